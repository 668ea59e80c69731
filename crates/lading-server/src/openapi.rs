//! `/api/v1/openapi.json`: the API described from the handlers themselves (`utoipa`: each
//! handler carries its method, path, parameters, body and responses next to its code).

use crate::{access, batches, deletions, download, events, generic, me, metrics, overview, upload};
use axum::Json;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Lading",
        description = "A durable, distributed ingest queue: batches, jobs, generic jobs, access requests."
    ),
    paths(
        crate::index,
        crate::health,
        crate::ready,
        openapi,
        metrics::metrics,
        events::events,
        overview::overview,
        overview::dependencies,
        overview::processes,
        me::me,
        overview::stage_metrics,
        upload::upload,
        download::job_download,
        download::object_download,
        access::request,
        deletions::request,
        deletions::list,
        deletions::show,
        deletions::decide,
        access::status,
        access::show,
        access::file,
        batches::submit,
        batches::list_batches,
        batches::show_batch,
        batches::batch_jobs,
        batches::batch_action,
        batches::list_jobs,
        batches::count_jobs,
        batches::bulk,
        batches::audit,
        batches::show_job,
        batches::job_files,
        batches::job_action,
        batches::hold_collection,
        batches::release_collection,
        batches::pause_queue,
        batches::resume_queue,
        batches::status,
        batches::list_outbox,
        batches::retry_outbox,
        batches::clear_lock,
        batches::batch_history,
        batches::job_history,
        generic::types,
        generic::get_type,
        generic::put_type,
        generic::add,
        generic::list,
        generic::show,
        generic::remove,
        generic::accept,
        generic::update,
        generic::finish,
        generic::finish_and_accept,
        generic::resubmit,
        generic::subscribe,
        generic::wait,
        generic::unsubscribe,
        generic::finish_many,
        generic::retry,
        generic::schedules,
        generic::put_schedule,
        generic::remove_schedule,
    ),
    modifiers(&Bearer),
    security(("bearer" = []))
)]
pub struct ApiDoc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let c = doc.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "service", summary = "This OpenAPI document", responses((status = 200, description = "this document", body = serde_json::Value)), security(()))]
pub(crate) async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    Json(doc)
}
