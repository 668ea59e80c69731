//! The backend conformance suite: one set of tests, generic over the backend, covering the
//! tree contract and every engine guarantee of SPEC §3. A behaviour not tested here is not
//! guaranteed. A backend runs it with
//! `lading_store_tests::conformance_tests!(my_harness_constructor);` in one of its test files.
//!
//! Tests wait on the engine and the tree, never on sleeps; the only timeouts are upper bounds
//! that turn a hang into a failure.

mod generic;
pub use generic::*;

use lading_core::layout::*;
use lading_core::time::system_clock;
use lading_core::{
    BatchState, BoxFuture, CreateMode, Event, JobState, Op, OpResult, Tree, TreeError, WatchKind,
};
use lading_engine::{Engine, EngineError, JobSpec};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// One open session, plus a way to make it lapse.
pub struct Session {
    pub tree: Arc<dyn Tree>,
    /// Makes the session expire as if its process stalled past the timeout, and lets the
    /// store notice (its ephemeral nodes are gone when this returns).
    pub expire: Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>,
}

/// A fresh, empty store of one backend kind.
pub trait Harness: Send + Sync + 'static {
    /// Opens a new session on this store.
    fn open(&self) -> BoxFuture<'_, Session>;
}

/// Upper bound on any single wait in the suite; a hang fails instead of blocking CI.
pub const WAIT: Duration = Duration::from_secs(30);

pub async fn engine(h: &dyn Harness, owner: &str) -> (Arc<Engine>, Session) {
    let s = h.open().await;
    let e = Arc::new(Engine::new(s.tree.clone(), system_clock(), owner));
    e.init().await.expect("init");
    (e, s)
}

/// A Pending batch with `n` jobs, moved to Processing (what batch intake does).
pub async fn batch_with_jobs(e: &Engine, n: usize, priorities: &[u8]) -> (BatchId, Vec<JobId>) {
    let mut sub = Map::new();
    sub.insert("profile_name".into(), json!("demo_profile"));
    sub.insert("submitter".into(), json!("tester"));
    sub.insert(
        "payload_url".into(),
        json!("http://127.0.0.1/manifest.checkm"),
    );
    let bid = e.create_batch(sub).await.expect("create batch");
    let lease = e
        .acquire_batch(BatchState::Pending)
        .await
        .expect("acquire")
        .expect("a pending batch");
    assert_eq!(lease.batch, bid);
    let mut jobs = Vec::new();
    for i in 0..n {
        let mut cfg = Map::new();
        cfg.insert("profile_name".into(), json!("demo_profile"));
        cfg.insert("local_id".into(), json!([format!("loc{i:03}")]));
        let spec = JobSpec {
            configuration: cfg,
            priority: priorities.get(i).copied(),
            ..Default::default()
        };
        jobs.push(e.create_job(&lease, spec).await.expect("create job"));
    }
    e.batch_transition(lease, Event::To(BatchState::Processing), None)
        .await
        .expect("to processing");
    (bid, jobs)
}

/// Drives one job from Pending through every stage to Completed, one lease per stage, as
/// independent stage workers would.
pub async fn run_job_to_completion(e: &Engine, state: JobState) -> Option<JobId> {
    let lease = e.acquire_job(state).await.expect("acquire")?;
    let id = lease.job.clone();
    let mut state = if state == JobState::Pending {
        e.job_transition(lease, Event::To(JobState::Estimating), None)
            .await
            .expect("start")
            .status
    } else {
        e.job_transition(lease, Event::Success, None)
            .await
            .expect("advance")
            .status
    };
    while state != JobState::Completed {
        let lease = e
            .acquire_job(state)
            .await
            .expect("acquire")
            .expect("job waiting in its next state");
        assert_eq!(lease.job, id);
        state = e
            .job_transition(lease, Event::Success, None)
            .await
            .expect("advance")
            .status;
    }
    Some(id)
}

/// A dump with the volatile parts (times, uuids, lock owners) replaced by placeholders.
pub async fn normalised_dump(tree: &dyn Tree) -> BTreeMap<String, Value> {
    let mut d = lading_engine::dump(tree, "/").await.expect("dump");
    for (path, v) in d.iter_mut() {
        if let Value::Object(m) = v {
            for k in ["last_modified", "submissionDate", "acquired"] {
                if m.contains_key(k) {
                    m.insert(k.into(), json!("<time>"));
                }
            }
            if m.contains_key("batchID") {
                m.insert("batchID".into(), json!("<uuid>"));
            }
            if m.contains_key("session") {
                m.insert("session".into(), json!("<session>"));
            }
        }
        let _ = path;
    }
    let uuids: Vec<String> = d
        .keys()
        .filter(|k| k.starts_with("/batch-uuids/"))
        .cloned()
        .collect();
    for k in uuids {
        let v = d.remove(&k).unwrap_or(Value::Null);
        d.insert("/batch-uuids/<uuid>".into(), v);
    }
    renumber_ids(d)
}

/// Sequential ids are the server's to choose (ZooKeeper numbers a child by its parent's change
/// count, so `/jobs/states` existing makes the first job `jid0000000001`). Renames the k-th
/// smallest id of each prefix to number k, keeping everything else byte for byte.
fn renumber_ids(d: BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    fn ids(s: &str, out: &mut std::collections::BTreeSet<String>) {
        for prefix in ["bid", "jid", "qid"] {
            let mut from = 0;
            while let Some(i) = s[from..].find(prefix) {
                let start = from + i;
                let digits = &s[start + 3..];
                if digits.len() >= 10 && digits.as_bytes()[..10].iter().all(u8::is_ascii_digit) {
                    out.insert(s[start..start + 13].to_string());
                }
                from = start + 3;
            }
        }
    }
    let mut found = std::collections::BTreeSet::new();
    for (k, v) in &d {
        ids(k, &mut found);
        ids(&v.to_string(), &mut found);
    }
    let mut rename = BTreeMap::new();
    let mut counters: BTreeMap<String, usize> = BTreeMap::new();
    for id in found {
        let n = counters.entry(id[..3].to_string()).or_default();
        rename.insert(id.clone(), format!("{}{:010}", &id[..3], n));
        *n += 1;
    }
    let fix = |s: &str| {
        let mut out = s.to_string();
        // Renaming goes through placeholders so that one rename never feeds another.
        for (i, old) in rename.keys().enumerate() {
            out = out.replace(old.as_str(), &format!("<id{i}>"));
        }
        for (i, new) in rename.values().enumerate() {
            out = out.replace(&format!("<id{i}>"), new);
        }
        out
    };
    d.into_iter()
        .map(|(k, v)| {
            let v: Value = serde_json::from_str(&fix(&v.to_string())).unwrap_or(v);
            (fix(&k), v)
        })
        .collect()
}

fn bytes(s: &str) -> Option<Vec<u8>> {
    Some(s.as_bytes().to_vec())
}

// ===== the tree contract =====================================================================

pub async fn tree_nodes_have_versions_and_sorted_children(h: &dyn Harness) {
    let s = h.open().await;
    let t = &s.tree;
    t.create("/t", None, CreateMode::Persistent).await.unwrap();
    t.create("/t/b", bytes("2"), CreateMode::Persistent)
        .await
        .unwrap();
    t.create("/t/a", bytes("1"), CreateMode::Persistent)
        .await
        .unwrap();
    assert_eq!(t.children("/t").await.unwrap(), vec!["a", "b"]);
    let n = t.get("/t/a").await.unwrap().unwrap();
    assert_eq!((n.data.as_deref(), n.stat.version), (Some(&b"1"[..]), 0));
    assert_eq!(
        t.get("/t").await.unwrap().unwrap().data,
        None,
        "empty nodes carry no data"
    );
    let st = t.set("/t/a", bytes("x"), Some(0)).await.unwrap();
    assert_eq!(st.version, 1);
    assert!(matches!(
        t.set("/t/a", bytes("y"), Some(0)).await,
        Err(TreeError::BadVersion {
            expected: 0,
            actual: 1,
            ..
        })
    ));
    assert_eq!(
        t.get("/t/a").await.unwrap().unwrap().data.as_deref(),
        Some(&b"x"[..]),
        "a refused set changes nothing"
    );
    assert!(matches!(
        t.create("/t/a", None, CreateMode::Persistent).await,
        Err(TreeError::NodeExists(_))
    ));
    assert!(
        matches!(t.create("/nope/x", None, CreateMode::Persistent).await, Err(TreeError::NoNode(p)) if p == "/nope")
    );
    assert!(matches!(
        t.delete("/t", None).await,
        Err(TreeError::NotEmpty(_))
    ));
    assert!(matches!(
        t.delete("/t/a", Some(0)).await,
        Err(TreeError::BadVersion { .. })
    ));
    t.delete("/t/a", Some(1)).await.unwrap();
    assert!(t.get("/t/a").await.unwrap().is_none());
    assert!(matches!(
        t.children("/missing").await,
        Err(TreeError::NoNode(_))
    ));
    assert!(matches!(
        t.get("relative").await,
        Err(TreeError::InvalidPath(..))
    ));
}

pub async fn tree_sequential_names_have_ten_digits_and_increase(h: &dyn Harness) {
    let s = h.open().await;
    let t = &s.tree;
    t.create("/seq", None, CreateMode::Persistent)
        .await
        .unwrap();
    let a = t
        .create("/seq/item", None, CreateMode::PersistentSequential)
        .await
        .unwrap();
    let b = t
        .create("/seq/item", None, CreateMode::PersistentSequential)
        .await
        .unwrap();
    assert_eq!(a.len(), "/seq/item".len() + 10, "{a}");
    assert!(a["/seq/item".len()..].bytes().all(|c| c.is_ascii_digit()));
    assert!(b > a);
}

