//! One simulated deployment, run from a seed on simulated time.
//!
//! Several processes share the simulated tree, each a real [`Engine`] on its own session,
//! started by `lading_node::Node` as a real process of its role is (`role`: every stage,
//! access and the monitor; a worker of every stage; a worker of the file stages with
//! access and the monitor), so each runs what production runs: the real stage loops,
//! Lading's outbox deliverer, housekeeping (the finishing watch and sweep), the quota
//! waker, the announcer, stage metrics, and generic jobs (`lading-jobs`: the real activity
//! monitor, which also ticks schedules and applies retention, and the simulator's own
//! processor beside it; the type has a rate limit). A third of the batches
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
//! an idle deployment must take a new one-job batch through at once, and another process
//! must take a job whose holder's process crashed under it as soon as its lock goes;
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

mod checks;
mod config;
mod driver;
mod events;
mod stages;
mod verdict;
mod workload;
use crate::check::{QUOTA_LIMIT, QUOTA_PROFILE, SPACE_FREE, SPACE_KEEP, SPACE_MAX_JOB, SPACE_ROOT};
use crate::payload::{Answers, PayloadServer, Payloads, Place, Served};
use crate::tree::{EPOCH_MS, Faults, SimTree, World};
use checks::*;
use config::*;
pub use driver::run;
use driver::*;
use events::*;
use lading_core::layout::{AccessQueue, BatchId, JobId};
use lading_core::random::{Random, Seeded};
use lading_core::time::Clock;
use lading_core::{BatchState, BoxFuture, Event, JobState, Tree};
use lading_engine::{Effect, Engine, JobSpec};
use lading_worker::{BatchCtx, BatchStage, JobCtx, JobStage, Outcome, Shutdown, StageConfig};
use serde_json::{Map, Value, json};
use stages::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use workload::*;

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
/// The lock probe's `sim_probe` value, and the stage where its job's first handler hangs.
const LOCK_PROBE: &str = "lock";
const LOCK_PROBE_STAGE: JobState = JobState::Estimating;

/// The engine's clock on tokio's (paused, auto-advancing) time.
struct SimClock {
    start: tokio::time::Instant,
}

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        EPOCH_MS + self.start.elapsed().as_millis() as u64
    }
}

/// The inventory's clock: two days behind the processes' while the flag is set. Every
/// copy's last check (made when it was recorded, or by the last audit) then looks two days
/// old to the scheduled fixity audit, which takes copies unchecked for a day: each of its
/// ticks reads every recorded copy, under the faults. The run's end clears the flag for
/// its last wait ([`Sim::behind`]).
struct Behind(
    lading_core::time::SharedClock,
    Arc<std::sync::atomic::AtomicBool>,
);

impl Clock for Behind {
    fn now_ms(&self) -> u64 {
        let behind = self.1.load(std::sync::atomic::Ordering::Relaxed);
        let by = if behind { 2 * 86_400_000 } else { 0 };
        self.0.now_ms().saturating_sub(by)
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
    /// The session whose handler took the lock probe's job first (and hangs in it).
    lock_probe_holder: Option<u64>,
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

/// One simulated process.
struct Proc {
    tree: Arc<SimTree>,
    stop: lading_node::node::NodeHandle,
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
    /// The inventory's clock is two days behind ([`Behind`]). Cleared for the run's last
    /// wait (for an upload left open to be aborted): the faults are over, and the audit's
    /// ticks there, every copy read again at each, were 8% of a run. The first tick after
    /// reads each copy once more; the ticks after it find none due, and still abort what
    /// was left open.
    behind: Arc<std::sync::atomic::AtomicBool>,
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
        }))
        .with_stage_wrap(Arc::new(SimStages {
            dice: self.dice.clone(),
            outside: self.outside.clone(),
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
            lading_ingest::inventory::Inventory::new(ingest.cfg.inventory()).with_clock(Arc::new(
                Behind(ingest.engine.clock().clone(), self.behind.clone()),
            )),
        );
        ingest
    }

    /// Starts process `i` as a real process of its role starts ([`lading_node::Node`],
    /// see [`role`]), on its own session of the simulated tree, with the simulated world's
    /// handlers wrapped around its stages ([`SimStages`]) and the generic-jobs workload's
    /// processor beside them.
    async fn start(&mut self, i: usize) -> Proc {
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
        // Generic jobs (lading-jobs) on the same session.
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
        let (g, dice, outside) = (generic.clone(), self.dice.clone(), self.outside.clone());
        let processor: lading_node::node::Service = Box::new(move |sd| {
            Box::pin(async move {
                process_generic(g, dice, outside, sd).await;
                Ok(())
            })
        });
        let env = lading_node::node::NodeEnv {
            jobs: Some(generic),
            identity: Some(("sim".into(), i as u32)),
            services: vec![("generic-jobs processor", processor)],
            http: None,
        };
        let node = lading_node::node::Node::start_in(ingest, role(i), env)
            .await
            .expect("a simulated process starts");
        let handle = node.handle();
        // A crash aborts this task, and with it every service.
        let task = tokio::spawn(async move {
            let _ = node.run_open().await;
        });
        Proc {
            tree,
            stop: handle,
            task,
        }
    }
}

/// What process `i` of a deployment runs, as `lading worker --stages …` would: the first
/// every stage, both access queues and the generic-jobs monitor (with the fixity audit);
/// then, in turn, a worker of every stage, and a worker of the file stages (estimating to
/// recording) with the access queues and the monitor.
fn role(i: usize) -> lading_node::node::NodeSpec {
    use lading_node::node::NodeSpec;
    let every: Vec<String> = lading_ingest::STAGE_NAMES
        .iter()
        .map(|s| s.to_string())
        .collect();
    let access = vec![AccessQueue::Small, AccessQueue::Large];
    match i {
        0 => NodeSpec {
            stages: every,
            access,
            monitor: true,
            ..Default::default()
        },
        i if i % 2 == 1 => NodeSpec {
            stages: every,
            ..Default::default()
        },
        _ => NodeSpec {
            stages: every
                .iter()
                .skip_while(|s| *s != "estimating")
                .take_while(|s| *s != "notify")
                .cloned()
                .collect(),
            access,
            monitor: true,
            ..Default::default()
        },
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
            if e.kind == lading_engine::EffectKind::Mail {
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
