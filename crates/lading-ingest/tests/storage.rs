//! Storage nodes against real SeaweedFS servers (two servers stand for two nodes): a batch
//! stored on a primary and a replica, read back key by key; the scheduled fixity audit
//! checking every copy; the fixity checker finding a corrupted replica copy and repairing it; a store interrupted half-way resuming without
//! sending a confirmed file again; the primary killed mid-batch; wrong credentials, a missing
//! bucket and an unknown node refused, named, with nothing left behind. On both stores. Outages: `storage_weather.rs`.

#[macro_use]
mod common;

use common::nodes::*;
use common::{Backend, World};
use lading_core::{BatchState, JobState};
use lading_ingest::nodes::{Node, NodeSettings, Place};
use lading_ingest::{Config, Ingest};
use lading_testkit::seaweed::{SECRET_KEY, Weed};
use std::sync::Arc;

on_both_backends!(
    a_batch_is_stored_on_a_primary_and_a_replica_and_fixity_repairs_a_bad_copy,
    an_interrupted_store_resumes_without_sending_confirmed_files_again,
    wrong_credentials_and_a_missing_bucket_fail_at_once_naming_the_node,
    the_primary_killed_mid_batch_and_started_again_leaves_every_object_complete,
);

/// The primary node's server is SIGKILLed while a batch of objects with multipart files is
/// being stored, and started again a second later: the stage's retries carry every object
/// to Completed, every file reads back right, and no multipart upload is left open.
async fn the_primary_killed_mid_batch_and_started_again_leaves_every_object_complete(w: World) {
    let mut a = Weed::start().unwrap();
    a.bucket("primary").unwrap();
    let nodes = vec![node(9501, &a, "primary")];
    w.profile(
        "s3",
        "collection = \"demo\"\nstorage_nodes = [9501]\n[max_attempts]\nstoring = 40\n",
    );
    let ingest = ingest_with(&w, nodes.clone()).unwrap();
    let big: Vec<u8> = (0..11 << 20).map(|i| (i * 13 % 241) as u8).collect();
    let mut bids = Vec::new();
    for i in 0..4 {
        let small = format!("object {i}\n");
        let m = w.object_manifest(
            &format!("o{i}.checkm"),
            &[("big.bin", &big), ("small.txt", small.as_bytes())],
        );
        bids.push(
            w.submit_as(&ingest, "s3", "depositor", &m, "manifest")
                .await,
        );
    }
    let run = w.run_all(&ingest);
    // Killed once the first object is on its way to the node.
    w.until("a job reaching Storing", || async {
        for b in &bids {
            for j in w.jobs_of(b).await {
                if w.engine.job(&j).await.unwrap().status.status == JobState::Storing {
                    return Some(());
                }
            }
        }
        None
    })
    .await;
    a.kill();
    // Down until the stage has found it so (past the client's own few quick retries): the
    // node is marked down, or a job's attempt failed on it; the stage carries them on.
    w.until("the killed node found down by the stage", || async {
        if w.engine.deps().list().iter().any(|h| !h.up) {
            return Some(());
        }
        for b in &bids {
            for j in w.jobs_of(b).await {
                let st = w.engine.job(&j).await.unwrap().status;
                if st.message.is_some_and(|m| !m.is_empty()) {
                    return Some(());
                }
            }
        }
        None
    })
    .await;
    a.restart().unwrap();
    let primary = Node::open(&nodes[0], env).unwrap();
    for b in &bids {
        let end = w.batch_ends(b).await;
        let job = w.jobs_of(b).await.remove(0);
        let st = w.engine.job(&job).await.unwrap().status;
        assert_eq!(end, BatchState::Completed, "{st:?}");
        let s = w.stored(&job).await;
        let c = primary
            .digest(&s.ark, s.version, "producer/big.bin", None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(c.sha256, sha256(&big));
    }
    assert_eq!(
        a.open_uploads("primary"),
        0,
        "no multipart upload left open"
    );
    // The kill was felt: some job at Storing waited on the node (an outage, not an attempt).
    let figures = ingest.stats.figures();
    let storing = figures
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("storing"))
        .map(|(_, f)| f.waits + f.transient)
        .unwrap_or(0);
    assert!(storing > 0, "no job at Storing felt the kill: {figures:?}");
    // The probe of open uploads sees one when there is one.
    if let Place::Bucket { store, .. } = &primary.place {
        let key = object_store::path::Path::parse("probe").unwrap();
        let id = store.create_multipart(&key).await.unwrap();
        assert_eq!(a.open_uploads("primary"), 1);
        store.abort_multipart(&key, &id).await.unwrap();
        // Uploads whose ids were never learned are found and aborted by the version's
        // sweep, and only the version's: v10's and another object's stay open.
        let ark = "ark:/99999/sweep&<1>";
        for (version, rel) in [(1, "producer/a"), (1, "producer/b/c"), (10, "producer/a")] {
            let k = primary.key(ark, version, rel).unwrap();
            let id = store.create_multipart(&k).await.unwrap();
            store
                .put_part(&k, &id, 0, vec![7u8; 1024].into())
                .await
                .unwrap();
        }
        let other = primary.key("ark:/99999/sweep", 1, "producer/a").unwrap();
        store.create_multipart(&other).await.unwrap();
        assert_eq!(a.open_uploads("primary"), 4);
        assert_eq!(primary.abort_open_uploads(ark, 1).await.unwrap(), 2);
        assert_eq!(
            a.open_uploads("primary"),
            2,
            "v10's and the other object's stay"
        );
        assert_eq!(primary.abort_open_uploads(ark, 10).await.unwrap(), 1);
        assert_eq!(
            primary
                .abort_open_uploads("ark:/99999/sweep", 1)
                .await
                .unwrap(),
            1
        );
        assert_eq!(a.open_uploads("primary"), 0);
        // The audit's sweep of abandoned uploads goes by the server's own date of each
        // (`Initiated`): one begun just now is left until it is older than asked, and an
        // upload outside the node's prefix is never touched.
        let k = primary
            .key("ark:/99999/abandoned", 3, "producer/x")
            .unwrap();
        store.create_multipart(&k).await.unwrap();
        let outside = object_store::path::Path::parse("elsewhere/x").unwrap();
        let outside_id = store.create_multipart(&outside).await.unwrap();
        let now = lading_core::time::Clock::now_ms(&lading_core::time::SystemClock);
        assert_eq!(
            primary
                .abort_abandoned_uploads(now - 3_600_000)
                .await
                .unwrap(),
            0,
            "begun less than an hour ago"
        );
        assert_eq!(a.open_uploads("primary"), 2, "both stay open");
        assert_eq!(
            primary.abort_abandoned_uploads(now + 60_000).await.unwrap(),
            1
        );
        assert_eq!(
            a.open_uploads("primary"),
            1,
            "the one outside the prefix stays"
        );
        store.abort_multipart(&outside, &outside_id).await.unwrap();
        assert_eq!(a.open_uploads("primary"), 0);
    }
    run.stop().await;
}

