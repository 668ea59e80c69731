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
//! /generic-jobs/TYPE                             the type's settings ([`TypeSettings`]: activity
//!                                                timeout, retry policy, rate limit, retention)
//! /generic-jobs/TYPE/jobs/ID                     the job record (JSON, see [`Record`])
//! /generic-jobs/TYPE/pending/PPPP-SSSSSSSSSSSSS-ID
//!                                                empty; one per pending job: PPPP its priority
//!                                                + 1000 (4 digits), SSS… its scheduled time in
//!                                                ms (13 digits), so children sort by priority,
//!                                                then by the time jobs become due
//! /generic-jobs/TYPE/active/ID~LOCK              owner; exists exactly while LOCK holds ID
//! /generic-jobs/TYPE/finished/SSSSSSSSSSSSS-ID   empty; one per finished job, by the time it
//!                                                finished (retention removes the oldest)
//! /generic-jobs/TYPE/failed/SSSSSSSSSSSSS-ID     the same for failed jobs
//! /generic-jobs/TYPE/rate                        {"second","count"}: accepts in this second,
//!                                                when the type has a rate limit
//! /generic-jobs/TYPE/schedules/NAME              a schedule ([`Schedule`]) and its last tick
//! ```
//!
//! A job's state is in its record and matches where its entries are: pending ⇔ a `pending`
//! entry, running ⇔ an `active` entry, finished ⇔ a `finished` entry, failed ⇔ a `failed`
//! entry (jobs finished before that folder existed have none). Every change is one `multi`
//! that moves the record and the entries together, so they never disagree.
//!
//! # Extensions of couch_jobs
//! couch_jobs' operations keep their meaning. Beside them: a run ends with an [`Outcome`]
//! (an error is retried by the type's policy, with exponential backoff and jitter, and after
//! the last attempt the job is **failed**, a fourth state, until an admin retries it);
//! priorities (lower first, then due time); schedules (one job per tick, exactly once however
//! many monitors run); a rate limit per type; retention of finished and failed jobs; batched
//! accept and finish; and subscriptions that see every transition, in order.
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

mod add;
mod group;
mod layout;
mod monitor;
mod process;
pub mod processor;
mod read;
mod record;
mod schedule;
mod subscribe;
mod types;
use layout::*;
pub use monitor::MonitorPass;
pub use process::MAX_BATCH;
pub use processor::CommandProcessor;
use record::is_zero;
pub use record::{HISTORY, JobView, MAX_ERROR, Outcome, PRIORITIES, Record};
pub use schedule::{Cron, Every, Schedule, ScheduleView, tick_id};
pub use types::{TypeSettings, TypeUpdate, TypeView};

use lading_core::random::SharedRandom;
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
use std::time::Duration;
// tokio's: the runtime's clock (the simulator pauses it), the system's otherwise.
use tokio::sync::Notify;
use tokio::time::Instant;

/// The subtree every generic job lives in.
pub const ROOT: &str = "/generic-jobs";
/// How long a process uses a type's settings before reading them again.
const SETTINGS_TTL: Duration = Duration::from_secs(1);
/// Pending entries read per round trip when looking for a due job.
const PAGE: usize = 64;
/// Pending entries an acceptor reads first.
const FIRST_PAGE: usize = 16;
/// Due entries an acceptor reads beyond those it wants, to stand in for any taken meanwhile.
const SPARE: usize = 3;
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

/// A job's state (seed 004: pending → running → finished, and back to pending; and, an
/// extension, failed: a run that ended in error on its last attempt).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Pending,
    Running,
    Finished,
    Failed,
}

