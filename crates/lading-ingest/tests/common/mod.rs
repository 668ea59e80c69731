//! What the pipeline tests share: a store, a config, profiles, a payload server and an SMTP
//! receiver, all real and on loopback, in a temporary directory.

#![allow(dead_code)]

/// Runs a test body on both stores: `NAME::on_sqlite` and `NAME::on_zookeeper`.
#[allow(unused_macros)]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                use super::*;
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn on_sqlite() {
                    super::$name(World::on(Backend::Sqlite).await).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn on_zookeeper() {
                    super::$name(World::on(Backend::ZooKeeper).await).await;
                }
            }
        )*
    };
}

pub mod bags;
pub mod nodes;

use lading_core::Tree;
use lading_core::layout::{BatchId, JobId};
use lading_core::time::system_clock;
use lading_core::{BatchState, JobState};
use lading_engine::Engine;
use lading_ingest::checkm::{self, ManifestKind};
use lading_ingest::fetch::Hasher;
use lading_ingest::{Config, Ingest, Submission};
use lading_store_sqlite::{SqliteOptions, SqliteTree};
use lading_testkit::payload_server::PayloadServer;
use lading_worker::{Shutdown, ShutdownHandle};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The stages up to a job's download: run alone, they leave jobs waiting in Processing.
pub const EARLY: &[&str] = &[
    "intake",
    "pending",
    "estimating",
    "provisioning",
    "downloading",
];

pub const WAIT: Duration = Duration::from_secs(60);

/// The store a [`World`] runs on.
#[derive(Debug, Clone, Copy)]
pub enum Backend {
    Sqlite,
    /// A real ZooKeeper server (one per test binary), a fresh chroot per world.
    ZooKeeper,
}

fn zk_server() -> &'static lading_testkit::zk::ZkServer {
    static SERVER: std::sync::OnceLock<lading_testkit::zk::ZkServer> = std::sync::OnceLock::new();
    SERVER.get_or_init(|| lading_testkit::zk::ZkServer::start().expect("start ZooKeeper"))
}

pub struct World {
    pub backend: Backend,
    /// The store's address: the SQLite file, or `zk://HOSTS/CHROOT`.
    pub store: String,
    pub dir: tempfile::TempDir,
    pub engine: Arc<Engine>,
    pub server: PayloadServer,
    pub smtp: Smtp,
    pub cfg: Config,
}

impl World {
    pub async fn new() -> World {
        World::on(Backend::Sqlite).await
    }

    pub async fn on(backend: Backend) -> World {
        let dir = tempfile::tempdir().unwrap();
        let store = match backend {
            Backend::Sqlite => dir.path().join("lading.db").display().to_string(),
            Backend::ZooKeeper => {
                let hosts = zk_server().connect_string();
                let name = dir.path().file_name().unwrap().to_string_lossy();
                let chroot = format!("/t-{}", name.trim_start_matches('.'));
                lading_store_zk::ZkTree::ensure_chroot(&hosts, &chroot)
                    .await
                    .unwrap();
                format!("zk://{hosts}{chroot}")
            }
        };
        let tree = open_tree(backend, &store).await;
        let engine = Arc::new(Engine::new(tree, system_clock(), "pipeline-test"));
        engine.init().await.unwrap();
        std::fs::create_dir_all(dir.path().join("payload")).unwrap();
        let server = PayloadServer::start(dir.path().join("payload"))
            .await
            .unwrap();
        let smtp = Smtp::start().await;
        let mut cfg = Config {
            data_dir: dir.path().join("data"),
            smtp_host: Some("127.0.0.1".into()),
            smtp_port: smtp.port,
            reserve_bytes: 0,
            unestimated_min_free_bytes: 0,
            provisioning_round_ms: 200,
            report_settle_s: 0,
            file_attempts: 2,
            ..Config::default()
        };
        for s in lading_ingest::STAGE_NAMES {
            cfg.stages.insert(
                s.to_string(),
                lading_ingest::config::StageSettings {
                    concurrency: Some(2),
                    timeout_s: Some(60),
                    max_attempts: Some(3),
                    backoff_base_ms: Some(50),
                    backoff_max_ms: Some(200),
                },
            );
        }
        cfg.stages.insert(
            "outbox".into(),
            lading_ingest::config::StageSettings {
                concurrency: Some(2),
                timeout_s: Some(10),
                max_attempts: Some(3),
                backoff_base_ms: Some(50),
                backoff_max_ms: Some(200),
            },
        );
        std::fs::create_dir_all(cfg.profiles_dir()).unwrap();
        std::fs::create_dir_all(cfg.work_dir()).unwrap();
        let w = World {
            backend,
            store,
            dir,
            engine,
            server,
            smtp,
            cfg,
        };
        w.profile(
            "demo",
            &format!(
                "collection = \"demo\"\nnotification = [\"depositor@example.org\"]\ncallback_url = \"{}\"\n",
                w.server.callback_url()
            ),
        );
        w
    }

