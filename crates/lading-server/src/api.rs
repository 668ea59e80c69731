//! The API's typed requests, shared by the handlers that read them, the OpenAPI document
//! that describes them and the [`crate::client::Client`] that sends them: a field is named
//! once.

use lading_ingest::{Submission, Trust};
use serde::{Deserialize, Serialize};

/// A batch submission: the JSON body of `POST /api/v1/batches` (by URL), and the query of
/// `POST /api/v1/batches/upload` (the uploaded file is the payload; `payload_url` is refused
/// there).
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The payload's URL: required by `POST /api/v1/batches`, refused with an upload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(required = true)]
    pub payload_url: Option<String>,
    pub profile: String,
    /// `file` (the default), `container`, `manifest` or `batch-manifest`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub payload_type: Option<String>,
    /// ERC what.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// ERC who.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creator: Option<String>,
    /// ERC when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_id: Option<String>,
    /// Admin tokens only: submit on someone's behalf.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitter: Option<String>,
}

impl SubmitRequest {
    /// The payload type asked for, or the default.
    pub fn payload_type(&self) -> &str {
        self.payload_type.as_deref().unwrap_or("file")
    }

    /// The ingest submission, once the caller's submitter is settled, of the payload at
    /// `payload_url` under `trust`.
    pub(crate) fn into_submission(
        self,
        submitter: String,
        payload_url: String,
        trust: Trust,
    ) -> Submission {
        Submission {
            payload_type: self.payload_type().to_string(),
            profile: self.profile,
            submitter,
            payload_url,
            title: self.title,
            creator: self.creator,
            date: self.date,
            local_id: self.local_id,
            primary_id: self.primary_id,
            trust,
        }
    }
}
