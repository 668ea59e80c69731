//! Results as zip files streamed in constant memory:
//!
//! ```text
//! GET /api/v1/jobs/{jid}/download                    the version the job stored
//! GET /api/v1/objects/download?ark=ARK&version=N     any recorded version (admin)
//! ```
//!
//! The zip is written on a blocking thread into a bounded channel (8 × 64 KiB) that the
//! response body drains, so memory does not grow with the object; entries are stored
//! uncompressed (payloads are usually compressed already) with ZIP64 for files over 4 GiB.
//! A job that has not stored anything yet gets 409 with the state it is in.

use crate::{Admin, ApiError, AppState, PathParams, Principal, Query, Role};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use lading_core::layout::{JobId, ark_node_name, job_node};
use lading_engine::EngineError;
use lading_ingest::access::Source;
use lading_ingest::stages::StoredVersion;
use serde::Deserialize;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

type Chunk = Result<Bytes, std::io::Error>;

/// Forwards what the zip writer writes to the response body.
struct ChannelWriter(tokio::sync::mpsc::Sender<Chunk>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "client went away"))?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A response streaming `dir` as `file_name`.
pub fn zip_response(dir: PathBuf, file_name: &str) -> Response {
    source_response(Source::Dir(dir), file_name)
}

/// A response streaming a stored version (a folder, or a storage node's copy) as a zip.
pub fn source_response(src: Source, file_name: &str) -> Response {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Chunk>(8);
    let name = file_name.to_string();
    tokio::spawn(async move {
        let written = lading_ingest::access::write_source_zip(&src, ChannelWriter(tx.clone()));
        if let Err(e) = written.await {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                tracing::warn!("zip {name}: {e}");
            }
            // The client sees a broken body rather than a zip that looks whole.
            let _ = tx.send(Err(e)).await;
        }
    });
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    (
        [
            (header::CONTENT_TYPE, "application/zip".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{file_name}\""),
            ),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

#[utoipa::path(get, path = "/api/v1/jobs/{id}/download", tag = "results", summary = "Download the version a job stored", params(("id" = String, Path, description = "job id (jid…)")), responses((status = 200, description = "the stored version as a zip", content_type = "application/zip"), (status = 404, description = "no such job (or not yours)"), (status = 409, description = "nothing stored yet; the body says the state", body = serde_json::Value)))]
pub async fn job_download(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let jid = JobId::parse(&id).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let e = &s.ingest.engine;
    let info = e.job(&jid).await?;
    if p.role != Role::Admin {
        let mine = e
            .batch(&info.bid)
            .await
            .map(|b| b.submission.submitter() == Some(&p.name))
            .unwrap_or(false);
        if !mine {
            return Err(EngineError::NoJob(id).into());
        }
    }
    let path = job_node(&jid, "store");
    let stored: Option<StoredVersion> = match e
        .tree()
        .get(&path)
        .await
        .map_err(EngineError::from)?
        .and_then(|n| n.data)
    {
        None => None,
        // A store record that cannot be read is named, not taken for "nothing stored yet".
        Some(d) => Some(
            lading_core::json::from_bytes(&d).map_err(|err| EngineError::Corrupt {
                path: path.clone(),
                reason: err.to_string(),
            })?,
        ),
    };
    let Some(stored) = stored else {
        let state = info.status.status.name();
        return Ok((
            StatusCode::CONFLICT,
            Json(json!({
                "error": format!("{jid} has stored nothing yet; it is {state}"),
                "kind": "not_ready",
                "state": state,
                "message": info.status.message,
            })),
        )
            .into_response());
    };
    crate::deletions::refuse_deleted(&s, &stored.ark, stored.version).await?;
    let name = format!("{}-v{}.zip", ark_node_name(&stored.ark), stored.version);
    if stored.node.is_some() {
        let src =
            lading_ingest::access::source(&s.ingest, &stored.ark, stored.version, Some(&stored))
                .await
                .map_err(|why| no_copy_now(&stored.ark, stored.version, &why))?;
        return Ok(source_response(src, &name));
    }
    let dir = PathBuf::from(&stored.path);
    if !dir.is_dir() {
        return Err(ApiError::logged(
            StatusCode::GONE,
            "gone",
            &format!(
                "version {} of {} is no longer in storage",
                stored.version, stored.ark
            ),
            &format!("its folder {} is gone", stored.path),
        ));
    }
    Ok(zip_response(dir, &name))
}

/// No storage node serves the version now (each node's own words, addresses among them, go
/// to the log).
fn no_copy_now(ark: &str, version: u32, why: &str) -> ApiError {
    ApiError::logged(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        &format!("no storage node can serve version {version} of {ark} now; try again later"),
        why,
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectQuery {
    ark: String,
    version: u32,
}

#[utoipa::path(get, path = "/api/v1/objects/download", tag = "results", summary = "Download any recorded object version", params(("ark" = String, Query, description = "the object's ARK"), ("version" = u32, Query, description = "version number")), responses((status = 200, description = "the version as a zip", content_type = "application/zip"), (status = 404, description = "no such recorded version"), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub async fn object_download(
    State(s): State<AppState>,
    Admin(_): Admin,
    Query(q): Query<ObjectQuery>,
) -> Result<Response, ApiError> {
    let (ark, version) = (q.ark.clone(), q.version);
    s.ingest
        .inventory
        .run(move |i| i.version_path(&ark, version))
        .await
        .map_err(|e| ApiError::internal(format!("inventory: {e}")))?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no version {} of {:?} is recorded", q.version, q.ark),
            )
        })?;
    crate::deletions::refuse_deleted(&s, &q.ark, q.version).await?;
    // The primary's copy, or a replica's when the primary does not answer or failed fixity.
    let src = lading_ingest::access::source(&s.ingest, &q.ark, q.version, None)
        .await
        .map_err(|why| no_copy_now(&q.ark, q.version, &why))?;
    Ok(source_response(
        src,
        &format!("{}-v{}.zip", ark_node_name(&q.ark), q.version),
    ))
}