    /// A second session on the same store, as another tool (Merritt's) would have.
    pub async fn other_session(&self) -> Arc<dyn Tree> {
        open_tree(self.backend, &self.store).await
    }

    /// Another host on the same store: its own store session, data and working folders, and
    /// the storage root and inventory shared with this world's (as a network file system
    /// would share them).
    pub async fn other_host(&self, name: &str) -> Arc<Ingest> {
        let engine = Arc::new(Engine::new(
            self.other_session().await,
            system_clock(),
            name,
        ));
        engine.init().await.unwrap();
        let cfg = Config {
            data_dir: self.dir.path().join(name),
            storage_root: Some(self.cfg.storage_root()),
            inventory: Some(self.cfg.inventory().setting()),
            profiles_dir: Some(self.cfg.profiles_dir()),
            ..self.cfg.clone()
        };
        std::fs::create_dir_all(cfg.work_dir()).unwrap();
        Ingest::new(engine, cfg)
    }

    /// Runs the named stages of `ingest` in a task; returns the handle that stops it.
    pub fn run_stages(&self, ingest: &Arc<Ingest>, names: &[&'static str]) -> Running {
        let (handle, shutdown) = Shutdown::new();
        let (i, names) = (ingest.clone(), names.to_vec());
        let task = tokio::spawn(async move {
            lading_ingest::run(&i, &names, shutdown).await.unwrap();
        });
        Running { handle, task }
    }

    pub fn profile(&self, name: &str, toml: &str) {
        std::fs::write(self.cfg.profiles_dir().join(format!("{name}.toml")), toml).unwrap();
    }

    pub fn ingest(&self) -> Arc<Ingest> {
        Ingest::new(self.engine.clone(), self.cfg.clone())
    }

    pub fn payload(&self) -> PathBuf {
        self.dir.path().join("payload")
    }

    /// Writes a payload file; returns its URL and md5.
    pub fn file(&self, rel: &str, bytes: &[u8]) -> (String, String) {
        let p = self.payload().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
        let mut h = Hasher::new(checkm::HashAlg::Md5);
        h.update(bytes);
        (self.server.url(rel), h.hex())
    }

    /// An object manifest of `files` (name, bytes), served at `rel`; returns its URL.
    pub fn object_manifest(&self, rel: &str, files: &[(&str, &[u8])]) -> String {
        let rows: Vec<Vec<String>> = files
            .iter()
            .map(|(name, bytes)| {
                let (url, md5) = self.file(&format!("{rel}.d/{name}"), bytes);
                vec![
                    url,
                    "md5".into(),
                    md5,
                    bytes.len().to_string(),
                    name.to_string(),
                ]
            })
            .collect();
        let text = checkm::write(ManifestKind::Object, checkm::OBJECT_FIELDS, &rows);
        self.file(rel, text.as_bytes()).0
    }

    pub async fn submit(&self, ingest: &Ingest, url: &str, ty: &str) -> BatchId {
        self.submit_as(ingest, "demo", "depositor", url, ty).await
    }

    /// An ingest service, and a batch of one object of `files` (an object manifest served
    /// at `o.checkm`) submitted on it.
    pub async fn submit_object(&self, files: &[(&str, &[u8])]) -> (Arc<Ingest>, BatchId) {
        let m = self.object_manifest("o.checkm", files);
        let ingest = self.ingest();
        let bid = self.submit(&ingest, &m, "manifest").await;
        (ingest, bid)
    }

    /// Submits the payload at `url` of type `ty` with `profile`, as `submitter`.
    pub async fn submit_as(
        &self,
        ingest: &Ingest,
        profile: &str,
        submitter: &str,
        url: &str,
        ty: &str,
    ) -> BatchId {
        lading_ingest::submit(
            ingest,
            &Submission {
                profile: profile.into(),
                submitter: submitter.into(),
                payload_url: url.into(),
                payload_type: ty.into(),
                ..Default::default()
            },
        )
        .await
        .unwrap()
    }

    /// Runs every stage in a task; returns the handle that stops it.
    pub fn run_all(&self, ingest: &Arc<Ingest>) -> Running {
        self.run_stages(ingest, lading_ingest::STAGE_NAMES)
    }

    /// Waits until `batch` has ended: Completed or Failed.
    pub async fn batch_ends(&self, batch: &BatchId) -> BatchState {
        self.batch_reaches(batch, &[BatchState::Completed, BatchState::Failed])
            .await
    }

    /// The first job of `batch`, checked to have failed after `stage` succeeded: its id and
    /// the failure's message.
    pub async fn failed_after(&self, batch: &BatchId, stage: JobState) -> (JobId, String) {
        let job = self.jobs_of(batch).await.remove(0);
        let st = self.engine.job(&job).await.unwrap().status;
        assert_eq!(st.status, JobState::Failed);
        assert_eq!(st.last_successful_status, Some(stage));
        (job, st.message.unwrap_or_default())
    }

    /// Waits, on change events, until `batch` is in one of `states`.
    pub async fn batch_reaches(&self, batch: &BatchId, states: &[BatchState]) -> BatchState {
        let what = format!("batch {batch} reaching {states:?}");
        self.until(&what, || async {
            let s = self.engine.batch(batch).await.unwrap().status.status;
            states.contains(&s).then_some(s)
        })
        .await
    }

    /// Waits until `check` gives a value: looked at again on each change this engine
    /// commits, and each second for other processes' changes (and missed events); panics
    /// naming `what` after [`WAIT`].
    pub async fn until<T, F, Fut>(&self, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let mut ev = self.engine.subscribe();
        tokio::time::timeout(WAIT, async {
            loop {
                if let Some(v) = check().await {
                    return v;
                }
                let _ = tokio::time::timeout(Duration::from_secs(1), ev.recv()).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("waited in vain for {what}"))
    }

    /// Waits for `batch` to end; panics unless it ended Completed.
    pub async fn completes(&self, batch: &BatchId) {
        let end = self.batch_ends(batch).await;
        if end != BatchState::Completed {
            let mut why = vec![self.batch_message(batch).await];
            for j in self.jobs_of(batch).await {
                let st = self.engine.job(&j).await.unwrap().status;
                why.push(format!(
                    "{j} {:?}: {}",
                    st.status,
                    st.message.unwrap_or_default()
                ));
            }
            panic!("batch {batch} ended {end:?}: {}", why.join("; "));
        }
    }

    /// Serves `text` as `obj.checkm` and submits it as a manifest on a new ingest.
    pub async fn submit_manifest(&self, text: &str) -> (Arc<Ingest>, BatchId) {
        let (url, _) = self.file("obj.checkm", text.as_bytes());
        let ingest = self.ingest();
        let bid = self.submit(&ingest, &url, "manifest").await;
        (ingest, bid)
    }

    /// The record Storing wrote for `job` (what it stored, where), if any.
    pub async fn store_record(&self, job: &JobId) -> Option<lading_ingest::stages::StoredVersion> {
        let n = self
            .engine
            .tree()
            .get(&lading_core::layout::job_node(job, "store"))
            .await
            .unwrap()?;
        Some(serde_json::from_slice(&n.data.unwrap()).unwrap())
    }

    /// The record Storing wrote for `job`; panics when there is none.
    pub async fn stored(&self, job: &JobId) -> lading_ingest::stages::StoredVersion {
        self.store_record(job).await.expect("a store record")
    }

    /// The message of `batch`'s status (empty when none).
    pub async fn batch_message(&self, batch: &BatchId) -> String {
        let st = self.engine.batch(batch).await.unwrap().status;
        st.message.unwrap_or_default()
    }

    /// Runs every stage on `ingest` until `batch` has completed, then stops them.
    pub async fn runs_to_completion(&self, ingest: &Arc<Ingest>, batch: &BatchId) {
        let run = self.run_all(ingest);
        self.completes(batch).await;
        run.stop().await;
    }

    /// The batch's first job, once intake has made it.
    pub async fn first_job(&self, batch: &BatchId) -> JobId {
        loop {
            if let Some(j) = self.jobs_of(batch).await.first() {
                return j.clone();
            }
            self.batch_reaches(batch, &[BatchState::Processing]).await;
        }
    }

    pub async fn job_reaches(&self, job: &JobId, state: JobState) {
        self.until(&format!("job {job} reaching {state}"), || async {
            (self.engine.job(job).await.unwrap().status.status == state).then_some(())
        })
        .await
    }

    pub async fn jobs_of(&self, batch: &BatchId) -> Vec<JobId> {
        let info = self.engine.batch(batch).await.unwrap();
        let mut v: Vec<JobId> = info.jobs.values().flatten().cloned().collect();
        v.sort();
        v
    }
}

async fn open_tree(backend: Backend, store: &str) -> Arc<dyn Tree> {
    match backend {
        Backend::Sqlite => Arc::new(SqliteTree::open(store, SqliteOptions::default()).unwrap()),
        Backend::ZooKeeper => Arc::new(
            lading_store_zk::ZkTree::open(store, lading_store_zk::ZkOptions::default())
                .await
                .unwrap(),
        ),
    }
}

/// Merritt's own writes, node by node, as its Java library (`mrt-zk`) makes them: what a
/// test lays down to play Merritt's ingest service and consumers. Data is what
/// `QueueItemHelper.serializeAsBytes` gives (a JSON object's text, a number's digits, an
/// empty node for none); status objects have Merritt's keys in Merritt's order.
pub mod merritt {
    use lading_core::layout::{BatchId, JobId};
    use lading_core::{CreateMode, Tree};
    use serde_json::{Value, json};

    const NOW: &str = "2026-11-24 10:00:00 +0000";

    fn bytes(v: &Value) -> Option<Vec<u8>> {
        Some(v.to_string().into_bytes())
    }

    async fn create(t: &dyn Tree, path: &str, data: Option<Vec<u8>>) -> String {
        t.create(path, data, CreateMode::Persistent)
            .await
            .unwrap_or_else(|e| panic!("create {path}: {e}"))
    }

    /// `Batch.createBatch(client, submission)`: `/batches/bidN`, its `/batch-uuids` entry,
    /// `submission` and a Pending `status`.
    pub async fn create_batch(t: &dyn Tree, submission: &Value) -> BatchId {
        let path = t
            .create(
                "/batches/bid",
                Some(Vec::new()),
                CreateMode::PersistentSequential,
            )
            .await
            .unwrap();
        let bid = BatchId::parse(lading_core::tree::split_path(&path).1).unwrap();
        if let Some(u) = submission["batchID"].as_str().filter(|u| !u.is_empty()) {
            create(t, &format!("/batch-uuids/{u}"), Some(bid.as_str().into())).await;
        }
        create(t, &format!("{path}/submission"), bytes(submission)).await;
        let status = json!({"status": "Pending", "last_modified": NOW, "message": ""});
        create(t, &format!("{path}/status"), bytes(&status)).await;
        bid
    }

    /// `Batch.acquirePendingBatch`: the consumer locks the batch, makes a bare `states` and
    /// sets it Processing. Returns with the lock still held (the consumer unlocks after
    /// making its jobs).
    pub async fn acquire_batch(t: &dyn Tree, bid: &BatchId) {
        t.create(
            &format!("/batches/{bid}/lock"),
            Some(Vec::new()),
            CreateMode::Ephemeral,
        )
        .await
        .unwrap();
        create(t, &format!("/batches/{bid}/states"), Some(Vec::new())).await;
        let status = json!({"status": "Processing", "last_modified": NOW, "message": ""});
        t.set(&format!("/batches/{bid}/status"), bytes(&status), None)
            .await
            .unwrap();
    }

    /// `QueueItem.unlock`.
    pub async fn unlock_batch(t: &dyn Tree, bid: &BatchId) {
        t.delete(&format!("/batches/{bid}/lock"), None)
            .await
            .unwrap();
    }

    /// `Job.createJob(client, bid, priority, configuration, identifiers, metadata)`: the job
    /// is locked while it is made and unlocked at the end unless `keep_lock` (a Merritt
    /// worker that goes on with it).
    pub async fn create_job(
        t: &dyn Tree,
        bid: &BatchId,
        priority: u8,
        configuration: &Value,
        identifiers: &Value,
        metadata: &Value,
        keep_lock: bool,
    ) -> JobId {
        let path = t
            .create(
                "/jobs/jid",
                Some(Vec::new()),
                CreateMode::PersistentSequential,
            )
            .await
            .unwrap();
        let jid = JobId::parse(lading_core::tree::split_path(&path).1).unwrap();
        t.create(
            &format!("{path}/lock"),
            Some(Vec::new()),
            CreateMode::Ephemeral,
        )
        .await
        .unwrap();
        create(t, &format!("{path}/bid"), Some(bid.as_str().into())).await;
        create(
            t,
            &format!("{path}/priority"),
            Some(priority.to_string().into()),
        )
        .await;
        create(t, &format!("{path}/space_needed"), Some("0".into())).await;
        create(t, &format!("{path}/configuration"), bytes(configuration)).await;
        if identifiers.as_object().is_some_and(|m| !m.is_empty()) {
            create(t, &format!("{path}/identifiers"), bytes(identifiers)).await;
        }
        if metadata.as_object().is_some_and(|m| !m.is_empty()) {
            create(t, &format!("{path}/metadata"), bytes(metadata)).await;
        }
        let status = json!({"status": "Pending", "last_modified": NOW,
                            "last_successful_status": null, "retry_count": 0, "message": ""});
        create(t, &format!("{path}/status"), bytes(&status)).await;
        let folder = format!("/batches/{bid}/states/batch-processing");
        if t.exists(&folder).await.unwrap().is_none() {
            create(t, &folder, Some(Vec::new())).await;
        }
        create(t, &format!("{folder}/{jid}"), Some(Vec::new())).await;
        create(
            t,
            &format!("/jobs/states/pending/{priority:02}-{jid}"),
            Some(Vec::new()),
        )
        .await;
        if !keep_lock {
            t.delete(&format!("{path}/lock"), None).await.unwrap();
        }
        jid
    }

    /// `Job.setStatus(client, to)` by the job's lock holder, from `from` (at priority `priority`): the
    /// job's status, its `/jobs/states` reference and its batch reference, each its own write
    /// as Merritt makes them, the batch's target folder made when missing.
    pub async fn move_job(
        t: &dyn Tree,
        bid: &BatchId,
        jid: &JobId,
        priority: u8,
        from: &str,
        to: &str,
    ) {
        if let Some(landing) = move_job_leaving(t, bid, jid, priority, from, to).await {
            land(t, &landing).await;
        }
    }

    /// [`move_job`] up to its last request: the job's status and state reference written, and
    /// its old batch reference deleted (`setBatchStatePath`'s first request). Returns the
    /// batch reference still to make, when the move changes the job's batch folder.
    pub async fn move_job_leaving(
        t: &dyn Tree,
        bid: &BatchId,
        jid: &JobId,
        priority: u8,
        from: &str,
        to: &str,
    ) -> Option<String> {
        // `Job.statusObject`: the old object with status and time replaced, and
        // last_successful_status set to the old status unless moving to Failed or Deleted.
        let old = t
            .get(&format!("/jobs/{jid}/status"))
            .await
            .unwrap()
            .unwrap();
        let mut status: Value = serde_json::from_slice(&old.data.unwrap()).unwrap();
        status["status"] = json!(to);
        status["last_modified"] = json!(NOW);
        if !matches!(to, "Failed" | "Deleted") {
            status["last_successful_status"] = json!(from);
        }
        status["message"] = json!("");
        t.set(&format!("/jobs/{jid}/status"), bytes(&status), None)
            .await
            .unwrap();
        let (lf, lt) = (from.to_lowercase(), to.to_lowercase());
        t.delete(&format!("/jobs/states/{lf}/{priority:02}-{jid}"), None)
            .await
            .unwrap();
        let folder = format!("/jobs/states/{lt}");
        if t.exists(&folder).await.unwrap().is_none() {
            create(t, &folder, Some(Vec::new())).await;
        }
        create(
            t,
            &format!("{folder}/{priority:02}-{jid}"),
            Some(Vec::new()),
        )
        .await;
        let sub = |s: &str| match s {
            "Completed" => "batch-completed",
            "Failed" => "batch-failed",
            "Deleted" => "batch-deleted",
            _ => "batch-processing",
        };
        let (bf, bt) = (sub(from), sub(to));
        if bf == bt {
            return None;
        }
        t.delete(&format!("/batches/{bid}/states/{bf}/{jid}"), None)
            .await
            .unwrap();
        Some(format!("/batches/{bid}/states/{bt}/{jid}"))
    }

    /// `setBatchStatePath`'s second request: makes the batch reference `path` (and its folder
    /// when missing, as Merritt does).
    pub async fn land(t: &dyn Tree, path: &str) {
        let (folder, _) = lading_core::tree::split_path(path);
        if t.exists(folder).await.unwrap().is_none() {
            create(t, folder, Some(Vec::new())).await;
        }
        create(t, path, Some(Vec::new())).await;
    }

    /// `QueueItem.unlock` of a job.
    pub async fn unlock_job(t: &dyn Tree, jid: &JobId) {
        t.delete(&format!("/jobs/{jid}/lock"), None).await.unwrap();
    }

    /// A Merritt job's configuration for one file at `url`.
    pub fn file_job(url: &str) -> Value {
        json!({"profile_name": "demo", "submitter": "merritt-user", "payload_url": url,
               "payload_type": "file", "response_type": "tsv"})
    }

    /// Runs a Pending job `t` holds through every stage to Completed, as Merritt's daemons
    /// would (the pipeline's own order: Pending is left by starting the job, each stage after
    /// it by its success), and lets it go.
    pub async fn run_to_completed(t: &dyn Tree, bid: &BatchId, jid: &JobId) {
        use lading_core::JobState;
        move_job(t, bid, jid, 5, "Pending", "Estimating").await;
        let mut at = JobState::Estimating;
        while let Some(next) = at.success() {
            move_job(t, bid, jid, 5, at.name(), next.name()).await;
            at = next;
        }
        assert_eq!(at, JobState::Completed);
        unlock_job(t, jid).await;
    }

    /// `Access.createAssembly(client, queue, token)`: `/access/QUEUE/qidN` with the token's
    /// JSON as `token` (or `raw` bytes as they are) and a Pending `status`. Returns the
    /// request's path.
    pub async fn create_assembly(
        t: &dyn Tree,
        queue: &str,
        token: Result<&Value, &[u8]>,
    ) -> String {
        let path = t
            .create(
                &format!("/access/{queue}/qid"),
                Some(Vec::new()),
                CreateMode::PersistentSequential,
            )
            .await
            .unwrap();
        let data = match token {
            Ok(v) => bytes(v),
            Err(raw) => Some(raw.to_vec()),
        };
        create(t, &format!("{path}/token"), data).await;
        let status = json!({"status": "Pending", "last_modified": NOW, "message": ""});
        create(t, &format!("{path}/status"), bytes(&status)).await;
        path
    }
}

/// Files of a stored version, relative, sorted.
pub fn stored_files(version_dir: &Path) -> Vec<String> {
    lading_ingest::stages::list_files(version_dir)
        .unwrap()
        .into_iter()
        .map(|f| f.path)
        .collect()
}

pub use lading_testkit::smtp::Smtp;

/// Every stage running on an ingest, as [`World::run_all`] started them.
pub struct Running {
    handle: ShutdownHandle,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops the stages and waits until they have ended.
    pub async fn stop(self) {
        self.handle.stop();
        self.task.await.unwrap();
    }

    /// Aborts the stages at once (as a crash would) and waits until they have ended.
    pub async fn abort(self) {
        self.handle.abort();
        self.task.await.unwrap();
    }
}
