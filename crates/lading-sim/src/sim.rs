//! One simulated deployment, run from a seed on simulated time.
//!
//! Several processes share the simulated tree, each a real [`Engine`] on its own session
//! running, under one `Supervisor`, the real stage loops ([`Worker`]), Lading's outbox
//! deliverer, Lading's housekeeping (the finishing watch and sweep), Lading's quota waker,
//! and generic jobs (`lading-jobs`: a processor and the real activity monitor, which also
//! ticks schedules and applies retention; the type has a rate limit). A third of the batches
//! carry a payload (`payload.rs`: a batch manifest, a single-file batch manifest or a
//! container batch manifest, served over HTTP/1.1 by a simulated payload server or read
//! from files): Lading's own Intake, Estimating, Downloading, Processing (with the profile's
//! command, run by the simulated scanner, `command.rs`), Storing and Recording take them
//! into a shared storage root and inventory. The other batches' jobs go through simulated
//! handlers for those stages, each taking a while and succeeding, failing for a while or
//! failing for good, as the seed says. Pending is Lading's quota; Provisioning reserves space
//! through Lading's admission; Notify (the job's callback) and Reporting and UpdateReporting
//! (the numbered report and its mail) are Lading's own stages for every batch. Mails go
//! through Lading's own SMTP client to a simulated relay (`smtp.rs`) and callbacks, as
//! Lading forms them for the wire, over HTTP/1.1 to a simulated receiver (`callback.rs`);
//! both delay them, lose them, and lose their answers (so they are sent again with the same
//! key), and read back what came over the wire. Cleanup and the working-folder sweep run every 10 s or every
//! minute; in a seed of four ended batches are kept 0 h, so they are purged (checked at each
//! purge's commit) while the workload goes on. An event stream's client follows every
//! transition through Lading's follower (the tree's change feed, which has gaps) and its HTTP
//! server (`GET /api/v1/events` on connections in memory, `http.rs`), goes away now and then
//! and resumes from its last id; it must have been sent every transition the statuses show. The workload submits batches and, between them, crashes and restarts
//! processes, expires and pauses their sessions, holds and releases jobs, requeues failed
//! ones (one at a time and by batch), deletes jobs, pauses the ingest queue, and puts
//! depositors' late fixes in place (a missing file, a corrected manifest). Then the faults
//! stop, and every batch must end, every mail and callback be delivered and every generic job
//! be finished or failed, within a bounded simulated time, and the schedule must tick again;
//! no generic job may be finished successfully by two acceptances; and every completed
//! payload job must have stored and recorded exactly its payload's files, once.
//!
//! Half of the payload batches (those of odd number) are stored on two storage nodes: S3
//! buckets in memory (`lading_ingest::bucket::Memory`), shared by the processes, whose
//! requests are refused, come late, or take effect with their answer lost while the faults
//! last (each refusal and loss is in the trace). Lading's bucket Storing writes them, the
//! outbox's `replicate` deliveries copy them to the replica, and the fixity checker reads
//! every recorded copy now and then under the faults (it must never report a good copy) and
//! at the end, when copies made to go bad must be exactly what it finds and repairs; each
//! process runs the scheduled fixity audit (`lading_ingest::fixity::run_audit`, a generic
//! job every 10 s here), and no copy may be recorded bad or missing before any goes bad. Each
//! process runs both access queues too: zips of stored versions asked for now and then, each
//! of which must end, and hold the version's recorded files when it completes.

use crate::check::{QUOTA_LIMIT, QUOTA_PROFILE, SPACE_FREE, SPACE_KEEP, SPACE_MAX_JOB, SPACE_ROOT};
use crate::payload::{Answers, PayloadServer, Payloads, Place, Served};
use crate::tree::{EPOCH_MS, Faults, SimTree, World};
use lading_core::layout::{AccessQueue, BatchId, JobId};
use lading_core::random::{Random, Seeded};
use lading_core::time::Clock;
use lading_core::{BatchState, BoxFuture, Event, JobState, Tree};
use lading_engine::{Effect, Engine, JobSpec};
use lading_worker::{
    BatchCtx, BatchStage, JobCtx, JobStage, Outcome, Phase, Shutdown, ShutdownHandle, StageConfig,
    Supervisor, Worker,
};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the simulated deployment is shaped.
#[derive(Debug, Clone)]
pub struct Options {
    pub nodes: usize,
    pub batches: usize,
    pub faults: bool,
    pub trace: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 3,
            batches: 20,
            faults: true,
            trace: false,
        }
    }
}

/// What one seed's run found.
#[derive(Debug)]
pub struct Run {
    pub seed: u64,
    pub sim_ms: u64,
    pub steps: u64,
    pub jobs: usize,
    /// Jobs of payload batches that completed, each checked against its stored version.
    pub stored: usize,
    /// Of those, the objects that came in a zip, a tar and a tar.gz container, found as
    /// their containers held them.
    pub unpacked: [usize; 3],
    pub violations: Vec<String>,
    pub tail: Vec<String>,
    pub trace_hash: u64,
    pub full: Option<Vec<String>>,
}

/// A session lapses this long after its process stops answering.
const SESSION_TIMEOUT_MS: u64 = 3_000;
/// Once faults stop, every batch ends and every mail is delivered within this.
const LIVENESS_MS: u64 = 60_000;

/// The waiters' safety sweep in the simulated processes: past the liveness bound and the
/// whole run, so a missed wake-up leaves work waiting and is reported, where the production
/// sweep (10 s) would cover it up.
const SWEEP_MS: u64 = 3_600_000;
/// How long an idle deployment may take a one-job batch through every stage and its report
/// (each stage's waiting worker woken by the tree; a missed wake-up costs a periodic look,
/// 10 s).
const PROBE_MS: u64 = 5_000;

/// The engine's clock on tokio's (paused, auto-advancing) time.
struct SimClock {
    start: tokio::time::Instant,
}

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        EPOCH_MS + self.start.elapsed().as_millis() as u64
    }
}

/// The inventory's clock: two days behind the processes'. Every copy's last check (made
/// when it was recorded, or by the last audit) then looks two days old to the scheduled
/// fixity audit, which takes copies unchecked for a day: each of its ticks reads every
/// recorded copy, under the faults.
struct Behind(lading_core::time::SharedClock);

impl Clock for Behind {
    fn now_ms(&self) -> u64 {
        self.0.now_ms().saturating_sub(2 * 86_400_000)
    }
}

/// What left the simulated processes: each delivered mail and callback, by key.
#[derive(Default)]
struct Outside {
    /// key → (content, deliveries)
    mails: BTreeMap<String, (Value, u32)>,
    callbacks: BTreeMap<String, (Value, u32)>,
    /// What the outside world found wrong in what Lading handed it: a mail or callback it
    /// could not read, a processing command run on the wrong thing.
    wrong: Vec<String>,
    /// Generic job → how many acceptances finished it successfully (a job is added once, so
    /// more than one is a processor that was fenced and committed anyway).
    generic_done: BTreeMap<String, u32>,
}

/// The generic-jobs type the simulated processors serve, and how many jobs it gets.
const GENERIC_TYPE: &str = "sim";
const GENERIC_JOBS: usize = 10;
/// Its rate limit (accepts per second) and how long its ended jobs are kept.
const GENERIC_RATE: u32 = 1;
const GENERIC_KEEP_S: u64 = 20;
/// Its schedule: a job every few seconds, added by whichever monitor gets there first.
const SCHEDULE: &str = "tick";
const SCHEDULE_EVERY_S: u64 = 4;

/// The simulated handlers' shared dice.
struct Dice(Arc<Seeded>);

impl Dice {
    fn below(&self, n: usize) -> usize {
        self.0.below(n)
    }
}

