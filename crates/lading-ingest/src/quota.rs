//! Per-submitter quotas (seed 002): a profile's `max_in_flight_per_submitter` caps how many
//! of one submitter's jobs of that profile are past Pending and not finished. A job over the
//! cap waits in Pending — deferred, not failed — and is looked at again each round, so it
//! starts as the submitter's others finish, while other submitters' jobs (not over their cap)
//! are taken meanwhile: one large depositor cannot starve the rest.
//!
//! Kept in the tree, so every worker on every machine counts the same:
//!
//! ```text
//! /quotas/PROFILE/SUBMITTER        its version serialises reservations
//! /quotas/PROFILE/SUBMITTER/JID    one per job holding a slot
//! ```
//!
//! A job over the cap is *parked*: recorded under `/quota-waiters/PROFILE/SUBMITTER/JID` and
//! deferred for [`PARK`] (so it costs nothing while it waits, and workers pass it over for
//! other submitters' jobs). The waker ([`run_waker`], run beside the Pending stage) watches
//! jobs finish; when a submitter with parked jobs has free slots, it wakes that many of them
//! ([`Engine::wake_job`]), oldest first.
//!
//! A job reserves its slot when it starts (in a `multi` that bumps the folder's version, so
//! two workers cannot both take the last slot). Slots are given back lazily: when the folder
//! is full, slots of jobs that have finished (Completed, Failed, Deleted) or are gone are
//! removed in one versioned `multi`. A slot reserved by a job still in Pending (its worker
//! stopped between reserving and moving it) stays its own: the retry finds it.

use lading_core::layout::JobId;
use lading_core::{JobState, Op, TreeError};
use lading_engine::{Engine, EngineError, Fence};

pub const QUOTAS: &str = "/quotas";
/// Jobs parked for a slot: `/quota-waiters/PROFILE/SUBMITTER/JID`.
pub const WAITERS: &str = "/quota-waiters";
/// How long a parked job waits unless woken: a safety net, not a polling interval.
pub const PARK: std::time::Duration = std::time::Duration::from_secs(600);

/// How soon the waker looks again when a parked job could not be woken for the moment.
const UNSETTLED_AGAIN: std::time::Duration = std::time::Duration::from_secs(1);
const MAX_TRIES: usize = 32;

/// A submitter name as one node name (see [`lading_core::layout::escape_node_name`]).
pub fn node_name(s: &str) -> String {
    lading_core::layout::escape_node_name(s)
}

/// What a reservation found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    Granted,
    /// The submitter's jobs in flight, at the cap.
    Full(usize),
}

/// Makes `path` and the folders above it: `path` first, one write when only it is missing;
/// when its parent is missing too (a submitter's first), every folder from the root. A sweep
/// may remove an empty folder above between two creates (its `NoNode`): then the walk starts
/// over from the root, a few times.
async fn ensure(engine: &Engine, path: &str) -> Result<(), EngineError> {
    let create = |at: String| async move {
        match engine
            .tree()
            .create(&at, None, lading_core::CreateMode::Persistent)
            .await
        {
            Ok(_) => Ok(None),
            Err(e) if matches!(e.root(), TreeError::NodeExists(_)) => Ok(None),
            Err(e) if matches!(e.root(), TreeError::NoNode(_)) => Ok(Some(e)),
            Err(e) => Err(EngineError::from(e)),
        }
    };
    let Some(mut last) = create(path.to_string()).await? else {
        return Ok(());
    };
    'walk: for _ in 0..MAX_TRIES {
        let mut at = String::new();
        for part in path.trim_start_matches('/').split('/') {
            at = format!("{at}/{part}");
            if let Some(e) = create(at.clone()).await? {
                last = e;
                continue 'walk;
            }
        }
        return Ok(());
    }
    Err(last.into())
}

fn in_flight(s: JobState) -> bool {
    !matches!(
        s,
        JobState::Completed | JobState::Failed | JobState::Deleted | JobState::Held
    )
}

