//! The API's typed requests, shared by the handlers that read them, the OpenAPI document
//! that describes them and the command line's client (`lading_node::client::Client`) that sends them: a field is named
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

/// The answer to a submission: the new batch, Pending.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Submitted {
    pub id: String,
    pub status: String,
    /// An upload's size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

impl Submitted {
    /// A batch just made, Pending.
    pub fn pending(bid: &lading_core::layout::BatchId, bytes: Option<u64>) -> Submitted {
        Submitted {
            id: bid.to_string(),
            status: "Pending".into(),
            bytes,
        }
    }

    /// The answer: 201 with the batch's location.
    pub fn created(self) -> axum::response::Response {
        use axum::response::IntoResponse;
        let at = format!("/api/v1/batches/{}", self.id);
        let created = axum::http::StatusCode::CREATED;
        (
            created,
            [(axum::http::header::LOCATION, at)],
            axum::Json(self),
        )
            .into_response()
    }
}

/// A job or batch action's answer: the item's new state, or that it was purged.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ActionResult {
    pub id: String,
    /// None when the item was purged.
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub purged: bool,
}

/// The optional body of `POST /api/v1/jobs/{id}/requeue`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RequeueRequest {
    /// The target state (default: the stage that failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

/// The optional body of `POST /api/v1/batches/{id}/requeue-failed`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RequeueFailedRequest {
    /// Just the jobs that failed at this stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// The target state (default: the stage each job failed at).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

/// What a bulk requeue did: each job requeued, and each refused with why.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Requeued {
    pub id: String,
    pub requeued: Vec<ActionResult>,
    pub refused: Vec<Refusal>,
}

/// A job a bulk action left alone, and why.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Refusal {
    pub id: String,
    pub error: String,
    pub kind: String,
}

/// A collection held or released.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CollectionHold {
    pub collection: String,
    pub held: bool,
    /// False when it already was (held) or was not (released, and nothing came back).
    pub changed: bool,
    /// Release only: how many Held batches and jobs went back to Pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<usize>,
}

/// A queue paused or resumed.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QueuePause {
    pub queue: String,
    pub paused: bool,
    /// False when it already was.
    pub changed: bool,
}

/// Every outbox entry, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OutboxList {
    pub entries: Vec<lading_engine::OutboxItem>,
}

/// An outbox entry made due again.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OutboxRetried {
    pub name: String,
    pub entry: lading_engine::OutboxEntry,
}

/// A foreign lock cleared.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LockCleared {
    pub kind: String,
    pub name: String,
    pub cleared: bool,
}

/// A job's or batch's transitions, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct History {
    pub id: String,
    #[schema(value_type = Vec<Object>)]
    pub history: serde_json::Value,
}

/// The job actions of `POST /api/v1/jobs/{id}/{action}` (and `lading admin job`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobAction {
    Hold,
    Release,
    Requeue,
    Delete,
}

/// The batch actions of `POST /api/v1/batches/{id}/{action}` (and `lading admin batch`),
/// besides `requeue-failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchAction {
    Hold,
    Release,
    Delete,
    UpdateReporting,
}

impl JobAction {
    pub const NAMES: [&'static str; 4] = ["hold", "release", "requeue", "delete"];
    const ALL: [JobAction; 4] = [Self::Hold, Self::Release, Self::Requeue, Self::Delete];

    pub fn name(self) -> &'static str {
        Self::NAMES[Self::ALL.iter().position(|a| *a == self).unwrap_or(0)]
    }

    /// The action of this name (as in the API's path).
    pub fn parse(name: &str) -> Option<JobAction> {
        let i = Self::NAMES.iter().position(|n| *n == name)?;
        Some(Self::ALL[i])
    }
}

impl BatchAction {
    pub const NAMES: [&'static str; 4] = ["hold", "release", "delete", "update-reporting"];
    const ALL: [BatchAction; 4] = [
        Self::Hold,
        Self::Release,
        Self::Delete,
        Self::UpdateReporting,
    ];

    pub fn name(self) -> &'static str {
        Self::NAMES[Self::ALL.iter().position(|a| *a == self).unwrap_or(0)]
    }

    /// The action of this name (as in the API's path).
    pub fn parse(name: &str) -> Option<BatchAction> {
        let i = Self::NAMES.iter().position(|n| *n == name)?;
        Some(Self::ALL[i])
    }
}

