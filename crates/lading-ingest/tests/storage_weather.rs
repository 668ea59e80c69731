//! Storage nodes in bad weather, against real SeaweedFS servers: a primary down longer than
//! every attempt costs time and no work, a replica down lets versions complete and catches up,
//! a key the node refuses fails its job at once while the node stays up. On both stores.

#[macro_use]
mod common;

use common::nodes::*;
use common::{Backend, World};
use lading_core::BatchState;
use lading_ingest::nodes::{Node, NodeSettings};
use lading_ingest::{Config, Ingest};
use lading_testkit::seaweed::Weed;
use std::sync::Arc;

on_both_backends!(
    a_primary_down_longer_than_every_attempt_costs_time_and_no_work,
    a_replica_down_lets_versions_complete_and_catches_up_when_back,
    a_key_the_node_refuses_fails_its_job_at_once_and_the_node_stays_up,
);

/// `n` single-file objects in one batch (a single-file batch manifest), for profile `p`.
async fn many_objects(
    w: &World,
    ingest: &Ingest,
    p: &str,
    n: usize,
) -> lading_core::layout::BatchId {
    let rows: Vec<Vec<String>> = (0..n)
        .map(|i| {
            let (url, _) = w.file(
                &format!("many/f{i}.txt"),
                format!("object {i}\n").as_bytes(),
            );
            vec![url, String::new()]
        })
        .collect();
    let text = lading_ingest::checkm::write(
        lading_ingest::checkm::ManifestKind::SingleFileBatch,
        &[
            lading_ingest::checkm::FILE_URL,
            lading_ingest::checkm::PRIMARY_ID,
        ],
        &rows,
    );
    let (url, _) = w.file("many.checkm", text.as_bytes());
    w.submit_as(ingest, p, "depositor", &url, "single-file-batch-manifest")
        .await
}

/// The world's ingest on `nodes`, with test-sized waits: probes at most a second apart, and
/// a waiting job not looked at again by itself for ten minutes (so only the prober's wake
/// can bring it back within a test's wait).
/// Waits until this process's prober has found storage node `name` down `n` times in a row.
async fn probed(ingest: &Ingest, name: &str, n: u32) {
    let what = format!("{n} failed probes of node {name}");
    lading_testkit::poll::until_true(&what, common::WAIT, async || {
        ingest
            .engine
            .deps()
            .list()
            .iter()
            .any(|h| h.kind == "storage-node" && h.name == name && !h.up && h.probes >= n)
    })
    .await;
}

fn weather_ingest(w: &World, nodes: Vec<NodeSettings>) -> Arc<Ingest> {
    let cfg = Config {
        storage_nodes: nodes,
        dependencies: lading_ingest::config::DependencySettings {
            probe_max_s: 1,
            max_wait_h: 72,
            recheck_s: 600,
            ..Default::default()
        },
        ..w.cfg.clone()
    };
    Ingest::try_new_env(w.engine.clone(), cfg, env).unwrap()
}

/// Jobs of `bid` and their statuses.
async fn statuses(
    w: &World,
    bid: &lading_core::layout::BatchId,
) -> Vec<lading_core::layout::JobStatus> {
    let mut out = Vec::new();
    for j in w.jobs_of(bid).await {
        out.push(w.engine.job(&j).await.unwrap().status);
    }
    out
}

/// SPEC §11: the primary node is SIGKILLed while a batch is being stored and kept down far
/// longer than the stage's whole attempt budget (two attempts, backoff under 200 ms). No job
/// fails and none uses an attempt; each shows the wait, naming the node and the cause in
/// plain words; once the node is back its prober wakes them (no job is looked at again by
/// itself within the test), every object completes, and each is on both nodes as one
/// version.
async fn a_primary_down_longer_than_every_attempt_costs_time_and_no_work(w: World) {
    let (mut a, b) = (Weed::start().unwrap(), Weed::start().unwrap());
    a.bucket("primary").unwrap();
    b.bucket("replica").unwrap();
    let nodes = vec![node(9501, &a, "primary"), node(9502, &b, "replica")];
    w.profile(
        "s3",
        "collection = \"demo\"\nstorage_nodes = [9501, 9502]\n[max_attempts]\nstoring = 2\n",
    );
    let ingest = weather_ingest(&w, nodes.clone());
    const N: usize = 24;
    // Down before the first job reaches Storing: every job of the batch meets the outage.
    a.kill();
    let bid = many_objects(&w, &ingest, "s3", N).await;
    let run = w.run_all(&ingest);
    let key = "storage-node-9501";
    lading_testkit::poll::until_true("every job waiting on node 9501", common::WAIT, async || {
        let h = ingest.engine.deps().list();
        h.iter()
            .any(|h| h.kind == "storage-node" && h.name == "9501" && !h.up && h.waiting == N as u64)
    })
    .await;
    assert!(ingest.engine.deps().is_down(key));
    // Down for longer than the attempt budget would last, many times over: the prober has
    // found it down again and again (each probe a second apart at most).
    probed(&ingest, "9501", 4).await;
    for st in statuses(&w, &bid).await {
        assert_eq!(st.status, lading_core::JobState::Storing, "{st:?}");
        assert_eq!(lading_engine::attempts(&st), 0, "no attempt used: {st:?}");
        let m = st.message.clone().unwrap_or_default();
        assert!(
            m.starts_with("waiting: storage node 9501 unavailable since ")
                && m.ends_with("connection refused"),
            "{m}"
        );
        assert!(!m.contains("http://"), "no address in a job's message: {m}");
        assert_eq!(
            st.extra.get("waiting_on").and_then(|v| v.as_str()),
            Some(key)
        );
    }
    // The health, as the API and `lading status` show it.
    let summary = w.engine.summary().await.unwrap();
    let down = &summary.dependencies_down;
    assert_eq!(down.len(), 1, "{down:?}");
    assert_eq!(down[0].label, "storage node 9501");
    assert_eq!(down[0].address, a.endpoint());
    let restarted = std::time::Instant::now();
    a.restart().unwrap();
    assert_eq!(w.batch_ends(&bid).await, BatchState::Completed);
    eprintln!(
        "every job completed {:.1} s after node 9501 was restarted",
        restarted.elapsed().as_secs_f64()
    );
    assert!(!ingest.engine.deps().is_down(key));
    let (primary, replica) = (
        Node::open(&nodes[0], env).unwrap(),
        Node::open(&nodes[1], env).unwrap(),
    );
    for job in w.jobs_of(&bid).await {
        let st = w.engine.job(&job).await.unwrap().status;
        assert!(
            st.extra
                .get("waited_ms")
                .and_then(|v| v.as_u64())
                .unwrap_or(0)
                > 0,
            "{st:?}"
        );
        let s = w.stored(&job).await;
        assert_eq!(primary.versions(&s.ark).await.unwrap(), [1]);
        lading_testkit::poll::until_true("the replica's copy", common::WAIT, async || {
            replica.versions(&s.ark).await.unwrap() == [1]
        })
        .await;
    }
    assert!(
        w.engine
            .summary()
            .await
            .unwrap()
            .dependencies_down
            .is_empty()
    );
    run.stop().await;
}

