//! The ingest pipeline: submission, batch intake, the job stages (estimating through
//! notify), reporting, cleanup — each a handler for `lading-worker`, each doing real work
//! against real servers (HTTP for payloads and callbacks, the file system for working and
//! storage, SQLite or PostgreSQL for the inventory, SMTP for reports).
//!
//! [`Ingest`] carries what every stage shares; [`stages()`] lists them in pipeline order;
//! [`run`] runs a chosen set in one process.

pub mod access;
pub mod bagit;
pub mod bagprofile;
pub mod blocking;
pub mod bucket;
pub mod checkm;
pub mod cleanup;
pub mod command;
pub mod config;
pub mod deletion;
pub mod fair;
pub mod fetch;
pub mod files;
pub mod fixity;
pub mod intake;
pub mod inventory;
pub mod nodes;
pub mod outbox;
pub mod policy;
pub mod quota;
pub mod replicate;
pub mod report;
pub mod restore;
pub mod sources;
pub mod stages;
mod unpack;
pub mod weather;

pub use config::{Config, HttpSettings, PayloadSettings, Profile, TokenSettings};
pub use intake::{PayloadType, Submission, SubmitError, submit, submit_keeping};
pub use policy::Trust;

use fetch::{FetchError, Fetcher};
use lading_core::BatchState;
use lading_engine::Engine;
use lading_worker::{
    BatchStage, JobStage, Outcome, Phase, Shutdown, StageConfig, Supervisor, Worker,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// What the stages share.
pub struct Ingest {
    pub engine: Arc<Engine>,
    pub cfg: Config,
    pub fetcher: Fetcher,
    pub inventory: Arc<inventory::Inventory>,
    /// What this process's stage workers did (outcomes, latencies), for `/metrics`.
    pub stats: Arc<lading_worker::Stats>,
    /// This process's download slots per submitter (see [`fair`]).
    pub slots: fair::Slots,
    /// The configured storage nodes, opened.
    pub nodes: nodes::Nodes,
    /// Profiles read so far, with the modification time of their file: every stage of every
    /// job asks for its profile, and a `stat` is much cheaper than reading and parsing.
    profiles: Mutex<HashMap<String, (Option<SystemTime>, Profile)>>,
    /// Profiles held in memory ([`Ingest::with_profile`]), looked up before the folder.
    given: HashMap<String, Profile>,
    /// What carries mails and callbacks out ([`outbox::Wire`] unless told otherwise).
    pub courier: Arc<dyn outbox::Courier>,
    /// What runs profiles' processing commands ([`command::Shell`] unless told otherwise).
    pub commands: Arc<dyn command::Commands>,
    /// What each stage's handler is wrapped in before it runs ([`stages()`]); none in a real
    /// process (the simulator's faults and simulated handlers otherwise).
    pub wrap: Option<Arc<dyn StageWrap>>,
    /// What housekeeping's finishing watch has done (see [`cleanup::FinishingProgress`]).
    pub finishing: Arc<cleanup::FinishingProgress>,
}

/// Wraps the stages a process runs (see [`Ingest::with_stage_wrap`]): what a process of the
/// simulator runs in place of, or around, Lading's own handlers, while everything else of
/// the process is assembled as in production.
pub trait StageWrap: Send + Sync {
    /// The handler that runs for a job stage whose own handler is `real`.
    fn job(&self, real: Arc<dyn JobStage>) -> Arc<dyn JobStage>;
    /// The handler that runs for a batch stage whose own handler is `real`.
    fn batch(&self, real: Arc<dyn BatchStage>) -> Arc<dyn BatchStage>;
}

impl Ingest {
    /// Panics on a payload policy that cannot be built (see [`Ingest::try_new`]).
    pub fn new(engine: Arc<Engine>, cfg: Config) -> Arc<Ingest> {
        Ingest::try_new(engine, cfg).expect("valid [payload] settings")
    }

    /// The stages' shared state; an invalid `[payload] allow` entry, a missing
    /// `allow_file_roots` folder, a storage node that cannot be opened (or its credentials
    /// are not set), and a profile naming a storage node the config lacks are named.
    pub fn try_new(engine: Arc<Engine>, cfg: Config) -> Result<Arc<Ingest>, String> {
        Ingest::try_new_env(engine, cfg, |k| std::env::var(k).ok())
    }

    /// [`Ingest::try_new`], with storage nodes' credentials read from `env`.
    pub fn try_new_env(
        engine: Arc<Engine>,
        cfg: Config,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Arc<Ingest>, String> {
        let fetcher = Fetcher::with_settings(&cfg.payload)?;
        Ingest::assemble(engine, cfg, fetcher, env).map(Arc::new)
    }

    /// [`Ingest::try_new_env`] with a fetcher made already: processes in one program (the
    /// simulator's) share one, as its HTTP clients are costly to make.
    pub fn assemble(
        engine: Arc<Engine>,
        cfg: Config,
        fetcher: Fetcher,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Ingest, String> {
        let nodes = nodes::Nodes::open(&cfg.storage_nodes, env)?;
        // Every profile's nodes exist (profiles that cannot be read are named when used).
        if let Ok(rd) = std::fs::read_dir(cfg.profiles_dir()) {
            let mut names: Vec<String> = rd
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_suffix(".toml"))
                        .map(str::to_string)
                })
                .collect();
            names.sort();
            // A profile that cannot be read stops the process at start, naming its file
            // and the problem, rather than failing the first deposit that names it.
            for name in names {
                let p = cfg.profile(&name).map_err(|e| e.to_string())?;
                nodes.of_profile(&p)?;
            }
        }
        engine.deps().configure(cfg.dependencies.settings());
        register_dependencies(&engine, &cfg, &nodes);
        let inventory =
            inventory::Inventory::new(cfg.inventory()).with_clock(engine.clock().clone());
        Ok(Ingest {
            engine,
            inventory: Arc::new(inventory),
            cfg,
            fetcher,
            stats: Arc::new(lading_worker::Stats::default()),
            slots: fair::Slots::default(),
            nodes,
            profiles: Mutex::new(HashMap::new()),
            given: HashMap::new(),
            courier: Arc::new(outbox::Wire),
            commands: Arc::new(command::Shell),
            wrap: None,
            finishing: Default::default(),
        })
    }

    /// The same, with `p` held in memory: [`Ingest::profile`] finds it without reading the
    /// profiles folder.
    /// Makes the process's dependencies known again, each with its probe: for a caller that
    /// added storage nodes after building it (the simulator).
    pub fn register_dependencies(&self) {
        register_dependencies(&self.engine, &self.cfg, &self.nodes);
    }

    pub fn with_profile(mut self, p: Profile) -> Ingest {
        self.given.insert(p.name.clone(), p);
        self
    }

    /// The same, with mails and callbacks carried by `courier`.
    pub fn with_courier(mut self, courier: Arc<dyn outbox::Courier>) -> Ingest {
        self.courier = courier;
        self
    }

    /// The same, with processing commands run by `commands`.
    pub fn with_commands(mut self, commands: Arc<dyn command::Commands>) -> Ingest {
        self.commands = commands;
        self
    }

    /// The same, with each stage's handler wrapped by `wrap` (the simulator's).
    pub fn with_stage_wrap(mut self, wrap: Arc<dyn StageWrap>) -> Ingest {
        self.wrap = Some(wrap);
        self
    }

    /// The names of every profile (files in the profiles folder, and those given in code),
    /// sorted; at most 1,000.
    pub fn profile_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.given.keys().cloned().collect();
        if let Ok(rd) = std::fs::read_dir(self.cfg.profiles_dir()) {
            names.extend(rd.filter_map(|e| e.ok()).take(1000).filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".toml"))
                    .map(str::to_string)
            }));
        }
        names.sort();
        names.dedup();
        names.truncate(1000);
        names
    }

    /// Profile `name`, re-read only when its file changed.
    pub fn profile(&self, name: &str) -> Result<Profile, config::ConfigError> {
        if let Some(p) = self.given.get(name) {
            return Ok(p.clone());
        }
        let path = self.cfg.profiles_dir().join(format!("{name}.toml"));
        let mtime = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        if let Some((seen, p)) = self
            .profiles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            && mtime.is_some()
            && *seen == mtime
        {
            return Ok(p.clone());
        }
        let p = self.cfg.profile(name)?;
        self.nodes
            .of_profile(&p)
            .map_err(config::ConfigError::UnknownNode)?;
        self.profiles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), (mtime, p.clone()));
        Ok(p)
    }
}

