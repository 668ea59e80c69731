//! Invariants checked at every commit, on the jobs and batches the commit touched, while
//! the tree is locked (nothing can happen in between).
//!
//! - **One state, agreeing**: a job with a status has exactly one reference among the state
//!   folders (at its priority), in the folder its status names, and exactly one reference
//!   among its batch's folders, the one its state belongs to.
//! - **No commit by a fenced worker**: a commit that sets a job's or a batch's status without
//!   naming the version it read either takes its lock in the same `multi` or is made by the
//!   session that held the lock before it. A versioned set is fenced by its version. No
//!   commit deletes a job's or a batch's lock another session holds (unless it made it).
//! - **Quotas**: a submitter's quota folder holds no more slots than the limit.
//! - **Generic jobs** (`lading-jobs`): no second of a type's clock has more accepts than its
//!   rate limit; a job is removed only when it has ended and its type's retention has passed
//!   (the simulated admin removes none itself); a schedule's last tick only moves on, to a
//!   tick of its rule that is due, and the job its commit adds is that tick's.

use lading_core::layout::{BATCH_FOLDERS, BatchId, JOBS, JobId, batch_node, batch_ref, job_node};
use lading_core::{JobState, Op};
use lading_jobs::{Record, Schedule, TypeSettings};
use lading_store_sqlite::mem::Mem;
use std::collections::BTreeMap;

/// What a commit's fencing check needs from before it: for each status the commit sets,
/// the path of its lock and that lock's owner then (`None`: free).
pub struct Probe {
    guarded: Vec<(String, String, Option<u64>)>,
    /// Job and batch locks the commit deletes without making them in it: path and owner.
    unlocked: Vec<(String, Option<u64>)>,
    /// Generic jobs the commit removes: type, id, and the record before.
    removed: Vec<(String, String, Option<Record>)>,
    /// Schedules the commit sets: type, name, and the last tick before.
    ticked: Vec<(String, String, Option<u64>)>,
    /// Job and batch statuses the commit deletes (a purge): the status path, its content
    /// before, and for a batch the jobs its folders listed before.
    purged: Vec<(String, Option<serde_json::Value>, Vec<JobId>)>,
}

/// Accepts of generic jobs per type and second of the acceptors' clock (what a rate limit
/// bounds).
pub type Accepts = BTreeMap<(String, u64), u64>;

const GENERIC: &str = "/generic-jobs/";

/// `(type, folder, name)` of a path `/generic-jobs/TYPE/FOLDER/NAME`.
fn generic_path(path: &str) -> Option<(&str, &str, &str)> {
    let mut parts = path.strip_prefix(GENERIC)?.split('/');
    let (ty, folder, name) = (parts.next()?, parts.next()?, parts.next()?);
    parts.next().is_none().then_some((ty, folder, name))
}

fn parsed<T: serde::de::DeserializeOwned>(data: Option<&[u8]>) -> Option<T> {
    lading_core::json::from_bytes(data?).ok()
}

fn type_settings(mem: &Mem, ty: &str) -> Option<TypeSettings> {
    parsed(mem.get(&format!("{GENERIC}{ty}"))?.data.as_deref())
}

/// The lock guarding a status node (`/jobs/jidN/status`, `/batches/bidN/status`).
fn lock_of(status_path: &str) -> Option<String> {
    let base = status_path.strip_suffix("/status")?;
    let is_job = base.starts_with("/jobs/jid") && base.matches('/').count() == 2;
    let is_batch = base.starts_with("/batches/bid") && base.matches('/').count() == 2;
    (is_job || is_batch).then(|| format!("{base}/lock"))
}

