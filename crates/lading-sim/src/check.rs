//! Invariants checked at every commit, on the jobs and batches the commit touched, while
//! the tree is locked (nothing can happen in between).
//!
//! - **One state, agreeing**: a job with a status has exactly one reference among the state
//!   folders (at its priority), in the folder its status names, and exactly one reference
//!   among its batch's folders, the one its state belongs to.
//! - **No commit by a fenced worker**: a commit that sets a job's or a batch's status without
//!   naming the version it read either takes its lock in the same `multi` or is made by the
//!   session that held the lock before it. A versioned set is fenced by its version.

use lading_core::layout::{
    BATCH_FOLDERS, BatchId, JOBS, JobId, batch_node, batch_ref, job_node, job_ref,
};
use lading_core::{JobState, Op};
use lading_store_sqlite::mem::Mem;

/// What a commit's fencing check needs from before it: for each status the commit sets,
/// the path of its lock and that lock's owner then (`None`: free).
pub struct Probe {
    guarded: Vec<(String, String, Option<u64>)>,
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
    Probe { guarded }
}

/// The jobs a commit touched (their ids), from the paths of its ops.
fn touched_jobs(ops: &[Op]) -> Vec<JobId> {
    let mut out: Vec<JobId> = Vec::new();
    for o in ops {
        let p = o.path();
        let name = if let Some(rest) = p.strip_prefix("/jobs/states/") {
            rest.split('/')
                .nth(1)
                .and_then(|r| r.split_once('-'))
                .map(|(_, j)| j)
        } else if let Some(rest) = p.strip_prefix("/jobs/") {
            rest.split('/').next()
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

pub fn after_commit(mem: &Mem, session: u64, ops: &[Op], probe: &Probe) -> Vec<String> {
    let mut found = Vec::new();
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
    for jid in touched_jobs(ops) {
        found.extend(job_consistent(mem, &jid));
    }
    found
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
        .and_then(|d| serde_json::from_slice::<serde_json::Value>(d).ok())
        .and_then(|v| v.get("status")?.as_str().and_then(JobState::parse));
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
    let held: Vec<JobState> = JobState::ALL
        .iter()
        .copied()
        .filter(|s| mem.get(&job_ref(*s, priority, jid)).is_some())
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
