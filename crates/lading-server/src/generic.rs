//! Generic jobs over HTTP: the seed-004 operations under `/api/v1/types/{type}`, with
//! long-polling `accept` and `wait`. Admin tokens, and for accept, update and finish (one or
//! many) processor tokens of the type (`*` below).
//!
//! ```text
//! GET    /api/v1/types                               types, settings, counts
//! PUT    /api/v1/types/{type}                        {"timeout_s"?,"max_attempts"?,"backoff_base_ms"?,
//!                                                     "rate_per_s"?,"keep_finished_s"?,"keep_failed_s"?}
//!                                                    changes those settings (timeout_s makes the type)
//! GET    /api/v1/types/{type}                                                 settings, counts
//! POST   /api/v1/types/{type}/jobs                   {"id","data"?,"scheduled_time"?,"priority"?}  add
//! GET    /api/v1/types/{type}/jobs?state=&after=&limit=                       list
//! GET    /api/v1/types/{type}/jobs/{id}                                       the job
//! DELETE /api/v1/types/{type}/jobs/{id}                                       remove
//! POST   /api/v1/types/{type}/jobs/{id}/retry                                 a failed job: pending
//! GET    /api/v1/types/{type}/schedules                                       schedules
//! PUT    /api/v1/types/{type}/schedules/{name}       {"every_s"|"cron","data"?,"priority"?}
//! DELETE /api/v1/types/{type}/schedules/{name}
//! POST   /api/v1/types/{type}/accept            *    {"max_sched_time"?,"timeout_ms"?,"no_schedule"?,"max_jobs"?}
//!                                                    200 the job with its lock (with max_jobs:
//!                                                    {"jobs": [...]}), 204 none
//! POST   /api/v1/types/{type}/finish            *    {"jobs": [{"id","lock","data"?,"error"?}]}
//!                                                    200 {"results": [...]}, one per job
//! POST   /api/v1/types/{type}/jobs/{id}/update  *    {"lock","data"?}         409 halt
//! POST   /api/v1/types/{type}/jobs/{id}/finish  *    {"lock","data"?,"error"?} 409 halt
//! POST   /api/v1/types/{type}/jobs/{id}/finish-and-accept
//!                                               *    {"lock","data"?,"error"?, and accept's fields}
//!                                                    200 {"finished","next"}, 409 halt
//! POST   /api/v1/types/{type}/jobs/{id}/resubmit     {"lock","scheduled_time"?}
//! POST   /api/v1/types/{type}/jobs/{id}/subscribe    {"subscription","state"}
//! POST   /api/v1/subscriptions/wait                  {"subscriptions","state"?,"timeout_ms"?}
//!                                                    200 the change, 204 none
//! DELETE /api/v1/subscriptions/{subscription}
//! ```

use crate::api::{
    AcceptedJobs, FinishResult, FinishResults, FinishedAndNext, JobAdded, JobPage, Schedules,
    Subscribed,
};
use crate::{Admin, ApiError, AppState, Body, MAX_POLL_MS, PathParams, Query, Worker};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use lading_jobs::{
    AcceptOptions, AddOptions, Cron, Every, Job, JobView, Outcome, ScheduleView, State as JobState,
    TypeUpdate, TypeView,
};
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Duration;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/types", get(types))
        .route("/api/v1/types/{type}", get(get_type).put(put_type))
        .route("/api/v1/types/{type}/jobs", get(list).post(add))
        .route("/api/v1/types/{type}/jobs/{id}", get(show).delete(remove))
        .route("/api/v1/types/{type}/accept", post(accept))
        .route("/api/v1/types/{type}/finish", post(finish_many))
        .route("/api/v1/types/{type}/jobs/{id}/retry", post(retry))
        .route("/api/v1/types/{type}/schedules", get(schedules))
        .route(
            "/api/v1/types/{type}/schedules/{name}",
            axum::routing::put(put_schedule).delete(remove_schedule),
        )
        .route("/api/v1/types/{type}/jobs/{id}/update", post(update))
        .route("/api/v1/types/{type}/jobs/{id}/finish", post(finish))
        .route(
            "/api/v1/types/{type}/jobs/{id}/finish-and-accept",
            post(finish_and_accept),
        )
        .route("/api/v1/types/{type}/jobs/{id}/resubmit", post(resubmit))
        .route("/api/v1/types/{type}/jobs/{id}/subscribe", post(subscribe))
        .route("/api/v1/subscriptions/wait", post(wait))
        .route("/api/v1/subscriptions/{subscription}", delete(unsubscribe))
}

