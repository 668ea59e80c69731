//! The batch stages' loop: a batch taken with its lease, its stage's handler run (retried,
//! waiting, or held while a dependency is down), and its outcome recorded.

use super::*;

impl BatchLoop {
    /// Fails a batch. A Pending batch has no Failed move of its own: it goes through
    /// Processing, keeping its lock, so nobody reports the empty batch in between.
    ///
    /// A Pending batch that already has jobs (an earlier attempt made them, then stopped) is
    /// not failed: those jobs are objects on their way, and the batch goes on to Processing
    /// with them, its message naming why intake stopped, and reports them when they end.
    async fn fail(&self, mut lease: BatchLease, reason: String) -> Result<(), EngineError> {
        if lease.status.status == BatchState::Pending {
            let made: usize = match self.engine.batch(&lease.batch).await {
                Ok(info) => info.jobs.values().map(Vec::len).sum(),
                // The batch is given back, still Pending, for another intake attempt: dropping
                // the lease here kept its lock for as long as this process lived, and the
                // batch stayed Pending (found by `lading-sim`).
                Err(e) => {
                    let _ = self.engine.release_batch_lease(lease).await;
                    return Err(e);
                }
            };
            if made > 0 {
                lease.report = None;
                lease.effects.clear();
                let msg = format!(
                    "intake stopped after making {made} jobs: {reason}; the batch goes on with them"
                );
                return self
                    .engine
                    .batch_transition(lease, Event::To(BatchState::Processing), Some(msg))
                    .await
                    .map(|_| ());
            }
        }
        let lease = if lease.status.status == BatchState::Pending {
            // The failure's report and effects belong to the move to Failed, not to this
            // step on the way (a crash between the two leaves a batch with no job in
            // Processing, which is reported as such).
            let (report, effects) = (lease.report.take(), std::mem::take(&mut lease.effects));
            let mut on = self
                .engine
                .batch_advance(lease, Event::To(BatchState::Processing), None)
                .await?;
            on.report = report;
            on.effects = effects;
            on
        } else {
            lease
        };
        self.engine
            .batch_transition(lease, Event::Fail, Some(reason))
            .await
            .map(|_| ())
    }
}

pub(crate) struct BatchLoop {
    pub(crate) engine: Arc<Engine>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) stage: Arc<dyn BatchStage>,
    pub(crate) cfg: StageConfig,
}

impl Acquire for BatchLoop {
    type Lease = BatchLease;
    const WHAT: &'static str = "batch";
    fn state_name(&self) -> &str {
        self.stage.state().name()
    }
    async fn wait(&self, stop: Shutdown) -> Result<Option<BatchLease>, String> {
        self.engine
            .wait_batch_or(self.stage.state(), IDLE_WAIT, stop.into_stopped())
            .await
            .map_err(|e| e.to_string())
    }
    async fn handle(&self, lease: BatchLease, shutdown: &mut Shutdown) -> Option<BatchLease> {
        use tracing::Instrument;
        let span =
            tracing::info_span!("batch", batch = %lease.batch, stage = lease.status.status.name());
        self.handle_batch(lease, shutdown).instrument(span).await;
        None
    }
    async fn release(&self, lease: BatchLease) {
        let _ = self.engine.release_batch_lease(lease).await;
    }
}

