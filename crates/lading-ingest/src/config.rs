//! The service configuration (one TOML file, environment overrides) and ingest profiles (one
//! TOML file each in a directory).

use lading_worker::StageConfig;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: {error}")]
    Parse { path: PathBuf, error: String },
    #[error("unknown profile {name:?} (no {path})")]
    UnknownProfile { name: String, path: PathBuf },
    #[error("invalid profile name {0:?}: letters, digits, '_', '-' and '.' only")]
    BadProfileName(String),
    #[error("environment variable {name}: {error}")]
    Env { name: String, error: String },
    #[error("{0}")]
    UnknownNode(String),
}

/// Per-stage settings in the config file (`[stages.downloading]`, …).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSettings {
    pub concurrency: Option<usize>,
    pub timeout_s: Option<u64>,
    pub max_attempts: Option<u32>,
    pub backoff_base_ms: Option<u64>,
    pub backoff_max_ms: Option<u64>,
}

/// An API bearer token (`[[tokens]]` in the config file).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TokenSettings {
    /// Who holds it: the submitter name recorded with the batches it submits.
    pub name: String,
    pub token: String,
    /// `admin` (everything), `submitter` (submit, and read its own batches) or `processor`
    /// (accept, update and finish generic jobs of `types`, nothing else).
    pub role: String,
    /// For a `processor` token: the generic-job types it may process.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<String>,
    /// For a `submitter` token (required there): the collections it may submit to, by the
    /// profiles' `collection`; `["*"]` is every collection.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collections: Vec<String>,
}

/// The service configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where everything below lives unless given explicitly: the store too
    /// (`DATA_DIR/lading.db`), unless `store` names another.
    pub data_dir: PathBuf,
    /// The store: `sqlite:PATH` or `zk://host:port[,…][/chroot]`. Default
    /// `sqlite:DATA_DIR/lading.db`; `--store` and `LADING_STORE` come before it.
    pub store: Option<String>,
    pub work_dir: Option<PathBuf>,
    pub storage_root: Option<PathBuf>,
    /// The inventory database: a SQLite file, or a `postgres://USER@HOST:PORT/DB` URL for an
    /// inventory shared by several hosts.
    pub inventory: Option<PathBuf>,
    pub profiles_dir: Option<PathBuf>,
    /// Kept free on the working storage beyond a job's `space_needed`.
    pub reserve_bytes: u64,
    /// Unestimated jobs (space_needed 0) wait while free space is below this.
    pub unestimated_min_free_bytes: u64,
    /// How often a job waiting for space is looked at again.
    pub provisioning_round_ms: u64,
    /// A reopened batch (a job of a reported batch requeued) is reported again only once no
    /// requeue has come for this long, so an operator requeueing jobs one by one gives the
    /// depositor one update.
    pub report_settle_s: u64,
    /// Names the working file system in space reservations (default: this host's name and
    /// the working folder's path). Hosts that share one working file system must give it
    /// the same id; hosts with disks of their own, different ones.
    pub work_root_id: Option<String>,
    /// The folder holding Merritt's ingest packages: a batch submitted by Merritt's ingest
    /// service names its package by `filename`, resolved here (never outside). Unset: such
    /// batches fail, saying so.
    pub merritt_package_root: Option<PathBuf>,
    /// Jobs needing more than this get `large_job_priority`.
    pub large_job_bytes: u64,
    pub large_job_priority: u8,
    /// Concurrent HEAD requests per job while estimating.
    pub estimate_concurrency: usize,
    /// Attempts per file inside one download attempt.
    pub file_attempts: u32,
    pub smtp_host: Option<String>,
    pub smtp_port: u16,
    pub mail_from: String,
    /// Completed batches older than this are removed by cleanup; so are working folders of
    /// jobs no longer in the tree that nothing touched for this long.
    pub retention_hours: u64,
    /// Seconds between cleanups (by the process that reports) and between sweeps of working
    /// folders (by each host that keeps them): 1..=86400.
    pub cleanup_every_s: u64,
    /// The shoulder minted primary identifiers start with, unless the profile names one.
    pub shoulder: String,
    pub stages: BTreeMap<String, StageSettings>,
    /// Where `lading serve` listens.
    pub listen: String,
    /// Largest upload `POST /api/v1/batches/upload` takes.
    pub max_upload_bytes: u64,
    /// Bytes one submitter's uploads may hold on a host at once: uploads arriving and those
    /// kept until their batches are cleaned up. An admin is not held to it.
    pub max_upload_bytes_per_submitter: u64,
    /// Batches one submitter may have open (not Completed, Failed or Deleted) at once; one
    /// more is refused (429 `open_batches`) before its body is read. An admin is not held to it.
    pub max_open_batches_per_submitter: u64,
    /// API tokens. With none, `lading serve` makes an admin token in the data directory and
    /// listens on loopback only.
    pub tokens: Vec<TokenSettings>,
    /// What depositors' payloads may reach and how large they may be (`[payload]`).
    pub payload: PayloadSettings,
    /// The HTTP server's limits and timeouts (`[http]`).
    pub http: HttpSettings,
    /// What one submitter may ask of the access queues (`[access]`).
    #[serde(default)]
    pub access: AccessSettings,
    /// The permission bits taken away from stored objects' files and folders (octal, like a
    /// `umask`): `"077"` (the default) keeps them to the service's own user; `"027"` lets
    /// its group read them.
    pub storage_umask: String,
    /// Numbered storage nodes (`[[storage_nodes]]`): S3-compatible buckets or folders. A
    /// profile names its nodes (`storage_nodes = [9501, 9502]`, primary first); a profile
    /// naming none stores under `storage_root` as before.
    pub storage_nodes: Vec<NodeSettings>,
    /// The scheduled fixity audit (`[fixity]`).
    pub fixity: FixitySettings,
    /// Waiting on outside services that are down (`[dependencies]`, SPEC §11).
    pub dependencies: DependencySettings,
}

