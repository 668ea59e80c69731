//! The simulated stages: a job stage whose dice decide each outcome, the intake of a batch
//! without a payload, and the mix of both with the real ingest stages.

use super::*;

/// The simulated handlers' shared dice.
pub(super) struct Dice(pub(super) Arc<Seeded>);

impl Dice {
    pub(super) fn below(&self, n: usize) -> usize {
        self.0.below(n)
    }
}

pub(super) struct SimJobStage {
    pub(super) state: JobState,
    pub(super) dice: Arc<Dice>,
    pub(super) outside: Arc<Mutex<Outside>>,
}

impl JobStage for SimJobStage {
    fn state(&self) -> JobState {
        self.state
    }
    fn success(&self) -> Event<JobState> {
        // Pending's way on is Estimating (its table successor is Held's release).
        match self.state {
            JobState::Pending => Event::To(JobState::Estimating),
            _ => Event::Success,
        }
    }
    fn run(&self, job: Arc<JobCtx>) -> BoxFuture<'static, Outcome> {
        if self.state == JobState::Pending {
            // Lading's quota: a job starts only within its submitter's limit of jobs in
            // flight, else it is parked until the waker wakes it.
            let dice = self.dice.clone();
            return Box::pin(async move {
                let submitter = (job.config().ok())
                    .and_then(|c| c.submitter.clone())
                    .unwrap_or_default();
                match lading_ingest::quota::start_within(
                    &job,
                    QUOTA_PROFILE,
                    &submitter,
                    QUOTA_LIMIT,
                )
                .await
                {
                    Ok(Outcome::Done) if probe(&job.info).is_none() => handled(&dice).await,
                    Ok(o) => o,
                    Err(e) => Outcome::from(e),
                }
            });
        }
        if self.state == JobState::Provisioning {
            // Lading's space admission: the job's bytes reserved on the working root until
            // its download ends, or a wait while others hold the room.
            let dice = self.dice.clone();
            return Box::pin(async move {
                // A payload job's own estimate; a simulated job's size from the dice.
                let needed = if has_payload(job.info.configuration.raw()) {
                    job.info.space_needed
                } else {
                    1 + dice.below(SPACE_MAX_JOB as usize) as u64
                };
                match job
                    .reserve_space(SPACE_ROOT, needed, SPACE_FREE, SPACE_KEEP)
                    .await
                {
                    Ok(None) if probe(&job.info).is_none() => handled(&dice).await,
                    Ok(None) => Outcome::Done,
                    Ok(Some(held)) => Outcome::Wait {
                        after: Duration::from_millis(500),
                        reason: format!("waiting for space: {held} bytes reserved by others"),
                    },
                    Err(e) => Outcome::from(e),
                }
            });
        }
        if self.state == LOCK_PROBE_STAGE
            && probe(&job.info).and_then(Value::as_str) == Some(LOCK_PROBE)
        {
            // The lock probe's job: its first handler says which session holds it and hangs
            // until its process is crashed under it; the next is quick.
            let outside = self.outside.clone();
            return Box::pin(async move {
                let session = job.engine.tree().session_id();
                let first = {
                    let mut o = outside.lock().unwrap_or_else(|p| p.into_inner());
                    o.lock_probe_holder.get_or_insert(session) == &session
                };
                if first {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                Outcome::Done
            });
        }
        if probe(&job.info).is_some() {
            // The wake-up probe's job: quick, and never failing.
            return Box::pin(async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Outcome::Done
            });
        }
        let dice = self.dice.clone();
        Box::pin(async move { handled(&dice).await })
    }
}

/// A simulated stage's work: a while, then done, busy (retried) or bad input (failed).
pub(super) async fn handled(dice: &Dice) -> Outcome {
    let (took, roll) = (dice.below(300), dice.below(1000));
    tokio::time::sleep(Duration::from_millis(took as u64)).await;
    match roll {
        0..=59 => Outcome::Transient("the simulated service is busy".into()),
        60..=71 => Outcome::Fatal("the simulated input is bad".into()),
        _ => Outcome::Done,
    }
}

/// Intake: makes the batch's jobs (those a previous attempt did not make).
pub(super) struct SimIntake;