/// Liveness (`ok`) or readiness (`ready`, with the store's kind).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ServiceState {
    pub status: String,
    /// `sqlite` or `zookeeper`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
}

/// A job's files: the versions it stored (from the inventory), its working folder on this
/// host, and the tail of its log there.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobFiles {
    pub id: String,
    /// `{ark, version, created, files: [[path, size, sha256]]}` per version (at most 5,000
    /// files in all).
    #[schema(value_type = Vec<Object>)]
    pub stored: Vec<lading_ingest::inventory::JobVersion>,
    /// Per stored version and storage node (0: the storage root): copies found good, bad
    /// and missing, and when they were last checked. A replica still on its way has none.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub copies: Vec<lading_ingest::inventory::NodeCopies>,
    pub working: WorkingFiles,
    pub log: LogTail,
}

/// What a job's working folder on one host holds: the object's own files and containers
/// (not Lading's interim state), paths relative to the folder.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkingFiles {
    pub host: String,
    pub present: bool,
    pub files: Vec<WorkingFile>,
    /// The folder held more than is listed.
    pub truncated: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkingFile {
    pub path: String,
    pub size: u64,
}

/// The last lines of a job's log on one host.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LogTail {
    pub lines: Vec<String>,
    pub truncated: bool,
}

/// One batch of a listing: its status (without its transitions), submission, and jobs per
/// folder (`batch-completed`, …).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchRow {
    pub id: String,
    pub status: lading_core::layout::BatchStatus,
    #[schema(value_type = Object)]
    pub submission: lading_core::Recorded<lading_core::layout::BatchSubmission>,
    pub jobs: std::collections::BTreeMap<String, usize>,
}

/// A page of batches; `next_after` is the cursor of the next page, when there may be one.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchPage {
    pub batches: Vec<BatchRow>,
    pub next_after: Option<String>,
}

/// One job of a listing in a state; a Failed one says what failed and how.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobRow {
    pub id: String,
    pub priority: u8,
    /// `fatal` or `exhausted` (retries used up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_stage: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A page of the jobs in one state, in acquisition order.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobRowPage {
    pub state: String,
    pub jobs: Vec<JobRow>,
    pub next_after: Option<String>,
}

/// A job of a batch as the batch's page lists it: its state, its object's identifiers and
/// its status message.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchJobRow {
    pub id: String,
    pub state: String,
    /// The object's ARK (`primary_id`), once given or minted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ark: Option<String>,
    #[serde(default)]
    pub local_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A page of a batch's jobs, by job id.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchJobPage {
    pub batch: String,
    pub jobs: Vec<BatchJobRow>,
    pub next_after: Option<String>,
}

/// An access request made: `token` is its only handle (its secret is not stored).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AccessRequested {
    pub token: String,
    pub id: String,
    pub queue: String,
}

/// An access request as its token's holder sees it; `file` once the zip is ready.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AccessView {
    pub id: String,
    pub queue: String,
    pub state: String,
    pub message: Option<String>,
    pub ark: Option<String>,
    pub version: Option<u32>,
    pub file: Option<String>,
}

// Generic jobs: the job records themselves are lading-jobs' own (`JobView`, `TypeView`,
// `ScheduleView`, `Change`); these wrap them.

/// What `POST /api/v1/types/TYPE/jobs` did.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobAdded {
    #[serde(rename = "type")]
    pub ty: String,
    pub id: String,
    pub result: lading_jobs::Added,
}

/// A page of jobs; `next_after` is the cursor of the next page, when there may be one.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobPage {
    pub jobs: Vec<lading_jobs::JobView>,
    pub next_after: Option<String>,
}

/// Jobs accepted at once (`max_jobs`), each with its lock.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AcceptedJobs {
    pub jobs: Vec<lading_jobs::JobView>,
}

/// A finish and the next job accepted in the same call (`next` none when none came in time).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FinishedAndNext {
    pub finished: lading_jobs::JobView,
    pub next: Option<lading_jobs::JobView>,
}

/// A new subscription to a job, and the job's state now.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Subscribed {
    pub subscription: u64,
    pub state: lading_jobs::State,
}

/// One item of a batched finish: its new state, or why nothing was written for it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FinishResult {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<lading_jobs::State>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `halt` when the lock no longer holds the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// The results of a batched finish, one per item, in order.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FinishResults {
    pub results: Vec<FinishResult>,
}

/// A type's schedules.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Schedules {
    pub schedules: Vec<lading_jobs::ScheduleView>,
}
