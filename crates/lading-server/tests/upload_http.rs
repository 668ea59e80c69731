//! Batches from uploads over real HTTP: the file is streamed to disk and ingested; bad names,
//! oversized and truncated bodies are refused and leave no file and no batch.

mod common;

use common::*;
use reqwest::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uploaded_file_becomes_a_batch_and_is_ingested() {
    let s = start().await;
    let (shutdown_handle, shutdown) = lading_worker::Shutdown::new();
    let ingest = s.ingest.clone();
    let workers = tokio::spawn(async move {
        lading_ingest::run(&ingest, lading_ingest::STAGE_NAMES, shutdown).await
    });
    let content = b"uploaded content\n".repeat(1000);
    let (ct, body) = multipart("file", "report.txt", &content);
    let (st, v) = s
        .send(
            SUBMITTER,
            "POST",
            "/api/v1/batches/upload?profile=demo&title=Report",
            &ct,
            body,
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(v["bytes"], content.len());
    let bid = v["id"].as_str().unwrap();
    s.until_batch(bid, "Completed").await;
    // The submitter sees its upload by name, not the server's folders.
    let (_, b) = s.get(SUBMITTER, &format!("/api/v1/batches/{bid}")).await;
    assert_eq!(
        b["submission"]["payload_url"].as_str().unwrap(),
        "upload:report.txt",
        "{b}"
    );
    assert!(
        !b.to_string().contains(s.dir.path().to_str().unwrap()),
        "{b}"
    );
    let stored = s.ingest.cfg.storage_root();
    let found = lading_testkit::files_under(&stored)
        .into_iter()
        .any(|p| p.ends_with("report.txt") && std::fs::read(&p).unwrap() == content);
    assert!(
        found,
        "the uploaded file is stored under {}",
        stored.display()
    );
    shutdown_handle.stop();
    workers.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_uploads_are_refused_and_leave_nothing() {
    let s = start().await;
    let before = s.dump().await;
    let small = b"x".to_vec();
    let up = "/api/v1/batches/upload?profile=demo";
    let cases: Vec<(&str, String, Vec<u8>, StatusCode, &str)> = {
        let (ct, b) = multipart("file", "../../etc/evil", &small);
        let (ct2, b2) = multipart("file", ".hidden", &small);
        let (ct3, b3) = multipart("file", "big.bin", &vec![7u8; (1 << 20) + 1]);
        let (ct4, mut b4) = multipart("file", "cut.bin", &vec![1u8; 5000]);
        b4.truncate(3000);
        let (ct5, b5) = multipart("other", "a.bin", &small);
        let (ct6, b6) = multipart("file", "a.bin", &small);
        vec![
            (
                up,
                ct,
                b,
                StatusCode::BAD_REQUEST,
                "must not contain a path",
            ),
            (
                up,
                ct2,
                b2,
                StatusCode::BAD_REQUEST,
                "must not start with '.'",
            ),
            (
                up,
                ct3,
                b3,
                StatusCode::PAYLOAD_TOO_LARGE,
                "larger than the limit",
            ),
            (up, ct4, b4, StatusCode::BAD_REQUEST, "upload body"),
            (
                up,
                ct5,
                b5,
                StatusCode::BAD_REQUEST,
                "unexpected form field \"other\"",
            ),
            (
                "/api/v1/batches/upload?profile=nosuch",
                ct6.clone(),
                b6.clone(),
                StatusCode::BAD_REQUEST,
                "unknown profile \"nosuch\"",
            ),
            (
                "/api/v1/batches/upload?profile=demo&type=zip",
                ct6.clone(),
                b6.clone(),
                StatusCode::BAD_REQUEST,
                "unknown payload type",
            ),
            (
                "/api/v1/batches/upload?profile=demo&payload_url=http%3A%2F%2Fexample.org%2Fx",
                ct6.clone(),
                b6.clone(),
                StatusCode::BAD_REQUEST,
                "payload_url is not taken with an upload",
            ),
            (
                "/api/v1/batches/upload?profile=demo&colour=red",
                ct6,
                b6,
                StatusCode::BAD_REQUEST,
                "unknown field `colour`",
            ),
            (
                up,
                "application/json".into(),
                b"{}".to_vec(),
                StatusCode::BAD_REQUEST,
                "multipart",
            ),
        ]
    };
    for (path, ct, body, status, says) in cases {
        let (st, v) = s.send(SUBMITTER, "POST", path, &ct, body).await;
        assert_eq!(st, status, "{path} {says}: {v}");
        let msg = v["error"].as_str().unwrap_or_default();
        assert!(msg.contains(says), "{msg:?} should say {says:?}");
        assert_eq!(
            s.uploads(),
            Vec::<std::path::PathBuf>::new(),
            "{says}: files left"
        );
        assert_eq!(s.dump().await, before, "{says}: the tree changed");
    }
}

/// An uploaded manifest whose rows name files beside it (the newcomer's `letters.checkm`
/// uploaded alone) fails its batch saying that an upload brings only the manifest and that a
/// zip brings the files; nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uploaded_manifest_naming_files_beside_it_says_to_upload_a_zip() {
    let s = start().await;
    let (shutdown_handle, shutdown) = lading_worker::Shutdown::new();
    let ingest = s.ingest.clone();
    let workers = tokio::spawn(async move {
        lading_ingest::run(&ingest, lading_ingest::STAGE_NAMES, shutdown).await
    });
    let manifest = "#%checkm_0.7\n#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest\n\
#%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileName\n\
a.txt | | | | a.txt\n#%eof\n";
    let (ct, body) = multipart("file", "letters.checkm", manifest.as_bytes());
    let (st, v) = s
        .send(
            SUBMITTER,
            "POST",
            "/api/v1/batches/upload?profile=demo&type=manifest",
            &ct,
            body,
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let bid = v["id"].as_str().unwrap();
    s.until_batch(bid, "Failed").await;
    let (_, b) = s.get(SUBMITTER, &format!("/api/v1/batches/{bid}")).await;
    let jid = b["jobs"]
        .as_object()
        .and_then(|m| {
            m.values()
                .flat_map(|v| v.as_array().cloned().unwrap_or_default())
                .next()
        })
        .and_then(|j| j.as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("a job in {b}"));
    let (_, j) = s.get(SUBMITTER, &format!("/api/v1/jobs/{jid}")).await;
    let msg = j["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for want in [
        "\"a.txt\" names a file beside the uploaded manifest",
        "http(s) URLs the server may fetch",
        "upload a zip or tar of them (type container)",
    ] {
        assert!(msg.contains(want), "{want:?} not in {msg:?}");
    }
    assert!(!msg.contains("configured roots"), "{msg}");
    assert!(!msg.contains(s.dir.path().to_str().unwrap()), "{msg}");
    let stored = s.ingest.cfg.storage_root();
    assert!(
        lading_testkit::files_under(&stored).is_empty(),
        "nothing stored"
    );
    shutdown_handle.stop();
    workers.await.unwrap().unwrap();
}
