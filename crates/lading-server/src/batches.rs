//! Ingest over HTTP: submit a batch by URL, read batches and jobs, and every admin action of
//! SPEC §5.
//!
//! ```text
//! POST /api/v1/batches                      {"payload_url","profile","type"?,"title"?,…}  201
//! GET  /api/v1/batches?state=&profile=&submitter=&collection=&after=&limit=
//! GET  /api/v1/batches/{bid|uuid}
//! POST /api/v1/batches/{bid}/hold|release|delete|update-reporting          admin
//! GET  /api/v1/jobs?state=STATE&collection=&message=&…&after=&limit=         admin
//! GET  /api/v1/jobs/count?state=STATE&…    how many the filter matches        admin
//! POST /api/v1/jobs/bulk  {"action","filter","max"}  202, runs on             admin
//! GET  /api/v1/audit                        bulk operations, newest first     admin
//! GET  /api/v1/jobs/{jid}
//! POST /api/v1/jobs/{jid}/hold|release|requeue|delete   requeue: {"to"?}      admin
//! PUT|DELETE /api/v1/collections/{name}/hold                                  admin
//! PUT|DELETE /api/v1/queues/{name}/pause                                      admin
//! GET  /api/v1/status                       counts per state, paused queues   admin
//! ```
//!
//! A submitter token sees only its own batches and their jobs; another's is "not found", so
//! ids cannot be probed.

use crate::api::{
    ActionResult, BatchAction, CollectionHold, JobAction, QueuePause, RequeueFailedRequest,
};
use crate::ops::{Local, Ops};
use crate::{Admin, ApiError, AppState, Body, PathParams, Principal, Query, Role};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use lading_core::BatchState;
use lading_core::layout::{BatchId, BatchSubmission, JobId};
use lading_engine::EngineError;
use serde::Deserialize;
use serde_json::{Value, json};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/batches", get(list_batches).post(submit))
        .route("/api/v1/batches/{id}", get(show_batch))
        .route("/api/v1/batches/{id}/history", get(batch_history))
        .route("/api/v1/batches/{id}/jobs", get(batch_jobs))
        .route("/api/v1/jobs/{id}/history", get(job_history))
        .route("/api/v1/jobs/{id}/files", get(job_files))
        .route("/api/v1/batches/{id}/{action}", post(batch_action))
        .route("/api/v1/jobs", get(list_jobs))
        .route("/api/v1/jobs/count", get(count_jobs))
        .route("/api/v1/jobs/bulk", post(bulk))
        .route("/api/v1/audit", get(audit))
        .route("/api/v1/jobs/{id}", get(show_job))
        .route("/api/v1/jobs/{id}/{action}", post(job_action))
        .route(
            "/api/v1/collections/{name}/hold",
            put(hold_collection).delete(release_collection),
        )
        .route(
            "/api/v1/queues/{name}/pause",
            put(pause_queue).delete(resume_queue),
        )
        .route("/api/v1/status", get(status))
        .route("/api/v1/outbox", get(list_outbox))
        .route("/api/v1/outbox/{name}/retry", post(retry_outbox))
        .route(
            "/api/v1/locks/{kind}/{name}",
            axum::routing::delete(clear_lock),
        )
}

type Result<T, E = ApiError> = std::result::Result<T, E>;

fn not_found_batch(id: &str) -> ApiError {
    EngineError::NoBatch(id.to_string()).into()
}

#[utoipa::path(post, path = "/api/v1/batches", tag = "batches", summary = "Submit a batch by payload URL", request_body = crate::api::SubmitRequest, responses((status = 201, description = "the batch, Pending", body = crate::api::Submitted), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this"), (status = 429, description = "the submitter has max_open_batches_per_submitter batches open")))]
pub(crate) async fn submit(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    Body(mut b): Body<crate::api::SubmitRequest>,
) -> Result<Response> {
    let payload_url = b.payload_url.take().ok_or_else(|| {
        // As any other missing field of the body.
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "missing field `payload_url` (the payload's URL; to send a file, upload it)",
        )
    })?;
    let submitter = p.submitter(b.submitter.take())?;
    p.may_submit_to(&s.ingest, &b.profile)?;
    p.may_open_batch(&s).await?;
    // Whoever sends it, a URL that comes in over the API is held to the payload policy.
    let sub = b.into_submission(
        submitter,
        payload_url,
        lading_ingest::Trust::Depositor { upload: None },
    );
    let bid = lading_ingest::submit(&s.ingest, &sub).await?;
    Ok(crate::api::Submitted::pending(&bid, None).created())
}

