//! Cleanup: completed (and deleted) batches older than the retention age go, with their jobs and working
//! directories. Stored objects and the inventory stay: they are the point of ingest.

use crate::Ingest;
use lading_core::BatchState;
use lading_core::time::parse_ts;
use lading_engine::EngineError;

/// What one cleanup pass removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Cleaned {
    pub batches: usize,
    pub jobs: usize,
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
        out.jobs += e.purge_batch(&bid).await?;
        out.batches += 1;
    }
    Ok(out)
}
