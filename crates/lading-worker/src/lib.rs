//! The stage-worker framework (seed 003): the loop every consumer daemon shares, so a stage
//! is only its handler.
//!
//! A handler returns an [`Outcome`]:
//! - `Done`: the job moves on (the stage's success event), in one transition.
//! - `Transient(reason)`: the job stays in its state, its lock is released and it is deferred
//!   with exponential backoff and jitter; the retry time and the attempt count are stored in
//!   the job's status, so *any* worker in any process honours them. After the stage's
//!   `max_attempts` the job is Failed with the reason and the count.
//! - `Wait { after, reason }`: deferred like a transient error but not counted (a job waiting
//!   for room in provisioning is not failing).
//! - `Unavailable { dependency, cause }`: an outside service the job needs is down (SPEC
//!   §11). The dependency is marked down for the whole process, the job waits in its stage
//!   without using an attempt (unlocked, with a visible reason), and one prober per
//!   dependency ([`deps`]) wakes the waiting jobs, in priority order and a few at first, once
//!   it answers again. A job that has waited longer than `max_wait` fails naming it.
//! - `Fatal(reason)`: Failed at once.
//!
//! A handler that panics is `Fatal` with the panic message; one that runs past the stage's
//! timeout is aborted and counts as `Transient`. Handlers run in their own tasks, so neither
//! takes the worker down. Work is picked up from change notifications (`wait_job_or`,
//! `wait_batch_or`), never a polling loop.
//!
//! Shutdown has two steps ([`Shutdown`]): *stop* ends acquisition and lets running handlers
//! finish; *abort* cuts them off and releases their leases. The binary sends *stop* on the first
//! SIGINT/SIGTERM and *abort* after a grace period or a second signal. Nothing committed is lost
//! either way: a transition is one atomic step, and a job whose handler was cut off is still in
//! its state for the next worker, with whatever interim state the handler kept in its
//! working directory.

pub mod announce;
mod batches;
mod ctx;
pub mod deps;
mod outcome;
mod services;
mod shutdown;
pub mod stage_metrics;
mod stats;

use batches::BatchLoop;
pub use ctx::{BatchCtx, BatchStage, JobCtx, JobStage, append_log, claim_workdir, workdir};
pub use outcome::{Outcome, StageConfig};
pub use services::{Phase, Supervisor};
pub use shutdown::{Shutdown, ShutdownHandle};
pub use stats::{BUCKETS_S, Histogram, StageFigures, Stats};

use lading_core::layout::{BatchId, JobId};
use lading_core::tree::BoxFuture;
use lading_core::{BatchState, Event, JobState};
use lading_engine::{
    BatchInfo, BatchLease, Effect, Engine, EngineError, JobData, JobInfo, JobLease, JobSpec,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
// Tokio's clock: the real one in a process, the simulated one under `lading-sim`.
use tokio::sync::{Mutex, RwLock};
use tokio::time::Instant;

/// How long an idle stage loop waits for work before looking at the shutdown flag again (it
/// also wakes on the flag itself; this only bounds a single wait).
const IDLE_WAIT: Duration = Duration::from_secs(60);
/// Pause after a store error before a stage loop tries again.
const ERROR_PAUSE: Duration = Duration::from_millis(500);

/// Runs stages against one engine.
pub struct Worker {
    engine: Arc<Engine>,
    work_root: PathBuf,
    stats: Arc<Stats>,
}

impl Worker {
    /// `work_root` holds the working directories of jobs whose configuration names none.
    pub fn new(engine: Arc<Engine>, work_root: impl Into<PathBuf>) -> Worker {
        Worker {
            engine,
            work_root: work_root.into(),
            stats: Arc::new(Stats::default()),
        }
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Records into `stats` (shared with whoever reports them, e.g. `/metrics`).
    pub fn with_stats(mut self, stats: Arc<Stats>) -> Worker {
        self.stats = stats;
        self
    }

    /// Runs the stages until shut down: `concurrency` slots per stage (see [`run_loops`]).
    pub async fn run(
        &self,
        jobs: Vec<(Arc<dyn JobStage>, StageConfig)>,
        batches: Vec<(Arc<dyn BatchStage>, StageConfig)>,
        shutdown: Shutdown,
    ) {
        let mut set = tokio::task::JoinSet::new();
        for (stage, cfg) in jobs {
            let n = cfg.concurrency;
            let l = JobLoop {
                engine: self.engine.clone(),
                work_root: self.work_root.clone(),
                stats: self.stats.clone(),
                stage,
                cfg,
            };
            set.spawn(run_loops(Arc::new(l), n, shutdown.clone()));
        }
        for (stage, cfg) in batches {
            let n = cfg.concurrency;
            let l = BatchLoop {
                engine: self.engine.clone(),
                stats: self.stats.clone(),
                stage,
                cfg,
            };
            set.spawn(run_loops(Arc::new(l), n, shutdown.clone()));
        }
        while let Some(r) = set.join_next().await {
            if let Err(e) = r {
                tracing::error!(error = %e, "a stage ended abnormally");
            }
        }
    }
}

/// The text of a panic payload.
fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// A working folder a handler of this process is in. Two handlers of one job can run at once
/// in one process: one whose lease was lost (its session ended; its next commit will be
/// refused, but until then it goes on) and the one that took the job up again. In one
/// folder they would undo each other's work: one renames a download into place while the
/// other writes it again, and what is left half-written is stored with the object. So the
/// second waits until the first has ended.
struct InFolder(PathBuf);

/// The folders of [`InFolder`], for the whole process (simulated processes have folders of
/// their own).
fn folders_in_use() -> &'static std::sync::Mutex<std::collections::HashSet<PathBuf>> {
    static IN_USE: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<PathBuf>>> =
        std::sync::OnceLock::new();
    IN_USE.get_or_init(Default::default)
}

impl InFolder {
    /// `dir`, for this handler; `None` while another handler is in it.
    fn enter(dir: &Path) -> Option<InFolder> {
        let mut used = folders_in_use().lock().unwrap_or_else(|p| p.into_inner());
        used.insert(dir.to_path_buf())
            .then(|| InFolder(dir.to_path_buf()))
    }
}

impl Drop for InFolder {
    fn drop(&mut self) {
        folders_in_use()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.0);
    }
}