/// How work waits on an outside service that is down: it uses no attempt, one prober per
/// dependency and process asks it whether it is back, and a wait has a limit.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct DependencySettings {
    /// The longest pause between two probes of a dependency that is down (they start at
    /// 1 s and double).
    pub probe_max_s: u64,
    /// How long a job may wait on one dependency before it fails, naming it.
    pub max_wait_h: u64,
    /// The same in seconds, for short-lived setups and tests; takes precedence when set.
    pub max_wait_s: Option<u64>,
    /// `max_wait_h` for one kind of dependency (`storage-node`, `smtp`, `callback`,
    /// `payload-host`, `inventory`), where it should differ.
    pub max_wait_h_by_kind: BTreeMap<String, u64>,
    /// A waiting job is looked at again after this long even when no prober wakes it (its
    /// process ended while it waited).
    pub recheck_s: u64,
}

impl Default for DependencySettings {
    fn default() -> Self {
        DependencySettings {
            probe_max_s: 5,
            max_wait_h: 72,
            max_wait_s: None,
            max_wait_h_by_kind: BTreeMap::new(),
            recheck_s: 60,
        }
    }
}

impl DependencySettings {
    /// As the engine's registry takes them.
    pub fn settings(&self) -> lading_engine::deps::DepSettings {
        lading_engine::deps::DepSettings {
            probe_max: Duration::from_secs(self.probe_max_s.max(1)),
            max_wait: Duration::from_secs(
                self.max_wait_s
                    .unwrap_or(self.max_wait_h.saturating_mul(3600)),
            ),
            max_wait_by_kind: self
                .max_wait_h_by_kind
                .iter()
                .map(|(k, h)| (k.clone(), Duration::from_secs(h.saturating_mul(3600))))
                .collect(),
            recheck: Duration::from_secs(self.recheck_s.max(1)),
        }
    }
}

/// The kinds of dependency `[dependencies] max_wait_h_by_kind` may name.
pub use lading_engine::deps::KINDS as DEPENDENCY_KINDS;

