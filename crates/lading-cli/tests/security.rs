//! The trust boundary, tried as a hostile submitter would: a real `lading serve` process on
//! loopback with real tokens, real payload servers (one allowed, one "internal" that must
//! never be reached), bombs and oversized inputs built here, and raw sockets for the
//! connection floods. Every refusal is checked to name its rule and to leave the stored state
//! as it was. See docs/SECURITY.md.

mod common;

use common::serve::*;
use lading_testkit::payload_server::PayloadServer;
use lading_testkit::{checkm, files_under, poll};
use reqwest::StatusCode;
use serde_json::json;
use std::io::{Read, Write};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A loopback "internal service" that counts every connection made to it: no depositor's
/// URL may ever reach it.
struct Internal {
    addr: std::net::SocketAddr,
    hits: Arc<AtomicUsize>,
}

fn internal_service() -> Internal {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            h.fetch_add(1, Ordering::SeqCst);
            let mut s = s;
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nsecret",
            );
        }
    });
    Internal { addr, hits }
}

/// A server answering every request with `head` and then `body` forever, `chunk` bytes
/// every `every`.
fn endless_server(head: &'static str, chunk: usize, every: Duration) -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                if s.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let block = vec![b'0'; chunk];
                loop {
                    if s.write_all(&block).is_err() {
                        return;
                    }
                    if !every.is_zero() {
                        // Sleep (time is the subject): a client that drips its body slowly.
                        std::thread::sleep(every);
                    }
                }
            });
        }
    });
    addr
}