/// Aborts a task when dropped: a handler never outlives the loop that runs it.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `fut` in its own task under `timeout`; a panic is `Fatal`, a timeout `Transient`, an
/// abort `None` (the task was cut off). Dropped before it ends (its loop's service was cut
/// off, as a process's crash cuts everything off), it aborts the handler's task: a detached
/// handler would go on writing in the job's working folder beside the next attempt (found by
/// `lading-sim`, seed 844977240: a crashed process's download, still running, left a `.part`
/// file that the job's next attempt in the restarted process took into the object).
async fn supervise(
    fut: BoxFuture<'static, Outcome>,
    timeout: Duration,
    shutdown: &mut Shutdown,
) -> Option<Outcome> {
    let mut handle = tokio::spawn(fut);
    let _cut_off_with_this = AbortOnDrop(handle.abort_handle());
    let outcome = tokio::select! {
        // In order, not at random: a run is the same every time (`lading-sim`).
        biased;
        r = tokio::time::timeout(timeout, &mut handle) => Some(match r {
            Ok(Ok(o)) => o,
            Ok(Err(e)) if e.is_panic() => {
                Outcome::Fatal(format!("handler panicked: {}", panic_message(e.into_panic())))
            }
            Ok(Err(e)) => Outcome::Transient(format!("handler ended abnormally: {e}")),
            Err(_) => {
                handle.abort();
                Outcome::Transient(format!("timed out after {} s", timeout.as_secs_f64()))
            }
        }),
        _ = shutdown.aborted() => {
            handle.abort();
            None
        }
    };
    outcome.map(Outcome::without_passwords)
}

struct JobLoop {
    engine: Arc<Engine>,
    work_root: PathBuf,
    stats: Arc<Stats>,
    stage: Arc<dyn JobStage>,
    cfg: StageConfig,
}

/// Something the runtime runs: it waits for an item of work, handles it, and gives back one it
/// leased but did not handle. Ingest jobs and batches (one state each), access requests,
/// generic jobs of one type and scheduled tasks are all run as `Acquire`s through
/// [`run_loops`], so every loop has the same stop, the same error pause and the same
/// shutdown.
pub trait Acquire: Send + Sync + 'static {
    type Lease: Send;
    /// What an item is (`job`, `batch`, `access request`), for messages.
    const WHAT: &'static str;
    /// The loop's name (a state, a queue, a type), for messages.
    fn state_name(&self) -> &str;
    /// Waits for work until `stop` says stop (cancelled through the store, never by
    /// dropping an acquisition half done). `Ok(None)`: nothing yet, ask again.
    fn wait(
        &self,
        stop: Shutdown,
    ) -> impl Future<Output = Result<Option<Self::Lease>, String>> + Send;
    /// Handles one item; may come back with the next one, already leased.
    fn handle(
        &self,
        lease: Self::Lease,
        shutdown: &mut Shutdown,
    ) -> impl Future<Output = Option<Self::Lease>> + Send;
    /// Gives back an item leased but not handled.
    fn release(&self, lease: Self::Lease) -> impl Future<Output = ()> + Send;
}