/// The scheduled fixity audit: every stored copy read back and compared with the inventory.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct FixitySettings {
    /// Each copy is checked again after this many days; 0 turns the schedule off.
    pub every_days: u64,
    /// The audit reads at most this many bytes per second (0: unbounded).
    pub bytes_per_s: u64,
    /// The audit's schedule ticks every this many seconds (1..=86400; 3600, hourly), and
    /// each tick checks one share of the copies due.
    pub audit_every_s: u64,
    /// Each audit share also aborts the multipart uploads open on a bucket node that began
    /// more than this many seconds ago (0: never; else at least 60; a day by default): an
    /// upload no writer holds any more (an attempt that lost its lease, a process that
    /// died mid-upload) keeps parts no object holds. Longer than any one upload takes.
    pub abort_uploads_after_s: u64,
}

impl Default for FixitySettings {
    fn default() -> Self {
        FixitySettings {
            every_days: 90,
            bytes_per_s: 50 << 20,
            audit_every_s: 3600,
            abort_uploads_after_s: 86_400,
        }
    }
}

/// Bounds on what a depositor sends (`[payload]` in the config), each with a safe default.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct PayloadSettings {
    /// URL prefixes depositors may name beyond public http(s) addresses, e.g.
    /// `"http://127.0.0.1:9000/"`.
    pub allow: Vec<String>,
    /// The only folders depositors' `file://` URLs may point into (canonicalised).
    pub allow_file_roots: Vec<PathBuf>,
    /// Largest manifest, counted while it streams in.
    pub max_manifest_bytes: u64,
    /// Most rows (objects or files) one manifest may list.
    pub max_rows: usize,
    /// Most `#%fields` names one manifest may declare.
    pub max_fields: usize,
    /// Most `#%prefix` lines one manifest may have.
    pub max_prefixes: usize,
    /// Longest manifest line.
    pub max_line_bytes: usize,
    /// Largest file one job may download (a declared size caps it further).
    pub max_file_bytes: u64,
    /// Most bytes the containers of one job may unpack to.
    pub max_unpacked_bytes: u64,
    /// Most entries the containers of one job may hold.
    pub max_unpacked_entries: u64,
    /// Most a container may expand: unpacked bytes per byte of container.
    pub max_unpack_ratio: u64,
    /// A download slower than this over `rate_window_s` is cut off (transient: it is retried
    /// with backoff, and fails after the stage's attempts).
    pub min_rate_bytes_per_s: u64,
    pub rate_window_s: u64,
    /// Longest a job whose declared size does not fit waits for space before it fails.
    pub max_space_wait_s: u64,
}

impl Default for PayloadSettings {
    fn default() -> Self {
        PayloadSettings {
            allow: Vec::new(),
            allow_file_roots: Vec::new(),
            max_manifest_bytes: 64 << 20,
            max_rows: 10_000,
            max_fields: 64,
            max_prefixes: 64,
            max_line_bytes: 64 << 10,
            max_file_bytes: 1 << 40,
            max_unpacked_bytes: 1 << 40,
            max_unpacked_entries: 100_000,
            max_unpack_ratio: 200,
            min_rate_bytes_per_s: 1024,
            rate_window_s: 30,
            max_space_wait_s: 3_600,
        }
    }
}

/// The HTTP server's limits (`[http]` in the config).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    /// Open connections at most; at the cap, the longest-idle connection (one with no
    /// request in progress) is closed to make room, so a flood of idle connections cannot
    /// lock others out.
    pub max_connections: usize,
    /// Time a client has to send a request's headers, counted from when the connection
    /// opens or its previous response ended: also the keep-alive idle timeout.
    pub header_timeout_s: u64,
    /// Time an ordinary (not streaming, not long-poll, not upload) request may take,
    /// reading its body included.
    pub request_timeout_s: u64,
    /// An upload that sends nothing for this long is refused (408).
    pub upload_stall_s: u64,
    /// Largest JSON request body.
    pub max_body_bytes: usize,
    /// Largest header block of one multipart part.
    pub max_part_header_bytes: usize,
    /// `/metrics` (public) shows generic-job type names, which tenants choose.
    pub metrics_type_names: bool,
    /// Streaming responses (event streams, downloads) one client (one token, or one
    /// address without a token) may hold open at once; more are refused with 429.
    pub max_streams_per_client: usize,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            max_connections: 1024,
            header_timeout_s: 10,
            request_timeout_s: 60,
            upload_stall_s: 60,
            max_body_bytes: 1 << 20,
            max_part_header_bytes: 16 << 10,
            metrics_type_names: false,
            max_streams_per_client: 8,
        }
    }
}