/// The batch `id` (a `bid…` or its uuid) if `p` may see it.
pub(crate) async fn visible_batch(
    s: &AppState,
    p: &Principal,
    id: &str,
) -> Result<lading_engine::BatchInfo> {
    let bid = (s.ingest.engine.find_batch(id).await?).ok_or_else(|| not_found_batch(id))?;
    let info = s.ingest.engine.batch(&bid).await?;
    if p.role != Role::Admin && info.submission.submitter() != Some(&p.name) {
        return Err(not_found_batch(id));
    }
    Ok(info)
}

#[utoipa::path(get, path = "/api/v1/batches/{id}", tag = "batches", summary = "A batch", params(("id" = String, Path, description = "bid… or the batch uuid")), responses((status = 200, description = "the batch", body = lading_engine::BatchInfo), (status = 404, description = "no such batch (or not yours)")))]
pub(crate) async fn show_batch(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    PathParams(id): PathParams<String>,
) -> Result<Json<lading_engine::BatchInfo>> {
    let mut info = visible_batch(&s, &p, &id).await?;
    lading_engine::expand_history(&mut info.status.extra);
    if p.role != Role::Admin {
        info.submission.edit(|v| crate::redact::paths(&s, v));
        if let Some(m) = info.status.message.as_mut() {
            crate::redact::text(&s, m);
        }
        redact_history(&mut info.status.extra);
    }
    Ok(Json(info))
}

/// A record's transitions (its expanded history), as the history endpoints answer.
fn history(id: String, extra: &serde_json::Map<String, Value>) -> crate::api::History {
    crate::api::History {
        id,
        history: extra
            .get(lading_engine::HISTORY_FIELD)
            .cloned()
            .unwrap_or_else(|| json!([])),
    }
}

/// A history as a submitter reads it: the fields its event stream shows (states, times,
/// retry counts), not the operator's hosts and messages.
fn redact_history(extra: &mut serde_json::Map<String, Value>) {
    if let Some(Value::Array(list)) = extra.get_mut(lading_engine::HISTORY_FIELD) {
        for entry in list {
            if let Some(o) = entry.as_object_mut() {
                o.remove("host");
                o.remove("message");
            }
        }
    }
}

#[utoipa::path(get, path = "/api/v1/batches/{id}/history", tag = "batches", summary = "A batch's transitions", description = "Each state change of the batch, oldest first (the last 32): `at`, `from`, `to`, `host` (the process that made it), `message`. Kept with the batch, so any host answers.", params(("id" = String, Path, description = "bid… or the batch uuid")), responses((status = 200, description = "the transitions, oldest first", body = crate::api::History), (status = 404, description = "no such batch (or not yours)")))]
pub(crate) async fn batch_history(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    PathParams(id): PathParams<String>,
) -> Result<Json<crate::api::History>> {
    let Json(info) = show_batch(State(s), Extension(p), PathParams(id)).await?;
    Ok(Json(history(info.id.to_string(), &info.status.extra)))
}

#[derive(Deserialize)]
pub(crate) struct PageQuery {
    after: Option<String>,
    limit: Option<usize>,
}

/// Most rows of a batch's jobs one request reads (each is a job read).
const MAX_BATCH_JOBS_PAGE: usize = 200;

