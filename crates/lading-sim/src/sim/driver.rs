//! One run of the simulator: the world built from a seed, the faults and crashes played
//! against it, and the checks run once it is quiet.

use super::*;

/// Retries a call through the errors `retryable` names, as an operator would (ten tries,
/// 100 ms apart); `None` when it did not go through.
pub(super) async fn retrying<T, E, F, Fut>(f: F, retryable: impl Fn(&E) -> bool) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    for _ in 0..10 {
        match f().await {
            Ok(v) => return Some(v),
            Err(e) if retryable(&e) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(_) => return None,
        }
    }
    None
}

/// An admin call, retried through connection losses and expiries.
pub(super) async fn admin<T, F, Fut>(f: F) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = lading_engine::Result<T>>,
{
    retrying(f, |e: &lading_engine::EngineError| {
        e.is_retryable()
            || matches!(
                e,
                lading_engine::EngineError::Tree(lading_core::TreeError::SessionExpired)
            )
    })
    .await
}

/// A generic-jobs admin call, retried through any error (a lost reply, an expiry, a race).
pub(super) async fn admin_generic<T, F, Fut>(f: F) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = lading_jobs::Result<T>>,
{
    retrying(f, |_: &lading_jobs::JobsError| true).await
}

/// A job of one of `bids`, picked by `rng` (for a hold or a delete).
pub(super) async fn any_job(
    rng: &Seeded,
    admin_engine: &Engine,
    bids: &[BatchId],
) -> Option<(BatchId, JobId)> {
    let b = pick(rng, bids)?;
    let info = admin(|| admin_engine.batch(&b)).await?;
    let j = pick(
        rng,
        &info.jobs.values().flatten().cloned().collect::<Vec<_>>(),
    )?;
    Some((b, j))
}

/// What `look` still finds open once it finds nothing or `within` has passed, looked at every
/// `every` of simulated time: the harness observes from outside, so it looks (the processes
/// under test are woken by the tree). Empty when everything ended in time.
pub(super) async fn still_open<F, Fut>(within: Duration, every: Duration, look: F) -> Vec<String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Vec<String>>,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut open = Vec::new();
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(every).await;
        open = look().await;
        if open.is_empty() {
            break;
        }
    }
    open
}

/// What is still open of `bids` (with the outbox's undelivered entries, when `outbox`) once
/// they have all ended or `within` has passed (see [`still_open`]). A look reads only the
/// batches not yet seen ended; once none is open, every batch (and the outbox) is read
/// again in one pass, so the answer is what was true at one moment (a batch seen ended and
/// reopened since is open again). Reading every batch at every look was two fifths of the
/// batch-status reads of a one-process run.
pub(super) async fn not_ended(
    admin_engine: &Engine,
    bids: &[BatchId],
    within: Duration,
    every: Duration,
    outbox: bool,
) -> Vec<String> {
    let watched = Mutex::new(bids.to_vec());
    still_open(within, every, || async {
        let looking = watched.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let (mut still, mut open) = open_batches(admin_engine, &looking).await;
        if open.is_empty() {
            // None open of those looked at: all of them, and the outbox, at once.
            (still, open) = open_batches(admin_engine, bids).await;
            if outbox && open.is_empty() {
                match admin_engine.outbox().await {
                    Ok(o) if o.is_empty() => {}
                    Ok(o) => open.push(format!(
                        "{} outbox entries undelivered, such as {:?}",
                        o.len(),
                        o.first()
                    )),
                    Err(e) => open.push(format!("the outbox cannot be read: {e}")),
                }
            }
        }
        *watched.lock().unwrap_or_else(|p| p.into_inner()) = still;
        open
    })
    .await
}

/// Which of `bids` are not ended, and each of them described.
async fn open_batches(admin_engine: &Engine, bids: &[BatchId]) -> (Vec<BatchId>, Vec<String>) {
    let (mut still, mut open) = (Vec::new(), Vec::new());
    for b in bids {
        // Its state alone, one read (the whole record is seven).
        let found = match admin_engine.batch_state(b).await {
            Ok(BatchState::Completed | BatchState::Failed) => continue,
            // Purged by cleanup: only an ended batch is (checked at its commit).
            Err(lading_engine::EngineError::NoBatch(_)) => continue,
            Ok(s) => format!("{b} {s}"),
            Err(e) => format!("{b} unreadable: {e}"),
        };
        still.push(b.clone());
        open.push(found);
    }
    (still, open)
}