async fn a_batch_is_stored_on_a_primary_and_a_replica_and_fixity_repairs_a_bad_copy(w: World) {
    let (mut a, b) = (Weed::start().unwrap(), Weed::start().unwrap());
    a.bucket("primary").unwrap();
    b.bucket("replica").unwrap();
    let nodes = vec![node(9501, &a, "primary"), node(9502, &b, "replica")];
    w.profile(
        "s3",
        "collection = \"demo\"\nstorage_nodes = [9501, 9502]\n",
    );
    let ingest = ingest_with(&w, nodes.clone()).unwrap();
    // This process's `/metrics` counters before (the other backend's run of this test counts
    // in the same process, so only their growth is checked).
    let fixity_failures = || {
        lading_ingest::fixity::failures_by_node()
            .get(&9502)
            .copied()
            .unwrap_or(0)
    };
    let (replicated0, failures0) = (replicated_to_9502(), fixity_failures());
    let big: Vec<u8> = (0..12 << 20).map(|i| (i * 7 % 251) as u8).collect();
    let files: Vec<(&str, &[u8])> = vec![
        ("letter.txt", b"Dear node,\n"),
        ("sub/dir/data.bin", &[0u8, 1, 2, 3, 255]),
        ("large.bin", &big),
    ];
    let m = w.object_manifest("o.checkm", &files);
    let bid = w
        .submit_as(&ingest, "s3", "depositor", &m, "manifest")
        .await;
    let run = w.run_all(&ingest);
    let end = w.batch_ends(&bid).await;
    let job = w.jobs_of(&bid).await.remove(0);
    let st = w.engine.job(&job).await.unwrap().status;
    assert_eq!(end, BatchState::Completed, "{st:?}");
    let s = w.stored(&job).await;
    assert_eq!(s.node, Some(9501));
    assert_eq!(s.path, format!("s3://primary/lading/{}|1|", s.ark));
    let primary = Node::open(&nodes[0], env).unwrap();
    let replica = Node::open(&nodes[1], env).unwrap();
    on_both_nodes(&a, &primary, &replica, &s.ark, &files, replicated0).await;
    the_scheduled_audit_checks_every_copy(&w, &ingest, &s.ark, files.len()).await;
    // Every copy checks out.
    let audit = lading_ingest::fixity::check(&ingest, None, Some(&s.ark), None)
        .await
        .unwrap();
    assert!(audit.findings.is_empty(), "{:?}", audit.findings);
    let n_files = audit.checked / 2;
    assert!(n_files >= files.len(), "{audit:?}");
    // A replica copy goes bad: found, named, repaired from the primary.
    if let Place::Bucket { store, .. } = &replica.place {
        let key =
            object_store::path::Path::parse(format!("lading/{}|1|producer/letter.txt", s.ark))
                .unwrap();
        store
            .put(&key, b"Dear rot,\n".to_vec().into())
            .await
            .unwrap();
    }
    let audit = lading_ingest::fixity::check(&ingest, Some(9502), None, None)
        .await
        .unwrap();
    assert_eq!(audit.findings.len(), 1, "{:?}", audit.findings);
    assert!(
        fixity_failures() > failures0,
        "lading_fixity_failures_total{{node=9502}} counts the bad copy"
    );
    let f = &audit.findings[0];
    assert_eq!(
        (f.node, f.path.as_str(), f.status.as_str()),
        (9502, "producer/letter.txt", "bad")
    );
    assert_eq!(f.expected, sha256(b"Dear node,\n"));
    assert_eq!(f.found.as_deref(), Some(sha256(b"Dear rot,\n").as_str()));
    let fixed = lading_ingest::fixity::repair(&ingest, Some(9502), None)
        .await
        .unwrap();
    assert_eq!(fixed.findings[0].status, "repaired from node 9501");
    let again = lading_ingest::fixity::check(&ingest, None, None, None)
        .await
        .unwrap();
    assert!(again.findings.is_empty(), "{:?}", again.findings);
    // The inventory says when each copy was checked, on each node.
    let a2 = s.ark.clone();
    let copies = ingest
        .inventory
        .run(move |i| i.copies(None, Some(&a2)))
        .await
        .unwrap();
    assert!(copies.iter().any(|c| c.node == 9501) && copies.iter().any(|c| c.node == 9502));
    assert!(
        copies
            .iter()
            .all(|c| c.status == "ok" && c.checked.is_some())
    );
    run.stop().await;
    // The primary goes down: an access request is served from the replica.
    a.kill();
    let qid = w
        .engine
        .create_access(
            lading_core::layout::AccessQueue::Small,
            &serde_json::json!({"ark": s.ark, "version": 1}),
        )
        .await
        .unwrap();
    let (handle, stop) = lading_worker::Shutdown::new();
    let task = tokio::spawn(lading_ingest::access::run(
        ingest.clone(),
        lading_core::layout::AccessQueue::Small,
        stop,
    ));
    let st = w
        .until("the request to end", || async {
            let i = w
                .engine
                .access(lading_core::layout::AccessQueue::Small, &qid)
                .await
                .unwrap();
            matches!(
                i.status.status,
                lading_core::AccessState::Completed | lading_core::AccessState::Failed
            )
            .then_some(i.status)
        })
        .await;
    handle.stop();
    task.await.unwrap();
    assert_eq!(st.status, lading_core::AccessState::Completed, "{st:?}");
    let zip_path =
        lading_ingest::access::zip_path(&ingest.cfg, lading_core::layout::AccessQueue::Small, &qid);
    let mut zip = zip::ZipArchive::new(std::fs::File::open(zip_path).unwrap()).unwrap();
    for (name, bytes) in &files {
        let mut e = zip.by_name(&format!("producer/{name}")).unwrap();
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut got).unwrap();
        assert_eq!(&got, bytes, "{name} from the replica");
    }
}