pub fn before_commit(mem: &Mem, ops: &[Op]) -> Probe {
    let guarded = ops
        .iter()
        .filter_map(|o| match o {
            // A set of the version read is fenced by that version (an admin's change of a
            // batch the reporter holds makes the reporter's own commit fail): only an
            // unversioned set needs the lock.
            Op::Set {
                path,
                version: None,
                ..
            } => {
                let lock = lock_of(path)?;
                let owner = mem.get(&lock).map(|n| n.owner);
                Some((path.clone(), lock, owner))
            }
            _ => None,
        })
        .collect();
    let unlocked = ops
        .iter()
        .filter_map(|o| match o {
            Op::Delete { path, .. }
                if path.ends_with("/lock")
                    && lock_of(&format!("{}/status", path.trim_end_matches("/lock"))).is_some()
                    && !ops
                        .iter()
                        .any(|c| matches!(c, Op::Create { path: p, .. } if p == path)) =>
            {
                Some((path.clone(), mem.get(path).map(|n| n.owner)))
            }
            _ => None,
        })
        .collect();
    let mut removed = Vec::new();
    let mut ticked = Vec::new();
    for o in ops {
        match (o, generic_path(o.path())) {
            (Op::Delete { path, .. }, Some((ty, "jobs", id))) => {
                let before = mem.get(path).and_then(|n| parsed(n.data.as_deref()));
                removed.push((ty.to_string(), id.to_string(), before));
            }
            (Op::Set { path, .. }, Some((ty, "schedules", name))) => {
                let before = mem
                    .get(path)
                    .and_then(|n| parsed::<Schedule>(n.data.as_deref()))
                    .map(|s| s.last_tick_ms);
                ticked.push((ty.to_string(), name.to_string(), before));
            }
            _ => {}
        }
    }
    let purged = ops
        .iter()
        .filter_map(|o| match o {
            Op::Delete { path, .. } if lock_of(path).is_some() => {
                let before = mem.get(path).and_then(|n| parsed(n.data.as_deref()));
                let listed = path
                    .strip_prefix("/batches/")
                    .and_then(|r| r.strip_suffix("/status"))
                    .and_then(|b| BatchId::parse(b).ok())
                    .map(|b| {
                        BATCH_FOLDERS
                            .iter()
                            .flat_map(|f| {
                                mem.children(&lading_core::layout::batch_ref_folder(&b, f))
                                    .into_iter()
                                    .flatten()
                                    .filter_map(|j| JobId::parse(j).ok())
                                    .collect::<Vec<_>>()
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                Some((path.clone(), before, listed))
            }
            _ => None,
        })
        .collect();
    Probe {
        guarded,
        unlocked,
        removed,
        ticked,
        purged,
    }
}

/// The generic-jobs invariants of one commit, at `now_ms` (the processes' clock), counting
/// its accepts into `accepts`.
fn generic_after(
    mem: &Mem,
    ops: &[Op],
    probe: &Probe,
    now_ms: u64,
    accepts: &mut Accepts,
) -> Vec<String> {
    let mut found = Vec::new();
    // Accepts: a commit that takes jobs' locks (`active/ID~LOCK`) counts them, against a
    // rate-limited type, in the second its rate node then names; counted here, not trusted
    // from the node's count.
    let mut taken: BTreeMap<&str, u64> = BTreeMap::new();
    for o in ops {
        if let Op::Create { path, .. } = o
            && let Some((ty, "active", _)) = generic_path(path)
        {
            *taken.entry(ty).or_default() += 1;
        }
    }
    for (ty, n) in taken {
        let limit = type_settings(mem, ty).map_or(0, |t| t.rate_per_s) as u64;
        if limit == 0 {
            continue;
        }
        let rate = format!("{GENERIC}{ty}/rate");
        let counted = ops.iter().find_map(|o| match o {
            Op::Set { path, data, .. } | Op::Create { path, data, .. } if *path == rate => {
                parsed::<serde_json::Value>(data.as_deref())?
                    .get("second")?
                    .as_u64()
            }
            _ => None,
        });
        let Some(second) = counted else {
            found.push(format!(
                "rate limit: {n} jobs of type {ty} accepted without counting them"
            ));
            continue;
        };
        let total = accepts.entry((ty.to_string(), second)).or_default();
        *total += n;
        if *total > limit {
            found.push(format!(
                "rate limit: {total} accepts of type {ty} in second {second}, over its limit of {limit}"
            ));
        }
    }
    // Removals: only ended jobs, once their type's retention has passed.
    for (ty, id, before) in &probe.removed {
        let Some(rec) = before else { continue };
        let keep_s = type_settings(mem, ty).map(|t| match rec.state {
            lading_jobs::State::Finished => t.keep_finished_s,
            lading_jobs::State::Failed => t.keep_failed_s,
            _ => 0,
        });
        let ended = rec.ended_ms.unwrap_or(u64::MAX);
        match keep_s {
            Some(k) if k > 0 && ended.saturating_add(k * 1000) <= now_ms => {}
            _ => found.push(format!(
                "generic job {ty}/{id} removed while {} (ended at {:?}, retention {keep_s:?} s, now {now_ms})",
                rec.state.name(),
                rec.ended_ms
            )),
        }
    }
    // Schedules: the last tick moves on to a due tick of the rule, with that tick's job.
    for (ty, name, before) in &probe.ticked {
        let path = format!("{GENERIC}{ty}/schedules/{name}");
        let Some(after) = mem
            .get(&path)
            .and_then(|n| parsed::<Schedule>(n.data.as_deref()))
        else {
            found.push(format!("schedule {ty}/{name} unreadable after its commit"));
            continue;
        };
        let tick = after.last_tick_ms;
        let tick_job = lading_jobs::tick_id(name, tick);
        let adds = ops.iter().any(|o| {
            matches!(o, Op::Create { path, .. } if generic_path(path) == Some((ty, "jobs", &tick_job)))
        });
        if before.is_some_and(|b| tick < b) {
            found.push(format!(
                "schedule {ty}/{name}: its last tick went back from {before:?} to {tick}"
            ));
        }
        if !adds {
            // A replaced schedule keeps its tick (no job); any other move adds its job.
            if before.is_some_and(|b| b != tick) {
                found.push(format!(
                    "schedule {ty}/{name} moved to tick {tick} without adding {tick_job}"
                ));
            }
            continue;
        }
        if tick > now_ms {
            found.push(format!(
                "schedule {ty}/{name}: tick {tick} added before it was due (now {now_ms})"
            ));
        }
        if let Some(every) = after.every_s
            && tick % (every * 1000) != 0
        {
            found.push(format!(
                "schedule {ty}/{name}: tick {tick} is not a multiple of its {every} s"
            ));
        }
    }
    found
}

/// The jobs whose references a commit may have changed (their ids), from the paths of its
/// ops: a reference made or removed, a job's node, status, priority (its references' names)
/// or batch. A check changes nothing, nor does a job's lock or any other of its nodes: a
/// commit of those alone leaves [`job_consistent`] as the last commit that did left it
/// (taking a lock called it for nothing, a third of its calls).
fn touched_jobs(ops: &[Op]) -> Vec<JobId> {
    let mut out: Vec<JobId> = Vec::new();
    for o in ops {
        if matches!(o, Op::Check { .. }) {
            continue;
        }
        let p = o.path();
        let name = if let Some(rest) = p.strip_prefix("/jobs/states/") {
            rest.split('/')
                .nth(1)
                .and_then(|r| r.split_once('-'))
                .map(|(_, j)| j)
        } else if let Some(rest) = p.strip_prefix("/jobs/") {
            let mut parts = rest.split('/');
            let job = parts.next();
            match parts.next() {
                None | Some("status" | "priority" | "bid") => job,
                Some(_) => None,
            }
        } else if let Some(rest) = p.strip_prefix("/batches/") {
            // /batches/bidN/states/batch-X/jidN
            rest.split('/').nth(3)
        } else {
            None
        };
        if let Some(j) = name.and_then(|n| JobId::parse(n).ok())
            && !out.contains(&j)
        {
            out.push(j);
        }
    }
    out
}

/// The profile every simulated job is of, and its limit of jobs in flight per submitter
/// (`max_in_flight_per_submitter`); the workload has three submitters.
pub const QUOTA_PROFILE: &str = "sim";
pub const QUOTA_LIMIT: usize = 4;

/// A quota folder never holds more slots than its limit: a commit that reserves one leaves
/// at most the limit (the reservation counts every slot, stale ones too, against the
/// folder's version).
fn quota_after(mem: &Mem, ops: &[Op]) -> Vec<String> {
    let mut found = Vec::new();
    // `QUOTAS/QUOTA_PROFILE/submitter/job`, matched piece by piece (a prefix formatted at
    // every commit, with the reservations' below, was 0.7% of a run).
    for o in ops {
        let Op::Create { path, .. } = o else { continue };
        let Some(rest) = path
            .strip_prefix(lading_ingest::quota::QUOTAS)
            .and_then(|r| r.strip_prefix('/'))
            .and_then(|r| r.strip_prefix(QUOTA_PROFILE))
            .and_then(|r| r.strip_prefix('/'))
        else {
            continue;
        };
        let Some((submitter, _job)) = rest.split_once('/') else {
            continue;
        };
        let dir = &path[..path.len() - rest.len() + submitter.len()];
        let held = mem.count_children(dir).unwrap_or(0) as usize;
        if held > QUOTA_LIMIT {
            found.push(format!(
                "quota: {dir} holds {held} slots, over its limit of {}",
                QUOTA_LIMIT
            ));
        }
    }
    found
}

/// The simulated working root's space: every job's provisioning reserves its bytes there
/// against a file system that never shows them used (the worst case: only the reservations
/// keep two admissions from counting the same free space).
pub const SPACE_ROOT: &str = "sim-root";
pub const SPACE_FREE: u64 = 600 << 20;
pub const SPACE_KEEP: u64 = 100 << 20;
/// The most one simulated job needs.
pub const SPACE_MAX_JOB: u64 = 120 << 20;

/// The reservations on the simulated root never add up to more than its free space less
/// what is kept free.
fn reservations_after(mem: &Mem, ops: &[Op]) -> Vec<String> {
    let reserves = ops.iter().any(|o| {
        matches!(o, Op::Create { path, .. } if path
            .strip_prefix(lading_core::layout::RESERVATIONS)
            .is_some_and(|r| r.starts_with('/')))
    });
    if !reserves {
        return Vec::new();
    }
    let prefix = format!("{}/", lading_core::layout::RESERVATIONS);
    let held: u64 = mem
        .children(lading_core::layout::RESERVATIONS)
        .into_iter()
        .flatten()
        .filter_map(|j| mem.get(&format!("{prefix}{j}")))
        .filter_map(|n| n.data.as_deref())
        .filter_map(|d| lading_core::json::from_bytes::<lading_engine::Reservation>(d).ok())
        .filter(|r| r.root == SPACE_ROOT)
        .map(|r| r.bytes)
        .sum();
    if held > SPACE_FREE - SPACE_KEEP {
        return vec![format!(
            "space: {held} bytes reserved on {SPACE_ROOT}, over its {} free less {} kept",
            SPACE_FREE, SPACE_KEEP
        )];
    }
    Vec::new()
}

/// Purges: a job's status goes only when it is Completed or Deleted; a batch's only when it
/// is Completed or Deleted and was last changed at least `retention_ms` before `now_ms`, and
/// no job its folders listed outlives it.
fn purges_after(mem: &Mem, probe: &Probe, now_ms: u64, retention_ms: u64) -> Vec<String> {
    let mut found = Vec::new();
    for (path, before, listed) in &probe.purged {
        let field = |k: &str| {
            before
                .as_ref()
                .and_then(|v| v.get(k)?.as_str().map(str::to_string))
        };
        let status = field("status").unwrap_or_default();
        if !matches!(status.as_str(), "Completed" | "Deleted") {
            found.push(format!("purge: {path} deleted while {status:?}"));
        }
        if !path.starts_with("/batches/") {
            continue;
        }
        let changed = field("last_modified")
            .as_deref()
            .and_then(lading_core::time::parse_ts);
        if changed.is_none_or(|t| t.saturating_add(retention_ms) > now_ms) {
            found.push(format!(
                "purge: {path} deleted {} ms after its last change at {changed:?}, within the retention of {retention_ms} ms",
                changed.map_or(0, |t| now_ms.saturating_sub(t))
            ));
        }
        for j in listed {
            if mem.get(&format!("{JOBS}/{j}")).is_some() {
                found.push(format!(
                    "purge: {path} deleted while its job {j} is still in the tree"
                ));
            }
        }
    }
    found
}

pub fn after_commit(
    mem: &Mem,
    session: u64,
    ops: &[Op],
    probe: &Probe,
    now_ms: u64,
    retention_ms: u64,
    accepts: &mut Accepts,
) -> Vec<String> {
    let mut found = generic_after(mem, ops, probe, now_ms, accepts);
    found.extend(purges_after(mem, probe, now_ms, retention_ms));
    found.extend(quota_after(mem, ops));
    found.extend(reservations_after(mem, ops));
    for (status, lock, owner) in &probe.guarded {
        let takes_lock = ops
            .iter()
            .any(|o| matches!(o, Op::Create { path, .. } if path == lock));
        if !takes_lock && *owner != Some(session) {
            found.push(format!(
                "fenced commit: {status} set by session {session} while its lock was {}",
                match owner {
                    Some(o) => format!("held by session {o}"),
                    None => "free".to_string(),
                }
            ));
        }
    }
    for (lock, owner) in &probe.unlocked {
        if let Some(o) = owner
            && *o != session
        {
            found.push(format!(
                "fenced commit: {lock} deleted by session {session} while session {o} held it"
            ));
        }
    }
    for jid in touched_jobs(ops) {
        found.extend(job_consistent(mem, &jid));
    }
    found
}

/// A status node's state, the rest of it skipped (a whole `Value` with its history was a few
/// percent of a run, read at every commit).
#[derive(serde::Deserialize)]
struct StatusOnly<'a> {
    #[serde(borrow)]
    status: std::borrow::Cow<'a, str>,
}

/// A job's references agree with its status (nothing to say of a job being made or gone).
pub fn job_consistent(mem: &Mem, jid: &JobId) -> Vec<String> {
    let mut found = Vec::new();
    let Some(status) = mem.get(&job_node(jid, "status")) else {
        // Not made yet, or deleted: no reference may remain of a deleted job.
        if mem.get(&format!("{JOBS}/{jid}")).is_none() {
            for s in JobState::ALL {
                let folder = lading_core::layout::job_state_folder(*s);
                if let Some(mut kids) = mem.children(&folder)
                    && kids.any(|k| k.ends_with(&format!("-{jid}")))
                {
                    found.push(format!("job {jid} is gone but referenced in {folder}"));
                }
            }
        }
        return found;
    };
    let state = status
        .data
        .as_deref()
        .and_then(|d| lading_core::json::from_bytes::<StatusOnly>(d).ok())
        .and_then(|v| JobState::parse(&v.status));
    let Some(state) = state else {
        return vec![format!("job {jid}: its status is not readable")];
    };
    let priority: u8 = mem
        .get(&job_node(jid, "priority"))
        .and_then(|n| {
            std::str::from_utf8(n.data.as_deref()?)
                .ok()?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(5);
    // One path rewritten in place per state (each formatted anew, this was 2% of a run).
    let name = lading_core::layout::job_ref_name(priority, jid);
    let mut path = String::new();
    let held: Vec<JobState> = JobState::ALL
        .iter()
        .copied()
        .filter(|s| {
            path.clear();
            for part in [
                lading_core::layout::JOB_STATES,
                "/",
                s.node_name(),
                "/",
                &name,
            ] {
                path.push_str(part);
            }
            mem.get(&path).is_some()
        })
        .collect();
    if held != [state] {
        found.push(format!(
            "job {jid}: status says {state} but it is referenced under {held:?}"
        ));
    }
    let batch = mem
        .get(&job_node(jid, "bid"))
        .and_then(|n| BatchId::parse(std::str::from_utf8(n.data.as_deref()?).ok()?).ok());
    if let Some(bid) = batch
        && mem.get(&batch_node(&bid, "status")).is_some()
        && mem.get(&lading_core::layout::batch_states(&bid)).is_some()
    {
        let in_folders: Vec<&str> = BATCH_FOLDERS
            .iter()
            .copied()
            .filter(|f| mem.get(&batch_ref(&bid, f, jid)).is_some())
            .collect();
        if in_folders != [state.batch_folder()] {
            found.push(format!(
                "job {jid}: state {state} belongs in {} but batch {bid} lists it under {in_folders:?}",
                state.batch_folder()
            ));
        }
    }
    found
}