/// Waits until the server's metrics show `n` generic-job acceptors waiting.
async fn waiting_acceptors(s: &Serve, n: usize) {
    let want = format!("\nlading_generic_acceptors_waiting {n}\n");
    poll::until(
        &format!("{n} acceptors waiting"),
        Duration::from_secs(30),
        async || {
            let m = s.metrics().await;
            let line = m
                .lines()
                .find(|l| l.starts_with("lading_generic_acceptors_waiting "));
            if m.contains(&want) {
                Ok(())
            } else {
                Err(line.map(str::to_string))
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_urls_and_internal_addresses_are_refused_and_nothing_reaches_them() {
    let internal = internal_service();
    let s = serve(&[], "");
    let secret = format!("http://{}/admin", internal.addr);
    for url in [
        "file:///proc/self/cmdline".to_string(),
        "FILE:///etc/passwd".to_string(),
        format!("file://{}/lading.toml", s.dir.path().display()),
        "file://lading.toml/x".to_string(),
        secret.clone(),
        format!("http://localhost:{}/admin", internal.addr.port()),
        format!("http://[::1]:{}/admin", internal.addr.port()),
        format!("http://0x7f000001:{}/admin", internal.addr.port()),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "gopher://example.org/x".to_string(),
    ] {
        for token in [BOB, ADMIN] {
            let (st, v) = s
                .submit(token, json!({"payload_url": url, "profile": "beta"}))
                .await;
            assert_eq!(st, StatusCode::BAD_REQUEST, "{url}: {v}");
            let e = v["error"].as_str().unwrap();
            assert!(
                e.contains("payload policy") || e.contains("not an http, https or file URL"),
                "{url}: {e}"
            );
            assert!(
                !e.contains("No such file"),
                "a refusal tells nothing of the file: {e}"
            );
        }
    }
    // A missing file and an existing one outside the roots read the same.
    let (_, a) = s
        .submit(
            BOB,
            json!({"payload_url": "file:///etc/passwd", "profile": "beta"}),
        )
        .await;
    let (_, b) = s
        .submit(
            BOB,
            json!({"payload_url": "file:///etc/nonexistent-9f2", "profile": "beta"}),
        )
        .await;
    assert_eq!(
        a["error"].as_str().unwrap().replace("passwd", "X"),
        b["error"].as_str().unwrap().replace("nonexistent-9f2", "X")
    );
    assert!(s.batches().await.is_empty(), "no batch was stored");

    // Inside an uploaded manifest, the rows are the depositor's too: the batch fails at
    // intake naming the rule, no job is made, nothing is fetched.
    let rows = vec![
        "file:///etc/passwd | | | | | passwd".to_string(),
        format!("{secret} | | | | | secret.txt"),
    ];
    for row in rows {
        let b = s.single_file_batch(&row).await;
        assert_eq!(b["status"]["status"], "Failed", "{b}");
        assert!(message(&b).contains("payload policy"), "{row}: {b}");
        assert!(s.jobs_of(&b).await.is_empty(), "no job was made: {b}");
    }
    assert_eq!(
        internal.hits.load(Ordering::SeqCst),
        0,
        "the internal service was reached"
    );
    assert!(s.stored_files().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_an_internal_address_is_refused() {
    let internal = internal_service();
    // An allowed server that redirects to the internal one.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let redirector = l.local_addr().unwrap();
    let target = format!("http://{}/admin", internal.addr);
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let mut s = s;
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(
                format!("HTTP/1.1 302 Found\r\nLocation: {target}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            );
        }
    });
    let s = serve(
        &[format!("http://{redirector}/")],
        "[stages.downloading]\nmax_attempts = 1\n",
    );
    let b = s
        .submit_finished(
            BOB,
            json!({"payload_url": format!("http://{redirector}/f.txt"), "profile": "beta"}),
        )
        .await;
    let job = s.only_job(&b).await;
    assert_eq!(job["status"]["status"], "Failed", "{job}");
    assert!(message(&job).contains("redirect"), "{job}");
    assert!(message(&job).contains("payload policy"), "{job}");
    assert_eq!(internal.hits.load(Ordering::SeqCst), 0);
    assert!(s.stored_files().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_can_neither_read_nor_extend_anothers_object() {
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

    // Read: Bob's request for Alice's object is the same 404 as for a made-up one.
    let (st, mine) = s
        .post(BOB, "/api/v1/access", json!({"ark": ark, "version": 1}))
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{mine}");
    let (st2, none) = s
        .post(
            BOB,
            "/api/v1/access",
            json!({"ark": "ark:/99999/fk4nothing", "version": 1}),
        )
        .await;
    assert_eq!(st2, StatusCode::NOT_FOUND);
    assert_eq!(
        mine["error"].as_str().unwrap().replace(&ark, "ARK"),
        none["error"]
            .as_str()
            .unwrap()
            .replace("ark:/99999/fk4nothing", "ARK")
    );
    // Alice herself may.
    let (st, v) = s
        .post(ALICE, "/api/v1/access", json!({"ark": ark, "version": 1}))
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{v}");
    // The secret is kept only as a digest.
    let token = v["token"].as_str().unwrap().to_string();
    let secret = token.rsplit('.').next().unwrap().to_string();
    let (st, _) = s.get(ALICE, &format!("/api/v1/access/{token}")).await;
    assert_eq!(st, StatusCode::OK);
    let dump = Command::new(env!("CARGO_BIN_EXE_lading"))
        .arg("--store")
        .arg(format!(
            "sqlite:{}",
            s.dir.path().join("lading.db").display()
        ))
        .args(["dump", "--format", "json", "/access"])
        .output()
        .unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(dump.contains("secret_sha256"), "{dump}");
    assert!(!dump.contains(&secret), "the secret is in the tree: {dump}");

    // Write: Bob's file as a new version of Alice's object, from another collection.
    let (st, v) = s
        .submit(
            BOB,
            json!({"payload_url": files.url("b.txt"), "profile": "beta", "primary_id": ark}),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("another collection"),
        "{v}"
    );
    // The same through a manifest row: the job fails, nothing is stored.
    let m = checkm(
        "mrt-single-file-batch-manifest",
        "nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileLastModified | nfo:fileName | mrt:primaryIdentifier",
        &[format!("{} | | | | | b.txt | {ark}", files.url("b.txt"))],
    );
    let (st, v) = s
        .upload(
            BOB,
            "profile=beta&type=single-file-batch-manifest",
            "m.checkm",
            m.as_bytes(),
        )
        .await;
    s.only_job_failed((st, v), "another collection").await;
    assert_eq!(s.stored_files(), stored_before, "nothing more was stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_cannot_lock_the_server_up() {
    let s = serve(&[], "[http]\nmax_connections = 200\nheader_timeout_s = 2\n");
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut held = Vec::new();
    // As many connections as the finding used (1,100), or as this process may open.
    let flood = 1100.min(lading_server::conn::raise_open_files().saturating_sub(100));
    assert!(flood > 400, "too few descriptors for the test: {flood}");
    // Idle connections, half-sent headers and a slow body, well past the cap.
    for i in 0..flood {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        use tokio::io::AsyncWriteExt;
        match i % 3 {
            0 => {}
            1 => {
                let _ = c
                    .write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                    .await;
            }
            _ => {
                let _ = c
                    .write_all(
                        format!(
                            "POST /api/v1/batches HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {BOB}\r\n\
                             Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{"
                        )
                        .as_bytes(),
                    )
                    .await;
            }
        }
        held.push(c);
        if i % 100 == 99 {
            s.healthy().await;
        }
    }
    // The server stays healthy while they are held, until the idle and half-header ones are
    // closed once their header time is up (waited on as the first one's end of stream).
    use tokio::io::AsyncReadExt;
    let mut b = [0u8; 64];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        s.healthy().await;
        match tokio::time::timeout(Duration::from_millis(100), held[0].read(&mut b)).await {
            Ok(Ok(0)) => break,
            Ok(r) => panic!("an idle connection got {r:?}"),
            Err(_) => assert!(Instant::now() < deadline, "idle connections never closed"),
        }
    }
    let mut closed = 1;
    for c in held.iter_mut().step_by(3).skip(1) {
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_secs(10), c.read(&mut b)).await {
            closed += 1;
        }
    }
    assert_eq!(
        closed,
        held.len().div_ceil(3),
        "every idle connection was closed"
    );
    s.healthy().await;
    assert!(s.batches().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_hostile_manifests_are_refused_without_stalling_the_server() {
    // Rows name hosts this machine cannot resolve: an outage of those hosts (SPEC §11),
    // waited for a second at most here.
    let s = serve_with(
        &[],
        "max_rows = 100\nmax_manifest_bytes = 4194304\n",
        "[dependencies]\nmax_wait_s = 1\nprobe_max_s = 1\n",
    );
    let fields = "nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileLastModified | nfo:fileName";
    // Many prefixes and very wide fields: each refused by its limit, quickly.
    let mut prefixes = String::from(
        "#%checkm_0.7\n#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-single-file-batch-manifest\n",
    );
    for i in 0..20_000 {
        prefixes.push_str(&format!("#%prefix | p{i}: | http://example.org/{i}#\n"));
    }
    let wide: Vec<String> = (0..100_000).map(|i| format!("x:f{i}")).collect();
    let wide = format!(
        "#%checkm_0.7\n#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-single-file-batch-manifest\n\
         #%fields | nfo:fileUrl | {}\n#%eof\n",
        wide.join(" | ")
    );
    let rows: Vec<String> = (0..101)
        .map(|i| format!("https://example.org/{i} | | | | | f{i}"))
        .collect();
    let many = checkm("mrt-single-file-batch-manifest", fields, &rows);
    let long_line = checkm(
        "mrt-single-file-batch-manifest",
        fields,
        &[format!(
            "https://example.org/{} | | | | | f",
            "a".repeat(70_000)
        )],
    );
    for (what, text, expect) in [
        ("prefixes", prefixes, "payload.max_prefixes"),
        ("fields", wide, "payload.max_line_bytes"),
        ("rows", many, "payload.max_rows"),
        ("line", long_line, "payload.max_line_bytes"),
    ] {
        let (st, v) = s.bobs_batch_manifest(&text).await;
        assert_eq!(st, StatusCode::CREATED, "{what}: {v}");
        let bid = v["id"].as_str().unwrap().to_string();
        s.healthy().await;
        let b = s.finished(&bid).await;
        assert_eq!(b["status"]["status"], "Failed", "{what}: {b}");
        assert!(message(&b).contains(expect), "{what}: {b}");
        assert!(s.jobs_of(&b).await.is_empty(), "{what}: no job was made");
    }
    // Many fields within the line limit.
    let wide: Vec<String> = (0..2_000).map(|i| format!("x:{i}")).collect();
    let wide = format!(
        "#%checkm_0.7\n#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-single-file-batch-manifest\n\
         #%fields | nfo:fileUrl | {}\n#%eof\n",
        wide.join(" | ")
    );
    let (_, v) = s.bobs_batch_manifest(&wide).await;
    let b = s.finished(v["id"].as_str().unwrap()).await;
    assert!(message(&b).contains("payload.max_fields"), "{b}");
    // A byte-order mark at the start is fine.
    let bom = format!(
        "\u{feff}{}",
        checkm(
            "mrt-single-file-batch-manifest",
            fields,
            &["https://example.org/x | | | | | x".into()]
        )
    );
    let (_, v) = s.bobs_batch_manifest(&bom).await;
    let b = s.finished(v["id"].as_str().unwrap()).await;
    assert!(
        !message(&b).contains("checkm_0.7"),
        "the BOM is accepted: {b}"
    );
    assert!(s.stored_files().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_and_dripping_payloads_are_cut_off() {
    let endless = endless_server(
        "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",
        64 << 10,
        Duration::ZERO,
    );
    let drip = endless_server(
        "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\nConnection: close\r\n\r\n",
        1,
        Duration::from_millis(500),
    );
    let s = serve_with(
        &[format!("http://{endless}/"), format!("http://{drip}/")],
        "max_manifest_bytes = 1048576\nmin_rate_bytes_per_s = 1000\nrate_window_s = 2\n",
        "[stages.downloading]\nmax_attempts = 1\n",
    );
    // An endless manifest: refused past the manifest limit.
    let b = s.submit_finished(BOB, json!({"payload_url": format!("http://{endless}/m.checkm"), "profile": "beta", "type": "batch-manifest"})).await;
    assert!(message(&b).contains("payload.max_manifest_bytes"), "{b}");
    // An endless file whose manifest declares 10 bytes: cut off at the 11th.
    let job = s
        .single_file_batch_job(&format!("http://{endless}/f.bin | | | 10 | | f.bin"))
        .await;
    assert!(
        message(&job).contains("sends more than the 10 bytes"),
        "{job}"
    );
    // A file dripping one byte at a time: cut off by the minimum rate.
    let (_, v) = s
        .submit(
            BOB,
            json!({"payload_url": format!("http://{drip}/d.bin"), "profile": "beta"}),
        )
        .await;
    let b = s.finished(v["id"].as_str().unwrap()).await;
    let job = s.only_job(&b).await;
    assert!(
        message(&job).contains("payload.min_rate_bytes_per_s"),
        "{job}"
    );
    // A size that can never fit fails at once, not after hours of waiting.
    let job = s
        .single_file_batch_job(&format!(
            "http://{drip}/missing | | | 999999999999999999 | | x"
        ))
        .await;
    assert!(message(&job).contains("can never fit"), "{job}");
    // Nothing large was left in the working folders.
    s.left_nothing();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_bombs_are_refused_and_leave_nothing_behind() {
    let s = serve(&[], "");
    // 64 MiB of zeros in a tar.gz of a few dozen KiB: far past the default ratio of 200.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("zeros.bin"), vec![0u8; 64 << 20]).unwrap();
    let st = Command::new("tar")
        .current_dir(tmp.path())
        .args(["czf", "bomb.tar.gz", "zeros.bin"])
        .status()
        .unwrap();
    assert!(st.success());
    let bomb = std::fs::read(tmp.path().join("bomb.tar.gz")).unwrap();
    assert!(bomb.len() < 1 << 20);
    let (st, v) = s
        .upload(BOB, "profile=beta&type=container", "bomb.tar.gz", &bomb)
        .await;
    s.only_job_failed((st, v), "payload.max_unpack_ratio").await;
    s.left_nothing();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_with_huge_headers_or_bad_names_are_refused_and_leave_nothing() {
    let s = serve(&[], "");
    let uploads = || files_under(&s.data().join("uploads"));
    // One part with a megabyte of headers.
    let boundary = "sec-test-boundary-5b1e";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\nX-Pad: "
    )
    .into_bytes();
    body.extend(std::iter::repeat_n(b'a', 1 << 20));
    body.extend_from_slice(format!("\r\n\r\nhello\r\n--{boundary}--\r\n").as_bytes());
    let (st, v) = s
        .send(
            BOB,
            "POST",
            "/api/v1/batches/upload?profile=beta",
            &format!("multipart/form-data; boundary={boundary}"),
            body,
        )
        .await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("http.max_part_header_bytes"),
        "{v}"
    );
    for name in ["#frag.txt", "q?x=1.txt", "100%.txt", &"n".repeat(251)] {
        let (st, v) = s.upload(BOB, "profile=beta", name, b"x").await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{name}: {v}");
    }
    for id in [".", "..", "a\u{0}b", "..x"] {
        let (st, v) = s.submit(BOB, json!({"payload_url": "https://example.org/x", "profile": "beta", "primary_id": id})).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{id:?}: {v}");
        assert!(
            v["error"].as_str().unwrap().contains("primary identifier"),
            "{v}"
        );
    }
    assert!(uploads().is_empty(), "{:?}", uploads());
    assert!(s.batches().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_cannot_be_stored_fail_at_once() {
    let s = serve(&[], "");
    let long = "n".repeat(252);
    let m = checkm(
        "mrt-ingest-manifest",
        "nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileLastModified | nfo:fileName",
        &[format!("https://example.org/x | | | | | {long}")],
    );
    let (st, v) = s
        .upload(BOB, "profile=beta&type=manifest", "m.checkm", m.as_bytes())
        .await;
    let job = s.only_job_failed((st, v), "over the limit of 250").await;
    assert_eq!(job["status"]["retry_count"], 0, "not retried: {job}");
    assert_eq!(job["status"]["failure_kind"], "fatal", "{job}");
    assert_eq!(job["status"]["failed_attempts"], 1, "{job}");
    // Failed jobs are listed with what failed and how, and filtered on it.
    let (st, v) = s
        .get(ADMIN, "/api/v1/jobs?state=Failed&failure_kind=fatal")
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["jobs"][0]["id"], job["id"], "{v}");
    assert_eq!(v["jobs"][0]["failure_kind"], "fatal", "{v}");
    assert_eq!(
        v["jobs"][0]["failed_stage"], job["status"]["failed_stage"],
        "{v}"
    );
    let (_, v) = s
        .get(ADMIN, "/api/v1/jobs?state=Failed&failure_kind=exhausted")
        .await;
    assert_eq!(v["jobs"], json!([]), "{v}");
    let (st, _) = s
        .get(ADMIN, "/api/v1/jobs?state=Failed&failure_kind=bogus")
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hardening_roles_overflow_ghost_acceptors_metrics_and_file_modes() {
    let s = serve(&[], "");
    // The config holds tokens and is readable by others (mode 0644): a warning.
    assert!(
        s.stderr
            .lock()
            .unwrap()
            .contains("holds API tokens but other users may read it")
    );
    // `bearer` in lower case.
    let r = s
        .http
        .get(format!("{}/api/v1/batches", s.base))
        .header("authorization", format!("bearer {BOB}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // A submitter on an admin route with a bad body: 403, not the body's schema.
    let r = s
        .http
        .put(format!("{}/api/v1/types/thumbs", s.base))
        .bearer_auth(BOB)
        .header("content-type", "application/json")
        .body("{\"nonsense\": 1}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // A timeout that would overflow in milliseconds: 400, and no type is made.
    let (st, v) = s
        .call(
            ADMIN,
            "PUT",
            "/api/v1/types/thumbs",
            Some(json!({"timeout_s": 18446744073709552u64})),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    let (st, _) = s.get(ADMIN, "/api/v1/types/thumbs").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = s
        .call(
            ADMIN,
            "PUT",
            "/api/v1/types/thumbs",
            Some(json!({"timeout_s": 60})),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    // Ghost acceptors: clients that hang up take nothing.
    let mut ghosts = Vec::new();
    for _ in 0..20 {
        let (http, base) = (reqwest::Client::new(), s.base.clone());
        ghosts.push(tokio::spawn(async move {
            let _ = http
                .post(format!("{base}/api/v1/types/thumbs/accept"))
                .bearer_auth(ADMIN)
                .json(&json!({"timeout_ms": 60000}))
                .send()
                .await;
        }));
    }
    // The long-polls reach the server process; then the server notices their hang-ups.
    waiting_acceptors(&s, 20).await;
    for g in &ghosts {
        g.abort();
    }
    waiting_acceptors(&s, 0).await;
    // No acceptor is left waiting: a ghost that still held on would be counted above.
    let (st, v) = s
        .post(
            ADMIN,
            "/api/v1/types/thumbs/jobs",
            json!({"id": "j1", "data": {}}),
        )
        .await;
    assert!(st.is_success(), "{v}");
    let (_, j) = s.get(ADMIN, "/api/v1/types/thumbs/jobs/j1").await;
    assert_eq!(j["state"], "pending", "no ghost took it: {j}");
    let (st, j) = s
        .post(
            ADMIN,
            "/api/v1/types/thumbs/accept",
            json!({"timeout_ms": 5000}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{j}");
    // Tenant-chosen names stay off the public metrics page.
    let m = s.metrics().await;
    assert!(!m.contains("thumbs"), "{m}");
    assert!(
        m.contains("lading_generic_jobs{state=\"running\"} 1"),
        "{m}"
    );
    // Files are the service's own.
    use std::os::unix::fs::PermissionsExt;
    for f in ["lading.db", "data/inventory.db"] {
        let p = s.dir.path().join(f);
        if let Ok(m) = std::fs::metadata(&p) {
            assert_eq!(
                m.permissions().mode() & 0o077,
                0,
                "{f} is {:o}",
                m.permissions().mode()
            );
        }
    }
    let m = std::fs::metadata(s.dir.path().join("lading.db")).unwrap();
    assert_eq!(m.permissions().mode() & 0o077, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_submitters_slow_downloads_do_not_hold_every_slot() {
    // Endless dripping files, and a long rate window: nothing is cut off by the rate here.
    let drip = endless_server(
        "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\nConnection: close\r\n\r\n",
        1,
        Duration::from_millis(200),
    );
    let pdir = tempfile::tempdir().unwrap();
    std::fs::write(pdir.path().join("tiny.txt"), b"tiny\n").unwrap();
    let files = PayloadServer::start(pdir.path()).await.unwrap();
    let s = serve_with(
        &[format!("http://{drip}/"), format!("http://{}/", files.addr)],
        "min_rate_bytes_per_s = 1\nrate_window_s = 600\n",
        "[stages.downloading]\nconcurrency = 2\n",
    );
    // Bob's three slow files take both slots.
    let rows: Vec<String> = (0..3)
        .map(|i| format!("http://{drip}/d{i}.bin | | | | | d{i}.bin"))
        .collect();
    let m = checkm(
        "mrt-single-file-batch-manifest",
        "nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileLastModified | nfo:fileName",
        &rows,
    );
    let (st, v) = s.bobs_batch_manifest(&m).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let bobs = v["id"].as_str().unwrap().to_string();
    // Another process's downloads have no event here.
    poll::until(
        "bob's downloads to start",
        Duration::from_secs(60),
        async || {
            let (_, b) = s.get(ADMIN, &format!("/api/v1/batches/{bobs}")).await;
            let downloading = s
                .jobs_of(&b)
                .await
                .iter()
                .filter(|j| j["status"]["status"] == "Downloading" && j["locked"] == true)
                .count();
            if downloading == 2 { Ok(()) } else { Err(b) }
        },
    )
    .await;
    // Alice's tiny file gets a slot and completes while Bob's still drip.
    s.alices_completed(&files.url("tiny.txt")).await;
    let (_, bob) = s.get(ADMIN, &format!("/api/v1/batches/{bobs}")).await;
    assert_eq!(
        bob["status"]["status"], "Processing",
        "bob's are still going: {bob}"
    );
    // One of Bob's gave its slot back, and said so; none failed.
    let jobs = s.jobs_of(&bob).await;
    assert!(
        jobs.iter().all(|j| j["status"]["status"] != "Failed"),
        "{jobs:?}"
    );
}

/// This machine's own name when it resolves to loopback only (as a host's name in a
/// container or a VM does), else `localhost`: a name, not an address, either way.
async fn loopback_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let addrs: Vec<std::net::SocketAddr> = match tokio::net::lookup_host((host.as_str(), 0)).await {
        Ok(a) => a.collect(),
        Err(_) => Vec::new(),
    };
    if !host.is_empty() && !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()) {
        host
    } else {
        "localhost".into()
    }
}

/// A server answering `GET /ok/rN` with a redirect to the N-th of `targets`.
fn redirector(targets: Vec<String>) -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let mut s = s;
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]).to_string();
            let i: usize = req
                .split_once("/ok/r")
                .and_then(|(_, r)| r.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let to = targets.get(i).cloned().unwrap_or_default();
            let _ = s.write_all(
                format!("HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            );
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_allowed_host_admits_only_its_prefix_not_other_ports_or_paths() {
    let host = loopback_name().await;
    // The allowed server holds an allowed folder and an internal one beside it.
    let pdir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(pdir.path().join("ok")).unwrap();
    std::fs::create_dir_all(pdir.path().join("internal")).unwrap();
    std::fs::write(pdir.path().join("ok/a.txt"), b"allowed\n").unwrap();
    std::fs::write(pdir.path().join("internal/secret.txt"), b"secret\n").unwrap();
    let files = PayloadServer::start(pdir.path()).await.unwrap();
    let p1 = files.addr.port();
    let internal = internal_service();
    let p2 = internal.addr.port();
    let redirect = redirector(vec![
        format!("http://{host}:{p2}/secret.txt"),
        format!("http://{host}:{p1}/files/internal/secret.txt"),
        format!("http://{host}:{p1}/files/ok/../internal/secret.txt"),
    ]);
    let p3 = redirect.port();
    let s = serve(
        &[
            format!("http://{host}:{p1}/files/ok/"),
            format!("http://{host}:{p3}/ok/"),
        ],
        "[stages.downloading]\nmax_attempts = 1\n",
    );
    // Inside the prefix: taken and stored.
    let ok = s
        .submit_finished(
            BOB,
            json!({"payload_url": format!("http://{host}:{p1}/files/ok/a.txt"), "profile": "beta"}),
        )
        .await;
    let job = s.only_job(&ok).await;
    assert_eq!(ok["status"]["status"], "Completed", "{job}");
    let stored_before = s.stored_files();
    let batches_before = s.batches().await;
    // Another port, outside the path, and spellings that climb out: refused at submit.
    for url in [
        format!("http://{host}:{p2}/secret.txt"),
        format!("http://{host}:{p1}/files/internal/secret.txt"),
        format!("http://{host}:{p1}/files/ok/%2e%2e/internal/secret.txt"),
        format!("http://{host}:{p1}/files/ok/..%2finternal/secret.txt"),
        format!("http://{host}:{p1}/files/okay/../internal/secret.txt"),
    ] {
        let (st, v) = s
            .submit(BOB, json!({"payload_url": url, "profile": "beta"}))
            .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{url}: {v}");
        let e = v["error"].as_str().unwrap();
        assert!(e.contains("allowed only under the prefixes"), "{url}: {e}");
    }
    assert_eq!(s.batches().await, batches_before, "nothing was stored");
    // In a manifest row: the batch fails at intake, no job is made.
    let b = s
        .single_file_batch(&format!(
            "http://{host}:{p1}/files/internal/secret.txt | | | | | secret.txt"
        ))
        .await;
    assert_eq!(b["status"]["status"], "Failed", "{b}");
    assert!(
        message(&b).contains("allowed only under the prefixes"),
        "{b}"
    );
    // A redirect from inside a prefix to another port or path: the job fails naming it.
    for i in 0..3 {
        let b = s
            .submit_finished(
                BOB,
                json!({"payload_url": format!("http://{host}:{p3}/ok/r{i}"), "profile": "beta"}),
            )
            .await;
        let job = s.only_job(&b).await;
        assert_eq!(job["status"]["status"], "Failed", "{job}");
        assert!(message(&job).contains("redirect"), "{job}");
        assert!(message(&job).contains("payload policy"), "{job}");
    }
    assert_eq!(
        internal.hits.load(Ordering::SeqCst),
        0,
        "the internal service was reached"
    );
    assert_eq!(s.stored_files(), stored_before, "nothing more was stored");
    for f in s.stored_files() {
        let text = std::fs::read(&f).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&text).contains("secret"),
            "{}",
            f.display()
        );
    }
}
