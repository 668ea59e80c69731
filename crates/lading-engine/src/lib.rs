//! The queue engine: batches, jobs and access requests on any [`Tree`], with the node layout
//! of SPEC §2 and the guarantees of SPEC §3.
//!
//! How the guarantees are built from the tree:
//! - **Atomic transitions**: one `multi` checks the caller's lock, rewrites the status with
//!   the version read at acquisition, moves the `states/STATE/PP-JID` and batch references,
//!   and (unless the caller keeps working) deletes the lock.
//! - **Fencing**: a lease remembers the session it was taken in and the status version. A
//!   lapsed session cannot commit; a status changed by anyone else fails the version check.
//!   Either way the caller gets [`EngineError::LeaseLost`].
//! - **Order without scans**: acquisition reads the head of the state folder a page at a time
//!   (`children_page`), so its cost does not grow with the queue.
//! - **Exactly-once batch completion**: a batch moves Processing → Reporting only through a
//!   version-checked `set` after seeing `batch-processing` empty; the loser of a race sees
//!   the version moved and stops. Anything that puts a job back into `batch-processing` bumps
//!   the batch status version in the same `multi`.
//! - **Admin actions on unlocked items** create and delete the item's lock inside their own
//!   `multi`, so they fail cleanly (`Locked`) while a worker holds it.

mod error;
mod locks;
mod outbox;
mod reserve;

pub use error::{EngineError, Result};
pub use locks::ForeignLock;
pub use outbox::{Effect, OutboxClaim, OutboxEntry, OutboxItem};
pub use reserve::{RESERVED_FIELD, Reservation};

use foldhash::{HashMap, HashMapExt};
use lading_core::layout::{self, *};
use lading_core::time::{SharedClock, format_ts};
use lading_core::{
    AccessState, BatchState, CreateMode, Event, JobProgress, JobState, Op, Tree, TreeError, Watch,
    WatchKind,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;

/// References read per page while looking for work.
const PAGE: usize = 64;
/// How many next jobs a move tries to lock along with it before it is made alone.
const NEXT_TRIES: usize = 2;
/// See `Engine::next_score`.
const NEXT_SCORE_MAX: i32 = 8;
const NEXT_PROBE: u32 = 16;
/// How many free jobs at the head of a contended queue a worker picks among at random.
const SPREAD: usize = 16;
/// Most references one acquisition looks at before giving up (all locked by others).
const MAX_SCAN: usize = 4096;
/// Retries of an optimistic read-check-write loop before reporting `Conflict`.
const MAX_OPTIMISTIC: usize = 32;

/// A committed change, published to subscribers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChangeEvent {
    /// `batch`, `job` or `access`.
    pub kind: &'static str,
    pub id: String,
    /// The batch a job belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    pub from: Option<String>,
    pub to: String,
    pub time: String,
}

/// A job held by this worker.
#[derive(Debug, Clone)]
pub struct JobLease {
    pub job: JobId,
    pub batch: BatchId,
    pub status: JobStatus,
    pub priority: u8,
    /// Why a `Fail` moves the job, recorded with it: `fatal` (bad input, will not work) or
    /// `exhausted` (the stage's attempts ran out). Set by the worker before it fails the job.
    pub failure_kind: Option<&'static str>,
    /// Outside effects the job's next move causes: recorded in the outbox in that move's
    /// `multi`, delivered after it commits (see [`Effect`]).
    pub effects: Vec<Effect>,
    status_version: i32,
    session: u64,
}

impl JobLease {
    pub fn state(&self) -> JobState {
        self.status.status
    }
}

/// A batch held by this worker.
#[derive(Debug, Clone)]
pub struct BatchLease {
    pub batch: BatchId,
    pub status: BatchStatus,
    /// Outside effects the batch's next move causes, recorded in that move's `multi`.
    pub effects: Vec<Effect>,
    /// A `status-report` written in the batch's next move's `multi` (a report exists only
    /// for a move that committed).
    pub report: Option<StatusReport>,
    status_version: i32,
    session: u64,
}

/// An access request held by this worker.
#[derive(Debug, Clone)]
pub struct AccessLease {
    pub queue: AccessQueue,
    pub id: AccessId,
    pub status: AccessStatus,
    pub token: Value,
    status_version: i32,
    session: u64,
}

/// A per-object lock (`/locks/storage/ARK`, `/locks/inventory/ARK`).
#[derive(Debug)]
pub struct ArkLock {
    path: String,
    session: u64,
}

/// What a new job is made of.
#[derive(Debug, Clone, Default)]
pub struct JobSpec {
    pub configuration: Map<String, Value>,
    /// 0..=99; lower runs first. `None` means the default, 5.
    pub priority: Option<u8>,
    pub space_needed: u64,
    pub identifiers: Identifiers,
    pub metadata: ErcMetadata,
}

/// Everything stored about a job.
#[derive(Debug, Clone, Serialize)]
pub struct JobInfo {
    pub id: String,
    pub bid: String,
    pub status: JobStatus,
    pub priority: u8,
    pub space_needed: u64,
    pub configuration: Value,
    pub identifiers: Value,
    pub metadata: Value,
    pub locked: bool,
}

/// Everything stored about a batch, with its jobs per reference folder.
#[derive(Debug, Clone, Serialize)]
pub struct BatchInfo {
    pub id: String,
    pub status: BatchStatus,
    pub submission: Value,
    pub status_report: Option<StatusReport>,
    pub jobs: BTreeMap<String, Vec<String>>,
    pub locked: bool,
}

/// An access request.
#[derive(Debug, Clone, Serialize)]
pub struct AccessInfo {
    pub queue: AccessQueue,
    pub id: String,
    pub status: AccessStatus,
    pub token: Value,
    pub locked: bool,
}

/// Default priority of a job (SPEC §2).
pub const DEFAULT_PRIORITY: u8 = 5;

/// The engine over one tree session.
pub struct Engine {
    tree: Arc<dyn Tree>,
    clock: SharedClock,
    owner: String,
    events: broadcast::Sender<ChangeEvent>,
    /// Locks this process is trying for or holds, so local workers do not race each other.
    /// Lock path → the session it was claimed in; a claim from an older session is void (that
    /// session's locks are gone).
    claimed: Mutex<HashMap<String, u64>>,
    /// Batch reference folders seen to exist (see `folder_ops`).
    known_folders: Mutex<foldhash::HashSet<String>>,
    /// Job → batch, which never changes once written: saves a read per acquisition.
    job_batches: Mutex<HashMap<JobId, BatchId>>,
    /// Batches seen in a terminal state (Completed, Deleted), which they never leave: batch
    /// acquisition skips them without reading their status again.
    terminal_batches: Mutex<HashMap<BatchId, BatchState>>,
    /// Pause and hold flags read under a watch: valid until the watch fires.
    flags: Mutex<HashMap<String, (bool, Arc<AtomicBool>)>>,
    /// Job locks another worker was found holding, per state folder: skipped by acquisition
    /// for a moment, and watched by a waiting worker of that state.
    busy: Mutex<HashMap<String, BusyFolder>>,
    /// References of jobs found deferred (a retry time in the future) → that time in ms:
    /// acquisition skips them without a round trip until then.
    deferred: Mutex<HashMap<String, u64>>,
    /// How moves that also lock the next job fared lately: up on success, down harder on a
    /// race lost to another session. Below zero such moves are mostly made alone (one in
    /// [`NEXT_PROBE`] still tries): where many sessions share the queue heads, a lost race
    /// costs a round trip that a plain move and acquisition would not.
    next_score: AtomicI32,
    next_calls: AtomicU32,
    /// Batches the last batch scan found in a non-terminal state: what a waiting batch worker
    /// watches.
    live_batches: Mutex<Vec<BatchId>>,
    /// Signalled when this process lets go of a claim, and counted when a claim was refused
    /// because another local worker had it: a waiter that lost such a race is woken when the
    /// winner lets go (the tree's own watch may have fired before the claim was dropped).
    unclaimed: tokio::sync::Notify,
    local_conflicts: std::sync::atomic::AtomicU64,
}

/// References of one state folder found locked by other workers, and when.
#[derive(Default)]
struct BusyFolder {
    names: HashMap<String, std::time::Instant>,
    /// When a lock was last found taken here.
    last: Option<std::time::Instant>,
}

/// Status field (`/jobs/JID/status`, beside Merritt's fields) holding the earliest time, in
/// ms since the epoch, at which a deferred job may be taken again.
pub const RETRY_AT_FIELD: &str = "retry_at_ms";
/// Status field holding how many attempts of the current stage ended in a transient error.
pub const ATTEMPTS_FIELD: &str = "attempts";

/// How long a job found locked by another worker is skipped by this process's acquisitions.
const BUSY_SKIP: Duration = Duration::from_millis(500);
/// Live batches whose status and lock a waiting batch worker watches.
const WAIT_BATCHES: usize = 32;
/// Locks of busy jobs a waiting worker watches.
const WAIT_LOCKS: usize = 16;
/// A waiting worker looks again at least this often, whatever it was told.
const SWEEP: Duration = Duration::from_secs(10);

/// Processing batches whose `batch-processing` folder `watch_finishing_batches` watches.
const WATCH_PROCESSING: usize = 256;

/// Bound on `job_batches`; it is simply emptied when full.
const JOB_BATCHES_KEPT: usize = 100_000;