/// What one submitter may ask of the access queues (`[access]` in the config); an admin is
/// not held to them.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct AccessSettings {
    /// Requests one submitter may have waiting or being assembled at once.
    pub max_requests_per_submitter: usize,
    /// Bytes of assembled files one submitter's requests may hold until cleanup removes them
    /// (`retention_hours` after they finish), counted by the versions' sizes.
    pub max_bytes_per_submitter: u64,
}

impl Default for AccessSettings {
    fn default() -> Self {
        AccessSettings {
            max_requests_per_submitter: 8,
            max_bytes_per_submitter: 16 << 30,
        }
    }
}

/// What a refused `cleanup_every_s` is told.
const CLEANUP_EVERY_RANGE: &str =
    "cleanup_every_s must be 1..=86400 (seconds between cleanups and sweeps of working folders)";

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("lading-data"),
            store: None,
            work_dir: None,
            storage_root: None,
            inventory: None,
            profiles_dir: None,
            reserve_bytes: 256 << 20,
            unestimated_min_free_bytes: 1 << 30,
            provisioning_round_ms: 5_000,
            report_settle_s: 30,
            work_root_id: None,
            merritt_package_root: None,
            large_job_bytes: 10 << 30,
            large_job_priority: 8,
            estimate_concurrency: 8,
            file_attempts: 3,
            smtp_host: None,
            storage_nodes: Vec::new(),
            fixity: FixitySettings::default(),
            dependencies: DependencySettings::default(),
            smtp_port: 25,
            mail_from: "lading@localhost".into(),
            retention_hours: 24 * 30,
            cleanup_every_s: 3600,
            shoulder: "ark:/99999/fk4".into(),
            stages: BTreeMap::new(),
            listen: "127.0.0.1:8080".into(),
            max_upload_bytes: 8 << 30,
            max_upload_bytes_per_submitter: 32 << 30,
            max_open_batches_per_submitter: 1000,
            tokens: Vec::new(),
            payload: PayloadSettings::default(),
            http: HttpSettings::default(),
            access: AccessSettings::default(),
            storage_umask: "077".into(),
        }
    }
}

impl Config {
    /// The store this config names: its `store`, else `sqlite:DATA_DIR/lading.db`.
    pub fn store_url(&self) -> String {
        self.store
            .clone()
            .unwrap_or_else(|| format!("sqlite:{}", self.data_dir.join("lading.db").display()))
    }