pub async fn tree_children_page_reads_the_head_in_order(h: &dyn Harness) {
    let s = h.open().await;
    let t = &s.tree;
    t.create("/p", None, CreateMode::Persistent).await.unwrap();
    let ops: Vec<Op> = (0..50)
        .rev()
        .map(|i| Op::create(format!("/p/{i:03}"), None))
        .collect();
    t.multi(ops).await.unwrap();
    assert_eq!(
        t.children_page("/p", None, 3).await.unwrap(),
        vec!["000", "001", "002"]
    );
    assert_eq!(
        t.children_page("/p", Some("002"), 2).await.unwrap(),
        vec!["003", "004"]
    );
    assert!(
        t.children_page("/p", Some("049"), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(t.count_children("/p").await.unwrap(), 50);
}

pub async fn multi_is_all_or_nothing(h: &dyn Harness) {
    let s = h.open().await;
    let t = &s.tree;
    t.create("/m", bytes("v0"), CreateMode::Persistent)
        .await
        .unwrap();
    let err = t
        .multi(vec![
            Op::create("/m/new", None),
            Op::set("/m", bytes("v1"), Some(0)),
            Op::check("/m", Some(0)), // fails: the set above moved it to 1
            Op::create("/m/never", None),
        ])
        .await
        .unwrap_err();
    assert_eq!(err.failed_op(), Some(2));
    assert!(matches!(err.root(), TreeError::BadVersion { .. }));
    assert!(
        t.get("/m/new").await.unwrap().is_none(),
        "nothing of a failed multi is applied"
    );
    let m = t.get("/m").await.unwrap().unwrap();
    assert_eq!((m.data.as_deref(), m.stat.version), (Some(&b"v0"[..]), 0));
    let ok = t
        .multi(vec![
            Op::create("/m/a", None),
            Op::create("/m/a/b", bytes("x")),
            Op::delete("/m/a/b", None),
        ])
        .await
        .unwrap();
    assert_eq!(
        ok,
        vec![
            OpResult::Create("/m/a".into()),
            OpResult::Create("/m/a/b".into()),
            OpResult::Delete
        ]
    );
}

pub async fn ephemeral_nodes_end_with_their_session(h: &dyn Harness) {
    let a = h.open().await;
    let b = h.open().await;
    a.tree
        .create("/e", None, CreateMode::Persistent)
        .await
        .unwrap();
    a.tree
        .create("/e/mine", bytes("a"), CreateMode::Ephemeral)
        .await
        .unwrap();
    a.tree
        .create("/e/closing", None, CreateMode::Ephemeral)
        .await
        .unwrap();
    let st = b.tree.exists("/e/mine").await.unwrap().unwrap();
    assert_eq!(st.ephemeral_owner, a.tree.session_id());
    assert!(matches!(
        a.tree
            .create("/e/mine/child", None, CreateMode::Persistent)
            .await,
        Err(TreeError::NoChildrenForEphemerals(_))
    ));
    (a.expire)().await;
    assert!(
        b.tree.get("/e/mine").await.unwrap().is_none(),
        "an expired session's ephemerals are removed"
    );
    assert_ne!(a.tree.session_id(), 0);
    // A closed session's ephemerals go at once.
    let c = h.open().await;
    c.tree
        .create("/e/c", None, CreateMode::Ephemeral)
        .await
        .unwrap();
    c.tree.close().await.unwrap();
    assert!(b.tree.get("/e/c").await.unwrap().is_none());
}

pub async fn watches_fire_on_changes(h: &dyn Harness) {
    let a = h.open().await;
    let b = h.open().await;
    a.tree
        .create("/w", None, CreateMode::Persistent)
        .await
        .unwrap();
    let child_watch = a.tree.watch("/w", WatchKind::Children).await.unwrap();
    let data_watch = a.tree.watch("/w", WatchKind::Data).await.unwrap();
    b.tree
        .create("/w/x", None, CreateMode::Persistent)
        .await
        .unwrap();
    tokio::time::timeout(WAIT, child_watch)
        .await
        .expect("child watch fired");
    b.tree.set("/w", bytes("d"), None).await.unwrap();
    tokio::time::timeout(WAIT, data_watch)
        .await
        .expect("data watch fired");
}

// ===== the engine ===========================================================================

pub async fn job_walks_the_pipeline_and_the_tree_matches_the_layout(h: &dyn Harness) {
    let (e, s) = engine(h, "golden").await;
    let (bid, jobs) = batch_with_jobs(&e, 2, &[]).await;
    assert_eq!(jobs.len(), 2);
    assert_eq!(
        run_job_to_completion(&e, JobState::Pending).await,
        Some(jobs[0].clone())
    );
    // Second job fails in Downloading.
    let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    e.job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    for st in [JobState::Estimating, JobState::Provisioning] {
        let l = e.acquire_job(st).await.unwrap().unwrap();
        e.job_transition(l, Event::Success, None).await.unwrap();
    }
    let l = e.acquire_job(JobState::Downloading).await.unwrap().unwrap();
    let failed = e
        .job_transition(l, Event::Fail, Some("digest mismatch".into()))
        .await
        .unwrap();
    assert_eq!(failed.last_successful_status, Some(JobState::Provisioning));
    assert_eq!(
        e.batch(&bid).await.unwrap().status.status,
        BatchState::Reporting
    );

    let got = normalised_dump(s.tree.as_ref()).await;
    let mut expected: BTreeMap<String, Value> =
        serde_json::from_str(GOLDEN).expect("golden parses");
    // Empty folders of every job state exist; add them rather than listing all twelve.
    for st in JobState::ALL {
        expected.entry(job_state_folder(*st)).or_insert(Value::Null);
    }
    let diff: Vec<String> = got
        .keys()
        .chain(expected.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|k| got.get(*k) != expected.get(*k))
        .map(|k| format!("{k}: got {:?}, expected {:?}", got.get(k), expected.get(k)))
        .collect();
    assert!(
        diff.is_empty(),
        "tree differs from the golden layout:\n{}",
        diff.join("\n")
    );
}

/// What one step changed in the tree: `+path` added, `-path` removed, `~path` rewritten, each
/// with its (normalised) data.
fn step_diff(
    before: &BTreeMap<String, Value>,
    after: &BTreeMap<String, Value>,
) -> BTreeMap<String, Value> {
    let mut d = BTreeMap::new();
    for (k, v) in after {
        match before.get(k) {
            None => {
                d.insert(format!("+{k}"), v.clone());
            }
            Some(old) if old != v => {
                d.insert(format!("~{k}"), v.clone());
            }
            _ => {}
        }
    }
    for k in before.keys() {
        if !after.contains_key(k) {
            d.insert(format!("-{k}"), Value::Null);
        }
    }
    d
}

/// Compares what changed since `prev` with `expected`, then moves `prev` on.
async fn check_step(
    tree: &dyn Tree,
    prev: &mut BTreeMap<String, Value>,
    label: &str,
    expected: Value,
) {
    let now = normalised_dump(tree).await;
    let got = step_diff(prev, &now);
    let want: BTreeMap<String, Value> = serde_json::from_value(expected).expect("expected diff");
    assert_eq!(
        serde_json::to_string_pretty(&got).unwrap(),
        serde_json::to_string_pretty(&want).unwrap(),
        "step {label}"
    );
    *prev = now;
}

/// Merritt's documented transitions (seed 000), one at a time: after each step exactly the
/// nodes the seed names change, with the data it gives.
pub async fn merritt_transitions_change_exactly_the_documented_nodes(h: &dyn Harness) {
    let (e, s) = engine(h, "golden").await;
    let tree = s.tree.clone();
    let mut prev = normalised_dump(tree.as_ref()).await;
    let lock = json!({"owner": "golden", "session": "<session>", "acquired": "<time>"});
    // Batch: API call creates and queues a batch.
    let mut sub = Map::new();
    sub.insert("profile_name".into(), json!("merritt_demo"));
    sub.insert("submitter".into(), json!("depositor"));
    sub.insert("payload_url".into(), json!("http://127.0.0.1/file1.checkm"));
    sub.insert("type".into(), json!("file"));
    let bid = e.create_batch(sub).await.unwrap();
    check_step(tree.as_ref(), &mut prev, "create batch", json!({
        "+/batches/bid0000000000": null,
        "+/batches/bid0000000000/status": {"status": "Pending", "last_modified": "<time>", "message": ""},
        "+/batches/bid0000000000/submission": {"batchID": "<uuid>", "payload_url": "http://127.0.0.1/file1.checkm", "profile_name": "merritt_demo", "submissionDate": "<time>", "submitter": "depositor", "type": "file"},
        "+/batch-uuids/<uuid>": "bid0000000000",
        // Lading's own index of batches by submitter (outside Merritt's layout).
        "+/batch-submitters/depositor": null,
        "+/batch-submitters/depositor/bid0000000000": null,
    })).await;
    // Batch: acquire pending batch — create lock.
    let lease = e.acquire_batch(BatchState::Pending).await.unwrap().unwrap();
    assert_eq!(lease.batch, bid);
    check_step(
        tree.as_ref(),
        &mut prev,
        "acquire batch",
        json!({"+/batches/bid0000000000/lock": lock}),
    )
    .await;
    // Job creation: a new job id is written in 3 places.
    let mut cfg = Map::new();
    cfg.insert("profile_name".into(), json!("merritt_demo"));
    cfg.insert("payload_url".into(), json!("file1.checkm"));
    cfg.insert("local_id".into(), json!(["loc001"]));
    let jid = e
        .create_job(
            &lease,
            JobSpec {
                configuration: cfg,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    check_step(tree.as_ref(), &mut prev, "create job", json!({
        "+/jobs/jid0000000000": null,
        "+/jobs/jid0000000000/bid": "bid0000000000",
        "+/jobs/jid0000000000/configuration": {"local_id": ["loc001"], "payload_url": "file1.checkm", "profile_name": "merritt_demo"},
        "+/jobs/jid0000000000/identifiers": {"primary_id": "", "local_id": []},
        "+/jobs/jid0000000000/metadata": {},
        "+/jobs/jid0000000000/priority": 5,
        "+/jobs/jid0000000000/space_needed": 0,
        "+/jobs/jid0000000000/status": {"status": "Pending", "last_successful_status": null, "last_modified": "<time>", "retry_count": 0, "message": ""},
        "+/jobs/states/pending/05-jid0000000000": null,
        "+/batches/bid0000000000/states": null,
        "+/batches/bid0000000000/states/batch-completed": null,
        "+/batches/bid0000000000/states/batch-deleted": null,
        "+/batches/bid0000000000/states/batch-failed": null,
        "+/batches/bid0000000000/states/batch-processing": null,
        "+/batches/bid0000000000/states/batch-processing/jid0000000000": null,
    })).await;
    // Batch: Pending → Processing; delete the lock.
    e.batch_transition(lease, Event::To(BatchState::Processing), None)
        .await
        .unwrap();
    check_step(
        tree.as_ref(),
        &mut prev,
        "batch Pending -> Processing",
        json!({
            "~/batches/bid0000000000/status": {"status": "Processing", "last_modified": "<time>", "message": ""},
            "-/batches/bid0000000000/lock": null,
        }),
    )
    .await;
    // Job: acquire pending job — create lock; Pending → Estimating.
    let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    assert_eq!(l.job, jid);
    check_step(
        tree.as_ref(),
        &mut prev,
        "acquire job",
        json!({"+/jobs/jid0000000000/lock": lock}),
    )
    .await;
    e.job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    check_step(tree.as_ref(), &mut prev, "job Pending -> Estimating", json!({
        "~/jobs/jid0000000000/status": {"status": "Estimating", "last_successful_status": null, "last_modified": "<time>", "retry_count": 0, "message": ""},
        "-/jobs/states/pending/05-jid0000000000": null,
        "+/jobs/states/estimating/05-jid0000000000": null,
        "-/jobs/jid0000000000/lock": null,
    })).await;
    // Every working stage: the status moves on, last_successful_status is the stage left.
    let stages = [
        (
            JobState::Estimating,
            "Provisioning",
            "estimating",
            "provisioning",
        ),
        (
            JobState::Provisioning,
            "Downloading",
            "provisioning",
            "downloading",
        ),
        (
            JobState::Downloading,
            "Processing",
            "downloading",
            "processing",
        ),
        (JobState::Processing, "Storing", "processing", "storing"),
        (JobState::Storing, "Recording", "storing", "recording"),
        (JobState::Recording, "Notify", "recording", "notify"),
    ];
    for (from, to, old_folder, new_folder) in stages {
        let l = e.acquire_job(from).await.unwrap().unwrap();
        e.job_transition(l, Event::Success, None).await.unwrap();
        let mut want = Map::new();
        want.insert(
            "~/jobs/jid0000000000/status".into(),
            json!({"status": to, "last_successful_status": from.name(), "last_modified": "<time>", "retry_count": 0, "message": ""}),
        );
        want.insert(
            format!("-/jobs/states/{old_folder}/05-jid0000000000"),
            Value::Null,
        );
        want.insert(
            format!("+/jobs/states/{new_folder}/05-jid0000000000"),
            Value::Null,
        );
        check_step(tree.as_ref(), &mut prev, "job stage", Value::Object(want)).await;
    }
    // Job: Notify → Completed; the batch reference moves, and the batch, whose last job that
    // was, goes to Reporting.
    let l = e.acquire_job(JobState::Notify).await.unwrap().unwrap();
    e.job_transition(l, Event::Success, None).await.unwrap();
    check_step(tree.as_ref(), &mut prev, "job Notify -> Completed", json!({
        "~/jobs/jid0000000000/status": {"status": "Completed", "last_successful_status": "Notify", "last_modified": "<time>", "retry_count": 0, "message": ""},
        "-/jobs/states/notify/05-jid0000000000": null,
        "+/jobs/states/completed/05-jid0000000000": null,
        "-/batches/bid0000000000/states/batch-processing/jid0000000000": null,
        "+/batches/bid0000000000/states/batch-completed/jid0000000000": null,
        "~/batches/bid0000000000/status": {"status": "Reporting", "last_modified": "<time>", "message": ""},
    })).await;
}

/// The tree after `job_walks_the_pipeline_and_the_tree_matches_the_layout`, with volatile
/// values normalised: Merritt's layout, node for node.
pub const GOLDEN: &str = r#"{
  "/": null,
  "/access": null, "/access/large": null, "/access/small": null,
  "/batch-uuids": null, "/batch-uuids/<uuid>": "bid0000000000",
  "/batch-submitters": null, "/batch-submitters/tester": null,
  "/batch-submitters/tester/bid0000000000": null,
  "/batches": null,
  "/batches/bid0000000000": null,
  "/batches/bid0000000000/states": null,
  "/batches/bid0000000000/states/batch-completed": null,
  "/batches/bid0000000000/states/batch-completed/jid0000000000": null,
  "/batches/bid0000000000/states/batch-deleted": null,
  "/batches/bid0000000000/states/batch-failed": null,
  "/batches/bid0000000000/states/batch-failed/jid0000000001": null,
  "/batches/bid0000000000/states/batch-processing": null,
  "/batches/bid0000000000/status": {"status": "Reporting", "last_modified": "<time>", "message": ""},
  "/batches/bid0000000000/submission": {"batchID": "<uuid>", "payload_url": "http://127.0.0.1/manifest.checkm", "profile_name": "demo_profile", "submissionDate": "<time>", "submitter": "tester"},
  "/jobs": null,
  "/jobs/jid0000000000": null,
  "/jobs/jid0000000000/bid": "bid0000000000",
  "/jobs/jid0000000000/configuration": {"local_id": ["loc000"], "profile_name": "demo_profile"},
  "/jobs/jid0000000000/identifiers": {"primary_id": "", "local_id": []},
  "/jobs/jid0000000000/metadata": {},
  "/jobs/jid0000000000/priority": 5,
  "/jobs/jid0000000000/space_needed": 0,
  "/jobs/jid0000000000/status": {"status": "Completed", "last_successful_status": "Notify", "last_modified": "<time>", "retry_count": 0, "message": ""},
  "/jobs/jid0000000001": null,
  "/jobs/jid0000000001/bid": "bid0000000000",
  "/jobs/jid0000000001/configuration": {"local_id": ["loc001"], "profile_name": "demo_profile"},
  "/jobs/jid0000000001/identifiers": {"primary_id": "", "local_id": []},
  "/jobs/jid0000000001/metadata": {},
  "/jobs/jid0000000001/priority": 5,
  "/jobs/jid0000000001/space_needed": 0,
  "/jobs/jid0000000001/status": {"status": "Failed", "last_successful_status": "Provisioning", "last_modified": "<time>", "retry_count": 0, "message": "digest mismatch", "failed_stage": "Downloading", "failure_kind": "fatal", "failed_attempts": 1},
  "/jobs/states": null,
  "/jobs/states/completed/05-jid0000000000": null,
  "/jobs/states/failed/05-jid0000000001": null,
  "/locks": null, "/locks/collections": null, "/locks/inventory": null, "/locks/queue": null, "/locks/storage": null,
  "/outbox": null, "/reservations": null
}"#;

pub async fn illegal_transition_is_refused_and_changes_nothing(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let (_bid, jobs) = batch_with_jobs(&e, 1, &[]).await;
    let before = normalised_dump(s.tree.as_ref()).await;
    let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    let err = e
        .job_transition(l.clone(), Event::To(JobState::Completed), None)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "illegal job transition from Pending to Completed"
    );
    e.release_job_lease(l).await.unwrap();
    let err = e.requeue_job(&jobs[0], None).await.unwrap_err();
    assert!(matches!(err, EngineError::Illegal(_)), "{err}");
    let err = e.delete_job(&jobs[0]).await.unwrap_err();
    assert!(
        err.to_string().contains("Pending") && err.to_string().contains("Deleted"),
        "{err}"
    );
    assert_eq!(
        normalised_dump(s.tree.as_ref()).await,
        before,
        "refused moves leave the tree as it was"
    );
}

pub async fn unknown_ids_get_typed_errors(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let missing = JobId::parse("jid9999999999").unwrap();
    assert!(matches!(e.job(&missing).await, Err(EngineError::NoJob(j)) if j == "jid9999999999"));
    assert!(matches!(
        e.hold_job(&missing).await,
        Err(EngineError::NoJob(_))
    ));
    let b = BatchId::parse("bid9999999999").unwrap();
    assert!(matches!(e.batch(&b).await, Err(EngineError::NoBatch(_))));
    assert!(matches!(
        e.delete_batch(&b).await,
        Err(EngineError::NoBatch(_))
    ));
    assert!(matches!(
        e.pause_queue("nosuch").await,
        Err(EngineError::Invalid(_))
    ));
}

pub async fn corrupt_node_is_named_and_nothing_changes(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let (_bid, jobs) = batch_with_jobs(&e, 1, &[]).await;
    s.tree
        .set(&job_node(&jobs[0], "status"), bytes("{not json"), None)
        .await
        .unwrap();
    let before = normalised_dump(s.tree.as_ref()).await;
    let err = e.acquire_job(JobState::Pending).await.unwrap_err();
    match &err {
        EngineError::Corrupt { path, reason } => {
            assert_eq!(path, &job_node(&jobs[0], "status"));
            assert!(reason.contains("invalid JSON"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    assert!(matches!(
        e.hold_job(&jobs[0]).await,
        Err(EngineError::Corrupt { .. })
    ));
    assert_eq!(
        normalised_dump(s.tree.as_ref()).await,
        before,
        "no lock or move left behind"
    );
}

pub async fn acquisition_follows_priority_then_age(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let (_bid, jobs) = batch_with_jobs(&e, 4, &[7, 3, 7, 3]).await;
    let mut order = Vec::new();
    while let Some(l) = e.acquire_job(JobState::Pending).await.unwrap() {
        order.push(l.job.clone());
        e.job_transition(l, Event::To(JobState::Estimating), None)
            .await
            .unwrap();
    }
    assert_eq!(
        order,
        vec![
            jobs[1].clone(),
            jobs[3].clone(),
            jobs[0].clone(),
            jobs[2].clone()
        ]
    );
}

pub async fn set_priority_moves_the_reference(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let (_bid, jobs) = batch_with_jobs(&e, 2, &[]).await;
    let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    let l = e
        .job_advance(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    let mut l = l;
    e.set_priority(&mut l, 12).await.unwrap();
    e.set_space_needed(&l, 1_000_000_000).await.unwrap();
    e.job_transition(l, Event::Success, None).await.unwrap();
    assert!(
        s.tree
            .exists(&job_ref(JobState::Provisioning, 12, &jobs[0]))
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        s.tree
            .exists(&job_ref(JobState::Estimating, 5, &jobs[0]))
            .await
            .unwrap()
            .is_none()
    );
    let info = e.job(&jobs[0]).await.unwrap();
    assert_eq!((info.priority, info.space_needed), (12, 1_000_000_000));
    assert!(matches!(
        e.set_priority(
            &mut e.acquire_job(JobState::Pending).await.unwrap().unwrap(),
            100
        )
        .await,
        Err(EngineError::Invalid(_))
    ));
}

pub async fn concurrent_workers_each_job_handed_to_exactly_one(h: &dyn Harness) {
    let (e, _s) = engine(h, "setup").await;
    let (_bid, jobs) = batch_with_jobs(&e, 60, &[]).await;
    // Three sessions (as three processes would have), four workers each.
    let mut handles = Vec::new();
    for w in 0..3 {
        let (ew, sw) = engine(h, &format!("worker{w}")).await;
        for _ in 0..4 {
            let ew = ew.clone();
            handles.push(tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(l) = ew.acquire_job(JobState::Pending).await.expect("acquire") {
                    got.push(l.job.clone());
                    tokio::task::yield_now().await;
                    ew.job_transition(l, Event::To(JobState::Estimating), None)
                        .await
                        .expect("transition");
                }
                got
            }));
        }
        std::mem::forget(sw); // sessions stay open for the test's life
    }
    let mut all = Vec::new();
    for hd in handles {
        all.extend(
            tokio::time::timeout(WAIT, hd)
                .await
                .expect("worker finished")
                .expect("worker ok"),
        );
    }
    let unique: HashSet<_> = all.iter().cloned().collect();
    assert_eq!(all.len(), jobs.len(), "every job handed out exactly once");
    assert_eq!(unique.len(), jobs.len());
    assert_eq!(e.job_counts().await.unwrap()[&JobState::Estimating], 60);
}

/// A worker that moves a job on may lock its next job in the same `multi`: the next one in
/// queue order, locked against everyone else; when another session got it first, the move is
/// made alone; a paused queue hands nothing out this way either; a lost lease moves nothing
/// and locks nothing.
pub async fn moving_a_job_can_lock_the_next_in_the_same_multi(h: &dyn Harness) {
    let (e1, s1) = engine(h, "w1").await;
    let (e2, _s2) = engine(h, "w2").await;
    let (_bid, jobs) = batch_with_jobs(&e1, 4, &[]).await;
    let next = [JobState::Pending];
    let l0 = e1.acquire_job(JobState::Pending).await.unwrap().unwrap();
    assert_eq!(l0.job, jobs[0]);
    let (st, l1) = e1
        .job_transition_then_acquire(l0, Event::To(JobState::Estimating), None, &next)
        .await
        .unwrap();
    assert_eq!(st.status, JobState::Estimating);
    let l1 = l1.expect("the next Pending job comes with the move");
    assert_eq!(l1.job, jobs[1], "queue order");
    assert_eq!(l1.state(), JobState::Pending);
    let moved = e2.acquire_job(JobState::Estimating).await.unwrap().unwrap();
    assert_eq!(moved.job, jobs[0], "the moved job's lock is gone");
    e2.release_job_lease(moved).await.unwrap();
    // This session takes one of the last two, the other session the other: this one never
    // met that lock. The job that came with the move is locked against the other session.
    let ly = e1.acquire_job(JobState::Pending).await.unwrap().unwrap();
    let lx = e2.acquire_job(JobState::Pending).await.unwrap().unwrap();
    let mut three = vec![l1.job.clone(), ly.job.clone(), lx.job.clone()];
    three.sort();
    assert_eq!(three, jobs[1..].to_vec());
    assert!(e2.acquire_job(JobState::Pending).await.unwrap().is_none());

    // The only candidate is locked by the other session: the move is made alone.
    let (st, none) = e1
        .job_transition_then_acquire(l1, Event::To(JobState::Estimating), None, &next)
        .await
        .unwrap();
    assert_eq!(st.status, JobState::Estimating);
    assert!(none.is_none(), "the next job was locked elsewhere");
    assert_eq!(
        e1.job(&jobs[1]).await.unwrap().status.status,
        JobState::Estimating
    );
    // The other session's lease is intact.
    e2.job_transition(lx, Event::To(JobState::Estimating), None)
        .await
        .unwrap();

    // A lost lease moves nothing and locks nothing.
    let (e3, _s3) = engine(h, "w3").await;
    let (_bid, more) = batch_with_jobs(&e3, 2, &[]).await;
    (s1.expire)().await;
    let y = ly.job.clone();
    let err = e1
        .job_transition_then_acquire(ly, Event::To(JobState::Estimating), None, &next)
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::LeaseLost(_)), "{err}");
    assert_eq!(e3.job(&y).await.unwrap().status.status, JobState::Pending);
    let mut free = HashSet::new();
    while let Some(l) = e3.acquire_job(JobState::Pending).await.unwrap() {
        free.insert(l.job.clone());
    }
    assert_eq!(free, HashSet::from([y, more[0].clone(), more[1].clone()]));

    // A paused queue: the move is made, nothing more is handed out.
    let (e4, _s4) = engine(h, "w4").await;
    let (_bid, last) = batch_with_jobs(&e4, 2, &[]).await;
    let l = e4.acquire_job(JobState::Pending).await.unwrap().unwrap();
    assert!(last.contains(&l.job));
    e4.pause_queue("ingest").await.unwrap();
    let (st, none) = e4
        .job_transition_then_acquire(l, Event::To(JobState::Estimating), None, &next)
        .await
        .unwrap();
    assert_eq!(st.status, JobState::Estimating);
    assert!(none.is_none(), "a paused queue hands out nothing");
    e4.resume_queue("ingest").await.unwrap();
}

pub async fn lost_lease_cannot_commit_transition(h: &dyn Harness) {
    let (e1, s1) = engine(h, "stalled").await;
    let (e2, _s2) = engine(h, "healthy").await;
    let (_bid, jobs) = batch_with_jobs(&e1, 1, &[]).await;
    let l = e1.acquire_job(JobState::Pending).await.unwrap().unwrap();
    let l = e1
        .job_advance(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    assert!(
        e2.acquire_job(JobState::Estimating)
            .await
            .unwrap()
            .is_none(),
        "locked while held"
    );
    (s1.expire)().await;
    // The stalled worker wakes up and tries to commit: refused, nothing changes.
    let err = e1
        .job_transition(l.clone(), Event::Success, None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, EngineError::LeaseLost(ref j) if j == jobs[0].as_str()),
        "{err}"
    );
    assert!(matches!(
        e1.set_space_needed(&l, 5).await,
        Err(EngineError::LeaseLost(_))
    ));
    // Another worker picks it up in the state it was in.
    let l2 = e2
        .acquire_job(JobState::Estimating)
        .await
        .unwrap()
        .expect("job available again");
    assert_eq!(l2.job, jobs[0]);
    assert_eq!(e2.job(&jobs[0]).await.unwrap().space_needed, 0);
    e2.job_transition(l2, Event::Success, None).await.unwrap();
    assert_eq!(
        e2.job(&jobs[0]).await.unwrap().status.status,
        JobState::Provisioning
    );
}

pub async fn a_worker_whose_session_expired_can_acquire_again(h: &dyn Harness) {
    // Regressions: the engine remembered its claims across a session expiry and never handed
    // those jobs out again in that process; and the SQLite store gave a new session the id of
    // the one it replaced, so the dead session's leases looked alive.
    let (e, s) = engine(h, "w").await;
    let (_bid, jobs) = batch_with_jobs(&e, 1, &[]).await;
    let lease = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    // The handler holding it is cancelled: the lease is dropped, never released.
    drop(lease);
    let before = s.tree.session_id();
    (s.expire)().await;
    assert_ne!(
        s.tree.session_id(),
        before,
        "a new session never reuses an old id"
    );
    let again = e
        .acquire_job(JobState::Pending)
        .await
        .unwrap()
        .expect("the job is handed out again");
    assert_eq!(again.job, jobs[0]);
}

pub async fn stale_lease_after_a_takeover_is_lost(h: &dyn Harness) {
    // Same session, but the status moved underneath (admin action after the lock was gone).
    let (e, s) = engine(h, "w").await;
    let (_bid, jobs) = batch_with_jobs(&e, 1, &[]).await;
    let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    s.tree
        .delete(&job_node(&jobs[0], "lock"), None)
        .await
        .unwrap();
    e.hold_job(&jobs[0]).await.unwrap();
    let err = e
        .job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::LeaseLost(_)), "{err}");
    assert_eq!(e.job(&jobs[0]).await.unwrap().status.status, JobState::Held);
}

pub async fn batch_reports_exactly_once_when_jobs_finish_concurrently(h: &dyn Harness) {
    for round in 0..3 {
        let (e, _s) = engine(h, "setup").await;
        let (bid, _jobs) = batch_with_jobs(&e, 12, &[]).await;
        // Bring every job to Notify.
        while let Some(l) = e.acquire_job(JobState::Pending).await.unwrap() {
            let mut l = e
                .job_advance(l, Event::To(JobState::Estimating), None)
                .await
                .unwrap();
            while l.state() != JobState::Notify {
                l = e.job_advance(l, Event::Success, None).await.unwrap();
            }
            e.release_job_lease(l).await.unwrap();
        }
        let mut engines = Vec::new();
        for w in 0..4 {
            engines.push(engine(h, &format!("w{round}{w}")).await);
        }
        let mut receivers: Vec<_> = engines.iter().map(|(ew, _)| ew.subscribe()).collect();
        receivers.push(e.subscribe());
        let mut leases = Vec::new();
        let mut i = 0;
        while let Some(l) = engines[i % 4]
            .0
            .acquire_job(JobState::Notify)
            .await
            .unwrap()
        {
            leases.push((engines[i % 4].0.clone(), l));
            i += 1;
        }
        assert_eq!(leases.len(), 12);
        let mut handles = Vec::new();
        for (idx, (ew, l)) in leases.into_iter().enumerate() {
            handles.push(tokio::spawn(async move {
                let ev = if idx % 5 == 0 {
                    Event::Fail
                } else {
                    Event::Success
                };
                ew.job_transition(l, ev, None)
                    .await
                    .expect("final transition");
            }));
        }
        for hd in handles {
            hd.await.unwrap();
        }
        let info = e.batch(&bid).await.unwrap();
        assert_eq!(info.status.status, BatchState::Reporting);
        assert!(info.jobs["batch-processing"].is_empty());
        assert_eq!(
            info.jobs["batch-completed"].len() + info.jobs["batch-failed"].len(),
            12
        );
        // Exactly one Processing → Reporting move, across every engine's events.
        let mut moves = 0;
        for rx in receivers.iter_mut() {
            while let Ok(ev) = rx.try_recv() {
                if ev.kind == "batch" && ev.id == bid.as_str() && ev.to == "Reporting" {
                    moves += 1;
                }
            }
        }
        assert_eq!(moves, 1, "the batch moved to Reporting exactly once");
        // The sweep finds nothing more to do.
        assert_eq!(e.sweep_reporting().await.unwrap(), 0);
        assert!(!e.maybe_report(&bid).await.unwrap());
    }
}

pub async fn requeue_returns_a_failed_job_to_the_stage_that_failed(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let (bid, jobs) = batch_with_jobs(&e, 1, &[]).await;
    let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    let mut l = e
        .job_advance(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    while l.state() != JobState::Recording {
        l = e.job_advance(l, Event::Success, None).await.unwrap();
    }
    e.job_transition(l, Event::Fail, Some("inventory down".into()))
        .await
        .unwrap();
    assert_eq!(
        e.batch(&bid).await.unwrap().status.status,
        BatchState::Reporting
    );
    let st = e.requeue_job(&jobs[0], None).await.unwrap();
    assert_eq!(
        (st.status, st.retry_count, st.last_successful_status),
        (JobState::Recording, 1, Some(JobState::Storing))
    );
    let info = e.batch(&bid).await.unwrap();
    assert_eq!(info.jobs["batch-processing"], vec![jobs[0].to_string()]);
    assert!(info.jobs["batch-failed"].is_empty());
    // An explicit target from the table is accepted too.
    let l = e.acquire_job(JobState::Recording).await.unwrap().unwrap();
    e.job_transition(l, Event::Fail, None).await.unwrap();
    let st = e
        .requeue_job(&jobs[0], Some(JobState::Downloading))
        .await
        .unwrap();
    assert_eq!((st.status, st.retry_count), (JobState::Downloading, 2));
}

pub async fn deferred_job_is_not_taken_before_its_retry_time(h: &dyn Harness) {
    let (e, _s) = engine(h, "w1").await;
    let (other, _s2) = engine(h, "w2").await;
    let (_bid, jobs) = batch_with_jobs(&e, 2, &[]).await;
    let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    assert_eq!(l.job, jobs[0]);
    let retry_at_ms = e.clock().now_ms() + 1500;
    let st = e
        .job_defer(l, retry_at_ms, 1, Some("server busy".into()))
        .await
        .unwrap();
    assert_eq!(lading_engine::attempts(&st), 1);
    let stored = e.job(&jobs[0]).await.unwrap();
    assert_eq!(stored.status.status, JobState::Pending);
    assert_eq!(stored.status.message.as_deref(), Some("server busy"));
    assert_eq!(lading_engine::retry_at(&stored.status), Some(retry_at_ms));
    assert!(!stored.locked, "deferring releases the lock");
    // Another process honours the retry time: it takes the next job, then nothing.
    let l2 = other.acquire_job(JobState::Pending).await.unwrap().unwrap();
    assert_eq!(l2.job, jobs[1]);
    other.release_job_lease(l2).await.unwrap();
    let again = other.acquire_job(JobState::Pending).await.unwrap().unwrap();
    assert_eq!(again.job, jobs[1]);
    assert!(
        other
            .acquire_job(JobState::Pending)
            .await
            .unwrap()
            .is_none()
    );
    // A waiting worker is woken when the deferred job becomes due.
    let l = other
        .wait_job(JobState::Pending, WAIT)
        .await
        .unwrap()
        .expect("the deferred job once due");
    assert_eq!(l.job, jobs[0]);
    assert!(e.clock().now_ms() >= retry_at_ms);
    // Leaving the stage forgets its attempts and retry time.
    let st = other
        .job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    assert_eq!(lading_engine::attempts(&st), 0);
    assert_eq!(lading_engine::retry_at(&st), None);
    other.release_job_lease(again).await.unwrap();
}

pub async fn report_and_update_reporting(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let (bid, jobs) = batch_with_jobs(&e, 2, &[]).await;
    run_job_to_completion(&e, JobState::Pending).await.unwrap();
    let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    e.job_transition(l, Event::Fail, Some("bad manifest row".into()))
        .await
        .unwrap();
    let lease = e
        .acquire_batch(BatchState::Reporting)
        .await
        .unwrap()
        .expect("reporting batch");
    let report = e.build_report(&bid).await.unwrap();
    assert_eq!(
        (report.completed_jobs.clone(), report.failed_jobs.clone()),
        (vec![jobs[0].to_string()], vec![jobs[1].to_string()])
    );
    e.write_status_report(&lease, &report).await.unwrap();
    e.batch_transition(lease, Event::Fail, Some("1 job failed".into()))
        .await
        .unwrap();
    // Merritt's way: an admin asks for an updated report of the Failed batch.
    let st = e.update_reporting(&bid).await.unwrap();
    assert_eq!(st.status, BatchState::UpdateReporting);
    let lease = e
        .acquire_batch(BatchState::UpdateReporting)
        .await
        .unwrap()
        .unwrap();
    e.batch_transition(lease, Event::Fail, Some("1 of 2 jobs failed".into()))
        .await
        .unwrap();
    // Requeuing the failed job reopens the batch; done, it reports again by itself.
    e.requeue_job(&jobs[1], None).await.unwrap();
    assert_eq!(
        e.batch(&bid).await.unwrap().status.status,
        BatchState::Processing
    );
    run_job_to_completion(&e, JobState::Pending).await.unwrap();
    let mut lease = e
        .acquire_batch(BatchState::Reporting)
        .await
        .unwrap()
        .expect("the reopened batch reports again");
    let report = e.build_report(&bid).await.unwrap();
    assert_eq!(report.completed_jobs.len(), 2);
    assert!(report.failed_jobs.is_empty());
    lease.report = Some(report);
    e.batch_transition(lease, Event::Success, None)
        .await
        .unwrap();
    let info = e.batch(&bid).await.unwrap();
    assert_eq!(info.status.status, BatchState::Completed);
    assert_eq!(info.status_report.unwrap().completed_jobs.len(), 2);
    // Cleanup purges a completed batch and its jobs.
    assert_eq!(e.purge_batch(&bid).await.unwrap(), 2);
    assert!(matches!(e.batch(&bid).await, Err(EngineError::NoBatch(_))));
    assert!(matches!(e.job(&jobs[0]).await, Err(EngineError::NoJob(_))));
    assert_eq!(e.job_counts().await.unwrap().values().sum::<u64>(), 0);
}

/// A batch of two jobs, the first completed and the second Failed, with the batch in `state`
/// (Processing: the second job failed while the first still ran).
async fn batch_with_a_failed_job(e: &Engine, state: BatchState) -> (BatchId, Vec<JobId>) {
    let (bid, jobs) = batch_with_jobs(e, 2, &[]).await;
    if state == BatchState::Processing {
        // The second fails first: the first is still in the pipeline.
        let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
        let l = if l.job == jobs[1] {
            l
        } else {
            // Held while the other is taken.
            let second = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
            e.release_job_lease(l).await.unwrap();
            second
        };
        assert_eq!(l.job, jobs[1]);
        e.job_transition(l, Event::Fail, Some("bad row".into()))
            .await
            .unwrap();
        return (bid, jobs);
    }
    run_job_to_completion(e, JobState::Pending).await.unwrap();
    let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    e.job_transition(l, Event::Fail, Some("bad row".into()))
        .await
        .unwrap();
    if state == BatchState::Reporting {
        let jobs = failed_last(e, &bid, jobs).await;
        return (bid, jobs);
    }
    let lease = e
        .acquire_batch(BatchState::Reporting)
        .await
        .unwrap()
        .unwrap();
    e.batch_transition(lease, Event::Fail, Some("1 of 2 jobs failed".into()))
        .await
        .unwrap();
    if state == BatchState::UpdateReporting {
        e.update_reporting(&bid).await.unwrap();
    }
    let jobs = failed_last(e, &bid, jobs).await;
    (bid, jobs)
}

/// `jobs` with the batch's failed job last (acquisition picks among equals at random).
async fn failed_last(e: &Engine, bid: &BatchId, mut jobs: Vec<JobId>) -> Vec<JobId> {
    let failed = e.batch(bid).await.unwrap().jobs["batch-failed"].clone();
    jobs.sort_by_key(|j| failed.contains(&j.to_string()));
    jobs
}

pub async fn requeue_at_every_batch_state_reports_again(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    for state in [
        BatchState::Processing,
        BatchState::Reporting,
        BatchState::Failed,
        BatchState::UpdateReporting,
    ] {
        let (bid, jobs) = batch_with_a_failed_job(&e, state).await;
        assert_eq!(e.batch(&bid).await.unwrap().status.status, state);
        let st = e
            .requeue_job(&jobs[1], Some(JobState::Pending))
            .await
            .unwrap();
        assert_eq!(st.status, JobState::Pending);
        let info = e.batch(&bid).await.unwrap();
        assert_eq!(info.status.status, BatchState::Processing, "from {state}");
        assert!(!info.locked, "from {state}");
        if state != BatchState::Processing {
            let msg = info.status.message.unwrap_or_default();
            assert!(
                msg.contains("reopened") && msg.contains(jobs[1].as_str()),
                "{msg}"
            );
        }
        // The rest of the batch's work, then one report that sees every job completed.
        while run_job_to_completion(&e, JobState::Pending).await.is_some() {}
        let lease = e
            .acquire_batch(BatchState::Reporting)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("batch from {state} reports again"));
        assert_eq!(lease.batch, bid);
        let report = e.build_report(&bid).await.unwrap();
        assert_eq!(report.completed_jobs.len(), 2, "from {state}");
        e.batch_transition(lease, Event::Success, None)
            .await
            .unwrap();
        assert_eq!(
            e.batch(&bid).await.unwrap().status.status,
            BatchState::Completed
        );
        // A Completed batch has nothing to requeue: refused, nothing changes.
        let before = e.batch(&bid).await.unwrap().status;
        let err = e.requeue_job(&jobs[0], None).await.unwrap_err();
        assert!(matches!(err, EngineError::Illegal(_)), "{err}");
        assert_eq!(e.batch(&bid).await.unwrap().status, before);
    }
}

/// The first report's mail of `bid`, as an effect.
fn report_mail(bid: &BatchId, payload: Value) -> lading_engine::Effect {
    lading_engine::Effect {
        kind: "mail".into(),
        key: "<report-1>".into(),
        batch: Some(bid.to_string()),
        job: None,
        payload,
    }
}

pub async fn a_reporter_that_loses_its_batch_to_a_requeue_records_nothing(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let (bid, jobs) = batch_with_a_failed_job(&e, BatchState::Reporting).await;
    let mut lease = e
        .acquire_batch(BatchState::Reporting)
        .await
        .unwrap()
        .unwrap();
    lease.report = Some(e.build_report(&bid).await.unwrap());
    lease.effects.push(report_mail(&bid, json!({})));
    // While the reporter works, an admin requeues the failed job.
    e.requeue_job(&jobs[1], None).await.unwrap();
    let err = e
        .batch_transition(lease, Event::Fail, Some("1 of 2 jobs failed".into()))
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::LeaseLost(_)), "{err}");
    let info = e.batch(&bid).await.unwrap();
    assert_eq!(info.status.status, BatchState::Processing);
    assert!(!info.locked, "the reporter let go of the batch");
    assert!(
        info.status_report.is_none(),
        "no report of a move that failed"
    );
    assert!(e.outbox().await.unwrap().is_empty(), "no mail either");
    assert!(s.tree.children(OUTBOX).await.unwrap().is_empty());
    // The requeued job finishes; the batch reports once, then, with its mail in the outbox.
    run_job_to_completion(&e, JobState::Pending).await.unwrap();
    let mut lease = e
        .acquire_batch(BatchState::Reporting)
        .await
        .unwrap()
        .unwrap();
    lease.report = Some(e.build_report(&bid).await.unwrap());
    lease
        .effects
        .push(report_mail(&bid, json!({"to": ["a@example.org"]})));
    e.batch_transition(lease, Event::Success, None)
        .await
        .unwrap();
    let out = e.outbox().await.unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].entry.effect.key, "<report-1>");
    assert_eq!(out[0].entry.attempts, 0);
    assert_eq!(
        e.batch(&bid)
            .await
            .unwrap()
            .status_report
            .unwrap()
            .completed_jobs
            .len(),
        2
    );
}

