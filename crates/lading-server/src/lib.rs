//! The HTTP face of Lading (axum): `/api/v1`, JSON in and out, bearer-token auth.
//!
//! Shape: one [`AppState`] shared by every handler; [`router`] builds the whole API; errors
//! are one type, [`ApiError`], that renders as `{"error": "...", "kind": "..."}` with a 4xx
//! for anything the caller can fix. Request bodies are parsed strictly (unknown fields are
//! refused) by [`Body`], so a typo is an error, not a silently ignored field.
//!
//! HTTP only: a process that serves it (opening the store, its services, signals) and the
//! API's client are `lading-node`.

pub mod access;
pub mod api;
pub mod auth;
mod batches;
pub mod conn;
pub mod download;
pub mod events;
mod generic;
pub mod merritt;
mod metrics;
pub mod openapi;
pub mod ops;
pub mod overview;
mod redact;
pub mod upload;

pub use auth::{Admin, Auth, Principal, Role, Worker};

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use lading_jobs::{Jobs, JobsError};
use serde::de::DeserializeOwned;
use serde_json::json;
use std::sync::Arc;

/// Longest a long-poll (`accept`, `wait`) may ask to wait.
pub const MAX_POLL_MS: u64 = 120_000;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub ingest: Arc<lading_ingest::Ingest>,
    pub events: Arc<events::EventHub>,
    pub jobs: Arc<Jobs>,
    pub auth: Arc<Auth>,
    /// Becomes true when the server stops: long-polls end at once (503) instead of holding
    /// the shutdown up for their whole timeout.
    pub stopping: lading_worker::Shutdown,
}

impl AppState {
    /// Runs `fut` unless the server starts stopping first.
    pub async fn unless_stopping<T>(
        &self,
        fut: impl std::future::Future<Output = T>,
    ) -> Result<T, ApiError> {
        let mut stopping = self.stopping.clone();
        tokio::select! {
            // In order, not at random: a run is the same every time (`lading-sim`).
            biased;
            v = fut => Ok(v),
            _ = stopping.stopped() => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the server is shutting down",
            )),
        }
    }
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/api/v1/health", get(health))
        .route("/api/v1/ready", get(ready))
        .route("/api/v1/openapi.json", get(openapi::openapi))
        .route("/metrics", get(metrics::metrics))
        .route("/api/v1/events", get(events::events))
        .route("/api/v1/overview", get(overview::overview))
        .route("/api/v1/dependencies", get(overview::dependencies))
        .route("/api/v1/access", axum::routing::post(access::request))
        .route("/api/v1/access/{token}", get(access::status))
        .route("/api/v1/access-requests/{id}", get(access::show))
        .route("/api/v1/access/{token}/file", get(access::file))
        .route("/api/v1/jobs/{id}/download", get(download::job_download))
        .route("/api/v1/objects/download", get(download::object_download))
        .route(
            "/api/v1/batches/upload",
            axum::routing::post(upload::upload).layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .merge(batches::routes())
        .merge(generic::routes())
        .merge(merritt::routes())
        .layer(axum::extract::DefaultBodyLimit::max(
            state.ingest.cfg.http.max_body_bytes,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        .with_state(state)
}

/// The admin page: static HTML and script; it asks for a token and talks to the API.
#[utoipa::path(get, path = "/", tag = "page", summary = "The web admin page", responses((status = 200, description = "the admin page (HTML)", content_type = "text/html")), security(()))]
pub(crate) async fn index() -> Response {
    (
        [
            (axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                axum::http::header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:",
            ),
        ],
        include_str!("web/index.html"),
    )
        .into_response()
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/api/v1/health", tag = "service", summary = "Liveness", responses((status = 200, description = "the process answers", body = api::ServiceState)), security(()))]
pub(crate) async fn health() -> Json<api::ServiceState> {
    Json(api::ServiceState {
        status: "ok".into(),
        store: None,
    })
}

/// Readiness: the store answers and the server is not stopping.
#[utoipa::path(get, path = "/api/v1/ready", tag = "service", summary = "Readiness", responses((status = 200, description = "ready", body = api::ServiceState), (status = 503, description = "the store does not answer, or the server is stopping")), security(()))]
pub(crate) async fn ready(axum::extract::State(s): axum::extract::State<AppState>) -> Response {
    if s.stopping.is_stopping() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the server is shutting down",
        )
        .into_response();
    }
    match s.jobs.tree().exists("/").await {
        Ok(_) => Json(api::ServiceState {
            status: "ready".into(),
            store: Some(s.jobs.tree().kind().into()),
        })
        .into_response(),
        Err(e) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("store: {e}"),
        )
        .into_response(),
    }
}