async fn an_interrupted_store_resumes_without_sending_confirmed_files_again(w: World) {
    let a = Weed::start().unwrap();
    a.bucket("primary").unwrap();
    let nodes = vec![node(9501, &a, "primary")];
    w.profile("s3", "collection = \"demo\"\nstorage_nodes = [9501]\n");
    let ingest = ingest_with(&w, nodes.clone()).unwrap();
    // One file of 12 parts among small ones: the crash comes while its multipart upload is
    // open on the server. The crashed worker reaches the node through a proxy that holds the
    // first request of an upload under way (a part or the completion, whichever its client
    // sends first with the upload's id): the upload stays open, the other files go on.
    let weed_addr: std::net::SocketAddr =
        a.endpoint().trim_start_matches("http://").parse().unwrap();
    let proxy = lading_testkit::proxy::HoldingProxy::start(weed_addr, "uploadId=").unwrap();
    let held_nodes = vec![node_at(9501, proxy.endpoint(), "primary")];
    let bodies: Vec<(String, Vec<u8>)> = (0..60)
        .map(|i| {
            let size = if i == 30 { 60 << 20 } else { 256 << 10 };
            (format!("f{i:02}.bin"), vec![i as u8; size])
        })
        .collect();
    let files: Vec<(&str, &[u8])> = bodies
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    let m = w.object_manifest("o.checkm", &files);
    let bid = w
        .submit_as(&ingest, "s3", "depositor", &m, "manifest")
        .await;
    // A worker of its own session, which dies (every task aborted, its session closed, so
    // its leases go as a crashed process's do) once some files are confirmed.
    let crashed = Arc::new(lading_engine::Engine::new(
        w.other_session().await,
        lading_core::time::system_clock(),
        "crashed",
    ));
    crashed.init().await.unwrap();
    let first = Ingest::try_new_env(
        crashed.clone(),
        Config {
            storage_nodes: held_nodes,
            ..w.cfg.clone()
        },
        env,
    )
    .unwrap();
    let run = w.run_all(&first);
    let job = w
        .until("intake to make the job", || async {
            w.jobs_of(&bid).await.first().cloned()
        })
        .await;
    let progress = lading_core::layout::job_node(&job, "store-progress");
    // The proxy holds the upload, so what is waited for stays true once reached.
    let confirmed: Vec<String> = w
        .until(
            "some files confirmed, and a multipart upload open",
            || async {
                let n = w.engine.tree().get(&progress).await.unwrap()?;
                let v: serde_json::Value =
                    serde_json::from_slice(&n.data.unwrap_or_default()).ok()?;
                let c = v["confirmed"].as_array()?;
                (c.len() >= 8 && proxy.holding() && a.open_uploads("primary") > 0).then(|| {
                    c.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
            },
        )
        .await;
    run.abort().await;
    crashed.tree().close().await.unwrap();
    assert!(
        a.open_uploads("primary") > 0,
        "the crash left a multipart upload open"
    );
    let primary = Node::open(&nodes[0], env).unwrap();
    let s_ark = (w.engine.job(&job).await.unwrap().identifiers.primary_id).unwrap();
    let mut before = Vec::new();
    for rel in &confirmed {
        before.push(
            primary
                .head(&s_ark, 1, rel)
                .await
                .unwrap()
                .expect("confirmed"),
        );
    }
    assert!(
        confirmed.len() < 62,
        "interrupted before the end: {} confirmed",
        confirmed.len()
    );
    // A successor finishes; the files confirmed before are not sent again.
    let again = ingest_with(&w, nodes.clone()).unwrap();
    let run = w.run_all(&again);
    assert_eq!(w.batch_ends(&bid).await, BatchState::Completed);
    for (rel, old) in confirmed.iter().zip(&before) {
        let now = primary.head(&s_ark, 1, rel).await.unwrap().unwrap();
        assert_eq!(
            (&now.etag, now.modified_ms),
            (&old.etag, old.modified_ms),
            "{rel}"
        );
    }
    for (name, body) in &bodies {
        let c = primary
            .digest(&s_ark, 1, &format!("producer/{name}"), None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(c.sha256, sha256(body));
    }
    assert_eq!(a.open_uploads("primary"), 0);
    run.stop().await;
}

async fn wrong_credentials_and_a_missing_bucket_fail_at_once_naming_the_node(w: World) {
    let a = Weed::start().unwrap();
    a.bucket("primary").unwrap();
    let wrong = NodeSettings {
        secret_access_key_env: Some("WRONG_SECRET".into()),
        ..node(9601, &a, "primary")
    };
    let missing = node(9602, &a, "no-such-bucket");
    w.profile(
        "wrongkey",
        "collection = \"demo\"\nstorage_nodes = [9601]\n",
    );
    w.profile(
        "nobucket",
        "collection = \"demo\"\nstorage_nodes = [9602]\n",
    );
    let ingest = ingest_with(&w, vec![wrong, missing]).unwrap();
    let (m, _) = w.file("one.txt", b"one file");
    let b1 = w
        .submit_as(&ingest, "wrongkey", "depositor", &m, "file")
        .await;
    let b2 = w
        .submit_as(&ingest, "nobucket", "depositor", &m, "file")
        .await;
    let run = w.run_all(&ingest);
    for (bid, want) in [
        (&b1, "storage node 9601 (bucket primary)"),
        (&b2, "storage node 9602 (bucket no-such-bucket)"),
    ] {
        assert_eq!(w.batch_ends(bid).await, BatchState::Failed);
        let job = w.jobs_of(bid).await.remove(0);
        let st = w.engine.job(&job).await.unwrap().status;
        assert_eq!(st.status, JobState::Failed);
        assert_eq!(st.last_successful_status, Some(JobState::Processing));
        let msg = st.message.unwrap_or_default();
        assert!(msg.contains(want), "{msg}");
        // Fatal at once: one attempt, not the stage's three.
        let hist = w.engine.job(&job).await.unwrap();
        let tries = serde_json::to_string(&hist)
            .unwrap()
            .matches("\"Storing\"")
            .count();
        assert!(tries <= 3, "{tries}");
    }
    let msg = w
        .engine
        .job(&w.jobs_of(&b2).await.remove(0))
        .await
        .unwrap()
        .status
        .message
        .unwrap();
    assert!(msg.contains("does not exist"), "{msg}");
    // Nothing was left in the real bucket.
    let good = Node::open(&node(9601, &a, "primary"), env).unwrap();
    if let Place::Bucket { store, .. } = &good.place {
        let keys = store.keys(None).await.unwrap();
        assert!(keys.is_empty(), "{keys:?}");
    }
    run.stop().await;
}

/// One object, two profiles of its collection that store in different places: the second
/// would number its versions again from 1 on its node, so its job fails at Storing before
/// anything is written there, naming both places; the inventory keeps the one numbering, and
/// the first profile goes on adding versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_is_not_numbered_again_where_another_profile_stores() {
    let w = World::new().await;
    let folder = w.dir.path().join("node9701");
    let settings = NodeSettings::at(9701, &format!("file://{}", folder.display()));
    w.profile("rooted", "collection = \"demo\"\n");
    w.profile("noded", "collection = \"demo\"\nstorage_nodes = [9701]\n");
    let ingest = ingest_with(&w, vec![settings.clone()]).unwrap();
    let ark = "ark:/99999/fk4twoplaces";
    let submit = |profile: &'static str, url: String| {
        let ingest = ingest.clone();
        async move {
            lading_ingest::submit(
                &ingest,
                &lading_ingest::Submission {
                    profile: profile.into(),
                    submitter: "depositor".into(),
                    payload_url: url,
                    payload_type: "file".into(),
                    primary_id: Some(ark.into()),
                    ..Default::default()
                },
            )
            .await
            .unwrap()
        }
    };
    let run = w.run_all(&ingest);
    let first = submit("rooted", w.file("one.txt", b"version one").0).await;
    assert_eq!(w.batch_ends(&first).await, BatchState::Completed);
    let inventory = lading_ingest::inventory::Inventory::new(w.cfg.inventory());
    let before = inventory.versions(ark).unwrap();
    assert_eq!(before.len(), 1);

    let second = submit("noded", w.file("two.txt", b"version two").0).await;
    assert_eq!(w.batch_ends(&second).await, BatchState::Failed);
    let (_, msg) = w.failed_after(&second, JobState::Processing).await;
    assert!(
        msg.contains(&format!("{ark} v1 is stored on the storage root"))
            && msg.contains("stores on storage node 9701"),
        "{msg}"
    );
    // Nothing went to the node, and the inventory is as it was.
    let node = Node::open(&settings, env).unwrap();
    assert!(node.versions(ark).await.unwrap().is_empty());
    assert_eq!(inventory.versions(ark).unwrap(), before);

    // The profile that stores where the object lives adds its next version.
    let third = submit("rooted", w.file("three.txt", b"version three").0).await;
    assert_eq!(w.batch_ends(&third).await, BatchState::Completed);
    assert_eq!(
        inventory
            .versions(ark)
            .unwrap()
            .iter()
            .map(|v| v.0)
            .collect::<Vec<_>>(),
        vec![1, 2]
    );
    run.stop().await;
}

/// A profile naming a node the config lacks: the service does not start, and a profile added
/// later is refused at submission, naming the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_naming_an_unknown_node_is_refused_at_start_and_at_submission() {
    let w = World::new().await;
    w.profile("lost", "collection = \"demo\"\nstorage_nodes = [4242]\n");
    let err = ingest_with(&w, vec![]).err().expect("refused at start");
    assert!(
        err.contains("storage node 4242") && err.contains("profile lost"),
        "{err}"
    );
    std::fs::remove_file(w.cfg.profiles_dir().join("lost.toml")).unwrap();
    let ingest = ingest_with(&w, vec![]).unwrap();
    w.profile("lost", "collection = \"demo\"\nstorage_nodes = [4242]\n");
    let (m, _) = w.file("one.txt", b"one file");
    let sub = lading_ingest::Submission {
        profile: "lost".into(),
        submitter: "depositor".into(),
        payload_url: m,
        payload_type: "file".into(),
        ..Default::default()
    };
    let err = lading_ingest::submit(&ingest, &sub).await.unwrap_err();
    assert!(err.to_string().contains("storage node 4242"), "{err}");
    assert!(
        w.engine.batch_ids().await.unwrap().is_empty(),
        "no batch was made"
    );
}