struct SimJobStage {
    state: JobState,
    dice: Arc<Dice>,
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
                let submitter = job
                    .info
                    .configuration
                    .get("submitter")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                match lading_ingest::quota::start_within(
                    &job,
                    QUOTA_PROFILE,
                    &submitter,
                    QUOTA_LIMIT,
                )
                .await
                {
                    Ok(Outcome::Done) if job.info.configuration.get("sim_probe").is_none() => {
                        handled(&dice).await
                    }
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
                let needed = if has_payload(&job.info.configuration) {
                    job.info.space_needed
                } else {
                    1 + dice.below(SPACE_MAX_JOB as usize) as u64
                };
                match job
                    .reserve_space(SPACE_ROOT, needed, SPACE_FREE, SPACE_KEEP)
                    .await
                {
                    Ok(None) if job.info.configuration.get("sim_probe").is_none() => {
                        handled(&dice).await
                    }
                    Ok(None) => Outcome::Done,
                    Ok(Some(held)) => Outcome::Wait {
                        after: Duration::from_millis(500),
                        reason: format!("waiting for space: {held} bytes reserved by others"),
                    },
                    Err(e) => Outcome::from(e),
                }
            });
        }
        if job.info.configuration.get("sim_probe").is_some() {
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
async fn handled(dice: &Dice) -> Outcome {
    let (took, roll) = (dice.below(300), dice.below(1000));
    tokio::time::sleep(Duration::from_millis(took as u64)).await;
    match roll {
        0..=59 => Outcome::Transient("the simulated service is busy".into()),
        60..=71 => Outcome::Fatal("the simulated input is bad".into()),
        _ => Outcome::Done,
    }
}

/// Intake: makes the batch's jobs (those a previous attempt did not make).
struct SimIntake;

impl BatchStage for SimIntake {
    fn state(&self) -> BatchState {
        BatchState::Pending
    }
    fn success(&self) -> Event<BatchState> {
        Event::To(BatchState::Processing)
    }
    fn run(&self, b: Arc<BatchCtx>) -> BoxFuture<'static, Outcome> {
        Box::pin(async move {
            let want = b
                .info
                .submission
                .get("sim_jobs")
                .and_then(Value::as_u64)
                .unwrap_or(1);
            let mut have = std::collections::BTreeSet::new();
            for j in b.info.jobs.values().flatten() {
                match b.engine.job(j).await {
                    Ok(info) => {
                        if let Some(i) = info.configuration.get("index").and_then(Value::as_u64) {
                            have.insert(i);
                        }
                    }
                    Err(e) => return Outcome::from(e),
                }
            }
            for i in (0..want).filter(|i| !have.contains(i)) {
                let mut configuration = Map::new();
                configuration.insert("index".into(), json!(i));
                for k in ["submitter", "profile"] {
                    if let Some(v) = b.info.submission.get(k) {
                        configuration.insert(k.into(), v.clone());
                    }
                }
                if let Some(p) = b.info.submission.get("sim_probe") {
                    configuration.insert("sim_probe".into(), p.clone());
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

/// Whether a job is of a payload batch: Lading's own handlers fetch, process, store and
/// record it.
fn has_payload(configuration: &Value) -> bool {
    configuration.get("payload_url").is_some()
}

/// A job stage run by Lading's own handler for the jobs of payload batches, and by the
/// simulated one for the others.
struct Mixed<S> {
    real: S,
    sim: SimJobStage,
}

impl<S: JobStage> Mixed<S> {
    fn stage(real: S, sim: SimJobStage) -> Arc<dyn JobStage> {
        Arc::new(Mixed { real, sim })
    }
}

impl<S: JobStage> JobStage for Mixed<S> {
    fn state(&self) -> JobState {
        self.sim.state
    }
    fn max_attempts(&self, job: &lading_engine::JobInfo) -> Option<u32> {
        self.real.max_attempts(job)
    }
    fn run(&self, job: Arc<JobCtx>) -> BoxFuture<'static, Outcome> {
        if has_payload(&job.info.configuration) {
            self.real.run(job)
        } else {
            self.sim.run(job)
        }
    }
}

/// Intake: Lading's own for a batch with a payload, the simulated one for the others.
struct MixedIntake(lading_ingest::intake::Intake);

impl BatchStage for MixedIntake {
    fn state(&self) -> BatchState {
        BatchState::Pending
    }
    fn success(&self) -> Event<BatchState> {
        Event::To(BatchState::Processing)
    }
    fn run(&self, b: Arc<BatchCtx>) -> BoxFuture<'static, Outcome> {
        if has_payload(&b.info.submission) {
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

/// One simulated process.
struct Proc {
    tree: Arc<SimTree>,
    stop: ShutdownHandle,
    task: tokio::task::JoinHandle<()>,
}

struct Sim {
    world: Arc<World>,
    clock: Arc<SimClock>,
    dice: Arc<Dice>,
    outside: Arc<Mutex<Outside>>,
    work: tempfile::TempDir,
    /// What the depositors' payload server serves.
    served: Served,
    answers: Arc<Mutex<Answers>>,
    /// The storage nodes of profile [`NODES_PROFILE`]: S3 buckets in memory, shared by
    /// every process (as a server is), failing requests while the faults last.
    buckets: Buckets,
    /// How long ended batches are kept: in a seed of four, none (cleanup removes a batch
    /// and its working folders at its first pass after the batch ended).
    retention_hours: u64,
    seed: u64,
    starts: u64,
}

/// Storage node 1 (the primary) and 2 (its replica), and whether their faults are on.
#[derive(Clone)]
struct Buckets {
    nodes: [Arc<lading_ingest::bucket::Memory>; 2],
    faults: Arc<std::sync::atomic::AtomicBool>,
    /// Until when (simulated ms) each node is down: every request refused, as a stopped
    /// server refuses connections.
    outage: Arc<[std::sync::atomic::AtomicU64; 2]>,
}

impl Buckets {
    /// Requests fail (before or after they take effect) and come late, from the seed,
    /// while `faults` is set.
    fn new(seed: u64, faults: bool, world: &Arc<World>, clock: Arc<SimClock>) -> Buckets {
        use lading_ingest::bucket::{Fault, Memory};
        let on = Arc::new(std::sync::atomic::AtomicBool::new(faults));
        let outage: Arc<[std::sync::atomic::AtomicU64; 2]> = Arc::new(Default::default());
        let dice = Seeded::new(seed ^ 0x6275_636b);
        let node = |n: u32| {
            let (on, dice, world) = (on.clone(), dice.clone(), world.clone());
            let (outage, now) = (outage.clone(), clock.clone());
            let faults = Arc::new(move |op: &str, key: &str| {
                let until = outage[n as usize - 1].load(std::sync::atomic::Ordering::Relaxed);
                if now.now_ms() < until {
                    return Fault::Down;
                }
                if !on.load(std::sync::atomic::Ordering::Relaxed) {
                    return Fault::None;
                }
                let fault = match dice.below(100) {
                    0..=2 => Fault::Refused,
                    3..=4 => Fault::AnswerLost,
                    5..=14 => Fault::Slow(Duration::from_millis(50 + dice.below(2000) as u64)),
                    _ => Fault::None,
                };
                if matches!(fault, Fault::Refused | Fault::AnswerLost) {
                    world
                        .lock()
                        .trace(format!("node {n}: {op} {key}: {fault:?}"));
                }
                fault
            });
            Arc::new(Memory::with_clock(faults, clock.clone()))
        };
        Buckets {
            nodes: [node(1), node(2)],
            faults: on,
            outage,
        }
    }

    /// The nodes as a process opens them. Files longer than [`PART_SIZE`] go up as multipart
    /// uploads.
    fn open(&self) -> [lading_ingest::nodes::Node; 2] {
        use lading_ingest::nodes::Node;
        [
            Node::in_bucket(1, "primary", "lading/", self.nodes[0].clone()),
            Node::in_bucket(2, "replica", "lading/", self.nodes[1].clone()),
        ]
        .map(|n| n.with_part_size(PART_SIZE))
    }
}

/// The storage nodes' part size: a payload's file (up to some 800 bytes) goes up in one PUT
/// or as a multipart upload of a few parts, as do a version's own records (its manifests,
/// `lading-version.json`), under the same faults as every other request.
const PART_SIZE: u64 = 256;

/// The profile every simulated batch is submitted under: its report is mailed and each
/// job's outcome called back (both through the real outbox, to the simulated world).
const PROFILE: &str = "sim";

/// The ingest settings the real Notify and Reporting stages and the outbox deliverer run
/// with: a mail relay named, a short settling time after requeues, and deliveries retried
/// quickly and for as long as it takes (the simulated relay comes back).
fn ingest_config(
    work: &std::path::Path,
    name: &str,
    retention_hours: u64,
) -> lading_ingest::Config {
    let mut cfg = lading_ingest::Config {
        smtp_host: Some("relay.sim.invalid".into()),
        mail_from: "lading@sim.invalid".into(),
        report_settle_s: 2,
        // Cleanup (by each process that reports) and the working-folder sweep (by each that
        // keeps working folders): every 10 s where ended batches are kept 0 h, else every
        // minute (the sweep then finds nothing old enough in a run, and costs a look at each
        // folder).
        retention_hours,
        cleanup_every_s: if retention_hours == 0 {
            CLEANUP_EVERY_S
        } else {
            6 * CLEANUP_EVERY_S
        },
        // Each process its own working folder (a host's disk); the storage root and the
        // inventory shared by all (a shared file system, one database).
        data_dir: work.join(format!("{name}-data")),
        work_dir: Some(work.join(name)),
        work_root_id: Some(name.into()),
        storage_root: Some(work.join("storage")),
        inventory: Some(work.join("inventory.db")),
        // The scheduled fixity audit, every 10 s: with the inventory's clock two days
        // behind ([`Behind`]), each share reads every recorded copy.
        fixity: lading_ingest::config::FixitySettings {
            every_days: 1,
            bytes_per_s: 0,
            audit_every_s: AUDIT_EVERY_S,
            abort_uploads_after_s: ABORT_UPLOADS_AFTER_S,
        },
        ..Default::default()
    };
    cfg.stages.insert(
        "outbox".into(),
        lading_ingest::config::StageSettings {
            concurrency: Some(2),
            timeout_s: Some(60),
            max_attempts: Some(u32::MAX),
            backoff_base_ms: Some(200),
            backoff_max_ms: Some(3_000),
        },
    );
    cfg
}

/// How often cleanup and the working-folder sweep run.
const CLEANUP_EVERY_S: u64 = 10;

/// How often the scheduled fixity audit's schedule ticks.
const AUDIT_EVERY_S: u64 = 10;

/// After how long the scheduled audit aborts an upload left open (`[fixity]
/// abort_uploads_after_s`, its least).
const ABORT_UPLOADS_AFTER_S: u64 = 60;

/// The profile of some payload batches: stored on bucket node 1 and copied to node 2.
const NODES_PROFILE: &str = "sim-nodes";

fn nodes_profile() -> lading_ingest::Profile {
    lading_ingest::Profile {
        name: NODES_PROFILE.into(),
        storage_nodes: vec![1, 2],
        ..profile()
    }
}

/// The profile of other payload batches: stored on folder node 3 and copied to folder node 4
/// (folders shared by every process, as a mounted file system is).
const FOLDERS_PROFILE: &str = "sim-folders";

fn folders_profile() -> lading_ingest::Profile {
    lading_ingest::Profile {
        name: FOLDERS_PROFILE.into(),
        storage_nodes: vec![3, 4],
        ..profile()
    }
}

/// Folder nodes 3 (a primary) and 4 (its replica), as a process opens them from its
/// settings (`file://` URLs).
fn folder_nodes(work: &std::path::Path) -> [lading_ingest::nodes::Node; 2] {
    [3, 4].map(|id| {
        let settings = lading_ingest::config::NodeSettings::at(
            id,
            &format!("file://{}", work.join(format!("node{id}")).display()),
        );
        lading_ingest::nodes::Node::open(&settings, |_| None).expect("a folder node")
    })
}

fn profile() -> lading_ingest::Profile {
    lading_ingest::Profile {
        name: PROFILE.into(),
        collection: "sim".into(),
        notification: vec!["depositor@sim.invalid".into()],
        callback_url: Some("http://callbacks.sim.invalid/lading".into()),
        command: Some(crate::command::SCAN.into()),
        ..Default::default()
    }
}

/// One fetcher for every simulated process of the program (its HTTP clients are costly to
/// make, and nothing in the simulation fetches).
fn fetcher() -> lading_ingest::fetch::Fetcher {
    static F: std::sync::OnceLock<lading_ingest::fetch::Fetcher> = std::sync::OnceLock::new();
    F.get_or_init(|| {
        lading_ingest::fetch::Fetcher::with_settings(&Default::default())
            .expect("default payload settings")
    })
    .clone()
}

fn stage_config() -> StageConfig {
    StageConfig {
        concurrency: 2,
        timeout: Duration::from_secs(60),
        max_attempts: 4,
        backoff_base: Duration::from_millis(200),
        backoff_max: Duration::from_secs(3),
    }
}

impl Sim {
    /// A process's ingest service: its own working folder, the shared storage root,
    /// inventory and storage nodes, the payload server and the outside world.
    fn ingest(&self, engine: Arc<Engine>, name: &str) -> lading_ingest::Ingest {
        let mut ingest = lading_ingest::Ingest::assemble(
            engine,
            ingest_config(self.work.path(), name, self.retention_hours),
            fetcher().with_source(Arc::new(PayloadServer {
                dice: self.dice.0.clone(),
                served: self.served.clone(),
                answers: self.answers.clone(),
                faults: self.buckets.faults.clone(),
            })),
            |_| None,
        )
        .expect("the simulator's ingest settings")
        .with_profile(profile())
        .with_profile(nodes_profile())
        .with_profile(folders_profile())
        .with_courier(Arc::new(SimCourier {
            dice: self.dice.clone(),
            outside: self.outside.clone(),
        }))
        .with_commands(Arc::new(crate::command::Scanner {
            dice: self.dice.0.clone(),
            wrong: {
                let outside = self.outside.clone();
                Arc::new(move |why| {
                    outside
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .wrong
                        .push(why)
                })
            },
            hang: stage_config().timeout + Duration::from_secs(30),
            faults: self.buckets.faults.clone(),
        }));
        for n in self.buckets.open() {
            ingest.nodes.insert(n);
        }
        for n in folder_nodes(self.work.path()) {
            ingest.nodes.insert(n);
        }
        // Each node with its probe, as a node's ingest registers them.
        ingest.register_dependencies();
        ingest.inventory = Arc::new(
            lading_ingest::inventory::Inventory::new(ingest.cfg.inventory())
                .with_clock(Arc::new(Behind(ingest.engine.clock().clone()))),
        );
        ingest
    }

    fn start(&mut self, i: usize) -> Proc {
        self.starts += 1;
        let name = format!("p{i}");
        let tree = self.world.connect(&name);
        let engine = Arc::new(
            Engine::new(
                tree.clone(),
                self.clock.clone(),
                format!("{name}.{}", self.starts),
            )
            .with_random(Seeded::new(
                self.seed.wrapping_mul(31).wrapping_add(self.starts),
            ))
            .with_sweep(Duration::from_millis(SWEEP_MS)),
        );
        let ingest = Arc::new(self.ingest(engine.clone(), &name));
        let jobs: Vec<(Arc<dyn JobStage>, StageConfig)> = JobState::PIPELINE
            .iter()
            .map(|s| {
                let sim = SimJobStage {
                    state: *s,
                    dice: self.dice.clone(),
                };
                use lading_ingest::stages as real;
                let i = ingest.clone();
                let stage: Arc<dyn JobStage> = match s {
                    // The real Notify: the job's callback, recorded with its move to Completed.
                    JobState::Notify => Arc::new(real::Notify(i)),
                    // Lading's own file stages for the jobs of payload batches.
                    JobState::Estimating => Mixed::stage(real::Estimate(i), sim),
                    JobState::Downloading => Mixed::stage(real::Download(i), sim),
                    JobState::Processing => Mixed::stage(real::Process(i), sim),
                    JobState::Storing => Mixed::stage(real::Store(i), sim),
                    JobState::Recording => Mixed::stage(real::Record(i), sim),
                    _ => Arc::new(sim),
                };
                (stage, stage_config())
            })
            .collect();
        // The real Reporting and UpdateReporting: the numbered report and its mail.
        let report = |s| Arc::new(lading_ingest::report::Report(ingest.clone(), s));
        let batches: Vec<(Arc<dyn BatchStage>, StageConfig)> = vec![
            (
                Arc::new(MixedIntake(lading_ingest::intake::Intake(ingest.clone()))),
                stage_config(),
            ),
            (report(BatchState::Reporting), stage_config()),
            (report(BatchState::UpdateReporting), stage_config()),
        ];
        let worker = Worker::new(engine.clone(), self.work.path().join(&name));
        // Generic jobs (lading-jobs) on the same session: a processor and the activity monitor.
        let generic = Arc::new(
            lading_jobs::Jobs::new(
                tree.clone(),
                self.clock.clone(),
                format!("{name}.{}", self.starts),
            )
            .with_random(Seeded::new(
                self.seed.wrapping_mul(37).wrapping_add(self.starts),
            )),
        );
        // Every service under one supervisor, as in a real node: the outbox deliverer stops
        // last, so what the stages record while they finish is still delivered. A crash
        // aborts the supervisor's task, and with it every service.
        let mut services = Supervisor::new();
        let stop = services.handle();
        let i = ingest.clone();
        services.spawn("stages", Phase::First, |sd| async move {
            // What stores that failed in an earlier run left in the storage root, as a node
            // with the storing stage sweeps it when it starts.
            let _ = lading_ingest::stages::sweep_storage(&i).await;
            worker.run(jobs, batches, sd).await;
            Ok(())
        });
        // Lading's housekeeping: batches whose jobs all ended move on to Reporting (a watch,
        // and a sweep), and old batches are cleaned up.
        let i = ingest.clone();
        services.spawn("housekeeping", Phase::First, |sd| async move {
            lading_ingest::cleanup::housekeeping(i, sd).await;
            Ok(())
        });
        // Working folders of jobs cleanup removed, as each host that keeps them sweeps them.
        let i = ingest.clone();
        services.spawn("working-folder sweep", Phase::First, |sd| async move {
            lading_ingest::cleanup::sweep_work_dirs_every(i, sd).await;
            Ok(())
        });
        // The access queues: stored versions assembled as zips, read from the storage root
        // or the nodes.
        for q in [AccessQueue::Small, AccessQueue::Large] {
            let i = ingest.clone();
            services.spawn("access queue", Phase::First, move |sd| async move {
                lading_ingest::access::run(i, q, sd).await;
                Ok(())
            });
        }
        // The scheduled fixity audit, as every node running the monitor runs it.
        let (i, g) = (ingest.clone(), generic.clone());
        services.spawn("fixity audit", Phase::First, |sd| async move {
            lading_ingest::fixity::run_audit(i, g, sd).await;
            Ok(())
        });
        // Lading's outbox deliverer, to the simulated world.
        services.spawn("outbox", Phase::Last, |sd| async move {
            lading_ingest::outbox::run(ingest, sd).await;
            Ok(())
        });
        // Probers of the dependencies found down, as in a real node.
        let e = engine.clone();
        services.spawn("probers", Phase::Last, |sd| async move {
            lading_worker::deps::run_probers(e, sd).await
        });
        let g = generic.clone();
        services.spawn("generic-jobs monitor", Phase::First, |sd| async move {
            g.run_monitor(sd).await;
            Ok(())
        });
        let e = engine.clone();
        services.spawn("quota waker", Phase::First, |sd| async move {
            let limits = Arc::new(|p: &str| (p == QUOTA_PROFILE).then_some(QUOTA_LIMIT));
            lading_ingest::quota::run_waker_with(e, limits, sd).await;
            Ok(())
        });
        let (dice, outside) = (self.dice.clone(), self.outside.clone());
        services.spawn("generic-jobs processor", Phase::First, |sd| async move {
            process_generic(generic, dice, outside, sd).await;
            Ok(())
        });
        let task = tokio::spawn(async move {
            let _ = services.join().await;
        });
        Proc { tree, stop, task }
    }
}

/// Records a delivery of `kind` (`mail`, `callback`) by key in the outside world; one key
/// with two contents is recorded as a conflict (a violation at the end).
fn record(outside: &Mutex<Outside>, kind: &str, key: String, content: Value) {
    let mut o = outside.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = content.get("unreadable") {
        o.wrong
            .push(format!("a {kind} that could not be read: {why}"));
        return;
    }
    let book = if kind == "mail" {
        &mut o.mails
    } else {
        &mut o.callbacks
    };
    let got = book.entry(key).or_insert((content.clone(), 0));
    if got.0 != content {
        got.0 = json!({"conflict": [got.0.clone(), content]});
    }
    got.1 += 1;
}

/// The outside world as Lading's real outbox deliverer meets it. A mail goes through
/// Lading's own SMTP client to the simulated relay (`smtp.rs`), on a pipe in memory; a
/// callback, the POST Lading forms for the wire, through hyper's HTTP/1.1 client to the
/// simulated receiver (`callback.rs`), whose answer Lading reads as from the network. Every
/// arrival is recorded by key.
struct SimCourier {
    dice: Arc<Dice>,
    outside: Arc<Mutex<Outside>>,
}

impl lading_ingest::outbox::Courier for SimCourier {
    fn carry<'a>(
        &'a self,
        ingest: &'a lading_ingest::Ingest,
        e: &'a Effect,
    ) -> BoxFuture<'a, Result<(), lading_ingest::outbox::Failure>> {
        Box::pin(async move {
            if e.kind == "mail" {
                let outside = self.outside.clone();
                let (pipe, relay) = crate::smtp::connect(&self.dice.0, move |key, content| {
                    record(&outside, "mail", key, content)
                });
                let sent = lading_ingest::outbox::mail_over(ingest, e, Box::new(pipe)).await;
                let _ = relay.await;
                return sent;
            }
            let post = lading_ingest::outbox::callback_of(e)?;
            let outside = self.outside.clone();
            let (pipe, receiver) = crate::callback::connect(&self.dice.0, move |key, content| {
                record(&outside, "callback", key, content)
            });
            let sent = match crate::callback::post_over(pipe, &post).await {
                Ok(status) => lading_ingest::outbox::callback_answer(&post.url, status),
                Err(why) => Err(lading_ingest::outbox::callback_unsent(&post.url, why)),
            };
            let _ = receiver.await;
            sent
        })
    }
}

/// A generic-jobs processor: accepts a job or two, works on each a while, then finishes it
/// (an error one time in five, retried by the type's policy), or now and then drops it
/// unfinished (the activity monitor must notice and put it back).
async fn process_generic(
    jobs: Arc<lading_jobs::Jobs>,
    dice: Arc<Dice>,
    outside: Arc<Mutex<Outside>>,
    shutdown: Shutdown,
) {
    while !shutdown.is_stopping() {
        // One job or a few; the due head in order, or any of it (acceptors on several hosts
        // then take different jobs at once, and meet only at the rate limit).
        let opts = lading_jobs::AcceptOptions {
            timeout: Duration::from_secs(1),
            no_schedule: dice.below(2) == 0,
            ..Default::default()
        };
        let max = 1 + dice.below(2);
        match jobs.accept_many(GENERIC_TYPE, max, &opts).await {
            Ok(accepted) => {
                for mut job in accepted {
                    let (took, roll) = (dice.below(400), dice.below(100));
                    tokio::time::sleep(Duration::from_millis(took as u64)).await;
                    let outcome = match roll {
                        0..=4 => continue,
                        5..=24 => lading_jobs::Outcome::Error {
                            message: "the simulated job failed".into(),
                            data: None,
                        },
                        _ => lading_jobs::Outcome::Success(None),
                    };
                    let success = matches!(outcome, lading_jobs::Outcome::Success(_));
                    if jobs.finish_with(&mut job, outcome).await.is_ok() && success {
                        let mut o = outside.lock().unwrap_or_else(|p| p.into_inner());
                        *o.generic_done.entry(job.id.clone()).or_default() += 1;
                    }
                }
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// What a client of the event stream received: every transition, by the job or batch, the
/// state reached and when (an event's id names the status version it was read at, so the
/// same transition read twice has two ids).
#[derive(Default)]
struct Watched {
    seen: std::collections::BTreeSet<(String, String, String)>,
    /// From when the stream reports transitions (ms): those before are the past.
    from_ms: u64,
    /// The follower had started.
    following: bool,
    resumes: u32,
    /// Of those, the ones sent what followed from the hub's ring (the others, from the tree).
    kept_resumes: u32,
    /// Resets received (the state read again).
    resets: u32,
    /// Every event id a second client that never goes away received, in order.
    reference: Vec<String>,
    /// For each comeback sent what followed from the hub's ring: the last id the client had
    /// seen, and the first it was sent then (the hub owes exactly the events after it, in
    /// order, none lost or repeated).
    kept_next: Vec<(String, Option<String>)>,
}

/// Events the simulated event hub keeps for clients that come back: few, so a client away
/// for a while is sent what it missed from the tree, and one away briefly from memory.
const EVENTS_KEPT: usize = 64;

/// An event stream's client of Lading's event hub (`lading_server::events::EventHub`, what
/// `GET /api/v1/events` streams; the hub's follower reads every writer's transitions from the
/// tree's change feed, and keeps the last [`EVENTS_KEPT`]). Now and then the client goes away
/// and comes back with the last id it saw: the hub sends what followed from its ring when it
/// still keeps that id, else from the tree since that id's time. A `reset` (transitions were
/// lost, or the client fell behind) makes it read the state again, as a client is told to.
async fn watch_events(
    world: Arc<World>,
    engine: Arc<Engine>,
    server: EventsServer,
    rng: Arc<Seeded>,
    watched: Arc<Mutex<Watched>>,
    shutdown: Shutdown,
) {
    use lading_server::events::{EventHub, Sent};
    let Some(hub) = retrying(|| EventHub::start_keeping(&engine, EVENTS_KEPT), |_| true).await
    else {
        return;
    };
    // Lading's HTTP server, with its connection limits, on the hub; it stops once the
    // client has taken what it was sent.
    let (listener, connector) = crate::http::pair();
    let (server_stop, server_shutdown) = Shutdown::new();
    let auth = lading_server::Auth::new(&[lading_ingest::config::TokenSettings {
        name: "operator".into(),
        token: EVENTS_TOKEN.into(),
        role: "admin".into(),
        types: Vec::new(),
        collections: Vec::new(),
    }])
    .expect("the simulator's token");
    let auth = Arc::new(auth);
    let state = lading_server::AppState {
        ingest: server.ingest,
        events: hub.clone(),
        jobs: server.jobs,
        auth: auth.clone(),
        stopping: server_shutdown.clone(),
    };
    let serving = tokio::spawn(lading_server::serve(
        listener,
        lading_server::router(state),
        server_shutdown.into_stopped(),
        // One stream per client: a stream the server kept after its client went away would
        // refuse the client's comeback (429).
        lading_server::conn::Limits {
            max_streams_per_client: 1,
            ..Default::default()
        },
        Some(auth),
    ));
    {
        let mut w = watched.lock().unwrap_or_else(|p| p.into_inner());
        w.from_ms = hub.live_from();
        w.following = true;
    }
    // A second client that never goes away: the order the hub sends events in.
    let reference = {
        let (hub, watched, shutdown) = (hub.clone(), watched.clone(), shutdown.clone());
        tokio::spawn(async move {
            let Ok(s) = hub.follow(None, None).await else {
                return;
            };
            let mut s = Box::pin(s);
            let mut stop = std::pin::pin!(shutdown.into_stopped());
            let mut ending = false;
            loop {
                let Some(next) = next_sent(&mut s, stop.as_mut(), &mut ending).await else {
                    return;
                };
                match next {
                    Some(Sent::Change(id, _)) => watched
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .reference
                        .push(id.to_string()),
                    Some(Sent::Reset) => {}
                    None => return,
                }
            }
        })
    };
    let client = async {
        let mut last: Option<String> = None;
        let mut away_until: Option<tokio::time::Instant> = None;
        let mut stream = None;
        let mut stop = std::pin::pin!(shutdown.clone().into_stopped());
        // Told to end: the client comes back (if away), takes what was sent, and ends.
        let mut ending = false;
        loop {
            if stream.is_none() {
                if let Some(t) = away_until.take()
                    && !ending
                {
                    tokio::select! {
                        biased;
                        _ = &mut stop => ending = true,
                        _ = tokio::time::sleep_until(t) => {}
                    }
                }
                let kept = last.as_deref().is_some_and(|l| hub.keeps(l));
                let mut answer = Err(String::new());
                for _ in 0..10 {
                    answer = crate::http::follow(&connector, EVENTS_TOKEN, last.as_deref()).await;
                    if answer.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let s = match answer {
                    Ok(s) => s,
                    Err(e) => {
                        world.lock().violation(format!(
                            "events: GET /api/v1/events failed ten times; the last: {e}"
                        ));
                        return;
                    }
                };
                if last.is_some() {
                    let mut w = watched.lock().unwrap_or_else(|p| p.into_inner());
                    w.resumes += 1;
                    if kept {
                        w.kept_resumes += 1;
                        w.kept_next.push((last.clone().unwrap_or_default(), None));
                    }
                    drop(w);
                    world.lock().trace(format!(
                        "events: the client comes back after {last:?}, sent what followed from {}",
                        if kept { "the hub's ring" } else { "the tree" }
                    ));
                }
                stream = Some(Box::pin(s));
            }
            let Some(s) = stream.as_mut() else { continue };
            let Some(next) = next_sent(s, stop.as_mut(), &mut ending).await else {
                return;
            };
            match next {
                Some(Sent::Change(id, ev)) => {
                    let mut w = watched.lock().unwrap_or_else(|p| p.into_inner());
                    w.seen
                        .insert((ev.id.clone(), ev.to.clone(), ev.time.clone()));
                    if let Some((_, first @ None)) = w.kept_next.last_mut() {
                        *first = Some(id.to_string());
                    }
                    // The last id received, in the stream's order (what a client sends back).
                    last = Some(id.to_string());
                }
                Some(Sent::Reset) => {
                    // Told that some were missed, a client re-reads the state: here, every
                    // transition the tree shows since its last event.
                    let since = last
                        .as_deref()
                        .and_then(lading_engine::transition_id_time)
                        .unwrap_or(hub.live_from());
                    let Some(owed) = admin(|| engine.transitions_since(since, None)).await else {
                        return;
                    };
                    world.lock().trace(format!(
                        "events: the stream says transitions were missed; {} read again from {since} ms",
                        owed.len()
                    ));
                    let mut w = watched.lock().unwrap_or_else(|p| p.into_inner());
                    w.resets += 1;
                    for (_, ev) in owed {
                        w.seen.insert((ev.id, ev.to, ev.time));
                    }
                    continue;
                }
                None => return,
            }
            if !ending && rng.below(40) == 0 {
                world
                    .lock()
                    .trace(format!("events: the client goes away after {last:?}"));
                {
                    let mut w = watched.lock().unwrap_or_else(|p| p.into_inner());
                    if matches!(w.kept_next.last(), Some((_, None))) {
                        w.kept_next.pop();
                    }
                }
                stream = None;
                away_until = Some(
                    tokio::time::Instant::now()
                        + Duration::from_millis(200 + rng.below(4000) as u64),
                );
            }
        }
    };
    client.await;
    // The end check compares the two clients: the reference has taken all it was sent.
    let _ = reference.await;
    server_stop.stop();
    let _ = serving.await;
}

/// The token of the event stream's client (an admin's: it follows every batch).
const EVENTS_TOKEN: &str = "sim-events-token-0123456789abcdef";

/// What the event stream's host serves its API with.
struct EventsServer {
    ingest: Arc<lading_ingest::Ingest>,
    jobs: Arc<lading_jobs::Jobs>,
}

/// What an event client is sent next (`None` inside: the stream ended). Once `stop` has
/// fired (`ending`), only what was sent by then: `None` once nothing more comes for a
/// second (simulated time moves only when every task waits, so whatever was on its way,
/// through the wire too, has come by then).
async fn next_sent<S>(
    s: &mut S,
    mut stop: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ending: &mut bool,
) -> Option<Option<lading_server::events::Sent>>
where
    S: futures_util::Stream<Item = lading_server::events::Sent> + Unpin,
{
    use futures_util::StreamExt;
    if !*ending {
        tokio::select! {
            biased;
            n = s.next() => return Some(n),
            _ = stop.as_mut() => *ending = true,
        }
    }
    tokio::time::timeout(Duration::from_secs(1), s.next())
        .await
        .ok()
}

/// Retries a call through the errors `retryable` names, as an operator would (ten tries,
/// 100 ms apart); `None` when it did not go through.
async fn retrying<T, E, F, Fut>(f: F, retryable: impl Fn(&E) -> bool) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    for _ in 0..10 {
        match f().await {
            Ok(v) => return Some(v),
            Err(e) if retryable(&e) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(_) => return None,
        }
    }
    None
}

/// An admin call, retried through connection losses and expiries.
async fn admin<T, F, Fut>(f: F) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = lading_engine::Result<T>>,
{
    retrying(f, |e: &lading_engine::EngineError| {
        e.is_retryable()
            || matches!(
                e,
                lading_engine::EngineError::Tree(lading_core::TreeError::SessionExpired)
            )
    })
    .await
}

/// A generic-jobs admin call, retried through any error (a lost reply, an expiry, a race).
async fn admin_generic<T, F, Fut>(f: F) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = lading_jobs::Result<T>>,
{
    retrying(f, |_: &lading_jobs::JobsError| true).await
}

/// A job of one of `bids`, picked by `rng` (for a hold or a delete).
async fn any_job(
    rng: &Seeded,
    admin_engine: &Engine,
    bids: &[BatchId],
) -> Option<(BatchId, JobId)> {
    let b = pick(rng, bids)?;
    let info = admin(|| admin_engine.batch(&b)).await?;
    let j = pick(
        rng,
        &info.jobs.values().flatten().cloned().collect::<Vec<_>>(),
    )?;
    Some((b, j))
}

/// What `look` still finds open once it finds nothing or `within` has passed, looked at every
/// `every` of simulated time: the harness observes from outside, so it looks (the processes
/// under test are woken by the tree). Empty when everything ended in time.
async fn still_open<F, Fut>(within: Duration, every: Duration, look: F) -> Vec<String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Vec<String>>,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut open = Vec::new();
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(every).await;
        open = look().await;
        if open.is_empty() {
            break;
        }
    }
    open
}

/// What is still open of `bids` (with the outbox's undelivered entries, when `outbox`) once
/// they have all ended or `within` has passed (see [`still_open`]).
async fn not_ended(
    admin_engine: &Engine,
    bids: &[BatchId],
    within: Duration,
    every: Duration,
    outbox: bool,
) -> Vec<String> {
    still_open(within, every, || async {
        let mut open = Vec::new();
        for b in bids {
            match admin_engine.batch(b).await {
                Ok(i) if matches!(i.status.status, BatchState::Completed | BatchState::Failed) => {}
                // Purged by cleanup: only an ended batch is (checked at its commit).
                Err(lading_engine::EngineError::NoBatch(_)) => {}
                Ok(i) => open.push(format!("{b} {}", i.status.status)),
                Err(e) => open.push(format!("{b} unreadable: {e}")),
            }
        }
        if outbox {
            match admin_engine.outbox().await {
                Ok(o) if o.is_empty() => {}
                Ok(o) => open.push(format!(
                    "{} outbox entries undelivered, such as {:?}",
                    o.len(),
                    o.first()
                )),
                Err(e) => open.push(format!("the outbox cannot be read: {e}")),
            }
        }
        open
    })
    .await
}

/// The generic jobs not Finished or Failed once they all are or `within` has passed (see
/// [`still_open`]).
async fn generic_not_ended(jobs: &lading_jobs::Jobs, within: Duration) -> Vec<String> {
    still_open(within, Duration::from_millis(500), || async {
        let Some(all) = admin_generic(|| jobs.list(GENERIC_TYPE, None, None, 10_000)).await else {
            return vec!["the jobs are unreadable".into()];
        };
        let mut open: Vec<String> = all
            .iter()
            .filter(|j| {
                !matches!(
                    j.record.state,
                    lading_jobs::State::Finished | lading_jobs::State::Failed
                )
            })
            .map(|j| format!("{} {}", j.id, j.record.state.name()))
            .collect();
        // The jobs added at the start are all there, or ended and removed by retention.
        for i in 0..GENERIC_JOBS {
            let id = format!("g{i}");
            if all.iter().any(|j| j.id == id) {
                continue;
            }
            let gone = retrying(
                || jobs.get_job_state(GENERIC_TYPE, &id),
                |e| !matches!(e, lading_jobs::JobsError::NoJob { .. }),
            )
            .await
            .is_none();
            if !gone {
                open.push(format!("{id} missing from the list"));
            }
        }
        open
    })
    .await
}

/// The processes' working folders: in memory where the machine has a tmpfs (`/dev/shm`), as
/// the workers make and remove a folder per job and a disk spends most of a run on that.
fn work_folder() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::tempdir_in(shm)
    {
        return d;
    }
    tempfile::tempdir().expect("a temporary folder")
}

pub fn run(seed: u64, opts: &Options) -> Run {
    // Lading's blocking work (files, hashing, the inventory) in place, so that it lands where
    // the seed's run puts it.
    lading_ingest::blocking::in_place_on_this_thread();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(simulate(seed, opts))
}

async fn simulate(seed: u64, opts: &Options) -> Run {
    let world = World::new(seed, opts.faults.then(Faults::default_on), opts.trace);
    let start = world.lock().start();
    let clock = Arc::new(SimClock { start });
    let rng = Seeded::new(seed);
    let mut payloads = Payloads::default();
    let mut sim = Sim {
        world: world.clone(),
        clock: clock.clone(),
        dice: Arc::new(Dice(Seeded::new(seed ^ 0x6469_6365))),
        outside: Arc::default(),
        work: work_folder(),
        served: payloads.served.clone(),
        answers: Arc::default(),
        buckets: Buckets::new(seed, opts.faults, &world, clock.clone()),
        retention_hours: if Seeded::new(seed ^ 0x7265_7465).below(4) == 0 {
            0
        } else {
            lading_ingest::Config::default().retention_hours
        },
        seed,
        starts: 0,
    };
    {
        let mut w = world.lock();
        w.retention_ms = sim.retention_hours.saturating_mul(3_600_000);
        w.trace(format!("ended batches are kept {} h", sim.retention_hours));
    }
    let admin_engine = Arc::new(
        Engine::new(world.connect("admin"), clock.clone(), "admin")
            .with_random(Seeded::new(seed ^ 0xad)),
    );
    // The admin's session is the operator's: faults do not end it (it retries).
    admin(|| admin_engine.init()).await;
    // Generic jobs: a type whose running jobs time out after 5 s, with a rate limit and a
    // retention of ended jobs; a schedule; and its jobs.
    let admin_jobs = lading_jobs::Jobs::new(admin_engine.tree().clone(), clock.clone(), "admin")
        .with_random(Seeded::new(seed ^ 0x6a));
    let settings = lading_jobs::TypeUpdate {
        timeout_s: Some(5),
        rate_per_s: Some(GENERIC_RATE),
        keep_finished_s: Some(GENERIC_KEEP_S),
        keep_failed_s: Some(GENERIC_KEEP_S),
        ..Default::default()
    };
    admin_generic(|| admin_jobs.update_type(GENERIC_TYPE, &settings)).await;
    admin_generic(|| {
        admin_jobs.set_schedule(
            GENERIC_TYPE,
            SCHEDULE,
            lading_jobs::Every::Seconds(SCHEDULE_EVERY_S),
            json!({ "tick": true }),
            0,
        )
    })
    .await;
    for i in 0..GENERIC_JOBS {
        let id = format!("g{i}");
        admin_generic(|| admin_jobs.add(GENERIC_TYPE, &id, json!({ "i": i }), None)).await;
    }
    // An event stream's client, on a host of its own (its session is not spared faults).
    let watched = Arc::new(Mutex::new(Watched::default()));
    let (events_stop, events_shutdown) = Shutdown::new();
    let events = {
        let tree = world.connect("events");
        let engine = Arc::new(
            Engine::new(tree.clone(), clock.clone(), "events")
                .with_random(Seeded::new(seed ^ 0x6576)),
        );
        // The host serves Lading's HTTP API (the event stream among it) on connections in
        // memory; the client reads the stream off the wire.
        let server = EventsServer {
            ingest: Arc::new(sim.ingest(engine.clone(), "events")),
            jobs: Arc::new(lading_jobs::Jobs::new(tree, clock.clone(), "events")),
        };
        tokio::spawn(watch_events(
            world.clone(),
            engine,
            server,
            Seeded::new(seed ^ 0x636c),
            watched.clone(),
            events_shutdown,
        ))
    };
    // The operator's own tools (the fixity checker) on the admin's session.
    let admin_ingest = Arc::new(sim.ingest(admin_engine.clone(), "admin"));
    let mut procs: Vec<Option<Proc>> = (0..opts.nodes).map(|i| Some(sim.start(i))).collect();
    let mut down_until: Vec<Option<tokio::time::Instant>> = vec![None; opts.nodes];
    let mut bids: Vec<BatchId> = Vec::new();
    let mut reopened: BTreeMap<String, u32> = BTreeMap::new();
    // Batches a job was deleted from (or may have been: the answer can be lost).
    let mut deleted_from: std::collections::BTreeSet<String> = Default::default();
    let mut held: Vec<(JobId, tokio::time::Instant)> = Vec::new();
    // Access requests asked for: (id, ark, version), and whether the faults were on.
    let mut asked: Vec<Asked> = Vec::new();
    let mut queue_paused_until: Option<tokio::time::Instant> = None;
    let payload_root = sim.work.path().join("payloads");
    // Fixes the depositor makes only later (a missing file, a corrected manifest), and when.
    let mut late: Vec<(tokio::time::Instant, Place, Vec<u8>)> = Vec::new();
    for i in 0..opts.batches {
        let mut sub = Map::new();
        sub.insert("batchID".into(), json!(format!("sim-{seed}-{i}")));
        sub.insert("submitter".into(), json!(format!("user{}", rng.below(3))));
        sub.insert("profile".into(), json!(PROFILE));
        if rng.below(3) == 0 {
            // A payload on disk, through Lading's own intake and file stages.
            let p = payloads.make(&payload_root, seed, i, &rng);
            match crate::payload::Storage::of(i) {
                // On the bucket nodes, and copied from one to the other.
                crate::payload::Storage::Buckets => {
                    sub.insert("profile".into(), json!(NODES_PROFILE));
                }
                // On the folder nodes, the same way.
                crate::payload::Storage::Folders => {
                    sub.insert("profile".into(), json!(FOLDERS_PROFILE));
                }
                crate::payload::Storage::Root => {}
            }
            sub.insert("payload_url".into(), json!(p.url));
            sub.insert("type".into(), json!(p.payload_type));
            if let Some((path, bytes)) = p.late {
                let at =
                    tokio::time::Instant::now() + Duration::from_millis(rng.below(8000) as u64);
                late.push((at, path, bytes));
            }
        } else {
            sub.insert("sim_jobs".into(), json!(1 + rng.below(9)));
        }
        let uuid = format!("sim-{seed}-{i}");
        let made = admin(|| admin_engine.create_batch(submission(&sub))).await;
        let bid = match made {
            Some(b) => Some(b),
            // Made, and the answer lost: found by its uuid.
            None => admin(|| admin_engine.batch_by_uuid(&uuid)).await.flatten(),
        };
        if let Some(b) = bid {
            let ty = sub
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("simulated");
            world.lock().trace(format!("submitted {b} ({uuid}, {ty})"));
            bids.push(b);
        }
        // Between two submissions: what the world does to the deployment.
        for _ in 0..1 + rng.below(3) {
            tokio::time::sleep(Duration::from_millis(rng.below(1500) as u64)).await;
            let now = tokio::time::Instant::now();
            for (k, p) in procs.iter_mut().enumerate() {
                if p.is_none() && down_until[k].is_some_and(|t| t <= now) {
                    *p = Some(sim.start(k));
                    down_until[k] = None;
                    world.lock().trace(format!("p{k} restarted"));
                }
            }
            held.retain(|(j, until)| {
                if *until <= now {
                    let (e, j) = (admin_engine.clone(), j.clone());
                    tokio::spawn(async move {
                        admin(|| e.release_job(&j)).await;
                    });
                    false
                } else {
                    true
                }
            });
            late.retain(|(at, place, bytes)| {
                if *at > now {
                    return true;
                }
                payloads.put(place, bytes);
                let shown = match place {
                    Place::Disk(p) => p
                        .strip_prefix(&payload_root)
                        .unwrap_or(p)
                        .display()
                        .to_string(),
                    Place::Served(u) => u.clone(),
                };
                world
                    .lock()
                    .trace(format!("the depositor put {shown} right"));
                false
            });
            if queue_paused_until.is_some_and(|t| t <= now) {
                queue_paused_until = None;
                admin(|| admin_engine.resume_queue("ingest")).await;
            }
            if !opts.faults {
                continue;
            }
            let k = rng.below(opts.nodes);
            match rng.below(11) {
                0 => {
                    if let Some(p) = procs[k].take() {
                        p.tree.kill();
                        p.task.abort();
                        let s = p.tree.session_id();
                        let w = world.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(SESSION_TIMEOUT_MS)).await;
                            w.lock().expire(s);
                        });
                        down_until[k] =
                            Some(now + Duration::from_millis(500 + rng.below(5000) as u64));
                        world.lock().trace(format!("p{k} crashed"));
                    }
                }
                1 => {
                    if let Some(p) = &procs[k] {
                        let s = p.tree.session_id();
                        world.lock().expire(s);
                    }
                }
                2 => {
                    if let Some(p) = &procs[k] {
                        let d = 500 + rng.below(6000) as u64;
                        p.tree.pause_until(now + Duration::from_millis(d));
                        world.lock().trace(format!("p{k} paused {d} ms"));
                        if d > SESSION_TIMEOUT_MS {
                            let (w, s) = (world.clone(), p.tree.session_id());
                            tokio::spawn(async move {
                                tokio::time::sleep(Duration::from_millis(SESSION_TIMEOUT_MS)).await;
                                w.lock().expire(s);
                            });
                        }
                    }
                }
                3 | 4 => {
                    // Requeue the failed jobs of a batch: all at once, or one.
                    if let Some(b) = pick(&rng, &bids) {
                        if rng.below(2) == 0 {
                            // Each job is requeued in its own commit, and each may reopen
                            // the batch: a report may come between two of them (Lading's
                            // Reporting waits `report_settle_s` for them; this one does not).
                            if let Some(r) =
                                admin(|| admin_engine.requeue_failed(&b, None, None)).await
                            {
                                *reopened.entry(b.to_string()).or_default() +=
                                    r.iter().filter(|(_, r)| r.is_ok()).count() as u32;
                            }
                        } else if let Some(info) = admin(|| admin_engine.batch(&b)).await
                            && let Some(j) =
                                info.jobs.get("batch-failed").and_then(|f| pick(&rng, f))
                            && admin(|| admin_engine.requeue_job(&j, None)).await.is_some()
                        {
                            *reopened.entry(b.to_string()).or_default() += 1;
                        }
                    }
                }
                5 => {
                    if let Some((_, j)) = any_job(&rng, &admin_engine, &bids).await
                        && admin(|| admin_engine.hold_job(&j)).await.is_some()
                    {
                        held.push((j, now + Duration::from_millis(rng.below(4000) as u64)));
                    }
                }
                6 => {
                    if let Some((b, j)) = any_job(&rng, &admin_engine, &bids).await {
                        deleted_from.insert(b.to_string());
                        if admin(|| admin_engine.delete_job(&j))
                            .await
                            .flatten()
                            .is_some()
                        {
                            *reopened.entry(b.to_string()).or_default() += 1;
                        }
                    }
                }
                8 => {
                    // The fixity checker reads every recorded copy back, under the faults:
                    // it may fail, but never call a good copy bad or missing.
                    if let Ok(a) =
                        lading_ingest::fixity::check(&admin_ingest, None, None, None).await
                    {
                        for f in a.findings {
                            world
                                .lock()
                                .violation(format!("fixity: a good copy reported: {f}"));
                        }
                    }
                }
                10 => {
                    // A storage node goes down for a while (up to 20 s), and comes back by
                    // itself: work on it waits, using no attempt, and resumes.
                    let n = rng.below(2);
                    let until = clock.now_ms() + 1_000 + rng.below(19_000) as u64;
                    sim.buckets.outage[n].store(until, std::sync::atomic::Ordering::Relaxed);
                    world
                        .lock()
                        .trace(format!("node {} down until {until}", n + 1));
                }
                9 => {
                    if let Some(r) = ask_access(&rng, &admin_engine, &admin_ingest, &bids).await {
                        world
                            .lock()
                            .trace(format!("access {} asked for {} v{}", r.1, r.2, r.3));
                        asked.push(r);
                    }
                }
                7 if queue_paused_until.is_none() => {
                    admin(|| admin_engine.pause_queue("ingest")).await;
                    queue_paused_until = Some(now + Duration::from_millis(rng.below(3000) as u64));
                }
                _ => {}
            }
        }
    }
    // The faults stop (the tree's, the buckets' and the payload server's); everything held
    // is let go and every process is up.
    for (_, place, bytes) in std::mem::take(&mut late) {
        payloads.put(&place, &bytes);
    }
    world.lock().faults = None;
    sim.buckets
        .faults
        .store(false, std::sync::atomic::Ordering::Relaxed);
    for n in sim.buckets.outage.iter() {
        n.store(0, std::sync::atomic::Ordering::Relaxed);
    }
    world.lock().trace("faults stop".into());
    for (j, _) in std::mem::take(&mut held) {
        admin(|| admin_engine.release_job(&j)).await;
    }
    admin(|| admin_engine.resume_queue("ingest")).await;
    for (k, p) in procs.iter_mut().enumerate() {
        if p.is_none() {
            *p = Some(sim.start(k));
        }
    }
    let open = not_ended(
        &admin_engine,
        &bids,
        Duration::from_millis(LIVENESS_MS),
        Duration::from_millis(500),
        true,
    )
    .await;
    if !open.is_empty() {
        world.lock().violation(format!(
            "liveness: {} s after the faults stopped, not ended: {}",
            LIVENESS_MS / 1000,
            open.join(", ")
        ));
    }
    // The schedule ticks on once the faults stop (within two of its intervals and the
    // monitors' longest wait), and is removed; then every generic job ends (finished, or
    // failed after its attempts), and none was finished by two acceptances.
    let faults_stopped = clock.now_ms();
    let ticked = still_open(
        Duration::from_secs(2 * SCHEDULE_EVERY_S + 1),
        Duration::from_millis(500),
        || async {
            match admin_generic(|| admin_jobs.schedules(GENERIC_TYPE)).await {
                Some(list) if list.iter().any(|(_, s)| s.last_tick_ms > faults_stopped) => vec![],
                Some(list) => vec![format!("{list:?}")],
                None => vec!["unreadable".into()],
            }
        },
    )
    .await;
    if !ticked.is_empty() {
        world.lock().violation(format!(
            "liveness: schedule {SCHEDULE} did not tick within {} s after the faults stopped: {}",
            2 * SCHEDULE_EVERY_S + 1,
            ticked.join(", ")
        ));
    }
    admin_generic(|| admin_jobs.remove_schedule(GENERIC_TYPE, SCHEDULE)).await;
    let generic_open = generic_not_ended(&admin_jobs, Duration::from_millis(LIVENESS_MS)).await;
    if !generic_open.is_empty() {
        world.lock().violation(format!(
            "liveness: generic jobs not ended {} s after the faults stopped: {}",
            LIVENESS_MS / 1000,
            generic_open.join(", ")
        ));
    }
    let twice: Vec<String> = sim
        .outside
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .generic_done
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, n)| format!("{id} ({n} times)"))
        .collect();
    if !twice.is_empty() {
        world.lock().violation(format!(
            "generic jobs finished successfully by more than one acceptance: {}",
            twice.join(", ")
        ));
    }
    // Wake-ups: the deployment, idle now, takes a new one-job batch through at once.
    if open.is_empty() {
        let mut sub = Map::new();
        sub.insert("batchID".into(), json!(format!("sim-{seed}-probe")));
        sub.insert("submitter".into(), json!("probe"));
        sub.insert("profile".into(), json!(PROFILE));
        sub.insert("sim_jobs".into(), json!(1));
        sub.insert("sim_probe".into(), json!(true));
        if let Some(bid) = admin(|| admin_engine.create_batch(submission(&sub))).await {
            world
                .lock()
                .trace(format!("submitted the wake-up probe {bid}"));
            let late = not_ended(
                &admin_engine,
                std::slice::from_ref(&bid),
                Duration::from_millis(PROBE_MS),
                Duration::from_millis(50),
                false,
            )
            .await;
            if !late.is_empty() {
                world.lock().violation(format!(
                    "wake-ups: an idle deployment did not take the one-job batch through within {} s: {}",
                    PROBE_MS / 1000,
                    late.join(", ")
                ));
            }
        }
    }
    // The event stream: every transition the tree's statuses show since the stream began was
    // sent to its client, however often it went away and came back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    events_stop.stop();
    let _ = events.await;
    if open.is_empty() {
        // The client has ended: what it received is all there is.
        let w = std::mem::take(&mut *watched.lock().unwrap_or_else(|p| p.into_inner()));
        let mut missed = Vec::new();
        if w.following {
            for b in &bids {
                let Some(info) = admin(|| admin_engine.batch(b)).await else {
                    continue;
                };
                let mut statuses = vec![(b.to_string(), info.status.extra.clone())];
                for j in info.jobs.values().flatten() {
                    if let Some(job) = admin(|| admin_engine.job(j)).await {
                        statuses.push((j.to_string(), job.status.extra.clone()));
                    }
                }
                for (id, extra) in statuses {
                    for e in lading_engine::history(&extra) {
                        let f = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default();
                        let at = lading_core::time::parse_ts(f("at")).unwrap_or(0);
                        let key = (id.clone(), f("to").to_string(), f("at").to_string());
                        if at >= w.from_ms && !w.seen.contains(&key) {
                            missed.push(format!("{id} to {} at {}", f("to"), f("at")));
                        }
                    }
                }
            }
        }
        // A client back at an id the hub still kept is sent exactly what followed it.
        for (back_at, first) in &w.kept_next {
            let Some(first) = first else { continue };
            let followed = w
                .reference
                .iter()
                .position(|id| id == back_at)
                .and_then(|i| w.reference.get(i + 1));
            if followed.is_some_and(|f| f != first) {
                missed.push(format!(
                    "back at {back_at}, sent {first} first, where {followed:?} followed it"
                ));
            }
        }
        if !missed.is_empty() {
            world.lock().violation(format!(
                "events: {} transitions never sent to the client, or sent out of order \
                 ({} comebacks, {} of them sent from the hub's ring; {} resets), such as {:?}",
                missed.len(),
                w.resumes,
                w.kept_resumes,
                w.resets,
                &missed[..missed.len().min(5)]
            ));
        }
    }
    // No space stays reserved once every batch has ended: a reservation lasts until its
    // job's download ends, whichever way the job left (a delete and a purge included).
    if open.is_empty()
        && let Some(left) = admin(|| admin_engine.reservations()).await
        && !left.is_empty()
    {
        let jobs: Vec<&String> = left.iter().map(|(j, _)| j).collect();
        world.lock().violation(format!(
            "space: reservations left after every batch ended, of {jobs:?}"
        ));
    }
    // The reports: one content per key, each batch's last report listing every job it kept,
    // and no more reports than its first plus one per reopening. The callbacks: one content
    // per key, and one for every job that completed.
    let mut jobs = 0;
    let mut stored = 0;
    let mut unpacked = [0; 3];
    {
        let (mails, callbacks, wrong) = {
            let o = sim.outside.lock().unwrap_or_else(|p| p.into_inner());
            (o.mails.clone(), o.callbacks.clone(), o.wrong.clone())
        };
        let mut found = wrong;
        for (key, (content, _)) in mails.iter().chain(&callbacks) {
            if content.get("conflict").is_some() {
                found.push(format!("{key} delivered with two contents: {content}"));
            }
        }

        for b in &bids {
            let Ok(info) = admin_engine.batch(b).await else {
                continue;
            };
            let mut kept: Vec<String> = ["batch-completed", "batch-failed"]
                .iter()
                .flat_map(|f| info.jobs.get(*f).cloned().unwrap_or_default())
                .map(|j| j.to_string())
                .collect();
            kept.sort();
            jobs += info.jobs.values().map(Vec::len).sum::<usize>();
            if open.is_empty() {
                for j in info.jobs.get("batch-completed").into_iter().flatten() {
                    let called = format!(":{j}:completed:");
                    if !callbacks.keys().any(|k| k.contains(&called)) {
                        found.push(format!(
                            "job {j} of {b} completed with no callback delivered"
                        ));
                    }
                }
            }
            // The report mail's Message-ID names the batch by its Merritt batch id.
            let named = info
                .submission
                .get("batchID")
                .and_then(Value::as_str)
                .unwrap_or(b.as_str());
            let prefix = format!("<lading.{named}.report-");
            let mine: Vec<(u64, &Value)> = mails
                .iter()
                .filter_map(|(k, (c, _))| {
                    let n = k.strip_prefix(&prefix)?.split('@').next()?;
                    Some((n.parse().ok()?, c))
                })
                .collect();
            let allowed = 1 + reopened.get(b.as_str()).copied().unwrap_or(0) as usize;
            if mine.len() > allowed {
                found.push(format!(
                    "batch {b} reported {} times, reopened {} times",
                    mine.len(),
                    allowed - 1
                ));
            }
            if let Some((n, last)) = mine.iter().max_by_key(|(n, _)| *n) {
                let mut listed = listed_in_mail(last);
                listed.sort();
                // Every job the batch kept is in its last report; a job the report lists
                // and the batch no longer keeps was deleted since (which reopens nothing).
                let processing = info
                    .jobs
                    .get("batch-processing")
                    .map(|f| f.iter().map(JobId::to_string).collect::<Vec<_>>())
                    .unwrap_or_default();
                let missing: Vec<&String> = kept.iter().filter(|j| !listed.contains(j)).collect();
                let extra: Vec<&String> =
                    listed.iter().filter(|j| processing.contains(j)).collect();
                if (!missing.is_empty() || !extra.is_empty()) && open.is_empty() {
                    found.push(format!(
                        "batch {b}: report {n} lacks {missing:?} and lists {extra:?} still in processing"
                    ));
                }
            } else if open.is_empty() {
                found.push(format!(
                    "batch {b} ended ({}: {}) with no report delivered",
                    info.status.status,
                    info.status.message.as_deref().unwrap_or_default()
                ));
            }
        }
        if open.is_empty() {
            // A batch cleanup has begun to purge may be seen with some of its jobs only.
            let mut skip = deleted_from.clone();
            skip.extend(world.lock().purged_from.iter().cloned());
            found.extend(one_job_per_object(&payloads, &admin_engine, &bids, &skip).await);
            found.extend(no_attempt_spent_on_an_outage(&admin_engine, &bids).await);
            let (bad, checked) = stored_as_given(
                sim.work.path(),
                &payloads,
                &admin_engine,
                &bids,
                &sim.buckets,
                &mut unpacked,
            )
            .await;
            found.extend(bad);
            stored = checked;
            found.extend(fixity_finds_rot(&admin_ingest, &sim.buckets, &rng, &world).await);
            found.extend(
                access_served(&sim, &rng, &admin_engine, &admin_ingest, &bids, asked).await,
            );
            // An upload a replaced attempt began after the winner's last sweep, and could
            // not abort, stays open until the scheduled audit finds it abandoned: given that
            // long and a few of the audit's shares, none may be left.
            let before = uploads_left_open(&sim.buckets, true).await;
            world.lock().trace(format!(
                "storage: {} uploads open at the end, {} of them under a stored version",
                before.0, before.1
            ));
            tokio::time::sleep(Duration::from_secs(
                ABORT_UPLOADS_AFTER_S + 3 * AUDIT_EVERY_S,
            ))
            .await;
            found.extend(uploads_left_open(&sim.buckets, false).await.2);
            // Working folders: a process keeps none of a job cleanup removed (the process
            // that cleaned up removed its own; each other's sweep, its).
            if sim.retention_hours == 0 {
                found.extend(folders_of_removed_jobs(&sim, &admin_engine, opts.nodes).await);
            }
        }
        let mut st = world.lock();
        for f in found {
            st.violation(f);
        }
    }
    let a = *sim.answers.lock().unwrap_or_else(|p| p.into_inner());
    world.lock().trace(format!(
        "payload server: {} whole answers, {} unavailable, {} not found, {} reset, {} dripping",
        a.whole, a.unavailable, a.not_found, a.reset, a.dripping
    ));
    for p in procs.iter().flatten() {
        p.stop.abort();
    }
    for p in procs.into_iter().flatten() {
        let _ = tokio::time::timeout(Duration::from_secs(30), p.task).await;
    }
    let st = world.lock();
    Run {
        seed,
        sim_ms: start.elapsed().as_millis() as u64,
        steps: st.commits,
        jobs,
        stored,
        unpacked,
        violations: st.violations.clone(),
        tail: st.tail.iter().cloned().collect(),
        trace_hash: st.trace_hash,
        full: st.full.clone(),
    }
}

/// The jobs a report mail lists: its body's indented lines, each starting with a job's id
/// (under "Completed (n):" and "Failed (n):").
fn listed_in_mail(mail: &Value) -> Vec<String> {
    let body = mail.get("body").and_then(Value::as_str).unwrap_or_default();
    body.lines()
        .filter_map(|l| l.strip_prefix("  "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn pick<T: Clone>(rng: &Seeded, from: &[T]) -> Option<T> {
    (!from.is_empty()).then(|| from[rng.below(from.len())].clone())
}

/// A submission from the simulator's fields (all of them strings, numbers or booleans).
fn submission(fields: &Map<String, Value>) -> lading_core::layout::BatchSubmission {
    fields
        .clone()
        .try_into()
        .expect("the simulator's fields make a submission")
}

/// Once all is quiet: a few stored copies go bad on the nodes' disks. The fixity checker
/// must find exactly those, repair each from the other node, and find nothing after.
async fn fixity_finds_rot(
    ingest: &lading_ingest::Ingest,
    buckets: &Buckets,
    rng: &Seeded,
    world: &World,
) -> Vec<String> {
    use lading_ingest::bucket::Bucket;
    use std::collections::BTreeSet;
    let mut found = Vec::new();
    // Nothing has gone bad yet: neither the checker's calls under the faults nor the
    // scheduled audit may have recorded a copy bad or missing.
    match ingest.inventory.run(|i| i.copies(None, None)).await {
        Ok(all) => {
            let checked = all.iter().filter(|c| c.checked.is_some()).count();
            world.lock().trace(format!(
                "fixity: before any copy goes bad, {} copies recorded, {checked} checked",
                all.len()
            ));
            for c in all
                .iter()
                .filter(|c| c.status != "ok" && c.checked.is_some())
            {
                found.push(format!(
                    "fixity: a good copy recorded {}: node {} {} v{} {}",
                    c.status, c.node, c.ark, c.version, c.path
                ));
            }
        }
        Err(e) => found.push(format!("fixity: the inventory's copies unreadable: {e}")),
    }
    let mut rotted = BTreeSet::new();
    for _ in 0..2 {
        let k = rng.below(2);
        let keys: Vec<String> = buckets.nodes[k]
            .keys(None)
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|m| m.location.to_string())
            .filter(|key| key.contains("|producer/"))
            .collect();
        let Some(key) = keys.get(rng.below(keys.len().max(1))) else {
            continue;
        };
        // lading/ARK|V|producer/PATH
        let mut parts = key.trim_start_matches("lading/").splitn(3, '|');
        let (Some(ark), Some(v), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Ok(v) = v.parse::<u32>() else { continue };
        // Only copies the inventory records (a version a failed job left is not audited).
        let a = ark.to_string();
        let recorded = ingest
            .inventory
            .run(move |i| i.copies(Some(k as u32 + 1), Some(&a)))
            .await
            .unwrap_or_default()
            .iter()
            .any(|c| c.version == v && c.path == path);
        // One copy of a file at most: with both gone bad, nothing could repair it.
        if !recorded
            || rotted
                .iter()
                .any(|(_, a, w, p)| a == ark && *w == v && p == path)
        {
            continue;
        }
        if buckets.nodes[k].rot(key, b"rot".to_vec()).await.is_ok() {
            rotted.insert((k as u32 + 1, ark.to_string(), v, path.to_string()));
        }
    }
    let named = |a: &lading_ingest::fixity::Audit| -> BTreeSet<(u32, String, u32, String)> {
        a.findings
            .iter()
            .map(|f| (f.node, f.ark.clone(), f.version, f.path.clone()))
            .collect()
    };
    match lading_ingest::fixity::repair(ingest, None, None).await {
        Ok(a) => {
            world.lock().trace(format!(
                "fixity: {} copies checked; gone bad {rotted:?}; found {}, repaired {}",
                a.checked,
                a.findings.len(),
                a.findings
                    .iter()
                    .filter(|f| f.status.starts_with("repaired"))
                    .count()
            ));
            if named(&a) != rotted {
                found.push(format!(
                    "fixity: found {:?}, the copies gone bad are {rotted:?}",
                    named(&a)
                ));
            }
            for f in a
                .findings
                .iter()
                .filter(|f| !f.status.starts_with("repaired"))
            {
                found.push(format!("fixity: not repaired: {f}"));
            }
        }
        Err(e) => found.push(format!("fixity: the check failed with no faults on: {e}")),
    }
    match lading_ingest::fixity::check(ingest, None, None, None).await {
        Ok(a) if a.findings.is_empty() => {}
        Ok(a) => found.push(format!("fixity: after the repair, still {:?}", named(&a))),
        Err(e) => found.push(format!("fixity: the check after the repair failed: {e}")),
    }
    found
}

/// An access request: its id, the object and version, and the version's files as the
/// inventory records them (path → SHA-256).
type Asked = (
    AccessQueue,
    lading_core::layout::AccessId,
    String,
    u32,
    BTreeMap<String, String>,
);

/// An access request for a version some completed payload job stored.
async fn ask_access(
    rng: &Seeded,
    admin_engine: &Engine,
    ingest: &lading_ingest::Ingest,
    bids: &[BatchId],
) -> Option<Asked> {
    let b = pick(rng, bids)?;
    let info = admin(|| admin_engine.batch(&b)).await?;
    let j = pick(rng, info.jobs.get("batch-completed")?)?;
    let jid = j.to_string();
    let v = ingest
        .inventory
        .run(move |i| i.job_versions(&jid))
        .await
        .ok()?
        .into_iter()
        .next()?;
    let token = json!({ "ark": v.ark, "version": v.version, "requester": "sim" });
    let queue = [AccessQueue::Small, AccessQueue::Large][rng.below(2)];
    let id = admin(|| admin_engine.create_access(queue, &token)).await?;
    let files = v.files.into_iter().map(|(p, _, sha)| (p, sha)).collect();
    Some((queue, id, v.ark, v.version, files))
}

/// Every access request ended, and each that completed holds the version's files as the
/// inventory records them, byte for byte; with the faults over, more are asked for, and
/// each must complete.
async fn access_served(
    sim: &Sim,
    rng: &Seeded,
    admin_engine: &Engine,
    ingest: &lading_ingest::Ingest,
    bids: &[BatchId],
    mut asked: Vec<Asked>,
) -> Vec<String> {
    let during = asked.len();
    for _ in 0..3 {
        asked.extend(ask_access(rng, admin_engine, ingest, bids).await);
    }
    let mut found = Vec::new();
    let ended = |s: &lading_core::AccessState| {
        matches!(
            s,
            lading_core::AccessState::Completed | lading_core::AccessState::Failed
        )
    };
    // Cleanup removes a finished request (and its zip) once the retention has passed: a
    // request gone since is not looked at further (only a finished one is removed).
    let purged = |queue: AccessQueue, id: lading_core::layout::AccessId| async move {
        matches!(
            admin_engine.access(queue, &id).await,
            Err(lading_engine::EngineError::NoAccess(_))
        )
    };
    for (k, (queue, id, ark, version, want)) in asked.iter().enumerate() {
        let mut info = None;
        for _ in 0..120 {
            info = admin(|| admin_engine.access(*queue, id)).await;
            if info.as_ref().is_some_and(|i| ended(&i.status.status)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let Some(info) = info else {
            if !purged(*queue, id.clone()).await {
                found.push(format!("access {id}: unreadable"));
            }
            continue;
        };
        match info.status.status {
            lading_core::AccessState::Completed => {}
            lading_core::AccessState::Failed if k < during => continue,
            s => {
                found.push(format!(
                    "access {id} for {ark} v{version}: {s:?} ({}) with no faults on",
                    info.status.message.unwrap_or_default()
                ));
                continue;
            }
        }
        let zip = (0..8)
            .map(|p| {
                sim.work
                    .path()
                    .join(format!("p{p}-data"))
                    .join("access")
                    .join(format!("{}-{id}.zip", queue.name()))
            })
            .find(|p| p.exists());
        let got = zip.as_deref().map(zip_entries);
        // Exactly the files the inventory lists, but the version's own record at its top
        // (`lading-version.json`, Lading's: served from no copy, wherever it is stored).
        let served: Vec<_> = want
            .iter()
            .filter(|(p, _)| p.as_str() != lading_ingest::files::VERSION_FILE)
            .collect();
        match got {
            Some(Ok(got))
                if !served.is_empty()
                    && got.len() == served.len()
                    && served.iter().all(|(p, sha)| got.get(p.as_str()) == Some(sha)) => {}
            None | Some(Err(_)) if purged(*queue, id.clone()).await => {}
            other => found.push(format!(
                "access {id} for {ark} v{version} completed with {other:?}, the inventory records {want:?}"
            )),
        }
    }
    found
}

/// The processes' working folders of jobs no longer in the tree, each a violation once a
/// working-folder sweep has run with the retention at 0 (with the default of 30 days, a
/// folder of a job purged by an admin stays that long: another tree may own it).
async fn folders_of_removed_jobs(sim: &Sim, admin_engine: &Engine, nodes: usize) -> Vec<String> {
    let mut found = Vec::new();
    for p in 0..nodes {
        let root = sim.work.path().join(format!("p{p}"));
        let mut names: Vec<JobId> = std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| JobId::parse(e.file_name().to_str()?).ok())
            .collect();
        names.sort();
        for j in names {
            if let Err(lading_engine::EngineError::NoJob(_)) = admin_engine.job(&j).await {
                found.push(format!(
                    "working folders: p{p} keeps {j}, a job removed from the tree"
                ));
            }
        }
    }
    found
}

/// A zip's entries: name → SHA-256 of its bytes.
fn zip_entries(p: &std::path::Path) -> Result<BTreeMap<String, String>, String> {
    use sha2::Digest;
    use std::io::Read;
    let mut z = zip::ZipArchive::new(std::fs::File::open(p).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let mut out = BTreeMap::new();
    for i in 0..z.len() {
        let mut e = z.by_index(i).map_err(|e| e.to_string())?;
        let name = e.name().map_err(|e| e.to_string())?.to_string();
        let mut b = Vec::new();
        e.read_to_end(&mut b).map_err(|e| e.to_string())?;
        let h = sha2::Sha256::digest(&b);
        out.insert(name, h.iter().map(|x| format!("{x:02x}")).collect());
    }
    Ok(out)
}

/// What is wrong with job `j`'s version on each of `nodes`: each must hold exactly `files`
/// (its payload's, path → SHA-256).
async fn held_on(
    nodes: &[lading_ingest::nodes::Node],
    j: &JobId,
    ark: &str,
    version: u32,
    files: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut found = Vec::new();
    for n in nodes {
        let held = on_node(n, ark, version).await;
        if held.as_ref() != Ok(files) {
            found.push(format!(
                "storage: job {j}'s {ark} v{version} on {} holds {held:?}, its payload is {files:?}",
                n.name()
            ));
        }
    }
    found
}

/// A version's producer files on node `n`, as its record lists them, each read back whole
/// (its SHA-256 the record's): path → SHA-256, or what is wrong.
async fn on_node(
    n: &lading_ingest::nodes::Node,
    ark: &str,
    version: u32,
) -> Result<BTreeMap<String, String>, String> {
    // As replication and the fixity checker read it: on a folder node, the version's own
    // record and the files in its folder.
    let record = lading_ingest::replicate::version_on(n, ark, version)
        .await
        .map_err(|e| e.what)?;
    let producer = format!("{}/", lading_ingest::stages::PRODUCER);
    let mut out = BTreeMap::new();
    for f in &record.files {
        let (at, rel) = f.stored_at(version);
        let read = n.digest(ark, at, rel, None).await.map_err(|e| e.what)?;
        match read {
            Some(c) if c.sha256 == f.sha256 && c.size == f.size => {}
            other => {
                return Err(format!(
                    "{} reads {other:?}, its record says {}",
                    f.path, f.sha256
                ));
            }
        }
        if let Some(p) = f.path.strip_prefix(&producer) {
            out.insert(p.to_string(), f.sha256.clone());
        }
    }
    Ok(out)
}

/// The versions with a record on a bucket, by object, ascending.
async fn versions_on(b: &lading_ingest::bucket::Memory) -> BTreeMap<String, Vec<u32>> {
    use lading_ingest::bucket::Bucket;
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let record = format!("|{}", lading_ingest::nodes::VERSION_RECORD);
    for m in b.keys(None).await.unwrap_or_default() {
        let key = m.location.to_string();
        let Some(head) = key
            .strip_prefix("lading/")
            .and_then(|k| k.strip_suffix(&record))
        else {
            continue;
        };
        if let Some((ark, v)) = head.rsplit_once('|')
            && let Ok(v) = v.parse()
        {
            out.entry(ark.to_string()).or_default().push(v);
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// Multipart uploads still open: how many, how many of them under a stored version (one
/// with its record), and, unless `counting`, a violation for each (parts stored and paid for
/// that no object holds). Once every batch has ended and the scheduled audit has had time
/// to abort the abandoned ones, none may be open.
async fn uploads_left_open(buckets: &Buckets, counting: bool) -> (usize, usize, Vec<String>) {
    use lading_ingest::bucket::Bucket;
    let (mut open_n, mut stored_n) = (0, 0);
    let mut found = Vec::new();
    for (n, b) in buckets.nodes.iter().enumerate() {
        let mut marker = None;
        loop {
            match b.list_uploads("lading/", marker.take()).await {
                Ok((open, next)) => {
                    for u in open {
                        // `lading/ARK|V|PATH`: the version's record is `lading/ARK|V|` + it.
                        let version = u.key.rsplit_once('|').map_or("", |(v, _)| v);
                        let record = format!("{version}|{}", lading_ingest::nodes::VERSION_RECORD);
                        let stored = match object_store::path::Path::parse(&record) {
                            Ok(k) => b.head(&k).await.is_ok(),
                            Err(_) => false,
                        };
                        open_n += 1;
                        stored_n += usize::from(stored);
                        if !counting {
                            found.push(format!(
                                "storage: multipart upload {} of {} (begun at {:?}) left open on \
                                 node {}{}",
                                u.id,
                                u.key,
                                u.initiated_ms,
                                n + 1,
                                if stored {
                                    " under a stored version"
                                } else {
                                    ""
                                }
                            ));
                        }
                    }
                    match next {
                        Some(m) => marker = Some(m),
                        None => break,
                    }
                }
                Err(e) => {
                    found.push(format!(
                        "storage: node {}'s open uploads cannot be listed: {}",
                        n + 1,
                        e.what
                    ));
                    break;
                }
            }
        }
    }
    (open_n, stored_n, found)
}

/// Each payload batch's jobs, one per object its manifest lists, once intake made any (but
/// in the batches of `deleted_from`: an admin's delete of an ended job removes it, and
/// cleanup purges a batch's jobs one by one before the batch); after an
/// intake that gave up partway, a job for some of them, none twice.
/// A job that failed after using up its attempts on a storage node that was down (refused,
/// unavailable): an outage must cost time, never attempts (SPEC §11).
async fn no_attempt_spent_on_an_outage(admin_engine: &Engine, bids: &[BatchId]) -> Vec<String> {
    let mut found = Vec::new();
    for b in bids {
        let Some(info) = admin(|| admin_engine.batch(b)).await else {
            continue;
        };
        for j in info.jobs.get("batch-failed").into_iter().flatten() {
            let Some(job) = admin(|| admin_engine.job(j)).await else {
                continue;
            };
            let msg = job.status.message.unwrap_or_default();
            // A node's outage refuses every request at the door ("is down"), which a stage
            // must classify as unavailable; the nodes' random faults (a 503, a lost answer)
            // are a request's bad luck and stay ordinary retries.
            let outage =
                msg.contains("the simulated node is down") || msg.contains("unavailable: ");
            if msg.contains("gave up after") && outage {
                found.push(format!("job {j}: an outage used up its attempts: {msg}"));
            }
        }
    }
    found
}

async fn one_job_per_object(
    payloads: &Payloads,
    admin_engine: &Engine,
    bids: &[BatchId],
    deleted_from: &std::collections::BTreeSet<String>,
) -> Vec<String> {
    let mut found = Vec::new();
    for b in bids.iter().filter(|b| !deleted_from.contains(b.as_str())) {
        let Some(info) = admin(|| admin_engine.batch(b)).await else {
            continue;
        };
        if let Some(listed) = info
            .submission
            .get("payload_url")
            .and_then(Value::as_str)
            .and_then(|u| payloads.listed.get(u))
        {
            let mut made = Vec::new();
            for j in info.jobs.values().flatten() {
                let Some(job) = admin(|| admin_engine.job(j)).await else {
                    continue;
                };
                if let Some(url) = job.configuration.get("payload_url").and_then(Value::as_str) {
                    made.push(url.to_string());
                }
            }
            made.sort();
            let mut want = listed.clone();
            want.sort();
            // An intake that gave up after making some jobs lets the batch go on with them,
            // and says so in the batch's history: then fewer, never others or twice.
            let stopped = serde_json::to_string(&info.status)
                .is_ok_and(|t| t.contains("intake stopped after making"));
            let twice = made.windows(2).any(|w| w[0] == w[1]);
            let fewer = made.iter().all(|u| want.binary_search(u).is_ok());
            if !made.is_empty() && (twice || !(made == want || stopped && fewer)) {
                found.push(format!(
                    "intake: batch {b} made jobs for {made:?}, its manifest lists {want:?}"
                ));
            }
        }
    }
    found
}

/// The objects of payload batches, as stored and recorded. Each job that completed stored one
/// version, recorded in the inventory, holding exactly its object's files (those of its own
/// payload, every byte) under the primary identifier its manifest gave. Over the whole
/// storage root, each object's versions run from 1 with no gap, each written by one job, and
/// no job wrote two.
async fn stored_as_given(
    work: &std::path::Path,
    payloads: &Payloads,
    admin_engine: &Engine,
    bids: &[BatchId],
    buckets: &Buckets,
    unpacked: &mut [usize; 3],
) -> (Vec<String>, usize) {
    use lading_ingest::inventory::Inventory;
    let nodes = buckets.open();
    let folders = folder_nodes(work);
    let mut found = Vec::new();
    let mut checked = 0;
    let inventory = Inventory::new(lading_ingest::inventory::Location::Sqlite(
        work.join("inventory.db"),
    ));
    let listed = |dir: &std::path::Path| -> BTreeMap<String, String> {
        lading_ingest::files::list_files(dir)
            .unwrap_or_default()
            .into_iter()
            .map(|f| (f.path, f.sha256))
            .collect()
    };
    for b in bids {
        let Some(info) = admin(|| admin_engine.batch(b)).await else {
            continue;
        };
        for j in info.jobs.get("batch-completed").into_iter().flatten() {
            let Some(job) = admin(|| admin_engine.job(j)).await else {
                continue;
            };
            let Some(url) = job.configuration.get("payload_url").and_then(Value::as_str) else {
                continue;
            };
            let Some(want) = payloads.expected.get(url) else {
                found.push(format!(
                    "storage: job {j} fetched {url}, which no payload names"
                ));
                continue;
            };
            let versions = match inventory.job_versions(j.as_str()) {
                Ok(v) => v,
                Err(e) => {
                    found.push(format!("storage: the inventory cannot list job {j}: {e}"));
                    continue;
                }
            };
            checked += 1;
            let [v] = &versions[..] else {
                found.push(format!(
                    "storage: job {j} completed with {} versions recorded",
                    versions.len()
                ));
                continue;
            };
            if let Some(ark) = &want.ark
                && *ark != v.ark
            {
                found.push(format!(
                    "storage: job {j} stored {} though its manifest gave {ark}",
                    v.ark
                ));
            }
            // The depositor's files (beside them: the version's manifest and record).
            let producer = format!("{}/", lading_ingest::stages::PRODUCER);
            let recorded: BTreeMap<String, String> = v
                .files
                .iter()
                .filter_map(|(p, _, sha)| Some((p.strip_prefix(&producer)?.into(), sha.clone())))
                .collect();
            if recorded != want.files {
                found.push(format!(
                    "storage: job {j} recorded {recorded:?} for {} v{}, its payload is {:?}",
                    v.ark, v.version, want.files
                ));
            } else if let Some(k) = [".zip", ".tar", ".tar.gz"]
                .iter()
                .position(|ext| url.ends_with(ext))
            {
                unpacked[k] += 1;
            }
            let path = inventory.version_path(&v.ark, v.version).ok().flatten();
            if path.as_deref().is_some_and(|p| p.starts_with("s3://")) {
                // On both nodes: the version's record and every file's bytes.
                found.extend(held_on(&nodes, j, &v.ark, v.version, &want.files).await);
                continue;
            }
            if path
                .as_deref()
                .is_some_and(|p| std::path::Path::new(p).starts_with(work.join("node3")))
            {
                // On folder node 3, read through the node as for a bucket; and its replica
                // on node 4.
                found.extend(held_on(&folders, j, &v.ark, v.version, &want.files).await);
            }
            let on_disk = path
                .as_deref()
                .map(|p| listed(&std::path::Path::new(p).join(lading_ingest::stages::PRODUCER)));
            if on_disk.as_ref() != Some(&want.files) {
                found.push(format!(
                    "storage: job {j}'s {} v{} holds {on_disk:?} at {path:?}, its payload is {:?}",
                    v.ark, v.version, want.files
                ));
            }
        }
    }
    // The whole root: versions 1..n, one job each, no job twice.
    let root = work.join("storage");
    let mut writers: BTreeMap<String, String> = BTreeMap::new();
    // The same on the primary node, whose every recorded version the replica holds too, and
    // the replica nothing the primary lacks. Between the two: a version whose job stopped
    // short of the inventory (it gave up on its last attempt at Storing, its record written
    // and the answer lost, or at Recording, its copy made) until an admin's requeue
    // finishes the job.
    let within = |a: &BTreeMap<String, Vec<u32>>, b: &BTreeMap<String, Vec<u32>>| {
        a.iter()
            .all(|(ark, vs)| vs.iter().all(|v| b.get(ark).is_some_and(|w| w.contains(v))))
    };
    let recorded = |on: &BTreeMap<String, Vec<u32>>| -> BTreeMap<String, Vec<u32>> {
        on.iter()
            .map(|(ark, vs)| {
                let known: Vec<u32> = inventory
                    .versions(ark)
                    .unwrap_or_default()
                    .iter()
                    .map(|(v, _, _)| *v)
                    .collect();
                (
                    ark.clone(),
                    vs.iter()
                        .copied()
                        .filter(|v| known.contains(v))
                        .collect::<Vec<_>>(),
                )
            })
            .filter(|(_, vs)| !vs.is_empty())
            .collect()
    };
    let mut primary: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (k, n) in nodes.iter().enumerate() {
        let held = versions_on(&buckets.nodes[k]).await;
        if k == 0 {
            primary = held.clone();
            for (ark, versions) in &held {
                if *versions != (1..=versions.len() as u32).collect::<Vec<_>>() {
                    found.push(format!(
                        "storage: {ark} has versions {versions:?} on {}",
                        n.name()
                    ));
                }
                for v in versions {
                    let stored = lading_ingest::stages::read_node_version(n, ark, *v).await;
                    let Ok(Some(stored)) = stored else {
                        found.push(format!("storage: {ark} v{v} on {}: {stored:?}", n.name()));
                        continue;
                    };
                    let here = format!("{ark} v{v}");
                    if let Some(before) = writers.insert(stored.stored.job.clone(), here.clone()) {
                        found.push(format!(
                            "storage: job {} stored both {before} and {here}",
                            stored.stored.job
                        ));
                    }
                }
            }
        } else if !within(&recorded(&primary), &held) || !within(&held, &primary) {
            found.push(format!(
                "storage: {} holds versions {held:?}, the primary {primary:?}, of which the inventory records {:?}",
                n.name(),
                recorded(&primary)
            ));
        }
    }
    // The storage root, and folder node 3 (a primary) laid out as it is.
    let objects: Vec<std::path::PathBuf> = [root, work.join("node3")]
        .iter()
        .flat_map(|root| {
            let mut objects: Vec<std::path::PathBuf> = std::fs::read_dir(root)
                .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
                .unwrap_or_default();
            objects.sort();
            objects
        })
        .collect();
    for o in objects {
        let versions = lading_ingest::files::versions(&o).unwrap_or_default();
        if versions != (1..=versions.len() as u32).collect::<Vec<_>>() {
            found.push(format!(
                "storage: {} has versions {versions:?}",
                o.display()
            ));
        }
        for v in versions {
            let at = o.join(format!("v{v}"));
            let stored = std::fs::read(at.join(lading_ingest::files::VERSION_FILE))
                .ok()
                .and_then(|b| {
                    serde_json::from_slice::<lading_ingest::files::StoredVersion>(&b).ok()
                });
            let Some(stored) = stored else {
                found.push(format!("storage: {} has no version record", at.display()));
                continue;
            };
            let here = format!("{} v{v}", stored.ark);
            if let Some(before) = writers.insert(stored.job.clone(), here.clone()) {
                found.push(format!(
                    "storage: job {} stored both {before} and {here}",
                    stored.job
                ));
            }
        }
    }
    (found, checked)
}
