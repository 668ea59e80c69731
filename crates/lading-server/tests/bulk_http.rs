//! Finding jobs and acting on many at once over real HTTP: the filters of `GET
//! /api/v1/jobs` and its count, a bulk requeue and delete of what a filter selects (at most
//! the confirmed count), their record in the audit log, and bad input refused with every job
//! left as it was.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;

async fn count(s: &Server, query: &str) -> Value {
    let (st, v) = s.get(ADMIN, &format!("/api/v1/jobs/count?{query}")).await;
    assert_eq!(st, StatusCode::OK, "{query}: {v}");
    v
}

/// The jobs a filter lists (every page).
async fn listed(s: &Server, query: &str) -> Vec<String> {
    let (st, v) = s.get(ADMIN, &format!("/api/v1/jobs?{query}")).await;
    assert_eq!(st, StatusCode::OK, "{query}: {v}");
    assert!(v["next_after"].is_null(), "one page: {v}");
    v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_string())
        .collect()
}

/// Starts a bulk operation and waits for it to finish; its record in the audit log.
async fn bulk(s: &Server, body: Value) -> Value {
    let (st, op) = s.post(ADMIN, "/api/v1/jobs/bulk", body).await;
    assert_eq!(st, StatusCode::ACCEPTED, "{op}");
    assert_eq!(op["state"], "running", "{op}");
    let id = op["id"].as_str().unwrap().to_string();
    // It runs on in the server: its progress is in the audit log, which no event announces.
    let mut done = Value::Null;
    lading_testkit::poll::until_true(
        "the operation finishes",
        Duration::from_secs(60),
        async || {
            let (_, log) = s.get(ADMIN, "/api/v1/audit").await;
            done = log
                .as_array()
                .and_then(|ops| ops.iter().find(|o| o["id"] == id.as_str()).cloned())
                .unwrap_or(Value::Null);
            done["state"] == "finished"
        },
    )
    .await;
    done
}

async fn state_of(s: &Server, job: &str) -> String {
    let (_, v) = s.get(ADMIN, &format!("/api/v1/jobs/{job}")).await;
    v["status"]["status"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_find_jobs_and_a_bulk_requeue_acts_on_at_most_the_count_confirmed() {
    let s = start().await;
    let ids = failed_jobs_of_two_collections(&s).await;
    // Filters: collection, message (any case), profile, submitter, batch, stage, kind.
    let refused_letters = "state=Failed&collection=letters&message=refused";
    assert_eq!(
        count(&s, refused_letters).await,
        json!({"state": "Failed", "matched": 3, "scanned": 6, "complete": true})
    );
    assert_eq!(
        listed(&s, refused_letters).await,
        [ids[0].clone(), ids[1].clone(), ids[3].clone()]
    );
    assert_eq!(
        listed(&s, "state=Failed&profile=maps_profile").await,
        ids[4..].to_vec()
    );
    let (_, j) = s.get(ADMIN, &format!("/api/v1/jobs/{}", ids[0])).await;
    let batch = j["bid"].as_str().unwrap();
    for (query, matched) in [
        (format!("state=Failed&batch={batch}&submitter=alice"), 6),
        ("state=Failed&submitter=bob".to_string(), 0),
        (
            "state=Failed&stage=Pending&failure_kind=fatal".to_string(),
            6,
        ),
        ("state=Failed&failure_kind=exhausted".to_string(), 0),
        ("state=Failed&older_than_min=60".to_string(), 0),
        ("state=Failed&older_than_min=0&q=jid".to_string(), 6),
        ("state=Pending&collection=letters".to_string(), 0),
    ] {
        assert_eq!(count(&s, &query).await["matched"], matched, "{query}");
    }

    // Bad filters and requests are named, and change nothing.
    for (query, says) in [
        ("state=Nope", "Nope"),
        ("state=Failed&colour=red", "colour"),
        ("state=Failed&failure_kind=sometimes", "failure_kind"),
        (
            &*format!("state=Failed&message={}", "x".repeat(201)),
            "message is 201 bytes",
        ),
    ] {
        let (st, v) = s.get(ADMIN, &format!("/api/v1/jobs/count?{query}")).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{query}: {v}");
        assert!(v["error"].as_str().unwrap().contains(says), "{says}: {v}");
    }
    let filter = json!({"state": "Failed", "collection": "letters", "message": "refused"});
    for (body, says) in [
        (
            json!({"action": "explode", "filter": filter, "max": 3}),
            "unknown action",
        ),
        (
            json!({"action": "requeue", "filter": filter, "max": 0}),
            "max must be at least 1",
        ),
        (
            json!({"action": "requeue", "filter": {"state": "Failed", "x": 1}, "max": 3}),
            "x",
        ),
        (json!({"action": "requeue", "filter": filter}), "max"),
    ] {
        let (st, v) = s.post(ADMIN, "/api/v1/jobs/bulk", body).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
        assert!(v["error"].as_str().unwrap().contains(says), "{says}: {v}");
    }
    // Operators only.
    for (path, body) in [
        ("/api/v1/jobs/count?state=Failed", None),
        ("/api/v1/audit", None),
        (
            "/api/v1/jobs/bulk",
            Some(json!({"action": "delete", "filter": {"state": "Failed"}, "max": 6})),
        ),
    ] {
        let (st, v) = match body {
            None => s.get(SUBMITTER, path).await,
            Some(b) => s.post(SUBMITTER, path, b).await,
        };
        assert_eq!(st, StatusCode::FORBIDDEN, "{path}: {v}");
    }
    for id in &ids {
        assert_eq!(state_of(&s, id).await, "Failed", "{id} untouched");
    }
    let (_, log) = s.get(ADMIN, "/api/v1/audit").await;
    assert_eq!(log, json!([]), "nothing was done");

    // The admin confirmed 2 of the 3: two are requeued (to the stage they failed at), in
    // acquisition order; the third stays Failed.
    let op = bulk(&s, json!({"action": "requeue", "filter": filter, "max": 2})).await;
    assert_eq!(
        (
            &op["who"],
            &op["action"],
            &op["matched"],
            &op["done"],
            &op["refused_count"]
        ),
        (
            &json!("root"),
            &json!("requeue"),
            &json!(2),
            &json!(2),
            &json!(0)
        ),
        "{op}"
    );
    assert_eq!(op["filter"]["collection"], "letters", "{op}");
    assert!(
        op["finished_at_ms"].as_u64() >= op["started_at_ms"].as_u64(),
        "{op}"
    );
    let states: Vec<String> = states_of(&s, &ids).await;
    assert_eq!(
        states,
        ["Pending", "Pending", "Failed", "Failed", "Failed", "Failed"]
    );
    assert_eq!(count(&s, refused_letters).await["matched"], 1);

    // Every Failed job of maps deleted; the audit log lists both operations, newest first.
    let op = bulk(
        &s,
        json!({"action": "delete", "filter": {"state": "Failed", "collection": "maps"}, "max": 5}),
    )
    .await;
    assert_eq!(
        (&op["matched"], &op["done"]),
        (&json!(2), &json!(2)),
        "{op}"
    );
    assert_eq!(state_of(&s, &ids[4]).await, "Deleted");
    let (_, log) = s.get(ADMIN, "/api/v1/audit").await;
    let actions: Vec<&str> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["delete", "requeue"], "{log}");
}

async fn states_of(s: &Server, ids: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for id in ids {
        out.push(state_of(s, id).await);
    }
    out
}