#[utoipa::path(get, path = "/api/v1/batches/{id}/jobs", tag = "batches", summary = "A batch's jobs, with their objects' identifiers", description = "The batch's jobs in job id order, each with its state, its object's ARK and local ids, and its status message (a submitter reads its own batches, messages without server paths). Paged: `limit` (at most 200, default 100) and `after` (the last id of the page before).", params(("id" = String, Path, description = "bid… or the batch uuid"), ("after" = Option<String>, Query, description = "the last job id of the page before"), ("limit" = Option<usize>, Query, description = "page size, at most 200")), responses((status = 200, description = "a page of the batch's jobs", body = crate::api::BatchJobPage), (status = 400, description = "bad input (the error names it)"), (status = 404, description = "no such batch (or not yours)")))]
pub(crate) async fn batch_jobs(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    PathParams(id): PathParams<String>,
    Query(q): Query<PageQuery>,
) -> Result<Json<crate::api::BatchJobPage>> {
    let limit = q.limit.unwrap_or(100).clamp(1, MAX_BATCH_JOBS_PAGE);
    if let Some(a) = q.after.as_deref() {
        JobId::parse(a).map_err(|e| ApiError::bad_request(format!("after: {e}")))?;
    }
    let info = visible_batch(&s, &p, &id).await?;
    let mut ids: Vec<&JobId> = info.jobs.values().flatten().collect();
    ids.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    ids.dedup();
    let mut jobs = Vec::new();
    let mut more = false;
    for j in ids
        .into_iter()
        .filter(|j| q.after.as_deref().is_none_or(|a| j.as_str() > a))
    {
        if jobs.len() == limit {
            more = true;
            break;
        }
        let job = match s.ingest.engine.job(j).await {
            Ok(job) => job,
            // Purged since the batch was read.
            Err(EngineError::NoJob(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut message = job.status.message.clone().filter(|m| !m.is_empty());
        if p.role != Role::Admin
            && let Some(m) = message.as_mut()
        {
            crate::redact::text(&s, m);
        }
        jobs.push(crate::api::BatchJobRow {
            id: j.to_string(),
            state: job.status.status.to_string(),
            ark: job.identifiers.primary_id,
            local_ids: job.identifiers.local_id,
            message,
        });
    }
    let next_after = more.then(|| jobs.last().map(|r| r.id.clone())).flatten();
    Ok(Json(crate::api::BatchJobPage {
        batch: info.id.to_string(),
        jobs,
        next_after,
    }))
}

#[utoipa::path(get, path = "/api/v1/jobs/{id}/history", tag = "jobs", summary = "A job's transitions", description = "Each state change of the job, oldest first (the last 32): `at`, `from`, `to`, `host` (the process that made it), `retry_count`, `message`. Kept with the job, so any host answers.", params(("id" = String, Path, description = "jid…")), responses((status = 200, description = "the transitions, oldest first", body = crate::api::History), (status = 404, description = "no such job (or not yours)")))]
pub(crate) async fn job_history(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    PathParams(id): PathParams<String>,
) -> Result<Json<crate::api::History>> {
    let Json(info) = show_job(State(s), Extension(p), PathParams(id)).await?;
    Ok(Json(history(info.id.to_string(), &info.status.extra)))
}

/// Working files listed per job, at most.
const MAX_WORKING_FILES: usize = 1000;
/// Lines of a job's log shown, at most, from its last [`LOG_TAIL_BYTES`].
const LOG_TAIL_LINES: usize = 50;
const LOG_TAIL_BYTES: u64 = 16 * 1024;

#[utoipa::path(get, path = "/api/v1/jobs/{id}/files", tag = "jobs", summary = "A job's files: the versions it stored (files with sizes and SHA-256 digests, from the inventory), what its working folder on this host holds, and the tail of its log there (the last two for an admin only; a submitter reads its own jobs' stored versions)", params(("id" = String, Path, description = "jid…")), responses((status = 200, description = "`stored`: [{ark, version, created, files: [[path, size, sha256]]}] (at most 5,000 files); `working`: {host, present, files: [{path, size}], truncated} (paths relative to the job's folder; the object's own files and containers, not Lading's interim state); `log`: {lines, truncated} (the last 50 lines)", body = crate::api::JobFiles), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this"), (status = 404, description = "no such job")))]
pub(crate) async fn job_files(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    PathParams(id): PathParams<String>,
) -> Result<Json<crate::api::JobFiles>> {
    let jid = JobId::parse(&id).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let info = s.ingest.engine.job(&jid).await?;
    // A submitter reads what its own job stored; another's is "not found".
    let admin = p.role == Role::Admin;
    if !admin && (p.role != Role::Submitter || !submitted_by(&s, &p, &info).await) {
        return Err(EngineError::NoJob(id).into());
    }
    let inv = s.ingest.inventory.clone();
    let job = id.clone();
    let (stored, copies) = inv
        .run(move |i| Ok((i.job_versions(&job)?, i.job_copies(&job)?)))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    if !admin {
        // The stored versions and their copies; nothing of this host's folders.
        return Ok(Json(crate::api::JobFiles {
            id,
            stored,
            copies,
            working: crate::api::WorkingFiles {
                host: String::new(),
                present: false,
                files: Vec::new(),
                truncated: false,
            },
            log: crate::api::LogTail {
                lines: Vec::new(),
                truncated: false,
            },
        }));
    }
    let dir = lading_worker::workdir(&s.ingest.cfg.work_dir(), &info);
    let host = s.ingest.engine.owner().to_string();
    let (working, log) =
        tokio::task::spawn_blocking(move || (working_files(&dir, &host), log_tail(&dir)))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(crate::api::JobFiles {
        id,
        stored,
        copies,
        working,
        log,
    }))
}

/// The files under a job's working folder (not Lading's interim state), by path.
fn working_files(dir: &std::path::Path, host: &str) -> crate::api::WorkingFiles {
    let mut files = Vec::new();
    let mut truncated = false;
    let mut stack = vec![std::path::PathBuf::new()];
    // Entries looked at, folders included: a tree of empty folders is bounded too.
    let mut seen = 0;
    // Bounded: the walk stops at the first entry past the cap (a depositor's container may
    // hold any number of files).
    'walk: while let Some(rel) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(dir.join(&rel)) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if files.len() == MAX_WORKING_FILES || seen > 4 * MAX_WORKING_FILES {
                truncated = true;
                break 'walk;
            }
            let name = rel.join(e.file_name());
            if rel.as_os_str().is_empty()
                && (e.file_name() == lading_ingest::stages::INTERIM || e.file_name() == "job.log")
            {
                continue;
            }
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(name);
            } else {
                files.push((name.to_string_lossy().into_owned(), meta.len()));
            }
        }
    }
    files.sort();
    crate::api::WorkingFiles {
        host: host.to_string(),
        present: dir.is_dir(),
        files: files
            .into_iter()
            .map(|(path, size)| crate::api::WorkingFile { path, size })
            .collect(),
        truncated,
    }
}