/// Ready when any of `watches` fires; never, when there are none.
async fn any_of(mut watches: Vec<Watch>) {
    std::future::poll_fn(|cx| {
        for w in watches.iter_mut() {
            if std::pin::Pin::new(w).poll(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    })
    .await
}

fn lost(what: &str) -> EngineError {
    EngineError::LeaseLost(what.to_string())
}

fn json_bytes<T: Serialize>(v: &T) -> Option<Vec<u8>> {
    Some(to_bytes(v))
}

impl Engine {
    /// Wraps a tree session. Call [`Engine::init`] once per store before use (it is idempotent).
    pub fn new(tree: Arc<dyn Tree>, clock: SharedClock, owner: impl Into<String>) -> Engine {
        let (events, _) = broadcast::channel(4096);
        Engine {
            tree,
            clock,
            owner: owner.into(),
            events,
            claimed: Mutex::new(HashMap::new()),
            job_batches: Mutex::new(HashMap::new()),
            known_folders: Mutex::new(foldhash::HashSet::default()),
            terminal_batches: Mutex::new(HashMap::new()),
            flags: Mutex::new(HashMap::new()),
            busy: Mutex::new(HashMap::new()),
            deferred: Mutex::new(HashMap::new()),
            next_score: AtomicI32::new(0),
            next_calls: AtomicU32::new(0),
            live_batches: Mutex::new(Vec::new()),
            unclaimed: tokio::sync::Notify::new(),
            local_conflicts: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub fn tree(&self) -> &Arc<dyn Tree> {
        &self.tree
    }

    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// Subscribes to committed changes made through this engine.
    pub fn subscribe(&self) -> broadcast::Receiver<ChangeEvent> {
        self.events.subscribe()
    }

    fn now(&self) -> String {
        format_ts(self.clock.now_ms())
    }

    fn publish(
        &self,
        kind: &'static str,
        id: &str,
        batch: Option<&BatchId>,
        from: Option<&str>,
        to: &str,
    ) {
        tracing::debug!(kind, id, from, to, "transition");
        let _ = self.events.send(ChangeEvent {
            kind,
            id: id.to_string(),
            batch: batch.map(|b| b.to_string()),
            from: from.map(str::to_string),
            to: to.to_string(),
            time: self.now(),
        });
    }

    fn lock_data(&self) -> Option<Vec<u8>> {
        json_bytes(&LockOwner {
            owner: self.owner.clone(),
            session: self.tree.session_id(),
            acquired: self.now(),
        })
    }

    /// Creates the fixed folders of the layout (idempotent).
    pub async fn init(&self) -> Result<()> {
        let mut paths: Vec<String> = ROOTS.iter().map(|s| s.to_string()).collect();
        paths.extend(JobState::ALL.iter().map(|s| job_state_folder(*s)));
        for p in paths {
            self.ensure(&p).await?;
        }
        // A tree made before the submitter index: index its batches once.
        if self.tree.exists(BATCH_SUBMITTERS).await?.is_none() {
            for bid in self.batch_ids().await? {
                let Some((sub, _)) = self
                    .read_json::<Map<String, Value>>(&batch_node(&bid, "submission"))
                    .await?
                else {
                    continue;
                };
                if let Some(who) = sub.get("submitter").and_then(Value::as_str) {
                    let dir = submitter_batches(who);
                    self.ensure(BATCH_SUBMITTERS).await?;
                    self.ensure(&dir).await?;
                    self.ensure(&format!("{dir}/{bid}")).await?;
                }
            }
            self.ensure(BATCH_SUBMITTERS).await?;
        }
        Ok(())
    }

    /// Creates the persistent node `path` unless it exists (looked at first: a read is much
    /// cheaper than a refused write).
    async fn ensure(&self, path: &str) -> Result<()> {
        if self.tree.exists(path).await?.is_some() {
            return Ok(());
        }
        match self.tree.create(path, None, CreateMode::Persistent).await {
            Ok(_) | Err(TreeError::NodeExists(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    // ----- reading -----------------------------------------------------------------------

    async fn read_json<T: DeserializeOwned>(&self, path: &str) -> Result<Option<(T, i32)>> {
        let Some(node) = self.tree.get(path).await? else {
            return Ok(None);
        };
        let bytes = node.data.unwrap_or_default();
        let v = serde_json::from_slice(&bytes).map_err(|e| EngineError::Corrupt {
            path: path.to_string(),
            reason: format!("invalid JSON: {e}"),
        })?;
        Ok(Some((v, node.stat.version)))
    }

    async fn read_string(&self, path: &str) -> Result<Option<String>> {
        let Some(node) = self.tree.get(path).await? else {
            return Ok(None);
        };
        String::from_utf8(node.data.unwrap_or_default())
            .map(|s| Some(s.trim().to_string()))
            .map_err(|_| EngineError::Corrupt {
                path: path.into(),
                reason: "not UTF-8 text".into(),
            })
    }

    async fn read_u64(&self, path: &str) -> Result<Option<u64>> {
        match self.read_string(path).await? {
            None => Ok(None),
            Some(s) if s.is_empty() => Ok(Some(0)),
            Some(s) => s.parse().map(Some).map_err(|_| EngineError::Corrupt {
                path: path.into(),
                reason: format!("not a decimal integer: {s:?}"),
            }),
        }
    }

    async fn job_status(&self, job: &JobId) -> Result<(JobStatus, i32)> {
        self.read_json(&job_node(job, "status"))
            .await?
            .ok_or_else(|| EngineError::NoJob(job.to_string()))
    }

    async fn job_priority(&self, job: &JobId) -> Result<u8> {
        let p = self
            .read_u64(&job_node(job, "priority"))
            .await?
            .unwrap_or(DEFAULT_PRIORITY as u64);
        u8::try_from(p)
            .ok()
            .filter(|p| *p <= 99)
            .ok_or_else(|| EngineError::Corrupt {
                path: job_node(job, "priority"),
                reason: format!("priority {p} is outside 0..=99"),
            })
    }

    async fn job_batch(&self, job: &JobId) -> Result<BatchId> {
        let known = self
            .job_batches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(job)
            .cloned();
        if let Some(b) = known {
            return Ok(b);
        }
        let path = job_node(job, "bid");
        let s = self
            .read_string(&path)
            .await?
            .ok_or_else(|| EngineError::NoJob(job.to_string()))?;
        let bid = BatchId::parse(&s).map_err(|e| EngineError::Corrupt {
            path,
            reason: e.to_string(),
        })?;
        let mut cache = self.job_batches.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= JOB_BATCHES_KEPT {
            cache.clear();
        }
        cache.insert(job.clone(), bid.clone());
        Ok(bid)
    }

    async fn batch_status(&self, batch: &BatchId) -> Result<(BatchStatus, i32)> {
        self.read_json(&batch_node(batch, "status"))
            .await?
            .ok_or_else(|| EngineError::NoBatch(batch.to_string()))
    }

    /// A job's full record, read as one snapshot.
    pub async fn job(&self, job: &JobId) -> Result<JobInfo> {
        let names = [
            "status",
            "bid",
            "priority",
            "space_needed",
            "configuration",
            "identifiers",
            "metadata",
            "lock",
        ];
        let paths: Vec<String> = names.iter().map(|n| job_node(job, n)).collect();
        let nodes = self.tree.get_many(&paths).await?;
        let text = |i: usize| -> Result<Option<String>> {
            match &nodes[i] {
                None => Ok(None),
                Some(n) => String::from_utf8(n.data.clone().unwrap_or_default())
                    .map(|s| Some(s.trim().to_string()))
                    .map_err(|_| EngineError::Corrupt {
                        path: paths[i].clone(),
                        reason: "not UTF-8 text".into(),
                    }),
            }
        };
        let json = |i: usize| -> Result<Option<Value>> {
            match &nodes[i] {
                None => Ok(None),
                Some(n) => serde_json::from_slice(n.data.as_deref().unwrap_or_default())
                    .map(Some)
                    .map_err(|e| EngineError::Corrupt {
                        path: paths[i].clone(),
                        reason: format!("invalid JSON: {e}"),
                    }),
            }
        };
        let number = |i: usize| -> Result<Option<u64>> {
            match text(i)? {
                None => Ok(None),
                Some(s) if s.is_empty() => Ok(Some(0)),
                Some(s) => s.parse().map(Some).map_err(|_| EngineError::Corrupt {
                    path: paths[i].clone(),
                    reason: format!("not a decimal integer: {s:?}"),
                }),
            }
        };
        let status: JobStatus = match json(0)? {
            None => return Err(EngineError::NoJob(job.to_string())),
            Some(v) => serde_json::from_value(v).map_err(|e| EngineError::Corrupt {
                path: paths[0].clone(),
                reason: format!("invalid JSON: {e}"),
            })?,
        };
        let bid = text(1)?.ok_or_else(|| EngineError::NoJob(job.to_string()))?;
        BatchId::parse(&bid).map_err(|e| EngineError::Corrupt {
            path: paths[1].clone(),
            reason: e.to_string(),
        })?;
        let p = number(2)?.unwrap_or(DEFAULT_PRIORITY as u64);
        let priority =
            u8::try_from(p)
                .ok()
                .filter(|p| *p <= 99)
                .ok_or_else(|| EngineError::Corrupt {
                    path: paths[2].clone(),
                    reason: format!("priority {p} is outside 0..=99"),
                })?;
        Ok(JobInfo {
            id: job.to_string(),
            bid,
            status,
            priority,
            space_needed: number(3)?.unwrap_or(0),
            configuration: json(4)?.unwrap_or(Value::Null),
            identifiers: json(5)?.unwrap_or(Value::Null),
            metadata: json(6)?.unwrap_or(Value::Null),
            locked: nodes[7].is_some(),
        })
    }

    /// A job's `configuration` node.
    pub async fn job_configuration(&self, job: &JobId) -> Result<Map<String, Value>> {
        Ok(self
            .read_json(&job_node(job, "configuration"))
            .await?
            .map(|(v, _)| v)
            .unwrap_or_default())
    }

    /// A batch's full record.
    pub async fn batch(&self, batch: &BatchId) -> Result<BatchInfo> {
        let (status, _) = self.batch_status(batch).await?;
        let submission = self
            .read_json(&batch_node(batch, "submission"))
            .await?
            .map(|(v, _)| v)
            .unwrap_or(Value::Null);
        let status_report = self
            .read_json(&batch_node(batch, "status-report"))
            .await?
            .map(|(v, _)| v);
        let mut jobs = BTreeMap::new();
        for folder in BATCH_FOLDERS {
            match self.tree.children(&batch_ref_folder(batch, folder)).await {
                Ok(c) => {
                    jobs.insert(folder.to_string(), c);
                }
                Err(TreeError::NoNode(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let locked = self
            .tree
            .exists(&batch_node(batch, "lock"))
            .await?
            .is_some();
        Ok(BatchInfo {
            id: batch.to_string(),
            status,
            submission,
            status_report,
            jobs,
            locked,
        })
    }

    /// Finds a batch by the uuid in its submission.
    pub async fn batch_by_uuid(&self, uuid: &str) -> Result<Option<BatchId>> {
        layout::check_name("batch uuid", uuid)?;
        match self.read_string(&batch_uuid_path(uuid)).await? {
            None => Ok(None),
            Some(s) => BatchId::parse(&s)
                .map(Some)
                .map_err(|e| EngineError::Corrupt {
                    path: batch_uuid_path(uuid),
                    reason: e.to_string(),
                }),
        }
    }

    /// Number of jobs per state (from the state folders; one count each).
    pub async fn job_counts(&self) -> Result<BTreeMap<JobState, u64>> {
        let mut out = BTreeMap::new();
        for s in JobState::ALL {
            let n = match self.tree.count_children(&job_state_folder(*s)).await {
                Ok(n) => n,
                Err(TreeError::NoNode(_)) => 0,
                Err(e) => return Err(e.into()),
            };
            out.insert(*s, n);
        }
        Ok(out)
    }

    /// Jobs in a state, in acquisition order, a page at a time: (priority, id).
    pub async fn list_jobs(
        &self,
        state: JobState,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(u8, JobId)>> {
        let names = self
            .tree
            .children_page(&job_state_folder(state), after, limit)
            .await?;
        Ok(names.iter().filter_map(|n| parse_job_ref(n)).collect())
    }

    /// All batch ids, in creation order.
    pub async fn batch_ids(&self) -> Result<Vec<BatchId>> {
        Ok(self
            .tree
            .children(BATCHES)
            .await?
            .iter()
            .filter_map(|n| BatchId::parse(n).ok())
            .collect())
    }

    /// Removes submitter-index entries whose batch is gone: another tool (Merritt's
    /// `Batch.deleteCompletedBatches`) deleted the batch without knowing Lading's index. An
    /// entry is made in the same `multi` as its batch's submission, so a missing batch is a
    /// deleted one. Returns how many entries went.
    pub async fn prune_submitter_index(&self) -> Result<usize> {
        let mut pruned = 0;
        let submitters = match self.tree.children(BATCH_SUBMITTERS).await {
            Ok(s) => s,
            Err(TreeError::NoNode(_)) => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        for who in submitters {
            let dir = format!("{BATCH_SUBMITTERS}/{who}");
            let entries = match self.tree.children(&dir).await {
                Ok(e) => e,
                Err(TreeError::NoNode(_)) => continue,
                Err(e) => return Err(e.into()),
            };
            for name in entries {
                let Ok(bid) = BatchId::parse(&name) else {
                    continue;
                };
                if self.tree.exists(&batch_path(&bid)).await?.is_none() {
                    match self.tree.delete(&format!("{dir}/{name}"), None).await {
                        Ok(()) => pruned += 1,
                        Err(TreeError::NoNode(_)) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        Ok(pruned)
    }

    /// The ids of the batches `submitter` submitted, in creation order (reads only those).
    pub async fn batch_ids_of(&self, submitter: &str) -> Result<Vec<BatchId>> {
        let mut ids: Vec<BatchId> = self
            .tree
            .children(&submitter_batches(submitter))
            .await
            .or_else(|e| match e {
                TreeError::NoNode(_) => Ok(Vec::new()),
                e => Err(e),
            })?
            .iter()
            .filter_map(|n| BatchId::parse(n).ok())
            .collect();
        ids.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        Ok(ids)
    }

    /// Batch states with their number of batches (reads every batch status).
    pub async fn batch_counts(&self) -> Result<BTreeMap<BatchState, u64>> {
        let mut out: BTreeMap<BatchState, u64> = BatchState::ALL.iter().map(|s| (*s, 0)).collect();
        for b in self.batch_ids().await? {
            match self.batch_status(&b).await {
                Ok((s, _)) => *out.entry(s.status).or_default() += 1,
                Err(EngineError::NoBatch(_)) => {} // being created or purged
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    // ----- holds and pauses ----------------------------------------------------------------

    /// A boolean read of the tree, remembered until a watch on `path` fires (or this engine
    /// changes a flag itself). Costs no round trip while nothing changes.
    async fn watched_flag<F>(&self, path: &str, kind: WatchKind, read: F) -> Result<bool>
    where
        F: std::future::Future<Output = Result<bool>>,
    {
        let key = format!("{kind:?}:{path}");
        if let Some((v, fresh)) = self
            .flags
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            && fresh.load(Ordering::SeqCst)
        {
            return Ok(*v);
        }
        let watch = self.tree.watch(path, kind).await?;
        let value = read.await?;
        let fresh = Arc::new(AtomicBool::new(true));
        let f = fresh.clone();
        tokio::spawn(async move {
            watch.await;
            f.store(false, Ordering::SeqCst);
        });
        self.flags
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, (value, fresh));
        Ok(value)
    }

    async fn flag(&self, path: &str, on: bool) -> Result<bool> {
        self.flags.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let r = if on {
            self.tree
                .create(path, None, CreateMode::Persistent)
                .await
                .map(|_| ())
        } else {
            self.tree.delete(path, None).await
        };
        match r {
            Ok(()) => Ok(true),
            Err(TreeError::NodeExists(_)) | Err(TreeError::NoNode(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Pauses a queue (`ingest`, `accessSmall`, `accessLarge`). Returns false if already paused.
    pub async fn pause_queue(&self, name: &str) -> Result<bool> {
        check_queue(name)?;
        self.flag(&queue_lock(name), true).await
    }

    pub async fn resume_queue(&self, name: &str) -> Result<bool> {
        check_queue(name)?;
        self.flag(&queue_lock(name), false).await
    }

    /// Whether a queue is paused, read from the tree now.
    pub async fn queue_paused(&self, name: &str) -> Result<bool> {
        check_queue(name)?;
        Ok(self.tree.exists(&queue_lock(name)).await?.is_some())
    }

    /// The same, as acquisition reads it: remembered under a watch, so another process's pause
    /// takes effect here when its watch event arrives (milliseconds), at no round trip before.
    async fn queue_paused_watched(&self, name: &str) -> Result<bool> {
        check_queue(name)?;
        let path = queue_lock(name);
        self.watched_flag(&path, WatchKind::Data, async {
            Ok(self.tree.exists(&path).await?.is_some())
        })
        .await
    }

    /// Holds a collection: its pending batches and jobs turn Held when next acquired.
    pub async fn hold_collection(&self, name: &str) -> Result<bool> {
        check_name("collection", name)?;
        self.flag(&collection_lock(name), true).await
    }

    pub async fn collection_held(&self, name: &str) -> Result<bool> {
        check_name("collection", name)?;
        Ok(self.tree.exists(&collection_lock(name)).await?.is_some())
    }

    /// Releases a collection hold and puts every Held batch and job of that collection back to
    /// Pending. Returns how many items were released.
    pub async fn release_collection(&self, name: &str) -> Result<usize> {
        check_name("collection", name)?;
        self.flag(&collection_lock(name), false).await?;
        let mut released = 0;
        for b in self.batch_ids().await? {
            let Ok((st, _)) = self.batch_status(&b).await else {
                continue;
            };
            if st.status == BatchState::Held
                && self.batch_collection(&b).await?.as_deref() == Some(name)
            {
                self.release_batch(&b).await?;
                released += 1;
            }
        }
        let mut after: Option<String> = None;
        loop {
            let page = self
                .tree
                .children_page(&job_state_folder(JobState::Held), after.as_deref(), PAGE)
                .await?;
            let Some(last) = page.last().cloned() else {
                break;
            };
            for name_ref in &page {
                let Some((_, job)) = parse_job_ref(name_ref) else {
                    continue;
                };
                if self.job_collection(&job).await?.as_deref() == Some(name) {
                    self.admin_job(&job, |p| p.apply(Event::To(JobState::Pending)))
                        .await?;
                    released += 1;
                }
            }
            after = Some(last);
        }
        Ok(released)
    }

    async fn batch_collection(&self, batch: &BatchId) -> Result<Option<String>> {
        let sub: Option<(Map<String, Value>, i32)> =
            self.read_json(&batch_node(batch, "submission")).await?;
        Ok(sub.and_then(|(m, _)| {
            m.get("collection")
                .and_then(Value::as_str)
                .map(str::to_string)
        }))
    }

    async fn job_collection(&self, job: &JobId) -> Result<Option<String>> {
        Ok(self
            .job_configuration(job)
            .await?
            .get("collection")
            .and_then(Value::as_str)
            .map(str::to_string))
    }

    async fn any_collection_held(&self) -> Result<bool> {
        self.watched_flag(COLLECTION_LOCKS, WatchKind::Children, async {
            Ok(self.tree.count_children(COLLECTION_LOCKS).await? > 0)
        })
        .await
    }

    // ----- batches -------------------------------------------------------------------------

    /// Creates a Pending batch from a submission (SPEC §2 `submission` fields; a `batchID` uuid
    /// is generated when missing and indexed under `/batch-uuids`).
    pub async fn create_batch(&self, mut submission: Map<String, Value>) -> Result<BatchId> {
        let uuid = match submission.get("batchID") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            None | Some(Value::Null) => uuid::Uuid::new_v4().to_string(),
            Some(other) => {
                return Err(EngineError::Invalid(format!(
                    "batchID must be a string, got {other}"
                )));
            }
        };
        check_name("batch uuid", &uuid)?;
        if self.tree.exists(&batch_uuid_path(&uuid)).await?.is_some() {
            return Err(EngineError::Invalid(format!(
                "a batch with batchID {uuid} already exists"
            )));
        }
        submission.insert("batchID".into(), Value::String(uuid.clone()));
        submission
            .entry("submissionDate")
            .or_insert_with(|| Value::String(self.now()));
        let path = self
            .tree
            .create(BATCH_PREFIX, None, CreateMode::PersistentSequential)
            .await?;
        let bid = BatchId::parse(lading_core::tree::split_path(&path).1)?;
        let status = BatchStatus {
            status: BatchState::Pending,
            last_modified: self.now(),
            message: None,
            extra: Map::new(),
        };
        let mut ops = vec![
            Op::create(batch_node(&bid, "submission"), json_bytes(&submission)),
            Op::create(batch_node(&bid, "status"), json_bytes(&status)),
            Op::create(batch_uuid_path(&uuid), Some(bid.to_string().into_bytes())),
        ];
        if let Some(who) = submission.get("submitter").and_then(Value::as_str) {
            // BATCH_SUBMITTERS itself is made by `init`.
            let dir = submitter_batches(who);
            self.ensure(&dir).await?;
            ops.push(Op::create(format!("{dir}/{bid}"), None));
        }
        let r = self.tree.multi(ops).await;
        if let Err(e) = r {
            // Leave no empty shell behind.
            let _ = self.tree.delete(&path, None).await;
            if matches!(e.root(), TreeError::NodeExists(p) if p.starts_with(BATCH_UUIDS)) {
                return Err(EngineError::Invalid(format!(
                    "a batch with batchID {uuid} already exists"
                )));
            }
            return Err(e.into());
        }
        self.publish(
            "batch",
            bid.as_str(),
            None,
            None,
            BatchState::Pending.name(),
        );
        Ok(bid)
    }

    /// Acquires a batch in `state` (Pending, Reporting or UpdateReporting), oldest first. A
    /// pending batch of a held collection is moved to Held instead of being returned; a paused
    /// ingest queue hands out nothing.
    pub async fn acquire_batch(&self, state: BatchState) -> Result<Option<BatchLease>> {
        if self.queue_paused_watched("ingest").await? {
            return Ok(None);
        }
        let holds = state == BatchState::Pending && self.any_collection_held().await?;
        let mut after: Option<String> = None;
        let mut live = Vec::new();
        loop {
            let page = self
                .tree
                .children_page(BATCHES, after.as_deref(), PAGE)
                .await?;
            let Some(last) = page.last().cloned() else {
                *self.live_batches.lock().unwrap_or_else(|p| p.into_inner()) = live;
                return Ok(None);
            };
            for name in &page {
                let Ok(bid) = BatchId::parse(name) else {
                    continue;
                };
                let known = self
                    .terminal_batches
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&bid)
                    .copied();
                if known.is_some_and(|t| t != state) {
                    continue;
                }
                let (status, version) = match self.batch_status(&bid).await {
                    Ok(s) => s,
                    Err(EngineError::NoBatch(_)) => {
                        // Being created (its node comes first, its status in a second
                        // `multi`): a waiter must watch for the status, or it would sleep
                        // through the batch's arrival until the sweep.
                        if live.len() < WAIT_BATCHES {
                            live.push(bid.clone());
                        }
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                if matches!(status.status, BatchState::Completed | BatchState::Deleted) {
                    let mut t = self
                        .terminal_batches
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    if t.len() >= JOB_BATCHES_KEPT {
                        t.clear();
                    }
                    t.insert(bid.clone(), status.status);
                } else if live.len() < WAIT_BATCHES {
                    live.push(bid.clone());
                }
                if status.status != state {
                    continue;
                }
                let lock = batch_node(&bid, "lock");
                let guard = Op::check(batch_node(&bid, "status"), Some(version));
                if !self.take_lock(&lock, guard).await? {
                    continue;
                }
                let lease = BatchLease {
                    batch: bid.clone(),
                    status,
                    effects: Vec::new(),
                    report: None,
                    status_version: version,
                    session: self.tree.session_id(),
                };
                if holds
                    && let Some(c) = self.batch_collection(&bid).await?
                    && self.collection_held(&c).await?
                {
                    self.batch_transition(
                        lease,
                        Event::To(BatchState::Held),
                        Some(format!("collection {c} is held")),
                    )
                    .await?;
                    continue;
                }
                return Ok(Some(lease));
            }
            after = Some(last);
        }
    }

    /// Waits until a batch in `state` can be acquired, or `timeout` passes. Woken by new
    /// batches, by status and lock changes of the live batches the last scan saw, and by the
    /// ingest pause flag; a slow sweep backs them up.
    pub async fn wait_batch(
        &self,
        state: BatchState,
        timeout: Duration,
    ) -> Result<Option<BatchLease>> {
        self.wait_batch_or(state, timeout, std::future::pending())
            .await
    }

    /// [`Engine::wait_batch`] that gives up when `cancel` completes (see
    /// [`Engine::wait_job_or`]).
    pub async fn wait_batch_or(
        &self,
        state: BatchState,
        timeout: Duration,
        cancel: impl std::future::Future<Output = ()>,
    ) -> Result<Option<BatchLease>> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut cancel = std::pin::pin!(cancel);
        loop {
            let mut watches = vec![
                self.tree.watch(BATCHES, WatchKind::Children).await?,
                self.tree
                    .watch(&queue_lock("ingest"), WatchKind::Data)
                    .await?,
            ];
            let live = self
                .live_batches
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            for bid in &live {
                watches.push(
                    self.tree
                        .watch(&batch_node(bid, "status"), WatchKind::Data)
                        .await?,
                );
                watches.push(
                    self.tree
                        .watch(&batch_node(bid, "lock"), WatchKind::Data)
                        .await?,
                );
            }
            let conflicts = self.local_conflicts.load(Ordering::Relaxed);
            let unclaimed = self.unclaimed.notified();
            let mut unclaimed = std::pin::pin!(unclaimed);
            unclaimed.as_mut().enable();
            if let Some(l) = self.acquire_batch(state).await? {
                return Ok(Some(l));
            }
            let lost_locally = self.local_conflicts.load(Ordering::Relaxed) != conflicts;
            // Batches the scan just found live but that were not watched yet.
            let now_live = self
                .live_batches
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if now_live.iter().any(|b| !live.contains(b)) {
                continue;
            }
            tokio::select! {
                _ = any_of(watches) => {}
                _ = &mut unclaimed, if lost_locally => {}
                _ = &mut cancel => return Ok(None),
                _ = tokio::time::sleep(SWEEP) => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(None),
            }
        }
    }

    /// Creates the lock at `lock` if `guard` still holds. Ok(false) when someone else has it or
    /// the guard failed (the item moved on).
    async fn try_lock(&self, lock: &str, guard: Op) -> Result<bool> {
        match self
            .tree
            .multi(vec![
                guard,
                Op::create_mode(lock, self.lock_data(), CreateMode::Ephemeral),
            ])
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if lost_race(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Claims `lock` for this process and creates it if `guard` still holds. Ok(false) when a
    /// local worker, another session, or a moved item got in the way; the claim is then dropped.
    async fn take_lock(&self, lock: &str, guard: Op) -> Result<bool> {
        if !self.claim(lock) {
            return Ok(false);
        }
        let got = self.try_lock(lock, guard).await;
        if !matches!(got, Ok(true)) {
            self.unclaim(lock);
        }
        got
    }

    fn claim(&self, lock: &str) -> bool {
        let session = self.tree.session_id();
        let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        match claimed.get(lock) {
            Some(s) if *s == session => {
                self.local_conflicts.fetch_add(1, Ordering::Relaxed);
                false
            }
            _ => {
                claimed.insert(lock.to_string(), session);
                true
            }
        }
    }

    fn unclaim(&self, lock: &str) {
        let had = self
            .claimed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(lock)
            .is_some();
        if had {
            self.unclaimed.notify_waiters();
        }
    }

    fn check_batch_lease(&self, lease: &BatchLease) -> Result<()> {
        if lease.session != self.tree.session_id() {
            return Err(lost(lease.batch.as_str()));
        }
        Ok(())
    }

    /// Moves a leased batch and releases its lock. Pending → Processing creates the batch's
    /// `states` folders (as Merritt does on acquisition) and then checks whether the batch is
    /// already finished.
    pub async fn batch_transition(
        &self,
        lease: BatchLease,
        event: Event<BatchState>,
        message: Option<String>,
    ) -> Result<BatchStatus> {
        let lock = batch_node(&lease.batch, "lock");
        let r = self
            .batch_transition_inner(&lease, event, message, false)
            .await;
        self.unclaim(&lock);
        let (status, _) = r?;
        if status.status == BatchState::Processing {
            self.maybe_report(&lease.batch).await?;
        }
        Ok(status)
    }

    /// Like [`Engine::batch_transition`] but keeps the lock (e.g. intake failing a batch
    /// goes Pending → Processing → Failed, and nobody may report it in between).
    pub async fn batch_advance(
        &self,
        mut lease: BatchLease,
        event: Event<BatchState>,
        message: Option<String>,
    ) -> Result<BatchLease> {
        match self
            .batch_transition_inner(&lease, event, message, true)
            .await
        {
            Ok((status, version)) => {
                lease.status = status;
                lease.status_version = version;
                lease.effects.clear();
                lease.report = None;
                Ok(lease)
            }
            Err(e) => {
                self.unclaim(&batch_node(&lease.batch, "lock"));
                Err(e)
            }
        }
    }

    async fn batch_transition_inner(
        &self,
        lease: &BatchLease,
        event: Event<BatchState>,
        message: Option<String>,
        keep_lock: bool,
    ) -> Result<(BatchStatus, i32)> {
        self.check_batch_lease(lease)?;
        let bid = &lease.batch;
        let to = lease.status.status.resolve(event)?;
        let mut status = lease.status.clone();
        status.status = to;
        status.last_modified = self.now();
        status.message = message;
        let lock = batch_node(bid, "lock");
        let mut ops = vec![
            Op::check(&lock, None),
            Op::set(
                batch_node(bid, "status"),
                json_bytes(&status),
                Some(lease.status_version),
            ),
        ];
        ops.extend(self.states_ops(bid, to).await?);
        if let Some(report) = &lease.report {
            let path = batch_node(bid, "status-report");
            let mut report = report.clone();
            report.last_modified = self.now();
            ops.push(if self.tree.exists(&path).await?.is_some() {
                Op::set(&path, json_bytes(&report), None)
            } else {
                Op::create(&path, json_bytes(&report))
            });
        }
        ops.extend(self.effect_ops(&lease.effects));
        if !keep_lock {
            ops.push(Op::delete(&lock, None));
        }
        if let Err(e) = self.tree.multi(ops).await {
            if matches!(e.root(), TreeError::BadVersion { .. }) {
                // Someone moved the batch under us (an admin requeue reopened it): the lock
                // is still ours and must not outlive this failed move.
                self.drop_own_lock(&lock).await;
            }
            return Err(self.lease_error(e, bid.as_str()));
        }
        self.publish(
            "batch",
            bid.as_str(),
            None,
            Some(lease.status.status.name()),
            to.name(),
        );
        Ok((status, lease.status_version + 1))
    }

    /// Deletes `lock` if this session holds it (best effort: the session's end removes it
    /// anyway).
    async fn drop_own_lock(&self, lock: &str) {
        if let Ok(Some(stat)) = self.tree.exists(lock).await
            && stat.ephemeral_owner == self.tree.session_id()
        {
            let _ = self.tree.delete(lock, Some(stat.version)).await;
        }
    }

    fn lease_error(&self, e: TreeError, what: &str) -> EngineError {
        match (e.failed_op(), e.root()) {
            (Some(_), TreeError::NoNode(p)) if p.ends_with("/lock") => lost(what),
            (Some(_), TreeError::BadVersion { path, .. }) if path.ends_with("/status") => {
                lost(what)
            }
            (_, TreeError::SessionExpired) => lost(what),
            _ => e.into(),
        }
    }

    /// Gives a batch back without moving it.
    pub async fn release_batch_lease(&self, lease: BatchLease) -> Result<()> {
        let lock = batch_node(&lease.batch, "lock");
        self.unclaim(&lock);
        self.check_batch_lease(&lease)?;
        match self.tree.delete(&lock, None).await {
            Ok(()) => Ok(()),
            Err(TreeError::NoNode(_)) => Err(lost(lease.batch.as_str())),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes `/batches/BID/status-report` under the batch lease.
    pub async fn write_status_report(
        &self,
        lease: &BatchLease,
        report: &StatusReport,
    ) -> Result<()> {
        self.check_batch_lease(lease)?;
        let path = batch_node(&lease.batch, "status-report");
        let mut report = report.clone();
        report.last_modified = self.now();
        let write = if self.tree.exists(&path).await?.is_some() {
            Op::set(&path, json_bytes(&report), None)
        } else {
            Op::create(&path, json_bytes(&report))
        };
        self.tree
            .multi(vec![
                Op::check(batch_node(&lease.batch, "lock"), None),
                write,
            ])
            .await
            .map_err(|e| self.lease_error(e, lease.batch.as_str()))?;
        Ok(())
    }

    /// The completed and failed jobs of a batch, as a report.
    pub async fn build_report(&self, batch: &BatchId) -> Result<StatusReport> {
        let list = |f: &'static str| async move {
            match self.tree.children(&batch_ref_folder(batch, f)).await {
                Ok(c) => Ok(c),
                Err(TreeError::NoNode(_)) => Ok(vec![]),
                Err(e) => Err(EngineError::from(e)),
            }
        };
        Ok(StatusReport {
            last_modified: self.now(),
            completed_jobs: list("batch-completed").await?,
            failed_jobs: list("batch-failed").await?,
            extra: Map::new(),
        })
    }

    /// Moves the batch to Reporting if it is Processing and its last job has left
    /// `batch-processing`. Safe to call any number of times, from anywhere: exactly one caller
    /// wins. Returns whether this call moved it.
    pub async fn maybe_report(&self, batch: &BatchId) -> Result<bool> {
        for _ in 0..MAX_OPTIMISTIC {
            let (status, version) = match self.batch_status(batch).await {
                Ok(s) => s,
                Err(EngineError::NoBatch(_)) => return Ok(false),
                Err(e) => return Err(e),
            };
            if status.status != BatchState::Processing {
                return Ok(false);
            }
            // One child is enough to know it is not empty; a count would cost the batch size.
            match self
                .tree
                .children_page(&batch_ref_folder(batch, "batch-processing"), None, 1)
                .await
            {
                Ok(c) if c.is_empty() => {}
                Ok(_) | Err(TreeError::NoNode(_)) => return Ok(false),
                Err(e) => return Err(e.into()),
            }
            let mut next = status.clone();
            next.status = BatchState::Reporting;
            next.last_modified = self.now();
            next.message = None;
            let lock = batch_node(batch, "lock");
            let r = self
                .tree
                .multi(vec![
                    Op::create_mode(&lock, None, CreateMode::Ephemeral),
                    Op::set(
                        batch_node(batch, "status"),
                        json_bytes(&next),
                        Some(version),
                    ),
                    Op::delete(&lock, None),
                ])
                .await;
            match r {
                Ok(_) => {
                    self.publish(
                        "batch",
                        batch.as_str(),
                        None,
                        Some(BatchState::Processing.name()),
                        BatchState::Reporting.name(),
                    );
                    return Ok(true);
                }
                // Someone holds the batch: they will check again when they let go.
                Err(e) if matches!(e.root(), TreeError::NodeExists(_)) => return Ok(false),
                Err(e) if matches!(e.root(), TreeError::BadVersion { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(EngineError::Conflict(batch.to_string()))
    }

    /// Runs [`Engine::maybe_report`] over every Processing batch: the safety net for a worker
    /// that crashed between a job's last transition and the batch check.
    pub async fn sweep_reporting(&self) -> Result<usize> {
        let mut moved = 0;
        for b in self.batch_ids().await? {
            if self.maybe_report(&b).await? {
                moved += 1;
            }
        }
        Ok(moved)
    }

    /// Waits until a job leaves `batch-processing` of some Processing batch (whoever moved it:
    /// this process, another, or another tool such as Merritt's own library), or a batch is
    /// added, or `timeout` passes; then moves every such batch that has finished to
    /// Reporting. Returns how many it moved. Watches at most [`WATCH_PROCESSING`] batches;
    /// [`Engine::sweep_reporting`] remains the net for the rest.
    pub async fn watch_finishing_batches(&self, timeout: Duration) -> Result<usize> {
        let mut processing = Vec::new();
        let mut watches = vec![self.tree.watch(BATCHES, WatchKind::Children).await?];
        for b in self.batch_ids().await?.into_iter().rev() {
            if processing.len() >= WATCH_PROCESSING {
                break;
            }
            if self
                .terminal_batches
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(&b)
            {
                continue;
            }
            match self.batch_status(&b).await {
                Ok((st, _)) if st.status == BatchState::Processing => {}
                Ok(_) | Err(EngineError::NoBatch(_)) => continue,
                Err(e) => return Err(e),
            }
            let folder = batch_ref_folder(&b, "batch-processing");
            match self.tree.watch(&folder, WatchKind::Children).await {
                Ok(w) => watches.push(w),
                Err(TreeError::NoNode(_)) => {}
                Err(e) => return Err(e.into()),
            }
            processing.push(b);
        }
        // Finished before the watch was set: caught now.
        let mut moved = 0;
        for b in &processing {
            if self.maybe_report(b).await? {
                moved += 1;
            }
        }
        if moved > 0 {
            return Ok(moved);
        }
        let _ = tokio::time::timeout(timeout, any_of(watches)).await;
        for b in &processing {
            if self.maybe_report(b).await? {
                moved += 1;
            }
        }
        Ok(moved)
    }

    /// The ops that give a batch moving to `to` its `states` folders when it has none. A batch
    /// going Processing needs them for its jobs; Merritt takes any batch without `states` for
    /// pending, so a held batch gets them too and Merritt's consumers leave it alone.
    async fn states_ops(&self, bid: &BatchId, to: BatchState) -> Result<Vec<Op>> {
        if !matches!(to, BatchState::Processing | BatchState::Held)
            || self.tree.exists(&batch_states(bid)).await?.is_some()
        {
            return Ok(Vec::new());
        }
        let mut ops = vec![Op::create(batch_states(bid), None)];
        ops.extend(
            BATCH_FOLDERS
                .iter()
                .map(|f| Op::create(batch_ref_folder(bid, f), None)),
        );
        Ok(ops)
    }

    /// Admin action on an unlocked batch.
    async fn admin_batch(
        &self,
        batch: &BatchId,
        to: BatchState,
        message: Option<String>,
    ) -> Result<BatchStatus> {
        let (status, version) = self.batch_status(batch).await?;
        let lease = BatchLease {
            batch: batch.clone(),
            status,
            effects: Vec::new(),
            report: None,
            status_version: version,
            session: self.tree.session_id(),
        };
        let lock = batch_node(batch, "lock");
        let ops = vec![Op::create_mode(&lock, None, CreateMode::Ephemeral)];
        // Take the lock inside the multi: fails with Locked if a worker has it.
        let to_state = lease.status.status.resolve(Event::To(to))?;
        let mut next = lease.status.clone();
        next.status = to_state;
        next.last_modified = self.now();
        next.message = message;
        let mut ops = ops;
        ops.push(Op::set(
            batch_node(batch, "status"),
            json_bytes(&next),
            Some(version),
        ));
        ops.extend(self.states_ops(batch, to_state).await?);
        ops.push(Op::delete(&lock, None));
        match self.tree.multi(ops).await {
            Ok(_) => {}
            Err(e) if matches!(e.root(), TreeError::NodeExists(_)) => {
                return Err(if lease.status.status == BatchState::Held {
                    EngineError::ForeignLocked(batch.to_string())
                } else {
                    EngineError::Locked(batch.to_string())
                });
            }
            Err(e) if matches!(e.root(), TreeError::BadVersion { .. }) => {
                return Err(EngineError::Conflict(batch.to_string()));
            }
            Err(e) => return Err(e.into()),
        }
        self.publish(
            "batch",
            batch.as_str(),
            None,
            Some(lease.status.status.name()),
            to_state.name(),
        );
        Ok(next)
    }

    /// Admin: Pending → Held.
    pub async fn hold_batch(&self, batch: &BatchId) -> Result<BatchStatus> {
        self.admin_batch(batch, BatchState::Held, Some("held by admin".into()))
            .await
    }

    /// Admin: Held → Pending.
    pub async fn release_batch(&self, batch: &BatchId) -> Result<BatchStatus> {
        self.admin_batch(batch, BatchState::Pending, None).await
    }

    /// Admin: Failed → UpdateReporting.
    pub async fn update_reporting(&self, batch: &BatchId) -> Result<BatchStatus> {
        self.admin_batch(batch, BatchState::UpdateReporting, None)
            .await
    }

    /// Admin: Failed or Held → Deleted. Every job of the batch must be deletable (Failed,
    /// Held, Completed or Deleted); Failed and Held jobs are marked Deleted too.
    pub async fn delete_batch(&self, batch: &BatchId) -> Result<BatchStatus> {
        let (status, _) = self.batch_status(batch).await?;
        status.status.resolve(Event::To(BatchState::Deleted))?;
        let info = self.batch(batch).await?;
        let jobs: Vec<JobId> = info
            .jobs
            .values()
            .flatten()
            .filter_map(|j| JobId::parse(j).ok())
            .collect();
        for j in &jobs {
            let (s, _) = self.job_status(j).await?;
            if !s.status.is_deletable() {
                return Err(EngineError::Invalid(format!(
                    "batch {batch} cannot be deleted: its job {j} is {} (only Failed, Held, Completed or Deleted jobs may be)",
                    s.status
                )));
            }
        }
        for j in &jobs {
            let (s, _) = self.job_status(j).await?;
            if matches!(s.status, JobState::Failed | JobState::Held) {
                self.admin_job(j, |p| p.apply(Event::To(JobState::Deleted)))
                    .await?;
            }
        }
        self.admin_batch(batch, BatchState::Deleted, Some("deleted by admin".into()))
            .await
    }

    // ----- jobs ----------------------------------------------------------------------------

    /// Creates a Pending job in a batch the caller holds (batch intake).
    pub async fn create_job(&self, lease: &BatchLease, spec: JobSpec) -> Result<JobId> {
        self.check_batch_lease(lease)?;
        let priority = spec.priority.unwrap_or(DEFAULT_PRIORITY);
        check_priority(priority)?;
        let bid = &lease.batch;
        if self
            .tree
            .exists(&batch_ref_folder(bid, "batch-processing"))
            .await?
            .is_none()
        {
            // Intake creates jobs after the Processing move made the folders, or before it; make
            // sure the folders exist without disturbing Merritt's "no states = pending" rule
            // for batches nobody holds.
            let mut ops = vec![Op::check(batch_node(bid, "lock"), None)];
            if self.tree.exists(&batch_states(bid)).await?.is_none() {
                ops.push(Op::create(batch_states(bid), None));
            }
            for f in BATCH_FOLDERS {
                if self.tree.exists(&batch_ref_folder(bid, f)).await?.is_none() {
                    ops.push(Op::create(batch_ref_folder(bid, f), None));
                }
            }
            match self.tree.multi(ops).await {
                Ok(_) => {}
                // A concurrent create_job of the same intake made them first.
                Err(e) if matches!(e.root(), TreeError::NodeExists(_)) => {}
                Err(e) => return Err(self.lease_error(e, bid.as_str())),
            }
        }
        let path = self
            .tree
            .create(JOB_PREFIX, None, CreateMode::PersistentSequential)
            .await?;
        let jid = JobId::parse(lading_core::tree::split_path(&path).1)?;
        let status = JobStatus {
            status: JobState::Pending,
            last_successful_status: None,
            last_modified: self.now(),
            retry_count: 0,
            message: None,
            extra: Map::new(),
        };
        let ops = vec![
            Op::check(batch_node(bid, "lock"), None),
            Op::create(job_node(&jid, "bid"), Some(bid.to_string().into_bytes())),
            Op::create(
                job_node(&jid, "configuration"),
                json_bytes(&spec.configuration),
            ),
            Op::create(job_node(&jid, "status"), json_bytes(&status)),
            Op::create(
                job_node(&jid, "priority"),
                Some(priority.to_string().into_bytes()),
            ),
            Op::create(
                job_node(&jid, "space_needed"),
                Some(spec.space_needed.to_string().into_bytes()),
            ),
            Op::create(job_node(&jid, "identifiers"), json_bytes(&spec.identifiers)),
            Op::create(job_node(&jid, "metadata"), json_bytes(&spec.metadata)),
            Op::create(job_ref(JobState::Pending, priority, &jid), None),
            Op::create(batch_ref(bid, "batch-processing", &jid), None),
        ];
        if let Err(e) = self.tree.multi(ops).await {
            let _ = self.tree.delete(&path, None).await;
            return Err(self.lease_error(e, bid.as_str()));
        }
        self.publish(
            "job",
            jid.as_str(),
            Some(bid),
            None,
            JobState::Pending.name(),
        );
        Ok(jid)
    }

    /// Acquires the next job in `state`: lowest priority number first, then oldest. Reads the
    /// head of the state folder a page at a time, so the cost does not grow with the queue.
    /// In Pending, a job of a held collection is moved to Held instead of being returned; a
    /// paused ingest queue hands out nothing.
    pub async fn acquire_job(&self, state: JobState) -> Result<Option<JobLease>> {
        let folder = job_state_folder(state);
        let mut after: Option<String> = None;
        let mut scanned = 0;
        // Pause and holds are read only once there is something to take: an idle worker polling
        // an empty state costs no round trip on a backend that caches its queues.
        let mut holds = None;
        while scanned < MAX_SCAN {
            let page = self
                .tree
                .children_page(&folder, after.as_deref(), PAGE)
                .await?;
            let Some(last) = page.last().cloned() else {
                return Ok(None);
            };
            let holds = match holds {
                Some(h) => h,
                None => {
                    if self.queue_paused_watched("ingest").await? {
                        return Ok(None);
                    }
                    let h = state == JobState::Pending && self.any_collection_held().await?;
                    holds = Some(h);
                    h
                }
            };
            // Jobs found locked by others a moment ago go last: tried only when nothing else
            // is free, so a lock that has just gone is still found.
            let (mut names, busy): (Vec<&String>, Vec<&String>) = page
                .iter()
                .filter(|n| !self.is_deferred(&folder, n))
                .partition(|n| !self.is_busy(&folder, n));
            // Deferred jobs (parked for a quota slot, waiting to retry) are passed over in
            // memory and do not count: thousands of them never hide a due job behind them.
            scanned += names.len() + busy.len();
            // At most one of them per call, the one found locked longest ago: every such job
            // is still tried in turn, without a burst of refused writes.
            let busy = busy.into_iter().min_by_key(|n| self.busy_since(&folder, n));
            let free = names.len();
            names.extend(busy);
            // Once this process has met other workers at the head of a queue, it spreads its
            // picks from the start; a lone worker takes strictly the head.
            let mut contended = self.contended_lately(&folder);
            for i in 0..names.len() {
                if contended && i < free {
                    let j = i + spread_pick(&names[i..free]);
                    names.swap(i, j);
                }
                let name = names[i];
                let Some((priority, jid)) = parse_job_ref(name) else {
                    continue;
                };
                let lock = job_node(&jid, "lock");
                if !self
                    .take_lock(&lock, Op::check(join(&folder, name), None))
                    .await?
                {
                    self.mark_busy(&folder, name);
                    contended = true;
                    continue;
                }
                if let Some(lease) = self
                    .lease_locked(&folder, name, &jid, priority, state, holds)
                    .await?
                {
                    return Ok(Some(lease));
                }
            }
            after = Some(last);
        }
        Ok(None)
    }

    /// The lease of job `jid`, referenced as `name` in `folder`, once its lock is taken; or
    /// `None` when it is not to be worked on now, and the caller tries another: deferred (its
    /// retry time has not come; the lock is given back) or moved to Held (`holds`: some
    /// collection is held, and it is the job's).
    async fn lease_locked(
        &self,
        folder: &str,
        name: &str,
        jid: &JobId,
        priority: u8,
        state: JobState,
        holds: bool,
    ) -> Result<Option<JobLease>> {
        let lease = match self.load_lease(jid, priority, state).await {
            Ok(l) => l,
            Err(e) => {
                let lock = job_node(jid, "lock");
                let _ = self.tree.delete(&lock, None).await;
                self.unclaim(&lock);
                return Err(e);
            }
        };
        if let Some(at) = retry_at(&lease.status)
            && at > self.clock.now_ms()
        {
            // Deferred by a worker after a transient error: not due yet.
            self.mark_deferred(folder, name, at);
            self.release_job_lease(lease).await?;
            return Ok(None);
        }
        if holds
            && let Some(c) = self.job_collection(jid).await?
            && self.collection_held(&c).await?
        {
            self.job_transition(
                lease,
                Event::To(JobState::Held),
                Some(format!("collection {c} is held")),
            )
            .await?;
            return Ok(None);
        }
        Ok(Some(lease))
    }

    /// A job this process could lock next in the first of `states` that has one free, read
    /// from memory on a backend that caches its queues, and claimed locally so no local
    /// worker tries it too. `None` when the queue is paused or nothing is free; Pending is
    /// passed over while a collection is held (a full acquisition moves such jobs to Held).
    async fn claim_next(&self, states: &[JobState]) -> Result<Option<Candidate>> {
        let mut checked_pause = false;
        for &state in states {
            let folder = job_state_folder(state);
            let page = self.tree.children_page(&folder, None, 2 * SPREAD).await?;
            if page.is_empty() {
                continue;
            }
            if !checked_pause {
                if self.queue_paused_watched("ingest").await? {
                    return Ok(None);
                }
                checked_pause = true;
            }
            if state == JobState::Pending && self.any_collection_held().await? {
                continue;
            }
            // Only as many as a pick spreads over are looked at.
            let free: Vec<&String> = page
                .iter()
                .filter(|n| !self.is_deferred(&folder, n) && !self.is_busy(&folder, n))
                .take(SPREAD)
                .collect();
            let start = if self.contended_lately(&folder) {
                spread_pick(&free)
            } else {
                0
            };
            let ordered = free[start..].iter().chain(&free[..start]);
            for name in ordered {
                let Some((priority, jid)) = parse_job_ref(name) else {
                    continue;
                };
                let lock = job_node(&jid, "lock");
                if self.claim(&lock) {
                    return Ok(Some(Candidate {
                        reference: join(&folder, name),
                        name: name.to_string(),
                        folder,
                        lock,
                        priority,
                        jid,
                        state,
                    }));
                }
            }
        }
        Ok(None)
    }

    fn is_deferred(&self, folder: &str, reference: &str) -> bool {
        let mut deferred = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        if deferred.is_empty() {
            return false;
        }
        let key = join(folder, reference);
        match deferred.get(&key) {
            Some(at) if *at > self.clock.now_ms() => true,
            Some(_) => {
                deferred.remove(&key);
                false
            }
            None => false,
        }
    }

    fn mark_deferred(&self, folder: &str, reference: &str, at_ms: u64) {
        let mut deferred = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        if deferred.len() > 10_000 {
            let now = self.clock.now_ms();
            deferred.retain(|_, at| *at > now);
        }
        deferred.insert(join(folder, reference), at_ms);
    }

    /// How long until the earliest job this process saw deferred becomes due.
    fn next_due(&self) -> Option<Duration> {
        let now = self.clock.now_ms();
        self.deferred
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|at| **at > now)
            .min()
            .map(|at| Duration::from_millis(at - now))
    }

    fn is_busy(&self, folder: &str, reference: &str) -> bool {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let Some(f) = busy.get_mut(folder) else {
            return false;
        };
        match f.names.get(reference) {
            Some(t) if t.elapsed() < BUSY_SKIP => true,
            Some(_) => {
                f.names.remove(reference);
                false
            }
            None => false,
        }
    }

    /// References of `folder` found locked lately, newest first, at most `n`; older ones are
    /// forgotten here (a job that moved on leaves its entry behind).
    fn busy_names(&self, folder: &str, n: usize) -> Vec<String> {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let Some(f) = busy.get_mut(folder) else {
            return Vec::new();
        };
        f.names.retain(|_, t| t.elapsed() < BUSY_SKIP);
        let mut v: Vec<(&String, &std::time::Instant)> = f.names.iter().collect();
        if v.len() > n {
            v.select_nth_unstable_by(n, |a, b| b.1.cmp(a.1));
            v.truncate(n);
        }
        v.sort_by(|a, b| b.1.cmp(a.1));
        v.into_iter().map(|(k, _)| k.clone()).collect()
    }

    fn busy_since(&self, folder: &str, reference: &str) -> Option<std::time::Instant> {
        let busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        busy.get(folder)?.names.get(reference).copied()
    }

    /// Whether this process met another worker at the head of `folder` lately.
    fn contended_lately(&self, folder: &str) -> bool {
        let busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        busy.get(folder)
            .and_then(|f| f.last)
            .is_some_and(|t| t.elapsed() < BUSY_SKIP)
    }

    fn mark_busy(&self, folder: &str, reference: &str) {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let f = busy.entry(folder.to_string()).or_default();
        if f.names.len() > 10_000 {
            f.names.retain(|_, t| t.elapsed() < BUSY_SKIP);
        }
        let now = std::time::Instant::now();
        f.names.insert(reference.to_string(), now);
        f.last = Some(now);
    }

    async fn load_lease(&self, jid: &JobId, priority: u8, state: JobState) -> Result<JobLease> {
        let (status, version) = self.job_status(jid).await?;
        if status.status != state {
            return Err(EngineError::Corrupt {
                path: job_node(jid, "status"),
                reason: format!(
                    "status says {} but the job is referenced under {}",
                    status.status,
                    state.node_name()
                ),
            });
        }
        Ok(JobLease {
            failure_kind: None,
            effects: Vec::new(),
            batch: self.job_batch(jid).await?,
            job: jid.clone(),
            status,
            priority,
            status_version: version,
            session: self.tree.session_id(),
        })
    }

    /// Waits until a job in `state` can be acquired, or `timeout` passes. Woken by changes to
    /// the state folder (and to the ingest pause flag), not by polling.
    pub async fn wait_job(&self, state: JobState, timeout: Duration) -> Result<Option<JobLease>> {
        self.wait_job_or(state, timeout, std::future::pending())
            .await
    }

    /// [`Engine::wait_job`] that also gives up (`Ok(None)`) when `cancel` completes. Cancel
    /// this way rather than by dropping the future: `cancel` is only looked at while waiting,
    /// never in the middle of taking a lock, so nothing is left claimed or locked.
    pub async fn wait_job_or(
        &self,
        state: JobState,
        timeout: Duration,
        cancel: impl std::future::Future<Output = ()>,
    ) -> Result<Option<JobLease>> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut cancel = std::pin::pin!(cancel);
        loop {
            let folder_watch = self
                .tree
                .watch(&job_state_folder(state), WatchKind::Children)
                .await?;
            let pause_watch = self
                .tree
                .watch(&queue_lock("ingest"), WatchKind::Data)
                .await?;
            let conflicts = self.local_conflicts.load(Ordering::Relaxed);
            let unclaimed = self.unclaimed.notified();
            let mut unclaimed = std::pin::pin!(unclaimed);
            unclaimed.as_mut().enable();
            if let Some(l) = self.acquire_job(state).await? {
                return Ok(Some(l));
            }
            let lost_locally = self.local_conflicts.load(Ordering::Relaxed) != conflicts;
            // Jobs that are there but locked become free when their lock goes (a worker
            // released it, or its session expired): watch those locks too.
            let mut lock_watches = Vec::new();
            for name in self.busy_names(&job_state_folder(state), WAIT_LOCKS) {
                if let Some((_, jid)) = parse_job_ref(&name) {
                    lock_watches.push(
                        self.tree
                            .watch(&job_node(&jid, "lock"), WatchKind::Data)
                            .await?,
                    );
                }
            }
            let any_lock = any_of(lock_watches);
            let due = self.next_due().unwrap_or(SWEEP).min(SWEEP);
            tokio::select! {
                _ = folder_watch => {}
                _ = pause_watch => {}
                _ = any_lock => {}
                _ = &mut unclaimed, if lost_locally => {}
                // A job deferred after a transient error becomes due.
                _ = tokio::time::sleep(due) => {}
                _ = &mut cancel => return Ok(None),
                // The safety net: a slow sweep, should a wake-up ever be missed.
                _ = tokio::time::sleep(SWEEP) => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(None),
            }
        }
    }

    fn check_job_lease(&self, lease: &JobLease) -> Result<()> {
        if lease.session != self.tree.session_id() {
            return Err(lost(lease.job.as_str()));
        }
        Ok(())
    }

    /// The ops that move a job's references from `old` to `new` state (and batch folder).
    /// Ops creating the batch reference folder a job moves into when no one has made it yet:
    /// Merritt creates `states/batch-processing` when it first needs it and the others only
    /// when its own code moves a job there, so a batch it made may lack them. Folders seen
    /// are remembered (they are never removed while the batch lives).
    async fn folder_ops(
        &self,
        batch: &BatchId,
        old: JobState,
        new: JobState,
        ops: &mut Vec<Op>,
    ) -> Result<()> {
        let folder = new.batch_folder();
        if folder == old.batch_folder() {
            return Ok(());
        }
        let path = batch_ref_folder(batch, folder);
        if self
            .known_folders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&path)
        {
            return Ok(());
        }
        if self.tree.exists(&path).await?.is_some() {
            let mut known = self.known_folders.lock().unwrap_or_else(|p| p.into_inner());
            if known.len() >= JOB_BATCHES_KEPT {
                known.clear();
            }
            known.insert(path);
            return Ok(());
        }
        if self.tree.exists(&batch_states(batch)).await?.is_none() {
            ops.push(Op::create(batch_states(batch), None));
        }
        ops.push(Op::create(path, None));
        Ok(())
    }

    fn move_ops(
        &self,
        job: &JobId,
        batch: &BatchId,
        priority: u8,
        old: JobState,
        new: JobState,
        ops: &mut Vec<Op>,
    ) {
        if old != new {
            ops.push(Op::delete(job_ref(old, priority, job), None));
            ops.push(Op::create(job_ref(new, priority, job), None));
        }
        let (of, nf) = (old.batch_folder(), new.batch_folder());
        if of != nf {
            ops.push(Op::delete(batch_ref(batch, of, job), None));
            ops.push(Op::create(batch_ref(batch, nf, job), None));
        }
    }

    /// Moves a leased job by success, fail or an explicit target, in one `multi`, and
    /// releases the lock. Returns the new status.
    pub async fn job_transition(
        &self,
        lease: JobLease,
        event: Event<JobState>,
        message: Option<String>,
    ) -> Result<JobStatus> {
        let lock = job_node(&lease.job, "lock");
        let r = self
            .job_transition_inner(&lease, event, message, false)
            .await;
        self.unclaim(&lock);
        let (status, _) = r?;
        if status.status.batch_folder() != "batch-processing" {
            self.maybe_report(&lease.batch).await?;
        }
        Ok(status)
    }

    /// Like [`Engine::job_transition`] but keeps the lock: the caller goes on to work on the
    /// job's next stage itself. Returns the updated lease.
    pub async fn job_advance(
        &self,
        mut lease: JobLease,
        event: Event<JobState>,
        message: Option<String>,
    ) -> Result<JobLease> {
        let (status, version) = match self
            .job_transition_inner(&lease, event, message, true)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                self.unclaim(&job_node(&lease.job, "lock"));
                return Err(e);
            }
        };
        lease.status = status;
        lease.status_version = version;
        if lease.status.status.batch_folder() != "batch-processing" {
            self.maybe_report(&lease.batch).await?;
        }
        Ok(lease)
    }

    async fn job_transition_inner(
        &self,
        lease: &JobLease,
        event: Event<JobState>,
        message: Option<String>,
        keep_lock: bool,
    ) -> Result<(JobStatus, i32)> {
        let (mut ops, status) = self.transition_plan(lease, event, message).await?;
        let lock = job_node(&lease.job, "lock");
        if !keep_lock {
            ops.push(Op::delete(&lock, None));
        }
        if let Err(e) = self.tree.multi(ops).await {
            if matches!(e.root(), TreeError::BadVersion { .. }) {
                self.drop_own_lock(&lock).await;
            }
            return Err(self.lease_error(e, lease.job.as_str()));
        }
        self.publish_move(lease, &status);
        Ok((status, lease.status_version + 1))
    }

    /// Moves [`Engine::next_score`] by `by`, within its bounds.
    fn score_next(&self, by: i32) {
        let _ = self
            .next_score
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some((v + by).clamp(-NEXT_SCORE_MAX, NEXT_SCORE_MAX))
            });
    }

    fn publish_move(&self, lease: &JobLease, status: &JobStatus) {
        self.publish(
            "job",
            lease.job.as_str(),
            Some(&lease.batch),
            Some(lease.status.status.name()),
            status.status.name(),
        );
    }

    /// The ops of a leased job's move (the lock is checked, not dropped) and its new status.
    async fn transition_plan(
        &self,
        lease: &JobLease,
        event: Event<JobState>,
        message: Option<String>,
    ) -> Result<(Vec<Op>, JobStatus)> {
        self.check_job_lease(lease)?;
        let old = &lease.status;
        let progress = JobProgress {
            state: old.status,
            last_successful: old.last_successful_status,
            retry_count: old.retry_count,
        };
        let next = progress.apply(event)?;
        let mut extra = old.extra.clone();
        if next.state != old.status {
            if next.state == JobState::Failed {
                // What failed, how, after how many attempts: kept with the failed job.
                let attempts = extra
                    .get(ATTEMPTS_FIELD)
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
                    + 1;
                extra.insert(FAILED_STAGE_FIELD.into(), Value::from(old.status.name()));
                extra.insert(
                    FAILURE_KIND_FIELD.into(),
                    Value::from(lease.failure_kind.unwrap_or("fatal")),
                );
                extra.insert(FAILED_ATTEMPTS_FIELD.into(), Value::from(attempts));
            } else {
                clear_failure(&mut extra);
            }
            // Attempts and retry times belong to the stage being left.
            extra.remove(ATTEMPTS_FIELD);
            extra.remove(RETRY_AT_FIELD);
        }
        // A space reservation lasts until the download ends, either way.
        let release = extra.contains_key(RESERVED_FIELD)
            && !matches!(next.state, JobState::Provisioning | JobState::Downloading);
        if release {
            extra.remove(RESERVED_FIELD);
        }
        let status = JobStatus {
            status: next.state,
            last_successful_status: next.last_successful,
            last_modified: self.now(),
            retry_count: next.retry_count,
            message,
            extra,
        };
        let lock = job_node(&lease.job, "lock");
        let mut ops = vec![
            Op::check(&lock, None),
            Op::set(
                job_node(&lease.job, "status"),
                json_bytes(&status),
                Some(lease.status_version),
            ),
        ];
        self.folder_ops(&lease.batch, old.status, next.state, &mut ops)
            .await?;
        self.move_ops(
            &lease.job,
            &lease.batch,
            lease.priority,
            old.status,
            next.state,
            &mut ops,
        );
        if release {
            ops.push(Op::delete(
                reserve::reservation_path(lease.job.as_str()),
                None,
            ));
        }
        ops.extend(self.effect_ops(&lease.effects));
        Ok((ops, status))
    }

    /// Moves a leased job as [`Engine::job_transition`] does and, in the same `multi`, locks
    /// the next job to work on in the first of `next` that has one free: a daemon going
    /// straight on to its next job pays one round trip per job, not two. Every stage still
    /// releases its job and takes the next one by its lock, so nothing else changes for
    /// other workers. When someone else locked that job first, the move is tried once more
    /// with the next free job, then made alone with no lease coming back (acquire as usual
    /// then); an engine that keeps losing such races mostly moves alone for a while
    /// ([`Engine::next_score`]). Returns the new status and the next lease.
    pub async fn job_transition_then_acquire(
        &self,
        lease: JobLease,
        event: Event<JobState>,
        message: Option<String>,
        next: &[JobState],
    ) -> Result<(JobStatus, Option<JobLease>)> {
        let lock = job_node(&lease.job, "lock");
        let (mut move_ops, status) = match self.transition_plan(&lease, event, message).await {
            Ok(p) => p,
            Err(e) => {
                self.unclaim(&lock);
                return Err(e);
            }
        };
        move_ops.push(Op::delete(&lock, None));
        let probe = self
            .next_calls
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(NEXT_PROBE);
        let mut tries = if self.next_score.load(Ordering::Relaxed) < 0 && !probe {
            NEXT_TRIES
        } else {
            0
        };
        let mut taken: Option<Candidate> = None;
        while tries < NEXT_TRIES {
            let c = match self.claim_next(next).await {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => {
                    self.unclaim(&lock);
                    return Err(e);
                }
            };
            tries += 1;
            let mut ops = move_ops.clone();
            let ours = ops.len();
            ops.push(Op::check(&c.reference, None));
            ops.push(Op::create_mode(
                &c.lock,
                self.lock_data(),
                CreateMode::Ephemeral,
            ));
            match self.tree.multi(ops).await {
                Ok(_) => {
                    self.score_next(1);
                    taken = Some(c);
                    break;
                }
                Err(e) => {
                    self.unclaim(&c.lock);
                    if !(e.failed_op().is_some_and(|i| i >= ours) && lost_race(&e)) {
                        self.unclaim(&lock);
                        return Err(self.lease_error(e, lease.job.as_str()));
                    }
                    // Another worker took that job, or it moved on: try the next free one
                    // with the move again (each try costs what the move alone would).
                    self.mark_busy(&c.folder, &c.name);
                    self.score_next(-2);
                }
            }
        }
        if taken.is_none()
            && let Err(e) = self.tree.multi(move_ops).await
        {
            self.unclaim(&lock);
            return Err(self.lease_error(e, lease.job.as_str()));
        }
        self.unclaim(&lock);
        self.publish_move(&lease, &status);
        let reported = if status.status.batch_folder() != "batch-processing" {
            self.maybe_report(&lease.batch).await
        } else {
            Ok(false)
        };
        // The move is made whatever happens to the next job: a job that cannot be leased now
        // (deferred, or unreadable: its lock is dropped) is left for a full acquisition.
        let next = match taken {
            None => None,
            Some(c) => match self
                .lease_locked(&c.folder, &c.name, &c.jid, c.priority, c.state, false)
                .await
            {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(job = %c.jid, error = %e, "cannot lease the next job");
                    None
                }
            },
        };
        match reported {
            Ok(_) => Ok((status, next)),
            Err(e) => {
                if let Some(n) = next {
                    let _ = self.release_job_lease(n).await;
                }
                Err(e)
            }
        }
    }

    /// Makes a job deferred in `state` due now (it waited for something that has come, e.g.
    /// a quota slot): its retry time is cleared and its reference re-made, so waiting workers
    /// look again, in one `multi` that also takes and drops its lock (so no worker holds it
    /// meanwhile). This process forgets the deferral at once; another process that saw the
    /// job deferred takes it when its own record of the retry time runs out. Returns false
    /// when the job is not deferred in `state` or is locked.
    pub async fn wake_job(&self, state: JobState, job: &JobId) -> Result<bool> {
        let (mut status, version) = self.job_status(job).await?;
        if status.status != state {
            return Ok(false);
        }
        let priority = self.job_priority(job).await?;
        let folder = job_state_folder(state);
        let name = job_ref_name(priority, job);
        let forget = || {
            self.deferred
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&join(&folder, &name));
        };
        if retry_at(&status).is_none_or(|at| at <= self.clock.now_ms()) {
            forget();
            return Ok(true);
        }
        status.extra.remove(RETRY_AT_FIELD);
        // Forgotten before the commit: a worker woken by it must not find it still deferred
        // here (should the commit fail, the next look at the job defers it again).
        forget();
        let lock = job_node(job, "lock");
        let reference = job_ref(state, priority, job);
        let r = self
            .tree
            .multi(vec![
                Op::create(&lock, None),
                Op::set(job_node(job, "status"), json_bytes(&status), Some(version)),
                Op::delete(&reference, None),
                Op::create(&reference, None),
                Op::delete(&lock, None),
            ])
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e)
                if matches!(
                    e.root(),
                    TreeError::NodeExists(_) | TreeError::BadVersion { .. } | TreeError::NoNode(_)
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Gives a job back in its state, not to be taken again before `retry_at_ms` (ms since the
    /// epoch), recording `attempts` of its current stage and the reason: one `multi` that
    /// rewrites the status (version-checked) and deletes the lock. Every worker, in every
    /// process, honours the retry time.
    pub async fn job_defer(
        &self,
        lease: JobLease,
        retry_at_ms: u64,
        attempts: u32,
        message: Option<String>,
    ) -> Result<JobStatus> {
        let lock = job_node(&lease.job, "lock");
        self.unclaim(&lock);
        self.check_job_lease(&lease)?;
        let mut status = lease.status.clone();
        status.last_modified = self.now();
        status.message = message;
        status
            .extra
            .insert(ATTEMPTS_FIELD.to_string(), Value::from(attempts));
        status
            .extra
            .insert(RETRY_AT_FIELD.to_string(), Value::from(retry_at_ms));
        let ops = vec![
            Op::check(&lock, None),
            Op::set(
                job_node(&lease.job, "status"),
                json_bytes(&status),
                Some(lease.status_version),
            ),
            Op::delete(&lock, None),
        ];
        self.tree
            .multi(ops)
            .await
            .map_err(|e| self.lease_error(e, lease.job.as_str()))?;
        self.mark_deferred(
            &job_state_folder(lease.state()),
            &job_ref_name(lease.priority, &lease.job),
            retry_at_ms,
        );
        Ok(status)
    }

    /// Gives a job back without moving it (e.g. a transient error; another worker retries).
    pub async fn release_job_lease(&self, lease: JobLease) -> Result<()> {
        let lock = job_node(&lease.job, "lock");
        self.unclaim(&lock);
        self.check_job_lease(&lease)?;
        match self.tree.delete(&lock, None).await {
            Ok(()) => Ok(()),
            Err(TreeError::NoNode(_)) => Err(lost(lease.job.as_str())),
            Err(e) => Err(e.into()),
        }
    }

    /// Changes a leased job's priority: rewrites `priority` and renames its `PP-JID` reference.
    pub async fn set_priority(&self, lease: &mut JobLease, priority: u8) -> Result<()> {
        check_priority(priority)?;
        self.check_job_lease(lease)?;
        if priority == lease.priority {
            return Ok(());
        }
        let state = lease.state();
        let ops = vec![
            Op::check(job_node(&lease.job, "lock"), None),
            Op::check(job_node(&lease.job, "status"), Some(lease.status_version)),
            Op::set(
                job_node(&lease.job, "priority"),
                Some(priority.to_string().into_bytes()),
                None,
            ),
            Op::delete(job_ref(state, lease.priority, &lease.job), None),
            Op::create(job_ref(state, priority, &lease.job), None),
        ];
        self.tree
            .multi(ops)
            .await
            .map_err(|e| self.lease_error(e, lease.job.as_str()))?;
        lease.priority = priority;
        Ok(())
    }

    /// Sets `space_needed` of a leased job.
    pub async fn set_space_needed(&self, lease: &JobLease, bytes: u64) -> Result<()> {
        self.set_job_node(lease, "space_needed", bytes.to_string().into_bytes())
            .await
    }

    /// Writes one of a leased job's JSON data nodes: `identifiers`, `metadata`, `inventory`,
    /// `store` or `configuration`.
    pub async fn set_job_data(&self, lease: &JobLease, name: &str, value: &Value) -> Result<()> {
        if ![
            "identifiers",
            "metadata",
            "inventory",
            "store",
            "configuration",
        ]
        .contains(&name)
        {
            return Err(EngineError::Invalid(format!(
                "{name:?} is not a job data node"
            )));
        }
        self.set_job_node(lease, name, to_bytes(value)).await
    }

    async fn set_job_node(&self, lease: &JobLease, name: &str, bytes: Vec<u8>) -> Result<()> {
        self.check_job_lease(lease)?;
        let path = job_node(&lease.job, name);
        let write = if self.tree.exists(&path).await?.is_some() {
            Op::set(&path, Some(bytes), None)
        } else {
            Op::create(&path, Some(bytes))
        };
        self.tree
            .multi(vec![Op::check(job_node(&lease.job, "lock"), None), write])
            .await
            .map_err(|e| self.lease_error(e, lease.job.as_str()))?;
        Ok(())
    }

    /// An admin move of an unlocked job. `f` computes the new progress from the current one.
    /// A version that moved meanwhile (the job, or its batch being reported) means reading
    /// again and retrying, a bounded number of times.
    async fn admin_job(
        &self,
        job: &JobId,
        f: impl Fn(JobProgress) -> Result<JobProgress, lading_core::IllegalTransition>,
    ) -> Result<JobStatus> {
        for _ in 0..MAX_OPTIMISTIC {
            if let Some(st) = self.admin_job_once(job, &f).await? {
                return Ok(st);
            }
        }
        Err(EngineError::Conflict(job.to_string()))
    }

    /// One try of [`Engine::admin_job`]; `None` when a version moved.
    async fn admin_job_once(
        &self,
        job: &JobId,
        f: &impl Fn(JobProgress) -> Result<JobProgress, lading_core::IllegalTransition>,
    ) -> Result<Option<JobStatus>> {
        let (old, version) = self.job_status(job).await?;
        let batch = self.job_batch(job).await?;
        let priority = self.job_priority(job).await?;
        let progress = JobProgress {
            state: old.status,
            last_successful: old.last_successful_status,
            retry_count: old.retry_count,
        };
        let next = f(progress)?;
        let mut extra = old.extra.clone();
        if next.state != JobState::Failed {
            clear_failure(&mut extra);
        }
        let status = JobStatus {
            status: next.state,
            last_successful_status: next.last_successful,
            last_modified: self.now(),
            retry_count: next.retry_count,
            message: None,
            extra,
        };
        let lock = job_node(job, "lock");
        let mut ops = vec![
            Op::create_mode(&lock, None, CreateMode::Ephemeral),
            Op::set(job_node(job, "status"), json_bytes(&status), Some(version)),
        ];
        self.folder_ops(&batch, old.status, next.state, &mut ops)
            .await?;
        self.move_ops(job, &batch, priority, old.status, next.state, &mut ops);
        // Back into batch-processing: bump the batch status version so a concurrent
        // `maybe_report` that saw the folder empty cannot win. A batch already reporting or
        // reported is reopened (back to Processing): it reports again, with the next report
        // number, once its jobs are done; a reporter holding it loses its lease, and nothing it
        // meant to record (the report, its mail) is.
        let reentering = old.status.batch_folder() != "batch-processing"
            && next.state.batch_folder() == "batch-processing";
        let leaving_failed = old.status.batch_folder() == "batch-failed"
            && next.state.batch_folder() != "batch-failed";
        let mut batch_moved: Option<(BatchState, BatchState)> = None;
        if (reentering || leaving_failed)
            && let Ok((bstatus, bversion)) = self.batch_status(&batch).await
        {
            let mut touched = bstatus.clone();
            touched.last_modified = self.now();
            match bstatus.status {
                BatchState::Deleted if reentering => {
                    return Err(EngineError::Invalid(format!(
                        "job {job} belongs to batch {batch}, which is Deleted: it cannot be requeued"
                    )));
                }
                BatchState::Reporting
                | BatchState::UpdateReporting
                | BatchState::Failed
                | BatchState::Completed
                    if reentering =>
                {
                    touched.status = BatchState::Processing;
                    touched.message = Some(format!(
                        "reopened: job {job} requeued (was {})",
                        bstatus.status
                    ));
                    batch_moved = Some((bstatus.status, BatchState::Processing));
                }
                BatchState::Failed => {
                    // A failed job deleted: the message keeps matching the counts.
                    touched.message = Some(
                        self.batch_counts_message(
                            &batch,
                            old.status.batch_folder(),
                            next.state.batch_folder(),
                        )
                        .await?,
                    );
                }
                _ => {}
            }
            if reentering || touched.message != bstatus.message {
                ops.push(Op::set(
                    batch_node(&batch, "status"),
                    json_bytes(&touched),
                    Some(bversion),
                ));
            }
        }
        ops.push(Op::delete(&lock, None));
        match self.tree.multi(ops).await {
            Ok(_) => {}
            Err(e) if matches!(e.root(), TreeError::NodeExists(p) if p.ends_with("/lock")) => {
                return Err(EngineError::Locked(job.to_string()));
            }
            Err(e) if matches!(e.root(), TreeError::BadVersion { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        self.publish(
            "job",
            job.as_str(),
            Some(&batch),
            Some(old.status.name()),
            next.state.name(),
        );
        if let Some((from, to)) = batch_moved {
            self.publish("batch", batch.as_str(), None, Some(from.name()), to.name());
        }
        if next.state.batch_folder() != "batch-processing"
            && old.status.batch_folder() == "batch-processing"
        {
            self.maybe_report(&batch).await?;
        }
        Ok(Some(status))
    }

    /// The message of a Failed batch after one of its jobs moves from the reference folder
    /// `from` to `to`: the counts as they will be, and whether an update report is due.
    async fn batch_counts_message(&self, batch: &BatchId, from: &str, to: &str) -> Result<String> {
        let mut n = [0usize; 3];
        for (i, f) in ["batch-completed", "batch-failed", "batch-deleted"]
            .into_iter()
            .enumerate()
        {
            let c = match self.tree.count_children(&batch_ref_folder(batch, f)).await {
                Ok(c) => c as usize,
                Err(TreeError::NoNode(_)) => 0,
                Err(e) => return Err(e.into()),
            };
            n[i] = c + usize::from(f == to) - usize::from(f == from && c > 0);
        }
        let mut m = batch_summary(n[0], n[1], n[2]);
        if n[1] == 0 {
            m.push_str(": an update report is due");
        }
        Ok(m)
    }

    /// Admin: Pending → Held.
    pub async fn hold_job(&self, job: &JobId) -> Result<JobStatus> {
        self.admin_job(job, |p| p.apply(Event::To(JobState::Held)))
            .await
    }

    /// Admin: Held → Pending.
    pub async fn release_job(&self, job: &JobId) -> Result<JobStatus> {
        self.admin_job(job, |p| {
            if p.state != JobState::Held {
                return Err(lading_core::IllegalTransition {
                    kind: "job",
                    from: p.state.to_string(),
                    to: "Pending (release)".into(),
                });
            }
            p.apply(Event::To(JobState::Pending))
        })
        .await
    }

    /// Admin: requeue a Failed job to `target`, by default the stage that failed.
    /// The default target is the recorded `failed_stage` (Lading's own field), so a job whose
    /// `last_successful_status` another tool set to `"Failed"` (Merritt does, moving a job
    /// out of Failed) still goes back to the stage that failed.
    pub async fn requeue_job(&self, job: &JobId, target: Option<JobState>) -> Result<JobStatus> {
        let target = match target {
            Some(t) => Some(t),
            None => {
                let (st, _) = self.job_status(job).await?;
                failed_stage(&st).and_then(JobState::parse).filter(|s| {
                    !matches!(
                        s,
                        JobState::Failed | JobState::Completed | JobState::Deleted | JobState::Held
                    )
                })
            }
        };
        self.admin_job(job, |p| p.requeue(target)).await
    }

    /// Admin: delete a job. Failed and Held jobs move to Deleted; Completed and Deleted jobs
    /// are purged from the tree. Any other state is refused.
    pub async fn delete_job(&self, job: &JobId) -> Result<Option<JobStatus>> {
        let (status, _) = self.job_status(job).await?;
        match status.status {
            JobState::Failed | JobState::Held => Ok(Some(
                self.admin_job(job, |p| p.apply(Event::To(JobState::Deleted)))
                    .await?,
            )),
            JobState::Completed | JobState::Deleted => {
                self.purge_job(job).await?;
                Ok(None)
            }
            s => Err(lading_core::IllegalTransition {
                kind: "job",
                from: s.to_string(),
                to: JobState::Deleted.to_string(),
            }
            .into()),
        }
    }

    /// Removes every node of a finished job (Completed or Deleted).
    pub async fn purge_job(&self, job: &JobId) -> Result<()> {
        let (status, version) = self.job_status(job).await?;
        if !matches!(status.status, JobState::Completed | JobState::Deleted) {
            return Err(lading_core::IllegalTransition {
                kind: "job",
                from: status.status.to_string(),
                to: "purged".into(),
            }
            .into());
        }
        let batch = self.job_batch(job).await?;
        let priority = self.job_priority(job).await?;
        let mut ops = vec![Op::check(job_node(job, "status"), Some(version))];
        for child in self.tree.children(&job_path(job)).await? {
            if child == "lock" {
                return Err(EngineError::Locked(job.to_string()));
            }
            ops.push(Op::delete(job_node(job, &child), None));
        }
        ops.push(Op::delete(job_path(job), None));
        let jref = job_ref(status.status, priority, job);
        if self.tree.exists(&jref).await?.is_some() {
            ops.push(Op::delete(jref, None));
        }
        let bref = batch_ref(&batch, status.status.batch_folder(), job);
        if self.tree.exists(&bref).await?.is_some() {
            ops.push(Op::delete(bref, None));
        }
        self.tree.multi(ops).await.map_err(|e| match e.root() {
            TreeError::BadVersion { .. } => EngineError::Conflict(job.to_string()),
            _ => e.into(),
        })?;
        Ok(())
    }

    /// Removes a finished access request (Completed, Failed or Deleted) from its queue
    /// (cleanup). A locked or unfinished one is refused.
    pub async fn purge_access(&self, queue: AccessQueue, id: &AccessId) -> Result<()> {
        let path = access_path(queue, id);
        let (status, version) = self
            .read_json::<AccessStatus>(&format!("{path}/status"))
            .await?
            .ok_or_else(|| EngineError::NoAccess(id.to_string()))?;
        if !matches!(
            status.status,
            AccessState::Completed | AccessState::Failed | AccessState::Deleted
        ) {
            return Err(lading_core::IllegalTransition {
                kind: "access",
                from: status.status.to_string(),
                to: "purged".into(),
            }
            .into());
        }
        let mut ops = vec![Op::check(format!("{path}/status"), Some(version))];
        for child in self.tree.children(&path).await? {
            if child == "lock" {
                return Err(EngineError::Locked(id.to_string()));
            }
            ops.push(Op::delete(format!("{path}/{child}"), None));
        }
        ops.push(Op::delete(&path, None));
        self.tree.multi(ops).await.map_err(|e| match e.root() {
            TreeError::BadVersion { .. } => EngineError::Conflict(id.to_string()),
            _ => e.into(),
        })?;
        Ok(())
    }

    /// Access requests of a queue, oldest first.
    pub async fn access_ids(&self, queue: AccessQueue) -> Result<Vec<AccessId>> {
        Ok(self
            .tree
            .children(&access_folder(queue))
            .await?
            .iter()
            .filter_map(|n| AccessId::parse(n).ok())
            .collect())
    }

    /// Removes a Completed or Deleted batch with all its jobs (cleanup). Jobs that are not
    /// finished are refused by name.
    pub async fn purge_batch(&self, batch: &BatchId) -> Result<usize> {
        let info = self.batch(batch).await?;
        if !matches!(
            info.status.status,
            BatchState::Completed | BatchState::Deleted
        ) {
            return Err(EngineError::Invalid(format!(
                "batch {batch} is {}, only Completed or Deleted batches are purged",
                info.status.status
            )));
        }
        let mut purged = 0;
        for j in info.jobs.values().flatten() {
            let jid = JobId::parse(j)?;
            match self.purge_job(&jid).await {
                Ok(()) => purged += 1,
                Err(EngineError::NoJob(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let mut ops = Vec::new();
        self.delete_subtree_ops(&batch_path(batch), &mut ops)
            .await?;
        if let Some(uuid) = info.submission.get("batchID").and_then(Value::as_str)
            && self.tree.exists(&batch_uuid_path(uuid)).await?.is_some()
        {
            ops.push(Op::delete(batch_uuid_path(uuid), None));
        }
        if let Some(who) = info.submission.get("submitter").and_then(Value::as_str) {
            let entry = format!("{}/{batch}", submitter_batches(who));
            if self.tree.exists(&entry).await?.is_some() {
                ops.push(Op::delete(entry, None));
            }
        }
        self.tree.multi(ops).await?;
        Ok(purged)
    }

    async fn delete_subtree_ops(&self, path: &str, ops: &mut Vec<Op>) -> Result<()> {
        let mut stack = vec![(path.to_string(), false)];
        while let Some((p, expanded)) = stack.pop() {
            if expanded {
                ops.push(Op::delete(p, None));
                continue;
            }
            let children = self.tree.children(&p).await?;
            stack.push((p.clone(), true));
            for c in children {
                if c == "lock" {
                    return Err(EngineError::Locked(p));
                }
                stack.push((join(&p, &c), false));
            }
        }
        Ok(())
    }

    // ----- access --------------------------------------------------------------------------

    /// Queues an object assembly request on the small or large queue.
    pub async fn create_access(&self, queue: AccessQueue, token: &Value) -> Result<AccessId> {
        self.create_access_with(queue, |_| token.clone()).await
    }

    /// [`Engine::create_access`] with a token made once the request's id is known (Merritt's
    /// token fields name the request).
    pub async fn create_access_with(
        &self,
        queue: AccessQueue,
        token: impl FnOnce(&AccessId) -> Value,
    ) -> Result<AccessId> {
        let path = self
            .tree
            .create(
                &format!("{}/qid", access_folder(queue)),
                None,
                CreateMode::PersistentSequential,
            )
            .await?;
        let id = AccessId::parse(lading_core::tree::split_path(&path).1)?;
        let status = AccessStatus {
            status: AccessState::Pending,
            last_modified: self.now(),
            message: None,
            extra: Map::new(),
        };
        let r = self
            .tree
            .multi(vec![
                Op::create(format!("{path}/token"), Some(to_bytes(&token(&id)))),
                Op::create(format!("{path}/status"), json_bytes(&status)),
            ])
            .await;
        if let Err(e) = r {
            let _ = self.tree.delete(&path, None).await;
            return Err(e.into());
        }
        self.publish(
            "access",
            id.as_str(),
            None,
            None,
            AccessState::Pending.name(),
        );
        Ok(id)
    }

    pub async fn access(&self, queue: AccessQueue, id: &AccessId) -> Result<AccessInfo> {
        let path = access_path(queue, id);
        let (status, _) = self
            .read_json(&format!("{path}/status"))
            .await?
            .ok_or_else(|| EngineError::NoAccess(id.to_string()))?;
        let token = self
            .read_json(&format!("{path}/token"))
            .await?
            .map(|(v, _)| v)
            .unwrap_or(Value::Null);
        let locked = self.tree.exists(&format!("{path}/lock")).await?.is_some();
        Ok(AccessInfo {
            queue,
            id: id.to_string(),
            status,
            token,
            locked,
        })
    }

    /// Acquires the oldest Pending request of a queue (nothing while the queue is paused).
    pub async fn acquire_access(&self, queue: AccessQueue) -> Result<Option<AccessLease>> {
        if self.queue_paused_watched(queue.lock_name()).await? {
            return Ok(None);
        }
        let mut after: Option<String> = None;
        loop {
            let page = self
                .tree
                .children_page(&access_folder(queue), after.as_deref(), PAGE)
                .await?;
            let Some(last) = page.last().cloned() else {
                return Ok(None);
            };
            for name in &page {
                let Ok(id) = AccessId::parse(name) else {
                    continue;
                };
                let path = access_path(queue, &id);
                let Some((status, version)) = self
                    .read_json::<AccessStatus>(&format!("{path}/status"))
                    .await?
                else {
                    continue;
                };
                if status.status != AccessState::Pending {
                    continue;
                }
                let token = self
                    .read_json(&format!("{path}/token"))
                    .await?
                    .map(|(v, _)| v)
                    .unwrap_or(Value::Null);
                // A request another tool made (Merritt's access service names no `ark`): left
                // for that tool, not taken and failed here.
                if token.get("ark").and_then(Value::as_str).is_none() {
                    continue;
                }
                let lock = format!("{path}/lock");
                let guard = Op::check(format!("{path}/status"), Some(version));
                if !self.take_lock(&lock, guard).await? {
                    continue;
                }
                return Ok(Some(AccessLease {
                    queue,
                    id,
                    status,
                    token,
                    status_version: version,
                    session: self.tree.session_id(),
                }));
            }
            after = Some(last);
        }
    }

    /// Moves a leased access request and releases its lock.
    pub async fn access_transition(
        &self,
        lease: AccessLease,
        event: Event<AccessState>,
        message: Option<String>,
    ) -> Result<AccessStatus> {
        let path = access_path(lease.queue, &lease.id);
        let lock = format!("{path}/lock");
        self.unclaim(&lock);
        if lease.session != self.tree.session_id() {
            return Err(lost(lease.id.as_str()));
        }
        let to = lease.status.status.resolve(event)?;
        let mut status = lease.status.clone();
        status.status = to;
        status.last_modified = self.now();
        status.message = message;
        self.tree
            .multi(vec![
                Op::check(&lock, None),
                Op::set(
                    format!("{path}/status"),
                    json_bytes(&status),
                    Some(lease.status_version),
                ),
                Op::delete(&lock, None),
            ])
            .await
            .map_err(|e| self.lease_error(e, lease.id.as_str()))?;
        self.publish(
            "access",
            lease.id.as_str(),
            None,
            Some(lease.status.status.name()),
            to.name(),
        );
        Ok(status)
    }

    /// Moves a leased access request but keeps the lock (Pending → Processing, then work).
    pub async fn access_advance(
        &self,
        mut lease: AccessLease,
        event: Event<AccessState>,
    ) -> Result<AccessLease> {
        let path = access_path(lease.queue, &lease.id);
        if lease.session != self.tree.session_id() {
            return Err(lost(lease.id.as_str()));
        }
        let to = lease.status.status.resolve(event)?;
        let mut status = lease.status.clone();
        status.status = to;
        status.last_modified = self.now();
        status.message = None;
        self.tree
            .multi(vec![
                Op::check(format!("{path}/lock"), None),
                Op::set(
                    format!("{path}/status"),
                    json_bytes(&status),
                    Some(lease.status_version),
                ),
            ])
            .await
            .map_err(|e| self.lease_error(e, lease.id.as_str()))?;
        self.publish(
            "access",
            lease.id.as_str(),
            None,
            Some(lease.status.status.name()),
            to.name(),
        );
        lease.status = status;
        lease.status_version += 1;
        Ok(lease)
    }

    // ----- per-object locks ----------------------------------------------------------------

    async fn ark_lock(&self, path: String) -> Result<ArkLock> {
        match self
            .tree
            .create(&path, self.lock_data(), CreateMode::Ephemeral)
            .await
        {
            Ok(_) => Ok(ArkLock {
                path,
                session: self.tree.session_id(),
            }),
            Err(TreeError::NodeExists(p)) => Err(EngineError::Locked(p)),
            Err(e) => Err(e.into()),
        }
    }

    /// Takes `/locks/storage/ARK` (fails with `Locked` while another holds it).
    pub async fn lock_storage(&self, ark: &str) -> Result<ArkLock> {
        if ark.is_empty() {
            return Err(EngineError::Invalid("empty ark".into()));
        }
        self.ark_lock(storage_lock(ark)).await
    }

    /// Takes `/locks/inventory/ARK`.
    pub async fn lock_inventory(&self, ark: &str) -> Result<ArkLock> {
        if ark.is_empty() {
            return Err(EngineError::Invalid("empty ark".into()));
        }
        self.ark_lock(inventory_lock(ark)).await
    }

    pub async fn unlock_ark(&self, lock: ArkLock) -> Result<()> {
        if lock.session != self.tree.session_id() {
            return Err(lost(&lock.path));
        }
        match self.tree.delete(&lock.path, None).await {
            Ok(()) => Ok(()),
            Err(TreeError::NoNode(_)) => Err(lost(&lock.path)),
            Err(e) => Err(e.into()),
        }
    }
}

fn join(parent: &str, name: &str) -> String {
    lading_core::tree::join_path(parent, name)
}

fn check_priority(p: u8) -> Result<()> {
    if p > 99 {
        return Err(EngineError::Invalid(format!(
            "priority {p} is outside 0..=99"
        )));
    }
    Ok(())
}

fn check_queue(name: &str) -> Result<()> {
    if !QUEUE_NAMES.contains(&name) {
        return Err(EngineError::Invalid(format!(
            "unknown queue {name:?} (expected one of {})",
            QUEUE_NAMES.join(", ")
        )));
    }
    Ok(())
}

/// A job picked to be locked next by [`Engine::job_transition_then_acquire`].
struct Candidate {
    folder: String,
    /// Its reference's name in `folder`, and the reference's full path.
    name: String,
    reference: String,
    lock: String,
    priority: u8,
    jid: JobId,
    state: JobState,
}

/// Whether a `multi` failed because another worker got there first or the item moved on
/// (taken, gone, or changed), rather than for a reason to report.
fn lost_race(e: &TreeError) -> bool {
    matches!(
        e.root(),
        TreeError::NodeExists(_) | TreeError::NoNode(_) | TreeError::BadVersion { .. }
    )
}

/// Where to start among `names` (free references in queue order) when other workers are
/// taking from the same queue: one of the next few of the head's priority, at random, rather
/// than all trying the head.
fn spread_pick(names: &[&String]) -> usize {
    let Some(head) = names.first() else {
        return 0;
    };
    let prefix = &head[..head.len().min(3)];
    let window = names
        .iter()
        .take(SPREAD)
        .take_while(|n| n.starts_with(prefix))
        .count();
    (cheap_random() % window.max(1) as u64) as usize
}

/// A pseudo-random number (xorshift64*), one state per thread seeded once from the OS: picks
/// among queue heads need spread, not secrecy, and asking the OS each time was measurable.
fn cheap_random() -> u64 {
    thread_local! {
        static STATE: std::cell::Cell<u64> =
            std::cell::Cell::new(uuid::Uuid::new_v4().as_u64_pair().0 | 1);
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

/// The tree under `root` as a sorted path → data map: JSON data decoded, other bytes as a
/// string, empty nodes as null. What `lading dump` prints and golden tests compare.
pub async fn dump(tree: &dyn Tree, root: &str) -> Result<BTreeMap<String, Value>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_string()];
    while let Some(p) = stack.pop() {
        let Some(node) = tree.get(&p).await? else {
            if p == root {
                return Err(EngineError::Tree(TreeError::NoNode(p)));
            }
            continue; // removed while we walked
        };
        out.insert(p.clone(), decode(node.data.as_deref()));
        match tree.children(&p).await {
            Ok(children) => stack.extend(children.iter().map(|c| join(&p, c))),
            Err(TreeError::NoNode(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

/// The retry time a deferred job's status carries, if any.
/// A failed job's stage, failure kind (`fatal` or `exhausted`) and attempts, in its status.
pub const FAILED_STAGE_FIELD: &str = "failed_stage";
pub const FAILURE_KIND_FIELD: &str = "failure_kind";
pub const FAILED_ATTEMPTS_FIELD: &str = "failed_attempts";

fn clear_failure(extra: &mut Map<String, Value>) {
    for k in [
        FAILED_STAGE_FIELD,
        FAILURE_KIND_FIELD,
        FAILED_ATTEMPTS_FIELD,
    ] {
        extra.remove(k);
    }
}

/// A batch's message from its job counts: `N of M jobs failed` (M the completed and failed),
/// and the deleted ones apart.
pub fn batch_summary(completed: usize, failed: usize, deleted: usize) -> String {
    let mut s = if failed > 0 {
        format!("{failed} of {} jobs failed", completed + failed)
    } else {
        format!("no failed jobs left ({completed} completed)")
    };
    if deleted > 0 {
        s.push_str(&format!("; {deleted} deleted"));
    }
    s
}

/// The stage a failed job failed in, if recorded.
pub fn failed_stage(status: &JobStatus) -> Option<&str> {
    status.extra.get(FAILED_STAGE_FIELD).and_then(Value::as_str)
}

/// `fatal` or `exhausted` for a failed job, if recorded.
pub fn failure_kind(status: &JobStatus) -> Option<&str> {
    status.extra.get(FAILURE_KIND_FIELD).and_then(Value::as_str)
}

pub fn retry_at(status: &JobStatus) -> Option<u64> {
    status.extra.get(RETRY_AT_FIELD).and_then(Value::as_u64)
}

/// Attempts of the current stage that ended in a transient error.
pub fn attempts(status: &JobStatus) -> u32 {
    status
        .extra
        .get(ATTEMPTS_FIELD)
        .and_then(Value::as_u64)
        .map_or(0, |n| n.min(u32::MAX as u64) as u32)
}

/// Node bytes as a JSON value: decoded JSON, else a string, else null when empty.
pub fn decode(data: Option<&[u8]>) -> Value {
    match data {
        None => Value::Null,
        Some([]) => Value::Null,
        Some(b) => serde_json::from_slice(b)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(b).into_owned())),
    }
}
