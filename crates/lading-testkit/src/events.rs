//! Talking to a running server's API: calls, multipart bodies, and waiting for a batch on its event stream
//! rather than by asking again and again.

use serde_json::Value;
use std::time::Duration;

/// A running server's API as its clients see it: a base URL (`http://HOST:PORT`) and one
/// HTTP client.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

impl Api {
    pub fn new(base: String) -> Api {
        Api {
            base,
            http: reqwest::Client::new(),
        }
    }

    /// One call as `token`, `body` sent as JSON: the answer's status and body (JSON, or the
    /// text as a string).
    pub async fn call(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (reqwest::StatusCode, Value) {
        let mut r = self.request(token, method, path);
        if let Some(b) = body {
            r = r.json(&b);
        }
        answer(r).await
    }

    pub async fn get(&self, token: &str, path: &str) -> (reqwest::StatusCode, Value) {
        self.call(token, "GET", path, None).await
    }

    pub async fn post(&self, token: &str, path: &str, body: Value) -> (reqwest::StatusCode, Value) {
        self.call(token, "POST", path, Some(body)).await
    }

    /// The ids of the batches `token` lists (`GET /api/v1/batches?QUERY`), in order.
    pub async fn batch_ids(&self, token: &str, query: &str) -> Vec<String> {
        let (st, v) = self.get(token, &format!("/api/v1/batches?{query}")).await;
        assert_eq!(st, reqwest::StatusCode::OK, "{v}");
        let rows = v["batches"].as_array().cloned().unwrap_or_default();
        rows.iter()
            .map(|b| b["id"].as_str().unwrap().to_string())
            .collect()
    }

    /// A call whose body is sent as it is, with its content type.
    pub async fn send(
        &self,
        token: &str,
        method: &str,
        path: &str,
        content_type: &str,
        body: impl Into<reqwest::Body>,
    ) -> (reqwest::StatusCode, Value) {
        let r = self.request(token, method, path);
        answer(r.header("content-type", content_type).body(body)).await
    }

    fn request(&self, token: &str, method: &str, path: &str) -> reqwest::RequestBuilder {
        let url = format!("{}{path}", self.base);
        self.http
            .request(method.parse().unwrap(), url)
            .bearer_auth(token)
    }

    /// [`until_batch`] on this server.
    pub async fn until_batch(
        &self,
        token: &str,
        bid: &str,
        within: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        until_batch(&self.http, &self.base, token, bid, within, done).await
    }
}

async fn answer(r: reqwest::RequestBuilder) -> (reqwest::StatusCode, Value) {
    let resp = r.send().await.unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A multipart/form-data body with one file part: (content type, body).
pub fn multipart(field: &str, file_name: &str, content: &[u8]) -> (String, Vec<u8>) {
    let boundary = "lading-test-boundary-7d1f";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{file_name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
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
