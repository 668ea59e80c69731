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
    let written = Arc::new(Written::default());
    let (e, st, sts, w) = (
        engine.clone(),
        stats.clone(),
        Arc::new(stages.clone()),
        written.clone(),
    );
    crate::every("stage metrics", FLUSH, sd, move || {
        let (e, st, sts, w) = (e.clone(), st.clone(), sts.clone(), w.clone());
        async move { flush(&e, &st, &sts, &w).await }
    })
    .await;
    // Bounded: a store that is down must not hold the stop up.
    let last = flush(&engine, &stats, &stages, &written);
    if tokio::time::timeout(crate::announce::LAST_WORD, last)
        .await
        .is_err()
    {
        tracing::debug!("the store did not take the last stage figures in time");
    }
}

/// The largest depth of each stage this flusher has had the store take, and for which
/// minute (start, ms): a depth no larger in the same minute adds nothing (the store keeps a
/// minute's largest), so an idle stage is written once a minute, not at every flush.
#[derive(Default)]
pub struct Written(std::sync::Mutex<std::collections::BTreeMap<String, (u64, u64)>>);

impl Written {
    fn covers(&self, stage: &str, minute: u64, depth: u64) -> bool {
        let w = self.0.lock().unwrap_or_else(|p| p.into_inner());
        w.get(stage)
            .is_some_and(|&(m, d)| m == minute && d >= depth)
    }

    /// The store took `depth` for `minute` of `stage`.
    fn took(&self, stage: &str, (minute, depth): (u64, u64)) {
        let mut w = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let e = w.entry(stage.to_string()).or_insert((minute, depth));
        *e = match *e {
            (m, d) if m == minute => (m, d.max(depth)),
            (m, d) if m > minute => (m, d),
            _ => (minute, depth),
        };
    }
}

/// Adds what `stats` counted (and the depth of `stages` now, unless `written` says the store
/// has as much for this minute) to the store; what the store did not take is kept for the
/// next time. Nothing is written for a stage with nothing new.
pub async fn flush(engine: &Engine, stats: &Stats, stages: &[JobState], written: &Written) {
    let now = engine.clock().now_ms();
    let mut all = stats.take_minutes();
    for st in stages {
        match engine.tree().count_children(&job_state_folder(*st)).await {
            Ok(n) if written.covers(st.name(), now - now % 60_000, n) => {}
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
        let depth = counts
            .last_key_value()
            .and_then(|(&minute, c)| Some((minute, c.depth?)));
        match stage_metrics::add(engine.tree().as_ref(), &stage, counts, now).await {
            Ok(()) => {
                if let Some(d) = depth {
                    written.took(&stage, d)
                }
            }
            Err(u) => {
                tracing::debug!(stage, error = %u.error, "cannot add to the stage metrics; kept for the next time");
                stats.put_back_minutes(&stage, u.counts);
            }
        }
    }
}
