//! Storage nodes for the tests: a SeaweedFS bucket as a node, its credentials, an ingest
//! configured with nodes.

use super::World;
use lading_ingest::nodes::{Node, NodeSettings, Place};
use lading_ingest::{Config, Ingest};
use lading_testkit::seaweed::{ACCESS_KEY, SECRET_KEY, Weed};
use sha2::Digest;
use std::sync::Arc;

pub fn env(k: &str) -> Option<String> {
    match k {
        "AWS_ACCESS_KEY_ID" => Some(ACCESS_KEY.into()),
        "AWS_SECRET_ACCESS_KEY" => Some(SECRET_KEY.into()),
        "WRONG_SECRET" => Some("not-the-secret".into()),
        _ => None,
    }
}

pub fn node(id: u32, weed: &Weed, bucket: &str) -> NodeSettings {
    node_at(id, weed.endpoint(), bucket)
}

/// Node `id` on bucket `bucket` of the S3 server at `endpoint`, with test-sized parts.
pub fn node_at(id: u32, endpoint: String, bucket: &str) -> NodeSettings {
    NodeSettings {
        id,
        url: format!("s3://{bucket}/lading"),
        endpoint: Some(endpoint),
        region: None,
        access_key_id_env: None,
        secret_access_key_env: None,
        part_size: Some(5 << 20),
        checksum: None,
    }
}

pub fn sha256(b: &[u8]) -> String {
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// The world's ingest with `nodes` configured and credentials from [`env`].
pub fn ingest_with(w: &World, nodes: Vec<NodeSettings>) -> Result<Arc<Ingest>, String> {
    let cfg = Config {
        storage_nodes: nodes,
        // The scheduled audit's schedule ticks each second (where a test runs it).
        fixity: lading_ingest::config::FixitySettings {
            audit_every_s: 1,
            ..w.cfg.fixity.clone()
        },
        ..w.cfg.clone()
    };
    Ingest::try_new_env(w.engine.clone(), cfg, env)
}

/// Versions this process copied to node 9502 (what `/metrics` counts).
pub fn replicated_to_9502() -> u64 {
    lading_ingest::replicate::copies_by_node()
        .get(&9502)
        .map_or(0, |c| c.0)
}

/// The version of `ark` is on the primary key by key, under Merritt's keys, and on the
/// replica through the outbox (counted in `/metrics`), with no multipart upload left open.
pub async fn on_both_nodes(
    a: &Weed,
    primary: &Node,
    replica: &Node,
    ark: &str,
    files: &[(&str, &[u8])],
    replicated0: u64,
) {
    // Key by key on the primary, under Merritt's keys.
    for (name, bytes) in files {
        let c = primary
            .digest(ark, 1, &format!("producer/{name}"), None)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name} on the primary"));
        assert_eq!((c.size, c.sha256), (bytes.len() as u64, sha256(bytes)));
    }
    if let Place::Bucket { store, .. } = &primary.place {
        let key = object_store::path::Path::parse(format!("lading/{}|1|producer/letter.txt", ark))
            .unwrap();
        assert_eq!(
            store.get(&key).await.unwrap().bytes().await.unwrap(),
            &b"Dear node,\n"[..]
        );
    }
    assert!(
        primary
            .head(ark, 1, "system/lading-version.json")
            .await
            .unwrap()
            .is_some()
    );
    // The replica follows through the outbox.
    lading_testkit::poll::until_true("the replica's version record", super::WAIT, async || {
        replica
            .head(ark, 1, "system/lading-version.json")
            .await
            .unwrap()
            .is_some()
    })
    .await;
    lading_testkit::poll::until_true(
        "lading_replica_versions_total{node=9502,outcome=stored} to count it",
        super::WAIT,
        async || replicated_to_9502() > replicated0,
    )
    .await;
    for (name, bytes) in files {
        let c = replica
            .digest(ark, 1, &format!("producer/{name}"), None)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name} on the replica"));
        assert_eq!(c.sha256, sha256(bytes));
    }
    assert_eq!(
        a.open_uploads("primary"),
        0,
        "no multipart upload left open"
    );
}

/// The scheduled audit, as a node runs it beside the activity monitor (its schedule ticking
/// every second here): it sets up its schedule, takes each job the monitor adds, and
/// records every copy of `ark` (`n_files` files on two nodes) checked and good.
pub async fn the_scheduled_audit_checks_every_copy(
    w: &World,
    ingest: &Arc<Ingest>,
    ark: &str,
    n_files: usize,
) {
    let jobs = Arc::new(lading_jobs::Jobs::new(
        w.engine.tree().clone(),
        w.engine.clock().clone(),
        "audit-test",
    ));
    let (audit_stop, sd) = lading_worker::Shutdown::new();
    let audit_task = tokio::spawn(lading_ingest::fixity::run_audit(
        ingest.clone(),
        jobs.clone(),
        sd,
    ));
    let (monitor_stop, sd) = lading_worker::Shutdown::new();
    let monitor_task = {
        let j = jobs.clone();
        tokio::spawn(async move { j.run_monitor(sd).await })
    };
    // Every copy was checked when it was recorded; made to look checked long ago, each is
    // due for the audit.
    let long_ago = lading_core::time::format_ts(0);
    let lading_ingest::config::Location::Sqlite(db) = ingest.inventory.location() else {
        panic!("the test's inventory is a SQLite file")
    };
    let due = rusqlite::Connection::open(db)
        .unwrap()
        .execute("UPDATE copies SET checked = ?1", [&long_ago])
        .unwrap();
    assert!(due >= 2 * n_files, "{due} copies made due");
    let a1 = ark.to_string();
    lading_testkit::poll::until_true(
        "the scheduled audit to check every copy",
        super::WAIT,
        async || {
            let a = a1.clone();
            let copies = ingest
                .inventory
                .run(move |i| i.copies(None, Some(&a)))
                .await
                .unwrap();
            copies.len() >= 2 * n_files
                && copies
                    .iter()
                    .all(|c| c.status == "ok" && c.checked.as_ref() != Some(&long_ago))
        },
    )
    .await;
    let schedules = jobs
        .schedules(lading_ingest::fixity::AUDIT_TYPE)
        .await
        .unwrap();
    assert_eq!(schedules.len(), 1, "{schedules:?}");
    assert_eq!(
        (schedules[0].0.as_str(), schedules[0].1.every_s),
        (lading_ingest::fixity::AUDIT_SCHEDULE, Some(1)),
        "the schedule has the configured period"
    );
    audit_stop.stop();
    monitor_stop.stop();
    audit_task.await.unwrap();
    monitor_task.await.unwrap();
}
