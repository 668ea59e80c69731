//! A Lading process's wiring, in one place: the store, its engine, the ingest service and
//! generic jobs on it, and what runs on them (pipeline stages, access workers, the
//! generic-jobs activity monitor, the fixity audit, the HTTP API), each a service of one
//! [`Supervisor`], started together and stopped with one [`Node::stop`]. `lading serve`,
//! `lading worker`, the benchmarks and the tests all build their process through it.

use crate::error::Context;
use lading_core::Tree;
use lading_core::layout::AccessQueue;
use lading_core::time::system_clock;
use lading_engine::Engine;
use lading_engine::processes::ProcessRecord;
use lading_ingest::{Config, Ingest};
use lading_jobs::Jobs;
use lading_server::{AppState, Auth};
use lading_store_sqlite::{SqliteOptions, SqliteTree};
use lading_store_zk::{ZkOptions, ZkTree};
use lading_worker::{Phase, Shutdown, ShutdownHandle, Supervisor};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An open store of either kind.
pub enum Store {
    Sqlite(Arc<SqliteTree>),
    Zk(Arc<ZkTree>),
}

impl Store {
    pub fn tree(&self) -> Arc<dyn Tree> {
        match self {
            Store::Sqlite(t) => t.clone(),
            Store::Zk(t) => t.clone(),
        }
    }
}

/// Opens a store from its URL: `sqlite:PATH` (or a bare path), or
/// `zk://host:port[,host:port…][/chroot]`.
pub async fn open(url: &str) -> crate::Result<Store> {
    if url.starts_with("zk://") {
        let mut opts = ZkOptions::default();
        if let Ok(ms) = std::env::var("LADING_ZK_SESSION_TIMEOUT_MS") {
            let ms: u64 = ms
                .parse()
                .map_err(|e: std::num::ParseIntError| e.to_string())
                .with_context(|| {
                    format!("LADING_ZK_SESSION_TIMEOUT_MS must be milliseconds, not {ms:?}")
                })?;
            opts.session_timeout = std::time::Duration::from_millis(ms);
        }
        let tree = ZkTree::open(url, opts)
            .await
            .with_context(|| format!("opening store {url}"))?;
        return Ok(Store::Zk(Arc::new(tree)));
    }
    Ok(Store::Sqlite(open_sqlite(url)?))
}

/// Opens a store from its URL, as a tree.
pub async fn open_store(url: &str) -> crate::Result<Arc<dyn Tree>> {
    Ok(open(url).await?.tree())
}

pub use crate::error::NoStore;

/// [`open_store`] for a command that must not create a store: an embedded store whose file
/// does not exist is [`NoStore`], and nothing is made.
pub async fn open_existing(url: &str) -> crate::Result<Arc<dyn Tree>> {
    if !url.starts_with("zk://") {
        let path = url.strip_prefix("sqlite:").unwrap_or(url);
        if !path.is_empty() && !url.contains("://") && !Path::new(path).exists() {
            return Err(NoStore(path.to_string()).into());
        }
    }
    open_store(url).await
}

/// Opens an embedded store from its URL.
pub fn open_sqlite(url: &str) -> crate::Result<Arc<SqliteTree>> {
    let path = url.strip_prefix("sqlite:").unwrap_or(url);
    if path.is_empty() {
        return Err(crate::NodeError::Other(format!(
            "empty store path in {url:?}"
        )));
    }
    if url.contains("://") {
        return Err(crate::NodeError::Other(format!(
            "unknown store URL {url:?}: expected sqlite:PATH or zk://host:port[,host:port]/chroot"
        )));
    }
    let tree = SqliteTree::open(PathBuf::from(path), SqliteOptions::default())
        .with_context(|| format!("opening store {url}"))?;
    Ok(Arc::new(tree))
}

/// The name this process's locks and leases carry: `HOST:PID`.
pub fn owner() -> String {
    lading_store_sqlite::default_owner()
}

/// An engine on the store at `url`, initialised.
pub async fn engine(url: &str) -> crate::Result<Arc<Engine>> {
    let e = Arc::new(Engine::new(open_store(url).await?, system_clock(), owner()));
    e.init().await?;
    Ok(e)
}