pub async fn outbox_entries_are_claimed_once_retried_and_deleted_when_delivered(h: &dyn Harness) {
    let (e, _s) = engine(h, "a").await;
    let (other, _s2) = engine(h, "b").await;
    let (_bid, _jobs) = batch_with_jobs(&e, 1, &[]).await;
    // A job's move records its callback; a failed move records nothing.
    let mut l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    l.effects.push(lading_engine::Effect {
        kind: "callback".into(),
        key: "k1".into(),
        batch: None,
        job: Some(l.job.to_string()),
        payload: json!({"url": "http://127.0.0.1/"}),
    });
    let stale = l.clone();
    e.job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    assert!(
        e.job_transition(stale, Event::To(JobState::Estimating), None)
            .await
            .is_err()
    );
    let out = e.outbox().await.unwrap();
    assert_eq!(out.len(), 1, "one entry: the stale move recorded nothing");
    // One claim at a time, across sessions.
    let c = e.claim_effect(&["callback"]).await.unwrap().unwrap();
    assert_eq!(c.entry.effect.key, "k1");
    assert!(matches!(
        other.claim_effect(&["callback"]).await.unwrap(),
        Err(None)
    ));
    assert!(matches!(
        e.claim_effect(&["mail"]).await.unwrap(),
        Err(None)
    ));
    // A failure keeps it with a retry time; not due before it.
    let at = e.clock().now_ms() + 60_000;
    e.effect_failed(c, "answered 500", Some(at)).await.unwrap();
    assert!(matches!(other.claim_effect(&["callback"]).await.unwrap(), Err(Some(t)) if t == at));
    let item = &e.outbox().await.unwrap()[0];
    assert_eq!(
        (item.entry.attempts, item.entry.last_error.as_deref()),
        (1, Some("answered 500"))
    );
    // Given up: dead, never claimed, until an admin retries it.
    let name = item.name.clone();
    e.retry_effect(&name).await.unwrap();
    let c = other.claim_effect(&["callback"]).await.unwrap().unwrap();
    other.effect_failed(c, "gone", None).await.unwrap();
    assert!(matches!(
        e.claim_effect(&["callback"]).await.unwrap(),
        Err(None)
    ));
    assert!(e.outbox().await.unwrap()[0].entry.dead);
    e.retry_effect(&name).await.unwrap();
    // Delivered: gone for good.
    let c = e.claim_effect(&["callback"]).await.unwrap().unwrap();
    assert_eq!(c.entry.effect.key, "k1");
    e.effect_done(c).await.unwrap();
    assert!(e.outbox().await.unwrap().is_empty());
    assert!(matches!(
        other.claim_effect(&["callback"]).await.unwrap(),
        Err(None)
    ));
}

