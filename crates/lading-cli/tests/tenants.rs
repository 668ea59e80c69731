//! The trust boundary between tenants, tried against a real `lading serve` as one hostile
//! submitter would against another: submissions only to its token's collections, event
//! streams and their room held per client however the token is spelt, identifiers that differ
//! only in separators kept apart, histories that show a submitter no more than its events, and
//! access requests bounded per submitter. Every refusal is checked to leave the stored state as
//! it was. See docs/SECURITY.md; the rest of the boundary is in security.rs.

mod common;

use common::serve::*;
use lading_testkit::files_under;
use lading_testkit::payload_server::PayloadServer;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::process::Command;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitter_may_submit_only_to_its_tokens_collections() {
    let pdir = tempfile::tempdir().unwrap();
    std::fs::write(pdir.path().join("a.txt"), b"alice's words\n").unwrap();
    std::fs::write(pdir.path().join("b.txt"), b"bob's words\n").unwrap();
    let files = PayloadServer::start(pdir.path()).await.unwrap();
    let s = serve(&[format!("http://{}/", files.addr)], "");
    let b = s.alices_completed(&files.url("a.txt")).await;
    let job = s.only_job(&b).await;
    let ark = job["identifiers"]["primary_id"]
        .as_str()
        .unwrap()
        .to_string();
    let stored_before = s.stored_files();
    let batches_before = s.batches().await;
    // Bob names Alice's profile: by URL, and by upload, with and without her object's id.
    for body in [
        json!({"payload_url": files.url("b.txt"), "profile": "alpha", "primary_id": ark}),
        json!({"payload_url": files.url("b.txt"), "profile": "alpha"}),
    ] {
        let (st, v) = s.submit(BOB, body.clone()).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{body}: {v}");
        let e = v["error"].as_str().unwrap();
        assert!(e.contains("bob may not submit to profile \"alpha\""), "{e}");
        assert!(e.contains("collections"), "{e}");
    }
    let q = format!(
        "profile=alpha&primary_id={}",
        ark.replace(':', "%3A").replace('/', "%2F")
    );
    let (st, v) = s.upload(BOB, &q, "b.txt", b"bob's bytes\n").await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    // Nothing was stored: no batch, no file, and Alice's object has one version.
    assert_eq!(s.batches().await, batches_before);
    assert_eq!(s.stored_files(), stored_before);
    assert!(
        std::fs::read_dir(s.data().join("uploads"))
            .map(|d| d.count() == 0)
            .unwrap_or(true),
        "an upload was kept"
    );
    // The admin is unrestricted; Alice still may add a version to her own object.
    let (st, v) = s
        .submit(
            ALICE,
            json!({"payload_url": files.url("a.txt"), "profile": "alpha", "primary_id": ark}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    // A config with a submitter token that names no collections does not start.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("lading.toml");
    std::fs::write(
        &cfg,
        format!(
            "data_dir = {:?}\nlisten = \"127.0.0.1:0\"\n[[tokens]]\nname = \"carol\"\ntoken = \"carol-token-0123456789abcdef\"\nrole = \"submitter\"\n",
            dir.path().join("data")
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lading"))
        .arg("--store")
        .arg(format!("sqlite:{}", dir.path().join("l.db").display()))
        .arg("--config")
        .arg(&cfg)
        .arg("serve")
        .env_remove("LADING_STORE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a submitter token needs collections"), "{err}");
}

/// Opens `n` event streams of `query` as `token`, each on its own connection; returns the
/// ones answered 200 (held open) and the count answered 429.
async fn open_streams(
    s: &Serve,
    token: &str,
    query: &str,
    n: usize,
) -> (Vec<reqwest::Response>, usize) {
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..n {
        // A client of its own each: one connection each.
        let c = reqwest::Client::new();
        let r = c
            .get(format!("{}/api/v1/events?{query}", s.base))
            .bearer_auth(token)
            .timeout(Duration::from_secs(600))
            .send()
            .await;
        match r {
            Ok(r) if r.status() == StatusCode::OK => held.push(r),
            Ok(r) if r.status() == StatusCode::TOO_MANY_REQUESTS => {
                let v: Value = r.json().await.unwrap();
                assert!(
                    v["error"]
                        .as_str()
                        .unwrap()
                        .contains("max_streams_per_client"),
                    "{v}"
                );
                refused += 1;
            }
            // Closed for room (the oldest stream is evicted, not the newest): fine.
            Ok(r) => panic!("{}", r.status()),
            Err(_) => {}
        }
    }
    (held, refused)
}

/// Standard base64 with padding, for a Basic header.
fn b64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for ch in bytes.chunks(3) {
        let n = ch.iter().fold(0u32, |a, b| (a << 8) | u32::from(*b)) << (8 * (3 - ch.len()));
        for i in 0..=ch.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
        out.push_str(&"=".repeat(3 - ch.len()));
    }
    out
}

/// Issue 58, item 1: a stream's client is the token's name, however the header is spelt.
/// Ten spellings of Alice's token open two streams (her cap), not ten; and with the
/// connections full, making room closes a stream of Alice (at her cap), never the other tenant's (the admin's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_spelt_ten_ways_is_one_client_and_room_is_never_made_from_another_tenant() {
    let pdir = tempfile::tempdir().unwrap();
    std::fs::write(pdir.path().join("a.txt"), b"alice's words\n").unwrap();
    let files = PayloadServer::start(pdir.path()).await.unwrap();
    let s = serve_with(
        &[format!("http://{}/", files.addr)],
        "",
        "[http]\nmax_connections = 3\nmax_streams_per_client = 2\n",
    );
    let b = s.alices_completed(&files.url("a.txt")).await;
    let bid = b["id"].as_str().unwrap().to_string();
    let basic = b64(format!("alice:{ALICE}").as_bytes());
    let spellings = [
        format!("Bearer {ALICE}"),
        format!("bearer {ALICE}"),
        format!("BEARER {ALICE}"),
        format!("Bearer  {ALICE}"),
        format!("Bearer {ALICE} "),
        format!("Basic {basic}"),
        format!("Basic {}", basic.trim_end_matches('=')),
        format!("basic {basic}"),
        format!("Basic  {basic}"),
        format!("BASIC {basic}"),
    ];
    let open = |auth: String, query: String| {
        let base = s.base.clone();
        async move {
            reqwest::Client::new()
                .get(format!("{base}/api/v1/events{query}"))
                .header("authorization", auth)
                .timeout(Duration::from_secs(600))
                .send()
                .await
                .unwrap()
        }
    };
    let (mut held, mut refused) = (Vec::new(), 0);
    for a in spellings {
        let r = open(a, format!("?batch={bid}")).await;
        match r.status() {
            StatusCode::OK => held.push(r),
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("{other}"),
        }
    }
    assert_eq!((held.len(), refused), (2, 8), "one client, capped at two");
    // Another tenant's one stream (the admin's) fills the connections (three); the next
    // request needs room.
    let bob = open(format!("Bearer {ADMIN}"), String::new()).await;
    assert_eq!(bob.status(), StatusCode::OK);
    s.healthy().await;
    // The other tenant's stream is open still: nothing ends it within a second.
    let mut body = bob.bytes_stream();
    use futures_util::StreamExt;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        match tokio::time::timeout_at(deadline, body.next()).await {
            Err(_) => break,
            Ok(Some(Ok(_))) => {}
            Ok(None | Some(Err(_))) => panic!("the other tenant's stream was closed for room"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_event_streams_cannot_lock_others_out() {
    let pdir = tempfile::tempdir().unwrap();
    std::fs::write(pdir.path().join("a.txt"), b"alice's words\n").unwrap();
    let files = PayloadServer::start(pdir.path()).await.unwrap();
    // The cap on streams per client, below the connection cap.
    let s = serve(
        &[format!("http://{}/", files.addr)],
        "[http]\nmax_connections = 16\n",
    );
    let b = s.alices_completed(&files.url("a.txt")).await;
    let bid = b["id"].as_str().unwrap().to_string();
    let (held, refused) = open_streams(&s, ALICE, &format!("batch={bid}"), 40).await;
    assert_eq!(held.len(), 8, "the default max_streams_per_client");
    assert_eq!(refused, 32);
    s.healthy().await;
    let (st, v) = s.get(ADMIN, "/api/v1/status").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (st, _) = s.get(BOB, "/api/v1/batches").await;
    assert_eq!(st, StatusCode::OK);
    drop(held);

    assert_eq!(s.batches().await.len(), 1, "nothing else changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identifiers_that_differ_only_in_separators_do_not_share_a_folder_or_lock() {
    let pdir = tempfile::tempdir().unwrap();
    std::fs::write(pdir.path().join("a.txt"), b"alice's words\n").unwrap();
    std::fs::write(pdir.path().join("b.txt"), b"bob's words\n").unwrap();
    let files = PayloadServer::start(pdir.path()).await.unwrap();
    let s = serve(&[format!("http://{}/", files.addr)], "");
    // Bob takes the names that Merritt's form of Alice's ARK would collapse to.
    for id in ["ark_99999_future7", "ark:/99999_future7"] {
        let b = s
            .submit_finished(
                BOB,
                json!({"payload_url": files.url("b.txt"), "profile": "beta", "primary_id": id}),
            )
            .await;
        assert_eq!(b["status"]["status"], "Completed", "{id}: {b}");
    }
    let bobs = s.stored_files();
    // Alice's own ARK is hers: stored under Merritt's name, beside Bob's.
    let b = s
        .submit_finished(
            ALICE,
            json!({"payload_url": files.url("a.txt"), "profile": "alpha", "primary_id": "ark:/99999/future7"}),
        )
        .await;
    assert_eq!(b["status"]["status"], "Completed", "{b}");
    let storage = s.data().join("storage");
    let mut folders: Vec<String> = std::fs::read_dir(&storage)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    folders.sort();
    assert_eq!(
        folders,
        [
            "ark%3A%2F99999%5Ffuture7",
            "ark%5F99999%5Ffuture7",
            "ark_99999_future7"
        ],
    );
    let mine = files_under(&storage.join("ark_99999_future7"));
    assert!(
        mine.iter()
            .any(|f| std::fs::read(f).unwrap() == b"alice's words\n"),
        "{mine:?}"
    );
    for f in bobs {
        assert!(f.exists(), "Bob's {} is still there", f.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitter_reads_in_history_what_its_events_show_and_no_more() {
    let pdir = tempfile::tempdir().unwrap();
    let files = PayloadServer::start(pdir.path()).await.unwrap();
    let s = serve(
        &[format!("http://{}/", files.addr)],
        "[stages.downloading]\nmax_attempts = 1\n",
    );
    let b = s
        .submit_finished(
            ALICE,
            json!({"payload_url": files.url("missing.txt"), "profile": "alpha"}),
        )
        .await;
    let bid = b["id"].as_str().unwrap().to_string();
    let job = s.only_job(&b).await;
    let jid = job["id"].as_str().unwrap().to_string();
    assert_eq!(job["status"]["status"], "Failed", "{job}");
    // The admin sees hosts and messages.
    let (_, admins) = s.get(ADMIN, &format!("/api/v1/jobs/{jid}/history")).await;
    let text = admins.to_string();
    assert!(
        text.contains("\"host\"") && text.contains("404"),
        "{admins}"
    );
    // Alice sees the states and times, as her event stream does: no host, no message,
    // in the history endpoints and in the records alike.
    for path in [
        format!("/api/v1/jobs/{jid}/history"),
        format!("/api/v1/batches/{bid}/history"),
        format!("/api/v1/jobs/{jid}"),
        format!("/api/v1/batches/{bid}"),
    ] {
        let (st, v) = s.get(ALICE, &path).await;
        assert_eq!(st, StatusCode::OK, "{path}: {v}");
        let entries = v["history"]
            .as_array()
            .or(v["status"]["history"].as_array())
            .unwrap_or_else(|| panic!("{path}: {v}"));
        assert!(entries.len() >= 2, "{path}: {v}");
        for e in entries {
            let o = e.as_object().unwrap();
            assert!(o.contains_key("to") && o.contains_key("at"), "{path}: {e}");
            assert!(
                !o.contains_key("host") && !o.contains_key("message"),
                "{path}: {e}"
            );
        }
    }
}

/// Trust round 3, item 8: a submitter's access requests are bounded. An identical request
/// shares the first one's file (a second token, no second request); past
/// `[access] max_requests_per_submitter` in flight, or past `max_bytes_per_submitter` held, a
/// request is a 429 naming the limit and makes nothing; an admin is not held to them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitters_access_requests_are_bounded_and_identical_ones_share_a_file() {
    let s = serve(
        &[],
        "[access]\nmax_requests_per_submitter = 2\nmax_bytes_per_submitter = 25000\n",
    );
    let mut arks = Vec::new();
    for name in ["one.bin", "two.bin"] {
        let content = vec![b'x'; 10_000];
        let (st, v) = s.upload(ALICE, "profile=alpha", name, &content).await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        let b = s.finished(v["id"].as_str().unwrap()).await;
        assert_eq!(b["status"]["status"], "Completed", "{b}");
        let job = s.only_job(&b).await;
        arks.push(
            job["identifiers"]["primary_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    // Requests stay in flight while the queue is paused.
    s.call(ADMIN, "PUT", "/api/v1/queues/accessSmall/pause", None)
        .await;
    let ask = |ark: &str, format: &str| json!({"ark": ark, "version": 1, "format": format});
    let (st, first) = s.post(ALICE, "/api/v1/access", ask(&arks[0], "zip")).await;
    assert_eq!(st, StatusCode::ACCEPTED, "{first}");
    let (st, again) = s.post(ALICE, "/api/v1/access", ask(&arks[0], "zip")).await;
    assert_eq!(st, StatusCode::ACCEPTED, "{again}");
    assert_eq!(
        again["id"], first["id"],
        "the identical request shares the first"
    );
    assert_ne!(again["token"], first["token"], "under a token of its own");
    let (st, bag) = s.post(ALICE, "/api/v1/access", ask(&arks[0], "bag")).await;
    assert_eq!(st, StatusCode::ACCEPTED, "{bag}");
    assert_ne!(bag["id"], first["id"], "a bag is another file");
    let queued = |s: &Serve| {
        std::fs::read_dir(s.data().join("access"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    // The requests in the store, read by another process as an operator would.
    let requests = |s: &Serve| {
        let out = Command::new(env!("CARGO_BIN_EXE_lading"))
            .arg("--store")
            .arg(format!(
                "sqlite:{}",
                s.dir.path().join("lading.db").display()
            ))
            .args(["dump", "/access", "--format", "json"])
            .env_remove("LADING_STORE")
            .env_remove("LADING_CONFIG")
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_object()
            .unwrap()
            .keys()
            .filter(|k| k.ends_with("/token"))
            .count()
    };
    assert_eq!(
        requests(&s),
        2,
        "the identical request made no request of its own"
    );
    // Two in flight: a third is refused, naming the limit, and makes nothing.
    let (st, v) = s.post(ALICE, "/api/v1/access", ask(&arks[1], "zip")).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert!(
        v.to_string().contains("max_requests_per_submitter = 2"),
        "{v}"
    );
    assert_eq!(requests(&s), 2, "nothing made");
    // The admin is not held to a submitter's bounds.
    let (st, v) = s.post(ADMIN, "/api/v1/access", ask(&arks[1], "zip")).await;
    assert_eq!(st, StatusCode::ACCEPTED, "{v}");
    s.call(ADMIN, "DELETE", "/api/v1/queues/accessSmall/pause", None)
        .await;
    let mut zips = Vec::new();
    for t in [&first["token"], &again["token"], &bag["token"]] {
        let t = t.as_str().unwrap().to_string();
        lading_testkit::poll::until("the access request", Duration::from_secs(60), async || {
            let (_, v) = s.get(ALICE, &format!("/api/v1/access/{t}")).await;
            assert_ne!(v["state"], "Failed", "{v}");
            if v["state"] == "Completed" {
                Ok(())
            } else {
                Err(v)
            }
        })
        .await;
        let r = s
            .http
            .get(format!("{}/api/v1/access/{t}/file", s.base))
            .bearer_auth(ALICE)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        zips.push(r.bytes().await.unwrap());
    }
    assert_eq!(zips[0], zips[1], "both tokens read the one file");
    assert_eq!(
        queued(&s),
        3,
        "three files: the shared zip, the bag, the admin's zip"
    );
    // Nothing in flight now, but two versions' bytes held: a third passes the byte limit.
    let (st, v) = s.post(ALICE, "/api/v1/access", ask(&arks[1], "bag")).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert!(v.to_string().contains("max_bytes_per_submitter"), "{v}");
    assert_eq!(queued(&s), 3, "nothing made");
    assert_eq!(requests(&s), 3, "nothing made");
}