/// Loads the config (file and environment); warns when a config that holds tokens can be
/// read by other users.
pub fn config(path: Option<&Path>) -> crate::Result<Config> {
    let cfg = Config::load(path)?;
    cfg.storage_umask_bits().map_err(crate::NodeError::Other)?;
    if let Some(p) = path
        && !cfg.tokens.is_empty()
        && let Ok(m) = std::fs::metadata(p)
    {
        use std::os::unix::fs::PermissionsExt;
        if m.permissions().mode() & 0o077 != 0 {
            let msg = format!(
                "{} holds API tokens but other users may read it (mode {:o}); chmod 600 it",
                p.display(),
                m.permissions().mode() & 0o777
            );
            // Once: the logs go to stderr for every command.
            tracing::warn!("{msg}");
        }
    }
    Ok(cfg)
}

/// The ingest service on an engine, with its working folder made.
pub fn ingest_on(engine: Arc<Engine>, cfg: Config) -> crate::Result<Arc<Ingest>> {
    std::fs::create_dir_all(cfg.work_dir())
        .with_context(|| format!("creating {}", cfg.work_dir().display()))?;
    Ingest::try_new(engine, cfg).map_err(crate::NodeError::Other)
}

/// The ingest service on the store at `url`.
pub async fn ingest(url: &str, cfg: Config) -> crate::Result<Arc<Ingest>> {
    ingest_on(engine(url).await?, cfg)
}

/// The access queues as stage names (`lading worker --stages access-small`).
pub const ACCESS_STAGES: [&str; 2] = lading_ingest::access::ACCESS_STAGE_NAMES;

/// The access queue a stage name names.
pub fn access_queue(stage: &str) -> Option<AccessQueue> {
    match stage {
        "access-small" => Some(AccessQueue::Small),
        "access-large" => Some(AccessQueue::Large),
        _ => None,
    }
}

/// What a [`Node`] runs.
#[derive(Default)]
pub struct NodeSpec {
    /// Pipeline stages (names of [`lading_ingest::STAGE_NAMES`]).
    pub stages: Vec<String>,
    /// Access queues whose requests this node assembles.
    pub access: Vec<AccessQueue>,
    /// Whether to run the generic-jobs activity monitor.
    pub monitor: bool,
    /// The HTTP API, on this listener with these tokens.
    pub http: Option<(tokio::net::TcpListener, Auth)>,
    /// The program's version (with its commit) the process announces; none:
    /// [`LIBRARY_VERSION`].
    pub version: Option<String>,
}

/// What a [`Node`] is handed rather than makes, for a program that runs several processes
/// on a store and clock of its own (the simulator); a real process takes the default.
#[derive(Default)]
pub struct NodeEnv {
    /// The generic-jobs service; none: one on the ingest's store and clock, owned by this
    /// process ([`owner`]).
    pub jobs: Option<Arc<Jobs>>,
    /// The host and process id the process announces; none: this host's and this process's.
    pub identity: Option<(String, u32)>,
    /// The program's own services beside Lading's, each under its name (the simulator's
    /// generic-jobs processor); they stop with the stages.
    pub services: Vec<(&'static str, Service)>,
    /// The HTTP API on connections the program makes itself (the simulator's, in memory),
    /// instead of [`NodeSpec::http`]'s listener.
    pub http: Option<HttpEnv>,
}

/// The HTTP API as a program serves it ([`NodeEnv::http`]): the node starts the event hub
/// (keeping the last `events_kept` events) and its feeders as its services, and runs
/// `serve` with the API's router as its `http` service.
pub struct HttpEnv {
    pub auth: Auth,
    pub events_kept: usize,
    pub serve: ServeHttp,
}

/// Serves the router on the program's connections until the stop signal, with the tokens.
pub type ServeHttp = Box<
    dyn FnOnce(
            lading_server::Router,
            Shutdown,
            Arc<Auth>,
        ) -> lading_core::BoxFuture<'static, std::io::Result<()>>
        + Send,
>;

/// A service a program adds to its [`Node`] ([`NodeEnv::services`]).
pub type Service =
    Box<dyn FnOnce(Shutdown) -> lading_core::BoxFuture<'static, Result<(), String>> + Send>;

/// Starts the event hub, its feeders and the HTTP API as services of `services`.
async fn serve_http(
    services: &mut Supervisor,
    ingest: &Arc<Ingest>,
    jobs: &Arc<Jobs>,
    http: HttpEnv,
) -> crate::Result<Arc<lading_server::events::EventHub>> {
    let (events, feeders) =
        lading_server::events::EventHub::start_keeping(&ingest.engine, http.events_kept).await?;
    // The hub's feeders (the tree's follower, the forwarder, the last hour's tally) are
    // services: one that panics is heard of and stops the process.
    for (name, task) in feeders {
        services.spawn(name, Phase::First, |sd| async move {
            tokio::select! {
                _ = task => {}
                _ = sd.into_stopped() => {}
            }
            Ok(())
        });
    }
    let state = AppState {
        events: events.clone(),
        ingest: ingest.clone(),
        jobs: jobs.clone(),
        auth: Arc::new(http.auth),
        stopping: services.shutdown(),
    };
    let auth = state.auth.clone();
    let serve = http.serve;
    services.spawn("http", Phase::First, |sd| async move {
        serve(lading_server::router(state), sd, auth)
            .await
            .map_err(|e| e.to_string())
    });
    Ok(events)
}

/// Stops or aborts a running [`Node`]: its supervisor's one stop signal.
#[derive(Clone)]
pub struct NodeHandle(ShutdownHandle);

impl NodeHandle {
    /// See [`Node::stop`].
    pub fn stop(&self) {
        self.0.stop();
    }

