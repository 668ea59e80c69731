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
pub mod bulk;
pub mod conn;
mod deletions;
pub mod download;
mod errors;
pub mod events;
mod generic;
pub mod me;
pub mod merritt;
mod metrics;
pub mod openapi;
pub mod ops;
pub mod overview;
mod redact;
pub mod upload;

pub use auth::{Admin, Auth, Principal, Role, Worker};
/// The API's router, as [`router`] makes it.
pub use axum::Router;
pub use errors::{ApiError, error_id};

use axum::Json;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use lading_jobs::Jobs;
use serde::de::DeserializeOwned;
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
        .route("/api/v1/processes", get(overview::processes))
        .route("/api/v1/me", get(me::me))
        .route("/api/v1/metrics/stages", get(overview::stage_metrics))
        .route("/api/v1/access", axum::routing::post(access::request))
        .route("/api/v1/access/{token}", get(access::status))
        .route("/api/v1/access-requests/{id}", get(access::show))
        .route("/api/v1/access/{token}/file", get(access::file))
        .route("/api/v1/jobs/{id}/download", get(download::job_download))
        .route("/api/v1/objects/download", get(download::object_download))
        .route(
            "/api/v1/batches/upload",
            axum::routing::post(upload::upload)
                .layer(axum::extract::DefaultBodyLimit::disable())
                .layer(axum::middleware::map_response(upload::close_after_refusal)),
        )
        .merge(batches::routes())
        .merge(generic::routes())
        .merge(deletions::routes())
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
        // The page's markup and its script, kept in two files, served as one page (the
        // script inline, as the policy above allows).
        concat!(
            include_str!("web/index.html"),
            include_str!("web/console.js"),
            "</script>\n</body>\n</html>\n"
        ),
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
        Err(e) => ApiError::unavailable(&e.to_string()).into_response(),
    }
}

/// A JSON request body, parsed strictly; a rejection is an [`ApiError`] naming the problem.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(rej) if rej.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(ApiError::new(
                rej.status(),
                "too_large",
                "the request body is larger than http.max_body_bytes",
            )),
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