/// Runs `l` with `n` slots until shut down, then waits for what is in hand. One loop waits
/// for work while a slot is free (`n` waiters on one folder would each set the same watches
/// and race each other for every item); each item is handled in a task of its own, with the
/// items it brings along, and frees its slot when done (a handler that panics frees it too).
pub async fn run_loops<L: Acquire>(l: Arc<L>, n: usize, shutdown: Shutdown) {
    let slots = Arc::new(tokio::sync::Semaphore::new(n.max(1)));
    let mut set = tokio::task::JoinSet::new();
    let ended = |r: Result<(), tokio::task::JoinError>| {
        if let Err(e) = r {
            tracing::error!(error = %e, "a {} handler ended abnormally", L::WHAT);
        }
    };
    loop {
        while let Some(r) = set.try_join_next() {
            ended(r);
        }
        if shutdown.is_stopping() {
            break;
        }
        let permit = tokio::select! {
            // In order, not at random: a run is the same every time (`lading-sim`).
            biased;
            p = slots.clone().acquire_owned() => p.expect("never closed"),
            _ = shutdown.clone().into_stopped() => break,
        };
        let lease = match l.wait(shutdown.clone()).await {
            Ok(Some(lease)) => lease,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(state = l.state_name(), error = %e, "cannot acquire a {}", L::WHAT);
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
        };
        let (l, mut shutdown) = (l.clone(), shutdown.clone());
        set.spawn(async move {
            // A job handled successfully may bring its successor along (locked in the same
            // `multi` that moved it on): handled next, without waiting.
            let mut next = Some(lease);
            while let Some(lease) = next.take() {
                if shutdown.is_stopping() {
                    l.release(lease).await;
                    break;
                }
                next = l.handle(lease, &mut shutdown).await;
            }
            drop(permit);
        });
    }
    while let Some(r) = set.join_next().await {
        ended(r);
    }
}

/// A task the runtime runs now and then: at once, then every `every`, until shut down. A
/// stop ends the wait between two runs; a run in progress finishes first.
pub struct Every<F> {
    name: &'static str,
    every: Duration,
    task: F,
    first: std::sync::atomic::AtomicBool,
}

impl<F, Fut> Acquire for Every<F>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    type Lease = ();
    const WHAT: &'static str = "scheduled task";
    fn state_name(&self) -> &str {
        self.name
    }
    async fn wait(&self, stop: Shutdown) -> Result<Option<()>, String> {
        if self.first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            return Ok(Some(()));
        }
        tokio::select! {
            // In order, not at random: a run is the same every time (`lading-sim`).
            biased;
            _ = tokio::time::sleep(self.every) => Ok(Some(())),
            _ = stop.into_stopped() => Ok(None),
        }
    }
    async fn handle(&self, _: (), _: &mut Shutdown) -> Option<()> {
        (self.task)().await;
        None
    }
    async fn release(&self, _: ()) {}
}

/// Runs `task` at once and then every `every` until shut down, as a loop of the runtime.
pub async fn every<F, Fut>(name: &'static str, every: Duration, shutdown: Shutdown, task: F)
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let e = Every {
        name,
        every,
        task,
        first: std::sync::atomic::AtomicBool::new(true),
    };
    run_loops(Arc::new(e), 1, shutdown).await
}

impl Acquire for JobLoop {
    type Lease = JobLease;
    const WHAT: &'static str = "job";
    fn state_name(&self) -> &str {
        self.stage.state().name()
    }
    async fn wait(&self, stop: Shutdown) -> Result<Option<JobLease>, String> {
        self.engine
            .wait_job_or(self.stage.state(), IDLE_WAIT, stop.into_stopped())
            .await
            .map_err(|e| e.to_string())
    }
    fn handle(
        &self,
        lease: JobLease,
        shutdown: &mut Shutdown,
    ) -> impl Future<Output = Option<JobLease>> + Send {
        use tracing::Instrument;
        let span = tracing::info_span!(
            "job",
            job = %lease.job,
            batch = %lease.batch,
            stage = lease.state().name()
        );
        self.handle_job(lease, shutdown).instrument(span)
    }
    async fn release(&self, lease: JobLease) {
        let _ = self.engine.release_job_lease(lease).await;
    }
}

