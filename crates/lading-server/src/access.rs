//! The access queue (seed 001): ask for a stored object version as a zip, on the `small` or
//! `large` queue; an access worker assembles it; poll with the token the request returned.
//!
//! ```text
//! POST /api/v1/access                 {"ark","version","queue"?}  → 202 {"token","id","queue"}
//! GET  /api/v1/access/{token}         the request's state (and message)
//! GET  /api/v1/access/{token}/file    the zip, once Completed (409 before)
//! ```
//!
//! The token is `QUEUE.QID.SECRET`; only the secret's digest is kept in the request's token
//! node, so a token cannot be guessed from a request id. Without `queue`, versions over
//! [`LARGE_BYTES`] go to `large`. The requests are assembled by the access stage
//! (`lading_ingest::access`), which honours the queue pause flags
//! (`/locks/queue/accessSmall|accessLarge`).

use crate::{ApiError, AppState, Body, PathParams, Principal};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use lading_core::AccessState;
use lading_core::layout::{AccessId, AccessQueue};
use lading_engine::EngineError;
use lading_ingest::Ingest;
use serde::Deserialize;
use serde_json::json;
use std::path::PathBuf;

/// Versions larger than this go to the `large` queue unless the request names one.
pub const LARGE_BYTES: u64 = 1 << 30;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AccessBody {
    ark: String,
    version: u32,
    queue: Option<String>,
    /// `zip` (the default: the version's files) or `bag` (a BagIt bag in a tar, valid under
    /// the profile it was deposited with).
    format: Option<String>,
}

fn zip_path(ingest: &Ingest, queue: AccessQueue, id: &AccessId) -> PathBuf {
    lading_ingest::access::zip_path(&ingest.cfg, queue, id)
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(e.to_string())
}

#[utoipa::path(post, path = "/api/v1/access", tag = "access", summary = "Request an object version through the access queue", request_body = AccessBody, responses((status = 202, description = "queued; the body has the token", body = crate::api::AccessRequested), (status = 404, description = "no such recorded version"), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub async fn request(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    Body(b): Body<AccessBody>,
) -> Result<Response, ApiError> {
    let ark = b.ark.clone();
    let versions = s
        .ingest
        .inventory
        .run(move |i| i.versions(&ark))
        .await
        .map_err(internal)?;
    // Not recorded and not the submitter's own get the same answer: no existence oracle.
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no version {} of {:?} is recorded", b.version, b.ark),
        )
    };
    let Some((_, _, bytes)) = versions.iter().find(|(v, _, _)| *v == b.version) else {
        return Err(not_found());
    };
    if p.role != crate::Role::Admin && !submitted_by(&s, &p, &b.ark, b.version).await? {
        return Err(not_found());
    }
    crate::deletions::refuse_deleted(&s, &b.ark, b.version).await?;
    let queue = match b.queue.as_deref() {
        Some(q) => AccessQueue::parse(q).ok_or_else(|| {
            ApiError::bad_request(format!("unknown access queue {q:?} (small or large)"))
        })?,
        None if *bytes > LARGE_BYTES => AccessQueue::Large,
        None => AccessQueue::Small,
    };
    let bag = match b.format.as_deref() {
        None | Some("zip") => false,
        Some("bag") => true,
        Some(f) => {
            return Err(ApiError::bad_request(format!(
                "unknown format {f:?} (zip or bag)"
            )));
        }
    };
    let secret = uuid::Uuid::new_v4().simple().to_string();
    if p.role != crate::Role::Admin
        && let Some(shared) = tenant_limits(&s, &p, &b, bag, *bytes, &secret).await?
    {
        return Ok(shared);
    }
    room_for(&s, *bytes)?;
    let (bytes, now) = (*bytes, s.ingest.engine.clock().now_ms());
    // Only the secret's digest is kept in the tree. Merritt's fields beside Lading's: `token`
    // is the request's public name (the part of the depositor's token before the secret),
    // `url` where the zip will be, `status` "200" (accepted, as Merritt's storage answers an
    // assembly request), and an availability estimate at 50 MiB/s.
    let id = s
        .ingest
        .engine
        .create_access_with(queue, |id| {
            let zip = if bag {
                lading_ingest::access::bag_path(&s.ingest.cfg, queue, id)
            } else {
                zip_path(&s.ingest, queue, id)
            };
            let mut merritt = json!({"token": format!("{}.{id}", queue.name()), "delivery-node": 0,
                   "cloud-content-byte": bytes, "status": "200",
                   "url": format!("file://{}", zip.display()),
                   "anticipated-availability-time":
                       lading_core::time::format_rfc3339(now + 1_000 + bytes / (50 << 20) * 1_000)});
            if bag {
                merritt["format"] = json!("bag");
            }
            let token = lading_core::layout::AccessToken {
                ark: Some(b.ark.clone()),
                version: Some(b.version),
                requester: Some(p.name.clone()),
                secret_sha256: Some(secret_digest(&secret)),
                secret: None,
                bytes: Some(bytes),
                extra: merritt.as_object().cloned().unwrap_or_default(),
            };
            serde_json::to_value(token).unwrap_or_default()
        })
        .await?;
    let t = format!("{}.{id}.{secret}", queue.name());
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, format!("/api/v1/access/{t}"))],
        Json(crate::api::AccessRequested {
            token: t,
            id: id.to_string(),
            queue: queue.name().into(),
        }),
    )
        .into_response())
}