/// A store URL that is neither `s3://` nor `file://`, a bucket name too short, a missing
/// credential variable and a part size below S3's smallest are named when a node opens.
#[test]
fn bad_node_settings_are_named() {
    let base = NodeSettings {
        id: 7,
        url: "s3://bucket".into(),
        endpoint: Some("http://127.0.0.1:1".into()),
        region: None,
        access_key_id_env: None,
        secret_access_key_env: None,
        part_size: None,
        checksum: None,
    };
    let err =
        |s: NodeSettings, e: &dyn Fn(&str) -> Option<String>| Node::open(&s, e).err().unwrap();
    let none = |_: &str| None;
    assert!(
        err(
            NodeSettings {
                url: "ftp://x/y".into(),
                ..base.clone()
            },
            &env
        )
        .contains("not s3:// or file://")
    );
    assert!(
        err(
            NodeSettings {
                url: "s3://ab".into(),
                ..base.clone()
            },
            &env
        )
        .contains("names no bucket")
    );
    assert!(err(base.clone(), &none).contains("AWS_ACCESS_KEY_ID is not set"));
    assert!(
        err(
            NodeSettings {
                part_size: Some(1 << 20),
                ..base.clone()
            },
            &env
        )
        .contains("part_size")
    );
    let shown = format!("{:?}", Node::open(&base, env).unwrap());
    assert!(
        !shown.contains(SECRET_KEY),
        "the secret is not in the node's Debug form"
    );
}