pub(crate) fn fatal_or_transient(e: FetchError) -> Outcome {
    match e {
        FetchError::Transient(m) => Outcome::Transient(m),
        FetchError::Fatal(m) => Outcome::Fatal(m),
        FetchError::Unavailable {
            dependency, cause, ..
        } => Outcome::Unavailable { dependency, cause },
    }
}

/// Stage names, in pipeline order, as `lading worker --stages` takes them.
pub const STAGE_NAMES: &[&str] = &[
    "intake",
    "pending",
    "estimating",
    "provisioning",
    "downloading",
    "processing",
    "storing",
    "recording",
    "notify",
    "reporting",
    "update-reporting",
];

/// The job and batch stages named, with their settings from the config.
#[allow(clippy::type_complexity)]
pub fn stages(
    ingest: &Arc<Ingest>,
    names: &[&str],
) -> Result<
    (
        Vec<(Arc<dyn JobStage>, StageConfig)>,
        Vec<(Arc<dyn BatchStage>, StageConfig)>,
    ),
    String,
> {
    let mut jobs: Vec<(Arc<dyn JobStage>, StageConfig)> = Vec::new();
    let mut batches: Vec<(Arc<dyn BatchStage>, StageConfig)> = Vec::new();
    let i = ingest.clone();
    for &name in names {
        let cfg = ingest.cfg.stage(name);
        match name {
            "intake" => batches.push((Arc::new(intake::Intake(i.clone())), cfg)),
            "reporting" => batches.push((
                Arc::new(report::Report(i.clone(), BatchState::Reporting)),
                cfg,
            )),
            "update-reporting" => batches.push((
                Arc::new(report::Report(i.clone(), BatchState::UpdateReporting)),
                cfg,
            )),
            "pending" => jobs.push((Arc::new(stages::Start(i.clone())), cfg)),
            "estimating" => jobs.push((Arc::new(stages::Estimate(i.clone())), cfg)),
            "provisioning" => jobs.push((Arc::new(stages::Provision(i.clone())), cfg)),
            "downloading" => jobs.push((Arc::new(stages::Download(i.clone())), cfg)),
            "processing" => jobs.push((Arc::new(stages::Process(i.clone())), cfg)),
            "storing" => jobs.push((Arc::new(stages::Store(i.clone())), cfg)),
            "recording" => jobs.push((Arc::new(stages::Record(i.clone())), cfg)),
            "notify" => jobs.push((Arc::new(stages::Notify(i.clone())), cfg)),
            other => {
                return Err(format!(
                    "unknown stage {other:?} (one of: {})",
                    STAGE_NAMES.join(", ")
                ));
            }
        }
    }
    if let Some(wrap) = &ingest.wrap {
        for (stage, _) in &mut jobs {
            *stage = wrap.job(stage.clone());
        }
        for (stage, _) in &mut batches {
            *stage = wrap.batch(stage.clone());
        }
    }
    Ok((jobs, batches))
}