/// The access requests made by `name`, in either queue.
async fn requests_of(s: &AppState, name: &str) -> Result<Vec<lading_engine::AccessInfo>, ApiError> {
    let e = &s.ingest.engine;
    let mut out = Vec::new();
    for q in [AccessQueue::Small, AccessQueue::Large] {
        for id in e.access_ids(q).await? {
            match e.access(q, &id).await {
                Ok(i) if i.token.requester.as_deref() == Some(name) => out.push(i),
                Ok(_) | Err(EngineError::NoAccess(_)) => {}
                Err(err) => return Err(err.into()),
            }
        }
    }
    Ok(out)
}

/// A submitter's bounds on the access queues (`[access]`): an identical request still
/// waiting, being assembled or assembled shares its file (the answer, a new token for it, is
/// returned); otherwise too many requests in flight, or too many bytes held, is a 429 naming
/// the limit.
async fn tenant_limits(
    s: &AppState,
    p: &Principal,
    b: &AccessBody,
    bag: bool,
    bytes: u64,
    secret: &str,
) -> Result<Option<Response>, ApiError> {
    let limits = &s.ingest.cfg.access;
    let mine = requests_of(s, &p.name).await?;
    for i in &mine {
        let same = i.token.ark.as_deref() == Some(b.ark.as_str())
            && i.token.version == Some(b.version)
            && lading_ingest::access::wants_bag(&i.token) == bag;
        let id = AccessId::parse(&i.id).map_err(|e| ApiError::internal(e.to_string()))?;
        let file = if bag {
            lading_ingest::access::bag_path(&s.ingest.cfg, i.queue, &id)
        } else {
            zip_path(&s.ingest, i.queue, &id)
        };
        let usable = match i.status.status {
            AccessState::Pending | AccessState::Processing => true,
            AccessState::Completed => file.exists(),
            _ => false,
        };
        if same && usable {
            s.ingest
                .engine
                .share_access(i.queue, &id, &secret_digest(secret))
                .await?;
            let t = format!("{}.{id}.{secret}", i.queue.name());
            return Ok(Some(
                (
                    StatusCode::ACCEPTED,
                    [(header::LOCATION, format!("/api/v1/access/{t}"))],
                    Json(crate::api::AccessRequested {
                        token: t,
                        id: id.to_string(),
                        queue: i.queue.name().into(),
                    }),
                )
                    .into_response(),
            ));
        }
    }
    let in_flight = mine
        .iter()
        .filter(|i| {
            matches!(
                i.status.status,
                AccessState::Pending | AccessState::Processing
            )
        })
        .count();
    if in_flight >= limits.max_requests_per_submitter {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_access_requests",
            format!(
                "{in_flight} of your access requests are waiting or being assembled, the most \
                 one submitter may have ([access] max_requests_per_submitter = {}); fetch or \
                 wait for them first",
                limits.max_requests_per_submitter
            ),
        ));
    }
    let held: u64 = mine
        .iter()
        .filter(|i| !matches!(i.status.status, AccessState::Failed | AccessState::Deleted))
        .map(|i| i.token.bytes.unwrap_or(0))
        .sum();
    if held.saturating_add(bytes) > limits.max_bytes_per_submitter {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "access_bytes",
            format!(
                "your access requests hold {held} bytes of assembled files; this version's \
                 {bytes} bytes would pass the limit of {} ([access] max_bytes_per_submitter); \
                 they are removed {} hours after they finish",
                limits.max_bytes_per_submitter, s.ingest.cfg.retention_hours
            ),
        ));
    }
    Ok(None)
}

/// Refuses (507) a request whose file would not fit on the access folder's file system with
/// the configured reserve left.
fn room_for(s: &AppState, bytes: u64) -> Result<(), ApiError> {
    let dir = s.ingest.cfg.data_dir.join("access");
    let at = if dir.exists() {
        dir
    } else {
        s.ingest.cfg.data_dir.clone()
    };
    let Ok(free) = lading_ingest::stages::free_bytes(&at) else {
        return Ok(());
    };
    let need = bytes.saturating_add(s.ingest.cfg.reserve_bytes);
    if free < need {
        return Err(ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "insufficient_storage",
            format!(
                "not enough free space to assemble this version now ({bytes} bytes and the \
                 configured reserve are needed); try again later"
            ),
        ));
    }
    Ok(())
}

