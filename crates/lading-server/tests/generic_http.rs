//! Generic jobs over real HTTP on loopback, against a real SQLite store: every operation,
//! long-polls woken by changes, auth, and bad input refused with nothing stored changed.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_over_http() {
    let s = start().await;
    let (st, _) = s
        .call("PUT", "/api/v1/types/conv", Some(json!({"timeout_s": 30})))
        .await;
    assert_eq!(st, StatusCode::OK);
    let (st, v) = s
        .call(
            "POST",
            "/api/v1/types/conv/jobs",
            Some(json!({"id": "a", "data": {"n": 1}})),
        )
        .await;
    assert_eq!(
        (st, v["result"].as_str()),
        (StatusCode::CREATED, Some("created"))
    );
    let (st, v) = s.call("GET", "/api/v1/types/conv/jobs/a", None).await;
    assert_eq!((st, v["state"].as_str()), (StatusCode::OK, Some("pending")));

    let (_, sub) = s
        .call("POST", "/api/v1/types/conv/jobs/a/subscribe", None)
        .await;
    assert_eq!(sub["state"], "pending");
    let sid = sub["subscription"].as_u64().unwrap();

    let (st, job) = s
        .call("POST", "/api/v1/types/conv/accept", Some(json!({})))
        .await;
    assert_eq!((st, job["id"].as_str()), (StatusCode::OK, Some("a")));
    let lock = job["lock"].as_str().unwrap().to_string();
    let (st, change) = s
        .call(
            "POST",
            "/api/v1/subscriptions/wait",
            Some(json!({"subscriptions": [sid], "timeout_ms": 5000})),
        )
        .await;
    assert_eq!(
        (st, change["state"].as_str()),
        (StatusCode::OK, Some("running"))
    );

    let (st, v) = s
        .call(
            "POST",
            "/api/v1/types/conv/jobs/a/update",
            Some(json!({"lock": lock, "data": {"n": 1, "half": true}})),
        )
        .await;
    assert_eq!((st, &v["data"]["half"]), (StatusCode::OK, &json!(true)));
    // A wrong lock: 409 halt, nothing written.
    let before = s.stored().await;
    let (st, v) = s
        .call(
            "POST",
            "/api/v1/types/conv/jobs/a/finish",
            Some(json!({"lock": "not-the-lock", "data": {}})),
        )
        .await;
    assert_eq!(
        (st, v["kind"].as_str()),
        (StatusCode::CONFLICT, Some("halt"))
    );
    assert_eq!(s.stored().await, before);
    let (st, v) = s
        .call(
            "POST",
            "/api/v1/types/conv/jobs/a/finish",
            Some(json!({"lock": lock, "data": {"done": 1}})),
        )
        .await;
    assert_eq!(
        (st, v["state"].as_str()),
        (StatusCode::OK, Some("finished"))
    );
    let (_, change) = s
        .call(
            "POST",
            "/api/v1/subscriptions/wait",
            Some(json!({"subscriptions": [sid], "state": "finished", "timeout_ms": 5000})),
        )
        .await;
    assert_eq!(change["state"], "finished");
    let (st, _) = s
        .call("DELETE", &format!("/api/v1/subscriptions/{sid}"), None)
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);

    // Nothing due: 204 at once; a long-poll is woken by an add.
    let (st, _) = s
        .call("POST", "/api/v1/types/conv/accept", Some(json!({})))
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let s = Arc::new(s);
    let s2 = s.clone();
    let poll = tokio::spawn(async move {
        s2.call(
            "POST",
            "/api/v1/types/conv/accept",
            Some(json!({"timeout_ms": 60000})),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    s.call("POST", "/api/v1/types/conv/jobs", Some(json!({"id": "b"})))
        .await;
    let (st, job) = poll.await.unwrap();
    assert_eq!((st, job["id"].as_str()), (StatusCode::OK, Some("b")));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "woken, not timed out"
    );
    let lock = job["lock"].as_str().unwrap();
    let (st, v) = s
        .call(
            "POST",
            "/api/v1/types/conv/jobs/b/resubmit",
            Some(json!({"lock": lock})),
        )
        .await;
    assert_eq!((st, v["resubmit"].as_bool()), (StatusCode::OK, Some(true)));
    s.call(
        "POST",
        "/api/v1/types/conv/jobs/b/finish",
        Some(json!({"lock": lock})),
    )
    .await;
    let (_, list) = s
        .call("GET", "/api/v1/types/conv/jobs?state=pending", None)
        .await;
    let ids: Vec<&str> = list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["b"], "resubmitted: pending again");
    let (_, types) = s.call("GET", "/api/v1/types", None).await;
    assert_eq!(types[0]["finished"], 1);
    let (st, _) = s.call("DELETE", "/api/v1/types/conv/jobs/b", None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, _) = s.call("GET", "/api/v1/types/conv/jobs/b", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_json_errors_and_change_nothing() {
    let s = start().await;
    s.call("PUT", "/api/v1/types/conv", Some(json!({"timeout_s": 30})))
        .await;
    s.call(
        "POST",
        "/api/v1/types/conv/jobs",
        Some(json!({"id": "keep", "data": {"v": 1}})),
    )
    .await;
    let before = s.stored().await;
    let cases: Vec<(&str, &str, &str, StatusCode, &str)> = vec![
        (
            "POST",
            "/api/v1/types/conv/jobs",
            "{not json",
            StatusCode::BAD_REQUEST,
            "JSON",
        ),
        (
            "POST",
            "/api/v1/types/conv/jobs",
            r#"{"id": "x", "colour": 1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown field `colour`",
        ),
        (
            "POST",
            "/api/v1/types/conv/jobs",
            r#"{"id": "../etc"}"#,
            StatusCode::BAD_REQUEST,
            "job id \"../etc\"",
        ),
        (
            "POST",
            "/api/v1/types/nosuch/jobs",
            r#"{"id": "x"}"#,
            StatusCode::NOT_FOUND,
            "no activity timeout",
        ),
        (
            "PUT",
            "/api/v1/types/conv",
            r#"{"timeout_s": 0}"#,
            StatusCode::BAD_REQUEST,
            "must be 1 to",
        ),
        (
            "POST",
            "/api/v1/types/conv/accept",
            r#"{"timeout_ms": 999999999}"#,
            StatusCode::BAD_REQUEST,
            "timeout_ms",
        ),
        (
            "POST",
            "/api/v1/types/conv/jobs/keep/finish",
            r#"{"lock": "nope"}"#,
            StatusCode::CONFLICT,
            "halt",
        ),
        (
            "POST",
            "/api/v1/types/conv/jobs/keep/finish-and-accept",
            r#"{"lock": "nope"}"#,
            StatusCode::CONFLICT,
            "halt",
        ),
        (
            "POST",
            "/api/v1/types/conv/jobs/keep/finish-and-accept",
            r#"{"lock": "nope", "timeout_ms": 999999999}"#,
            StatusCode::BAD_REQUEST,
            "timeout_ms",
        ),
        (
            "POST",
            "/api/v1/types/conv/jobs/keep/finish-and-accept",
            r#"{"lock": "nope", "next": true}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown field `next`",
        ),
        (
            "POST",
            "/api/v1/types/conv/jobs/keep/update",
            r#"{"lock": "nope", "scheduled_time": 5}"#,
            StatusCode::BAD_REQUEST,
            "resubmit only",
        ),
        (
            "DELETE",
            "/api/v1/types/conv/jobs/ghost",
            "",
            StatusCode::NOT_FOUND,
            "no job \"ghost\"",
        ),
        (
            "POST",
            "/api/v1/subscriptions/wait",
            r#"{"subscriptions": [12345]}"#,
            StatusCode::NOT_FOUND,
            "no subscription 12345",
        ),
        (
            "GET",
            "/api/v1/types/conv/jobs?state=done",
            "",
            StatusCode::BAD_REQUEST,
            "unknown state",
        ),
    ];
    for (method, path, body, status, says) in cases {
        let (st, v) = s.raw(method, path, body).await;
        assert_eq!(st, status, "{method} {path} {body}: {v}");
        let msg = v["error"].as_str().unwrap_or_default();
        assert!(
            msg.contains(says),
            "{method} {path}: {msg:?} should name {says:?}"
        );
        assert_eq!(
            s.stored().await,
            before,
            "{method} {path} changed the store"
        );
    }

    // Auth: no token, a wrong token → 401; a submitter token → 403. Nothing happens.
    let resp = s
        .http
        .post(format!("{}/api/v1/types/conv/jobs", s.base))
        .json(&json!({"id": "sneaky"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let (st, v) = s
        .call_as(
            "wrong-token-0123456789",
            "POST",
            "/api/v1/types/conv/jobs",
            Some(json!({"id": "sneaky"})),
        )
        .await;
    assert_eq!(
        (st, v["kind"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthorized"))
    );
    let (st, v) = s
        .call_as(SUBMITTER, "DELETE", "/api/v1/types/conv/jobs/keep", None)
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(s.stored().await, before);
    // Health and readiness need no token.
    for path in ["/api/v1/health", "/api/v1/ready"] {
        let resp = s
            .http
            .get(format!("{}{path}", s.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_taken_for_a_client_that_left_goes_back_to_pending() {
    let s = start().await;
    s.call("PUT", "/api/v1/types/conv", Some(json!({"timeout_s": 30})))
        .await;
    // The client gives up after 300 ms; the server is still waiting for a job for it.
    let r = s
        .http
        .post(format!("{}/api/v1/types/conv/accept", s.base))
        .bearer_auth(ADMIN)
        .json(&json!({"timeout_ms": 3000}))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(r.is_err(), "the client timed out");
    s.call(
        "POST",
        "/api/v1/types/conv/jobs",
        Some(json!({"id": "orphan"})),
    )
    .await;
    // Whether the server noticed at once or took the job and put it back, the job ends up
    // pending and a present client gets it.
    let (st, job) = s
        .call(
            "POST",
            "/api/v1/types/conv/accept",
            Some(json!({"timeout_ms": 10000})),
        )
        .await;
    assert_eq!((st, job["id"].as_str()), (StatusCode::OK, Some("orphan")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_and_accept_hands_over_the_next_job_in_one_request() {
    let s = start().await;
    s.call("PUT", "/api/v1/types/conv", Some(json!({"timeout_s": 30})))
        .await;
    for id in ["a", "b"] {
        s.call("POST", "/api/v1/types/conv/jobs", Some(json!({"id": id})))
            .await;
    }
    let (_, a) = s
        .call("POST", "/api/v1/types/conv/accept", Some(json!({})))
        .await;
    assert_eq!(a["id"], "a");
    let lock_a = a["lock"].as_str().unwrap().to_string();
    let (st, v) = s
        .call(
            "POST",
            "/api/v1/types/conv/jobs/a/finish-and-accept",
            Some(json!({"lock": lock_a, "data": {"done": true}})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (
            &v["finished"]["id"],
            &v["finished"]["state"],
            &v["finished"]["data"]
        ),
        (&json!("a"), &json!("finished"), &json!({"done": true}))
    );
    assert_eq!(
        (&v["next"]["id"], &v["next"]["state"]),
        (&json!("b"), &json!("running"))
    );
    let lock_b = v["next"]["lock"].as_str().unwrap().to_string();
    // The finished job's lock is spent: halt, and nothing changes.
    let before = s.stored().await;
    let (st, v) = s
        .call(
            "POST",
            "/api/v1/types/conv/jobs/a/finish-and-accept",
            Some(json!({"lock": lock_a})),
        )
        .await;
    assert_eq!(
        (st, v["kind"].as_str()),
        (StatusCode::CONFLICT, Some("halt"))
    );
    assert_eq!(s.stored().await, before);
    // The next job holds under its own lock; with nothing left due, `next` is null at once.
    let (st, v) = s
        .call(
            "POST",
            "/api/v1/types/conv/jobs/b/finish-and-accept",
            Some(json!({"lock": lock_b, "timeout_ms": 0})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["finished"]["state"], "finished");
    assert!(v["next"].is_null(), "{v}");
    let (_, types) = s.call("GET", "/api/v1/types", None).await;
    assert_eq!(
        (
            &types[0]["pending"],
            &types[0]["running"],
            &types[0]["finished"]
        ),
        (&json!(0), &json!(0), &json!(2))
    );
}
