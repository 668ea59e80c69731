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
//!
//! One `impl Engine` per aggregate, one module each:
//! - `read`: typed reads, listings and counts; `holds`: queue pauses and collection holds;
//! - `batches`: create, acquire, wait, batch moves; `reporting`: reports and finished batches;
//! - `jobs`: create, acquire, wait; `moves`: the job-moving `multi`s, chained acquisition;
//! - `claims`: lock claims and the contention heuristics behind acquisition;
//! - `admin`: hold, release, requeue, delete, purge; `access`: the access queue;
//! - `locks`: per-ark locks and foreign locks; `outbox`: outside effects; `reserve`: space
//!   reservations.

mod access;
pub mod audit;
pub use access::SHARED_SECRETS;
mod admin;
mod batches;
mod claims;
mod contention;
pub mod deps;
mod error;
mod follow;
mod history;
mod holds;
mod jobs;
mod locks;
mod moves;
mod outbox;
pub mod processes;
mod read;
mod records;
mod reporting;
mod reserve;
pub mod stage_metrics;
mod watched;
pub use lading_core::sabotage;

use claims::Round;
use contention::{ANY_TRIES, MAX_SCAN, NEXT_TRIES, SPREAD, WINDOW};
pub use error::{EngineError, Result};
pub use follow::{
    Following, Observed, Past, Task, Transition, transition_id, transition_id_at_most,
    transition_id_time,
};
pub use history::{HistoryEntry, expand_history, history};
pub(crate) use history::{RawHistory, push_history};
pub use locks::ForeignLock;
pub use outbox::{
    Effect, EffectKind, FixitySummary, OutboxClaim, OutboxCounts, OutboxEntry, OutboxItem,
    OutboxWatch, Summary,
};
pub use records::*;
pub use reporting::ReportTry;
pub use reserve::{RESERVED_FIELD, Reservation};

use foldhash::{HashMap, HashMapExt};
use lading_core::layout::{self, *};
use lading_core::time::{SharedClock, format_ts};
use lading_core::{
    AccessState, BatchState, CreateMode, Event, JobProgress, JobState, Op, Recorded, Tree,
    TreeError, Watch, WatchKind,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;

/// References read per page while looking for work.
const PAGE: usize = 64;
/// Retries of an optimistic read-check-write loop before reporting `Conflict`.
const MAX_OPTIMISTIC: usize = 32;

/// What a change event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    Batch,
    Job,
    Access,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Batch => "batch",
            ChangeKind::Job => "job",
            ChangeKind::Access => "access",
        }
    }
}

impl std::fmt::Display for ChangeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A committed change, published to subscribers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChangeEvent {
    pub kind: ChangeKind,
    pub id: String,
    /// The batch a job belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    pub from: Option<String>,
    pub to: String,
    pub time: lading_core::time::Stamp,
    /// The host (`owner` of the engine) that made it, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// How long a job state's longest-waiting job has been in it (see
/// [`Engine::oldest_per_state`]).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Oldest {
    /// When it entered the state (ms since the epoch); `None` for an empty state.
    pub since_ms: Option<u64>,
    /// False when the state holds more than [`OLDEST_SCAN`] jobs and only that many were read.
    pub exact: bool,
}

/// References of one state read by [`Engine::oldest_per_state`], at most.
pub const OLDEST_SCAN: usize = 2000;

/// Default priority of a job (SPEC §2).
pub const DEFAULT_PRIORITY: u8 = 5;

