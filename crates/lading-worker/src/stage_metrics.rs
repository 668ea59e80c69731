//! The flusher of a process's stage figures into the store's stage metrics (SPEC §12; see
//! `lading_engine::stage_metrics`): every [`FLUSH`] and a last time at its stop, with the
//! queue depth of each job stage it runs sampled beside them.

use crate::{Shutdown, Stats};
use lading_core::JobState;
use lading_core::layout::job_state_folder;
use lading_engine::Engine;
use lading_engine::stage_metrics::{self, MinuteCounts};
use std::sync::Arc;
use std::time::Duration;

/// How often a process adds what it counted to the store.
pub const FLUSH: Duration = Duration::from_secs(5);

/// Flushes `stats`' per-minute counts every [`FLUSH`] until shut down, then once more;
/// samples the depth of `stages` each time.
pub async fn flush_every(
    engine: Arc<Engine>,
    stats: Arc<Stats>,
    stages: Vec<JobState>,
    sd: Shutdown,
) {
    // Every FLUSH (the shared runtime's scheduled task), then once more at the stop.
    let (e, st, sts) = (engine.clone(), stats.clone(), Arc::new(stages.clone()));
    crate::every("stage metrics", FLUSH, sd, move || {
        let (e, st, sts) = (e.clone(), st.clone(), sts.clone());
        async move { flush(&e, &st, &sts).await }
    })
    .await;
    // Bounded: a store that is down must not hold the stop up.
    let last = flush(&engine, &stats, &stages);
    if tokio::time::timeout(crate::announce::LAST_WORD, last)
        .await
        .is_err()
    {
        tracing::debug!("the store did not take the last stage figures in time");
    }
}

/// Adds what `stats` counted (and the depth of `stages` now) to the store; what the store
/// did not take is kept for the next time.
pub async fn flush(engine: &Engine, stats: &Stats, stages: &[JobState]) {
    let now = engine.clock().now_ms();
    let mut all = stats.take_minutes();
    for st in stages {
        match engine.tree().count_children(&job_state_folder(*st)).await {
            Ok(n) => {
                let depth = MinuteCounts {
                    depth: Some(n),
                    ..Default::default()
                };
                let of_stage = all.entry(st.name().to_string()).or_default();
                of_stage
                    .entry(now - now % 60_000)
                    .or_default()
                    .merge(&depth);
            }
            Err(e) => tracing::debug!(stage = st.name(), error = %e, "cannot count a stage's jobs"),
        }
    }
    for (stage, counts) in all {
        if let Err(u) = stage_metrics::add(engine.tree().as_ref(), &stage, counts, now).await {
            tracing::debug!(stage, error = %u.error, "cannot add to the stage metrics; kept for the next time");
            stats.put_back_minutes(&stage, u.counts);
        }
    }
}
