//! Generic jobs: the job API of seed 004 (CouchDB's `couch_jobs`) on Lading's coordination
//! tree, so any kind of work — not only ingest — gets durable queues, scheduling, fencing and
//! stall recovery on the embedded store and on ZooKeeper alike.
//!
//! # Layout
//!
//! Everything lives under [`ROOT`], apart from the ingest layout of SPEC §2, so the two share
//! one store without touching each other's nodes:
//!
//! ```text
//! /generic-jobs                                  folder
//! /generic-jobs/TYPE                             {"timeout_s": N}   the type's activity timeout
//! /generic-jobs/TYPE/jobs/ID                     the job record (JSON, see [`Record`])
//! /generic-jobs/TYPE/pending/SSSSSSSSSSSSS-ID    empty; one per pending job, SSS… its scheduled
//!                                                time in ms (13 digits), so children sort in
//!                                                the order jobs become due
//! /generic-jobs/TYPE/active/ID~LOCK              owner; exists exactly while LOCK holds ID
//! ```
//!
//! A job's state is in its record and matches where its entries are: pending ⇔ a `pending`
//! entry, running ⇔ an `active` entry, finished ⇔ neither. Every change is one `multi` that
//! moves the record and the entries together, so they never disagree.
//!
//! # Guarantees and how they are kept
//! - **Mutual exclusion**: `accept` deletes the pending entry in the same `multi` that marks
//!   the record running; of racing acceptors exactly one can delete it.
//! - **Fencing**: every `update`/`finish` checks `active/ID~LOCK` in its `multi`. The lock is
//!   a fresh UUID per acceptance, so once the job was removed, re-enqueued by the activity
//!   monitor or accepted again, a stale processor's write fails whatever happened since
//!   (no ABA: the name is never reused) and it gets [`JobsError::Halt`].
//! - **Activity monitor**: a running job whose record was not updated for its type's timeout
//!   is re-enqueued by deleting its `active` entry in the re-enqueueing `multi`; with several
//!   monitors on several machines, one delete succeeds, so it happens exactly once.
//! - **Waiting** (`accept` with a timeout, `wait`) is woken by the tree's watches, not polling;
//!   a wait for a job scheduled later also wakes at its time.

pub mod processor;
pub use processor::CommandProcessor;

use lading_core::time::SharedClock;
use lading_core::{Op, OpResult, Tree, TreeError, Watch, WatchKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The subtree every generic job lives in.
pub const ROOT: &str = "/generic-jobs";
/// Pending entries read per round trip when looking for a due job.
const PAGE: usize = 64;
/// Pending entries an acceptor reads first.
const FIRST_PAGE: usize = 16;
/// Attempts of an optimistic read-modify-write before giving up with `Conflict`.
const MAX_OPTIMISTIC: usize = 64;
/// Due jobs `finish_then_accept` tries to claim in the finish's `multi` before it finishes
/// alone (each lost race costs a round trip).
const NEXT_CLAIMS: usize = 2;
/// Longest job id, type name.
const MAX_ID: usize = 200;
const MAX_TYPE: usize = 64;
/// Longest activity timeout a type may have (ten years): more is a mistake, and far more
/// would overflow once turned into milliseconds.
pub const MAX_TIMEOUT_S: u64 = 10 * 365 * 24 * 3600;

/// A job's state (seed 004: pending → running → finished, and back to pending).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Pending,
    Running,
    Finished,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Running => "running",
            State::Finished => "finished",
        }
    }
    pub fn parse(s: &str) -> Option<State> {
        match s.to_ascii_lowercase().as_str() {
            "pending" => Some(State::Pending),
            "running" => Some(State::Running),
            "finished" => Some(State::Finished),
            _ => None,
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the job API refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobsError {
    #[error(
        "job type {0:?} has no activity timeout; set one before adding jobs (set_type_timeout, or `lading jobs timeout {0} SECONDS`)"
    )]
    NoType(String),
    #[error("no job {id:?} of type {ty:?}")]
    NoJob { ty: String, id: String },
    /// The processor must stop: the job was removed, re-enqueued by the activity monitor, or
    /// is held under another lock. Nothing was written.
    #[error("halt: job {id:?} of type {ty:?} is no longer held by this processor ({why})")]
    Halt {
        ty: String,
        id: String,
        why: &'static str,
    },
    #[error("no subscription {0} (never made, ended, or expired after 10 minutes unused)")]
    NoSubscription(u64),
    #[error("this process already holds {0} subscriptions; end some (unsubscribe) first")]
    TooManySubscriptions(usize),
    #[error("invalid input: {0}")]
    Invalid(String),
    #[error("corrupt node {path}: {reason}")]
    Corrupt { path: String, reason: String },
    #[error("{0} changed concurrently too often; retry")]
    Conflict(String),
    #[error(transparent)]
    Tree(#[from] TreeError),
}

pub type Result<T, E = JobsError> = std::result::Result<T, E>;

/// The record at `/generic-jobs/TYPE/jobs/ID`. Unknown fields are kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub state: State,
    /// The job's data: any JSON, the creator's to set and the processor's to update.
    pub data: Value,
    /// When the job is (or was) due, ms since the epoch.
    pub scheduled_ms: u64,
    /// Set while running when the job was added again or resubmitted: `finish` re-enqueues it.
    #[serde(default)]
    pub resubmit: bool,
    /// The scheduled time the resubmitted job gets (now, when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resubmit_ms: Option<u64>,
    /// Data given by an `add` while the job ran: the data of its next run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_data: Option<Value>,
    /// The lock of the processor running it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<String>,
    /// Who runs it (`host:pid` or the name the processor gave).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Last change; while running, the last heartbeat. The activity monitor reads this.
    pub updated_ms: u64,
    pub added_ms: u64,
    /// Times accepted.
    #[serde(default)]
    pub runs: u64,
    /// Times the activity monitor re-enqueued it.
    #[serde(default)]
    pub stalls: u64,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

/// A job as a reader sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobView {
    #[serde(rename = "type")]
    pub ty: String,
    pub id: String,
    #[serde(flatten)]
    pub record: Record,
}