/// The engine over one tree session.
pub struct Engine {
    tree: Arc<dyn Tree>,
    clock: SharedClock,
    /// Spreads workers over a queue's head (see [`lading_core::random`]).
    random: lading_core::random::SharedRandom,
    owner: String,
    /// Made at the first subscription (4,096 slots allocated at once: most engines, a
    /// worker's, never have a subscriber, and a transition nobody hears is not built).
    events: std::sync::OnceLock<broadcast::Sender<ChangeEvent>>,
    /// Locks this process is trying for or holds, so local workers do not race each other.
    /// Lock path → the session it was claimed in; a claim from an older session is void (that
    /// session's locks are gone).
    claimed: Mutex<HashMap<String, u64>>,
    /// Batch reference folders seen to exist (see `folder_ops`).
    known_folders: Mutex<foldhash::HashSet<String>>,
    /// Job → batch, which never changes once written: saves a read per acquisition.
    job_batches: Mutex<HashMap<JobId, BatchId>>,
    /// Batches' `batchID`s as read (written once, at the batch's creation; bounded as
    /// `job_batches`).
    batch_uuids: Mutex<HashMap<BatchId, String>>,
    /// Batches seen in a terminal state (Completed, Deleted), which they never leave: batch
    /// acquisition skips them without reading their status again.
    terminal_batches: Mutex<HashMap<BatchId, BatchState>>,
    /// Watches shared by the whole process, and values read under them (pause and hold
    /// flags, batch statuses): see [`watched`].
    watched: watched::Watched,
    /// What this process learnt lately about other workers (busy and deferred references,
    /// lost races): see [`contention::Contention`].
    contention: contention::Contention,
    /// Batches the last batch scan found in a non-terminal state: what a waiting batch worker
    /// watches.
    live_batches: Mutex<Vec<BatchId>>,
    /// Per batch state, the batches of it the last scan found locked by others: a waiter
    /// watches their locks (a lock let go without a move makes one free; a move changes the
    /// status, which is watched anyway).
    locked_batches: Mutex<BTreeMap<BatchState, Vec<BatchId>>>,
    /// Signalled when this process lets go of a claim another local worker was refused: a
    /// waiter whose own round lost such a race (see `claims::LOST_LOCALLY`) is woken when the
    /// winner lets go (the tree's own watch may have fired before the claim was dropped).
    /// The claims a local worker was refused, each with its signal, given when it is let go;
    /// changed only under `claimed`'s lock. (Signalling every claim let go woke every loop
    /// of the process that had lost any local race, at each job a handler moved on: the
    /// most frequent wake-up of a busy process, found by counting in `lading-sim`.)
    contested: Mutex<HashMap<String, Arc<tokio::sync::Notify>>>,
    /// Per job state (see [`Engine::woken_in`]), signalled when this process forgets a
    /// deferral after waking a job of that state: a waiter woken by the wake's own commit may
    /// have looked before the deferral was forgotten, and passed the job over (found by
    /// `lading-sim`). One signal for every state woke every waiter of the process.
    woken: Vec<tokio::sync::Notify>,
    /// How many times a waiter has parked (see [`Engine::parked`]).
    parked: tokio::sync::watch::Sender<u64>,
    /// Locks this session may still hold after a failed call (a reply lost, a delete that did
    /// not go through) and that no lease owns: kept claimed, so no local worker takes them,
    /// until [`Engine::drop_strays`] deletes them or finds them gone or another session's.
    /// Without this a live process kept such a lock, and its job or batch, for ever (found
    /// by `lading-sim`).
    /// Locks a lease gave up that could not be told deleted, and the session they were made
    /// on.
    strays: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Outbox entry locks the last [`Engine::claim_effect`] found held by other sessions:
    /// what the deliverer's [`Engine::wait_outbox`] watches besides the outbox.
    outbox_busy: Mutex<Vec<String>>,
    /// What the deliverers' looks read of each outbox entry, by name: an entry not changed
    /// since is not decoded again (see [`outbox::Heads`]).
    outbox_heads: outbox::Heads,
    /// How often a waiter looks again whatever it was told ([`SWEEP`] unless set by
    /// [`Engine::with_sweep`]).
    sweep: Duration,
    /// The outside services work depends on, and their health (see [`deps`]).
    deps: deps::Dependencies,
}

/// Status field (`/jobs/JID/status`, beside Merritt's fields) holding the earliest time, in
/// ms since the epoch, at which a deferred job may be taken again.
pub const RETRY_AT_FIELD: &str = "retry_at_ms";
/// Status field holding how many attempts of the current stage ended in a transient error.
pub const ATTEMPTS_FIELD: &str = "attempts";

