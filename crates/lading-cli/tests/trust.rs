//! The third hostile round (docs/SECURITY.md), tried again against a real `lading serve`: a
//! form that names a forbidden profile before its file, a submitter's uploads past their cap,
//! control characters through every echoed field of an XML answer, stalled requests with
//! huge forms, identifiers that would share keys, internals in what a depositor reads, and a
//! Merritt upload slower than the request timeout. Each refusal is checked to leave the
//! stored state as it was.

mod common;

use common::serve::*;
use lading_testkit::files_under;
use lading_testkit::payload_server::PayloadServer;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A multipart body of `parts` in order, each `(name, file name, bytes)`: its content type
/// and bytes.
fn form(parts: &[(&str, Option<&str>, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "lading-trust-boundary-7f3a";
    let mut body = Vec::new();
    for (name, file, bytes) in parts {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        match file {
            Some(f) => body.extend_from_slice(
                format!(
                    "Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\n\
                     Content-Type: application/octet-stream\r\n\r\n"
                )
                .as_bytes(),
            ),
            None => body.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes(),
            ),
        }
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// Posts `parts` as a form to `path` with `token`: the status and the answer's text.
async fn post_form(
    s: &Serve,
    token: &str,
    path: &str,
    parts: &[(&str, Option<&str>, &[u8])],
) -> (StatusCode, String) {
    let (ct, body) = form(parts);
    let r = s
        .http
        .post(format!("{}{path}", s.base))
        .bearer_auth(token)
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status(), r.text().await.unwrap())
}

/// A raw connection to the server with the head of a POST of `len` bytes to `path` sent.
fn raw_post(s: &Serve, token: &str, path: &str, content_type: &str, len: usize) -> TcpStream {
    let addr = s.base.trim_start_matches("http://");
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        c,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: {content_type}\r\nContent-Length: {len}\r\n\r\n"
    )
    .unwrap();
    c
}

/// The status line and what follows, read from `c` until the server closes it or the head
/// and some body have come.
fn answer(c: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = c.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some(head_end) = text.find("\r\n\r\n")
            && text.len() > head_end + 4
        {
            break;
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// Files the uploads folder holds now, but the owner marks.
fn uploaded(s: &Serve) -> Vec<std::path::PathBuf> {
    files_under(&s.data().join("uploads"))
        .into_iter()
        .filter(|f| f.file_name().is_some_and(|n| n != ".owner"))
        .collect()
}

/// Characters XML 1.0 does not allow anywhere in a document.
fn not_xml(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{fffe}' | '\u{ffff}')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_naming_a_forbidden_profile_before_its_file_is_refused_before_the_file_is_read() {
    let s = serve(&[], "[http]\nupload_stall_s = 60\n");
    // The profile first, then a file of 16 MiB of which only 1 MiB is sent: the refusal must
    // come while the rest has not been sent (a server that read the file first would wait).
    let big = vec![b'x'; 16 << 20];
    let (ct, body) = form(&[("profile", None, b"beta"), ("file", Some("big.bin"), &big)]);
    let mut c = raw_post(&s, ALICE, "/poster/submit", &ct, body.len());
    c.write_all(&body[..1 << 20]).unwrap();
    let a = answer(&mut c);
    assert!(a.starts_with("HTTP/1.1 403"), "{a}");
    assert!(
        a.contains("alpha") || a.contains("beta"),
        "names the profile: {a}"
    );
    drop(c);
    assert!(uploaded(&s).is_empty(), "{:?}", uploaded(&s));

    // Merritt's Ruby client sends the file first: the file is received, refused, and removed.
    let (st, text) = post_form(
        &s,
        ALICE,
        "/poster/submit",
        &[
            ("file", Some("small.txt"), b"hello\n"),
            ("profile", None, b"beta"),
        ],
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{text}");
    assert!(uploaded(&s).is_empty(), "{:?}", uploaded(&s));
    assert!(s.batches().await.is_empty(), "no batch was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitters_uploads_are_capped_as_they_arrive_and_other_tenants_are_not() {
    let s = serve(&[], "max_upload_bytes_per_submitter = 3145728\n");
    let two = vec![b'a'; 2 << 20];
    let (st, v) = s.upload(ALICE, "profile=alpha", "one.bin", &two).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let first = uploaded(&s);
    assert_eq!(first.len(), 1, "{first:?}");

    // Her second would hold 4 MiB: refused as it arrives, and nothing of it kept.
    let (st, v) = s.upload(ALICE, "profile=alpha", "two.bin", &two).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["kind"], "upload_bytes", "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(msg.contains("max_upload_bytes_per_submitter"), "{msg}");
    assert!(!msg.contains(&s.data().display().to_string()), "{msg}");
    // The same through Merritt's route, its file first as Merritt's client sends it.
    let (st, text) = post_form(
        &s,
        ALICE,
        "/poster/submit",
        &[
            ("file", Some("three.bin"), &two),
            ("profile", None, b"alpha"),
            ("responseForm", None, b"json"),
        ],
    )
    .await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{text}");
    assert_eq!(uploaded(&s), first, "only the first upload is kept");
    assert_eq!(s.batches().await.len(), 1);

    // Another tenant, and the admin, are not held to Alice's share.
    let (st, v) = s.upload(BOB, "profile=beta", "bobs.bin", &two).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (st, v) = s.upload(ADMIN, "profile=alpha", "admins.bin", &two).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(uploaded(&s).len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitters_open_batches_are_capped_on_every_route_and_other_tenants_are_not() {
    let s = serve(&[], "max_open_batches_per_submitter = 2\n");
    // Paused, the queue leaves every batch Pending: open.
    let (st, v) = (s.call(ADMIN, "PUT", "/api/v1/queues/ingest/pause", None)).await;
    assert!(st.is_success(), "{v}");
    let mut alices = Vec::new();
    for name in ["one.bin", "two.bin"] {
        let (st, v) = s.upload(ALICE, "profile=alpha", name, b"abc").await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        alices.push(v["id"].as_str().unwrap().to_string());
    }
    let kept = uploaded(&s);
    assert_eq!(kept.len(), 2, "{kept:?}");

    // A third is refused on every route, naming the key, and nothing of it is kept.
    let (st, v) = s.upload(ALICE, "profile=alpha", "three.bin", b"abc").await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["kind"], "open_batches", "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(msg.contains("max_open_batches_per_submitter"), "{msg}");
    let url = json!({"payload_url": "https://example.org/x.bin", "profile": "alpha"});
    let (st, v) = s.submit(ALICE, url).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["kind"], "open_batches", "{v}");
    let (st, text) = post_form(
        &s,
        ALICE,
        "/poster/submit",
        &[
            ("file", Some("four.bin"), b"abc"),
            ("profile", None, b"alpha"),
        ],
    )
    .await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{text}");
    assert!(text.contains("max_open_batches_per_submitter"), "{text}");
    assert_eq!(
        uploaded(&s),
        kept,
        "nothing of a refused submission is kept"
    );
    assert_eq!(s.batches().await.len(), 2);

    // Another tenant, and the admin, are not held to Alice's count.
    let (st, v) = s.upload(BOB, "profile=beta", "bobs.bin", b"abc").await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (st, v) = s.upload(ADMIN, "profile=alpha", "admins.bin", b"abc").await;
    assert_eq!(st, StatusCode::CREATED, "{v}");

    // Once hers have ended, Alice submits again.
    let (st, v) = (s.call(ADMIN, "DELETE", "/api/v1/queues/ingest/pause", None)).await;
    assert!(st.is_success(), "{v}");
    for bid in &alices {
        s.finished(bid).await;
    }
    let (st, v) = s.upload(ALICE, "profile=alpha", "five.bin", b"abc").await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_control_byte_in_every_echoed_field_comes_back_as_well_formed_xml() {
    let s = serve(&[], "");
    let controls: Vec<u8> = (0u8..0x20).collect();
    let mut value = b"ctl".to_vec();
    value.extend_from_slice(&controls);
    value.extend_from_slice(b"end]]><&");
    for field in [
        "submitter",
        "creator",
        "title",
        "date",
        "note",
        "localIdentifier",
        "digestValue",
        "type",
    ] {
        let mut parts: Vec<(&str, Option<&str>, &[u8])> = vec![
            ("file", Some("hello.txt"), b"hello\n"),
            ("profile", None, b"alpha"),
        ];
        if field == "digestValue" {
            parts.push(("digestType", None, b"md5"));
        }
        parts.push((field, None, &value));
        let (st, text) = post_form(&s, ALICE, "/poster/submit", &parts).await;
        assert!(text.starts_with("<?xml"), "{field}: {st} {text}");
        let bad: Vec<u32> = text
            .chars()
            .filter(|c| not_xml(*c))
            .map(|c| c as u32)
            .collect();
        assert!(
            bad.is_empty(),
            "{field}: {st}: characters {bad:x?} in {text:?}"
        );
        assert!(
            !text.contains("]]><&"),
            "{field}: markup not escaped: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_requests_with_huge_forms_are_refused_as_they_arrive_and_hold_little_memory() {
    let s = serve(&[], "[http]\nupload_stall_s = 120\n");
    let pid = s.child.id();
    let rss = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    // Each connection announces 200 fields of 64 KiB, sends `sent` bytes of them, and then
    // sends nothing more: the server must answer 413 without the rest.
    let field = vec![b'f'; 64 << 10];
    let parts: Vec<(String, Option<&str>, &[u8])> = (0..200)
        .map(|i| (format!("f{i}"), None, field.as_slice()))
        .collect();
    let parts: Vec<(&str, Option<&str>, &[u8])> =
        parts.iter().map(|(n, f, b)| (n.as_str(), *f, *b)).collect();
    let (ct, body) = form(&parts);
    let attack = |n: usize, sent: usize| {
        let mut held = Vec::new();
        for _ in 0..n {
            let mut c = raw_post(&s, ALICE, "/poster/submit", &ct, body.len());
            c.write_all(&body[..sent]).unwrap();
            held.push(c);
        }
        for c in &mut held {
            let a = answer(c);
            assert!(a.starts_with("HTTP/1.1 413"), "{a}");
        }
        held
    };
    // The same shape just over the cap first, so that what a server of this many
    // connections needs anyway (threads, buffers, the allocator's arenas) is in the baseline.
    drop(attack(16, 70 << 10));
    let before = rss();
    let held = attack(16, 1 << 20);
    let grew_kib = rss().saturating_sub(before);
    // A request holds at most its 64 KiB of fields, the connection's 64 KiB read buffer and
    // the parser's paced buffer (docs/SECURITY.md). Measured alone, sixteen of them grow the
    // server by about 2 MiB together; on a loaded machine the allocator keeps more (18 MiB
    // was seen), so the bound is 3 MiB each, still far below the 17-20 MiB *each* that the
    // round that found this measured.
    assert!(grew_kib < 48 << 10, "the server grew by {grew_kib} KiB");
    drop(held);
    assert!(uploaded(&s).is_empty());
    assert!(s.batches().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identifiers_that_would_share_keys_are_refused_and_the_owner_still_deposits() {
    let pdir = tempfile::tempdir().unwrap();
    std::fs::write(pdir.path().join("a.txt"), b"alice's words\n").unwrap();
    let files = PayloadServer::start(pdir.path()).await.unwrap();
    let s = serve(&[format!("http://{}/", files.addr)], "");
    for id in [
        "/ark:/99999/sq1",
        "ark:/99999/sq1/",
        " ark:/99999/sq1",
        "ark:/99999//sq1",
        "ark:/99999/vic1|1|producer/x",
    ] {
        let (st, v) = s
            .submit(
                BOB,
                json!({"payload_url": files.url("a.txt"), "profile": "beta", "primary_id": id}),
            )
            .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{id:?}: {v}");
        if id.starts_with(' ') {
            continue; // Merritt's form trims its fields: that one is the owner's identifier.
        }
        // The same through Merritt's form.
        let (st, text) = post_form(
            &s,
            BOB,
            "/poster/submit",
            &[
                ("file", Some("a.txt"), b"words\n"),
                ("profile", None, b"beta"),
                ("primaryIdentifier", None, id.as_bytes()),
            ],
        )
        .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{id:?}: {text}");
    }
    assert!(s.batches().await.is_empty(), "nothing was made");
    assert!(uploaded(&s).is_empty());
    // The owner's identifier is still free.
    let b = s
        .submit_finished(
            ALICE,
            json!({"payload_url": files.url("a.txt"), "profile": "alpha", "primary_id": "ark:/99999/sq1"}),
        )
        .await;
    assert_eq!(b["status"]["status"], "Completed", "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_depositor_reads_names_no_server_folder_and_no_error_chain() {
    let pdir = tempfile::tempdir().unwrap();
    std::fs::write(pdir.path().join("a.txt"), b"alice's words\n").unwrap();
    let files = PayloadServer::start(pdir.path()).await.unwrap();
    let s = serve(&[format!("http://{}/", files.addr)], "");
    std::fs::write(
        s.data().join("profiles/broken.toml"),
        "collection = \"alpha\"\nthis is not TOML [\n",
    )
    .unwrap();
    let data = s.data().display().to_string();
    let clean = |what: &str, v: &Value| {
        let text = v.to_string();
        assert!(
            !text.contains(&data),
            "{what} names the data folder: {text}"
        );
        assert!(
            !text.contains("TOML") && !text.contains("expected"),
            "{what}: {text}"
        );
    };
    let (st, v) = s
        .submit(
            ADMIN,
            json!({"payload_url": files.url("a.txt"), "profile": "nope"}),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .starts_with("unknown profile \"nope\" (error id E")
    );
    clean("an unknown profile", &v);
    let (st, v) = s
        .submit(
            ADMIN,
            json!({"payload_url": files.url("a.txt"), "profile": "broken"}),
        )
        .await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
    clean("a broken profile", &v);
    let id = v["error"]
        .as_str()
        .unwrap()
        .split("error id ")
        .nth(1)
        .unwrap();
    let id = id.trim_end_matches(')');
    assert!(s.log_has(id), "the log has {id}");

    // A version whose folder an operator removed: 410, naming the version, not the folder.
    let b = s.alices_completed(&files.url("a.txt")).await;
    let job = s.only_job(&b).await;
    let jid = job["id"].as_str().unwrap();
    std::fs::remove_dir_all(s.data().join("storage")).unwrap();
    let r = s
        .http
        .get(format!("{}/api/v1/jobs/{jid}/download", s.base))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::GONE);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("no longer in storage"),
        "{v}"
    );
    clean("a version gone", &v);
    assert!(!v.to_string().contains("storage/"), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merritt_upload_slower_than_the_request_timeout_is_taken() {
    let s = serve(&[], "[http]\nrequest_timeout_s = 1\nupload_stall_s = 30\n");
    let (ct, body) = form(&[
        ("file", Some("slow.txt"), b"sent in two halves\n"),
        ("profile", None, b"alpha"),
        ("responseForm", None, b"json"),
    ]);
    let mut c = raw_post(&s, ALICE, "/poster/submit", &ct, body.len());
    let half = body.len() / 2;
    c.write_all(&body[..half]).unwrap();
    // An ordinary request begun after it, sent as slowly, is held to the timeout: its 408
    // is the signal that the upload has lasted longer than request_timeout_s.
    let mut slow = raw_post(&s, ALICE, "/api/v1/batches", "application/json", 100);
    slow.write_all(b"{\"profile\":").unwrap();
    let a = answer(&mut slow);
    assert!(a.starts_with("HTTP/1.1 408"), "{a}");
    c.write_all(&body[half..]).unwrap();
    let a = answer(&mut c);
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
    assert_eq!(s.batches().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_too_large_for_zookeeper_are_refused_and_the_session_stays() {
    use lading_testkit::zk::ZkServer;
    let zk = ZkServer::start().expect("ZooKeeper");
    let hosts = zk.connect_string();
    let chroot = format!("/trust-{}", uuid::Uuid::new_v4().simple());
    lading_store_zk::ZkTree::ensure_chroot(&hosts, &chroot)
        .await
        .unwrap();
    let store = format!("zk://{hosts}{chroot}");
    let s = serve_on(Some(&store), &[], "", "");
    // The round that found this: four ERC fields of 64 KiB of control characters each,
    // 1.57 MB as JSON. Refused as it arrives (the form's 64 KiB), before the store is asked.
    let controls: Vec<u8> = (0..64 << 10).map(|i| (i % 0x1f) as u8 + 1).collect();
    let mut parts: Vec<(&str, Option<&str>, &[u8])> = vec![
        ("file", Some("a.txt"), b"words\n"),
        ("profile", None, b"alpha"),
        ("responseForm", None, b"json"),
    ];
    for f in ["creator", "title", "date", "note"] {
        parts.push((f, None, &controls));
    }
    let (st, text) = post_form(&s, ALICE, "/poster/submit", &parts).await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{text}");
    // Through the JSON API, where a body may be 1 MiB: 168,000 control characters in one
    // field are 1,008,000 bytes escaped, under the body's limit and over what ZooKeeper takes
    // in one request: refused by the store's own limit before it is sent.
    let title = "\u{1}".repeat(168_000);
    let (st, v) = s
        .submit(
            ADMIN,
            json!({"payload_url": "http://example.org/x", "profile": "alpha", "title": title}),
        )
        .await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_eq!(v["kind"], "too_large", "{v}");
    assert!(s.batches().await.is_empty(), "nothing was made");
    // The same session goes on: a form within the limits is taken, and the process never
    // lost its connection to ZooKeeper.
    let (st, text) = post_form(
        &s,
        ALICE,
        "/poster/submit",
        &[
            ("file", Some("a.txt"), b"words\n"),
            ("profile", None, b"alpha"),
            ("creator", None, &controls[..8 << 10]),
            ("responseForm", None, b"json"),
        ],
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{text}");
    assert_eq!(s.batches().await.len(), 1);
    let log = s.stderr.lock().unwrap().clone();
    for sign in ["reconnect", "connection lost", "session expired"] {
        assert!(
            !log.to_lowercase().contains(sign),
            "{sign:?} in the log:\n{log}"
        );
    }
}