/// The generic jobs not Finished or Failed once they all are or `within` has passed (see
/// [`still_open`]).
pub(super) async fn generic_not_ended(jobs: &lading_jobs::Jobs, within: Duration) -> Vec<String> {
    still_open(within, Duration::from_millis(500), || async {
        let Some(all) = admin_generic(|| jobs.list(GENERIC_TYPE, None, None, 10_000)).await else {
            return vec!["the jobs are unreadable".into()];
        };
        let mut open: Vec<String> = all
            .iter()
            .filter(|j| {
                !matches!(
                    j.record.state,
                    lading_jobs::State::Finished | lading_jobs::State::Failed
                )
            })
            .map(|j| format!("{} {}", j.id, j.record.state.name()))
            .collect();
        // The jobs added at the start are all there, or ended and removed by retention.
        for i in 0..GENERIC_JOBS {
            let id = format!("g{i}");
            if all.iter().any(|j| j.id == id) {
                continue;
            }
            let gone = retrying(
                || jobs.get_job_state(GENERIC_TYPE, &id),
                |e| !matches!(e, lading_jobs::JobsError::NoJob { .. }),
            )
            .await
            .is_none();
            if !gone {
                open.push(format!("{id} missing from the list"));
            }
        }
        open
    })
    .await
}

/// The processes' working folders: in memory where the machine has a tmpfs (`/dev/shm`), as
/// the workers make and remove a folder per job and a disk spends most of a run on that.
pub(super) fn work_folder() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::tempdir_in(shm)
    {
        return d;
    }
    tempfile::tempdir().expect("a temporary folder")
}

pub fn run(seed: u64, opts: &Options) -> Run {
    // Lading's blocking work (files, hashing, the inventory) in place, so that it lands where
    // the seed's run puts it.
    lading_ingest::blocking::in_place_on_this_thread();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(simulate(seed, opts))
}

/// One seed's run: the deployment built ([`Deployment::new`]), the workload played against
/// it under faults ([`Deployment::play`]), the faults stopped, and then what must hold
/// checked (`verdict.rs`).
///
/// A run whose clock stood still too long ([`crate::tree::World::halted`]) ends there, with
/// the violation that says so, instead of never ending.
pub(super) async fn simulate(seed: u64, opts: &Options) -> Run {
    let mut d = Deployment::new(seed, opts).await;
    let world = d.world.clone();
    let counted = tokio::select! {
        biased;
        () = world.halted() => Default::default(),
        c = d.play_and_check() => c,
    };
    d.end(counted).await
}

impl Deployment {
    async fn play_and_check(&mut self) -> super::verdict::Counted {
        self.play().await;
        self.faults_stop().await;
        let open = self.batches_end().await;
        self.generic_jobs_end().await;
        let all_ended = open.is_empty();
        if all_ended {
            self.wakes_for_new_work().await;
            self.wakes_when_a_lock_goes().await;
        }
        self.events_were_sent(all_ended).await;
        if all_ended {
            self.no_space_reserved().await;
        }
        self.outcomes(all_ended).await
    }
}

/// The jobs a report mail lists: its body's indented lines, each starting with a job's id
/// (under "Completed (n):" and "Failed (n):").
pub(super) fn listed_in_mail(mail: &Value) -> Vec<String> {
    let body = mail.get("body").and_then(Value::as_str).unwrap_or_default();
    body.lines()
        .filter_map(|l| l.strip_prefix("  "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

pub(super) fn pick<T: Clone>(rng: &Seeded, from: &[T]) -> Option<T> {
    (!from.is_empty()).then(|| from[rng.below(from.len())].clone())
}

/// A submission from the simulator's fields (all of them strings, numbers or booleans).
pub(super) fn submission(fields: &Map<String, Value>) -> lading_core::layout::BatchSubmission {
    fields
        .clone()
        .try_into()
        .expect("the simulator's fields make a submission")
}