pub async fn deleting_the_last_failed_job_says_an_update_report_is_due(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let (bid, jobs) = batch_with_a_failed_job(&e, BatchState::Failed).await;
    e.delete_job(&jobs[1]).await.unwrap();
    let st = e.batch(&bid).await.unwrap().status;
    assert_eq!(st.status, BatchState::Failed);
    assert_eq!(
        st.message.as_deref(),
        Some("no failed jobs left (1 completed); 1 deleted: an update report is due")
    );
}

pub async fn concurrent_admissions_never_reserve_more_than_is_free(h: &dyn Harness) {
    const MIB: u64 = 1 << 20;
    let (a, _sa) = engine(h, "a").await;
    let (b, _sb) = engine(h, "b").await;
    let (_bid, _jobs) = batch_with_jobs(&a, 9, &[]).await;
    for _ in 0..9 {
        let l = a.acquire_job(JobState::Pending).await.unwrap().unwrap();
        let l = a
            .job_advance(l, Event::To(JobState::Estimating), None)
            .await
            .unwrap();
        a.job_transition(l, Event::Success, None).await.unwrap();
    }
    // Nine jobs of 1 MiB, admitted at the same moment by two sessions into 6 MiB.
    let mut set = tokio::task::JoinSet::new();
    for i in 0..9 {
        let e = if i % 2 == 0 { a.clone() } else { b.clone() };
        let mut l = e
            .acquire_job(JobState::Provisioning)
            .await
            .unwrap()
            .unwrap();
        set.spawn(async move {
            let r = e
                .reserve_space(&mut l, "host:/work", MIB, 6 * MIB, 0)
                .await
                .unwrap();
            (e, l, r)
        });
    }
    let mut admitted = Vec::new();
    let mut waiting = Vec::new();
    while let Some(r) = set.join_next().await {
        let (e, l, r) = r.unwrap();
        match r {
            None => admitted.push((e, l)),
            Some(held) => {
                assert!(held > 0 && held + MIB > 6 * MIB, "refused with {held} held");
                waiting.push((e, l));
            }
        }
    }
    assert_eq!(admitted.len(), 6, "6 MiB hold six jobs of 1 MiB");
    let held: u64 = a
        .reservations()
        .await
        .unwrap()
        .iter()
        .map(|(_, r)| r.bytes)
        .sum();
    assert_eq!(held, 6 * MIB);
    // Another root is another file system.
    let (e, mut l) = waiting.pop().unwrap();
    assert_eq!(
        e.reserve_space(&mut l, "other:/work", MIB, 6 * MIB, 0)
            .await
            .unwrap(),
        None
    );
    e.job_transition(l, Event::Success, None).await.unwrap();
    // A download that ends (either way) gives its space back, in its own move.
    let (e, l) = admitted.pop().unwrap();
    let l = e.job_advance(l, Event::Success, None).await.unwrap();
    assert_eq!(l.state(), JobState::Downloading);
    assert!(l.status.extra.contains_key(lading_engine::RESERVED_FIELD));
    e.job_transition(l, Event::Fail, Some("digest mismatch".into()))
        .await
        .unwrap();
    let (e, l) = admitted.pop().unwrap();
    let l = e.job_advance(l, Event::Success, None).await.unwrap();
    let st = e.job_transition(l, Event::Success, None).await.unwrap();
    assert_eq!(st.status, JobState::Processing);
    assert!(!st.extra.contains_key(lading_engine::RESERVED_FIELD));
    assert_eq!(
        a.reservations().await.unwrap().len(),
        5,
        "4 left on host:/work, 1 on other"
    );
    // Now two of the waiting fit.
    let mut fits = 0;
    for (e, mut l) in waiting {
        if e.reserve_space(&mut l, "host:/work", MIB, 6 * MIB, 0)
            .await
            .unwrap()
            .is_none()
        {
            fits += 1;
        }
        e.release_job_lease(l).await.unwrap();
    }
    assert_eq!(fits, 2);
    for (e, l) in admitted {
        e.release_job_lease(l).await.unwrap();
    }
}

