//! The OpenAPI document: served without a token, and it describes every route the server has.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::json;

/// Every route of the router, (method, path). A route added without its description fails.
const ROUTES: &[(&str, &str)] = &[
    ("get", "/"),
    ("get", "/api/v1/health"),
    ("get", "/api/v1/ready"),
    ("get", "/api/v1/openapi.json"),
    ("get", "/metrics"),
    ("get", "/api/v1/events"),
    ("get", "/api/v1/overview"),
    ("get", "/api/v1/dependencies"),
    ("get", "/api/v1/processes"),
    ("get", "/api/v1/me"),
    ("get", "/api/v1/metrics/stages"),
    ("get", "/api/v1/jobs/{id}/files"),
    ("post", "/api/v1/batches/upload"),
    ("get", "/api/v1/jobs/{id}/download"),
    ("get", "/api/v1/objects/download"),
    ("post", "/api/v1/access"),
    ("get", "/api/v1/access/{token}"),
    ("get", "/api/v1/access-requests/{id}"),
    ("get", "/api/v1/access/{token}/file"),
    ("post", "/api/v1/batches"),
    ("get", "/api/v1/batches"),
    ("get", "/api/v1/batches/{id}"),
    ("post", "/api/v1/batches/{id}/{action}"),
    ("get", "/api/v1/jobs"),
    ("get", "/api/v1/jobs/count"),
    ("post", "/api/v1/jobs/bulk"),
    ("get", "/api/v1/audit"),
    ("get", "/api/v1/jobs/{id}"),
    ("get", "/api/v1/jobs/{id}/history"),
    ("get", "/api/v1/batches/{id}/history"),
    ("get", "/api/v1/batches/{id}/jobs"),
    ("post", "/api/v1/jobs/{id}/{action}"),
    ("put", "/api/v1/collections/{name}/hold"),
    ("delete", "/api/v1/collections/{name}/hold"),
    ("put", "/api/v1/queues/{name}/pause"),
    ("delete", "/api/v1/queues/{name}/pause"),
    ("get", "/api/v1/status"),
    ("get", "/api/v1/outbox"),
    ("post", "/api/v1/outbox/{name}/retry"),
    ("delete", "/api/v1/locks/{kind}/{name}"),
    ("get", "/api/v1/types"),
    ("get", "/api/v1/types/{type}"),
    ("put", "/api/v1/types/{type}"),
    ("post", "/api/v1/types/{type}/jobs"),
    ("get", "/api/v1/types/{type}/jobs"),
    ("get", "/api/v1/types/{type}/jobs/{id}"),
    ("delete", "/api/v1/types/{type}/jobs/{id}"),
    ("post", "/api/v1/types/{type}/accept"),
    ("post", "/api/v1/types/{type}/finish"),
    ("post", "/api/v1/types/{type}/jobs/{id}/retry"),
    ("get", "/api/v1/types/{type}/schedules"),
    ("put", "/api/v1/types/{type}/schedules/{name}"),
    ("delete", "/api/v1/types/{type}/schedules/{name}"),
    ("post", "/api/v1/types/{type}/jobs/{id}/update"),
    ("post", "/api/v1/types/{type}/jobs/{id}/finish"),
    ("post", "/api/v1/types/{type}/jobs/{id}/finish-and-accept"),
    ("post", "/api/v1/types/{type}/jobs/{id}/resubmit"),
    ("post", "/api/v1/types/{type}/jobs/{id}/subscribe"),
    ("post", "/api/v1/subscriptions/wait"),
    ("delete", "/api/v1/subscriptions/{subscription}"),
    ("post", "/api/v1/deletions"),
    ("get", "/api/v1/deletions"),
    ("get", "/api/v1/deletions/{id}"),
    ("post", "/api/v1/deletions/{id}/{verb}"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_describes_every_route() {
    let s = start().await;
    let r = s
        .http
        .get(format!("{}/api/v1/openapi.json", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "no token needed");
    let doc: serde_json::Value = r.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let mut described = 0;
    for (method, path) in ROUTES {
        let op = &doc["paths"][path][method];
        assert!(op.is_object(), "{method} {path} is not described");
        assert!(op["summary"].is_string(), "{method} {path} has no summary");
        described += 1;
    }
    let total: usize = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| p.as_object().unwrap().len())
        .sum();
    assert_eq!(
        total, described,
        "the document describes routes the server lacks"
    );
    // Each route is really served (not 404 / 405 from the router).
    for (method, path) in ROUTES {
        let concrete = path
            .replace("{id}", "x")
            .replace("{action}", "hold")
            .replace("{token}", "t")
            .replace("{name}", "ingest")
            .replace("{type}", "t")
            .replace("{subscription}", "1");
        let resp = s
            .http
            .request(
                method.to_uppercase().parse().unwrap(),
                format!("{}{concrete}", s.base),
            )
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        assert_ne!(
            status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}: the router has no such route"
        );
        if status == StatusCode::NOT_FOUND {
            // Ours name what is missing; the router's own 404 is empty.
            let v: serde_json::Value = resp.json().await.unwrap_or_default();
            assert!(
                v["error"].is_string(),
                "{method} {path}: the router has no such route"
            );
        }
    }
    let submit = &doc["components"]["schemas"]["SubmitRequest"];
    assert!(
        submit["required"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("payload_url"))
    );
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}

/// The schemas are the answers' own: every field a served record or answer has is described
/// under its schema (Merritt's extra fields aside), and the states are the engine's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answers_are_described_by_their_schemas() {
    let s = start().await;
    let (_, doc) = s.get(ADMIN, "/api/v1/openapi.json").await;
    let schemas = &doc["components"]["schemas"];
    let described = |name: &str, v: &serde_json::Value| {
        let props = properties(schemas, &schemas[name]);
        assert!(!props.is_empty(), "no schema {name}: {schemas}");
        for k in v.as_object().unwrap().keys() {
            assert!(props.contains(k), "{name} does not describe {k:?}: {v}");
        }
    };
    let sub = s.submit_unfetched(ADMIN).await;
    described("Submitted", &sub);
    let (_, batch) = s
        .get(
            ADMIN,
            &format!("/api/v1/batches/{}", sub["id"].as_str().unwrap()),
        )
        .await;
    described("BatchInfo", &batch);
    let mut status = batch["status"].clone();
    status.as_object_mut().unwrap().remove("history");
    described("BatchStatus", &status);
    let (_, batches) = s.get(ADMIN, "/api/v1/batches").await;
    described("BatchPage", &batches);
    described("BatchRow", &batches["batches"][0]);
    let (_, jobs) = s.get(ADMIN, "/api/v1/jobs?state=Pending").await;
    described("JobRowPage", &jobs);
    let (_, paused) = s
        .call(ADMIN, "PUT", "/api/v1/queues/ingest/pause", None)
        .await;
    described("QueuePause", &paused);
    let (_, held) = s
        .call(ADMIN, "PUT", "/api/v1/collections/demo/hold", None)
        .await;
    described("CollectionHold", &held);
    let (_, outbox) = s.get(ADMIN, "/api/v1/outbox").await;
    described("OutboxList", &outbox);
    let (_, status) = s.get(ADMIN, "/api/v1/status").await;
    described("Summary", &status);
    described("OutboxCounts", &status["outbox"]);
    let (_, overview) = s.get(ADMIN, "/api/v1/overview").await;
    described("Overview", &overview);
    described("Minute", &overview["per_minute"][0]);
    let oldest = &schemas["Overview"]["properties"]["oldest"]["additionalProperties"];
    assert!(
        properties(schemas, oldest).contains(&"since_ms".to_string()),
        "{oldest}"
    );
    for path in ["/api/v1/health", "/api/v1/ready"] {
        let (_, v) = s.get(ADMIN, path).await;
        described("ServiceState", &v);
    }
    let states: Vec<&str> = lading_core::JobState::ALL
        .iter()
        .map(|s| s.name())
        .collect();
    assert_eq!(schemas["JobState"]["enum"], serde_json::json!(states));
    // Generic jobs: every answer of a job's life.
    let ty = "/api/v1/types/conv";
    let (_, t) = s
        .call(ADMIN, "PUT", ty, Some(json!({"timeout_s": 30})))
        .await;
    described("TypeView", &t);
    let (_, added) = s
        .post(ADMIN, &format!("{ty}/jobs"), json!({"id": "a"}))
        .await;
    described("JobAdded", &added);
    let (_, page) = s.get(ADMIN, &format!("{ty}/jobs")).await;
    described("JobPage", &page);
    described("JobView", &page["jobs"][0]);
    let (_, sub) = s
        .post(ADMIN, &format!("{ty}/jobs/a/subscribe"), json!({}))
        .await;
    described("Subscribed", &sub);
    let (_, job) = s.post(ADMIN, &format!("{ty}/accept"), json!({})).await;
    described("JobView", &job);
    let lock = job["lock"].clone();
    let finish = json!({"jobs": [{"id": "a", "lock": lock}, {"id": "b", "lock": "x"}]});
    let (_, done) = s.post(ADMIN, &format!("{ty}/finish"), finish).await;
    described("FinishResults", &done);
    described("FinishResult", &done["results"][0]);
    described("FinishResult", &done["results"][1]);
    let wait = json!({"subscriptions": [sub["subscription"]], "timeout_ms": 1});
    let (_, change) = s.post(ADMIN, "/api/v1/subscriptions/wait", wait).await;
    described("Change", &change);
    let every = json!({"every_s": 60});
    let (_, sch) = s
        .call(ADMIN, "PUT", &format!("{ty}/schedules/n"), Some(every))
        .await;
    described("ScheduleView", &sch);
    let (_, list) = s.get(ADMIN, &format!("{ty}/schedules")).await;
    described("Schedules", &list);
    // No schema is named after a Rust type rather than a record (an alias leaking through).
    for name in ["u64", "u32", "BTreeMap", "HashMap", "Value", "Vec"] {
        assert!(schemas.get(name).is_none(), "a schema named {name}");
    }
    for path in ["/api/v1/batches/{id}", "/api/v1/jobs/{id}"] {
        let body =
            &doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"];
        assert!(
            body["$ref"].is_string(),
            "{path} answers a described record: {body}"
        );
    }
}

/// The property names a schema describes: its own, and those of the schemas it is made of
/// (`allOf`, as a flattened record is described), following references.
fn properties(schemas: &serde_json::Value, schema: &serde_json::Value) -> Vec<String> {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap();
        return properties(schemas, &schemas[name]);
    }
    let mut out: Vec<String> = schema["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    for part in schema["allOf"].as_array().into_iter().flatten() {
        out.extend(properties(schemas, part));
    }
    out
}