/// A job held by a processor (what `accept` returns). Pass it to `update`, `finish`,
/// `resubmit`.
#[derive(Debug, Clone)]
pub struct Job {
    pub ty: String,
    pub id: String,
    /// This acceptance's lock token.
    pub lock: String,
    record: Record,
    version: i32,
}

impl Job {
    /// Takes the record a fenced `multi` wrote (its set is the `multi`'s second op).
    fn held(&mut self, rec: Record, res: &[OpResult]) {
        if let Some(OpResult::Set(stat)) = res.get(1) {
            self.version = stat.version;
        }
        self.record = rec;
    }

    pub fn data(&self) -> &Value {
        &self.record.data
    }
    /// The record as of the last `accept`/`update`.
    pub fn record(&self) -> &Record {
        &self.record
    }
    /// Whether a resubmission was requested (as of the last `update`): `finish` will
    /// re-enqueue the job.
    pub fn is_resubmitted(&self) -> bool {
        self.record.resubmit
    }
}

/// Options of [`Jobs::accept`].
#[derive(Debug, Clone, Default)]
pub struct AcceptOptions {
    /// Only jobs scheduled at or before this time (seconds since the epoch); default now.
    pub max_sched_time: Option<u64>,
    /// How long to wait for a job to become due; zero returns at once.
    pub timeout: Duration,
    /// Jobs are not scheduled and ids are random-looking: pick among the due head at random,
    /// so acceptors on several machines rarely race for the same job.
    pub no_schedule: bool,
}

/// What `add` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Added {
    /// A new job, pending.
    Created,
    /// It was pending: its data (and scheduled time, when given) were updated.
    Updated,
    /// It was running: it will be re-enqueued when it finishes.
    Resubmitted,
    /// It was finished: pending again.
    Requeued,
}

/// A subscription's handle.
pub type SubId = u64;

/// A change of a subscribed job's state; `state` is `None` when the job was removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    pub subscription: SubId,
    #[serde(rename = "type")]
    pub ty: String,
    pub id: String,
    pub state: Option<State>,
}

/// A subscription nobody has waited on for this long is ended (a client that went away).
pub const SUBSCRIPTION_IDLE_MS: u64 = 10 * 60_000;
/// Most subscriptions one process holds at once.
pub const MAX_SUBSCRIPTIONS: usize = 100_000;

struct Sub {
    ty: String,
    id: String,
    last: Option<State>,
    /// When it was made or last waited on (ms, the API's clock).
    used_ms: u64,
    /// Waits in progress on it; a subscription being waited on never expires.
    waiting: u32,
}

/// Counts an acceptor as idle for as long as it lives.
struct Idle<'a>(&'a AtomicUsize);

impl Drop for Idle<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The acceptors of one type in this process that wait for any due job (no
/// `max_sched_time`: they are interchangeable). One of them, the leader, holds a watch of the
/// pending folder and looks at each change itself; the others wait to be woken one at a time:
/// by a taker that saw more due than it took (see `try_accept`), so a burst reaches as many
/// acceptors as it needs while a single job stirs only the leader; and by a leader that
/// leaves, so another takes its place. An acceptor bounded by a `max_sched_time` leads a
/// `Waiters` of its own.
#[derive(Default)]
struct Waiters {
    notify: Notify,
    /// Whether an acceptor leads.
    leader: Mutex<bool>,
}

/// Leadership of a type's [`Waiters`], and the watch that goes with it. Dropped (the acceptor
/// got a job, gave up, or failed), it wakes another waiter to lead.
struct Leading<'a> {
    waiters: &'a Waiters,
    watch: Option<Watch>,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        *self.waiters.leader.lock().unwrap() = false;
        self.waiters.notify.notify_one();
    }
}

/// Counts a wait on its subscriptions for as long as it lives (a dropped wait included).
struct Waiting<'a> {
    subs: &'a Mutex<HashMap<SubId, Sub>>,
    ids: Vec<SubId>,
    clock: &'a SharedClock,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let now = self.clock.now_ms();
        let mut m = self.subs.lock().unwrap();
        for id in &self.ids {
            if let Some(s) = m.get_mut(id) {
                s.waiting = s.waiting.saturating_sub(1);
                s.used_ms = s.used_ms.max(now);
            }
        }
    }
}

/// The job API over one tree session.
pub struct Jobs {
    tree: Arc<dyn Tree>,
    clock: SharedClock,
    owner: String,
    /// Pending entries (type → names) an acceptor of this process is claiming: siblings skip
    /// them, so local acceptors do not all race for the head.
    claims: Mutex<HashMap<String, HashSet<String>>>,
    /// Per type: the acceptors of this process waiting for any due job, led by one that
    /// watches.
    waiters: Mutex<HashMap<String, Arc<Waiters>>>,
    /// Woken when a local claim failed (its entry may still be due).
    unclaimed: Notify,
    /// Acceptors of this process waiting for a job to become due. While there are any, the
    /// queue has no backlog, and a finishing processor leaves new jobs to them.
    idle_acceptors: AtomicUsize,
    /// Types known to exist (types are never deleted).
    types: Mutex<HashSet<String>>,
    subs: Mutex<HashMap<SubId, Sub>>,
    next_sub: AtomicU64,
    /// When idle subscriptions were last swept (ms).
    swept_ms: AtomicU64,
}

/// `parts` joined, in one allocation of the right size (these paths are built several times
/// per job, and `format!`'s machinery showed in the jobs bench's profile).
fn concat(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    parts.iter().for_each(|p| s.push_str(p));
    s
}
fn type_path(ty: &str) -> String {
    concat(&[ROOT, "/", ty])
}
fn job_path(ty: &str, id: &str) -> String {
    concat(&[ROOT, "/", ty, "/jobs/", id])
}
fn pending_dir(ty: &str) -> String {
    concat(&[ROOT, "/", ty, "/pending"])
}
fn pending_name(scheduled_ms: u64, id: &str) -> String {
    format!("{scheduled_ms:013}-{id}")
}
fn pending_path(ty: &str, scheduled_ms: u64, id: &str) -> String {
    concat(&[ROOT, "/", ty, "/pending/", &pending_name(scheduled_ms, id)])
}
fn active_dir(ty: &str) -> String {
    concat(&[ROOT, "/", ty, "/active"])
}
fn active_path(ty: &str, id: &str, lock: &str) -> String {
    concat(&[ROOT, "/", ty, "/active/", id, "~", lock])
}