/// One conformance suite, run against a folder node and a bucket node alike: writes only
/// where absent, the same bytes again accepted, other bytes refused (and the copy intact),
/// versions known by their records, reads, repairs.
async fn node_conformance(n: &Node) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::write(&a, b"the first bytes\n").unwrap();
    std::fs::write(&b, b"other bytes\n").unwrap();
    let ark = "ark:/13030/m5k695dk";
    let rel = "producer/dir/a file.txt";
    let mut none =
        |_: Option<String>| Box::pin(async { Ok(()) }) as lading_ingest::nodes::UploadNote<'static>;
    assert!(n.versions(ark).await.unwrap().is_empty());
    assert!(n.head(ark, 1, rel).await.unwrap().is_none());
    assert!(n.digest(ark, 1, rel, None).await.unwrap().is_none());
    let (c, already) = n.put_new(ark, 1, rel, &a, &mut none).await.unwrap();
    assert!(!already);
    assert_eq!(
        (c.size, c.sha256.clone()),
        (16, sha256(b"the first bytes\n"))
    );
    assert_eq!(n.head(ark, 1, rel).await.unwrap().unwrap().size, 16);
    // The same bytes again: counted as written, nothing rewritten.
    let (_, already) = n.put_new(ark, 1, rel, &a, &mut none).await.unwrap();
    assert!(already);
    // Other bytes: refused, fatal, named; the copy is intact.
    let e = n.put_new(ark, 1, rel, &b, &mut none).await.unwrap_err();
    assert!(
        e.fatal && e.what.contains("already holds other bytes"),
        "{}",
        e.what
    );
    assert!(
        e.what.contains(&format!("storage node {}", n.id)),
        "{}",
        e.what
    );
    assert_eq!(n.digest(ark, 1, rel, None).await.unwrap().unwrap(), c);
    // A version exists once its record does.
    assert!(n.versions(ark).await.unwrap().is_empty());
    let rec = dir.path().join("rec.json");
    std::fs::write(&rec, br#"{"ark":"ark:/13030/m5k695dk","version":1}"#).unwrap();
    n.put_new(
        ark,
        1,
        lading_ingest::nodes::VERSION_RECORD,
        &rec,
        &mut none,
    )
    .await
    .unwrap();
    assert_eq!(n.versions(ark).await.unwrap(), vec![1]);
    assert_eq!(
        n.read_small(ark, 1, lading_ingest::nodes::VERSION_RECORD)
            .await
            .unwrap()
            .unwrap(),
        std::fs::read(&rec).unwrap()
    );
    // Read back whole.
    let mut out = Vec::new();
    assert!(n.read_into(ark, 1, rel, &mut out).await.unwrap());
    assert_eq!(out, b"the first bytes\n");
    // A repair writes over the copy, and reads it back.
    let fixed = n.replace(ark, 1, rel, &b).await.unwrap().unwrap();
    assert_eq!(fixed.sha256, sha256(b"other bytes\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_node_and_a_bucket_node_pass_one_conformance_suite() {
    let folder = tempfile::tempdir().unwrap();
    let f = Node::open(
        &NodeSettings::at(9100, &format!("file://{}", folder.path().display())),
        env,
    )
    .unwrap();
    node_conformance(&f).await;
    let w = Weed::start().unwrap();
    w.bucket("conformance").unwrap();
    node_conformance(&Node::open(&node(9200, &w, "conformance"), env).unwrap()).await;
}

/// The simulator's bucket in memory answers as the real one does (the same suite), and
/// keeps its open uploads listed for the version's sweep; its faults fail a request before
/// it takes effect, or after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bucket_in_memory_passes_the_same_conformance_suite_and_fails_as_told() {
    use lading_ingest::bucket::{Bucket, Fault, Memory};
    let calm = Arc::new(Memory::new(Arc::new(|_: &str, _: &str| Fault::None)));
    let n = Node::in_bucket(9300, "memory", "lading/", calm.clone());
    node_conformance(&n).await;
    // A large file goes up in parts; an upload left open is found and aborted.
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.bin");
    let bytes: Vec<u8> = (0..(11u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(&big, &bytes).unwrap();
    let mut none =
        |_: Option<String>| Box::pin(async { Ok(()) }) as lading_ingest::nodes::UploadNote<'static>;
    let (c, _) = n
        .put_new("ark:/1/big", 1, "producer/big.bin", &big, &mut none)
        .await
        .unwrap();
    assert_eq!(
        (c.size, c.sha256.clone()),
        (bytes.len() as u64, sha256(&bytes))
    );
    assert_eq!(
        n.digest("ark:/1/big", 1, "producer/big.bin", None)
            .await
            .unwrap(),
        Some(c)
    );
    let key = n.key("ark:/1/big", 2, "producer/left.bin").unwrap();
    let other = n.key("ark:/1/big", 3, "producer/kept.bin").unwrap();
    calm.create_multipart(&key).await.unwrap();
    let kept = calm.create_multipart(&other).await.unwrap();
    assert_eq!(n.abort_open_uploads("ark:/1/big", 2).await.unwrap(), 1);
    assert_eq!(n.abort_open_uploads("ark:/1/big", 2).await.unwrap(), 0);
    calm.abort_multipart(&other, &kept).await.unwrap();
    // Refused: nothing written. Answer lost: written, and an error all the same.
    let a = dir.path().join("a");
    std::fs::write(&a, b"a file\n").unwrap();
    for (fault, written) in [(Fault::Refused, false), (Fault::AnswerLost, true)] {
        let f = fault.clone();
        let bucket = Arc::new(Memory::new(Arc::new(move |op: &str, _: &str| {
            if op == "PUT" { f.clone() } else { Fault::None }
        })));
        let n = Node::in_bucket(9301, "faulty", "", bucket);
        let e = n
            .put_new("ark:/1/f", 1, "producer/a", &a, &mut none)
            .await
            .unwrap_err();
        assert!(
            !e.fatal && e.what.contains("storage node 9301"),
            "{}",
            e.what
        );
        assert_eq!(
            n.head("ark:/1/f", 1, "producer/a").await.unwrap().is_some(),
            written,
            "{fault:?}"
        );
    }
}