type Result<T, E = ApiError> = std::result::Result<T, E>;

fn poll_timeout(ms: Option<u64>) -> Result<Duration> {
    match ms {
        Some(ms) if ms > MAX_POLL_MS => Err(ApiError::bad_request(format!(
            "timeout_ms {ms} is over the most a request may wait ({MAX_POLL_MS})"
        ))),
        ms => Ok(Duration::from_millis(ms.unwrap_or(0))),
    }
}

fn parse_state(s: &str) -> Result<JobState> {
    Ok(JobState::parse_named(s)?)
}

#[utoipa::path(get, path = "/api/v1/types", tag = "generic jobs", summary = "Generic job types", responses((status = 200, description = "types with their settings and counts", body = Vec<TypeView>), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn types(
    State(s): State<AppState>,
    Admin(_): Admin,
) -> Result<Json<Vec<TypeView>>> {
    let mut out = Vec::new();
    for (ty, settings) in s.jobs.types().await.map_err(ApiError::from)? {
        out.push(s.jobs.type_view(&ty, &settings).await?);
    }
    Ok(Json(out))
}

#[utoipa::path(get, path = "/api/v1/types/{type}", tag = "generic jobs", summary = "A type's timeout and counts", params(("type" = String, Path, description = "job type")), responses((status = 200, description = "the type", body = TypeView), (status = 404, description = "no such type"), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn get_type(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams(ty): PathParams<String>,
) -> Result<Json<TypeView>> {
    let settings = s.jobs.read_type(&ty).await?;
    Ok(Json(s.jobs.type_view(&ty, &settings).await?))
}

/// The settings to change; the others stay. `timeout_s` is needed to make a type. For
/// `rate_per_s`, `keep_finished_s` and `keep_failed_s`, 0 means none (no limit, kept).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TypeBody {
    timeout_s: Option<u64>,
    max_attempts: Option<u32>,
    backoff_base_ms: Option<u64>,
    rate_per_s: Option<u32>,
    keep_finished_s: Option<u64>,
    keep_failed_s: Option<u64>,
}

#[utoipa::path(put, path = "/api/v1/types/{type}", tag = "generic jobs", summary = "Change a type's settings (timeout_s creates the type)", params(("type" = String, Path, description = "job type")), request_body = TypeBody, responses((status = 200, description = "the type", body = TypeView), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn put_type(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams(ty): PathParams<String>,
    Body(b): Body<TypeBody>,
) -> Result<Json<TypeView>> {
    let update = TypeUpdate {
        timeout_s: b.timeout_s,
        max_attempts: b.max_attempts,
        backoff_base_ms: b.backoff_base_ms,
        rate_per_s: b.rate_per_s,
        keep_finished_s: b.keep_finished_s,
        keep_failed_s: b.keep_failed_s,
    };
    let settings = s.jobs.update_type(&ty, &update).await?;
    Ok(Json(s.jobs.type_view(&ty, &settings).await?))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AddBody {
    id: String,
    #[schema(value_type = Option<Object>)]
    data: Option<Value>,
    /// Seconds since the epoch.
    scheduled_time: Option<u64>,
    /// Lower runs first among due jobs: -1000 to 1000 (default 0).
    priority: Option<i32>,
}

#[utoipa::path(post, path = "/api/v1/types/{type}/jobs", tag = "generic jobs", summary = "Add (or re-add) a job", params(("type" = String, Path, description = "job type")), request_body = AddBody, responses((status = 201, description = "created", body = JobAdded), (status = 200, description = "updated, resubmitted or requeued", body = JobAdded), (status = 404, description = "no such type"), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn add(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams(ty): PathParams<String>,
    Body(b): Body<AddBody>,
) -> Result<Response> {
    let added = s
        .jobs
        .add_with(
            &ty,
            &b.id,
            b.data.unwrap_or_else(|| json!({})),
            AddOptions {
                scheduled_time: b.scheduled_time,
                priority: b.priority,
            },
        )
        .await?;
    let status = if added == lading_jobs::Added::Created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(JobAdded {
            ty,
            id: b.id,
            result: added,
        }),
    )
        .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    state: Option<String>,
    after: Option<String>,
    limit: Option<usize>,
}

