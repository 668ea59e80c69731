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
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
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
            // Keep-alive comments do not extend it.
            let chunk = tokio::time::timeout_at(deadline, self.resp.chunk())
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
    let v = s.submit_unfetched(SUBMITTER).await;
    let bid = v["id"].as_str().unwrap().to_string();
    s.call(ADMIN, "POST", &format!("/api/v1/batches/{bid}/hold"), None)
        .await;
    s.call(
        ADMIN,
        "POST",
        &format!("/api/v1/batches/{bid}/release"),
        None,
    )
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
    s.call(ADMIN, "POST", &format!("/api/v1/batches/{bid}/hold"), None)
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
    // Without a batch named, a submitter follows every batch of its own (its console's
    // stream): another's changes do not reach it.
    let (st, mut bobs) = Events::open(&s, BOB, "", None).await;
    assert_eq!(st, StatusCode::OK);
    s.call(
        ADMIN,
        "POST",
        &format!("/api/v1/batches/{bid}/release"),
        None,
    )
    .await;
    let v = s.submit_unfetched(BOB).await;
    let m = bobs.next().await;
    let ev: Value = serde_json::from_str(&m.2).unwrap();
    assert_eq!(
        (ev["id"].as_str(), to(&m).as_str()),
        (v["id"].as_str(), "batch Pending"),
        "{ev}"
    );
    assert!(ev.get("host").is_none_or(Value::is_null), "{ev}");
}

/// The stream carries what any writer commits (here another process's engine on the same
/// store, as a worker on another host would be), with its host; and a client that resumes
/// after a server restart gets, from the tree, every transition made while it was away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_come_from_every_writer_and_resume_after_a_restart() {
    use lading_store_sqlite::{SqliteOptions, SqliteTree};
    let s = start().await;
    let other = {
        let t = SqliteTree::open(s.dir.path().join("lading.db"), SqliteOptions::default()).unwrap();
        std::sync::Arc::new(lading_engine::Engine::new(
            std::sync::Arc::new(t),
            lading_core::time::system_clock(),
            "host-b:42",
        ))
    };
    let (_, mut live) = Events::open(&s, ADMIN, "", None).await;
    let v = s.submit_unfetched(SUBMITTER).await;
    let bid = lading_core::layout::BatchId::parse(v["id"].as_str().unwrap()).unwrap();
    assert_eq!(to(&live.next().await), "batch Pending");
    other.hold_batch(&bid).await.unwrap();
    let held = live.next().await;
    assert_eq!(to(&held), "batch Held");
    let ev: Value = serde_json::from_str(&held.2).unwrap();
    assert_eq!(ev["host"], "host-b:42", "{ev}");
    assert_eq!(ev["from"], "Pending");
    // The server restarts; meanwhile the other host releases and holds the batch again.
    let last = held.0.clone().unwrap();
    drop(live);
    let s = s.restart().await;
    let (_, mut fresh) = Events::open(&s, ADMIN, "", None).await;
    other.release_batch(&bid).await.unwrap();
    other.hold_batch(&bid).await.unwrap();
    // A client resuming from its last id at once, whether or not the server has seen the
    // other process's commits yet, gets them: from the tree or live.
    let (_, mut back) = Events::open(&s, ADMIN, "", Some(&last)).await;
    // A live client sees both (another process's commits reach the server within its poll
    // interval).
    for to in ["Pending", "Held"] {
        let ev = until_event(&mut fresh, |ev| ev["to"] == to && ev["host"] == "host-b:42").await;
        assert_eq!(ev["to"], to, "{ev}");
    }
    // Transitions of the last one's second may come again (history keeps seconds), oldest
    // first; the two made while the server was down come, in order, and nothing else.
    let want = ["Held -> Pending", "Pending -> Held"];
    let mut seen: Vec<String> = Vec::new();
    while !seen.ends_with(&want.map(String::from)) {
        assert!(seen.len() < 4, "{seen:?}");
        let m = back.next().await;
        assert_eq!(m.1, "change");
        let ev: Value = serde_json::from_str(&m.2).unwrap();
        assert_eq!(ev["kind"], "batch");
        seen.push(format!(
            "{} -> {}",
            ev["from"].as_str().unwrap_or("-"),
            ev["to"].as_str().unwrap()
        ));
        if ev["from"] == "Held" {
            assert_eq!(ev["host"], "host-b:42", "{ev}");
        }
    }
    // What came again is the start of the batch's story, in its order.
    let story = [
        "- -> Pending",
        "Pending -> Held",
        "Held -> Pending",
        "Pending -> Held",
    ];
    assert!(story.map(String::from).ends_with(&seen), "{seen:?}");
    // A submitter's view of the same resume has no hosts or messages.
    let (_, mut own) = Events::open(
        &s,
        SUBMITTER,
        &format!("?batch={bid}&last_event_id={last}"),
        None,
    )
    .await;
    let m = own.next().await;
    let ev: Value = serde_json::from_str(&m.2).unwrap();
    assert!(ev.get("host").is_none(), "{ev}");
    assert_eq!(
        ev["batch"].as_str().or(ev["id"].as_str()),
        Some(bid.as_str())
    );
    // And live events still flow after the restart, from the other host too. Transitions of
    // the seconds around the restart may come first (history keeps seconds, and the follower
    // reports a status first seen from a little before its start rather than lose one).
    other.release_batch(&bid).await.unwrap();
    let ev = until_event(&mut fresh, |ev| {
        ev["from"] == "Held" && ev["to"] == "Pending"
    })
    .await;
    assert_eq!(ev["host"], "host-b:42", "{ev}");

    // Merritt's own tools rewrite a status without a history: the change of state is an
    // event all the same (no host is known).
    let path = format!("/batches/{bid}/status");
    let node = other.tree().get(&path).await.unwrap().unwrap();
    let mut st: Value = serde_json::from_slice(node.data.as_deref().unwrap()).unwrap();
    st["status"] = json!("Held");
    st.as_object_mut().unwrap().remove("history");
    other
        .tree()
        .set(
            &path,
            Some(serde_json::to_vec(&st).unwrap()),
            Some(node.stat.version),
        )
        .await
        .unwrap();
    let ev = until_event(&mut fresh, |ev| ev.get("host").is_none()).await;
    assert_eq!(
        (ev["from"].as_str(), ev["to"].as_str()),
        (Some("Pending"), Some("Held")),
        "{ev}"
    );
}

/// The first of the next few events `ok` holds for.
async fn until_event(e: &mut Events, ok: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..6 {
        let m = e.next().await;
        let ev: Value = serde_json::from_str(&m.2).unwrap();
        if ok(&ev) {
            return ev;
        }
    }
    panic!("no such event among the next six");
}