/// An error as the API reports it.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
        }
    }
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid", message)
    }
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }
    /// An error the caller cannot act on: the detail (paths, addresses, error chains) goes
    /// to the log only, under an error id that the answer gives, so an operator can match
    /// the two.
    pub fn internal(detail: impl Into<String>) -> ApiError {
        let id = error_id();
        tracing::error!(error_id = %id, detail = %detail.into(), "internal error");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("internal error (error id {id}; the operator's log has the detail)"),
        )
    }

    /// A refusal whose operator detail stays in the log: the caller reads `safe` and the
    /// error id, the log has both and `detail`.
    pub fn logged(status: StatusCode, kind: &'static str, safe: &str, detail: &str) -> ApiError {
        let id = error_id();
        tracing::warn!(error_id = %id, %detail, "{safe}");
        ApiError::new(status, kind, format!("{safe} (error id {id})"))
    }
}

/// A short id for one error, shown to the caller and logged with the detail: unique in this
/// process (a counter) and across restarts (the process's start second).
pub fn error_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let start = *START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    format!(
        "E{:x}-{}",
        start % 0x1_0000_0000,
        N.fetch_add(1, Ordering::Relaxed) + 1
    )
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

/// An operator verb's error ([`ops::Ops`]) as the API reports it: the error it carries,
/// mapped as its type is everywhere else.
impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> ApiError {
        let e = match e.downcast::<ApiError>() {
            Ok(a) => return a,
            Err(e) => e,
        };
        let e = match e.downcast::<lading_engine::EngineError>() {
            Ok(x) => return x.into(),
            Err(e) => e,
        };
        let e = match e.downcast::<lading_ingest::SubmitError>() {
            Ok(x) => return x.into(),
            Err(e) => e,
        };
        match e.downcast::<lading_core::layout::BadId>() {
            Ok(x) => ApiError::bad_request(x.to_string()),
            Err(e) => ApiError::internal(format!("{e:#}")),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"error": self.message, "kind": self.kind})),
        )
            .into_response()
    }
}

impl From<JobsError> for ApiError {
    fn from(e: JobsError) -> ApiError {
        let (status, kind) = match &e {
            JobsError::NoJob { .. }
            | JobsError::NoType(_)
            | JobsError::NoSubscription(_)
            | JobsError::NoSchedule { .. } => (StatusCode::NOT_FOUND, "not_found"),
            JobsError::WrongState { .. } => (StatusCode::CONFLICT, "wrong_state"),
            JobsError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid"),
            JobsError::TooManySubscriptions(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many"),
            JobsError::Halt { .. } => (StatusCode::CONFLICT, "halt"),
            JobsError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            JobsError::Tree(t) if t.is_retryable() => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
            }
            JobsError::Corrupt { .. } | JobsError::Tree(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
        };
        ApiError::new(status, kind, e.to_string())
    }
}

/// A JSON request body, parsed strictly; a rejection is an [`ApiError`] naming the problem.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(rej) => Err(ApiError::new(rej.status(), "invalid", rej.body_text())),
        }
    }
}

/// Query parameters, parsed strictly.
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Query(v)),
            Err(rej) => Err(ApiError::bad_request(rej.body_text())),
        }
    }
}

/// Path parameters; a malformed one is a 400 naming it.
pub struct PathParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(PathParams(v)),
            Err(rej) => Err(ApiError::bad_request(rej.body_text())),
        }
    }
}

/// Serves `router` on `listener` under `limits` until `shutdown` completes (see [`conn`]);
/// `auth` names the client of each request for the per-client limits (the token's name).
pub async fn serve<L: conn::Accept>(
    listener: L,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    limits: conn::Limits,
    auth: Option<Arc<auth::Auth>>,
) -> std::io::Result<()> {
    conn::serve(listener, app, shutdown, limits, auth).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_api_errors_map_to_statuses_that_name_them() {
        let cases = [
            (
                JobsError::NoSubscription(7),
                StatusCode::NOT_FOUND,
                "not_found",
            ),
            (
                JobsError::TooManySubscriptions(100_000),
                StatusCode::TOO_MANY_REQUESTS,
                "too_many",
            ),
            (
                JobsError::Invalid("x".into()),
                StatusCode::BAD_REQUEST,
                "invalid",
            ),
        ];
        for (e, status, kind) in cases {
            let msg = e.to_string();
            let api = ApiError::from(e);
            assert_eq!((api.status, api.kind), (status, kind), "{msg}");
            assert_eq!(api.message, msg);
        }
    }
}