impl BatchStage for SimIntake {
    fn state(&self) -> BatchState {
        BatchState::Pending
    }
    fn success(&self) -> Event<BatchState> {
        Event::To(BatchState::Processing)
    }
    fn run(&self, b: Arc<BatchCtx>) -> BoxFuture<'static, Outcome> {
        Box::pin(async move {
            let sub = b.info.submission.raw();
            let want = sub.get("sim_jobs").and_then(Value::as_u64).unwrap_or(1);
            let mut have = std::collections::BTreeSet::new();
            for j in b.info.jobs.values().flatten() {
                match b.engine.job(j).await {
                    Ok(info) => {
                        let cfg = info.configuration.typed().ok();
                        if let Some(i) = cfg.and_then(|c| c.extra.get("index")?.as_u64()) {
                            have.insert(i);
                        }
                    }
                    Err(e) => return Outcome::from(e),
                }
            }
            for i in (0..want).filter(|i| !have.contains(i)) {
                let mut configuration = lading_core::layout::JobConfiguration {
                    submitter: b.submission().ok().and_then(|s| s.submitter.clone()),
                    ..Default::default()
                };
                configuration.extra.insert("index".into(), json!(i));
                for k in ["profile", "sim_probe"] {
                    if let Some(v) = sub.get(k) {
                        configuration.extra.insert(k.into(), v.clone());
                    }
                }
                let spec = JobSpec {
                    configuration,
                    ..Default::default()
                };
                if let Err(e) = b.create_job(spec).await {
                    return Outcome::from(e);
                }
            }
            Outcome::Done
        })
    }
}

/// Whether a job is the wake-up probe's.
fn probe(job: &lading_engine::JobInfo) -> Option<&Value> {
    job.configuration.raw().get("sim_probe")
}

/// Whether a job is of a payload batch: Lading's own handlers fetch, process, store and
/// record it.
pub(super) fn has_payload(configuration: &Value) -> bool {
    configuration.get("payload_url").is_some()
}

/// A job stage run by Lading's own handler for the jobs of payload batches, and by the
/// simulated one for the others.
pub(super) struct Mixed {
    pub(super) real: Arc<dyn JobStage>,
    pub(super) sim: SimJobStage,
}

impl JobStage for Mixed {
    fn state(&self) -> JobState {
        self.sim.state
    }
    fn max_attempts(&self, job: &lading_engine::JobInfo) -> Option<u32> {
        self.real.max_attempts(job)
    }
    fn run(&self, job: Arc<JobCtx>) -> BoxFuture<'static, Outcome> {
        if has_payload(job.info.configuration.raw()) {
            self.real.run(job)
        } else {
            self.sim.run(job)
        }
    }
}

/// Intake: Lading's own for a batch with a payload, the simulated one for the others.
pub(super) struct MixedIntake(pub(super) Arc<dyn BatchStage>);

impl BatchStage for MixedIntake {
    fn state(&self) -> BatchState {
        BatchState::Pending
    }
    fn success(&self) -> Event<BatchState> {
        Event::To(BatchState::Processing)
    }
    fn run(&self, b: Arc<BatchCtx>) -> BoxFuture<'static, Outcome> {
        if has_payload(b.info.submission.raw()) {
            self.0.run(b)
        } else {
            SimIntake.run(b)
        }
    }
    /// Lading's own report of a batch that failed at intake, whichever intake it was.
    fn on_failure(
        &self,
        b: Arc<BatchCtx>,
        reason: String,
    ) -> BoxFuture<'static, Option<(lading_core::layout::StatusReport, Vec<Effect>)>> {
        self.0.on_failure(b, reason)
    }
}

/// What a simulated process runs for each stage (see [`lading_ingest::StageWrap`]): the
/// real Notify (the job's callback) and Reporting and UpdateReporting (the numbered report
/// and its mail); Lading's own file stages and intake for payload batches, the simulated
/// ones for the others; the simulated Pending (the quota) and Provisioning (space
/// admission), whose outcomes the dice add to.
pub(super) struct SimStages {
    pub(super) dice: Arc<Dice>,
    pub(super) outside: Arc<Mutex<Outside>>,
}

impl lading_ingest::StageWrap for SimStages {
    fn job(&self, real: Arc<dyn JobStage>) -> Arc<dyn JobStage> {
        let sim = SimJobStage {
            state: real.state(),
            dice: self.dice.clone(),
            outside: self.outside.clone(),
        };
        match real.state() {
            JobState::Notify => real,
            JobState::Pending | JobState::Provisioning => Arc::new(sim),
            _ => Arc::new(Mixed { real, sim }),
        }
    }

    fn batch(&self, real: Arc<dyn BatchStage>) -> Arc<dyn BatchStage> {
        match real.state() {
            BatchState::Pending => Arc::new(MixedIntake(real)),
            _ => real,
        }
    }
}