    /// How long Completed and Deleted batches (and working folders of removed jobs) are kept.
    pub fn retention(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.retention_hours.saturating_mul(3600))
    }

    /// Reads `path` (when given) and applies `LADING_*` environment overrides.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let mut cfg = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|error| ConfigError::Read {
                    path: p.to_path_buf(),
                    error,
                })?;
                toml::from_str(&text).map_err(|e| ConfigError::Parse {
                    path: p.to_path_buf(),
                    error: e.to_string(),
                })?
            }
            None => Config::default(),
        };
        if let Some(p) = path
            && !(1..=86_400).contains(&cfg.cleanup_every_s)
        {
            return Err(ConfigError::Parse {
                path: p.to_path_buf(),
                error: format!("{CLEANUP_EVERY_RANGE}, not {}", cfg.cleanup_every_s),
            });
        }
        if let Some(p) = path
            && let Some(k) = (cfg.dependencies.max_wait_h_by_kind.keys())
                .find(|k| !DEPENDENCY_KINDS.contains(&k.as_str()))
        {
            return Err(ConfigError::Parse {
                path: p.to_path_buf(),
                error: format!(
                    "[dependencies] max_wait_h_by_kind names {k:?}, which is not a kind of \
                     dependency (one of: {})",
                    DEPENDENCY_KINDS.join(", ")
                ),
            });
        }
        if let Some(p) = path
            && !(1..=86_400).contains(&cfg.fixity.audit_every_s)
        {
            return Err(ConfigError::Parse {
                path: p.to_path_buf(),
                error: format!(
                    "[fixity] audit_every_s must be 1..=86400 (seconds between the audit's \
                     shares), not {}",
                    cfg.fixity.audit_every_s
                ),
            });
        }
        if let Some(p) = path
            && (1..60).contains(&cfg.fixity.abort_uploads_after_s)
        {
            return Err(ConfigError::Parse {
                path: p.to_path_buf(),
                error: format!(
                    "[fixity] abort_uploads_after_s must be 0 (never) or at least 60 (seconds \
                     an upload may stay open before the audit aborts it), not {}",
                    cfg.fixity.abort_uploads_after_s
                ),
            });
        }
        cfg.apply_env(|k| std::env::var(k).ok())?;
        Ok(cfg)
    }

    /// Overrides from the environment: `LADING_DATA_DIR`, `LADING_WORK_DIR`,
    /// `LADING_STORAGE_ROOT`, `LADING_INVENTORY`, `LADING_PROFILES_DIR`, `LADING_SMTP_HOST`,
    /// `LADING_SMTP_PORT`, `LADING_MAIL_FROM`, `LADING_RESERVE_BYTES`,
    /// `LADING_RETENTION_HOURS`, `LADING_LISTEN`, `LADING_MAX_UPLOAD_BYTES`.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        fn num<T: std::str::FromStr>(name: &str, v: String) -> Result<T, ConfigError> {
            v.parse().map_err(|_| ConfigError::Env {
                name: name.into(),
                error: format!("{v:?} is not a number"),
            })
        }
        if let Some(v) = get("LADING_DATA_DIR") {
            self.data_dir = v.into();
        }
        if let Some(v) = get("LADING_WORK_DIR") {
            self.work_dir = Some(v.into());
        }
        if let Some(v) = get("LADING_STORAGE_ROOT") {
            self.storage_root = Some(v.into());
        }
        if let Some(v) = get("LADING_INVENTORY") {
            self.inventory = Some(v.into());
        }
        if let Some(v) = get("LADING_PROFILES_DIR") {
            self.profiles_dir = Some(v.into());
        }
        if let Some(v) = get("LADING_SMTP_HOST") {
            self.smtp_host = Some(v);
        }
        if let Some(v) = get("LADING_SMTP_PORT") {
            self.smtp_port = num("LADING_SMTP_PORT", v)?;
        }
        if let Some(v) = get("LADING_MAIL_FROM") {
            self.mail_from = v;
        }
        if let Some(v) = get("LADING_RESERVE_BYTES") {
            self.reserve_bytes = num("LADING_RESERVE_BYTES", v)?;
        }
        if let Some(v) = get("LADING_MAX_UPLOAD_BYTES") {
            self.max_upload_bytes = num("LADING_MAX_UPLOAD_BYTES", v)?;
        }
        if let Some(v) = get("LADING_LISTEN") {
            self.listen = v;
        }
        if let Some(v) = get("LADING_RETENTION_HOURS") {
            self.retention_hours = num("LADING_RETENTION_HOURS", v)?;
        }
        if let Some(v) = get("LADING_CLEANUP_EVERY_S") {
            let every: u64 = num("LADING_CLEANUP_EVERY_S", v.clone())?;
            if !(1..=86_400).contains(&every) {
                return Err(ConfigError::Env {
                    name: "LADING_CLEANUP_EVERY_S".into(),
                    error: format!("{CLEANUP_EVERY_RANGE}, not {v}"),
                });
            }
            self.cleanup_every_s = every;
        }
        Ok(())
    }

    pub fn work_dir(&self) -> PathBuf {
        self.work_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("work"))
    }
    /// The id space reservations give the working file system (see `work_root_id`).
    pub fn work_root_id(&self) -> String {
        if let Some(id) = &self.work_root_id {
            return id.clone();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        let dir = self.work_dir();
        let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
        format!("{host}:{}", dir.display())
    }

    pub fn storage_root(&self) -> PathBuf {
        self.storage_root
            .clone()
            .unwrap_or_else(|| self.data_dir.join("storage"))
    }
    pub fn inventory(&self) -> Location {
        match &self.inventory {
            Some(s) => Location::from_setting(s),
            None => Location::Sqlite(self.data_dir.join("inventory.db")),
        }
    }
    pub fn profiles_dir(&self) -> PathBuf {
        self.profiles_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("profiles"))
    }

    /// The settings of stage `name` (a lower-case state name), defaults filled in.
    pub fn stage(&self, name: &str) -> StageConfig {
        self.stage_from(name, StageConfig::default())
    }

    /// How the outbox delivers (`[stages.outbox]`): short tries, kept up for about an hour.
    pub fn outbox(&self) -> StageConfig {
        self.stage_from(
            "outbox",
            StageConfig {
                concurrency: 4,
                timeout: Duration::from_secs(60),
                max_attempts: 12,
                backoff_base: Duration::from_secs(1),
                backoff_max: Duration::from_secs(600),
            },
        )
    }

    /// `defaults` with the `[stages.NAME]` settings over them.
    fn stage_from(&self, name: &str, mut c: StageConfig) -> StageConfig {
        if let Some(s) = self.stages.get(name) {
            if let Some(v) = s.concurrency {
                c.concurrency = v;
            }
            if let Some(v) = s.timeout_s {
                c.timeout = Duration::from_secs(v);
            }
            if let Some(v) = s.max_attempts {
                c.max_attempts = v;
            }
            if let Some(v) = s.backoff_base_ms {
                c.backoff_base = Duration::from_millis(v);
            }
            if let Some(v) = s.backoff_max_ms {
                c.backoff_max = Duration::from_millis(v);
            }
        }
        c
    }

    /// The bits of `storage_umask` (octal), or why it is not one.
    pub fn storage_umask_bits(&self) -> Result<u32, String> {
        u32::from_str_radix(self.storage_umask.trim(), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| {
                format!(
                    "storage_umask {:?} is not an octal mode like \"077\" or \"027\"",
                    self.storage_umask
                )
            })
    }

    /// Reads profile `name` from the profiles directory.
    pub fn profile(&self, name: &str) -> Result<Profile, ConfigError> {
        Profile::load(&self.profiles_dir(), name)
    }
}

