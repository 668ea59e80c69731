//! The quota sweep on both real backends (a SQLite file and a ZooKeeper server): it gives
//! back only the slots of finished jobs, drops folders left empty, and never loses a
//! reservation made while it runs.

use lading_core::time::system_clock;
use lading_core::{BatchState, Event, JobState, Tree};
use lading_engine::{Engine, JobSpec};
use lading_ingest::quota::{self, Slot};
use lading_store_sqlite::{SqliteOptions, SqliteTree};
use std::sync::Arc;

async fn engine(tree: Arc<dyn Tree>) -> Arc<Engine> {
    let e = Arc::new(Engine::new(tree, system_clock(), "tester"));
    e.init().await.unwrap();
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_the_sweep_gives_back_finished_slots_only_and_races_no_reservation() {
    let dir = tempfile::tempdir().unwrap();
    let tree = SqliteTree::open(dir.path().join("lading.db"), SqliteOptions::default()).unwrap();
    the_sweep_gives_back_finished_slots_only_and_races_no_reservation(Arc::new(tree)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_the_sweep_gives_back_finished_slots_only_and_races_no_reservation() {
    let zk = lading_testkit::zk::ZkServer::start().expect("start ZooKeeper");
    let hosts = zk.connect_string();
    lading_store_zk::ZkTree::ensure_chroot(&hosts, "/quota")
        .await
        .unwrap();
    let url = format!("zk://{hosts}/quota");
    let tree = lading_store_zk::ZkTree::open(&url, lading_store_zk::ZkOptions::default())
        .await
        .unwrap();
    the_sweep_gives_back_finished_slots_only_and_races_no_reservation(Arc::new(tree)).await;
}

/// A batch with `n` Pending jobs.
async fn jobs(e: &Engine, n: usize) -> Vec<lading_core::layout::JobId> {
    let mut sub = serde_json::Map::new();
    sub.insert("profile_name".into(), "p".into());
    let bid = e.create_batch(sub.try_into().unwrap()).await.unwrap();
    let lease = e.acquire_batch(BatchState::Pending).await.unwrap().unwrap();
    assert_eq!(lease.batch, bid);
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(e.create_job(&lease, JobSpec::default()).await.unwrap());
    }
    e.release_batch_lease(lease).await.unwrap();
    out
}

async fn the_sweep_gives_back_finished_slots_only_and_races_no_reservation(tree: Arc<dyn Tree>) {
    let e = engine(tree).await;
    let t = e.tree().clone();
    assert_eq!(
        quota::sweep(&e).await.unwrap(),
        0,
        "nothing to sweep, no /quotas"
    );
    let ids = jobs(&e, 17).await;

    // Reservations race with sweeps: every granted slot of a live job survives.
    let mut tasks = Vec::new();
    for (i, j) in ids.iter().take(16).enumerate() {
        let (e, j) = (e.clone(), j.clone());
        tasks.push(tokio::spawn(async move {
            quota::reserve(&e, "p", &format!("s{}", i % 4), &j, 100, None)
                .await
                .unwrap()
        }));
    }
    let sweeper = {
        let e = e.clone();
        tokio::spawn(async move {
            let mut n = 0;
            for _ in 0..50 {
                n += quota::sweep(&e).await.unwrap();
                tokio::task::yield_now().await;
            }
            n
        })
    };
    for t in tasks {
        assert_eq!(t.await.unwrap(), Slot::Granted);
    }
    sweeper.await.unwrap();
    for (i, j) in ids.iter().take(16).enumerate() {
        let slot = format!("/quotas/p/s{}/{j}", i % 4);
        assert!(t.exists(&slot).await.unwrap().is_some(), "{slot} was lost");
    }
    assert_eq!(
        quota::sweep(&e).await.unwrap(),
        0,
        "live jobs keep their slots"
    );

    // One job fails (finished): its slot goes, the others stay; a slot of a job that never existed
    // goes too.
    let lease = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    let done = lease.job.clone();
    e.job_transition(lease, Event::Fail, Some("failed for the test".into()))
        .await
        .unwrap();
    assert_eq!(
        quota::reserve(&e, "p", "ghost", &ids[16], 1, None)
            .await
            .unwrap(),
        Slot::Granted
    );
    e.tree()
        .multi(vec![lading_core::Op::delete(
            format!("/quotas/p/ghost/{}", ids[16]),
            None,
        )])
        .await
        .unwrap();
    t.create(
        "/quotas/p/ghost/not-a-job",
        None,
        lading_core::CreateMode::Persistent,
    )
    .await
    .unwrap();
    let n = quota::sweep(&e).await.unwrap();
    assert_eq!(
        n,
        1 + 2,
        "the finished job's slot, the ghost's slot and its folder"
    );
    let held: usize = slots_held(&t, &["s0", "s1", "s2", "s3"]).await;
    assert_eq!(held, 15);
    assert!(t.exists("/quotas/p/ghost").await.unwrap().is_none());
    let i = ids.iter().position(|j| *j == done).unwrap();
    assert!(
        t.exists(&format!("/quotas/p/s{}/{done}", i % 4))
            .await
            .unwrap()
            .is_none()
    );
}

async fn slots_held(t: &Arc<dyn Tree>, subs: &[&str]) -> usize {
    let mut n = 0;
    for s in subs {
        n += t.children(&format!("/quotas/p/{s}")).await.unwrap().len();
    }
    n
}

/// A tree that, once armed, lets a sweep remove the profile's empty folder just before a
/// reservation creates the submitter's folder in it: the interleaving that made
/// `quota::reserve` fail with `NoNode("/quotas/p/s0")` on ZooKeeper.
struct SweptBetween {
    inner: Arc<dyn Tree>,
    armed: std::sync::atomic::AtomicBool,
}

impl Tree for SweptBetween {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn session_id(&self) -> u64 {
        self.inner.session_id()
    }
    fn get<'a>(&'a self, path: &'a str) -> lading_core::TreeFuture<'a, Option<lading_core::Node>> {
        self.inner.get(path)
    }
    fn children<'a>(&'a self, path: &'a str) -> lading_core::Names<'a> {
        self.inner.children(path)
    }
    fn children_page<'a>(
        &'a self,
        path: &'a str,
        after: Option<&'a str>,
        max: usize,
    ) -> lading_core::Names<'a> {
        self.inner.children_page(path, after, max)
    }
    fn count_children<'a>(&'a self, path: &'a str) -> lading_core::TreeFuture<'a, u64> {
        self.inner.count_children(path)
    }
    fn multi(
        &self,
        ops: Vec<lading_core::Op>,
    ) -> lading_core::TreeFuture<'_, Vec<lading_core::OpResult>> {
        Box::pin(async move {
            let creates_submitter = matches!(ops.as_slice(),
                [lading_core::Op::Create { path, .. }] if path == "/quotas/p/s0");
            if creates_submitter && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
                // The sweep's own removal of the empty profile folder, in between.
                self.inner.delete("/quotas/p", None).await?;
            }
            self.inner.multi(ops).await
        })
    }
    fn multi_on(
        &self,
        session: u64,
        ops: Vec<lading_core::Op>,
    ) -> lading_core::TreeFuture<'_, Vec<lading_core::OpResult>> {
        self.inner.multi_on(session, ops)
    }
    fn watch<'a>(
        &'a self,
        path: &'a str,
        kind: lading_core::tree::WatchKind,
    ) -> lading_core::TreeFuture<'a, lading_core::Watch> {
        self.inner.watch(path, kind)
    }
    fn close(&self) -> lading_core::TreeFuture<'_, ()> {
        self.inner.close()
    }
}