/// Live batches whose status and lock a waiting batch worker watches.
const WAIT_BATCHES: usize = 32;
/// Locks of busy jobs a waiting worker watches.
const WAIT_LOCKS: usize = 16;
/// A waiting worker looks again at least this often, whatever it was told.
const SWEEP: Duration = Duration::from_secs(10);
/// How soon a stray lock's delete is tried again (see [`Engine::abandon_on`]).
const STRAY_RETRY: Duration = Duration::from_secs(1);

/// Processing batches whose `batch-processing` folder `watch_finishing` watches.
const WATCH_PROCESSING: usize = 256;

/// Bound on `job_batches`; it is simply emptied when full.
const JOB_BATCHES_KEPT: usize = 100_000;

/// Waits for the first of `watches` to fire; its index (a fired watch must not be polled
/// again). Never, when there are none.
async fn any_of<'a>(watches: impl Iterator<Item = &'a mut Watch>) -> usize {
    lading_core::tree::first_ready(watches).await.0
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
        Engine {
            tree,
            clock,
            random: lading_core::random::os_seeded(),
            owner: owner.into(),
            events: std::sync::OnceLock::new(),
            claimed: Mutex::new(HashMap::new()),
            job_batches: Mutex::new(HashMap::new()),
            batch_uuids: Mutex::new(HashMap::new()),
            known_folders: Mutex::new(foldhash::HashSet::default()),
            terminal_batches: Mutex::new(HashMap::new()),
            watched: Default::default(),
            contention: Default::default(),
            live_batches: Mutex::new(Vec::new()),
            locked_batches: Mutex::new(BTreeMap::new()),
            contested: Mutex::new(HashMap::new()),
            woken: JobState::ALL
                .iter()
                .map(|_| tokio::sync::Notify::new())
                .collect(),
            parked: tokio::sync::watch::Sender::new(0),
            strays: Mutex::new(Default::default()),
            outbox_busy: Mutex::new(Vec::new()),
            outbox_heads: Default::default(),
            sweep: SWEEP,
            deps: Default::default(),
        }
    }

    pub fn tree(&self) -> &Arc<dyn Tree> {
        &self.tree
    }

    /// The same engine with `random` for its choices (a seeded source makes a test
    /// repeatable).
    pub fn with_random(mut self, random: lading_core::random::SharedRandom) -> Engine {
        self.random = random;
        self
    }

    /// The same engine with `sweep` as its waiters' safety net: how often one looks again
    /// when no watch woke it (`SWEEP` by default). Every wake-up a waiter needs comes from a
    /// watch or a local signal; the sweep only bounds what a missed one costs. `lading-sim`
    /// sets it past its liveness bound, so that a missed wake-up shows as work left waiting
    /// instead of being covered up.
    pub fn with_sweep(mut self, sweep: Duration) -> Engine {
        self.sweep = sweep;
        self
    }

    /// The waiters' safety net (see [`Engine::with_sweep`]). The process's other watchers
    /// (housekeeping's finishing watch, outbox delivery, the quota waker) scale theirs from
    /// it, so one setting lengthens them all.
    pub fn sweep(&self) -> Duration {
        self.sweep
    }

    /// How many times a waiter of this engine (`wait_job_or`, `wait_batch_or`, `wait_access`) has
    /// parked: found nothing, armed its watches and started waiting. A test takes the count,
    /// starts a waiter, and waits for the count to move before it makes the change the
    /// waiter should wake for, instead of sleeping and hoping.
    pub fn parked(&self) -> tokio::sync::watch::Receiver<u64> {
        self.parked.subscribe()
    }

    /// Where this engine's (and its workers') random choices come from.
    pub fn random(&self) -> &lading_core::random::SharedRandom {
        &self.random
    }

    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// The signal of a job woken in `state` (see `woken`).
    pub(crate) fn woken_in(&self, state: JobState) -> &tokio::sync::Notify {
        &self.woken[state as usize]
    }

    /// The name this engine's locks, leases and history carry (`HOST:PID` for a process).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Subscribes to committed changes made through this engine.
    pub fn subscribe(&self) -> broadcast::Receiver<ChangeEvent> {
        self.events
            .get_or_init(|| broadcast::channel(4096).0)
            .subscribe()
    }

    fn now(&self) -> String {
        format_ts(self.clock.now_ms())
    }

    fn publish(
        &self,
        kind: ChangeKind,
        id: &str,
        batch: Option<&BatchId>,
        from: Option<&str>,
        to: &str,
    ) {
        tracing::debug!(kind = kind.as_str(), id, from, to, "transition");
        let Some(events) = self.events.get().filter(|e| e.receiver_count() > 0) else {
            return;
        };
        let _ = events.send(ChangeEvent {
            kind,
            id: id.to_string(),
            batch: batch.map(|b| b.to_string()),
            from: from.map(str::to_string),
            to: to.to_string(),
            time: lading_core::time::Stamp::at_ms(self.clock.now_ms()),
            host: Some(self.owner.clone()),
            message: None,
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
                if let Some(who) = lading_core::layout::submitter_in(&sub) {
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
    /// The session its lock is claimed and made under: its lease's.
    session: u64,
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
fn spread_pick(names: &[&String], random: &dyn lading_core::random::Random) -> usize {
    let Some(head) = names.first() else {
        return 0;
    };
    let prefix = &head[..head.len().min(3)];
    let window = names
        .iter()
        .take(SPREAD)
        .take_while(|n| n.starts_with(prefix))
        .count();
    random.below(window)
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
/// A batch status field: when (ms on the engine's clock) a job of the batch was last
/// requeued by an admin.
pub const REQUEUED_AT: &str = "requeued_at_ms";
pub const FAILED_STAGE_FIELD: &str = "failed_stage";
pub const FAILURE_KIND_FIELD: &str = "failure_kind";
pub const FAILED_ATTEMPTS_FIELD: &str = "failed_attempts";

/// The status field holding a job's or batch's transitions (the last [`MAX_HISTORY`]). Each
/// is one short string, `SECONDS|FROM|TO|HOST|RETRY_COUNT|MESSAGE` (SECONDS since the epoch;
/// HOST empty when it is the previous entry's; RETRY_COUNT empty for 0), so the status that
/// carries it stays cheap to read and write on every move; [`history`] gives them as
/// `{"at", "from", "to", "host", "retry_count", "message"}`. Kept in the status node, so it
/// goes wherever the job goes and any host reads it; Merritt's own tools rewrite a status
/// without it (their moves are not in it, and it starts again at Lading's next move).
pub const HISTORY_FIELD: &str = "history";
/// Transitions a status keeps.
pub const MAX_HISTORY: usize = 32;

impl Engine {
    /// The first entry of a new record's history: made Pending now, by this process.
    pub(crate) fn born(&self, extra: &mut Map<String, Value>, at: &str) {
        push_history(extra, None, "Pending", at, &self.owner, 0, None);
    }

    /// A job's next status record: `next` reached now, by this process, the move in its
    /// history with `why` (a move to the same state is not one); `message` is the record's.
    pub(crate) fn next_job_status(
        &self,
        old: JobState,
        next: &lading_core::JobProgress,
        mut extra: Map<String, Value>,
        message: Option<String>,
        why: Option<&str>,
    ) -> JobStatus {
        let now = self.now();
        if next.state != old {
            let (from, to) = (old.name(), next.state.name());
            push_history(
                &mut extra,
                Some(from),
                to,
                &now,
                &self.owner,
                next.retry_count,
                why,
            );
        }
        JobStatus {
            status: next.state,
            last_successful_status: next.last_successful,
            last_modified: now,
            retry_count: next.retry_count,
            message,
            extra,
        }
    }
}

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
        Some(b) => lading_core::json::from_bytes(b)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(b).into_owned())),
    }
}

#[cfg(test)]
mod history_tests;
