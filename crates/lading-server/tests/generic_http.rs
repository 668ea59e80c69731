//! Generic jobs over real HTTP on loopback, against a real SQLite store: every operation,
//! long-polls woken by changes, auth, and bad input refused with nothing stored changed.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;

/// A generic-job type's part of the API, called as the admin; paths are relative to
/// `/api/v1/types/NAME`.
struct TypeApi<'a> {
    s: &'a Server,
    base: String,
}

impl<'a> TypeApi<'a> {
    fn of(s: &'a Server, name: &str) -> TypeApi<'a> {
        let base = format!("/api/v1/types/{name}");
        TypeApi { s, base }
    }

    async fn call(&self, method: &str, rest: &str, body: Option<Value>) -> (StatusCode, Value) {
        let path = format!("{}{rest}", self.base);
        self.s.call(ADMIN, method, &path, body).await
    }

    async fn get(&self, rest: &str) -> (StatusCode, Value) {
        self.call("GET", rest, None).await
    }

    async fn post(&self, rest: &str, body: Value) -> (StatusCode, Value) {
        self.call("POST", rest, Some(body)).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_over_http() {
    let s = start().await;
    let conv = TypeApi::of(&s, "conv");
    let (st, _) = conv.call("PUT", "", Some(json!({"timeout_s": 30}))).await;
    assert_eq!(st, StatusCode::OK);
    let (st, v) = conv
        .post("/jobs", json!({"id": "a", "data": {"n": 1}}))
        .await;
    answered((st, &v), StatusCode::CREATED, "result", "created");
    let (st, v) = conv.get("/jobs/a").await;
    answered((st, &v), StatusCode::OK, "state", "pending");

    let (_, sub) = conv.call("POST", "/jobs/a/subscribe", None).await;
    assert_eq!(sub["state"], "pending");
    let sid = sub["subscription"].as_u64().unwrap();

    let (st, job) = conv.post("/accept", json!({})).await;
    answered((st, &job), StatusCode::OK, "id", "a");
    let lock = job["lock"].as_str().unwrap().to_string();
    let (st, change) = s
        .post(
            ADMIN,
            "/api/v1/subscriptions/wait",
            json!({"subscriptions": [sid], "timeout_ms": 5000}),
        )
        .await;
    answered((st, &change), StatusCode::OK, "state", "running");

    let (st, v) = conv
        .post(
            "/jobs/a/update",
            json!({"lock": lock, "data": {"n": 1, "half": true}}),
        )
        .await;
    assert_eq!((st, &v["data"]["half"]), (StatusCode::OK, &json!(true)));
    // A wrong lock: 409 halt, nothing written.
    let before = s.stored().await;
    let (st, v) = conv
        .post(
            "/jobs/a/finish",
            json!({"lock": "not-the-lock", "data": {}}),
        )
        .await;
    answered((st, &v), StatusCode::CONFLICT, "kind", "halt");
    assert_eq!(s.stored().await, before);
    let (st, v) = conv
        .post("/jobs/a/finish", json!({"lock": lock, "data": {"done": 1}}))
        .await;
    answered((st, &v), StatusCode::OK, "state", "finished");
    let (_, change) = s
        .post(
            ADMIN,
            "/api/v1/subscriptions/wait",
            json!({"subscriptions": [sid], "state": "finished", "timeout_ms": 5000}),
        )
        .await;
    assert_eq!(change["state"], "finished");
    let (st, _) = s
        .call(
            ADMIN,
            "DELETE",
            &format!("/api/v1/subscriptions/{sid}"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);

    // Nothing due: 204 at once; a long-poll is woken by an add.
    let (st, _) = conv.post("/accept", json!({})).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let api = s.api.clone();
    let mut parked = s.jobs.parked();
    let from = *parked.borrow_and_update();
    let poll = tokio::spawn(async move {
        let body = json!({"timeout_ms": 60000});
        api.post(ADMIN, "/api/v1/types/conv/accept", body).await
    });
    // The add comes once the long-poll has looked and is waiting.
    tokio::time::timeout(Duration::from_secs(30), parked.wait_for(|p| *p > from))
        .await
        .expect("the long-poll parked")
        .unwrap();
    let started = std::time::Instant::now();
    conv.post("/jobs", json!({"id": "b"})).await;
    let (st, job) = poll.await.unwrap();
    answered((st, &job), StatusCode::OK, "id", "b");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "woken, not timed out"
    );
    let lock = job["lock"].as_str().unwrap();
    let (st, v) = conv.post("/jobs/b/resubmit", json!({"lock": lock})).await;
    assert_eq!((st, v["resubmit"].as_bool()), (StatusCode::OK, Some(true)));
    conv.post("/jobs/b/finish", json!({"lock": lock})).await;
    let (_, list) = conv.get("/jobs?state=pending").await;
    let ids: Vec<&str> = list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["b"], "resubmitted: pending again");
    let (_, types) = s.get(ADMIN, "/api/v1/types").await;
    assert_eq!(types[0]["finished"], 1);
    let (st, _) = conv.call("DELETE", "/jobs/b", None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, _) = conv.get("/jobs/b").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

/// Requests the generic-jobs API must refuse: method, path, body, the status, and what the
/// error must name.
#[allow(clippy::type_complexity)]
fn bad_requests() -> Vec<(
    &'static str,
    &'static str,
    &'static str,
    StatusCode,
    &'static str,
)> {
    vec![
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
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_json_errors_and_change_nothing() {
    let s = start().await;
    let conv = TypeApi::of(&s, "conv");
    conv.call("PUT", "", Some(json!({"timeout_s": 30}))).await;
    conv.post("/jobs", json!({"id": "keep", "data": {"v": 1}}))
        .await;
    let before = s.stored().await;
    let cases = bad_requests();
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
        .post(
            "wrong-token-0123456789",
            "/api/v1/types/conv/jobs",
            json!({"id": "sneaky"}),
        )
        .await;
    answered((st, &v), StatusCode::UNAUTHORIZED, "kind", "unauthorized");
    let (st, v) = s
        .call(SUBMITTER, "DELETE", "/api/v1/types/conv/jobs/keep", None)
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
    let conv = TypeApi::of(&s, "conv");
    conv.call("PUT", "", Some(json!({"timeout_s": 30}))).await;
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
    conv.post("/jobs", json!({"id": "orphan"})).await;
    // Whether the server noticed at once or took the job and put it back, the job ends up
    // pending and a present client gets it.
    let (st, job) = conv.post("/accept", json!({"timeout_ms": 10000})).await;
    answered((st, &job), StatusCode::OK, "id", "orphan");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_and_accept_hands_over_the_next_job_in_one_request() {
    let s = start().await;
    let conv = TypeApi::of(&s, "conv");
    conv.call("PUT", "", Some(json!({"timeout_s": 30}))).await;
    for id in ["a", "b"] {
        conv.post("/jobs", json!({"id": id})).await;
    }
    let (_, a) = conv.post("/accept", json!({})).await;
    assert_eq!(a["id"], "a");
    let lock_a = a["lock"].as_str().unwrap().to_string();
    let (st, v) = conv
        .post(
            "/jobs/a/finish-and-accept",
            json!({"lock": lock_a, "data": {"done": true}}),
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
    let (st, v) = conv
        .post("/jobs/a/finish-and-accept", json!({"lock": lock_a}))
        .await;
    answered((st, &v), StatusCode::CONFLICT, "kind", "halt");
    assert_eq!(s.stored().await, before);
    // The next job holds under its own lock; with nothing left due, `next` is null at once.
    let (st, v) = conv
        .post(
            "/jobs/b/finish-and-accept",
            json!({"lock": lock_b, "timeout_ms": 0}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["finished"]["state"], "finished");
    assert!(v["next"].is_null(), "{v}");
    let (_, types) = s.get(ADMIN, "/api/v1/types").await;
    assert_eq!(
        (
            &types[0]["pending"],
            &types[0]["running"],
            &types[0]["finished"]
        ),
        (&json!(0), &json!(0), &json!(2))
    );
}

/// Everything a processor token of `thumbs` may not do (all but accept, update and finish
/// of its own type): method, path, body.
fn refused_to_processors() -> Vec<(&'static str, &'static str, Option<serde_json::Value>)> {
    vec![
        ("GET", "/api/v1/types", None),
        ("GET", "/api/v1/types/thumbs", None),
        (
            "PUT",
            "/api/v1/types/thumbs",
            Some(json!({"max_attempts": 9})),
        ),
        (
            "POST",
            "/api/v1/types/thumbs/jobs",
            Some(json!({"id": "mine"})),
        ),
        ("GET", "/api/v1/types/thumbs/jobs", None),
        ("GET", "/api/v1/types/thumbs/jobs/t1", None),
        ("DELETE", "/api/v1/types/thumbs/jobs/t1", None),
        ("POST", "/api/v1/types/thumbs/jobs/t1/retry", None),
        ("POST", "/api/v1/types/thumbs/jobs/t1/subscribe", None),
        (
            "POST",
            "/api/v1/types/thumbs/jobs/t1/resubmit",
            Some(json!({"lock": "x"})),
        ),
        ("GET", "/api/v1/types/thumbs/schedules", None),
        (
            "PUT",
            "/api/v1/types/thumbs/schedules/s",
            Some(json!({"every_s": 60})),
        ),
        ("POST", "/api/v1/types/other/accept", Some(json!({}))),
        (
            "POST",
            "/api/v1/types/other/finish",
            Some(json!({"jobs": []})),
        ),
        ("POST", "/api/v1/types/%74humbs/accept", Some(json!({}))),
        ("GET", "/api/v1/types/thumbs/accept", None),
        (
            "POST",
            "/api/v1/subscriptions/wait",
            Some(json!({"subscriptions": [1]})),
        ),
        ("GET", "/api/v1/batches", None),
        (
            "POST",
            "/api/v1/batches",
            Some(json!({"url": "http://127.0.0.1:1/x"})),
        ),
        ("GET", "/api/v1/status", None),
        ("GET", "/api/v1/outbox", None),
        ("GET", "/api/v1/events", None),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processor_tokens_process_their_types_and_nothing_else() {
    let s = start().await;
    for (ty, body) in [
        ("thumbs", json!({"timeout_s": 30, "max_attempts": 2})),
        ("other", json!({"timeout_s": 30})),
    ] {
        let (st, _) = s
            .call(ADMIN, "PUT", &format!("/api/v1/types/{ty}"), Some(body))
            .await;
        assert_eq!(st, StatusCode::OK);
    }
    for (ty, id) in [("thumbs", "t1"), ("thumbs", "t2"), ("other", "o1")] {
        let (st, _) = s
            .post(
                ADMIN,
                &format!("/api/v1/types/{ty}/jobs"),
                json!({"id": id}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED);
    }
    let before = s.dump().await;
    // Everything but accept, update and finish of its own type: 403, naming the rule.
    let refused = refused_to_processors();
    for (method, path, body) in refused {
        let (st, v) = s.call(THUMBS, method, path, body).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{method} {path}: {v}");
        assert!(
            v["error"]
                .as_str()
                .is_some_and(|e| e.contains("processor token may only accept, update and finish")),
            "{method} {path}: {v}"
        );
    }
    assert_eq!(s.dump().await, before, "nothing changed by the refusals");
    // A submitter may not process at all.
    let (st, _) = s
        .post(SUBMITTER, "/api/v1/types/thumbs/accept", json!({}))
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    assert_eq!(s.dump().await, before);

    // Its own type: accept, update, finish (with an error: retried), a batch, a finish.
    let (st, job) = s
        .post(THUMBS, "/api/v1/types/thumbs/accept", json!({}))
        .await;
    answered((st, &job), StatusCode::OK, "id", "t1");
    let lock = job["lock"].as_str().unwrap().to_string();
    let (st, _) = s
        .post(
            THUMBS,
            "/api/v1/types/thumbs/jobs/t1/update",
            json!({"lock": lock, "data": {"half": true}}),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    let (st, v) = s
        .post(
            THUMBS,
            "/api/v1/types/thumbs/jobs/t1/finish",
            json!({"lock": lock, "error": "convert: no such file"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (
            v["state"].as_str(),
            v["attempts"].as_u64(),
            v["last_error"].as_str()
        ),
        (Some("pending"), Some(1), Some("convert: no such file"))
    );
    let (st, v) = s
        .post(
            THUMBS,
            "/api/v1/types/thumbs/accept",
            json!({"max_jobs": 5}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let got = v["jobs"].as_array().unwrap();
    assert_eq!(got.len(), 1, "t1 waits out its backoff: {v}");
    assert_eq!(got[0]["id"], "t2");
    let lock2 = got[0]["lock"].as_str().unwrap();
    let (st, v) = s
        .post(
            THUMBS,
            "/api/v1/types/thumbs/finish",
            json!({"jobs": [
                {"id": "t2", "lock": lock2, "data": {"done": 1}},
                {"id": "t1", "lock": "not-the-lock"},
            ]}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["results"][0], json!({"id": "t2", "state": "finished"}));
    assert_eq!(v["results"][1]["kind"], "halt");
    let (_, t1) = s.get(ADMIN, "/api/v1/types/thumbs/jobs/t1").await;
    assert_eq!(t1["state"], "pending", "a wrong lock wrote nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_priorities_schedules_and_settings_over_http() {
    let s = start().await;
    let conv = TypeApi::of(&s, "conv");
    let (st, v) = conv
        .call(
            "PUT",
            "",
            Some(json!({"timeout_s": 30, "max_attempts": 1, "keep_finished_s": 3600})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (
            v["max_attempts"].as_u64(),
            v["keep_finished_s"].as_u64(),
            v["rate_per_s"].as_u64(),
            v["failed"].as_u64()
        ),
        (Some(1), Some(3600), Some(0), Some(0))
    );
    // Bad settings: 400 naming the field, nothing stored changed.
    let before = s.stored().await;
    for (body, field) in [
        (json!({"max_attempts": 0}), "max_attempts"),
        (json!({"timeout_s": 0}), "activity timeout"),
        (json!({"rate_per_s": -1}), "rate_per_s"),
        (json!({"retries": 3}), "retries"),
    ] {
        let (st, v) = conv.call("PUT", "", Some(body.clone())).await;
        // 400 for a value refused, 422 for one of the wrong type.
        assert!(
            st == StatusCode::BAD_REQUEST || st == StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {st} {v}"
        );
        assert!(v["error"].as_str().unwrap().contains(field), "{body}: {v}");
    }
    let (st, v) = s
        .call(
            ADMIN,
            "PUT",
            "/api/v1/types/fresh",
            Some(json!({"max_attempts": 2})),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "a type needs timeout_s: {v}");
    let (st, _) = conv
        .post("/jobs", json!({"id": "p", "priority": 5000}))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(s.stored().await, before);

    // Priorities: the lower first.
    for (id, prio) in [("later", 5), ("first", -5)] {
        let (st, _) = conv
            .post("/jobs", json!({"id": id, "priority": prio}))
            .await;
        assert_eq!(st, StatusCode::CREATED);
    }
    let (_, job) = conv.post("/accept", json!({})).await;
    assert_eq!(job["id"], "first");
    // An error on the only attempt: failed, listed, counted, retried by an admin.
    let (st, v) = conv
        .post(
            "/jobs/first/finish",
            json!({"lock": job["lock"], "error": "bad input"}),
        )
        .await;
    answered((st, &v), StatusCode::OK, "state", "failed");
    let (_, list) = conv.get("/jobs?state=failed").await;
    assert_eq!(list["jobs"][0]["id"], "first");
    assert_eq!(list["jobs"][0]["last_error"], "bad input");
    let (_, ty) = conv.get("").await;
    assert_eq!(
        (ty["failed"].as_u64(), ty["pending"].as_u64()),
        (Some(1), Some(1))
    );
    let (st, v) = conv.call("POST", "/jobs/later/retry", None).await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert!(v["error"].as_str().unwrap().contains("only a failed job"));
    let (st, v) = conv.call("POST", "/jobs/first/retry", None).await;
    answered((st, &v), StatusCode::OK, "state", "pending");

    // Schedules.
    let before = s.stored().await;
    for body in [
        json!({"cron": "61 * * * *"}),
        json!({"every_s": 60, "cron": "* * * * *"}),
        json!({}),
        json!({"every_s": 0}),
    ] {
        let (st, v) = conv
            .call("PUT", "/schedules/nightly", Some(body.clone()))
            .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}: {v}");
    }
    assert_eq!(s.stored().await, before);
    let (st, v) = conv
        .call(
            "PUT",
            "/schedules/nightly",
            Some(json!({"cron": "0 3 * * *", "data": {"k": 1}})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(v["next_tick_ms"].as_u64().unwrap() % 86_400_000 == 3 * 3_600_000);
    let (_, list) = conv.get("/schedules").await;
    assert_eq!(list["schedules"][0]["name"], "nightly");
    let (st, _) = conv.call("DELETE", "/schedules/nightly", None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, _) = conv.call("DELETE", "/schedules/nightly", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = conv.post("/finish", json!({"jobs": []})).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
}
