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
use lading_engine::{Engine, EngineError};

pub const QUOTAS: &str = "/quotas";
/// Jobs parked for a slot: `/quota-waiters/PROFILE/SUBMITTER/JID`.
pub const WAITERS: &str = "/quota-waiters";
/// How long a parked job waits unless woken: a safety net, not a polling interval.
pub const PARK: std::time::Duration = std::time::Duration::from_secs(600);
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

async fn ensure(engine: &Engine, path: &str) -> Result<(), EngineError> {
    let mut at = String::new();
    for part in path.trim_start_matches('/').split('/') {
        at = format!("{at}/{part}");
        match engine
            .tree()
            .create(&at, None, lading_core::CreateMode::Persistent)
            .await
        {
            Ok(_) | Err(TreeError::NodeExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn in_flight(s: JobState) -> bool {
    !matches!(
        s,
        JobState::Completed | JobState::Failed | JobState::Deleted | JobState::Held
    )
}

/// The paths of the slots in `dir` (children `held`) whose job is finished or gone.
async fn stale_slots(
    engine: &Engine,
    dir: &str,
    held: &[String],
) -> Result<Vec<String>, EngineError> {
    let mut stale = Vec::new();
    for j in held {
        let gone = match JobId::parse(j) {
            Err(_) => true,
            Ok(jid) => match engine.job(&jid).await {
                Ok(info) => !in_flight(info.status.status),
                Err(EngineError::NoJob(_)) => true,
                Err(e) => return Err(e),
            },
        };
        if gone {
            stale.push(format!("{dir}/{j}"));
        }
    }
    Ok(stale)
}

/// Reserves a slot for `job` under `limit`, or says the submitter is full.
pub async fn reserve(
    engine: &Engine,
    profile: &str,
    submitter: &str,
    job: &JobId,
    limit: usize,
) -> Result<Slot, EngineError> {
    let dir = format!("{QUOTAS}/{}/{}", node_name(profile), node_name(submitter));
    let t = engine.tree();
    for _ in 0..MAX_TRIES {
        let Some(node) = t.get(&dir).await? else {
            ensure(engine, &dir).await?;
            continue;
        };
        let v = node.stat.version;
        let held = t.children(&dir).await?;
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
            match t.multi(ops).await {
                Ok(_) => continue,
                Err(e) if is_race(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let ops = vec![
            Op::set(&dir, None, Some(v)),
            Op::create(format!("{dir}/{job}"), None),
        ];
        match t.multi(ops).await {
            Ok(_) => return Ok(Slot::Granted),
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

/// Records `job` as parked for a slot of (`profile`, `submitter`).
pub async fn park(
    engine: &Engine,
    profile: &str,
    submitter: &str,
    job: &JobId,
) -> Result<(), EngineError> {
    let dir = format!("{WAITERS}/{}/{}", node_name(profile), node_name(submitter));
    ensure(engine, &dir).await?;
    match engine
        .tree()
        .create(
            &format!("{dir}/{job}"),
            None,
            lading_core::CreateMode::Persistent,
        )
        .await
    {
        Ok(_) | Err(TreeError::NodeExists(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Forgets that `job` was parked (it got its slot, or is gone).
pub async fn unpark(
    engine: &Engine,
    profile: &str,
    submitter: &str,
    job: &JobId,
) -> Result<(), EngineError> {
    let path = format!(
        "{WAITERS}/{}/{}/{job}",
        node_name(profile),
        node_name(submitter)
    );
    match engine.tree().delete(&path, None).await {
        Ok(()) | Err(TreeError::NoNode(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Wakes, for every submitter with parked jobs, as many of them as it has free slots (oldest
/// first); parked jobs no longer in Pending are forgotten. Returns how many were woken.
pub async fn wake(ingest: &crate::Ingest) -> Result<usize, EngineError> {
    let engine = &ingest.engine;
    let t = engine.tree();
    let profiles = match t.children(WAITERS).await {
        Ok(p) => p,
        Err(TreeError::NoNode(_)) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let mut woken = 0;
    for p in profiles {
        // Profile names are node names already (letters, digits, '_', '-', '.').
        let limit = ingest
            .profile(&p)
            .ok()
            .and_then(|pr| pr.max_in_flight_per_submitter)
            .map_or(usize::MAX, |l| l as usize);
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
                    Ok(true) => {
                        woken += 1;
                        free -= 1;
                    }
                    // Locked (being started right now) or no longer parked: its slot is
                    // spoken for either way.
                    Ok(false) => {
                        if engine
                            .job(&jid)
                            .await
                            .is_ok_and(|i| i.status.status == JobState::Pending)
                        {
                            free -= 1;
                            continue;
                        }
                    }
                    Err(EngineError::NoJob(_)) => {}
                    Err(e) => return Err(e),
                }
                let _ = t.delete(&format!("{wdir}/{j}"), None).await;
            }
        }
    }
    Ok(woken)
}

/// Runs [`wake`] whenever a job reaches a final state (at most every 100 ms), and every
/// [`PARK`]/10 as a safety net, until `shutdown` says stop.
pub async fn run_waker(ingest: std::sync::Arc<crate::Ingest>, shutdown: lading_worker::Shutdown) {
    use lading_core::WatchKind;
    let mut stop = std::pin::pin!(shutdown.into_stopped());
    let t = ingest.engine.tree().clone();
    loop {
        let mut watches = Vec::new();
        for s in [
            JobState::Completed,
            JobState::Failed,
            JobState::Deleted,
            JobState::Held,
        ] {
            if let Ok(w) = t
                .watch(
                    &lading_core::layout::job_state_folder(s),
                    WatchKind::Children,
                )
                .await
            {
                watches.push(w);
            }
        }
        if let Err(e) = wake(&ingest).await {
            tracing::warn!(error = %e, "waking jobs parked for a quota slot");
        }
        let any =
            futures_util::future::select_all(watches.into_iter().map(Box::pin).collect::<Vec<_>>());
        tokio::select! {
            _ = &mut stop => return,
            _ = any => {}
            _ = tokio::time::sleep(PARK / 10) => {}
        }
        // Many jobs finish at once: look once for all of them.
        tokio::select! {
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