    /// See [`Node::abort`].
    pub fn abort(&self) {
        self.0.abort();
    }
}

impl NodeSpec {
    /// The stages and access queues named (`none` for none), and how to name them in a log
    /// line; an unknown name is refused, naming the known ones.
    pub fn for_stages(names: &[String]) -> crate::Result<(NodeSpec, String)> {
        let names: Vec<&String> = names.iter().filter(|n| *n != "none").collect();
        if let Some(bad) = names.iter().find(|n| {
            !lading_ingest::STAGE_NAMES.contains(&n.as_str()) && access_queue(n).is_none()
        }) {
            return Err(crate::NodeError::Other(format!(
                "unknown stage {bad:?}; the stages are {}, {} (or none)",
                lading_ingest::STAGE_NAMES.join(", "),
                ACCESS_STAGES.join(", ")
            )));
        }
        let (access, stages): (Vec<&String>, Vec<&String>) =
            names.iter().partition(|n| access_queue(n).is_some());
        let what = if stages.len() == lading_ingest::STAGE_NAMES.len() {
            "every stage".to_string()
        } else if names.is_empty() {
            "no stage".to_string()
        } else {
            names
                .iter()
                .map(|n| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let spec = NodeSpec {
            access: access.iter().filter_map(|n| access_queue(n)).collect(),
            stages: stages.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        };
        Ok((spec, what))
    }
}

/// A running process: everything of its [`NodeSpec`] on one store.
pub struct Node {
    pub ingest: Arc<Ingest>,
    pub jobs: Arc<Jobs>,
    /// Where the HTTP API listens, when it does.
    pub addr: Option<SocketAddr>,
    /// The event hub the HTTP API streams from, when it serves one.
    pub events: Option<Arc<lading_server::events::EventHub>>,
    handle: NodeHandle,
    services: Supervisor,
}

impl Node {
    /// Starts everything `spec` names on `ingest`'s store.
    pub async fn start(ingest: Arc<Ingest>, spec: NodeSpec) -> crate::Result<Node> {
        Node::start_in(ingest, spec, NodeEnv::default()).await
    }

    /// [`Node::start`], with what `env` hands the process.
    pub async fn start_in(
        ingest: Arc<Ingest>,
        spec: NodeSpec,
        env: NodeEnv,
    ) -> crate::Result<Node> {
        let names: Vec<&str> = spec.stages.iter().map(String::as_str).collect();
        lading_ingest::stages(&ingest, &names).map_err(crate::NodeError::Other)?;
        let jobs = env.jobs.unwrap_or_else(|| {
            Arc::new(Jobs::new(
                ingest.engine.tree().clone(),
                ingest.engine.clock().clone(),
                owner(),
            ))
        });
        let mut services = Supervisor::new();
        // The process says what it is and what it runs, until it stops (SPEC §12).
        let mut record = announced(&ingest, &spec);
        if let Some((host, pid)) = env.identity {
            (record.host, record.pid) = (host, pid);
        }
        let on = (ingest.engine.tree().clone(), ingest.engine.clock().clone());
        announce(&mut services, on, record, ingest.stats.clone());
        let mut addr = None;
        let http = match (spec.http, env.http) {
            (_, Some(http)) => Some(http),
            (Some((listener, auth)), None) => {
                addr = Some(listener.local_addr()?);
                let limits = lading_server::conn::Limits::from(&ingest.cfg.http);
                Some(HttpEnv {
                    auth,
                    events_kept: lading_server::events::KEPT,
                    serve: Box::new(move |app, sd, auth| {
                        Box::pin(lading_server::serve(
                            listener,
                            app,
                            sd.into_stopped(),
                            limits,
                            Some(auth),
                        ))
                    }),
                })
            }
            (None, None) => None,
        };
        let mut events = None;
        if let Some(http) = http {
            events = Some(serve_http(&mut services, &ingest, &jobs, http).await?);
        }
        if spec.monitor {
            let j = jobs.clone();
            services.spawn("generic-jobs monitor", Phase::First, |sd| async move {
                j.run_monitor(sd).await;
                Ok(())
            });
        }
        // The scheduled fixity audit: a generic job each `[fixity] audit_every_s` (hourly),
        // run here, checking the copies not checked for `[fixity] every_days`.
        if spec.monitor && ingest.cfg.fixity.every_days > 0 {
            let (i, j) = (ingest.clone(), jobs.clone());
            services.spawn("fixity audit", Phase::First, |sd| async move {
                lading_ingest::fixity::run_audit(i, j, sd).await;
                Ok(())
            });
        }
        // The access queues run on the same runtime and stop with the stages.
        for q in spec.access {
            let i = ingest.clone();
            services.spawn("access queue", Phase::First, move |sd| async move {
                lading_ingest::access::run(i, q, sd).await;
                Ok(())
            });
        }
        if !spec.stages.is_empty() {
            let names: Vec<&str> = spec.stages.iter().map(String::as_str).collect();
            lading_ingest::start(&ingest, &names, &mut services)
                .await
                .map_err(crate::NodeError::Other)?;
        }
        for (name, service) in env.services {
            services.spawn(name, Phase::First, service);
        }
        Ok(Node {
            ingest,
            jobs,
            addr,
            events,
            handle: NodeHandle(services.handle()),
            services,
        })
    }

    /// Begins a graceful stop: no new work is taken, the HTTP API and the other loops end,
    /// running stage handlers may finish.
    pub fn stop(&self) {
        self.handle.stop();
    }

    /// Cuts running stage handlers off (their jobs are released in their stage).
    pub fn abort(&self) {
        self.handle.abort();
    }

    /// What stops or aborts this node while [`Node::run`] or [`Node::join`] owns it.
    pub fn handle(&self) -> NodeHandle {
        self.handle.clone()
    }

    /// Runs until every service has ended: after a stop, or once one of them failed (which
    /// stops the others); then closes the store.
    pub async fn run(self) -> crate::Result<()> {
        let ended = self.services.join().await;
        self.ingest.engine.tree().close().await?;
        ended.map_err(crate::NodeError::Other)
    }

    /// Runs until SIGINT/SIGTERM, as [`crate::signals::until_signal`] does, with `grace`
    /// for running handlers; says `running` once signals are listened to.
    pub async fn run_until_signal(
        self,
        grace: std::time::Duration,
        running: &str,
        say: fn(&str),
    ) -> crate::Result<()> {
        let (stop, abort) = (self.handle(), self.handle());
        crate::signals::until_signal(
            self.run(),
            move || stop.stop(),
            move || abort.abort(),
            Some(grace),
            running,
            say,
        )
        .await
    }

    /// Runs until every service has ended (after a stop, or once one failed), and leaves
    /// the store open: for a program whose store outlives its processes (the simulator's).
    pub async fn run_open(self) -> Result<(), String> {
        self.services.join().await
    }

    /// Stops (if not yet stopping), waits for every service to end, and closes the store.
    pub async fn join(self) -> crate::Result<()> {
        self.stop();
        self.run().await
    }

    /// Stops, waits for every service to end, and leaves the store open (for a caller that
    /// reads on: the demo's report, a benchmark's figures).
    pub async fn stop_services(self) -> crate::Result<()> {
        self.stop();
        self.services.join().await.map_err(crate::NodeError::Other)
    }

    /// Every stage: what `lading worker` runs by default.
    pub fn every_stage() -> NodeSpec {
        NodeSpec {
            stages: lading_ingest::STAGE_NAMES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            ..Default::default()
        }
    }
}

/// What a process running `spec` says of itself under `/processes`.
fn announced(ingest: &Ingest, spec: &NodeSpec) -> ProcessRecord {
    let roles = [
        ("serve", spec.http.is_some()),
        ("worker", !spec.stages.is_empty()),
        ("access", !spec.access.is_empty()),
        ("jobs", spec.monitor),
    ];
    let mut stages: std::collections::BTreeMap<String, usize> = spec
        .stages
        .iter()
        .map(|s| (s.clone(), ingest.cfg.stage(s).concurrency))
        .collect();
    for q in &spec.access {
        let name = ACCESS_STAGES[usize::from(*q == AccessQueue::Large)];
        stages.insert(name.to_string(), 1);
    }
    let now = ingest.engine.clock().now_ms();
    ProcessRecord {
        host: host_name(),
        pid: std::process::id(),
        version: spec
            .version
            .clone()
            .unwrap_or_else(|| LIBRARY_VERSION.to_string()),
        roles: roles
            .iter()
            .filter(|(_, on)| *on)
            .map(|(r, _)| r.to_string())
            .collect(),
        stages,
        started_at_ms: now,
        heard_at_ms: now,
        running: Vec::new(),
        stopped_at_ms: None,
    }
}

/// The version a process built by a program other than `lading` (a test, a benchmark)
/// announces.
pub const LIBRARY_VERSION: &str = concat!("lading-node library ", env!("CARGO_PKG_VERSION"));

/// The announcer of `record` (SPEC §12): the process says what it is and what it runs (from
/// `stats`) under `/processes`, until it stops.
fn announce(
    services: &mut Supervisor,
    (tree, clock): (Arc<dyn Tree>, lading_core::time::SharedClock),
    record: ProcessRecord,
    stats: Arc<lading_worker::Stats>,
) {
    services.spawn("announcement", Phase::Last, |sd| async move {
        lading_worker::announce::announce(tree, clock, record, stats, sd).await;
        Ok(())
    });
}

/// A generic-jobs process (`lading jobs run|monitor`): the activity monitor, and the
/// processor of one type when it has one; no ingest service.
pub struct JobsSpec {
    /// What processes jobs, as the process names it (`generic jobs TYPE`), with how many at
    /// a time.
    pub processor: Option<(String, usize, Service)>,
    /// The program's version (with its commit) the process announces.
    pub version: String,
}

/// A running generic-jobs process ([`Node::start_jobs`]).
pub struct JobsNode {
    handle: NodeHandle,
    services: Supervisor,
}

impl JobsNode {
    /// What stops or aborts this process while [`JobsNode::run`] owns it.
    pub fn handle(&self) -> NodeHandle {
        self.handle.clone()
    }

    /// Runs until every service has ended: after a stop, or once one of them failed.
    pub async fn run(self) -> Result<(), String> {
        self.services.join().await
    }
}

impl Node {
    /// Starts a generic-jobs process on `jobs`' store, as `spec` says, announced with the
    /// role `jobs`.
    pub fn start_jobs(jobs: Arc<Jobs>, spec: JobsSpec) -> JobsNode {
        let mut services = Supervisor::new();
        let j = jobs.clone();
        services.spawn("generic-jobs monitor", Phase::First, |sd| async move {
            j.run_monitor(sd).await;
            Ok(())
        });
        let mut stages = std::collections::BTreeMap::new();
        if let Some((name, concurrency, processor)) = spec.processor {
            stages.insert(name, concurrency);
            services.spawn("generic-jobs processor", Phase::First, processor);
        }
        let now = jobs.clock().now_ms();
        let record = ProcessRecord {
            host: host_name(),
            pid: std::process::id(),
            version: spec.version,
            roles: vec!["jobs".to_string()],
            stages,
            started_at_ms: now,
            heard_at_ms: now,
            running: Vec::new(),
            stopped_at_ms: None,
        };
        let on = (jobs.tree().clone(), jobs.clock().clone());
        announce(&mut services, on, record, Default::default());
        JobsNode {
            handle: NodeHandle(services.handle()),
            services,
        }
    }
}

/// This host's name, as this process's locks carry it.
fn host_name() -> String {
    let owner = owner();
    match owner.rsplit_once(':') {
        Some((host, _pid)) => host.to_string(),
        None => owner,
    }
}

/// Waits until `batch` is Completed, Failed or Deleted, handing each change of the batch or
/// its jobs to `on_change` (this process's events wake it; a re-read each second backs them
/// up, for changes other processes make).
pub async fn wait_batch_end(
    engine: &Engine,
    batch: &lading_core::layout::BatchId,
    mut on_change: impl FnMut(&lading_engine::ChangeEvent),
) -> crate::Result<()> {
    use lading_core::BatchState;
    let mut events = engine.subscribe();
    loop {
        let info = engine.batch(batch).await?;
        if matches!(
            info.status.status,
            BatchState::Completed | BatchState::Failed | BatchState::Deleted
        ) {
            return Ok(());
        }
        if let Ok(Ok(ev)) =
            tokio::time::timeout(std::time::Duration::from_secs(1), events.recv()).await
            && (ev.kind == lading_engine::ChangeKind::Batch && ev.id == batch.as_str()
                || ev.batch.as_deref() == Some(batch.as_str()))
        {
            on_change(&ev);
        }
    }
}