/// Merritt's `Batch.acquirePendingBatch` creates only `states`, and `Job.createJob` only
/// `states/batch-processing`; the other reference folders appear when Merritt's own code
/// first moves a job there. Lading's moves create them when missing.
pub async fn merritt_lazily_made_batch_folders_are_created_by_the_move(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let (bid, jobs) = batch_with_jobs(&e, 3, &[]).await;
    for f in ["batch-completed", "batch-failed", "batch-deleted"] {
        s.tree
            .delete(&batch_ref_folder(&bid, f), None)
            .await
            .unwrap();
    }
    run_job_to_completion(&e, JobState::Pending).await.unwrap();
    let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    let failed = l.job.clone();
    e.job_transition(l, Event::Fail, Some("bad row".into()))
        .await
        .unwrap();
    e.delete_job(&failed).await.unwrap();
    let info = e.batch(&bid).await.unwrap();
    assert_eq!(info.jobs["batch-completed"].len(), 1);
    assert_eq!(info.jobs["batch-deleted"], vec![failed.to_string()]);
    assert_eq!(info.jobs["batch-processing"].len(), 1);
    // The third job (its batch made by a Merritt that created only `states`) fails too.
    for f in ["batch-failed"] {
        s.tree
            .delete(&batch_ref_folder(&bid, f), None)
            .await
            .unwrap();
    }
    let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    assert!(jobs.contains(&l.job));
    e.job_transition(l, Event::Fail, Some("bad row".into()))
        .await
        .unwrap();
    let info = e.batch(&bid).await.unwrap();
    assert_eq!(info.jobs["batch-failed"].len(), 1);
    assert_eq!(
        info.status.status,
        BatchState::Reporting,
        "the batch reports"
    );
}