/// Issue 58, item 10: a reservation survives a sweep that removes the folder above the one it
/// is making (the create of the removed parent is tried again), on a real ZooKeeper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_a_reservation_survives_a_sweep_removing_its_parent_folder_meanwhile() {
    let zk = lading_testkit::zk::ZkServer::start().expect("start ZooKeeper");
    let hosts = zk.connect_string();
    lading_store_zk::ZkTree::ensure_chroot(&hosts, "/quota-race")
        .await
        .unwrap();
    let url = format!("zk://{hosts}/quota-race");
    let inner: Arc<dyn Tree> = Arc::new(
        lading_store_zk::ZkTree::open(&url, lading_store_zk::ZkOptions::default())
            .await
            .unwrap(),
    );
    let tree = Arc::new(SweptBetween {
        inner: inner.clone(),
        armed: std::sync::atomic::AtomicBool::new(false),
    });
    let e = engine(tree.clone()).await;
    let ids = jobs(&e, 1).await;
    // `/quotas/p` exists and is empty, as a sweep may find it.
    for p in ["/quotas", "/quotas/p"] {
        let _ = inner
            .create(p, None, lading_core::CreateMode::Persistent)
            .await;
    }
    tree.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let slot = quota::reserve(&e, "p", "s0", &ids[0], 1, None)
        .await
        .unwrap();
    assert_eq!(slot, Slot::Granted);
    assert!(
        !tree.armed.load(std::sync::atomic::Ordering::SeqCst),
        "the sweep ran in between"
    );
    assert_eq!(
        inner.children("/quotas/p/s0").await.unwrap(),
        [ids[0].to_string()],
        "the slot is held"
    );
}

/// A park is one write once its submitter's folder exists (it made each folder from the root
/// before, each refused but the new ones); the first park makes the folders it needs, and a
/// park of a folder a sweep removed makes it again.
#[tokio::test]
async fn a_park_is_one_write_once_its_folder_exists() {
    let dir = tempfile::tempdir().unwrap();
    let tree = SqliteTree::open(dir.path().join("lading.db"), SqliteOptions::default()).unwrap();
    let counting = lading_store_tests::CountingTree::over(Arc::new(tree));
    let e = engine(counting.clone()).await;
    let t = e.tree().clone();
    let ids = jobs(&e, 3).await;
    let before = counting.writes();
    quota::park(&e, "p", "s0", &ids[0], None).await.unwrap();
    // The park, refused (no folder); /quota-waiters/p/s0 refused too (no parent); then
    // /quota-waiters, /quota-waiters/p, /quota-waiters/p/s0 made from the root; the park.
    assert_eq!(counting.writes() - before, 6, "the first park");
    let before = counting.writes();
    quota::park(&e, "p", "s0", &ids[1], None).await.unwrap();
    assert_eq!(
        counting.writes() - before,
        1,
        "a park under an existing folder"
    );
    // Parked twice: the second is a no-op that changes nothing.
    quota::park(&e, "p", "s0", &ids[1], None).await.unwrap();
    let mut parked = t.children("/quota-waiters/p/s0").await.unwrap();
    parked.sort();
    assert_eq!(parked, [ids[0].to_string(), ids[1].to_string()]);
    // Another submitter of the same profile: its folder only.
    let before = counting.writes();
    quota::park(&e, "p", "s1", &ids[2], None).await.unwrap();
    assert_eq!(
        counting.writes() - before,
        3,
        "the park, its folder, the park"
    );
    assert_eq!(
        t.children("/quota-waiters/p/s1").await.unwrap(),
        [ids[2].to_string()]
    );
}