/// The last lines of a job's log on this host.
fn log_tail(dir: &std::path::Path) -> crate::api::LogTail {
    let none = crate::api::LogTail {
        lines: Vec::new(),
        truncated: false,
    };
    use std::io::{Read, Seek, SeekFrom};
    let path = dir.join("job.log");
    // Only a plain file: a link is not followed.
    let plain = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file());
    let Some(mut f) = plain.then(|| std::fs::File::open(&path).ok()).flatten() else {
        return none;
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(LOG_TAIL_BYTES);
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(start)).is_err()
        || f.take(LOG_TAIL_BYTES).read_to_end(&mut buf).is_err()
    {
        return none;
    }
    let text = String::from_utf8_lossy(&buf);
    let mut lines: Vec<&str> = text.lines().collect();
    // A tail that starts mid-file starts mid-line: that partial line is dropped.
    if start > 0 && !lines.is_empty() {
        lines.remove(0);
    }
    let truncated = start > 0 || lines.len() > LOG_TAIL_LINES;
    let lines = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
    crate::api::LogTail {
        lines: lines.iter().map(|l| l.to_string()).collect(),
        truncated,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchQuery {
    state: Option<String>,
    profile: Option<String>,
    submitter: Option<String>,
    collection: Option<String>,
    /// Search: batches whose id, uuid, submitter, profile or title contains this
    /// (case-insensitive).
    q: Option<String>,
    after: Option<String>,
    limit: Option<usize>,
}

/// Longest search text.
const MAX_SEARCH: usize = 200;

/// The search text, lower-cased; refused when longer than [`MAX_SEARCH`].
fn search_text(q: Option<&str>) -> Result<Option<String>> {
    match q.map(str::trim) {
        None | Some("") => Ok(None),
        Some(t) if t.len() > MAX_SEARCH => Err(ApiError::bad_request(format!(
            "q is {} bytes long; at most {MAX_SEARCH}",
            t.len()
        ))),
        Some(t) => Ok(Some(t.to_lowercase())),
    }
}

use crate::bulk::any_field_contains;

#[utoipa::path(get, path = "/api/v1/batches", tag = "batches", summary = "List batches", params(("state" = Option<String>, Query, description = "batch state"), ("profile" = Option<String>, Query, description = "profile"), ("submitter" = Option<String>, Query, description = "submitter"), ("collection" = Option<String>, Query, description = "collection"), ("q" = Option<String>, Query, description = "search: id, uuid, submitter, profile or title containing this (case-insensitive)"), ("after" = Option<String>, Query, description = "cursor: the last id of the previous page"), ("limit" = Option<usize>, Query, description = "page size (1..=1000)")), responses((status = 200, description = "a page of batches", body = crate::api::BatchPage), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn list_batches(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    Query(q): Query<BatchQuery>,
) -> Result<Json<crate::api::BatchPage>> {
    let state = q
        .state
        .as_deref()
        .map(|st| {
            BatchState::parse(st)
                .ok_or_else(|| ApiError::bad_request(format!("unknown batch state {st:?}")))
        })
        .transpose()?;
    let submitter = match p.role {
        Role::Admin => q.submitter,
        Role::Processor => return Err(ApiError::forbidden("a processor token lists no batches")),
        Role::Submitter => match q.submitter {
            Some(other) if other != p.name => {
                return Err(ApiError::forbidden(format!(
                    "{} may list only its own batches",
                    p.name
                )));
            }
            _ => Some(p.name.clone()),
        },
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let needle = search_text(q.q.as_deref())?;
    let e = &s.ingest.engine;
    let mut out = Vec::new();
    let mut last = None;
    // A submitter's listing reads only its own batches (the submitter index).
    let ids = match p.role {
        Role::Admin => e.batch_ids().await?,
        Role::Submitter | Role::Processor => e.batch_ids_of(&p.name).await?,
    };
    for bid in ids {
        if q.after.as_deref().is_some_and(|a| bid.as_str() <= a) {
            continue;
        }
        let info = match e.batch(&bid).await {
            Ok(i) => i,
            Err(EngineError::NoBatch(_)) => continue,
            Err(err) => return Err(err.into()),
        };
        let sub = info.submission.typed().ok();
        let field = |f: fn(&BatchSubmission) -> Option<&String>| sub.and_then(f);
        if state.is_some_and(|st| st != info.status.status)
            || (submitter.as_ref()).is_some_and(|x| field(|s| s.submitter.as_ref()) != Some(x))
            || (q.profile.as_ref()).is_some_and(|x| field(|s| s.profile_name.as_ref()) != Some(x))
            || (q.collection.as_ref()).is_some_and(|x| field(|s| s.collection.as_ref()) != Some(x))
            || needle.as_deref().is_some_and(|n| {
                !info.id.as_str().to_lowercase().contains(n)
                    && !any_field_contains(
                        info.submission.raw(),
                        &[
                            "batchID",
                            "submitter",
                            "profile_name",
                            "profile",
                            "erc_what",
                            "title",
                        ],
                        n,
                    )
            })
        {
            continue;
        }
        let jobs = info.jobs.iter().map(|(k, v)| (k.clone(), v.len()));
        let mut submission = info.submission.clone();
        let mut status = info.status.clone();
        // A listing leaves the transitions out (GET /api/v1/batches/{bid}/history has them).
        status.extra.remove(lading_engine::HISTORY_FIELD);
        if p.role != Role::Admin {
            submission.edit(|v| crate::redact::paths(&s, v));
            if let Some(m) = status.message.as_mut() {
                crate::redact::text(&s, m);
            }
        }
        out.push(crate::api::BatchRow {
            id: info.id.to_string(),
            status,
            submission,
            jobs: jobs.collect(),
        });
        last = Some(bid.to_string());
        if out.len() == limit {
            break;
        }
    }
    let next = (out.len() == limit).then_some(last).flatten();
    Ok(Json(crate::api::BatchPage {
        batches: out,
        next_after: next,
    }))
}

/// Whether `p` submitted the batch of the job `info`.
async fn submitted_by(s: &AppState, p: &Principal, info: &lading_engine::JobInfo) -> bool {
    s.ingest
        .engine
        .batch(&info.bid)
        .await
        .map(|b| b.submission.submitter() == Some(&p.name))
        .unwrap_or(false)
}

#[utoipa::path(get, path = "/api/v1/jobs/{id}", tag = "jobs", summary = "A job", params(("id" = String, Path, description = "jid…")), responses((status = 200, description = "the job", body = lading_engine::JobInfo), (status = 404, description = "no such job (or not yours)")))]
pub(crate) async fn show_job(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    PathParams(id): PathParams<String>,
) -> Result<Json<lading_engine::JobInfo>> {
    let jid = JobId::parse(&id).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let mut info = s.ingest.engine.job(&jid).await?;
    lading_engine::expand_history(&mut info.status.extra);
    if p.role != Role::Admin {
        if !submitted_by(&s, &p, &info).await {
            return Err(EngineError::NoJob(id).into());
        }
        let mut info = info;
        info.configuration.edit(|v| crate::redact::paths(&s, v));
        if let Some(m) = info.status.message.as_mut() {
            crate::redact::text(&s, m);
        }
        redact_history(&mut info.status.extra);
        return Ok(Json(info));
    }
    Ok(Json(info))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JobQuery {
    #[serde(flatten)]
    filter: crate::bulk::JobFilter,
    after: Option<String>,
    limit: Option<usize>,
}

#[utoipa::path(get, path = "/api/v1/jobs", tag = "jobs", summary = "List jobs in a state, filtered", description = "A page of the jobs of one state that match every filter given (collection, profile, submitter, batch, q: id/ARK/local id/title, message text, failed stage, failure kind, last changed at least older_than_min minutes ago), in acquisition order. A filtered page may hold fewer than `limit` rows (at most 500 references are looked at per call beyond a page): follow `next_after`.", params(crate::bulk::JobFilter, ("after" = Option<String>, Query, description = "cursor"), ("limit" = Option<usize>, Query, description = "page size")), responses((status = 200, description = "a page of jobs in acquisition order", body = crate::api::JobRowPage), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn list_jobs(
    State(s): State<AppState>,
    Admin(_): Admin,
    Query(q): Query<JobQuery>,
) -> Result<Json<crate::api::JobRowPage>> {
    let f = q.filter.check()?;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let page = crate::bulk::rows(&s.ingest.engine, &f, q.after.as_deref(), limit).await?;
    Ok(Json(page))
}

#[utoipa::path(get, path = "/api/v1/jobs/count", tag = "admin", summary = "Count the jobs a filter matches", description = "The filters of GET /api/v1/jobs; at most 200,000 jobs are looked at (`complete` says whether the state's end was reached). The count a bulk operation's confirmation shows.", params(crate::bulk::JobFilter), responses((status = 200, description = "the count", body = crate::bulk::JobCount), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn count_jobs(
    State(s): State<AppState>,
    Admin(_): Admin,
    Query(f): Query<crate::bulk::JobFilter>,
) -> Result<Json<crate::bulk::JobCount>> {
    Ok(Json(
        crate::bulk::count(&s.ingest.engine, &f.check()?).await?,
    ))
}