#[utoipa::path(get, path = "/api/v1/types/{type}/jobs", tag = "generic jobs", summary = "List a type's jobs", params(("type" = String, Path, description = "job type"), ("state" = Option<String>, Query, description = "pending, running, finished or failed"), ("after" = Option<String>, Query, description = "cursor"), ("limit" = Option<usize>, Query, description = "page size")), responses((status = 200, description = "a page of jobs", body = JobPage), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn list(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams(ty): PathParams<String>,
    Query(q): Query<ListQuery>,
) -> Result<Json<JobPage>> {
    let state = q.state.as_deref().map(parse_state).transpose()?;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let jobs = s.jobs.list(&ty, state, q.after.as_deref(), limit).await?;
    let next = (jobs.len() == limit)
        .then(|| jobs.last().map(|j| j.id.clone()))
        .flatten();
    Ok(Json(JobPage {
        jobs,
        next_after: next,
    }))
}

#[utoipa::path(get, path = "/api/v1/types/{type}/jobs/{id}", tag = "generic jobs", summary = "A job", params(("type" = String, Path, description = "job type"), ("id" = String, Path, description = "job id")), responses((status = 200, description = "the job", body = JobView), (status = 404, description = "no such job")))]
pub(crate) async fn show(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams((ty, id)): PathParams<(String, String)>,
) -> Result<Json<JobView>> {
    Ok(Json(s.jobs.get_job(&ty, &id).await?))
}