/// The paths of the slots in `dir` (children `held`) whose job is finished or gone, from one
/// read of their jobs' statuses.
async fn stale_slots(
    engine: &Engine,
    dir: &str,
    held: &[String],
) -> Result<Vec<String>, EngineError> {
    let ids: Vec<Option<JobId>> = held.iter().map(|j| JobId::parse(j).ok()).collect();
    let jobs: Vec<JobId> = ids.iter().flatten().cloned().collect();
    let mut states = engine.job_states(&jobs).await?.into_iter();
    let mut stale = Vec::new();
    for (j, id) in held.iter().zip(&ids) {
        // A name that is no job's, or a job finished or gone.
        let live = id.is_some() && states.next().flatten().is_some_and(in_flight);
        if !live {
            stale.push(format!("{dir}/{j}"));
        }
    }
    Ok(stale)
}

/// `ops` after `fence` (the lease holder's, see `Engine::job_fence`; none: unfenced) in
/// one `multi`: the outer error is the lease lost, the inner one the store's answer to `ops`.
async fn multi_fenced(
    engine: &Engine,
    job: &JobId,
    fence: Option<&Fence>,
    ops: Vec<Op>,
) -> Result<Result<(), TreeError>, EngineError> {
    match fence {
        Some(f) => Ok(f
            .multi(engine.tree().as_ref(), job.as_str(), ops)
            .await?
            .map(drop)),
        None => Ok(engine.tree().multi(ops).await.map(drop)),
    }
}