/// Merritt's Java code writes `"Failed"` into `last_successful_status` when it moves a job out
/// of Failed; a requeue after the job fails again still goes to the stage that failed.
pub async fn merritt_last_successful_failed_still_requeues_to_the_stage_that_failed(
    h: &dyn Harness,
) {
    let (e, s) = engine(h, "w").await;
    let (_bid, jobs) = batch_with_jobs(&e, 1, &[]).await;
    let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    let l = e
        .job_advance(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    let l = e.job_advance(l, Event::Success, None).await.unwrap();
    e.job_transition(l, Event::Success, None).await.unwrap();
    // Downloading, as Merritt writes the status after its own requeue.
    s.tree
        .set(
            &job_node(&jobs[0], "status"),
            Some(
                br#"{"status":"Downloading","last_successful_status":"Failed","last_modified":"2026-11-24 10:00:00","retry_count":1,"message":""}"#
                    .to_vec(),
            ),
            None,
        )
        .await
        .unwrap();
    let l = e.acquire_job(JobState::Downloading).await.unwrap().unwrap();
    e.job_transition(l, Event::Fail, Some("digest mismatch".into()))
        .await
        .unwrap();
    let st = e.requeue_job(&jobs[0], None).await.unwrap();
    assert_eq!(st.status, JobState::Downloading);
}

/// Merritt's pending-batch scan takes any batch without `states` for pending (and then
/// throws on a Held one, leaving its lock): a batch Lading holds has `states`.
pub async fn merritt_pending_scan_skips_a_held_batch(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let bid = e.create_batch(Map::new()).await.unwrap();
    assert!(s.tree.exists(&batch_states(&bid)).await.unwrap().is_none());
    e.hold_batch(&bid).await.unwrap();
    assert!(s.tree.exists(&batch_states(&bid)).await.unwrap().is_some());
    for f in BATCH_FOLDERS {
        assert!(
            s.tree
                .exists(&batch_ref_folder(&bid, f))
                .await
                .unwrap()
                .is_some()
        );
    }
    // Released, it is Lading's to take, and it goes on as any batch.
    e.release_batch(&bid).await.unwrap();
    let l = e.acquire_batch(BatchState::Pending).await.unwrap().unwrap();
    assert_eq!(l.batch, bid);
    let st = e
        .batch_transition(l, Event::To(BatchState::Processing), None)
        .await
        .unwrap();
    // No jobs: it reports at once.
    assert!(matches!(
        st.status,
        BatchState::Processing | BatchState::Reporting
    ));
    assert!(!e.batch(&bid).await.unwrap().locked);
}

pub async fn held_collection_holds_batches_and_jobs_until_released(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    // A job of collection "coll" is queued, then the collection is held.
    let mut sub = Map::new();
    sub.insert("collection".into(), json!("coll"));
    let bid = e.create_batch(sub.clone()).await.unwrap();
    let lease = e.acquire_batch(BatchState::Pending).await.unwrap().unwrap();
    let mut cfg = Map::new();
    cfg.insert("collection".into(), json!("coll"));
    let jid = e
        .create_job(
            &lease,
            JobSpec {
                configuration: cfg,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    e.batch_transition(lease, Event::To(BatchState::Processing), None)
        .await
        .unwrap();
    assert!(e.hold_collection("coll").await.unwrap());
    let held_batch = e.create_batch(sub).await.unwrap();
    assert!(
        e.acquire_batch(BatchState::Pending)
            .await
            .unwrap()
            .is_none()
    );
    assert!(e.acquire_job(JobState::Pending).await.unwrap().is_none());
    assert_eq!(
        e.batch(&held_batch).await.unwrap().status.status,
        BatchState::Held
    );
    assert_eq!(e.job(&jid).await.unwrap().status.status, JobState::Held);
    assert_eq!(e.release_collection("coll").await.unwrap(), 2);
    assert!(!e.collection_held("coll").await.unwrap());
    assert_eq!(
        e.batch(&held_batch).await.unwrap().status.status,
        BatchState::Pending
    );
    let l = e
        .acquire_job(JobState::Pending)
        .await
        .unwrap()
        .expect("released job is pending again");
    assert_eq!(l.job, jid);
    let _ = bid;
}

pub async fn batch_worker_is_woken_when_a_batch_needs_reporting(h: &dyn Harness) {
    let (e, _s) = engine(h, "jobs").await;
    let (reporter, _s2) = engine(h, "reporter").await;
    let (bid, _jobs) = batch_with_jobs(&e, 1, &[]).await;
    // The reporter has looked once and found nothing to report; then it waits.
    assert!(
        reporter
            .acquire_batch(BatchState::Reporting)
            .await
            .unwrap()
            .is_none()
    );
    let waiting = {
        let r = reporter.clone();
        tokio::spawn(async move { r.wait_batch(BatchState::Reporting, WAIT).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    run_job_to_completion(&e, JobState::Pending).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("woken well before the sweep")
        .unwrap()
        .unwrap()
        .expect("the batch to report");
    assert_eq!(lease.batch, bid);
    // A new Pending batch wakes an intake worker too.
    let waiting = {
        let r = reporter.clone();
        tokio::spawn(async move { r.wait_batch(BatchState::Pending, WAIT).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut sub = Map::new();
    sub.insert("profile_name".into(), json!("demo_profile"));
    let new = e.create_batch(sub).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("woken by the new batch")
        .unwrap()
        .unwrap()
        .expect("the new batch");
    assert_eq!(got.batch, new);
    // A batch is made in two steps (its node, then its status): a waiter that wakes and looks
    // in between must still be woken when the status arrives, not by the sweep 10 s later.
    let waiting = {
        let r = reporter.clone();
        tokio::spawn(async move { r.wait_batch(BatchState::Pending, WAIT).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let path = e
        .tree()
        .create(BATCH_PREFIX, None, CreateMode::PersistentSequential)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = json!({"status": "Pending", "last_modified": "2026-11-21 00:00:00 +0000"});
    e.tree()
        .multi(vec![
            Op::create(format!("{path}/submission"), bytes("{}")),
            Op::create(format!("{path}/status"), bytes(&status.to_string())),
        ])
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("woken by the status of a batch seen half made")
        .unwrap()
        .unwrap()
        .expect("the batch");
    assert_eq!(format!("/batches/{}", got.batch), path);
}

pub async fn paused_queue_hands_out_nothing(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let (_bid, _jobs) = batch_with_jobs(&e, 1, &[]).await;
    e.create_batch(Map::new()).await.unwrap();
    assert!(e.pause_queue("ingest").await.unwrap());
    assert!(!e.pause_queue("ingest").await.unwrap(), "already paused");
    assert!(e.acquire_job(JobState::Pending).await.unwrap().is_none());
    assert!(
        e.acquire_batch(BatchState::Pending)
            .await
            .unwrap()
            .is_none()
    );
    // A waiting worker is woken by the resume, not by polling.
    let e2 = e.clone();
    let waiter = tokio::spawn(async move { e2.wait_job(JobState::Pending, WAIT).await });
    tokio::task::yield_now().await;
    e.resume_queue("ingest").await.unwrap();
    let got = tokio::time::timeout(WAIT, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(got.is_some(), "resumed queue hands the job out");
}

pub async fn waiting_worker_is_woken_by_new_work(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let (other, _s2) = engine(h, "producer").await;
    let e2 = e.clone();
    let waiter = tokio::spawn(async move { e2.wait_job(JobState::Pending, WAIT).await });
    tokio::task::yield_now().await;
    let (_bid, jobs) = batch_with_jobs(&other, 1, &[]).await;
    let got = tokio::time::timeout(WAIT, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .expect("woken with the job");
    assert_eq!(got.job, jobs[0]);
}

pub async fn admin_actions_respect_locks_and_the_table(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let (bid, jobs) = batch_with_jobs(&e, 2, &[]).await;
    let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    let locked = l.job.clone();
    let before = normalised_dump(s.tree.as_ref()).await;
    assert!(matches!(
        e.hold_job(&locked).await,
        Err(EngineError::Locked(_))
    ));
    assert_eq!(
        normalised_dump(s.tree.as_ref()).await,
        before,
        "a refused admin action changes nothing"
    );
    e.release_job_lease(l).await.unwrap();
    e.hold_job(&jobs[0]).await.unwrap();
    e.hold_job(&jobs[1]).await.unwrap();
    e.release_job(&jobs[1]).await.unwrap();
    assert!(
        matches!(e.release_job(&jobs[1]).await, Err(EngineError::Illegal(_))),
        "only Held jobs are released"
    );
    // Deleting a held job moves it to Deleted and out of batch-processing.
    let st = e.delete_job(&jobs[0]).await.unwrap().unwrap();
    assert_eq!(st.status, JobState::Deleted);
    let info = e.batch(&bid).await.unwrap();
    assert_eq!(info.jobs["batch-deleted"], vec![jobs[0].to_string()]);
    // A batch with a pending job cannot be deleted; its status stays.
    assert!(matches!(
        e.delete_batch(&bid).await,
        Err(EngineError::Illegal(_)) | Err(EngineError::Invalid(_))
    ));
    assert_eq!(
        e.batch(&bid).await.unwrap().status.status,
        BatchState::Processing
    );
    // Hold/release of a pending batch.
    let b2 = e.create_batch(Map::new()).await.unwrap();
    e.hold_batch(&b2).await.unwrap();
    assert!(matches!(
        e.hold_batch(&b2).await,
        Err(EngineError::Illegal(_))
    ));
    e.delete_batch(&b2).await.unwrap();
    assert_eq!(
        e.batch(&b2).await.unwrap().status.status,
        BatchState::Deleted
    );
}

pub async fn duplicate_batch_uuid_is_refused(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let mut sub = Map::new();
    sub.insert(
        "batchID".into(),
        json!("0b7e2a4e-1111-4222-8333-944445555666"),
    );
    let bid = e.create_batch(sub.clone()).await.unwrap();
    assert_eq!(
        e.batch_by_uuid("0b7e2a4e-1111-4222-8333-944445555666")
            .await
            .unwrap(),
        Some(bid)
    );
    let err = e.create_batch(sub).await.unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    assert_eq!(
        e.batch_ids().await.unwrap().len(),
        1,
        "no half-made batch left behind"
    );
}

/// A batch held because its collection is held (the acquisition path, not the admin's) gets
/// its `states` folders too, so Merritt's `Batch.acquirePendingBatch` passes it over.
pub async fn merritt_pending_scan_skips_a_batch_held_by_its_collection(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let mut sub = Map::new();
    sub.insert("collection".into(), json!("held_coll"));
    let bid = e.create_batch(sub).await.unwrap();
    e.hold_collection("held_coll").await.unwrap();
    assert!(
        e.acquire_batch(BatchState::Pending)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(e.batch(&bid).await.unwrap().status.status, BatchState::Held);
    assert!(s.tree.exists(&batch_states(&bid)).await.unwrap().is_some());
    for f in BATCH_FOLDERS {
        assert!(
            s.tree
                .exists(&batch_ref_folder(&bid, f))
                .await
                .unwrap()
                .is_some(),
            "{f}"
        );
    }
}

/// A Merritt consumer that took a Held batch for pending throws and keeps the batch's lock
/// (ephemeral, for as long as its process lives). Lading lists it as a foreign lock, names
/// it when an admin action meets it, and lets an admin clear it; a lock on a batch in any
/// other state is refused, and nothing else changes.
pub async fn merritt_failed_consumers_lock_on_a_held_batch_is_listed_and_cleared(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let (_m, merritt) = engine(h, "merritt").await;
    let bid = e.create_batch(Map::new()).await.unwrap();
    e.hold_batch(&bid).await.unwrap();
    // What Merritt's failed consumer leaves: its lock, made by its own session.
    merritt
        .tree
        .create(&batch_node(&bid, "lock"), None, CreateMode::Ephemeral)
        .await
        .unwrap();
    let locks = e.foreign_locks().await.unwrap();
    assert_eq!(locks.len(), 1, "{locks:?}");
    assert_eq!(
        (locks[0].kind, locks[0].name.as_str()),
        ("batch", bid.as_str())
    );
    let err = e.release_batch(&bid).await.unwrap_err();
    assert!(matches!(err, EngineError::ForeignLocked(_)), "{err}");
    assert!(err.to_string().contains("clear-lock batch"), "{err}");
    assert_eq!(e.batch(&bid).await.unwrap().status.status, BatchState::Held);
    // A completed batch's lock is never called foreign, nor cleared.
    let (done, _) = batch_with_jobs(&e, 0, &[]).await;
    let err = e
        .clear_foreign_lock("batch", done.as_str())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not Held"), "{err}");
    let err = e.clear_foreign_lock("batch", "nonsense").await.unwrap_err();
    assert!(err.to_string().contains("not a batch id"), "{err}");
    e.clear_foreign_lock("batch", bid.as_str()).await.unwrap();
    assert!(e.foreign_locks().await.unwrap().is_empty());
    e.release_batch(&bid).await.unwrap();
    let l = e.acquire_batch(BatchState::Pending).await.unwrap().unwrap();
    assert_eq!(l.batch, bid);
}

/// Merritt's `Batch.deleteCompletedBatches` deletes a completed batch, its jobs and its
/// `/batch-uuids` entry, knowing nothing of Lading's submitter index: the entry it leaves is
/// skipped by readers and pruned by cleanup.
pub async fn merritt_deleting_completed_batches_leaves_no_dangling_index(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let (bid, jobs) = batch_with_jobs(&e, 1, &[]).await;
    assert_eq!(e.batch_ids_of("tester").await.unwrap(), vec![bid.clone()]);
    // Merritt's deletion, node by node: each job's subtree and state reference, then the
    // batch's subtree and its uuid entry.
    let mut doomed = Vec::new();
    let dump = lading_engine::dump(s.tree.as_ref(), &format!("/batches/{bid}"))
        .await
        .unwrap();
    for j in &jobs {
        let jd = lading_engine::dump(s.tree.as_ref(), &format!("/jobs/{j}"))
            .await
            .unwrap();
        doomed.extend(jd.keys().cloned());
        for st in s.tree.children("/jobs/states").await.unwrap() {
            for r in s
                .tree
                .children(&format!("/jobs/states/{st}"))
                .await
                .unwrap()
            {
                if r.ends_with(j.as_str()) {
                    s.tree
                        .delete(&format!("/jobs/states/{st}/{r}"), None)
                        .await
                        .unwrap();
                }
            }
        }
    }
    doomed.extend(dump.keys().cloned());
    doomed.sort_by_key(|p| std::cmp::Reverse(p.matches('/').count()));
    for p in doomed {
        s.tree.delete(&p, None).await.unwrap();
    }
    assert!(e.batch_ids().await.unwrap().is_empty(), "the batch is gone");
    for u in s.tree.children(BATCH_UUIDS).await.unwrap() {
        s.tree
            .delete(&format!("{BATCH_UUIDS}/{u}"), None)
            .await
            .unwrap();
    }
    // The index still names it; readers skip it; pruning drops it, once.
    assert_eq!(e.batch_ids_of("tester").await.unwrap(), vec![bid.clone()]);
    assert!(matches!(e.batch(&bid).await, Err(EngineError::NoBatch(_))));
    assert_eq!(e.prune_submitter_index().await.unwrap(), 1);
    assert!(e.batch_ids_of("tester").await.unwrap().is_empty());
    assert_eq!(e.prune_submitter_index().await.unwrap(), 0);
    // A live batch's entry stays.
    let (live, _) = batch_with_jobs(&e, 1, &[]).await;
    assert_eq!(e.prune_submitter_index().await.unwrap(), 0);
    assert_eq!(e.batch_ids_of("tester").await.unwrap(), vec![live]);
}

/// An access request Merritt's own service made (its token names no `ark`) is left for it:
/// Lading's access workers take only their own.
pub async fn merritt_access_requests_are_left_to_merritt(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let merritt = e
        .create_access(
            AccessQueue::Small,
            &json!({"token": "4c0ffee0-0000-4000-8000-000000000001", "delivery-node": 7777,
                    "cloud-content-byte": 12, "status": 202, "url": "https://example.org/t",
                    "anticipated-availability-time": "2026-11-24T10:00:00-08:00"}),
        )
        .await
        .unwrap();
    assert!(
        e.acquire_access(AccessQueue::Small)
            .await
            .unwrap()
            .is_none()
    );
    let ours = e
        .create_access(
            AccessQueue::Small,
            &json!({"ark": "ark:/99999/fk4x", "version": 1}),
        )
        .await
        .unwrap();
    let l = e.acquire_access(AccessQueue::Small).await.unwrap().unwrap();
    assert_eq!(l.id, ours, "Lading's own request, past Merritt's");
    let l = e.access_advance(l, Event::Success).await.unwrap();
    e.access_transition(l, Event::Success, None).await.unwrap();
    let info = e.access(AccessQueue::Small, &merritt).await.unwrap();
    assert_eq!(info.status.status, lading_core::AccessState::Pending);
    assert!(!info.locked);
}

/// A request's node and its status are two commits: a waiting access worker that saw the
/// node first is woken by the status, not by a timer.
pub async fn access_waiter_is_woken_by_a_request_still_being_made(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let path = s
        .tree
        .create(
            &format!("{}/qid", access_folder(AccessQueue::Small)),
            None,
            CreateMode::PersistentSequential,
        )
        .await
        .unwrap();
    let waiter = {
        let e = e.clone();
        tokio::spawn(async move {
            e.wait_access(AccessQueue::Small, Duration::from_secs(600))
                .await
        })
    };
    // The waiter has seen the half-made request (its watch on the status is set) once it
    // is parked; then the second commit lands.
    tokio::task::yield_now().await;
    let status = json!({"status": "Pending", "last_modified": "2026-11-24 10:00:00 +0000",
                        "message": ""});
    s.tree
        .multi(vec![
            Op::create(
                format!("{path}/token"),
                Some(
                    json!({"ark": "ark:/99999/fk4x", "version": 1})
                        .to_string()
                        .into(),
                ),
            ),
            Op::create(format!("{path}/status"), Some(status.to_string().into())),
        ])
        .await
        .unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("woken by the status, long before its own timeout")
        .unwrap()
        .unwrap()
        .expect("the request, taken");
    assert_eq!(lease.token["ark"], "ark:/99999/fk4x");
}

pub async fn access_requests_move_through_their_states(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let id = e
        .create_access(
            AccessQueue::Small,
            &json!({"ark": "ark:/99999/fk4x", "version": 1}),
        )
        .await
        .unwrap();
    e.pause_queue("accessSmall").await.unwrap();
    assert!(
        e.acquire_access(AccessQueue::Small)
            .await
            .unwrap()
            .is_none()
    );
    e.resume_queue("accessSmall").await.unwrap();
    assert!(
        e.acquire_access(AccessQueue::Large)
            .await
            .unwrap()
            .is_none()
    );
    let l = e.acquire_access(AccessQueue::Small).await.unwrap().unwrap();
    assert_eq!(l.token["ark"], "ark:/99999/fk4x");
    let l = e.access_advance(l, Event::Success).await.unwrap();
    assert_eq!(l.status.status, lading_core::AccessState::Processing);
    e.access_transition(l, Event::Success, None).await.unwrap();
    let info = e.access(AccessQueue::Small, &id).await.unwrap();
    assert_eq!(info.status.status, lading_core::AccessState::Completed);
    assert!(!info.locked);
}

pub async fn ark_locks_are_exclusive_and_end_with_the_session(h: &dyn Harness) {
    let (e1, s1) = engine(h, "a").await;
    let (e2, _s2) = engine(h, "b").await;
    let lock = e1.lock_storage("ark:/13030/m5abc").await.unwrap();
    assert!(
        matches!(e2.lock_storage("ark:/13030/m5abc").await, Err(EngineError::Locked(p)) if p == "/locks/storage/ark_13030_m5abc")
    );
    let inv = e2.lock_inventory("ark:/13030/m5abc").await.unwrap();
    e1.unlock_ark(lock).await.unwrap();
    let again = e2.lock_storage("ark:/13030/m5abc").await.unwrap();
    e2.unlock_ark(again).await.unwrap();
    e2.unlock_ark(inv).await.unwrap();
    let _held = e1.lock_storage("ark:/1/x").await.unwrap();
    (s1.expire)().await;
    assert!(
        e2.lock_storage("ark:/1/x").await.is_ok(),
        "a dead session's ark lock is gone"
    );
}

/// A tree that counts the calls made through it, to measure cost in round trips.
pub struct CountingTree {
    inner: Arc<dyn Tree>,
    pub calls: std::sync::atomic::AtomicUsize,
}

impl CountingTree {
    fn bump(&self) {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    pub fn calls(&self) -> usize {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Tree for CountingTree {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn session_id(&self) -> u64 {
        self.inner.session_id()
    }
    fn get<'a>(
        &'a self,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Option<lading_core::Node>, TreeError>> {
        self.bump();
        self.inner.get(path)
    }
    fn exists<'a>(
        &'a self,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Option<lading_core::Stat>, TreeError>> {
        self.bump();
        self.inner.exists(path)
    }
    fn children<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<String>, TreeError>> {
        self.bump();
        self.inner.children(path)
    }
    fn children_page<'a>(
        &'a self,
        path: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, TreeError>> {
        self.bump();
        self.inner.children_page(path, after, limit)
    }
    fn count_children<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<u64, TreeError>> {
        self.bump();
        self.inner.count_children(path)
    }
    fn multi(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<Vec<OpResult>, TreeError>> {
        self.bump();
        self.inner.multi(ops)
    }
    fn watch<'a>(
        &'a self,
        path: &'a str,
        kind: WatchKind,
    ) -> BoxFuture<'a, Result<lading_core::Watch, TreeError>> {
        self.inner.watch(path, kind)
    }
    fn close(&self) -> BoxFuture<'_, Result<(), TreeError>> {
        self.inner.close()
    }
}

/// Round trips one acquisition costs with `queued` other jobs queued behind the head.
async fn acquisition_round_trips(h: &dyn Harness, queued: u32) -> usize {
    let s = h.open().await;
    let counting = Arc::new(CountingTree {
        inner: s.tree.clone(),
        calls: Default::default(),
    });
    let e = Engine::new(counting.clone(), system_clock(), "counter");
    e.init().await.unwrap();
    // Queue references directly (cheaper than whole jobs) behind one real job at the head.
    let folder = job_state_folder(JobState::Pending);
    let names: Vec<u32> = (0..queued).collect();
    for chunk in names.chunks(500) {
        let ops = chunk
            .iter()
            .map(|i| Op::create(format!("{folder}/50-jid9{queued:05}{i:06}"), None))
            .collect();
        s.tree.multi(ops).await.unwrap();
    }
    let b = e.create_batch(Map::new()).await.unwrap();
    let lease = e.acquire_batch(BatchState::Pending).await.unwrap().unwrap();
    assert_eq!(lease.batch, b);
    let jid = e
        .create_job(
            &lease,
            JobSpec {
                priority: Some(1),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    e.batch_transition(lease, Event::To(BatchState::Processing), None)
        .await
        .unwrap();
    let before = counting.calls();
    let got = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    let cost = counting.calls() - before;
    assert_eq!(got.job, jid, "the head of the queue is found");
    assert!(e.job_counts().await.unwrap()[&JobState::Pending] > queued as u64);
    e.job_transition(got, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    cost
}

pub async fn acquisition_cost_does_not_grow_with_the_queue(h: &dyn Harness) {
    let small = acquisition_round_trips(h, 100).await;
    let large = acquisition_round_trips(h, 3000).await;
    assert_eq!(
        small, large,
        "round trips per acquisition: {small} with 100 queued, {large} with 3,000"
    );
    assert!(small <= 8, "acquisition takes {small} round trips");
}

/// Instantiates every conformance test for a backend. `$make` is an expression that yields a
/// fresh `impl Harness` (a new, empty store) each time it is evaluated.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            tree_nodes_have_versions_and_sorted_children,
            tree_sequential_names_have_ten_digits_and_increase,
            tree_children_page_reads_the_head_in_order,
            multi_is_all_or_nothing,
            ephemeral_nodes_end_with_their_session,
            watches_fire_on_changes,
            job_walks_the_pipeline_and_the_tree_matches_the_layout,
            merritt_transitions_change_exactly_the_documented_nodes,
            illegal_transition_is_refused_and_changes_nothing,
            unknown_ids_get_typed_errors,
            corrupt_node_is_named_and_nothing_changes,
            acquisition_follows_priority_then_age,
            set_priority_moves_the_reference,
            concurrent_workers_each_job_handed_to_exactly_one,
            lost_lease_cannot_commit_transition,
            moving_a_job_can_lock_the_next_in_the_same_multi,
            stale_lease_after_a_takeover_is_lost,
            a_worker_whose_session_expired_can_acquire_again,
            batch_reports_exactly_once_when_jobs_finish_concurrently,
            requeue_returns_a_failed_job_to_the_stage_that_failed,
            report_and_update_reporting,
            requeue_at_every_batch_state_reports_again,
            a_reporter_that_loses_its_batch_to_a_requeue_records_nothing,
            outbox_entries_are_claimed_once_retried_and_deleted_when_delivered,
            deleting_the_last_failed_job_says_an_update_report_is_due,
            concurrent_admissions_never_reserve_more_than_is_free,
            merritt_lazily_made_batch_folders_are_created_by_the_move,
            merritt_pending_scan_skips_a_held_batch,
            merritt_pending_scan_skips_a_batch_held_by_its_collection,
            merritt_failed_consumers_lock_on_a_held_batch_is_listed_and_cleared,
            merritt_deleting_completed_batches_leaves_no_dangling_index,
            merritt_last_successful_failed_still_requeues_to_the_stage_that_failed,
            deferred_job_is_not_taken_before_its_retry_time,
            held_collection_holds_batches_and_jobs_until_released,
            paused_queue_hands_out_nothing,
            batch_worker_is_woken_when_a_batch_needs_reporting,
            waiting_worker_is_woken_by_new_work,
            admin_actions_respect_locks_and_the_table,
            duplicate_batch_uuid_is_refused,
            access_requests_move_through_their_states,
            access_waiter_is_woken_by_a_request_still_being_made,
            merritt_access_requests_are_left_to_merritt,
            ark_locks_are_exclusive_and_end_with_the_session,
            acquisition_cost_does_not_grow_with_the_queue,
            generic_jobs_walk_their_states_in_their_own_subtree,
            generic_jobs_racing_acceptors_hold_each_job_alone,
            generic_jobs_finish_then_accept_claims_the_next_job,
            generic_jobs_stale_processor_is_fenced,
            generic_jobs_scheduled_later_are_not_accepted_early,
            generic_jobs_resubmit_while_running_runs_again,
            generic_jobs_removed_while_running_halt_the_processor,
            generic_jobs_activity_monitor_requeues_a_stalled_job_once,
            generic_jobs_subscribers_see_each_state_change,
            generic_jobs_unused_subscriptions_expire,
            generic_jobs_waiting_acceptor_is_woken_by_an_add,
            generic_jobs_waiting_acceptors_share_out_a_burst,
        );
    };
    (@each $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness = $make;
                $crate::$name(&harness).await;
            }
        )*
    };
}