impl State {
    pub const ALL: [State; 4] = [
        State::Pending,
        State::Running,
        State::Finished,
        State::Failed,
    ];
    pub fn name(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Running => "running",
            State::Finished => "finished",
            State::Failed => "failed",
        }
    }
    pub fn parse(s: &str) -> Option<State> {
        State::ALL
            .into_iter()
            .find(|st| st.name().eq_ignore_ascii_case(s))
    }
    /// `parse`, or an error that lists the states.
    pub fn parse_named(s: &str) -> Result<State> {
        State::parse(s).ok_or_else(|| {
            JobsError::Invalid(format!(
                "unknown state {s:?}: expected pending, running, finished or failed"
            ))
        })
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
        "job type {0:?} has no activity timeout, so it does not exist yet: give it one with `lading jobs timeout {0} SECONDS` (or PUT /api/v1/types/{0})"
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
    /// The job is not in a state the operation applies to. Nothing was written.
    #[error("job {id:?} of type {ty:?} is {state}: {why}")]
    WrongState {
        ty: String,
        id: String,
        state: State,
        why: &'static str,
    },
    #[error("no schedule {name:?} of type {ty:?}")]
    NoSchedule { ty: String, name: String },
    #[error(transparent)]
    Tree(#[from] TreeError),
}

pub type Result<T, E = JobsError> = std::result::Result<T, E>;

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

/// Options of [`Jobs::add_with`].
#[derive(Debug, Clone, Copy, Default)]
pub struct AddOptions {
    /// Due at this time (seconds since the epoch); default now (for an existing pending job:
    /// its time is kept).
    pub scheduled_time: Option<u64>,
    /// Lower runs first; -1000 to 1000, default 0 (for an existing job: its priority is
    /// kept unless given).
    pub priority: Option<i32>,
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub subscription: SubId,
    #[serde(rename = "type")]
    pub ty: String,
    pub id: String,
    pub state: Option<State>,
    /// The transition's number in the job's life (0 for a removal, and for records written
    /// before transitions were counted).
    pub seq: u64,
    /// Transitions that happened since the last one reported and are no longer remembered
    /// (more than [`HISTORY`] while nobody waited): reported as a count, never silently.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub missed: u64,
}

/// A subscription nobody has waited on for this long is ended (a client that went away).
pub const SUBSCRIPTION_IDLE_MS: u64 = 10 * 60_000;
/// Most subscriptions one process holds at once.
pub const MAX_SUBSCRIPTIONS: usize = 100_000;

struct Sub {
    ty: String,
    id: String,
    last: Option<State>,
    /// The last transition reported (or seen at subscription).
    last_seq: u64,
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
        *self
            .waiters
            .leader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = false;
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
        let mut m = self
            .subs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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
    /// Spreads acceptors over the due head, and backoffs (see [`lading_core::random`]).
    random: SharedRandom,
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
    /// How many times an acceptor has parked (see [`Jobs::parked`]).
    parked: tokio::sync::watch::Sender<u64>,
    /// How many times a subscription wait has parked (see [`Jobs::parked_waits`]).
    parked_waits: tokio::sync::watch::Sender<u64>,
    /// Types known to exist (types are never deleted), with their settings as last read.
    types: Mutex<HashMap<String, (Arc<TypeSettings>, Instant)>>,
    /// Per type, when this process's monitor last removed ended jobs (ms; see
    /// `Jobs::retention_due`).
    retained_ms: Mutex<HashMap<String, u64>>,
    subs: Mutex<HashMap<SubId, Sub>>,
    next_sub: AtomicU64,
    /// When idle subscriptions were last swept (ms).
    swept_ms: AtomicU64,
    /// Adds of new jobs committed together where a `multi` is a round trip.
    adds: Arc<group::Group>,
    /// Lock tokens: a random prefix drawn from `random` at the first acceptance, then a
    /// counter.
    token_prefix: std::sync::OnceLock<u64>,
    tokens: AtomicU64,
}

/// Checks a priority.
pub fn check_priority(p: i32) -> Result<()> {
    if PRIORITIES.contains(&p) {
        Ok(())
    } else {
        Err(JobsError::Invalid(format!(
            "priority {p} is out of range: -1000 to 1000 (lower runs first)"
        )))
    }
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
            random: lading_core::random::os_seeded(),
            owner: owner.into(),
            claims: Mutex::new(HashMap::new()),
            waiters: Mutex::new(HashMap::new()),
            unclaimed: Notify::new(),
            idle_acceptors: AtomicUsize::new(0),
            parked: tokio::sync::watch::Sender::new(0),
            parked_waits: tokio::sync::watch::Sender::new(0),
            types: Mutex::new(HashMap::new()),
            retained_ms: Mutex::new(HashMap::new()),
            subs: Mutex::new(HashMap::new()),
            next_sub: AtomicU64::new(1),
            swept_ms: AtomicU64::new(0),
            adds: Arc::default(),
            token_prefix: std::sync::OnceLock::new(),
            tokens: AtomicU64::new(0),
        }
    }

    pub fn tree(&self) -> &Arc<dyn Tree> {
        &self.tree
    }

    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// How many times an acceptor of this API has parked: found nothing due and started
    /// waiting. A test takes the count, starts acceptors, and waits for it to move before it
    /// adds the jobs they should wake for, instead of sleeping and hoping.
    pub fn parked(&self) -> tokio::sync::watch::Receiver<u64> {
        self.parked.subscribe()
    }

    /// How many times a [`Jobs::wait`] has parked: found no change to report and started
    /// waiting for one (what [`Jobs::parked`] is for acceptors).
    pub fn parked_waits(&self) -> tokio::sync::watch::Receiver<u64> {
        self.parked_waits.subscribe()
    }

    /// Acceptors of this API waiting for a job now (a processor idle, or a client's
    /// long-poll); one whose caller went away is no longer counted.
    pub fn waiting_acceptors(&self) -> usize {
        self.idle_acceptors.load(Ordering::Relaxed)
    }

    /// The same API with `random` for its choices (a seeded source makes a test
    /// repeatable).
    pub fn with_random(mut self, random: SharedRandom) -> Jobs {
        self.random = random;
        self
    }

    /// A lock token never used before: this API's random prefix (one draw from its
    /// [`Random`](lading_core::random::Random), so a seeded run repeats its tokens) and a
    /// counter.
    fn lock_token(&self) -> String {
        let prefix = self.token_prefix.get_or_init(|| self.random.next_u64());
        format!(
            "{prefix:016x}{:016x}",
            self.tokens.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    async fn read(&self, ty: &str, id: &str) -> Result<Option<(Record, i32)>> {
        let path = job_path(ty, id);
        let Some(node) = self.tree.get(&path).await? else {
            return Ok(None);
        };
        let rec = lading_core::json::from_bytes(node.data.as_deref().unwrap_or(b"null")).map_err(
            |e| JobsError::Corrupt {
                path,
                reason: e.to_string(),
            },
        )?;
        Ok(Some((rec, node.stat.version)))
    }

    /// The type's settings: checks the type exists (and on first use in this process, that
    /// it has every folder). Read again at most once a second, so a change made elsewhere
    /// applies here within a second.
    async fn require_type(&self, ty: &str) -> Result<Arc<TypeSettings>> {
        check_type(ty)?;
        let known = self
            .types
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(ty)
            .cloned();
        if let Some((settings, at)) = &known
            && at.elapsed() < SETTINGS_TTL
        {
            return Ok(settings.clone());
        }
        let settings = self.read_type(ty).await?;
        self.remember_type(ty, settings).await
    }

    /// Remembers `ty`'s settings as just read (by [`Jobs::require_type`], or by the monitor's
    /// listing of every type), making the folders a type made by an older version lacks the
    /// first time this process meets it.
    async fn remember_type(&self, ty: &str, settings: TypeSettings) -> Result<Arc<TypeSettings>> {
        let known = self
            .types
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains_key(ty);
        if !known {
            self.ensure_dirs(ty).await?;
        }
        let settings = Arc::new(settings);
        self.types
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(ty.into(), (settings.clone(), Instant::now()));
        Ok(settings)
    }

    /// Creates the folders a type made by an older version lacks.
    async fn ensure_dirs(&self, ty: &str) -> Result<()> {
        for dir in type_dirs(ty) {
            if self.tree.exists(&dir).await?.is_none() {
                match self
                    .tree
                    .create(&dir, None, lading_core::CreateMode::Persistent)
                    .await
                {
                    Ok(_) | Err(TreeError::NodeExists(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        // Pending entries written before priorities (`SSS…-ID`) get their priority prefix.
        let dir = pending_dir(ty);
        for name in self.tree.children(&dir).await? {
            if let Some((p, ms, id, false)) = parse_pending(&name) {
                let ops = vec![
                    Op::delete(concat(&[&dir, "/", &name]), None),
                    Op::create(pending_path(ty, p, ms, id), None),
                ];
                match self.tree.multi(ops).await {
                    Ok(_) => {}
                    Err(e) if is_race(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }
}

/// The change `finish` makes to a held job's record (and the ops entering its next state):
/// success finishes it; an error re-enqueues it after a backoff while attempts are left and
/// fails it after the last. Either way a resubmission asked for while it ran wins: it runs
/// again (an error still counts as an attempt).
fn finishing(
    job: &Job,
    outcome: Outcome,
    settings: Arc<TypeSettings>,
    random: SharedRandom,
) -> impl Fn(&mut Record, u64) -> Vec<Op> + use<> {
    let (ty, id) = (job.ty.clone(), job.id.clone());
    move |rec, now| {
        rec.lock = None;
        rec.owner = None;
        rec.updated_ms = now;
        match &outcome {
            Outcome::Success(data) => {
                if let Some(d) = data {
                    rec.data = d.clone();
                }
                if !rec.resubmit {
                    rec.attempts = 0;
                    rec.last_error = None;
                }
                requeue(rec, &ty, &id, now)
            }
            Outcome::Error { message, data } => {
                if let Some(d) = data {
                    rec.data = d.clone();
                }
                rec.attempts = rec.attempts.saturating_add(1);
                rec.last_error = Some(bounded_error(message));
                if rec.resubmit {
                    return requeue(rec, &ty, &id, now);
                }
                if rec.attempts < settings.max_attempts {
                    let at = now + settings.backoff_ms(rec.attempts, &*random);
                    vec![rec.enqueue(&ty, &id, at)]
                } else {
                    vec![rec.end(State::Failed, &ty, &id, now)]
                }
            }
        }
    }
}

/// `message`, at most [`MAX_ERROR`] bytes (its end kept: the last lines say most).
fn bounded_error(message: &str) -> String {
    if message.len() <= MAX_ERROR {
        return message.to_string();
    }
    let mut start = message.len() - MAX_ERROR + 3;
    while !message.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &message[start..])
}

/// A finishing (or stalled) job: pending again when a resubmission was asked for, finished
/// otherwise. Returns the ops entering that state.
fn requeue(rec: &mut Record, ty: &str, id: &str, now: u64) -> Vec<Op> {
    if !rec.resubmit {
        return vec![rec.end(State::Finished, ty, id, now)];
    }
    rec.resubmit = false;
    let at = rec.resubmit_ms.take().unwrap_or(now);
    if let Some(d) = rec.next_data.take() {
        rec.data = d;
    }
    vec![rec.enqueue(ty, id, at)]
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
            parse_pending(&pending_name(-3, 1_700_000_000_000, "job-1")),
            Some((-3, 1_700_000_000_000, "job-1", true))
        );
        assert_eq!(
            parse_pending("1700000000000-old-1"),
            Some((0, 1_700_000_000_000, "old-1", false))
        );
        assert_eq!(parse_pending("12-x"), None);
        assert!(pending_name(0, 5, "b") < pending_name(0, 40, "a"));
        assert!(pending_name(-1, 99, "b") < pending_name(0, 5, "a"));
        assert!(pending_name(-1000, 99, "b") < pending_name(1000, 5, "a"));
        assert!(check_priority(1001).is_err() && check_priority(-1000).is_ok());
        let long = "é".repeat(MAX_ERROR);
        let b = bounded_error(&long);
        assert!(b.len() <= MAX_ERROR && b.starts_with("...") && b.ends_with('é'));
    }
}