#[utoipa::path(delete, path = "/api/v1/types/{type}/jobs/{id}", tag = "generic jobs", summary = "Remove a job (its processor gets halt)", params(("type" = String, Path, description = "job type"), ("id" = String, Path, description = "job id")), responses((status = 204, description = "removed"), (status = 404, description = "no such job")))]
pub(crate) async fn remove(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams((ty, id)): PathParams<(String, String)>,
) -> Result<StatusCode> {
    s.jobs.remove(&ty, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AcceptBody {
    max_sched_time: Option<u64>,
    timeout_ms: Option<u64>,
    #[serde(default)]
    no_schedule: bool,
    /// Accept up to this many jobs at once (1 to 1000): the answer is `{"jobs": [...]}`.
    max_jobs: Option<usize>,
}

#[utoipa::path(post, path = "/api/v1/types/{type}/accept", tag = "generic jobs", summary = "Accept the earliest due job (long-poll)", params(("type" = String, Path, description = "job type")), request_body = AcceptBody, responses((status = 200, description = "the job, with its lock; with max_jobs, {\"jobs\": [...]}", body = JobView), (status = 204, description = "none became due in time"), (status = 404, description = "no such type"), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn accept(
    State(s): State<AppState>,
    Worker(_): Worker,
    PathParams(ty): PathParams<String>,
    Body(b): Body<AcceptBody>,
) -> Result<Response> {
    let opts = accept_options(b.max_sched_time, b.timeout_ms, b.no_schedule)?;
    let jobs = s.jobs.clone();
    let Some(max) = b.max_jobs else {
        let ((), mut next) = for_client(&s, async move {
            Ok(((), jobs.accept_many(&ty, 1, &opts).await?))
        })
        .await?;
        return Ok(match next.pop() {
            Some(job) => Json(view(&job)).into_response(),
            None => StatusCode::NO_CONTENT.into_response(),
        });
    };
    let ((), got) = for_client(&s, async move {
        Ok(((), jobs.accept_many(&ty, max, &opts).await?))
    })
    .await?;
    Ok(if got.is_empty() {
        StatusCode::NO_CONTENT.into_response()
    } else {
        let jobs = got.iter().map(view).collect();
        Json(AcceptedJobs { jobs }).into_response()
    })
}

fn accept_options(
    max_sched_time: Option<u64>,
    timeout_ms: Option<u64>,
    no_schedule: bool,
) -> Result<AcceptOptions> {
    Ok(AcceptOptions {
        max_sched_time,
        timeout: poll_timeout(timeout_ms)?,
        no_schedule,
    })
}

fn view(job: &Job) -> JobView {
    JobView {
        ty: job.ty.clone(),
        id: job.id.clone(),
        record: job.record().clone(),
    }
}

/// Runs `work`, which may take jobs for the client, in its own task: if the client goes
/// away meanwhile, jobs taken after that are put straight back instead of running under a
/// lock nobody knows. Returns what `work` returned, unless the server is stopping.
async fn for_client<
    T: Send + 'static,
    J: IntoIterator<Item = Job, IntoIter: Send> + Send + 'static,
>(
    s: &AppState,
    work: impl std::future::Future<Output = lading_jobs::Result<(T, J)>> + Send + 'static,
) -> Result<(T, J)> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let jobs = s.jobs.clone();
    tokio::spawn(async move {
        let mut tx = tx;
        // A client that leaves while its accept still waits takes nothing: the wait ends
        // with it, before any job is claimed.
        let r = tokio::select! {
            biased;
            _ = tx.closed() => return,
            r = work => r,
        };
        if let Err(Ok((_, taken))) = tx.send(r) {
            for mut job in taken {
                let back = async {
                    jobs.resubmit(&mut job, None).await?;
                    jobs.finish(&mut job, None).await
                };
                if let Err(e) = back.await {
                    tracing::warn!("accepted job {} for a client that left: {e}", job.id);
                }
            }
        }
    });
    let r = s.unless_stopping(rx).await?.map_err(|_| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "accept task ended",
        )
    })?;
    Ok(r?)
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FinishAcceptBody {
    lock: String,
    #[schema(value_type = Option<Object>)]
    data: Option<Value>,
    /// The run failed with this message (retried by the type's policy).
    error: Option<String>,
    max_sched_time: Option<u64>,
    timeout_ms: Option<u64>,
    #[serde(default)]
    no_schedule: bool,
}