#[utoipa::path(post, path = "/api/v1/jobs/bulk", tag = "admin", summary = "Requeue, hold, release or delete the jobs a filter selects", description = "One admin operation over the jobs the filter matches when it runs, at most `max` of them (the count the admin confirmed). It runs on in the server: the answer (202) is its record as started; its progress and outcome (matched, done, refused with why) are in the audit log, GET /api/v1/audit.", request_body = crate::bulk::BulkRequest, responses((status = 202, description = "the operation, started", body = lading_engine::audit::AdminOperation), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn bulk(
    State(s): State<AppState>,
    Admin(p): Admin,
    req: axum::extract::Request,
) -> Result<Response> {
    let bytes = axum::body::to_bytes(req.into_body(), 64 << 10)
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
    let body: crate::bulk::BulkRequest = lading_core::json::from_bytes(&bytes)
        .map_err(|e| ApiError::bad_request(format!("body: {e}")))?;
    let op = crate::bulk::start(&s, &p.name, body).await?;
    Ok((StatusCode::ACCEPTED, Json(op)).into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuditQuery {
    /// How many (newest first; at most 1000).
    limit: Option<usize>,
}

#[utoipa::path(get, path = "/api/v1/audit", tag = "admin", summary = "The audit log of bulk operations", description = "Newest first: who, when, the action and filter, the confirmed maximum, how many jobs matched, were acted on and refused (the first 100 with why), and the state: running, finished, or interrupted (its process ended first).", params(AuditQuery), responses((status = 200, description = "the operations", body = Vec<lading_engine::audit::AdminOperation>), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn audit(
    State(s): State<AppState>,
    Admin(_): Admin,
    Query(q): Query<AuditQuery>,
) -> Result<Json<Vec<lading_engine::audit::AdminOperation>>> {
    let limit = q.limit.unwrap_or(100).clamp(1, lading_engine::audit::KEPT);
    Ok(Json(crate::bulk::log(&s.ingest.engine, limit).await?))
}

/// An optional JSON body: absent or blank is the default.
async fn optional_body<T: serde::de::DeserializeOwned + Default>(
    req: axum::extract::Request,
) -> Result<T> {
    let bytes = axum::body::to_bytes(req.into_body(), 64 << 10)
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    lading_core::json::from_bytes(&bytes).map_err(|e| ApiError::bad_request(format!("body: {e}")))
}

pub(crate) fn local(s: &AppState) -> Local {
    Local(s.ingest.clone())
}

#[utoipa::path(post, path = "/api/v1/jobs/{id}/{action}", tag = "admin", summary = "Administer a job (requeue takes an optional target)", params(("id" = String, Path, description = "jid…"), ("action" = String, Path, description = "hold, release, requeue or delete")), request_body = crate::api::RequeueRequest, responses((status = 200, description = "the new state", body = crate::api::ActionResult), (status = 404, description = "no such job or action"), (status = 409, description = "illegal transition or locked"), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn job_action(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams((id, action)): PathParams<(String, String)>,
    req: axum::extract::Request,
) -> Result<Json<ActionResult>> {
    let id = JobId::parse(&id).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let body: crate::api::RequeueRequest = optional_body(req).await?;
    let action = JobAction::parse(&action).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no job action {action:?} ({})", JobAction::NAMES.join(", ")),
        )
    })?;
    Ok(Json(
        local(&s)
            .job_action(&id, action, body.to.as_deref())
            .await?,
    ))
}