/// Starts the named stages on `services`, with what runs beside them: the working-folder
/// sweep (on hosts that keep working folders), housekeeping (with `reporting`), the quota
/// waker (with `pending`) and the outbox deliverer (with the stages that record mails and
/// callbacks; it stops last, so what the stages record while they finish is delivered).
/// Returns the worker's per-stage figures.
pub async fn start(
    ingest: &Arc<Ingest>,
    names: &[&str],
    services: &mut Supervisor,
) -> Result<Arc<lading_worker::Stats>, String> {
    let (jobs, batches) = stages(ingest, names)?;
    let work = ingest.cfg.work_dir();
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    if let Err(e) = stages::spread_subdirs(&work) {
        tracing::debug!(dir = %work.display(), error = %e, "cannot spread job folders");
    }
    if names.contains(&"storing") {
        // What stores that failed in an earlier run (a full disk, a crash) left behind.
        match stages::sweep_storage(ingest).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "storage root: partial copies removed"),
            Err(e) => tracing::warn!(error = %e, "cannot sweep the storage root"),
        }
    }
    // Hosts that keep working folders also remove those of jobs cleaned up elsewhere.
    if names
        .iter()
        .any(|n| matches!(*n, "downloading" | "processing" | "storing"))
    {
        let i = ingest.clone();
        services.spawn("working-folder sweep", Phase::First, |sd| async move {
            cleanup::sweep_work_dirs_every(i, sd).await;
            Ok(())
        });
    }
    let worker = Worker::new(ingest.engine.clone(), work).with_stats(ingest.stats.clone());
    let stats = worker.stats();
    // The process that reports also repairs and cleans up.
    if names.contains(&"reporting") {
        let i = ingest.clone();
        services.spawn("housekeeping", Phase::First, |sd| async move {
            cleanup::housekeeping(i, sd).await;
            Ok(())
        });
        // Approved deletions a node was unavailable for, tried again each minute.
        let i = ingest.clone();
        services.spawn("deletions", Phase::First, |sd| async move {
            deletion::run(i, std::time::Duration::from_secs(60), sd).await;
            Ok(())
        });
    }
    // The process that starts jobs also wakes those parked for a quota slot.
    if names.contains(&"pending") {
        let i = ingest.clone();
        services.spawn("quota waker", Phase::First, |sd| async move {
            quota::run_waker(i, sd).await;
            Ok(())
        });
    }
    // The processes that record mails and callbacks also deliver them.
    if names
        .iter()
        .any(|n| matches!(*n, "notify" | "reporting" | "update-reporting"))
    {
        let i = ingest.clone();
        services.spawn("outbox", Phase::Last, |sd| async move {
            outbox::run(i, sd).await;
            Ok(())
        });
    }
    // Probers of dependencies found down, until the last delivery has been tried.
    let e = ingest.engine.clone();
    services.spawn("probers", Phase::Last, |sd| async move {
        lading_worker::deps::run_probers(e, sd).await
    });
    // What the stages count, added to the store's stage metrics (last, with the last runs).
    let (e, counted) = (ingest.engine.clone(), stats.clone());
    let states: Vec<lading_core::JobState> = jobs.iter().map(|(s, _)| s.state()).collect();
    services.spawn("stage metrics", Phase::Last, |sd| async move {
        lading_worker::stage_metrics::flush_every(e, counted, states, sd).await;
        Ok(())
    });
    services.spawn("stages", Phase::First, |sd| async move {
        worker.run(jobs, batches, sd).await;
        Ok(())
    });
    Ok(stats)
}