/// `(scheduled_ms, id)` of a pending entry's name.
fn parse_pending(name: &str) -> Option<(u64, &str)> {
    let (ms, rest) = name.split_at_checked(13)?;
    let id = rest.strip_prefix('-')?;
    Some((ms.parse().ok()?, id))
}

/// Checks a job id: 1–200 characters of `A-Z a-z 0-9 . _ : @ + = -`, not starting with `.`.
pub fn check_id(id: &str) -> Result<()> {
    check_name(id, "job id", MAX_ID, "._:@+=-")
}

/// Checks a type name: 1–64 characters of `A-Z a-z 0-9 . _ -`, not starting with `.`.
pub fn check_type(ty: &str) -> Result<()> {
    check_name(ty, "job type", MAX_TYPE, "._-")
}

fn check_name(s: &str, what: &str, max: usize, extra: &str) -> Result<()> {
    if s.is_empty() || s.len() > max {
        return Err(JobsError::Invalid(format!(
            "{what} {s:?} must be 1 to {max} characters long"
        )));
    }
    if s.starts_with('.') {
        return Err(JobsError::Invalid(format!(
            "{what} {s:?} must not start with '.'"
        )));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || extra.contains(*c)))
    {
        return Err(JobsError::Invalid(format!(
            "{what} {s:?} contains {c:?}; allowed: letters, digits and {extra}"
        )));
    }
    Ok(())
}

/// Whether a tree error means "someone changed it first" (re-read and retry).
fn is_race(e: &TreeError) -> bool {
    matches!(
        e.root(),
        TreeError::BadVersion { .. } | TreeError::NoNode(_) | TreeError::NodeExists(_)
    )
}

/// A lock token never used before: a random per-process prefix and a counter (one
/// `getrandom` per process instead of one per acceptance).
fn lock_token() -> String {
    static PREFIX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| uuid::Uuid::new_v4().as_u64_pair().0);
    format!(
        "{prefix:016x}{:016x}",
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A cheap pseudo-random number (to spread acceptors over the due head; not for secrets).
fn spread(n: usize) -> usize {
    static STATE: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);
    let x = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % n as u64) as usize
}

fn secs_to_ms(s: u64) -> Result<u64> {
    s.checked_mul(1000)
        .filter(|ms| *ms < 10_000_000_000_000)
        .ok_or_else(|| JobsError::Invalid(format!("scheduled time {s} is out of range")))
}