impl JobLoop {
    /// Who a working folder belongs to: the batch's uuid and the job id (job ids alone repeat
    /// across trees, e.g. a ZooKeeper rebuilt, or two chroots sharing one data folder).
    /// A batch that cannot be read now is an error, never an empty uuid: a mark made from
    /// it would differ from the one before, and the job's folder would be moved aside (found
    /// by `lading-sim`, where reads are lost).
    async fn owner_of(&self, info: &JobInfo) -> Result<String, lading_engine::EngineError> {
        // Read as stored, whatever the records' shapes: the mark must never change.
        let uuid = match info.configuration.text("batch_uuid") {
            Some(u) => u.to_string(),
            // A job made by another tool (Merritt's library): the batch's submission says.
            None => self.engine.batch_uuid(&info.bid).await?,
        };
        Ok(format!("{uuid}/{}", info.id))
    }

    async fn handle_job(&self, mut lease: JobLease, shutdown: &mut Shutdown) -> Option<JobLease> {
        let started = Instant::now();
        let state = lease.state();
        let job = lease.job.clone();
        let now = self.engine.clock().now_ms();
        let _running = self.stats.running("job", job.as_str(), state.name(), now);
        let info = match self.engine.leased_job(&mut lease).await {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(job = %job, error = %e, "cannot read the job");
                let _ = self.engine.release_job_lease(lease).await;
                return None;
            }
        };
        let dir = workdir(&self.work_root, &info);
        let owner = match self.owner_of(&info).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(job = %job, error = %e, "cannot read the job's batch");
                let _ = self.engine.release_job_lease(lease).await;
                return None;
            }
        };
        // One handler at a time in a working folder (see `InFolder`).
        let Some(_in_folder) = InFolder::enter(&dir) else {
            let reason = "the job's working folder is still in use here, by a handler whose \
                          lease was lost; waiting for it to end"
                .to_string();
            self.finish(
                lease,
                Outcome::Wait {
                    after: Duration::from_secs(1),
                    reason,
                },
                self.cfg.max_attempts,
                started,
                false,
            )
            .await;
            return None;
        };
        let attempt = lading_engine::attempts(&lease.status) + 1;
        let max_attempts = self
            .stage
            .max_attempts(&info)
            .unwrap_or(self.cfg.max_attempts);
        let ctx = Arc::new(JobCtx {
            engine: self.engine.clone(),
            info_id: job.clone(),
            info,
            attempt,
            workdir: dir,
            owner,
            claimed: std::sync::OnceLock::new(),
            lease: Mutex::new(lease.clone()),
        });
        tracing::debug!(job = %job, state = state.name(), attempt, "handling");
        // A job that waits here on a dependency still down is not run: only the prober asks
        // the dependency whether it is back.
        let outcome = match self.engine.deps().still_down_for(&job) {
            Some((dependency, _, cause)) => Some(Outcome::Unavailable { dependency, cause }),
            None => supervise(self.stage.run(ctx.clone()), self.cfg.timeout, shutdown).await,
        };
        // The handler may have changed the priority: the lease it held is the current one.
        let lease = ctx.lease.lock().await.clone();
        match outcome {
            Some(o) => {
                let chain = !shutdown.is_stopping();
                self.finish(lease, o, max_attempts, started, chain).await
            }
            None => {
                tracing::info!(job = %job, "shutting down: job released in {}", state.name());
                let _ = self.engine.release_job_lease(lease).await;
                None
            }
        }
    }

    /// Records a handler's outcome. With `chain`, a job that moves on brings back the next
    /// job of this stage, locked in the same `multi`.
    async fn finish(
        &self,
        lease: JobLease,
        outcome: Outcome,
        max_attempts: u32,
        started: Instant,
        chain: bool,
    ) -> Option<JobLease> {
        let state = lease.state();
        let job = lease.job.clone();
        let now = self.engine.clock().now_ms();
        let attempts = lading_engine::attempts(&lease.status);
        let mut lease = lease;
        if outcome != Outcome::Done {
            // Effects belong to the move the handler asked for, not to a retry or a failure.
            lease.effects.clear();
        }
        let mut outcome = outcome;
        if !matches!(outcome, Outcome::Unavailable { .. }) {
            // A wait on a dependency, if there was one, is over.
            deps::end_wait(&mut lease.status, now);
            self.engine.deps().forget(&job);
        } else if let Some(failed) = deps::over_limit(&self.engine, &lease, &outcome, now) {
            lease.failure_kind = Some("dependency");
            outcome = Outcome::Fatal(failed);
        }
        let mut next = None;
        let r = match &outcome {
            Outcome::Unavailable { dependency, cause } => {
                let msg = deps::start_wait(&self.engine, &mut lease, dependency, cause, now);
                let at = deps::recheck_at(&self.engine.deps().settings(), &lease.status, now);
                self.engine
                    .job_defer(lease, at, attempts, Some(msg))
                    .await
                    .map(|_| ())
            }
            Outcome::Done => self
                .move_on(lease, self.stage.success(), None, chain)
                .await
                .map(|n| next = n),
            Outcome::Wait { after, reason } => self
                .engine
                .job_defer(
                    lease,
                    now + after.as_millis() as u64,
                    attempts,
                    Some(reason.clone()),
                )
                .await
                .map(|_| ()),
            Outcome::Transient(reason) => {
                let n = attempts + 1;
                if n >= max_attempts {
                    let msg = format!("{reason} (gave up after {n} attempts)");
                    lease.failure_kind = Some("exhausted");
                    self.move_on(lease, Event::Fail, Some(msg), chain)
                        .await
                        .map(|n| next = n)
                } else {
                    let delay = self.cfg.backoff(n, self.engine.random().unit());
                    let msg = format!(
                        "{reason} (attempt {n} of {}; retry in {:.1} s)",
                        max_attempts,
                        delay.as_secs_f64()
                    );
                    self.engine
                        .job_defer(lease, now + delay.as_millis() as u64, n, Some(msg))
                        .await
                        .map(|_| ())
                }
            }
            Outcome::Fatal(reason) => self
                .move_on(lease, Event::Fail, Some(reason.clone()), chain)
                .await
                .map(|n| next = n),
        };
        let now = self.engine.clock().now_ms();
        self.stats
            .record(state.name(), &outcome, started.elapsed(), now);
        match (r, &outcome) {
            (Ok(()), Outcome::Done)
                if state.resolve(self.stage.success()).ok() == Some(JobState::Completed) =>
            {
                tracing::info!(job = %job, state = state.name(), "job completed")
            }
            (Ok(()), Outcome::Done) => {
                tracing::debug!(job = %job, state = state.name(), "handled")
            }
            (Ok(()), Outcome::Fatal(reason)) => {
                tracing::info!(job = %job, state = state.name(), %reason, "job failed")
            }
            (Ok(()), Outcome::Transient(reason)) if attempts + 1 >= max_attempts => {
                tracing::info!(job = %job, state = state.name(), %reason, attempts = attempts + 1,
                    "job failed: out of attempts")
            }
            (Ok(()), Outcome::Transient(reason)) => {
                tracing::info!(job = %job, state = state.name(), %reason, attempt = attempts + 1,
                    "job deferred for a retry")
            }
            (Ok(()), Outcome::Wait { reason, .. }) => {
                tracing::debug!(job = %job, state = state.name(), %reason, "job waits")
            }
            (Ok(()), Outcome::Unavailable { dependency, cause }) => {
                tracing::debug!(job = %job, state = state.name(), dependency = %dependency.label(),
                    %cause, "job waits on a dependency")
            }
            (Err(e), _) => tracing::warn!(job = %job, state = state.name(), error = %e,
                "could not record the outcome; the job stays for another worker"),
        }
        next
    }

    /// Moves a job on; with `chain`, in the same `multi` locks this stage's next job, if one
    /// is free.
    async fn move_on(
        &self,
        lease: JobLease,
        event: Event<JobState>,
        message: Option<String>,
        chain: bool,
    ) -> Result<Option<JobLease>, EngineError> {
        if !chain {
            return self
                .engine
                .job_transition(lease, event, message)
                .await
                .map(|_| None);
        }
        let (_, next) = self
            .engine
            .job_transition_then_acquire(lease, event, message, &[self.stage.state()])
            .await?;
        Ok(next)
    }
}

#[cfg(test)]
mod folder_tests {
    use super::InFolder;

    #[test]
    fn one_handler_at_a_time_in_a_working_folder() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("jid1"), dir.path().join("jid2"));
        let first = InFolder::enter(&a).expect("a free folder");
        assert!(
            InFolder::enter(&a).is_none(),
            "the same folder, while in use"
        );
        let other = InFolder::enter(&b).expect("another job's folder");
        drop(first);
        let again = InFolder::enter(&a).expect("free again once the first handler ended");
        drop((again, other));
    }
}
