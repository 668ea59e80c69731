//! Filling a fresh store for a benchmark: a batch of Pending jobs, made concurrently so their
//! commits group.

use lading_core::layout::BatchId;
use lading_core::{BatchState, Event};
use lading_engine::{Engine, JobSpec};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Creates a batch with `n` Pending jobs, concurrently so commits group; returns its id.
pub(crate) async fn fill(
    engine: &Arc<Engine>,
    submission: serde_json::Map<String, serde_json::Value>,
    n: usize,
) -> crate::Result<BatchId> {
    fill_with(engine, submission, n, |_| JobSpec::default()).await
}

/// [`fill`], the `i`th job made by `spec(i)`.
pub(crate) async fn fill_with(
    engine: &Arc<Engine>,
    submission: serde_json::Map<String, serde_json::Value>,
    n: usize,
    spec: fn(usize) -> JobSpec,
) -> crate::Result<BatchId> {
    let bid = engine.create_batch(submission.try_into()?).await?;
    let lease = loop {
        match engine.acquire_batch(BatchState::Pending).await? {
            Some(l) if l.batch == bid => break l,
            Some(other) => engine.release_batch_lease(other).await?,
            None => {
                crate::error::bail!(
                    "batch {bid} could not be acquired (is the ingest queue paused?)"
                )
            }
        }
    };
    let next = Arc::new(AtomicUsize::new(0));
    let mut creators = Vec::new();
    for _ in 0..64.min(n.max(1)) {
        let (e, l, next) = (engine.clone(), lease.clone(), next.clone());
        creators.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    break;
                }
                e.create_job(&l, spec(i)).await?;
            }
            Ok::<_, crate::BenchError>(())
        }));
    }
    for c in creators {
        c.await??;
    }
    engine
        .batch_transition(lease, Event::To(BatchState::Processing), None)
        .await?;
    Ok(bid)
}