/// Completes when any of `watches` fires.
async fn any_fired(watches: &mut [lading_core::Watch]) {
    std::future::poll_fn(|cx| {
        for w in watches.iter_mut() {
            if Pin::new(w).poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        Poll::Pending
    })
    .await
}

impl Jobs {
    pub fn new(tree: Arc<dyn Tree>, clock: SharedClock, owner: impl Into<String>) -> Jobs {
        Jobs {
            tree,
            clock,
            owner: owner.into(),
            claims: Mutex::new(HashMap::new()),
            waiters: Mutex::new(HashMap::new()),
            unclaimed: Notify::new(),
            idle_acceptors: AtomicUsize::new(0),
            types: Mutex::new(HashSet::new()),
            subs: Mutex::new(HashMap::new()),
            next_sub: AtomicU64::new(1),
            swept_ms: AtomicU64::new(0),
        }
    }

    pub fn tree(&self) -> &Arc<dyn Tree> {
        &self.tree
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    async fn read(&self, ty: &str, id: &str) -> Result<Option<(Record, i32)>> {
        let path = job_path(ty, id);
        let Some(node) = self.tree.get(&path).await? else {
            return Ok(None);
        };
        let rec = serde_json::from_slice(node.data.as_deref().unwrap_or(b"null")).map_err(|e| {
            JobsError::Corrupt {
                path,
                reason: e.to_string(),
            }
        })?;
        Ok(Some((rec, node.stat.version)))
    }

    async fn require_type(&self, ty: &str) -> Result<()> {
        check_type(ty)?;
        if self.types.lock().unwrap().contains(ty) {
            return Ok(());
        }
        if self.tree.exists(&type_path(ty)).await?.is_none() {
            return Err(JobsError::NoType(ty.into()));
        }
        self.types.lock().unwrap().insert(ty.into());
        Ok(())
    }

    // ----- types -----

    /// Sets a type's activity timeout (whole seconds, at least 1), creating the type.
    pub async fn set_type_timeout(&self, ty: &str, timeout_s: u64) -> Result<()> {
        check_type(ty)?;
        if timeout_s == 0 || timeout_s > MAX_TIMEOUT_S {
            return Err(JobsError::Invalid(format!(
                "an activity timeout must be 1 to {MAX_TIMEOUT_S} seconds (ten years), not {timeout_s}"
            )));
        }
        let data = Some(serde_json::to_vec(&serde_json::json!({"timeout_s": timeout_s})).unwrap());
        let tp = type_path(ty);
        for _ in 0..MAX_OPTIMISTIC {
            if self.tree.exists(&tp).await?.is_some() {
                match self.tree.set(&tp, data.clone(), None).await {
                    Err(TreeError::NoNode(_)) => continue,
                    r => {
                        r?;
                        return Ok(());
                    }
                }
            }
            if self.tree.exists(ROOT).await?.is_none() {
                match self
                    .tree
                    .create(ROOT, None, lading_core::CreateMode::Persistent)
                    .await
                {
                    Ok(_) | Err(TreeError::NodeExists(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            let ops = vec![
                Op::create(&tp, data.clone()),
                Op::create(format!("{tp}/jobs"), None),
                Op::create(format!("{tp}/pending"), None),
                Op::create(format!("{tp}/active"), None),
            ];
            match self.tree.multi(ops).await {
                Ok(_) => return Ok(()),
                Err(e) if is_race(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(JobsError::Conflict(tp))
    }

    /// A type's activity timeout in seconds.
    pub async fn get_type_timeout(&self, ty: &str) -> Result<u64> {
        check_type(ty)?;
        let tp = type_path(ty);
        let node = self
            .tree
            .get(&tp)
            .await?
            .ok_or_else(|| JobsError::NoType(ty.into()))?;
        let v: Value =
            serde_json::from_slice(node.data.as_deref().unwrap_or(b"null")).map_err(|e| {
                JobsError::Corrupt {
                    path: tp.clone(),
                    reason: e.to_string(),
                }
            })?;
        v.get("timeout_s")
            .and_then(Value::as_u64)
            .ok_or_else(|| JobsError::Corrupt {
                path: tp,
                reason: "no timeout_s".into(),
            })
    }

    /// Every type with its timeout, sorted by name.
    pub async fn types(&self) -> Result<Vec<(String, u64)>> {
        let names = match self.tree.children(ROOT).await {
            Err(TreeError::NoNode(_)) => return Ok(Vec::new()),
            r => r?,
        };
        let mut out = Vec::new();
        for n in names {
            out.push((n.clone(), self.get_type_timeout(&n).await?));
        }
        Ok(out)
    }

    // ----- creating jobs -----

    /// Adds a job, or — when `id` exists — updates it as seed 004 says: pending → its data
    /// and (when given) scheduled time are updated; running → flagged to be re-enqueued with
    /// this data when it finishes; finished → pending again. `scheduled_time` is seconds since
    /// the epoch (default: now).
    pub async fn add(
        &self,
        ty: &str,
        id: &str,
        data: Value,
        scheduled_time: Option<u64>,
    ) -> Result<Added> {
        check_id(id)?;
        self.require_type(ty).await?;
        let sched = scheduled_time.map(secs_to_ms).transpose()?;
        let path = job_path(ty, id);
        for _ in 0..MAX_OPTIMISTIC {
            let now = self.now_ms();
            let (ops, added) = match self.read(ty, id).await? {
                None => {
                    let s = sched.unwrap_or(now);
                    let rec = Record {
                        state: State::Pending,
                        data: data.clone(),
                        scheduled_ms: s,
                        resubmit: false,
                        resubmit_ms: None,
                        next_data: None,
                        lock: None,
                        owner: None,
                        updated_ms: now,
                        added_ms: now,
                        runs: 0,
                        stalls: 0,
                        extra: Default::default(),
                    };
                    (
                        vec![
                            Op::create(&path, Some(serde_json::to_vec(&rec).unwrap())),
                            Op::create(pending_path(ty, s, id), None),
                        ],
                        Added::Created,
                    )
                }
                Some((mut rec, v)) => {
                    let mut ops = Vec::new();
                    let added = match rec.state {
                        State::Pending => {
                            rec.data = data.clone();
                            if let Some(s) = sched.filter(|s| *s != rec.scheduled_ms) {
                                ops.push(Op::delete(pending_path(ty, rec.scheduled_ms, id), None));
                                ops.push(Op::create(pending_path(ty, s, id), None));
                                rec.scheduled_ms = s;
                            }
                            Added::Updated
                        }
                        State::Running => {
                            rec.resubmit = true;
                            rec.resubmit_ms = sched;
                            rec.next_data = Some(data.clone());
                            Added::Resubmitted
                        }
                        State::Finished => {
                            rec.state = State::Pending;
                            rec.data = data.clone();
                            rec.scheduled_ms = sched.unwrap_or(now);
                            ops.push(Op::create(pending_path(ty, rec.scheduled_ms, id), None));
                            Added::Requeued
                        }
                    };
                    rec.updated_ms = now;
                    ops.insert(
                        0,
                        Op::set(&path, Some(serde_json::to_vec(&rec).unwrap()), Some(v)),
                    );
                    (ops, added)
                }
            };
            match self.tree.multi(ops).await {
                Ok(_) => return Ok(added),
                Err(e) if is_race(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(JobsError::Conflict(path))
    }

    /// Removes a job. A processor running it gets `Halt` at its next `update` or `finish`.
    pub async fn remove(&self, ty: &str, id: &str) -> Result<()> {
        check_id(id)?;
        check_type(ty)?;
        let path = job_path(ty, id);
        for _ in 0..MAX_OPTIMISTIC {
            let Some((rec, v)) = self.read(ty, id).await? else {
                return Err(JobsError::NoJob {
                    ty: ty.into(),
                    id: id.into(),
                });
            };
            let mut ops = vec![Op::delete(&path, Some(v))];
            match (rec.state, &rec.lock) {
                (State::Pending, _) => {
                    ops.push(Op::delete(pending_path(ty, rec.scheduled_ms, id), None))
                }
                (State::Running, Some(lock)) => {
                    ops.push(Op::delete(active_path(ty, id, lock), None))
                }
                _ => {}
            }
            match self.tree.multi(ops).await {
                Ok(_) => return Ok(()),
                Err(e) if is_race(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(JobsError::Conflict(path))
    }

    // ----- reading -----

    pub async fn get_job(&self, ty: &str, id: &str) -> Result<JobView> {
        check_type(ty)?;
        check_id(id)?;
        match self.read(ty, id).await? {
            Some((record, _)) => Ok(JobView {
                ty: ty.into(),
                id: id.into(),
                record,
            }),
            None => Err(JobsError::NoJob {
                ty: ty.into(),
                id: id.into(),
            }),
        }
    }

    pub async fn get_job_data(&self, ty: &str, id: &str) -> Result<Value> {
        Ok(self.get_job(ty, id).await?.record.data)
    }

    pub async fn get_job_state(&self, ty: &str, id: &str) -> Result<State> {
        Ok(self.get_job(ty, id).await?.record.state)
    }

    /// Up to `limit` jobs of a type with ids after `after`, in id order, optionally only
    /// those in `state`. The last id returned is the cursor for the next page.
    pub async fn list(
        &self,
        ty: &str,
        state: Option<State>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<JobView>> {
        self.require_type(ty).await?;
        let dir = format!("{ROOT}/{ty}/jobs");
        let mut out = Vec::new();
        let mut cursor = after.map(str::to_string);
        while out.len() < limit {
            let page = self
                .tree
                .children_page(&dir, cursor.as_deref(), PAGE.max(limit))
                .await?;
            for id in &page {
                if let Some((record, _)) = self.read(ty, id).await?
                    && state.is_none_or(|s| s == record.state)
                {
                    out.push(JobView {
                        ty: ty.into(),
                        id: id.clone(),
                        record,
                    });
                    if out.len() == limit {
                        break;
                    }
                }
            }
            if page.len() < PAGE.max(limit) {
                break;
            }
            cursor = page.last().cloned();
        }
        Ok(out)
    }

    /// Jobs of a type per state.
    pub async fn counts(&self, ty: &str) -> Result<HashMap<State, u64>> {
        self.require_type(ty).await?;
        let pending = self.tree.count_children(&pending_dir(ty)).await?;
        let running = self.tree.count_children(&active_dir(ty)).await?;
        let all = self
            .tree
            .count_children(&format!("{ROOT}/{ty}/jobs"))
            .await?;
        Ok(HashMap::from([
            (State::Pending, pending),
            (State::Running, running),
            (State::Finished, all.saturating_sub(pending + running)),
        ]))
    }

    // ----- processing -----

    /// Takes the earliest due pending job of `ty` and marks it running under a new lock.
    /// Waits up to `opts.timeout` for one to become due; `None` when none did.
    pub async fn accept(&self, ty: &str, opts: &AcceptOptions) -> Result<Option<Job>> {
        self.require_type(ty).await?;
        if let Some(s) = opts.max_sched_time {
            secs_to_ms(s)?;
        }
        let deadline = Instant::now() + opts.timeout;
        // Acceptors of any due job share their type's waiters. One bounded by a scheduled time
        // can neither stand in for them nor they for it: it leads waiters of its own (its own
        // watch, and nobody to wake).
        let waiters = match opts.max_sched_time {
            None => self.waiters(ty),
            Some(_) => Arc::new(Waiters::default()),
        };
        let dir = pending_dir(ty);
        let mut leading: Option<Leading> = None;
        loop {
            let unclaimed = self.unclaimed.notified();
            // Enabled before the look: a wake-up during it is kept (and handed on to another
            // waiter if this acceptor takes a job and never waits).
            let woken = waiters.notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let mut skipped = false;
            let next_due = match self
                .try_accept(ty, opts, &mut skipped, &[], usize::MAX)
                .await?
            {
                Ok((job, _)) => return Ok(Some(job)),
                Err(next_due) => next_due,
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            if leading.is_none() {
                let mut leader = waiters.leader.lock().unwrap();
                if !*leader {
                    *leader = true;
                    leading = Some(Leading {
                        waiters: &waiters,
                        watch: None,
                    });
                }
            }
            if let Some(l) = leading.as_mut()
                && l.watch.is_none()
            {
                // Watch first, then look once more: a job added in between is not missed.
                l.watch = Some(self.tree.watch(&dir, WatchKind::Children).await?);
                continue;
            }
            let mut wait = deadline - now;
            if let Some(due) = next_due {
                let ms = due.saturating_sub(self.now_ms()) + 1;
                wait = wait.min(Duration::from_millis(ms));
            }
            self.idle_acceptors.fetch_add(1, Ordering::Relaxed);
            let _idle = Idle(&self.idle_acceptors);
            let watch = leading.as_mut().and_then(|l| l.watch.as_mut());
            let fired = async {
                match watch {
                    Some(w) => w.await,
                    None => std::future::pending().await,
                }
            };
            let fired = tokio::select! {
                _ = fired => true,
                _ = woken => false,
                // Only a pass that stepped over a local peer's claim waits for it to end (a
                // wake-up for every lost race would stir every idle acceptor).
                _ = unclaimed, if skipped => false,
                _ = tokio::time::sleep(wait) => false,
            };
            if fired && let Some(l) = leading.as_mut() {
                // Armed again before the look: a change after the look fires it.
                l.watch = Some(self.tree.watch(&dir, WatchKind::Children).await?);
            }
        }
    }

    fn waiters(&self, ty: &str) -> Arc<Waiters> {
        let mut m = self.waiters.lock().unwrap();
        match m.get(ty) {
            Some(w) => w.clone(),
            None => m.entry(ty.to_string()).or_default().clone(),
        }
    }

    /// One pass over the due head. `Err(next)` when nothing could be taken; `next` is when the
    /// first not-yet-due job becomes due, if waiting for it can help. `skipped` is set when
    /// a job was passed over because another acceptor of this process was claiming it.
    ///
    /// Each claim's `multi` starts with `prefix` (its results come first); an error in the
    /// prefix is returned as is. At most `max_claims` claims are tried.
    async fn try_accept(
        &self,
        ty: &str,
        opts: &AcceptOptions,
        skipped: &mut bool,
        prefix: &[Op],
        mut max_claims: usize,
    ) -> Result<std::result::Result<(Job, Vec<OpResult>), Option<u64>>> {
        let now = self.now_ms();
        let limit = match opts.max_sched_time {
            Some(s) => secs_to_ms(s)?,
            None => now,
        };
        let dir = pending_dir(ty);
        let mut after: Option<String> = None;
        // The head is nearly always enough: a short first page, full ones after it.
        let mut page_len = FIRST_PAGE;
        loop {
            let page = self
                .tree
                .children_page(&dir, after.as_deref(), page_len)
                .await?;
            let mut due: Vec<(&str, u64, &str)> = Vec::new();
            let mut next = None;
            for name in &page {
                let Some((ms, id)) = parse_pending(name) else {
                    continue;
                };
                if ms > limit {
                    // Later jobs become due as time passes only when the limit is "now".
                    next = opts.max_sched_time.is_none().then_some(ms);
                    break;
                }
                due.push((name, ms, id));
            }
            if opts.no_schedule && due.len() > 1 {
                let r = spread(due.len());
                due.rotate_left(r);
            }
            let more_pages = next.is_none() && page.len() == page_len;
            let n_due = due.len();
            for (i, (name, ms, id)) in due.into_iter().enumerate() {
                if max_claims == 0 {
                    return Ok(Err(None));
                }
                if !self.claim_entry(ty, name) {
                    *skipped = true;
                    continue;
                }
                max_claims -= 1;
                let r = self.claim(ty, id, ms, prefix).await;
                self.unclaim_entry(ty, name);
                match r {
                    Ok(Some(got)) => {
                        // More may be due than this acceptor takes: wake a waiting one.
                        if (i + 1 < n_due || more_pages)
                            && self.idle_acceptors.load(Ordering::Relaxed) > 0
                        {
                            self.waiters(ty).notify.notify_one();
                        }
                        return Ok(Ok(got));
                    }
                    Ok(None) => self.unclaimed.notify_waiters(),
                    Err(e) => {
                        self.unclaimed.notify_waiters();
                        return Err(e);
                    }
                }
            }
            if next.is_some() || page.len() < page_len {
                return Ok(Err(next));
            }
            after = page.last().cloned();
            page_len = PAGE;
        }
    }

    /// Marks pending entry `name` of `ty` as being claimed by this process; `false` when a
    /// local acceptor already is.
    fn claim_entry(&self, ty: &str, name: &str) -> bool {
        let mut c = self.claims.lock().unwrap();
        match c.get_mut(ty) {
            Some(set) => !set.contains(name) && set.insert(name.to_string()),
            None => {
                c.insert(ty.to_string(), HashSet::from([name.to_string()]));
                true
            }
        }
    }

    fn unclaim_entry(&self, ty: &str, name: &str) {
        if let Some(set) = self.claims.lock().unwrap().get_mut(ty) {
            set.remove(name);
        }
    }

    /// Marks one pending job running, in one `multi` after `prefix`; `None` when another
    /// acceptor (or an `add`/`remove`) got there first. Returns the job and the results of
    /// the whole `multi`.
    async fn claim(
        &self,
        ty: &str,
        id: &str,
        scheduled_ms: u64,
        prefix: &[Op],
    ) -> Result<Option<(Job, Vec<OpResult>)>> {
        let Some((mut rec, v)) = self.read(ty, id).await? else {
            return Ok(None);
        };
        if rec.state != State::Pending || rec.scheduled_ms != scheduled_ms {
            return Ok(None);
        }
        let lock = lock_token();
        rec.state = State::Running;
        rec.lock = Some(lock.clone());
        rec.owner = Some(self.owner.clone());
        rec.updated_ms = self.now_ms();
        rec.runs += 1;
        let mut ops = prefix.to_vec();
        ops.extend([
            Op::delete(pending_path(ty, scheduled_ms, id), None),
            Op::set(
                job_path(ty, id),
                Some(serde_json::to_vec(&rec).unwrap()),
                Some(v),
            ),
            Op::create(
                active_path(ty, id, &lock),
                Some(self.owner.as_bytes().to_vec()),
            ),
        ]);
        match self.tree.multi(ops).await {
            Ok(res) => {
                let version = match res.get(prefix.len() + 1) {
                    Some(OpResult::Set(stat)) => stat.version,
                    _ => v + 1,
                };
                let job = Job {
                    ty: ty.into(),
                    id: id.into(),
                    lock,
                    record: rec,
                    version,
                };
                Ok(Some((job, res)))
            }
            Err(e) if is_race(&e) && e.failed_op().is_none_or(|i| i >= prefix.len()) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The job `id` as held under `lock` — for a processor that keeps only the id and the lock
    /// (an HTTP client). `Halt` when that lock no longer holds it.
    pub async fn held(&self, ty: &str, id: &str, lock: &str) -> Result<Job> {
        check_type(ty)?;
        check_id(id)?;
        let halt = |why| JobsError::Halt {
            ty: ty.into(),
            id: id.into(),
            why,
        };
        match self.read(ty, id).await? {
            None => Err(halt("removed")),
            Some((rec, _)) if rec.lock.as_deref() != Some(lock) => {
                Err(halt("not held under this lock"))
            }
            Some((record, version)) => Ok(Job {
                ty: ty.into(),
                id: id.into(),
                lock: lock.into(),
                record,
                version,
            }),
        }
    }

    /// The ops writing `change(record)` fenced by the job's lock (a check of the lock, or its
    /// delete when `finishing`; the record's set; what `change` adds), and the new record.
    fn fenced_ops(
        &self,
        job: &Job,
        finishing: bool,
        change: &impl Fn(&mut Record, u64) -> Vec<Op>,
    ) -> (Vec<Op>, Record) {
        let active = active_path(&job.ty, &job.id, &job.lock);
        let mut rec = job.record.clone();
        let extra = change(&mut rec, self.now_ms());
        let mut ops = vec![
            if finishing {
                Op::delete(active, None)
            } else {
                Op::check(active, None)
            },
            Op::set(
                job_path(&job.ty, &job.id),
                Some(serde_json::to_vec(&rec).unwrap()),
                Some(job.version),
            ),
        ];
        ops.extend(extra);
        (ops, rec)
    }

    /// Writes `change(record)` fenced by the job's lock: retried over concurrent `add`s,
    /// `Halt` once the lock is gone. `finishing` also releases the lock.
    async fn fenced(
        &self,
        job: &mut Job,
        finishing: bool,
        change: impl Fn(&mut Record, u64) -> Vec<Op>,
    ) -> Result<()> {
        let path = job_path(&job.ty, &job.id);
        let halt = |why| JobsError::Halt {
            ty: job.ty.clone(),
            id: job.id.clone(),
            why,
        };
        for _ in 0..MAX_OPTIMISTIC {
            let (ops, rec) = self.fenced_ops(job, finishing, &change);
            match self.tree.multi(ops).await {
                Ok(res) => {
                    job.held(rec, &res);
                    return Ok(());
                }
                Err(e) if e.failed_op() == Some(0) && is_race(&e) => {
                    return Err(halt("removed, re-enqueued or accepted again"));
                }
                Err(e) if is_race(&e) => {
                    // The record changed under us (an add asked for a resubmit): re-read.
                    match self.read(&job.ty, &job.id).await? {
                        None => return Err(halt("removed")),
                        Some((rec, _)) if rec.lock.as_deref() != Some(job.lock.as_str()) => {
                            return Err(halt("held under another lock"));
                        }
                        Some((rec, v)) => {
                            job.record = rec;
                            job.version = v;
                        }
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(JobsError::Conflict(path))
    }

    /// Heartbeat, and new data when given. `Halt` means stop running the job.
    pub async fn update(&self, job: &mut Job, data: Option<Value>) -> Result<()> {
        self.fenced(job, false, |rec, now| {
            if let Some(d) = &data {
                rec.data = d.clone();
            }
            rec.updated_ms = now;
            Vec::new()
        })
        .await
    }

    /// Marks the job for re-enqueueing when it finishes (at `scheduled_time`, seconds, or now).
    pub async fn resubmit(&self, job: &mut Job, scheduled_time: Option<u64>) -> Result<()> {
        let sched = scheduled_time.map(secs_to_ms).transpose()?;
        self.fenced(job, false, |rec, now| {
            rec.resubmit = true;
            rec.resubmit_ms = sched;
            rec.updated_ms = now;
            Vec::new()
        })
        .await
    }

    /// Finishes the job (with its final data, when given) — or, when a resubmission was
    /// requested, makes it pending again. `Halt`: nothing was written.
    pub async fn finish(&self, job: &mut Job, data: Option<Value>) -> Result<()> {
        let change = finishing(job, data);
        self.fenced(job, true, change).await
    }

    /// [`finish`](Self::finish), then [`accept`](Self::accept) of the same type — with the
    /// finish and the next job's claim in one `multi` when a job is due, so a busy processor
    /// pays one round trip per job instead of two. Not while other acceptors of this process
    /// wait for work: then there is no backlog, and new jobs are left to them.
    ///
    /// Whatever happens to the claim, the finish means what `finish` means: `Halt` when the
    /// lock no longer holds the job (then nothing was written and no job was taken). Waits up
    /// to `opts.timeout` for a next job, as `accept` does.
    pub async fn finish_then_accept(
        &self,
        job: &mut Job,
        data: Option<Value>,
        opts: &AcceptOptions,
    ) -> Result<Option<Job>> {
        if let Some(s) = opts.max_sched_time {
            secs_to_ms(s)?;
        }
        let ty = job.ty.clone();
        // Acceptors of this process are idle: no backlog, and a due job is theirs.
        if self.idle_acceptors.load(Ordering::Relaxed) == 0 {
            let change = finishing(job, data.clone());
            let (ops, rec) = self.fenced_ops(job, true, &change);
            let n = ops.len();
            let mut skipped = false;
            match self
                .try_accept(&ty, opts, &mut skipped, &ops, NEXT_CLAIMS)
                .await
            {
                Ok(Ok((next, res))) => {
                    job.held(rec, &res);
                    return Ok(Some(next));
                }
                // Nothing due, or lost every race for it: finish alone, then accept.
                Ok(Err(_)) => {}
                // The finish part was refused (the record changed, or the lock is gone):
                // `finish` re-reads, retries or halts as it always does.
                Err(JobsError::Tree(e)) if e.failed_op().is_some_and(|i| i < n) => {}
                Err(e) => return Err(e),
            }
        }
        self.finish(job, data).await?;
        self.accept(&ty, opts).await
    }

    // ----- the activity monitor -----

    /// One pass of the activity monitor: every running job whose last update is older than
    /// its type's timeout is made pending again. Returns how many this call re-enqueued (with
    /// several monitors, each stalled job is counted by exactly one).
    pub async fn monitor_once(&self) -> Result<usize> {
        let mut n = 0;
        for (ty, timeout_s) in self.types().await? {
            let dir = active_dir(&ty);
            for name in self.tree.children(&dir).await? {
                let Some((id, lock)) = name.rsplit_once('~') else {
                    continue;
                };
                let Some((mut rec, v)) = self.read(&ty, id).await? else {
                    continue;
                };
                let now = self.now_ms();
                if rec.lock.as_deref() != Some(lock)
                    || now.saturating_sub(rec.updated_ms) <= timeout_s.saturating_mul(1000)
                {
                    continue;
                }
                rec.lock = None;
                rec.owner = None;
                rec.updated_ms = now;
                rec.stalls += 1;
                // A stalled run never completed: it runs again now (with the data an `add`
                // gave meanwhile, if any).
                rec.resubmit = true;
                rec.resubmit_ms = None;
                let enqueue = requeue(&mut rec, &ty, id, now);
                let mut ops = vec![
                    Op::delete(format!("{dir}/{name}"), None),
                    Op::set(
                        job_path(&ty, id),
                        Some(serde_json::to_vec(&rec).unwrap()),
                        Some(v),
                    ),
                ];
                ops.extend(enqueue);
                match self.tree.multi(ops).await {
                    Ok(_) => {
                        tracing::warn!(ty, id, "activity timeout: job re-enqueued");
                        n += 1;
                    }
                    Err(e) if is_race(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(n)
    }

    /// Runs the activity monitor until `stop` is notified: a pass every quarter of the
    /// shortest type timeout (between 100 ms and 5 s). Errors are logged and retried.
    pub async fn run_monitor(&self, stop: &Notify) {
        loop {
            if let Err(e) = self.monitor_once().await {
                tracing::warn!("activity monitor: {e}");
            }
            let shortest = match self.types().await {
                Ok(t) => t.iter().map(|(_, s)| *s).min().unwrap_or(20),
                Err(_) => 20,
            };
            let every = Duration::from_millis((shortest * 250).clamp(100, 5_000));
            tokio::select! {
                _ = stop.notified() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    // ----- subscriptions -----

    /// Subscribes to a job's state changes; returns the subscription and the current state.
    /// Subscriptions not waited on for [`SUBSCRIPTION_IDLE_MS`] are ended (swept at most once
    /// a minute, on a new subscription); at most [`MAX_SUBSCRIPTIONS`] are held.
    pub async fn subscribe(&self, ty: &str, id: &str) -> Result<(SubId, State)> {
        let state = self.get_job_state(ty, id).await?;
        let now = self.clock.now_ms();
        let mut m = self.subs.lock().unwrap();
        let swept = self.swept_ms.load(Ordering::Relaxed);
        if now.saturating_sub(swept) >= 60_000 || m.len() >= MAX_SUBSCRIPTIONS {
            self.swept_ms.store(now, Ordering::Relaxed);
            m.retain(|_, s| s.waiting > 0 || now.saturating_sub(s.used_ms) < SUBSCRIPTION_IDLE_MS);
        }
        if m.len() >= MAX_SUBSCRIPTIONS {
            return Err(JobsError::TooManySubscriptions(m.len()));
        }
        let sid = self.next_sub.fetch_add(1, Ordering::Relaxed);
        m.insert(
            sid,
            Sub {
                ty: ty.into(),
                id: id.into(),
                last: Some(state),
                used_ms: now,
                waiting: 0,
            },
        );
        Ok((sid, state))
    }

    /// How many subscriptions this process holds.
    pub fn subscription_count(&self) -> usize {
        self.subs.lock().unwrap().len()
    }

    /// Ends a subscription; false when there was none.
    pub fn unsubscribe(&self, sub: SubId) -> bool {
        self.subs.lock().unwrap().remove(&sub).is_some()
    }

    /// The next state change of any of `subs` since it was last reported (or subscribed),
    /// only changes to `state` when given (a removal is always reported, and ends the
    /// subscription); `None` after `timeout`.
    pub async fn wait(
        &self,
        subs: &[SubId],
        state: Option<State>,
        timeout: Duration,
    ) -> Result<Option<Change>> {
        if subs.is_empty() {
            return Err(JobsError::Invalid(
                "wait needs at least one subscription".into(),
            ));
        }
        let _waiting = {
            let now_ms = self.clock.now_ms();
            let mut m = self.subs.lock().unwrap();
            if let Some(&missing) = subs.iter().find(|id| !m.contains_key(id)) {
                return Err(JobsError::NoSubscription(missing));
            }
            for id in subs {
                if let Some(s) = m.get_mut(id) {
                    s.waiting += 1;
                    s.used_ms = now_ms;
                }
            }
            Waiting {
                subs: &self.subs,
                ids: subs.to_vec(),
                clock: &self.clock,
            }
        };
        let deadline = Instant::now() + timeout;
        loop {
            let mut watches = Vec::with_capacity(subs.len());
            for &sid in subs {
                let (ty, id, last) = {
                    let m = self.subs.lock().unwrap();
                    let s = m.get(&sid).ok_or(JobsError::NoSubscription(sid))?;
                    (s.ty.clone(), s.id.clone(), s.last)
                };
                let path = job_path(&ty, &id);
                watches.push(self.tree.watch(&path, WatchKind::Data).await?);
                let now = self.read(&ty, &id).await?.map(|(r, _)| r.state);
                if now == last {
                    continue;
                }
                let mut m = self.subs.lock().unwrap();
                if now.is_none() {
                    m.remove(&sid);
                } else if let Some(s) = m.get_mut(&sid) {
                    s.last = now;
                }
                if now.is_none() || state.is_none() || now == state {
                    return Ok(Some(Change {
                        subscription: sid,
                        ty,
                        id,
                        state: now,
                    }));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            tokio::select! {
                _ = any_fired(&mut watches) => {}
                _ = tokio::time::sleep(left) => return Ok(None),
            }
        }
    }
}

/// The change `finish` makes to a held job's record (and the op re-enqueueing it, if any).
fn finishing(job: &Job, data: Option<Value>) -> impl Fn(&mut Record, u64) -> Vec<Op> + use<> {
    let (ty, id) = (job.ty.clone(), job.id.clone());
    move |rec, now| {
        if let Some(d) = &data {
            rec.data = d.clone();
        }
        rec.lock = None;
        rec.owner = None;
        rec.updated_ms = now;
        requeue(rec, &ty, &id, now)
    }
}

/// A finishing (or stalled) job: pending again when a resubmission was asked for, finished
/// otherwise. Returns the op that enqueues it, if any.
fn requeue(rec: &mut Record, ty: &str, id: &str, now: u64) -> Vec<Op> {
    if !rec.resubmit {
        rec.state = State::Finished;
        return Vec::new();
    }
    rec.state = State::Pending;
    rec.resubmit = false;
    rec.scheduled_ms = rec.resubmit_ms.take().unwrap_or(now);
    if let Some(d) = rec.next_data.take() {
        rec.data = d;
    }
    vec![Op::create(pending_path(ty, rec.scheduled_ms, id), None)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_entries_parse() {
        assert!(check_id("a-b_c.d:e@f+g=h").is_ok());
        assert!(check_id("").is_err());
        assert!(check_id("a/b").unwrap_err().to_string().contains("'/'"));
        assert!(check_id(".hidden").is_err());
        assert!(check_id(&"x".repeat(201)).is_err());
        assert!(check_type("replication").is_ok());
        assert!(check_type("a:b").is_err());
        assert_eq!(
            parse_pending(&pending_name(1_700_000_000_000, "job-1")),
            Some((1_700_000_000_000, "job-1"))
        );
        assert_eq!(parse_pending("12-x"), None);
        assert!(pending_name(5, "b") < pending_name(40, "a"));
    }
}