/// Whether `p` submitted the batch that stored version `version` of `ark`.
async fn submitted_by(
    s: &AppState,
    p: &Principal,
    ark: &str,
    version: u32,
) -> Result<bool, ApiError> {
    let a = ark.to_string();
    let bid = s
        .ingest
        .inventory
        .run(move |i| i.version_batch(&a, version))
        .await
        .map_err(internal)?;
    let Some(bid) = bid.and_then(|b| lading_core::layout::BatchId::parse(&b).ok()) else {
        return Ok(false);
    };
    match s.ingest.engine.batch(&bid).await {
        Ok(info) => Ok(info.submission.submitter() == Some(p.name.as_str())),
        Err(EngineError::NoBatch(_)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The hex SHA-256 of an access secret.
fn secret_digest(secret: &str) -> String {
    use sha2::Digest;
    lading_ingest::fetch::hex(&sha2::Sha256::digest(secret.as_bytes()))
}

/// Equality whose time does not depend on where the inputs differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The request a token names, if the token is right.
async fn lookup(
    s: &AppState,
    token: &str,
) -> Result<(AccessQueue, AccessId, lading_engine::AccessInfo), ApiError> {
    let unknown = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no access request has this token",
        )
    };
    let mut parts = token.splitn(3, '.');
    let (Some(q), Some(id), Some(secret)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(unknown());
    };
    let queue = AccessQueue::parse(q).ok_or_else(unknown)?;
    let id = AccessId::parse(id).map_err(|_| unknown())?;
    let info = match s.ingest.engine.access(queue, &id).await {
        Err(EngineError::NoAccess(_)) => return Err(unknown()),
        r => r?,
    };
    // Compared in constant time; a request made before digests were kept has its secret.
    let expected = match (
        info.token.secret_sha256.as_deref(),
        info.token.secret.as_deref(),
    ) {
        (Some(d), _) => d.to_string(),
        (None, Some(plain)) => secret_digest(plain),
        (None, None) => return Err(unknown()),
    };
    let given = secret_digest(secret);
    let shared = info
        .token
        .extra
        .get(lading_engine::SHARED_SECRETS)
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|d| d.as_str())
                .any(|d| constant_time_eq(d.as_bytes(), given.as_bytes()))
        })
        .unwrap_or(false);
    if !constant_time_eq(expected.as_bytes(), given.as_bytes()) && !shared {
        return Err(unknown());
    }
    Ok((queue, id, info))
}

#[utoipa::path(get, path = "/api/v1/access-requests/{id}", tag = "admin", summary = "An access request by its id (either queue), for an operator", params(("id" = String, Path, description = "qid…")), responses((status = 200, description = "the request: its status and record (the secret's digest only)", body = lading_engine::AccessInfo), (status = 404, description = "no such request"), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn show(
    State(s): State<AppState>,
    crate::Admin(_): crate::Admin,
    PathParams(id): PathParams<String>,
) -> Result<Json<lading_engine::AccessInfo>, ApiError> {
    use crate::ops::Ops;
    let id = AccessId::parse(&id).map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(Json(crate::batches::local(&s).access(&id).await?))
}

#[utoipa::path(get, path = "/api/v1/access/{token}", tag = "access", summary = "Poll an access request", params(("token" = String, Path, description = "the token the request returned")), responses((status = 200, description = "the request's state", body = crate::api::AccessView), (status = 404, description = "no request has this token")))]
pub async fn status(
    State(s): State<AppState>,
    PathParams(token): PathParams<String>,
) -> Result<Json<crate::api::AccessView>, ApiError> {
    let (queue, id, info) = lookup(&s, &token).await?;
    let done = info.status.status == AccessState::Completed;
    Ok(Json(crate::api::AccessView {
        id: id.to_string(),
        queue: queue.name().into(),
        state: info.status.status.name().into(),
        message: info.status.message,
        ark: info.token.ark,
        version: info.token.version,
        file: done.then(|| format!("/api/v1/access/{token}/file")),
    }))
}

#[utoipa::path(get, path = "/api/v1/access/{token}/file", tag = "access", summary = "Fetch an access request's zip", params(("token" = String, Path, description = "the token the request returned")), responses((status = 200, description = "the assembled zip", content_type = "application/zip"), (status = 404, description = "no request has this token"), (status = 409, description = "not Completed yet", body = serde_json::Value)))]
pub async fn file(
    State(s): State<AppState>,
    PathParams(token): PathParams<String>,
) -> Result<Response, ApiError> {
    let (queue, id, info) = lookup(&s, &token).await?;
    if info.status.status != AccessState::Completed {
        let state = info.status.status.name();
        return Ok((
            StatusCode::CONFLICT,
            Json(
                json!({"error": format!("access request {id} is {state}, not Completed"),
                        "kind": "not_ready", "state": state}),
            ),
        )
            .into_response());
    }
    let bag = lading_ingest::access::wants_bag(&info.token);
    let (path, mime, ext) = if bag {
        (
            lading_ingest::access::bag_path(&s.ingest.cfg, queue, &id),
            "application/x-tar",
            "tar",
        )
    } else {
        (zip_path(&s.ingest, queue, &id), "application/zip", "zip")
    };
    let f = tokio::fs::File::open(&path).await.map_err(|e| {
        ApiError::new(
            StatusCode::GONE,
            "gone",
            format!("the assembled file is gone: {e}"),
        )
    })?;
    let len = f.metadata().await.map_err(internal)?.len();
    Ok((
        [
            (header::CONTENT_TYPE, mime.to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{id}.{ext}\""),
            ),
        ],
        axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(f)),
    )
        .into_response())
}