impl BatchLoop {
    /// A batch has no stored retry time: transient errors are retried here, holding the
    /// batch, with the same backoff; the lock keeps other workers off meanwhile.
    async fn handle_batch(&self, lease: BatchLease, shutdown: &mut Shutdown) {
        let started = Instant::now();
        let bid = lease.batch.clone();
        let state = lease.status.status;
        let now = self.engine.clock().now_ms();
        let _running = self.stats.running("batch", bid.as_str(), state.name(), now);
        let info = match self.engine.batch(&bid).await {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(batch = %bid, error = %e, "cannot read the batch");
                let _ = self.engine.release_batch_lease(lease).await;
                return;
            }
        };
        let ctx_lease = RwLock::new(lease);
        let mut ctx = Arc::new(BatchCtx {
            engine: self.engine.clone(),
            batch_id: bid.clone(),
            info,
            attempt: 1,
            lease: ctx_lease,
        });
        let outcome = loop {
            let o = supervise(self.stage.run(ctx.clone()), self.cfg.timeout, shutdown).await;
            match o {
                Some(Outcome::Transient(reason)) if ctx.attempt < self.cfg.max_attempts => {
                    let delay = self.cfg.backoff(ctx.attempt, self.engine.random().unit());
                    tracing::warn!(batch = %bid, attempt = ctx.attempt, %reason,
                        "transient error; retrying in {:.1} s", delay.as_secs_f64());
                    tokio::select! {
                        // In order, not at random: a run is the same every time (`lading-sim`).
                        biased;
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.aborted() => break None,
                    }
                    let mut lease = ctx.lease.write().await.clone();
                    lease.effects.clear();
                    lease.report = None;
                    ctx = Arc::new(BatchCtx {
                        engine: self.engine.clone(),
                        batch_id: bid.clone(),
                        info: ctx.info.clone(),
                        attempt: ctx.attempt + 1,
                        lease: RwLock::new(lease),
                    });
                }
                Some(Outcome::Wait { after, reason }) => {
                    // Not ready yet: look again after `after`, holding the batch (its lock
                    // keeps other workers off; a move by an admin meanwhile takes the lease).
                    tracing::info!(batch = %bid, %reason, "waiting {:.1} s", after.as_secs_f64());
                    tokio::select! {
                        // In order, not at random: a run is the same every time (`lading-sim`).
                        biased;
                        _ = tokio::time::sleep(after) => {}
                        _ = shutdown.aborted() => break None,
                    }
                }
                Some(Outcome::Unavailable { dependency, cause }) => {
                    // Held while the dependency is down, using no attempt; given up (as a
                    // failure naming it) after `max_wait`.
                    let now = self.engine.clock().now_ms();
                    let (since, start) = self.engine.deps().down(&dependency, &cause, now);
                    if start {
                        deps::spawn_prober(self.engine.clone(), dependency.clone());
                    }
                    let settings = self.engine.deps().settings();
                    if settings.waited_too_long(&dependency, since, now) {
                        forget_effects(&ctx).await;
                        break Some(Outcome::Fatal(deps::gave_up(
                            &dependency,
                            &cause,
                            since,
                            &settings,
                        )));
                    }
                    tracing::info!(batch = %bid, dependency = %dependency.label(), %cause,
                        "waiting for a dependency");
                    tokio::select! {
                        // In order, not at random: a run is the same every time (`lading-sim`).
                        biased;
                        _ = tokio::time::sleep(settings.probe_max) => {}
                        _ = shutdown.aborted() => break None,
                    }
                }
                Some(Outcome::Transient(reason)) => {
                    forget_effects(&ctx).await;
                    break Some(Outcome::Fatal(format!(
                        "{reason} (gave up after {} attempts)",
                        ctx.attempt
                    )));
                }
                other => break other,
            }
        };
        let mut lease = ctx.lease.write().await.clone();
        if let Some(Outcome::Fatal(reason) | Outcome::Transient(reason)) = &outcome
            && lease.report.is_none()
            && let Some((report, effects)) =
                self.stage.on_failure(ctx.clone(), reason.clone()).await
        {
            lease.report = Some(report);
            lease.effects = effects;
        }
        let r = match &outcome {
            None => self.engine.release_batch_lease(lease).await,
            Some(Outcome::Done) => self
                .engine
                .batch_transition(lease, self.stage.success(), None)
                .await
                .map(|_| ()),
            Some(Outcome::Wait { .. } | Outcome::Unavailable { .. }) => {
                self.engine.release_batch_lease(lease).await
            }
            Some(Outcome::Fatal(reason)) | Some(Outcome::Transient(reason)) => {
                self.fail(lease, reason.clone()).await
            }
        };
        if let Some(o) = &outcome {
            let name = if state == BatchState::Pending {
                "Intake"
            } else {
                state.name()
            };
            let now = self.engine.clock().now_ms();
            self.stats.record(name, o, started.elapsed(), now);
        }
        log_batch_outcome(&bid, state, self.stage.success(), r, &outcome);
    }
}

/// The effects and report a failed attempt at a batch stage recorded in its lease,
/// forgotten: what goes with the batch's failure is its stage's own (`on_failure`).
async fn forget_effects(ctx: &BatchCtx) {
    let mut lease = ctx.lease.write().await;
    lease.effects.clear();
    lease.report = None;
}

/// Logs what became of batch `bid` in `state`: moved on, failed, or its outcome not recorded.
fn log_batch_outcome(
    bid: &BatchId,
    state: BatchState,
    success: Event<BatchState>,
    r: Result<(), EngineError>,
    outcome: &Option<Outcome>,
) {
    match (r, outcome) {
        (Err(e), _) => {
            tracing::warn!(batch = %bid, error = %e, "could not record the batch outcome")
        }
        (Ok(()), Some(Outcome::Done)) => {
            let to = state.resolve(success).map(|s| s.name());
            tracing::info!(batch = %bid, from = state.name(), to = to.unwrap_or("?"),
                "batch moved on")
        }
        (Ok(()), Some(Outcome::Fatal(reason) | Outcome::Transient(reason))) => {
            tracing::info!(batch = %bid, state = state.name(), %reason, "batch failed")
        }
        (Ok(()), _) => {}
    }
}
