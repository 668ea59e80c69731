//! A real `lading worker` SIGKILLed while a multipart upload to a real SeaweedFS node is open:
//! a second worker finishes the job, sends again only what the first had not confirmed, and
//! leaves no upload open. A proxy in front of the node holds the upload's second part on the
//! wire, so the kill comes at exactly that point every run.

mod common;

use common::{Reap, engine, object_manifest, until};
use lading_core::BatchState;
use lading_core::layout::{BatchId, JobId};
use lading_testkit::payload_server::PayloadServer;
use lading_testkit::proxy::HoldingProxy;
use lading_testkit::seaweed::{ACCESS_KEY, SECRET_KEY, Weed};
use std::process::Stdio;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_with_a_multipart_upload_open_is_finished_by_another_sending_only_the_unconfirmed()
 {
    let weed = Weed::start().expect("SeaweedFS");
    weed.bucket("primary").unwrap();
    let node: std::net::SocketAddr = weed
        .endpoint()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let proxy = HoldingProxy::start(node, "partNumber=2&").unwrap();
    let mut s = common::setup(
        "storage_nodes = [9501]\n",
        &format!(
            "[[storage_nodes]]\nid = 9501\nurl = \"s3://primary/lading\"\nendpoint = \"{}\"\npart_size = 5242880\n",
            proxy.endpoint()
        ),
    );
    s.env.extend([
        ("LADING_LOG", "warn"),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
    ]);
    let payload = s.dir.path().join("payload");
    std::fs::create_dir_all(&payload).unwrap();
    let server = PayloadServer::start(&payload).await.unwrap();
    // One file of three parts (5 + 5 + 2 MiB), first in name order, beside eight small ones
    // (one PUT each; with the two manifests Lading adds, ten, and the worker records its
    // confirmations of small files every eighth).
    let big = vec![7u8; 12 << 20];
    let small: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| {
            (
                format!("s{i}.txt"),
                format!("small file {i}\n").into_bytes(),
            )
        })
        .collect();
    let mut files: Vec<(&str, &[u8])> = vec![("a-big.bin", &big)];
    files.extend(small.iter().map(|(n, b)| (n.as_str(), b.as_slice())));
    let url = object_manifest(&server, &payload, &files);
    let o = s
        .cmd(&["submit", &url, "--profile", "demo", "--type", "manifest"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bid = BatchId::parse(String::from_utf8_lossy(&o.stdout).trim()).unwrap();

    let worker = |s: &common::Setup| {
        Reap(
            s.cmd(&["worker", "--grace-s", "5"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start a worker"),
        )
    };
    let mut first = worker(&s);
    let e = engine(&s.db).await;
    let mut job: Option<JobId> = None;
    until("the job's id", async || {
        job = e
            .batch(&bid)
            .await
            .unwrap()
            .jobs
            .values()
            .flatten()
            .next()
            .cloned();
        job.is_some()
    })
    .await;
    let job = job.unwrap();
    // The moment: the big file's second part held on the wire (its upload open on the node),
    // every other request answered, and the eight small files recorded as confirmed.
    let progress = lading_core::layout::job_node(&job, "store-progress");
    let mut confirmed: Vec<String> = Vec::new();
    until(
        "the upload open and the small files confirmed",
        async || {
            let recorded = e.tree().get(&progress).await.unwrap().and_then(|n| {
                serde_json::from_slice::<serde_json::Value>(&n.data.unwrap_or_default()).ok()
            });
            confirmed = recorded
                .and_then(|v| v["confirmed"].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect();
            proxy.holding() && proxy.unanswered() == 1 && confirmed.len() == 8
        },
    )
    .await;
    first.0.kill().unwrap(); // SIGKILL: no cleanup runs
    first.0.wait().unwrap();
    assert_eq!(
        weed.open_uploads("primary"),
        1,
        "the kill left the upload open"
    );
    assert!(
        !confirmed.contains(&"producer/a-big.bin".to_string()),
        "{confirmed:?}"
    );

    let _second = worker(&s);
    until("the batch to complete on the second worker", async || {
        e.batch(&bid).await.unwrap().status.status == BatchState::Completed
    })
    .await;
    assert_eq!(
        weed.open_uploads("primary"),
        0,
        "no multipart upload is left open"
    );
    // Each file recorded as confirmed went up once, from the first worker (a small file
    // confirmed after the last record costs one conditional PUT); the big one was begun
    // again.
    let counts = proxy.counts();
    let puts = |rel: &str| {
        counts
            .iter()
            .filter(|(k, _)| k.starts_with("PUT ") && k.ends_with(&format!("%7C{rel}")))
            .map(|(_, n)| n)
            .sum::<usize>()
    };
    for rel in &confirmed {
        assert_eq!(
            puts(rel),
            1,
            "{rel} was sent again: {:#?}",
            proxy.requests()
        );
    }
    let uploads_begun = proxy
        .requests()
        .iter()
        .filter(|r| r.starts_with("POST ") && r.contains("a-big.bin?uploads"))
        .count();
    assert_eq!(uploads_begun, 2, "{:#?}", proxy.requests());
}