/// An ingest profile: where a depositor's content goes and who hears about it.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The file's stem; not written in the file.
    #[serde(skip)]
    pub name: String,
    /// The collection mnemonic (held collections hold its batches).
    pub collection: String,
    /// Priority of its jobs (0..=99, lower first); default 5.
    pub priority: Option<u8>,
    /// Addresses the batch report is mailed to.
    #[serde(default)]
    pub notification: Vec<String>,
    /// POSTed the outcome of each job.
    pub callback_url: Option<String>,
    /// A shell command run in the job's working directory during processing.
    pub command: Option<String>,
    /// Shoulder for minted identifiers, e.g. `ark:/99999/fk4`.
    pub shoulder: Option<String>,
    /// Storage root for this profile's objects, instead of the service's.
    pub storage_root: Option<PathBuf>,
    /// The numbered storage nodes (`[[storage_nodes]]` of the service config) its objects
    /// go to: the first is the primary, the others get replicas. Empty: `storage_root`.
    #[serde(default)]
    pub storage_nodes: Vec<u32>,
    /// Attempts per stage, overriding the service's (`downloading = 3`).
    #[serde(default)]
    pub max_attempts: BTreeMap<String, u32>,
    /// Most jobs of this profile one submitter may have in flight (past Pending, not
    /// finished); the rest wait in Pending. None: no limit.
    pub max_in_flight_per_submitter: Option<u32>,
    /// BagIt profiles (JSON files, relative to the profiles folder) its bags are held to: a
    /// bag naming one of them in `BagIt-Profile-Identifier` is checked against that one,
    /// any other against the first. Empty: RFC 8493 alone.
    #[serde(default)]
    pub bag_profiles: Vec<PathBuf>,
    /// The profiles of `bag_profiles`, read when this profile is.
    #[serde(skip)]
    pub bags: Vec<std::sync::Arc<crate::bagprofile::BagProfile>>,
    /// Storage nodes by a bag's storage option (`Standard = [9501, 9502]`); an option with
    /// no entry fails its job naming it. Empty: every bag goes to `storage_nodes`.
    #[serde(default)]
    pub storage_options: BTreeMap<String, Vec<u32>>,
    /// The tag that names a bag's storage option (default `Storage-Option`; absent from a
    /// bag: `Standard`).
    pub storage_option_tag: Option<String>,
}