#[utoipa::path(post, path = "/api/v1/batches/{id}/{action}", tag = "admin", summary = "Administer a batch", description = "hold, release, delete, update-reporting, or requeue-failed: every Failed job of the batch (only those that failed at `stage`, when given) back to the stage it failed at (or `to`); the answer lists each job requeued and each refused with why.", params(("id" = String, Path, description = "bid…"), ("action" = String, Path, description = "hold, release, delete, update-reporting or requeue-failed")), request_body = crate::api::RequeueFailedRequest, responses((status = 200, description = "the new state (requeue-failed: each job requeued and refused)", body = crate::api::ActionResult), (status = 404, description = "no such batch or action"), (status = 409, description = "illegal transition or locked"), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn batch_action(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams((id, action)): PathParams<(String, String)>,
    req: axum::extract::Request,
) -> Result<Response> {
    let id = BatchId::parse(&id).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let body: RequeueFailedRequest = optional_body(req).await?;
    if action == "requeue-failed" {
        return Ok(Json(local(&s).requeue_failed(&id, body).await?).into_response());
    }
    if body.stage.is_some() || body.to.is_some() {
        return Err(ApiError::bad_request(
            "\"stage\" and \"to\" apply to requeue-failed only",
        ));
    }
    let action = BatchAction::parse(&action).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "no batch action {action:?} ({}, requeue-failed)",
                BatchAction::NAMES.join(", ")
            ),
        )
    })?;
    Ok(Json(local(&s).batch_action(&id, action).await?).into_response())
}

