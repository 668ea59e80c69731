//! What a store that fails for good leaves of its version on a real SeaweedFS bucket: only
//! its own bytes are removed, and nothing at all once its lease is lost (the files are then
//! its successor's).

#[macro_use]
mod common;

use common::World;
use common::nodes::*;
use lading_core::JobState;
use lading_core::layout::JobId;
use lading_core::tree::BoxFuture;
use lading_ingest::nodes::Node;
use lading_testkit::seaweed::Weed;
use lading_worker::{JobCtx, JobStage, Outcome};
use std::sync::Arc;

/// A job in Storing whose version 1 holds what another job storing the same ark left there
/// meanwhile (f0 and f1 with its bytes) and one file of its own (f2), with progress saying
/// it wrote f0 and f2: its store meets another's bytes and fails for good.
struct Stage {
    w: World,
    _weed: Weed,
    nodes: Vec<lading_ingest::nodes::NodeSettings>,
    primary: Node,
    job: JobId,
    ark: String,
}

async fn a_job_whose_version_holds_another_jobs_bytes() -> Stage {
    let w = World::new().await;
    let weed = Weed::start().unwrap();
    weed.bucket("primary").unwrap();
    let nodes = vec![node(9501, &weed, "primary")];
    w.profile("s3", "collection = \"demo\"\nstorage_nodes = [9501]\n");
    let ingest = ingest_with(&w, nodes.clone()).unwrap();
    let files: [(&str, &[u8]); 3] = [
        ("f0.bin", b"mine 0\n"),
        ("f1.bin", b"mine 1\n"),
        ("f2.bin", b"mine 2\n"),
    ];
    let m = w.object_manifest("o.checkm", &files);
    let bid = w
        .submit_as(&ingest, "s3", "depositor", &m, "manifest")
        .await;
    let storing = lading_ingest::STAGE_NAMES
        .iter()
        .position(|s| *s == "storing");
    let run = w.run_stages(&ingest, &lading_ingest::STAGE_NAMES[..storing.unwrap()]);
    let job = w.first_job(&bid).await;
    w.job_reaches(&job, JobState::Storing).await;
    run.stop().await;
    let ark = w
        .engine
        .job(&job)
        .await
        .unwrap()
        .identifiers
        .primary_id
        .unwrap();
    let primary = Node::open(&nodes[0], env).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (rel, bytes) in [
        ("f0.bin", &b"theirs 0\n"[..]),
        ("f1.bin", b"theirs 1\n"),
        ("f2.bin", b"mine 2\n"),
    ] {
        let src = dir.path().join(rel);
        std::fs::write(&src, bytes).unwrap();
        let key = format!("producer/{rel}");
        primary.replace(&ark, 1, &key, &src).await.unwrap();
    }
    let progress = serde_json::json!({
        "node": 9501,
        "version": 1,
        "confirmed": ["producer/f0.bin", "producer/f2.bin"],
        "written": ["producer/f0.bin", "producer/f2.bin"],
    });
    w.engine
        .tree()
        .create(
            &lading_core::layout::job_node(&job, "store-progress"),
            Some(serde_json::to_vec(&progress).unwrap()),
            lading_core::CreateMode::Persistent,
        )
        .await
        .unwrap();
    Stage {
        w,
        _weed: weed,
        nodes,
        primary,
        job,
        ark,
    }
}

impl Stage {
    /// The SHA-256 `producer/{rel}` of version 1 holds on the primary, if any.
    async fn holds(&self, rel: &str) -> Option<String> {
        let c = self
            .primary
            .digest(&self.ark, 1, &format!("producer/{rel}"), None)
            .await;
        c.unwrap().map(|c| c.sha256)
    }
}