#[utoipa::path(post, path = "/api/v1/types/{type}/jobs/{id}/finish-and-accept", tag = "generic jobs", summary = "Finish a job and accept the next (one round trip)", description = "Finishes the job as `finish` does and accepts the next due job of the type as `accept` does (long-poll). Under a backlog the finish and the claim are one store transaction. `next` is null when none came in time.", params(("type" = String, Path, description = "job type"), ("id" = String, Path, description = "job id")), request_body = FinishAcceptBody, responses((status = 200, description = "the job finished, and the next job with its lock (or null)", body = FinishedAndNext), (status = 409, description = "halt: nothing was written and no job was taken"), (status = 400, description = "bad input (the error names it)")))]
pub(crate) async fn finish_and_accept(
    State(s): State<AppState>,
    Worker(_): Worker,
    PathParams((ty, id)): PathParams<(String, String)>,
    Body(b): Body<FinishAcceptBody>,
) -> Result<Json<FinishedAndNext>> {
    let opts = accept_options(b.max_sched_time, b.timeout_ms, b.no_schedule)?;
    let mut job = s.jobs.held(&ty, &id, &b.lock).await?;
    let jobs = s.jobs.clone();
    let (finished, next) = for_client(&s, async move {
        let next = match b.error {
            None => jobs.finish_then_accept(&mut job, b.data, &opts).await?,
            Some(message) => {
                let outcome = Outcome::Error {
                    message,
                    data: b.data,
                };
                jobs.finish_with(&mut job, outcome).await?;
                jobs.accept(&ty, &opts).await?
            }
        };
        Ok((job, next))
    })
    .await?;
    Ok(Json(FinishedAndNext {
        finished: view(&finished),
        next: next.as_ref().map(view),
    }))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct HeldBody {
    lock: String,
    #[schema(value_type = Option<Object>)]
    data: Option<Value>,
    /// resubmit only: seconds since the epoch.
    scheduled_time: Option<u64>,
    /// finish only: the run failed with this message (retried by the type's policy, failed
    /// after its last attempt).
    error: Option<String>,
}

enum HeldOp {
    Update,
    Finish,
    Resubmit,
}

async fn held(
    s: AppState,
    ty: String,
    id: String,
    b: HeldBody,
    op: HeldOp,
) -> Result<Json<JobView>> {
    if b.scheduled_time.is_some() && !matches!(op, HeldOp::Resubmit) {
        return Err(ApiError::bad_request(
            "scheduled_time applies to resubmit only",
        ));
    }
    if b.error.is_some() && !matches!(op, HeldOp::Finish) {
        return Err(ApiError::bad_request("error applies to finish only"));
    }
    let mut job = s.jobs.held(&ty, &id, &b.lock).await?;
    match op {
        HeldOp::Update => s.jobs.update(&mut job, b.data).await?,
        HeldOp::Finish => {
            let outcome = match b.error {
                None => Outcome::Success(b.data),
                Some(message) => Outcome::Error {
                    message,
                    data: b.data,
                },
            };
            s.jobs.finish_with(&mut job, outcome).await?
        }
        HeldOp::Resubmit => {
            if b.data.is_some() {
                return Err(ApiError::bad_request("resubmit takes no data"));
            }
            s.jobs.resubmit(&mut job, b.scheduled_time).await?
        }
    }
    Ok(Json(JobView {
        ty,
        id,
        record: job.record().clone(),
    }))
}

/// The handler of one [`HeldOp`]: who may call it, its path, and what a 409 means.
macro_rules! held_handler {
    ($name:ident, $op:ident, $role:ident, $path:tt, $summary:tt, $conflict:tt) => {
        #[utoipa::path(post, path = $path, tag = "generic jobs", summary = $summary, params(("type" = String, Path, description = "job type"), ("id" = String, Path, description = "job id")), request_body = HeldBody, responses((status = 200, description = "the job", body = JobView), (status = 409, description = $conflict)))]
        pub(crate) async fn $name(
            State(s): State<AppState>,
            $role(_): $role,
            PathParams((ty, id)): PathParams<(String, String)>,
            Body(b): Body<HeldBody>,
        ) -> Result<Json<JobView>> {
            held(s, ty, id, b, HeldOp::$op).await
        }
    };
}

held_handler!(
    update,
    Update,
    Worker,
    "/api/v1/types/{type}/jobs/{id}/update",
    "Heartbeat, with new data",
    "halt: stop running the job"
);
held_handler!(
    finish,
    Finish,
    Worker,
    "/api/v1/types/{type}/jobs/{id}/finish",
    "Finish a job",
    "halt: nothing was written"
);
held_handler!(
    resubmit,
    Resubmit,
    Admin,
    "/api/v1/types/{type}/jobs/{id}/resubmit",
    "Ask for another run when this one finishes",
    "halt"
);

#[utoipa::path(post, path = "/api/v1/types/{type}/jobs/{id}/subscribe", tag = "generic jobs", summary = "Subscribe to a job's state changes", params(("type" = String, Path, description = "job type"), ("id" = String, Path, description = "job id")), responses((status = 200, description = "the subscription and the current state", body = Subscribed), (status = 404, description = "no such job"), (status = 429, description = "this server holds its most subscriptions (100,000); end some first")))]
pub(crate) async fn subscribe(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams((ty, id)): PathParams<(String, String)>,
) -> Result<Json<Subscribed>> {
    let (subscription, state) = s.jobs.subscribe(&ty, &id).await?;
    Ok(Json(Subscribed {
        subscription,
        state,
    }))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaitBody {
    subscriptions: Vec<u64>,
    state: Option<String>,
    timeout_ms: Option<u64>,
}

#[utoipa::path(post, path = "/api/v1/subscriptions/wait", tag = "generic jobs", summary = "Wait for the next change (long-poll)", request_body = WaitBody, responses((status = 200, description = "the change", body = lading_jobs::Change), (status = 204, description = "no change in time"), (status = 404, description = "no such subscription"), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn wait(
    State(s): State<AppState>,
    Admin(_): Admin,
    Body(b): Body<WaitBody>,
) -> Result<Response> {
    let state = b.state.as_deref().map(parse_state).transpose()?;
    let timeout = poll_timeout(b.timeout_ms)?;
    let r = s
        .unless_stopping(s.jobs.wait(&b.subscriptions, state, timeout))
        .await?;
    Ok(match r? {
        Some(change) => Json(change).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

#[utoipa::path(delete, path = "/api/v1/subscriptions/{subscription}", tag = "generic jobs", summary = "End a subscription", params(("subscription" = u64, Path, description = "subscription id")), responses((status = 204, description = "ended"), (status = 404, description = "no such subscription")))]
pub(crate) async fn unsubscribe(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams(sid): PathParams<u64>,
) -> Result<StatusCode> {
    if s.jobs.unsubscribe(sid) {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(lading_jobs::JobsError::NoSubscription(sid).into())
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FinishItem {
    id: String,
    lock: String,
    #[schema(value_type = Option<Object>)]
    data: Option<Value>,
    error: Option<String>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FinishManyBody {
    jobs: Vec<FinishItem>,
}

#[utoipa::path(post, path = "/api/v1/types/{type}/finish", tag = "generic jobs", summary = "Finish many jobs in one store transaction", description = "Each item ends its run as `finish` does (an `error` fails the run). One result per item, in order: `{\"id\", \"state\"}` or `{\"id\", \"error\", \"kind\"}` (kind `halt` when the lock no longer holds the job: nothing was written for it).", params(("type" = String, Path, description = "job type")), request_body = FinishManyBody, responses((status = 200, description = "one result per job", body = FinishResults), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub(crate) async fn finish_many(
    State(s): State<AppState>,
    Worker(_): Worker,
    PathParams(ty): PathParams<String>,
    Body(b): Body<FinishManyBody>,
) -> Result<Json<FinishResults>> {
    if b.jobs.is_empty() || b.jobs.len() > lading_jobs::MAX_BATCH {
        return Err(ApiError::bad_request(format!(
            "jobs must hold 1 to {} items, not {}",
            lading_jobs::MAX_BATCH,
            b.jobs.len()
        )));
    }
    let mut held = Vec::with_capacity(b.jobs.len());
    let mut outcomes = Vec::with_capacity(b.jobs.len());
    let mut results: Vec<Option<FinishResult>> = Vec::with_capacity(b.jobs.len());
    for item in b.jobs {
        match s.jobs.held(&ty, &item.id, &item.lock).await {
            Ok(job) => {
                held.push(job);
                outcomes.push(match item.error {
                    None => Outcome::Success(item.data),
                    Some(message) => Outcome::Error {
                        message,
                        data: item.data,
                    },
                });
                results.push(None);
            }
            Err(e) => results.push(Some(item_error(&item.id, e))),
        }
    }
    let done = s.jobs.finish_many(&mut held, outcomes).await;
    let mut done = held.iter().zip(done);
    let results = results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                let (job, r) = done.next().expect("one result per held job");
                match r {
                    Ok(()) => FinishResult {
                        id: job.id.clone(),
                        state: Some(job.record().state),
                        error: None,
                        kind: None,
                    },
                    Err(e) => item_error(&job.id, e),
                }
            })
        })
        .collect();
    Ok(Json(FinishResults { results }))
}

fn item_error(id: &str, e: lading_jobs::JobsError) -> FinishResult {
    let api = ApiError::from(e);
    FinishResult {
        id: id.into(),
        state: None,
        error: Some(api.message),
        kind: Some(api.kind.to_string()),
    }
}

#[utoipa::path(post, path = "/api/v1/types/{type}/jobs/{id}/retry", tag = "generic jobs", summary = "Retry a failed job (pending now, attempts reset)", params(("type" = String, Path, description = "job type"), ("id" = String, Path, description = "job id")), responses((status = 200, description = "the job", body = JobView), (status = 404, description = "no such job"), (status = 409, description = "the job is not failed: nothing changed")))]
pub(crate) async fn retry(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams((ty, id)): PathParams<(String, String)>,
) -> Result<Json<JobView>> {
    Ok(Json(s.jobs.retry(&ty, &id).await?))
}

#[utoipa::path(get, path = "/api/v1/types/{type}/schedules", tag = "generic jobs", summary = "A type's schedules", params(("type" = String, Path, description = "job type")), responses((status = 200, description = "the schedules, with their next tick", body = Schedules), (status = 404, description = "no such type")))]
pub(crate) async fn schedules(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams(ty): PathParams<String>,
) -> Result<Json<Schedules>> {
    let list = s.jobs.schedules(&ty).await?;
    let schedules = list.iter().map(|(n, sch)| sch.view(n)).collect();
    Ok(Json(Schedules { schedules }))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScheduleBody {
    /// Every this many seconds (ticks at multiples of it since the epoch).
    every_s: Option<u64>,
    /// Or a cron expression, `m h dom mon dow`, UTC.
    cron: Option<String>,
    #[schema(value_type = Option<Object>)]
    data: Option<Value>,
    #[serde(default)]
    priority: i32,
}

#[utoipa::path(put, path = "/api/v1/types/{type}/schedules/{name}", tag = "generic jobs", summary = "Make or replace a schedule: one job NAME@TICK per tick, exactly once", params(("type" = String, Path, description = "job type"), ("name" = String, Path, description = "schedule name")), request_body = ScheduleBody, responses((status = 200, description = "the schedule", body = ScheduleView), (status = 400, description = "bad input (the error names it)"), (status = 404, description = "no such type")))]
pub(crate) async fn put_schedule(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams((ty, name)): PathParams<(String, String)>,
    Body(b): Body<ScheduleBody>,
) -> Result<Json<ScheduleView>> {
    let every = match (b.every_s, b.cron) {
        (Some(n), None) => Every::Seconds(n),
        (None, Some(c)) => Every::Cron(Cron::parse(&c)?),
        _ => {
            return Err(ApiError::bad_request(
                "give either every_s (seconds) or cron (\"m h dom mon dow\"), not both or neither",
            ));
        }
    };
    let sch = s
        .jobs
        .set_schedule(
            &ty,
            &name,
            every,
            b.data.unwrap_or_else(|| json!({})),
            b.priority,
        )
        .await?;
    Ok(Json(sch.view(&name)))
}

#[utoipa::path(delete, path = "/api/v1/types/{type}/schedules/{name}", tag = "generic jobs", summary = "Remove a schedule (the jobs it added stay)", params(("type" = String, Path, description = "job type"), ("name" = String, Path, description = "schedule name")), responses((status = 204, description = "removed"), (status = 404, description = "no such schedule")))]
pub(crate) async fn remove_schedule(
    State(s): State<AppState>,
    Admin(_): Admin,
    PathParams((ty, name)): PathParams<(String, String)>,
) -> Result<StatusCode> {
    s.jobs.remove_schedule(&ty, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