#[utoipa::path(put, path = "/api/v1/collections/{name}/hold", tag = "admin", summary = "Hold a collection", params(("name" = String, Path, description = "collection mnemonic")), responses((status = 200, description = "held", body = crate::api::CollectionHold), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn hold_collection(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams(name): PathParams<String>,
) -> Result<Json<CollectionHold>> {
    Ok(Json(local(&s).collection(&name, true).await?))
}

#[utoipa::path(delete, path = "/api/v1/collections/{name}/hold", tag = "admin", summary = "Release a collection", params(("name" = String, Path, description = "collection mnemonic")), responses((status = 200, description = "released, with how many batches and jobs went back to Pending", body = crate::api::CollectionHold), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn release_collection(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams(name): PathParams<String>,
) -> Result<Json<CollectionHold>> {
    Ok(Json(local(&s).collection(&name, false).await?))
}

#[utoipa::path(put, path = "/api/v1/queues/{name}/pause", tag = "admin", summary = "Pause a queue", params(("name" = String, Path, description = "ingest, accessSmall or accessLarge")), responses((status = 200, description = "paused", body = crate::api::QueuePause), (status = 404, description = "no such queue"), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn pause_queue(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams(name): PathParams<String>,
) -> Result<Json<QueuePause>> {
    Ok(Json(local(&s).queue(&name, true).await?))
}

