//! The fixity checker (APTrust's worker of that name, SPEC §8): every recorded copy of every
//! stored file is read back from its node and compared with the inventory's size and
//! SHA-256; the outcome and time are recorded per file and node (`copies`), and `repair`
//! copies a verified good copy from another node over a bad or missing one.

use crate::Ingest;
use crate::inventory::{CopyCheck, CopyRow};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Bad or missing copies found by audits in this process, by node (for `/metrics`).
static FAILURES: Mutex<BTreeMap<u32, u64>> = Mutex::new(BTreeMap::new());

/// `lading_fixity_failures_total` by node, as counted in this process.
pub fn failures_by_node() -> BTreeMap<u32, u64> {
    FAILURES.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// One copy that is not what the inventory says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    pub node: u32,
    pub ark: String,
    pub version: u32,
    pub path: String,
    pub expected: String,
    /// The SHA-256 read, or none for a missing copy.
    pub found: Option<String>,
    /// `bad` or `missing`; after a repair, `repaired` or `unrepaired: WHY`.
    pub status: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: node {} {} v{} {}: expected sha256 {}, found {}",
            self.status,
            self.node,
            self.ark,
            self.version,
            self.path,
            self.expected,
            self.found.as_deref().unwrap_or("nothing (missing)")
        )
    }
}

/// What a check run did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Audit {
    pub checked: usize,
    pub bytes: u64,
    pub findings: Vec<Finding>,
}

/// Reads one copy back: Ok(None) when the node lacks it.
async fn read_copy(
    ingest: &Ingest,
    c: &CopyCheck,
    pace: Option<u64>,
) -> Result<Option<crate::nodes::Copy>, String> {
    if c.node == 0 {
        // The storage root of a profile without nodes: the version's recorded folder.
        let p = std::path::Path::new(&c.version_path).join(&c.path);
        return match crate::blocking::run(move || crate::fetch::file_sha256(&p)).await {
            Ok(Ok((size, sha256))) => Ok(Some(crate::nodes::Copy { size, sha256 })),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Ok(Err(e)) => Err(format!("storage root: {e}")),
            Err(e) => Err(e.to_string()),
        };
    }
    let n = ingest
        .nodes
        .get(c.node)
        .ok_or_else(|| format!("storage node {} is not configured here", c.node))?;
    n.digest(&c.ark, c.version, &c.path, pace)
        .await
        .map_err(|e| e.what)
}

/// Checks every recorded copy (of `node`, of `ark`), recording each outcome. A node that
/// cannot be read is an error (nothing is recorded as bad for it).
pub async fn check(
    ingest: &Ingest,
    node: Option<u32>,
    ark: Option<&str>,
    pace: Option<u64>,
) -> Result<Audit, String> {
    let a = ark.map(str::to_string);
    let copies = ingest
        .inventory
        .run(move |i| i.copies(node, a.as_deref()))
        .await
        .map_err(|e| format!("inventory: {e}"))?;
    check_list(ingest, copies, pace).await
}

/// The generic-jobs type of the scheduled audit, and its schedule's name.
pub const AUDIT_TYPE: &str = "lading.fixity";
pub const AUDIT_SCHEDULE: &str = "audit";
/// Copies one audit job checks at most (the schedule adds one job an hour).
const AUDIT_SHARE: i64 = 5000;

