//! Server-sent events over real HTTP: changes arrive live, a reconnect with Last-Event-ID
//! gets exactly what it missed, and a client too far behind is told to reset.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;

/// One SSE message: (id, event, data).
type Msg = (Option<String>, String, String);

struct Events {
    resp: reqwest::Response,
    buf: String,
}

impl Events {
    async fn open(
        s: &Server,
        token: &str,
        query: &str,
        last: Option<&str>,
    ) -> (StatusCode, Events) {
        let mut r = s
            .http
            .get(format!("{}/api/v1/events{query}", s.base))
            .bearer_auth(token);
        if let Some(l) = last {
            r = r.header("Last-Event-ID", l);
        }
        let resp = r.send().await.unwrap();
        (
            resp.status(),
            Events {
                resp,
                buf: String::new(),
            },
        )
    }

    /// The next message that is not a keep-alive comment.
    async fn next(&mut self) -> Msg {
        loop {
            if let Some(i) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..i + 2).collect();
                let (mut id, mut event, mut data) = (None, "message".to_string(), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().to_string());
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim());
                    }
                }
                if id.is_none() && data.is_empty() {
                    continue;
                }
                return (id, event, data);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.resp.chunk())
                .await
                .expect("an event within 30 s")
                .unwrap()
                .expect("the stream goes on");
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

fn to(m: &Msg) -> String {
    let v: Value = serde_json::from_str(&m.2).unwrap();
    format!(
        "{} {}",
        v["kind"].as_str().unwrap(),
        v["to"].as_str().unwrap()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_live_and_resumable_without_loss() {
    let s = start().await;
    let (st, mut live) = Events::open(&s, ADMIN, "", None).await;
    assert_eq!(st, StatusCode::OK);
    let (_, v) = s
        .call_as(
            SUBMITTER,
            "POST",
            "/api/v1/batches",
            Some(json!({"payload_url": "http://127.0.0.1:9/x", "profile": "demo"})),
        )
        .await;
    let bid = v["id"].as_str().unwrap().to_string();
    s.call("POST", &format!("/api/v1/batches/{bid}/hold"), None)
        .await;
    s.call("POST", &format!("/api/v1/batches/{bid}/release"), None)
        .await;
    let got = [live.next().await, live.next().await, live.next().await];
    let seen: Vec<String> = got.iter().map(to).collect();
    assert_eq!(seen, ["batch Pending", "batch Held", "batch Pending"]);
    assert!(got.iter().all(|m| m.1 == "change"));

    // Reconnect after the first: the two after it come again, and then live ones.
    let first = got[0].0.clone().unwrap();
    let (_, mut again) = Events::open(&s, ADMIN, "", Some(&first)).await;
    assert_eq!(again.next().await.0, got[1].0);
    assert_eq!(again.next().await.0, got[2].0);
    s.call("POST", &format!("/api/v1/batches/{bid}/hold"), None)
        .await;
    assert_eq!(to(&again.next().await), "batch Held");
    assert_eq!(to(&live.next().await), "batch Held");

    // An id from another server run (or unknown): reset first.
    let (_, mut stale) = Events::open(&s, ADMIN, "", Some("1-5")).await;
    assert_eq!(stale.next().await.1, "reset");
    let (_, mut stale) = Events::open(&s, ADMIN, "?last_event_id=garbage", None).await;
    assert_eq!(stale.next().await.1, "reset");

    // A submitter follows its own batch only.
    let (st, mut own) = Events::open(
        &s,
        SUBMITTER,
        &format!("?batch={bid}&last_event_id={first}"),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(to(&own.next().await), "batch Held");
    let (st, _) = Events::open(&s, BOB, &format!("?batch={bid}"), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = Events::open(&s, BOB, "", None).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
}
