//! Talking to a running server's API: one call, and waiting for a batch on its event stream
//! rather than by asking again and again.

use serde_json::Value;
use std::time::Duration;

/// One API call as `token`, `body` sent as JSON: the answer's status and body (JSON, or the
/// text as a string).
pub async fn call(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (reqwest::StatusCode, Value) {
    let mut r = http
        .request(method.parse().unwrap(), format!("{base}{path}"))
        .bearer_auth(token);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Waits until `done` holds for batch `bid` as `GET /api/v1/batches/BID` shows it (with
/// `token`), at most `within`, and returns that record. It follows the batch's event stream
/// (`/api/v1/events?batch=BID`) and looks again at each of its events; subscribed before the
/// first look, so no move is missed.
pub async fn until_batch(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    bid: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let mut events = http
        .get(format!("{base}/api/v1/events?batch={bid}"))
        .bearer_auth(token)
        .send()
        .await
        .expect("the event stream");
    assert_eq!(events.status(), 200, "the event stream of {bid}");
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let r = http
            .get(format!("{base}/api/v1/batches/{bid}"))
            .bearer_auth(token)
            .send()
            .await
            .expect("the batch");
        assert_eq!(r.status(), 200, "batch {bid}");
        let v: Value = r.json().await.expect("the batch as JSON");
        if done(&v) {
            return v;
        }
        // The next event of this batch (keep-alive comments are not).
        loop {
            let chunk = tokio::time::timeout_at(deadline, events.chunk())
                .await
                .unwrap_or_else(|_| panic!("batch {bid} never got there: {v}"))
                .expect("the event stream")
                .expect("the event stream goes on");
            if String::from_utf8_lossy(&chunk).contains("data:") {
                break;
            }
        }
    }
}