/// Runs the scheduled audit's jobs (type [`AUDIT_TYPE`], one per `[fixity] audit_every_s`
/// from its schedule, hourly by default) until `stop`: each checks a share of the copies
/// due ([`audit_due`]). The schedule is made first, or set to the configured period; while
/// the store cannot be reached, that is tried again every 30 s.
pub async fn run_audit(
    ingest: std::sync::Arc<Ingest>,
    jobs: std::sync::Arc<lading_jobs::Jobs>,
    stop: lading_worker::Shutdown,
) {
    use std::time::Duration;
    let every = ingest.cfg.fixity.audit_every_s.max(1);
    let setup = || async {
        // An audit share may read for a long time: the run's activity timeout is generous.
        jobs.set_type_timeout(AUDIT_TYPE, 6 * 3600).await?;
        let current = jobs.schedules(AUDIT_TYPE).await?;
        if !current
            .iter()
            .any(|(n, s)| n == AUDIT_SCHEDULE && s.every_s == Some(every))
        {
            jobs.set_schedule(
                AUDIT_TYPE,
                AUDIT_SCHEDULE,
                lading_jobs::Every::Seconds(every),
                serde_json::json!({}),
                0,
            )
            .await?;
        }
        Ok::<(), lading_jobs::JobsError>(())
    };
    let mut stopped = std::pin::pin!(stop.into_stopped());
    loop {
        let r = tokio::select! {
            // In order, not at random: a run is the same every time (`lading-sim`).
            biased;
            r = setup() => r,
            _ = &mut stopped => return,
        };
        let Err(e) = r else { break };
        tracing::warn!(error = %e, "fixity audit: cannot set up its schedule; trying again in 30 s");
        tokio::select! {
            // In order, not at random: a run is the same every time (`lading-sim`).
            biased;
            _ = tokio::time::sleep(Duration::from_secs(30)) => {}
            _ = &mut stopped => return,
        }
    }
    // Asked every few minutes (or each tick, when the schedule ticks more often) without
    // waiting: the audit is no acceptor held open, and costs one read when nothing is due.
    let opts = lading_jobs::AcceptOptions::default();
    let pause = Duration::from_secs(every.min(300));
    loop {
        let job = tokio::select! {
            // In order, not at random: a run is the same every time (`lading-sim`).
            biased;
            j = jobs.accept(AUDIT_TYPE, &opts) => j,
            _ = &mut stopped => return,
        };
        let mut job = match job {
            Ok(Some(j)) => j,
            Ok(None) => {
                tokio::select! {
                    // In order, not at random: a run is the same every time (`lading-sim`).
                    biased;
                    _ = tokio::time::sleep(pause) => continue,
                    _ = &mut stopped => return,
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "fixity audit: cannot accept");
                tokio::select! {
                    // In order, not at random: a run is the same every time (`lading-sim`).
                    biased;
                    _ = tokio::time::sleep(Duration::from_secs(30)) => continue,
                    _ = &mut stopped => return,
                }
            }
        };
        let r = tokio::select! {
            // In order, not at random: a run is the same every time (`lading-sim`).
            biased;
            r = audit_due(&ingest) => r,
            _ = &mut stopped => return,
        };
        let aborted = tokio::select! {
            // In order, not at random: a run is the same every time (`lading-sim`).
            biased;
            a = abort_abandoned_uploads(&ingest) => a,
            _ = &mut stopped => return,
        };
        let outcome = match r {
            Ok(a) => {
                for f in &a.findings {
                    tracing::error!(node = f.node, ark = %f.ark, version = f.version,
                        path = %f.path, "fixity: {f}");
                }
                tracing::info!(
                    checked = a.checked,
                    bad = a.findings.len(),
                    "fixity audit share done"
                );
                lading_jobs::Outcome::Success(Some(serde_json::json!({
                    "checked": a.checked, "bytes": a.bytes, "bad_or_missing": a.findings.len(),
                    "uploads_aborted": aborted,
                })))
            }
            Err(e) => lading_jobs::Outcome::Error {
                message: e,
                data: None,
            },
        };
        if let Err(e) = jobs.finish_with(&mut job, outcome).await {
            tracing::warn!(error = %e, "fixity audit: cannot finish its job");
        }
    }
}

/// Aborts, on every bucket node, the multipart uploads open longer than `[fixity]
/// abort_uploads_after_s` (see [`crate::nodes::Node::abort_abandoned_uploads`]). A node that
/// cannot be asked is logged and asked again at the next share. Returns how many were aborted.
pub async fn abort_abandoned_uploads(ingest: &Ingest) -> usize {
    let after = ingest.cfg.fixity.abort_uploads_after_s;
    if after == 0 {
        return 0;
    }
    let before = ingest
        .engine
        .clock()
        .now_ms()
        .saturating_sub(after.saturating_mul(1000));
    let mut aborted = 0;
    for node in ingest.nodes.all() {
        match node.abort_abandoned_uploads(before).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::warn!(node = %node.name(), aborted = n,
                    "fixity audit: aborted uploads open more than {after} s");
                aborted += n;
            }
            Err(e) => tracing::warn!(error = %e.what,
                "fixity audit: cannot abort abandoned uploads"),
        }
    }
    aborted
}