#[utoipa::path(delete, path = "/api/v1/queues/{name}/pause", tag = "admin", summary = "Resume a queue", params(("name" = String, Path, description = "ingest, accessSmall or accessLarge")), responses((status = 200, description = "resumed", body = crate::api::QueuePause), (status = 404, description = "no such queue"), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn resume_queue(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams(name): PathParams<String>,
) -> Result<Json<QueuePause>> {
    Ok(Json(local(&s).queue(&name, false).await?))
}

#[utoipa::path(get, path = "/api/v1/status", tag = "admin", summary = "Counts per state", responses((status = 200, description = "jobs and batches per state, paused queues, the outbox, foreign locks", body = lading_engine::Summary), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn status(
    State(s): State<AppState>,
    Admin(_): Admin,
) -> Result<Json<lading_engine::Summary>> {
    Ok(Json(local(&s).summary().await?))
}

#[utoipa::path(get, path = "/api/v1/outbox", tag = "admin", summary = "Mails and callbacks waiting for delivery", responses((status = 200, description = "every outbox entry, oldest first: kind, key, attempts, last error, dead (given up), delivering", body = crate::api::OutboxList), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn list_outbox(
    State(s): State<AppState>,
    Admin(_): Admin,
) -> Result<Json<crate::api::OutboxList>> {
    Ok(Json(crate::api::OutboxList {
        entries: local(&s).outbox().await?,
    }))
}

#[utoipa::path(post, path = "/api/v1/outbox/{name}/retry", tag = "admin", summary = "Deliver an outbox entry again now", params(("name" = String, Path, description = "the entry's name, e.g. e0000000007")), responses((status = 200, description = "the entry, due now with a fresh attempt count", body = crate::api::OutboxRetried), (status = 400, description = "no such entry (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn retry_outbox(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams(name): PathParams<String>,
) -> Result<Json<crate::api::OutboxRetried>> {
    let entry = s.ingest.engine.retry_effect(&name).await?;
    Ok(Json(crate::api::OutboxRetried { name, entry }))
}

#[utoipa::path(delete, path = "/api/v1/locks/{kind}/{name}", tag = "admin", summary = "Clear a lock left by another tool: a persistent storage or inventory lock, or a Held batch's lock", params(("kind" = String, Path, description = "storage, inventory or batch"), ("name" = String, Path, description = "the lock's name, as /api/v1/status lists it under foreign_locks")), responses((status = 200, description = "cleared", body = crate::api::LockCleared), (status = 400, description = "no such lock, or one held by a live session (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn clear_lock(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams((kind, name)): PathParams<(String, String)>,
) -> Result<Json<crate::api::LockCleared>> {
    local(&s).clear_lock(&kind, &name).await?;
    Ok(Json(crate::api::LockCleared {
        kind,
        name,
        cleared: true,
    }))
}
