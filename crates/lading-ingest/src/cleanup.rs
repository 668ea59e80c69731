//! Cleanup: completed (and deleted) batches older than the retention age go, with their jobs,
//! working directories and — for a batch made from an upload — the uploaded file; so do
//! finished access requests with their assembled zips; and, whatever their age, the quota
//! slots of finished jobs and quota folders left empty. Stored objects and the inventory stay:
//! they are the point of ingest.

use crate::Ingest;
use lading_core::BatchState;
use lading_core::time::parse_ts;
use lading_engine::EngineError;

/// What one cleanup pass removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Cleaned {
    pub batches: usize,
    pub jobs: usize,
    /// Finished access requests, with their assembled zips.
    pub access: usize,
    /// Quota slots of finished jobs, and quota folders left empty (any age).
    pub quotas: usize,
    /// Submitter-index entries of batches another tool deleted.
    pub index_entries: usize,
}

/// Removes Completed and Deleted batches whose last change is older than `retention_ms` before `now_ms`.
pub async fn cleanup(
    ingest: &Ingest,
    now_ms: u64,
    retention_ms: u64,
) -> Result<Cleaned, EngineError> {
    let e = &ingest.engine;
    let mut out = Cleaned::default();
    for bid in e.batch_ids().await? {
        let info = match e.batch(&bid).await {
            Ok(i) => i,
            Err(EngineError::NoBatch(_)) => continue,
            Err(err) => return Err(err),
        };
        if !matches!(
            info.status.status,
            BatchState::Completed | BatchState::Deleted
        ) {
            continue;
        }
        let Some(at) = parse_ts(&info.status.last_modified) else {
            continue;
        };
        if at.saturating_add(retention_ms) > now_ms {
            continue;
        }
        for j in info.jobs.values().flatten() {
            let dir = ingest.cfg.work_dir().join(j);
            if dir.exists()
                && let Err(err) = std::fs::remove_dir_all(&dir)
            {
                tracing::warn!(dir = %dir.display(), error = %err, "cannot remove working directory");
            }
        }
        let upload = info.submission["payload_url"]
            .as_str()
            .and_then(|u| upload_dir(ingest, u));
        out.jobs += e.purge_batch(&bid).await?;
        out.batches += 1;
        if let Some(dir) = upload
            && let Err(err) = std::fs::remove_dir_all(&dir)
        {
            tracing::warn!(dir = %dir.display(), error = %err, "cannot remove an upload");
        }
    }
    use lading_core::AccessState;
    use lading_core::layout::AccessQueue;
    for queue in [AccessQueue::Small, AccessQueue::Large] {
        for id in e.access_ids(queue).await? {
            let info = match e.access(queue, &id).await {
                Ok(i) => i,
                Err(EngineError::NoAccess(_)) => continue,
                Err(err) => return Err(err),
            };
            let finished = matches!(
                info.status.status,
                AccessState::Completed | AccessState::Failed | AccessState::Deleted
            );
            let old = parse_ts(&info.status.last_modified)
                .is_some_and(|at| at.saturating_add(retention_ms) <= now_ms);
            if !finished || !old || info.locked {
                continue;
            }
            let zip = crate::access::zip_path(&ingest.cfg, queue, &id);
            match std::fs::remove_file(&zip) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => {
                    tracing::warn!(file = %zip.display(), error = %err, "cannot remove an access zip");
                    continue;
                }
            }
            match e.purge_access(queue, &id).await {
                Ok(()) => out.access += 1,
                Err(EngineError::Locked(_) | EngineError::Conflict(_)) => {}
                Err(err) => return Err(err),
            }
        }
    }
    out.quotas = crate::quota::sweep(e).await?;
    out.index_entries = e.prune_submitter_index().await?;
    Ok(out)
}

/// The folder an uploaded payload was saved in (`DATA_DIR/uploads/UUID/NAME`), if
/// `payload_url` is one.
pub fn upload_dir(ingest: &Ingest, payload_url: &str) -> Option<std::path::PathBuf> {
    let file = std::path::Path::new(payload_url.strip_prefix("file://")?);
    let root = std::path::absolute(ingest.cfg.data_dir.join("uploads")).ok()?;
    let dir = file.parent()?;
    (dir.parent()? == root).then(|| dir.to_path_buf())
}

/// How often the process that runs reporting looks for batches a crash left in Processing.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(600);
/// How often it removes old batches.
const CLEANUP_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// Housekeeping of the process that runs reporting, until dropped: at start and every ten
/// minutes, a batch whose jobs have all left `batch-processing` but that is still Processing
/// (its last job's worker died between the two steps) is moved to Reporting; every hour, old
/// batches are cleaned up.
pub async fn housekeeping(ingest: std::sync::Arc<Ingest>) {
    // A batch whose last job another process or tool moved is noticed within seconds, not
    // at the next sweep.
    let i = ingest.clone();
    let _finishing = AbortOnDrop(tokio::spawn(async move {
        loop {
            match i
                .engine
                .watch_finishing_batches(std::time::Duration::from_secs(30))
                .await
            {
                Ok(n) if n > 0 => {
                    tracing::info!(batches = n, "finished batches moved on to Reporting")
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "watching batches failed");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        }
    }));
    let mut last_cleanup: Option<std::time::Instant> = None;
    loop {
        match ingest.engine.sweep_reporting().await {
            Ok(n) if n > 0 => tracing::info!(batches = n, "batches moved on to Reporting"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "reporting sweep failed"),
        }
        if last_cleanup.is_none_or(|t| t.elapsed() >= CLEANUP_EVERY) {
            last_cleanup = Some(std::time::Instant::now());
            let now = ingest.engine.clock().now_ms();
            let retention_ms = ingest.cfg.retention_hours.saturating_mul(3_600_000);
            match cleanup(&ingest, now, retention_ms).await {
                Ok(c) if c.batches > 0 => {
                    tracing::info!(batches = c.batches, jobs = c.jobs, "cleanup")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cleanup failed"),
            }
        }
        tokio::time::sleep(SWEEP_EVERY).await;
    }
}

/// A task aborted with its owner (housekeeping is itself aborted at shutdown).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