/// One share of the scheduled audit: the copies not checked for `[fixity] every_days`
/// (or never), longest unchecked first, read at most `bytes_per_s`.
pub async fn audit_due(ingest: &Ingest) -> Result<Audit, String> {
    let f = &ingest.cfg.fixity;
    let now = ingest.engine.clock().now_ms();
    let before = lading_core::time::format_ts(now.saturating_sub(f.every_days * 86_400_000));
    let copies = ingest
        .inventory
        .run(move |i| i.copies_due(&before, AUDIT_SHARE))
        .await
        .map_err(|e| format!("inventory: {e}"))?;
    check_list(ingest, copies, Some(f.bytes_per_s).filter(|b| *b > 0)).await
}

/// Checks `copies`, recording each outcome.
async fn check_list(
    ingest: &Ingest,
    copies: Vec<CopyCheck>,
    pace: Option<u64>,
) -> Result<Audit, String> {
    let mut audit = Audit::default();
    let mut rows = Vec::new();
    for c in copies {
        let got = read_copy(ingest, &c, pace).await?;
        audit.checked += 1;
        let (status, found) = match got {
            None => ("missing", None),
            Some(g) if g.size == c.size && g.sha256 == c.sha256 => {
                audit.bytes += g.size;
                ("ok", Some(g.sha256))
            }
            Some(g) => {
                audit.bytes += g.size;
                ("bad", Some(g.sha256))
            }
        };
        if status != "ok" {
            *FAILURES
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(c.node)
                .or_default() += 1;
            audit.findings.push(Finding {
                node: c.node,
                ark: c.ark.clone(),
                version: c.version,
                path: c.path.clone(),
                expected: c.sha256.clone(),
                found: found.clone(),
                status: status.into(),
            });
        }
        rows.push(CopyRow {
            ark: c.ark,
            version: c.version,
            path: c.path,
            node: c.node,
            status: status.into(),
            found,
        });
    }
    ingest
        .inventory
        .run(move |i| i.set_copies(&rows))
        .await
        .map_err(|e| format!("inventory: {e}"))?;
    Ok(audit)
}

/// Checks as [`check`] does, then replaces each bad or missing copy with one read from
/// another node whose copy reads right now, and checks it again. The findings say what
/// became of each copy (`repaired`, or `unrepaired: WHY`).
pub async fn repair(
    ingest: &Ingest,
    node: Option<u32>,
    ark: Option<&str>,
) -> Result<Audit, String> {
    let mut audit = check(ingest, node, ark, None).await?;
    for f in &mut audit.findings {
        let a = f.ark.clone();
        let all = ingest
            .inventory
            .run(move |i| i.copies(None, Some(&a)))
            .await
            .map_err(|e| format!("inventory: {e}"))?;
        let target = ingest.nodes.get(f.node).cloned();
        let mut outcome = "unrepaired: no other node holds a good copy".to_string();
        for other in all.iter().filter(|c| {
            c.node != f.node && c.version == f.version && c.path == f.path && c.node != 0
        }) {
            let Some(good) = read_copy(ingest, other, None).await.ok().flatten() else {
                continue;
            };
            if good.sha256 != f.expected || good.size != other.size {
                continue;
            }
            let (Some(src), Some(dst)) = (ingest.nodes.get(other.node), target.as_ref()) else {
                outcome = format!("unrepaired: node {} is not a configured node", f.node);
                break;
            };
            match crate::replicate::repair_file(ingest, src, dst, &f.ark, f.version, &f.path).await
            {
                Ok(Some(c)) if c.sha256 == f.expected => {
                    outcome = format!("repaired from node {}", other.node);
                    let row = CopyRow {
                        ark: f.ark.clone(),
                        version: f.version,
                        path: f.path.clone(),
                        node: f.node,
                        status: "ok".into(),
                        found: Some(c.sha256),
                    };
                    ingest
                        .inventory
                        .run(move |i| i.set_copies(&[row]))
                        .await
                        .map_err(|e| format!("inventory: {e}"))?;
                }
                Ok(other) => {
                    outcome = format!(
                        "unrepaired: the copy written reads {}",
                        other.map_or("nothing".into(), |c| c.sha256)
                    )
                }
                Err(e) => outcome = format!("unrepaired: {}", e.what),
            }
            break;
        }
        f.status = outcome;
    }
    Ok(audit)
}