/// Reserves a slot for `job` under `limit`, or says the submitter is full. Every write is
/// fenced by `fence` (the job's lease's; none for a caller that holds none): a handler that
/// lost its lease reserves nothing.
pub async fn reserve(
    engine: &Engine,
    profile: &str,
    submitter: &str,
    job: &JobId,
    limit: usize,
    fence: Option<&Fence>,
) -> Result<Slot, EngineError> {
    let dir = format!("{QUOTAS}/{}/{}", node_name(profile), node_name(submitter));
    let t = engine.tree();
    for _ in 0..MAX_TRIES {
        let Some(node) = t.get(&dir).await? else {
            ensure(engine, &dir).await?;
            continue;
        };
        let v = node.stat.version;
        // Swept away since the read: made again on the next round.
        let held = match t.children(&dir).await {
            Ok(h) => h,
            Err(e) if matches!(e.root(), TreeError::NoNode(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        if held.iter().any(|j| j == job.as_str()) {
            return Ok(Slot::Granted);
        }
        if held.len() >= limit {
            let stale = stale_slots(engine, &dir, &held).await?;
            if stale.is_empty() {
                return Ok(Slot::Full(held.len()));
            }
            let mut ops = vec![Op::set(&dir, None, Some(v))];
            ops.extend(stale.into_iter().map(|p| Op::delete(p, None)));
            match multi_fenced(engine, job, fence, ops).await? {
                Ok(()) => continue,
                Err(e) if is_race(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let ops = vec![
            Op::set(&dir, None, Some(v)),
            Op::create(format!("{dir}/{job}"), None),
        ];
        match multi_fenced(engine, job, fence, ops).await? {
            Ok(()) => return Ok(Slot::Granted),
            Err(e) if is_race(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(EngineError::Conflict(dir))
}

/// Gives back every slot held by a job that is finished or gone, and removes the folders of
/// submitters (and profiles) left with none — so `/quotas` does not keep a folder for every
/// submitter ever seen. Each folder is changed in one versioned `multi`, so a reservation racing
/// with the sweep is never lost: one of the two retries. Returns how many slots and folders
/// went.
pub async fn sweep(engine: &Engine) -> Result<usize, EngineError> {
    let t = engine.tree();
    let profiles = match t.children(QUOTAS).await {
        Ok(p) => p,
        Err(TreeError::NoNode(_)) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let mut removed = 0;
    for p in profiles {
        let pdir = format!("{QUOTAS}/{p}");
        for s in t.children(&pdir).await.unwrap_or_default() {
            let dir = format!("{pdir}/{s}");
            let Some(node) = t.get(&dir).await? else {
                continue;
            };
            let held = t.children(&dir).await.unwrap_or_default();
            let stale = stale_slots(engine, &dir, &held).await?;
            let empty = stale.len() == held.len();
            if stale.is_empty() && !empty {
                continue;
            }
            let n = stale.len() + usize::from(empty);
            let mut ops = vec![Op::set(&dir, None, Some(node.stat.version))];
            ops.extend(stale.into_iter().map(|p| Op::delete(p, None)));
            if empty {
                ops.push(Op::delete(&dir, None));
            }
            match t.multi(ops).await {
                Ok(_) => removed += n,
                // A reservation got in first: its folder is in use; the next sweep looks again.
                Err(e) if is_race(&e) || matches!(e.root(), TreeError::NotEmpty(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        match t.delete(&pdir, None).await {
            Ok(()) => removed += 1,
            Err(TreeError::NotEmpty(_) | TreeError::NoNode(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(removed)
}

/// Records `job` as parked for a slot of (`profile`, `submitter`), fenced by `fence` (see
/// [`reserve`]).
pub async fn park(
    engine: &Engine,
    profile: &str,
    submitter: &str,
    job: &JobId,
    fence: Option<&Fence>,
) -> Result<(), EngineError> {
    let dir = format!("{WAITERS}/{}/{}", node_name(profile), node_name(submitter));
    // The park itself first: its folders exist but for a submitter's first park (or one
    // after a sweep removed them), and are made then.
    let park = || {
        let ops = vec![Op::create(format!("{dir}/{job}"), None)];
        multi_fenced(engine, job, fence, ops)
    };
    let answer = match park().await? {
        Err(e) if matches!(e.root(), TreeError::NoNode(_)) => {
            ensure(engine, &dir).await?;
            park().await?
        }
        answer => answer,
    };
    match answer {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.root(), TreeError::NodeExists(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Forgets that `job` was parked (it got its slot), fenced by `fence` (see [`reserve`]): a
/// handler that lost its lease must not forget the park another worker has made since.
pub async fn unpark(
    engine: &Engine,
    profile: &str,
    submitter: &str,
    job: &JobId,
    fence: Option<&Fence>,
) -> Result<(), EngineError> {
    let path = format!(
        "{WAITERS}/{}/{}/{job}",
        node_name(profile),
        node_name(submitter)
    );
    match multi_fenced(engine, job, fence, vec![Op::delete(path, None)]).await? {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.root(), TreeError::NoNode(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Starts the leased `job` (Pending → on) within `limit` jobs in flight of (`profile`,
/// `submitter`): `Done` with its slot reserved, or parked and deferred for [`PARK`] (the
/// waker wakes it when a slot frees) with the reason. Every write is fenced by the lease:
/// a handler that lost it (its session lapsed while it ran) changes nothing. Before, such a
/// handler took a slot and forgot the park another worker had made meanwhile, and the job
/// waited out its park with nobody to wake it (found by `lading-sim`).
pub async fn start_within(
    job: &lading_worker::JobCtx,
    profile: &str,
    submitter: &str,
    limit: usize,
) -> Result<lading_worker::Outcome, EngineError> {
    let (engine, jid) = (&job.engine, job.job());
    let fence = job.fence().await?;
    let fence = Some(&fence);
    match reserve(engine, profile, submitter, jid, limit, fence).await? {
        Slot::Granted => {
            unpark(engine, profile, submitter, jid, fence).await?;
            Ok(lading_worker::Outcome::Done)
        }
        Slot::Full(n) => {
            // Parked until a slot frees (the waker wakes it), not polled.
            park(engine, profile, submitter, jid, fence).await?;
            Ok(lading_worker::Outcome::Wait {
                after: PARK,
                reason: format!(
                    "{submitter} has {n} jobs of profile {profile} in flight (limit {limit}); \
                     waiting for one to finish"
                ),
            })
        }
    }
}

/// A profile's limit of jobs in flight per submitter, by the profile's name (`None`: none).
pub type Limits = std::sync::Arc<dyn Fn(&str) -> Option<usize> + Send + Sync>;

/// The limits of `ingest`'s profiles.
fn limits_of(ingest: std::sync::Arc<crate::Ingest>) -> Limits {
    std::sync::Arc::new(move |p: &str| {
        ingest
            .profile(p)
            .ok()
            .and_then(|pr| pr.max_in_flight_per_submitter)
            .map(|l| l as usize)
    })
}

/// What one look at the parked jobs did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Woken {
    /// Jobs woken.
    pub woken: usize,
    /// A parked job was given a free slot but could not be woken: locked (being started, or
    /// looked at by a worker that finds it parked and lets go) or its park being written.
    /// Either settles within moments; the waker looks again soon, as no job ending may come
    /// to wake it.
    pub unsettled: bool,
}

/// Wakes, for every submitter with parked jobs, as many of them as it has free slots (oldest
/// first); parked jobs neither in Pending nor Held are forgotten.
pub async fn wake(engine: &Engine, limits: &Limits) -> Result<Woken, EngineError> {
    let t = engine.tree();
    let profiles = match t.children(WAITERS).await {
        Ok(p) => p,
        Err(TreeError::NoNode(_)) => return Ok(Woken::default()),
        Err(e) => return Err(e.into()),
    };
    let mut out = Woken::default();
    for p in profiles {
        // Profile names are node names already (letters, digits, '_', '-', '.').
        let limit = limits(&p).unwrap_or(usize::MAX);
        let pdir = format!("{WAITERS}/{p}");
        for s in t.children(&pdir).await.unwrap_or_default() {
            let wdir = format!("{pdir}/{s}");
            let mut waiting = t.children(&wdir).await.unwrap_or_default();
            if waiting.is_empty() {
                let _ = t.delete(&wdir, None).await;
                continue;
            }
            waiting.sort();
            let qdir = format!("{QUOTAS}/{p}/{s}");
            let held = match t.children(&qdir).await {
                Ok(h) => h,
                Err(TreeError::NoNode(_)) => Vec::new(),
                Err(e) => return Err(e.into()),
            };
            let stale = stale_slots(engine, &qdir, &held).await?;
            let mut free = limit.saturating_sub(held.len() - stale.len());
            for j in waiting {
                if free == 0 {
                    break;
                }
                let Ok(jid) = JobId::parse(&j) else {
                    let _ = t.delete(&format!("{wdir}/{j}"), None).await;
                    continue;
                };
                match engine.wake_job(JobState::Pending, &jid).await {
                    // Woken: its record stays until the job gets its slot (`start_within`
                    // removes it) or is gone. Removed here, it went with a record the job
                    // had just made again, parked anew by a worker that found the submitter
                    // still full, and nobody woke it (found by `lading-sim`).
                    Ok(true) => {
                        out.woken += 1;
                        free -= 1;
                        continue;
                    }
                    // Locked (being started right now), or not deferred (its park ran out,
                    // or is being written: the waiter is recorded before the deferral):
                    // its slot is spoken for either way, and its record stays. A Held job
                    // (an admin's hold, a held collection) comes back to Pending when
                    // released, still deferred for its park: it stays parked, or nobody
                    // would wake it. (Both found by `lading-sim`.)
                    // A job that cannot be read now keeps its record too; only one past
                    // Pending, ended or gone is forgotten.
                    // A lock may be a worker's that found the job parked and lets go: it is
                    // looked at again soon, or it waited for the slow look (found by
                    // `lading-sim`, seed 353719476).
                    Ok(false) => match engine.job_state(&jid).await {
                        Ok(JobState::Pending) => {
                            out.unsettled = true;
                            free -= 1;
                            continue;
                        }
                        Ok(JobState::Held) => continue,
                        Ok(_) | Err(EngineError::NoJob(_)) => {}
                        Err(_) => continue,
                    },
                    Err(EngineError::NoJob(_)) => {}
                    Err(e) => return Err(e),
                }
                let _ = t.delete(&format!("{wdir}/{j}"), None).await;
            }
        }
    }
    Ok(out)
}

/// [`run_waker_with`] on `ingest`'s engine and profiles.
pub async fn run_waker(ingest: std::sync::Arc<crate::Ingest>, shutdown: lading_worker::Shutdown) {
    let engine = ingest.engine.clone();
    run_waker_with(engine, limits_of(ingest), shutdown).await
}

/// Runs [`wake`] whenever a job reaches a final state (at most every 100 ms), and every six
/// of the engine's sweeps (60 s in a real process, see [`Engine::sweep`]) as a safety net,
/// until `shutdown` says stop.
pub async fn run_waker_with(
    engine: std::sync::Arc<Engine>,
    limits: Limits,
    shutdown: lading_worker::Shutdown,
) {
    use lading_core::WatchKind;
    let mut stop = std::pin::pin!(shutdown.into_stopped());
    let t = engine.tree().clone();
    let mut trouble = UNSETTLED_AGAIN;
    loop {
        let mut watches = Vec::new();
        let mut unwatched = false;
        for s in [
            JobState::Completed,
            JobState::Failed,
            JobState::Deleted,
            JobState::Held,
        ] {
            match t
                .watch(
                    &lading_core::layout::job_state_folder(s),
                    WatchKind::Children,
                )
                .await
            {
                Ok(w) => watches.push(w),
                Err(_) => unwatched = true,
            }
        }
        // The safety net: six of the engine's sweeps (60 s in a real process). A watch that
        // could not be set or a look that failed (a read lost, the store unreachable, the
        // session lost) hears of no job ending: the waker looks again in a second, then
        // backs off while the trouble lasts (found by `lading-sim`, seed 1003788: the watch
        // on Completed was lost to a dropped read, and jobs parked for a slot stayed parked
        // for the safety net's whole wait after every job in flight had ended).
        let net = engine.sweep() * 6;
        let again = match wake(&engine, &limits).await {
            Ok(w) if w.unsettled => UNSETTLED_AGAIN,
            Ok(_) if !unwatched => {
                trouble = UNSETTLED_AGAIN;
                net
            }
            r => {
                if let Err(e) = r {
                    tracing::warn!(error = %e, "waking jobs parked for a quota slot");
                }
                let now = trouble;
                trouble = (trouble * 2).min(net);
                now
            }
        };
        // None set (the session lost): the sleep below wakes it.
        let any = lading_core::tree::first_ready(watches);
        tokio::select! {
            // In order, not at random: a run is the same every time (`lading-sim`).
            biased;
            _ = &mut stop => return,
            _ = any => {}
            _ = tokio::time::sleep(again) => {}
        }
        // Many jobs finish at once: look once for all of them.
        tokio::select! {
            // In order, not at random: a run is the same every time (`lading-sim`).
            biased;
            _ = &mut stop => return,
            _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
        }
    }
}

fn is_race(e: &TreeError) -> bool {
    matches!(
        e.root(),
        TreeError::BadVersion { .. } | TreeError::NodeExists(_) | TreeError::NoNode(_)
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn submitter_names_become_safe_node_names() {
        assert_eq!(super::node_name("alice"), "alice");
        assert_eq!(super::node_name("a b/c"), "a%20b%2Fc");
        assert_eq!(super::node_name(".."), "%2E.");
    }
}