impl Profile {
    pub fn load(dir: &Path, name: &str) -> Result<Profile, ConfigError> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
            || name.starts_with('.')
        {
            return Err(ConfigError::BadProfileName(name.into()));
        }
        let path = dir.join(format!("{name}.toml"));
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ConfigError::UnknownProfile {
                    name: name.into(),
                    path,
                });
            }
            Err(error) => return Err(ConfigError::Read { path, error }),
        };
        let mut p: Profile = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.clone(),
            error: e.to_string(),
        })?;
        if p.collection.is_empty() {
            return Err(ConfigError::Parse {
                path,
                error: "collection is missing or empty".into(),
            });
        }
        if p.priority.is_some_and(|x| x > 99) {
            return Err(ConfigError::Parse {
                path,
                error: "priority must be 0..=99".into(),
            });
        }
        for file in &p.bag_profiles {
            let at = if file.is_absolute() {
                file.clone()
            } else {
                dir.join(file)
            };
            let bag =
                crate::bagprofile::BagProfile::load(&at).map_err(|error| ConfigError::Parse {
                    path: path.clone(),
                    error: format!("bag_profiles: {error}"),
                })?;
            p.bags.push(std::sync::Arc::new(bag));
        }
        p.name = name.to_string();
        Ok(p)
    }

    /// The node ids a bag with storage option `option` goes to, or why none.
    pub fn nodes_for_option(&self, option: &str) -> Result<&[u32], String> {
        self.storage_options
            .get(option)
            .map(Vec::as_slice)
            .ok_or_else(|| {
                format!(
                    "the bag's storage option {option:?} has no entry in profile {}'s \
                     [storage_options] ({})",
                    self.name,
                    self.storage_options
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }
}

/// One `[[storage_nodes]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NodeSettings {
    /// Merritt's node number, e.g. 9501.
    pub id: u32,
    /// `s3://BUCKET[/PREFIX]` or `file:///FOLDER`.
    pub url: String,
    /// An S3-compatible server (`http://127.0.0.1:8333`); absent: AWS itself.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// The variable holding the access key id (default `AWS_ACCESS_KEY_ID`).
    pub access_key_id_env: Option<String>,
    /// The variable holding the secret key (default `AWS_SECRET_ACCESS_KEY`).
    pub secret_access_key_env: Option<String>,
    /// Files above this go up in parts of this size (default 64 MiB, at least 5 MiB).
    pub part_size: Option<u64>,
    /// The checksum each request carries and the server checks the body against:
    /// `sha256` (the default: the node itself confirms the SHA-256 the inventory records)
    /// or `crc64nvme` (cheaper for the server; Lading still records its own SHA-256 of
    /// what it sent, and the fixity checker reads SHA-256 back).
    pub checksum: Option<String>,
}

impl NodeSettings {
    /// Node `id` at `url`, every other setting its default.
    pub fn at(id: u32, url: &str) -> NodeSettings {
        NodeSettings {
            id,
            url: url.to_string(),
            endpoint: None,
            region: None,
            access_key_id_env: None,
            secret_access_key_env: None,
            part_size: None,
            checksum: None,
        }
    }
}

/// Where the inventory is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Sqlite(PathBuf),
    /// A `postgres://` or `postgresql://` URL.
    Postgres(String),
}

impl Location {
    /// The configured value: a PostgreSQL URL, or else a SQLite file's path.
    pub fn from_setting(s: &Path) -> Location {
        match s.to_str() {
            Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => {
                Location::Postgres(u.to_string())
            }
            _ => Location::Sqlite(s.to_path_buf()),
        }
    }

    /// The value that configures this location (the inverse of [`Location::from_setting`]).
    pub fn setting(&self) -> PathBuf {
        match self {
            Location::Sqlite(p) => p.clone(),
            Location::Postgres(u) => PathBuf::from(u),
        }
    }
}

#[cfg(test)]
mod tests;
