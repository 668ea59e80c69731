//! Deletion only when approved ([`lading_ingest::deletion`]), admins only:
//!
//! ```text
//! POST /api/v1/deletions                   {"ark", "version"?, "reason"}: request (201)
//! GET  /api/v1/deletions[?ark=ARK][&open=true]  every request and tombstone (open: undecided)
//! GET  /api/v1/deletions/{id}              one
//! POST /api/v1/deletions/{id}/approve      a second admin (another token name) approves
//! POST /api/v1/deletions/{id}/cancel       any admin cancels a request
//! ```
//!
//! Who asked and who approved are the tokens' names.

use crate::{Admin, ApiError, AppState, Body, PathParams, Query};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lading_ingest::deletion::{self, Deletion};
use serde::Deserialize;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/deletions", get(list).post(request))
        .route("/api/v1/deletions/{id}", get(show))
        .route("/api/v1/deletions/{id}/{verb}", post(decide))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeletionBody {
    ark: String,
    version: Option<u32>,
    reason: String,
}

#[utoipa::path(post, path = "/api/v1/deletions", tag = "admin", summary = "Request the deletion of an object or one version (a second admin approves it)", request_body(content = serde_json::Value, description = "{\"ark\": ARK, \"version\": N (optional: the whole object), \"reason\": TEXT}"), responses((status = 201, description = "the request", body = serde_json::Value), (status = 404, description = "no such object or version"), (status = 409, description = "a request for it is open already"), (status = 410, description = "deleted already"), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn request(
    State(s): State<AppState>,
    Admin(p): Admin,
    Body(b): Body<DeletionBody>,
) -> Result<Response, ApiError> {
    let d = deletion::request(&s.ingest, &b.ark, b.version, &b.reason, &p.name).await?;
    Ok((StatusCode::CREATED, Json(d)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    ark: Option<String>,
    /// Only those still to be decided or carried out (requested, approved).
    #[serde(default)]
    open: bool,
}

#[utoipa::path(get, path = "/api/v1/deletions", tag = "admin", summary = "Deletion requests and tombstones, oldest first", params(("ark" = Option<String>, Query, description = "only this object's"), ("open" = Option<bool>, Query, description = "only those requested, or approved and waiting")), responses((status = 200, description = "the deletions", body = serde_json::Value), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn list(
    State(s): State<AppState>,
    Admin(_): Admin,
    Query(q): Query<ListQuery>,
) -> Result<Json<Vec<Deletion>>, ApiError> {
    let mut all = deletion::list(&s.ingest, q.ark.as_deref()).await?;
    if q.open {
        all.retain(|d| {
            matches!(
                d.status,
                deletion::Status::Requested | deletion::Status::Approved
            )
        });
    }
    Ok(Json(all))
}

#[utoipa::path(get, path = "/api/v1/deletions/{id}", tag = "admin", summary = "One deletion: the request, or once done its tombstone (who asked, who approved, when, why, the digests of what was deleted)", params(("id" = String, Path, description = "del…")), responses((status = 200, description = "the deletion", body = serde_json::Value), (status = 404, description = "no such deletion"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn show(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams(id): PathParams<String>,
) -> Result<Json<Deletion>, ApiError> {
    Ok(Json(deletion::get(&s.ingest, &id).await?))
}

#[utoipa::path(post, path = "/api/v1/deletions/{id}/{verb}", tag = "admin", summary = "Approve (a second admin: the files are then removed from every node) or cancel a requested deletion", params(("id" = String, Path, description = "del…"), ("verb" = String, Path, description = "approve or cancel")), responses((status = 200, description = "the deletion as it now is (approved with `waiting` while a node cannot be reached)", body = serde_json::Value), (status = 403, description = "the requester may not approve its own request, or the token's role may not do this"), (status = 404, description = "no such deletion or verb"), (status = 409, description = "not a requested deletion"), (status = 401, description = "no or unknown token")))]
pub(crate) async fn decide(
    State(s): State<AppState>,
    Admin(p): Admin,
    PathParams((id, verb)): PathParams<(String, String)>,
) -> Result<Json<Deletion>, ApiError> {
    let d = match verb.as_str() {
        "approve" => deletion::approve(&s.ingest, &id, &p.name).await?,
        "cancel" => deletion::cancel(&s.ingest, &id, &p.name).await?,
        other => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no deletion verb {other:?} (approve or cancel)"),
            ));
        }
    };
    Ok(Json(d))
}

/// Refuses a read of a deleted version with 410, naming its deletion.
pub(crate) async fn refuse_deleted(s: &AppState, ark: &str, version: u32) -> Result<(), ApiError> {
    match deletion::of_version(&s.ingest, ark, version).await? {
        Some(d) => Err(ApiError::new(StatusCode::GONE, "deleted", d.gone(version))),
        None => Ok(()),
    }
}