/// [`start`] on a supervisor of its own, stopped by `stop` (and aborted by its abort); runs
/// until every service has ended. For callers that run the stages alone (tests, the demo).
pub async fn run(
    ingest: &Arc<Ingest>,
    names: &[&str],
    stop: Shutdown,
) -> Result<Arc<lading_worker::Stats>, String> {
    let mut services = Supervisor::new();
    let stats = start(ingest, names, &mut services).await?;
    let handle = services.handle();
    // The caller's signal, passed on (not a service: it would wait for an abort for ever).
    let bridge = tokio::spawn(async move {
        let mut stop = stop;
        stop.stopped().await;
        handle.stop();
        stop.aborted().await;
        handle.abort();
    });
    let ended = services.join().await;
    bridge.abort();
    ended?;
    Ok(stats)
}

/// Makes the process's dependencies known (SPEC §11), each with its probe: every storage
/// node (a listing its credentials may make), and the SMTP server (a TCP connection).
fn register_dependencies(engine: &Engine, cfg: &Config, nodes: &nodes::Nodes) {
    for n in nodes.all() {
        let node = n.clone();
        let probe: lading_engine::deps::Probe = Arc::new(move || {
            let node = node.clone();
            Box::pin(async move {
                match node.check().await {
                    Err(nodes::NodeError {
                        down: Some(cause), ..
                    }) => Err(cause),
                    // Any other answer is an answer: the node is there.
                    _ => Ok(()),
                }
            })
        });
        engine.deps().register(n.dependency(), Some(probe));
    }
    if let Some(host) = cfg.smtp_host.clone() {
        let port = cfg.smtp_port;
        let probe: lading_engine::deps::Probe = Arc::new(move || {
            let host = host.clone();
            Box::pin(async move {
                match tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    tokio::net::TcpStream::connect((host.as_str(), port)),
                )
                .await
                {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(weather::io_cause(&e).unwrap_or("cannot connect").into()),
                    Err(_) => Err("timed out".into()),
                }
            })
        });
        engine.deps().register(smtp_dependency(cfg), Some(probe));
    }
}

/// The SMTP server as a dependency.
pub fn smtp_dependency(cfg: &Config) -> lading_engine::deps::Dependency {
    let host = cfg.smtp_host.clone().unwrap_or_default();
    lading_engine::deps::Dependency::new("smtp", host.clone(), format!("{host}:{}", cfg.smtp_port))
}