/// A store that fails for good removes what it wrote of its version (which has no record),
/// but only keys that still hold its own bytes: one it once wrote that holds another job's
/// bytes of the same ark and version by now stays, as does the other job's file it found in
/// its way (found by `lading-sim`, seed 5017358: the removal, slow to land, came after the
/// other job's commit, and a stored version lost a file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_store_removes_only_keys_that_hold_its_own_bytes() {
    let s = a_job_whose_version_holds_another_jobs_bytes().await;
    let ingest = ingest_with(&s.w, s.nodes.clone()).unwrap();
    let run = s.w.run_stages(&ingest, &["storing"]);
    s.w.job_reaches(&s.job, JobState::Failed).await;
    run.stop().await;
    let why =
        s.w.engine
            .job(&s.job)
            .await
            .unwrap()
            .status
            .message
            .unwrap();
    assert!(why.contains("already holds other bytes"), "{why}");
    assert_eq!(
        s.holds("f0.bin").await,
        Some(sha256(b"theirs 0\n")),
        "another job's bytes removed"
    );
    assert_eq!(s.holds("f1.bin").await, Some(sha256(b"theirs 1\n")));
    assert_eq!(s.holds("f2.bin").await, None, "its own bytes left behind");
}

/// Runs the real store once with the job's lock gone first (its session ended under the
/// handler, as an expiry or a long pause does), and says how that run ended; later runs
/// wait, so nothing else touches the version.
struct LosesItsLease {
    real: Arc<dyn JobStage>,
    engine: Arc<lading_engine::Engine>,
    ended: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<String>>>,
}

impl JobStage for LosesItsLease {
    fn state(&self) -> JobState {
        self.real.state()
    }
    fn run(&self, job: Arc<JobCtx>) -> BoxFuture<'static, Outcome> {
        let tx = self.ended.lock().unwrap().take();
        let (real, engine) = (self.real.clone(), self.engine.clone());
        Box::pin(async move {
            let Some(tx) = tx else {
                return Outcome::Wait {
                    after: std::time::Duration::from_secs(3600),
                    reason: "the test looks".into(),
                };
            };
            let lock = lading_core::layout::job_node(job.job(), "lock");
            engine.tree().delete(&lock, None).await.unwrap();
            let outcome = real.run(job).await;
            let _ = tx.send(format!("{outcome:?}"));
            outcome
        })
    }
}

/// Wraps the Storing stage of a process in [`LosesItsLease`].
struct Wrap {
    engine: Arc<lading_engine::Engine>,
    ended: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<String>>>,
}

impl lading_ingest::StageWrap for Wrap {
    fn job(&self, real: Arc<dyn JobStage>) -> Arc<dyn JobStage> {
        if real.state() != JobState::Storing {
            return real;
        }
        Arc::new(LosesItsLease {
            real,
            engine: self.engine.clone(),
            ended: std::sync::Mutex::new(self.ended.lock().unwrap().take()),
        })
    }
    fn batch(
        &self,
        real: Arc<dyn lading_worker::BatchStage>,
    ) -> Arc<dyn lading_worker::BatchStage> {
        real
    }
}

/// The same failure in a handler whose lease was lost removes nothing: the same job's
/// successor may already have found these very bytes in place and counted them as stored
/// (found by `lading-sim --nodes 4`, seed 512: a stale handler's removal landed after its
/// successor had counted the file, and the version was recorded without it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_lost_its_lease_removes_nothing_when_it_fails() {
    let s = a_job_whose_version_holds_another_jobs_bytes().await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let wrap = Wrap {
        engine: s.w.engine.clone(),
        ended: std::sync::Mutex::new(Some(tx)),
    };
    let ingest = ingest_with(&s.w, s.nodes.clone()).unwrap();
    let ingest = Arc::new(
        Arc::try_unwrap(ingest)
            .ok()
            .expect("one owner")
            .with_stage_wrap(Arc::new(wrap)),
    );
    let run = s.w.run_stages(&ingest, &["storing"]);
    let ended = rx.await.unwrap();
    assert!(ended.contains("already holds other bytes"), "{ended}");
    assert_eq!(
        s.holds("f2.bin").await,
        Some(sha256(b"mine 2\n")),
        "removed without the lease"
    );
    assert_eq!(s.holds("f0.bin").await, Some(sha256(b"theirs 0\n")));
    run.stop().await;
    let status = s.w.engine.job(&s.job).await.unwrap().status;
    assert_eq!(
        status.status,
        JobState::Storing,
        "the lost lease recorded nothing"
    );
}
