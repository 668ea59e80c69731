//! Where a type's jobs live in the tree, and their entries' names:
//!
//! ```text
//! /generic-jobs/TYPE                      the type's settings
//! /generic-jobs/TYPE/jobs/ID              a job's record
//! /generic-jobs/TYPE/pending/PPPP-MS13-ID due order (priority, then due time)
//! /generic-jobs/TYPE/active/ID~LOCK       a running job's lock
//! /generic-jobs/TYPE/finished|failed/MS13-ID  ended jobs, oldest first (retention)
//! /generic-jobs/TYPE/rate                 the rate limit's second and count
//! /generic-jobs/TYPE/schedules/NAME       a schedule and its last tick
//! ```

use super::*;

/// `parts` joined, in one allocation of the right size (these paths are built several times
/// per job, and `format!`'s machinery showed in the jobs bench's profile).
pub(crate) fn concat(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    parts.iter().for_each(|p| s.push_str(p));
    s
}
pub(crate) fn type_path(ty: &str) -> String {
    concat(&[ROOT, "/", ty])
}
pub(crate) fn job_path(ty: &str, id: &str) -> String {
    concat(&[ROOT, "/", ty, "/jobs/", id])
}
pub(crate) fn pending_dir(ty: &str) -> String {
    concat(&[ROOT, "/", ty, "/pending"])
}
pub(crate) fn pending_name(priority: i32, scheduled_ms: u64, id: &str) -> String {
    format!("{:04}-{scheduled_ms:013}-{id}", priority + 1000)
}
pub(crate) fn pending_path(ty: &str, priority: i32, scheduled_ms: u64, id: &str) -> String {
    concat(&[
        ROOT,
        "/",
        ty,
        "/pending/",
        &pending_name(priority, scheduled_ms, id),
    ])
}
pub(crate) fn finished_path(ty: &str, ms: u64, id: &str) -> String {
    concat(&[ROOT, "/", ty, "/finished/", &format!("{ms:013}-{id}")])
}
pub(crate) fn failed_path(ty: &str, ms: u64, id: &str) -> String {
    concat(&[ROOT, "/", ty, "/failed/", &format!("{ms:013}-{id}")])
}
pub(crate) fn rate_path(ty: &str) -> String {
    concat(&[ROOT, "/", ty, "/rate"])
}
pub(crate) fn schedules_dir(ty: &str) -> String {
    concat(&[ROOT, "/", ty, "/schedules"])
}
/// The folders of a type (created with it; added to a type made by an older version on
/// first use).
pub(crate) fn type_dirs(ty: &str) -> [String; 6] {
    [
        "jobs",
        "pending",
        "active",
        "finished",
        "failed",
        "schedules",
    ]
    .map(|d| concat(&[ROOT, "/", ty, "/", d]))
}
pub(crate) fn active_dir(ty: &str) -> String {
    concat(&[ROOT, "/", ty, "/active"])
}
pub(crate) fn active_path(ty: &str, id: &str, lock: &str) -> String {
    concat(&[ROOT, "/", ty, "/active/", id, "~", lock])
}

/// A pending entry's name: `(priority, scheduled_ms, id)`, and whether it has the priority
/// prefix (entries written before priorities existed, `SSS…-ID`, are priority 0).
pub(crate) fn parse_pending(name: &str) -> Option<(i32, u64, &str, bool)> {
    if name.as_bytes().get(4) == Some(&b'-') {
        let code: i32 = name[..4].parse().ok()?;
        let (ms, id) = parse_ended(&name[5..])?;
        return Some((code - 1000, ms, id, true));
    }
    let (ms, id) = parse_ended(name)?;
    Some((0, ms, id, false))
}

/// `(ms, id)` of a `finished`/`failed` entry's name (`SSSSSSSSSSSSS-ID`).
pub(crate) fn parse_ended(name: &str) -> Option<(u64, &str)> {
    let (ms, rest) = name.split_at_checked(13)?;
    let id = rest.strip_prefix('-')?;
    if !ms.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((ms.parse().ok()?, id))
}