/// SPEC §11: with the replica down, versions complete on the primary; each replica copy
/// waits in the outbox without using its attempts and is made once the replica is back.
async fn a_replica_down_lets_versions_complete_and_catches_up_when_back(w: World) {
    let (a, mut b) = (Weed::start().unwrap(), Weed::start().unwrap());
    a.bucket("primary").unwrap();
    b.bucket("replica").unwrap();
    let nodes = vec![node(9501, &a, "primary"), node(9502, &b, "replica")];
    w.profile(
        "s3",
        "collection = \"demo\"\nstorage_nodes = [9501, 9502]\n",
    );
    let ingest = weather_ingest(&w, nodes.clone());
    b.kill();
    let bid = many_objects(&w, &ingest, "s3", 6).await;
    let run = w.run_all(&ingest);
    assert_eq!(w.batch_ends(&bid).await, BatchState::Completed);
    lading_testkit::poll::until_true("node 9502 seen down", common::WAIT, async || {
        ingest.engine.deps().is_down("storage-node-9502")
    })
    .await;
    // The outbox's replica copies wait, using no attempt (3 would make them dead), however
    // many times the prober finds the replica still down.
    probed(&ingest, "9502", 3).await;
    let entries = w.engine.outbox().await.unwrap();
    assert!(!entries.is_empty());
    for e in &entries {
        assert!(!e.entry.dead, "{e:?}");
        assert_eq!(e.entry.attempts, 0, "{e:?}");
    }
    b.restart().unwrap();
    let replica = Node::open(&nodes[1], env).unwrap();
    for job in w.jobs_of(&bid).await {
        let s = w.stored(&job).await;
        lading_testkit::poll::until_true("the replica's copy", common::WAIT, async || {
            replica.versions(&s.ark).await.unwrap_or_default() == [1]
        })
        .await;
    }
    run.stop().await;
}

/// SPEC §11: a 4xx about one key (a name too long for the node) is that job's error: it
/// fails at once, with the problem in plain words, and the node stays up for the others.
async fn a_key_the_node_refuses_fails_its_job_at_once_and_the_node_stays_up(w: World) {
    let a = Weed::start().unwrap();
    a.bucket("primary").unwrap();
    let nodes = vec![node(9501, &a, "primary")];
    w.profile(
        "s3",
        "collection = \"demo\"\nstorage_nodes = [9501]\n[max_attempts]\nstoring = 5\n",
    );
    let ingest = weather_ingest(&w, nodes);
    // Longer than S3's 1,024 bytes of key, in folders a file system takes.
    let long = format!("{}/x.txt", vec!["n".repeat(200); 6].join("/"));
    let m = w.object_manifest("long.checkm", &[(long.as_str(), b"too long a name")]);
    let bad = w
        .submit_as(&ingest, "s3", "depositor", &m, "manifest")
        .await;
    let good = many_objects(&w, &ingest, "s3", 2).await;
    let run = w.run_all(&ingest);
    assert_eq!(w.batch_ends(&good).await, BatchState::Completed);
    w.batch_ends(&bad).await;
    let st = statuses(&w, &bad).await.remove(0);
    assert_eq!(st.status, lading_core::JobState::Failed, "{st:?}");
    let m = st.message.clone().unwrap_or_default();
    assert!(m.contains("refused the file name (too long)"), "{m}");
    assert!(
        !m.contains("http://") && !m.contains("<Code>"),
        "no internals: {m}"
    );
    assert_eq!(
        st.extra.get("failed_attempts").and_then(|v| v.as_u64()),
        Some(1),
        "failed at once: {st:?}"
    );
    assert!(!ingest.engine.deps().is_down("storage-node-9501"));
    run.stop().await;
}
