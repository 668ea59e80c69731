//! A process's announcement (SPEC §12): its record under `/processes`, written at start, again
//! whenever what it runs changes (at most once a second) and at least every
//! [`HEARTBEAT`], and a last time when it stops.

use crate::{Shutdown, Stats};
use lading_core::Tree;
use lading_core::time::SharedClock;
use lading_engine::processes::{self, ProcessRecord};
use std::sync::Arc;
use std::time::Duration;

/// The longest a live process's record goes unwritten.
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// The longest the last record (at a stop) is waited for.
pub const LAST_WORD: Duration = Duration::from_millis(500);
/// The shortest time between two writes: a busy process writes once a second, not per job.
const MIN_GAP: Duration = Duration::from_secs(1);

/// Announces this process as `record` (with what `stats` says it runs) until shut down, then
/// says it stopped. Forgets the records of processes gone for a day first.
pub async fn announce(
    tree: Arc<dyn Tree>,
    clock: SharedClock,
    mut record: ProcessRecord,
    stats: Arc<Stats>,
    mut sd: Shutdown,
) {
    match processes::forget_gone(tree.as_ref(), clock.now_ms()).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(forgotten = n, "records of processes gone for a day removed"),
        Err(e) => tracing::debug!(error = %e, "cannot forget gone processes"),
    }
    loop {
        record.heard_at_ms = clock.now_ms();
        record.running = stats.running_now();
        if let Err(e) = processes::announce(tree.as_ref(), &record).await {
            tracing::debug!(error = %e, "cannot announce this process");
        }
        tokio::select! {
            biased;
            _ = sd.stopped() => break,
            _ = tokio::time::sleep(MIN_GAP) => {}
        }
        tokio::select! {
            biased;
            _ = sd.stopped() => break,
            _ = stats.running_changed() => {}
            _ = tokio::time::sleep(HEARTBEAT - MIN_GAP) => {}
        }
    }
    let now = clock.now_ms();
    record.heard_at_ms = now;
    record.running = stats.running_now();
    record.stopped_at_ms = Some(now);
    // Bounded: a store that is down must not hold the stop up (its session's end says the
    // same, later).
    match tokio::time::timeout(LAST_WORD, processes::stopped(tree.as_ref(), &record)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "cannot say this process stopped"),
        Err(_) => tracing::debug!("the store did not take this process's last record in time"),
    }
}
