//! `lading`, the command line: inspect and administer a store, and measure it.
//!
//! Thin by design: every command opens a store, builds an [`Engine`] and calls one or two of
//! its methods. Exit codes: 0 success, 1 failure, 2 usage, 3 unknown id, 4 refused (an
//! illegal transition, a locked item, invalid input).

/// A status line of a long-running command ("running", "stopping", "stopped"): on stderr as
/// text, or as a log object with `--log-format json`, so that stream stays one JSON object
/// per line.
macro_rules! say {
    ($($t:tt)*) => { crate::say_line(&format!($($t)*)) };
}

static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn say_line(line: &str) {
    if JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed) {
        tracing::info!(target: "lading", "{}", line.strip_prefix("lading: ").unwrap_or(line));
    } else {
        eprintln!("{line}");
    }
}

mod admin;
mod jobs_cmd;
mod progress;
mod serve;

/// mimalloc: the store's writer frees what the async threads allocated, which glibc's
/// per-thread arenas make slow (about a fifth of the writer's time in `perf`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use admin::Admin;
use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use lading_core::JobState;
use lading_core::time::system_clock;
use lading_engine::{Engine, EngineError};
use lading_ingest::Ingest;
use lading_node::client::Client;
use lading_node::node::{self, open_store};
use lading_server::api::SubmitRequest;
use lading_server::ops::{Local, Ops};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// This program's version, with the commit it is built from.
pub(crate) const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("LADING_COMMIT"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "lading",
    version = VERSION,
    about = "A durable, distributed ingest queue"
)]
struct Cli {
    /// The store: `sqlite:PATH` (or a bare path) for the embedded store, or
    /// `zk://host:port[,host:port…][/chroot]` for a ZooKeeper ensemble.
    /// Default: the config's `store`, else sqlite:DATA_DIR/lading.db, the config's data
    /// folder (./lading-data without a config); `bench` makes a fresh store instead.
    #[arg(long, global = true, env = "LADING_STORE")]
    store: Option<String>,
    /// The service configuration (TOML); `LADING_*` environment variables override it.
    #[arg(long, global = true, env = "LADING_CONFIG")]
    config: Option<PathBuf>,
    /// Talk to a `lading serve` at this URL instead of opening a store (submit, status,
    /// admin): e.g. http://127.0.0.1:8080.
    #[arg(long, global = true, env = "LADING_SERVER")]
    server: Option<String>,
    /// The bearer token for --server.
    #[arg(long, global = true, env = "LADING_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Log lines as `text` (colour only on a terminal, and not with NO_COLOR set) or `json`
    /// (one object per line). Which lines: env LADING_LOG (e.g. `info`, `lading_worker=debug`);
    /// by default `info` for `serve` and `worker`, `warn` otherwise.
    #[arg(long, global = true, env = "LADING_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs go to stderr, filtered by LADING_LOG (default `default_level`).
fn init_logs(format: LogFormat, default_level: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("LADING_LOG")
        .unwrap_or_else(|_| default_level.into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => {
            JSON_LOGS.store(true, std::sync::atomic::Ordering::Relaxed);
            logs.json().with_current_span(true).init()
        }
        LogFormat::Text => logs
            .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
            .init(),
    }
}

/// The stages a `worker` or `serve` runs.
#[derive(clap::Args, Debug)]
struct Stages {
    /// Stages, comma-separated: intake, pending, estimating, provisioning, downloading,
    /// processing, storing, recording, notify, reporting, update-reporting, and the access
    /// queues access-small, access-large (assembling requested versions as zips); `none` for
    /// none (an API-only `serve`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "intake,pending,estimating,provisioning,downloading,processing,storing,recording,notify,reporting,update-reporting,access-small,access-large"
    )]
    stages: Vec<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Watch a real batch go through every stage: a manifest of manifests served from a
    /// loopback HTTP server, on a fresh embedded store in --dir.
    Demo {
        #[arg(long, default_value = "lading-demo")]
        dir: PathBuf,
        #[arg(long, default_value_t = 3)]
        objects: usize,
        #[arg(long, default_value_t = 3)]
        files: usize,
    },
    /// Run pipeline stages until SIGINT/SIGTERM.
    Worker {
        #[command(flatten)]
        stages: Stages,
        /// Seconds running jobs get to finish after the first signal.
        #[arg(long, default_value_t = 30)]
        grace_s: u64,
    },
    /// The HTTP API (/api/v1), the pipeline stages (every one by default) and the
    /// generic-jobs activity monitor in one process, until SIGINT/SIGTERM.
    Serve {
        /// Address to listen on (default: the config's `listen`, 127.0.0.1:8080).
        #[arg(long)]
        listen: Option<String>,
        #[command(flatten)]
        stages: Stages,
        #[arg(long, default_value_t = 30)]
        grace_s: u64,
    },
    /// Submit a batch: PAYLOAD is an http(s) or file:// URL (with --server, also a local file,
    /// uploaded).
    Submit {
        payload: String,
        #[arg(long)]
        profile: String,
        /// file, container, manifest, batch-manifest, single-file-batch-manifest,
        /// container-batch-manifest.
        #[arg(long = "type", default_value = "file")]
        payload_type: String,
        #[arg(long)]
        submitter: Option<String>,
        #[arg(long)]
        title: Option<String>,
        /// Wait until the batch is reported, showing its progress, then print the report.
        #[arg(long)]
        wait: bool,
    },
    /// Print the tree (or the part under PATH) as a path → data map.
    Dump {
        #[arg(default_value = "/")]
        path: String,
        #[arg(long, value_enum, default_value_t = Format::Yaml)]
        format: Format,
    },
    /// Show a batch (bid…, or its uuid), a job (jid…) or an access request (qid…); with no
    /// id, counts per state.
    Status {
        id: Option<String>,
        /// Print the record as JSON (as the API gives it) instead of text.
        #[arg(long)]
        json: bool,
        /// A job's or batch's transitions instead: when, from, to, which host, and why.
        #[arg(long, requires = "id")]
        history: bool,
    },
    /// Administrative actions.
    Admin {
        #[command(subcommand)]
        action: Admin,
    },
    /// Generic jobs (CouchDB's couch_jobs API): types, add, list, show, remove, watch, and a processor that
    /// runs a command per job.
    Jobs {
        #[command(subcommand)]
        action: jobs_cmd::JobsCmd,
    },
    /// Print a completion script for a shell, e.g. `lading completions bash >
    /// ~/.local/share/bash-completion/completions/lading`, or for zsh into a folder on
    /// $fpath as `_lading`, or for fish into ~/.config/fish/completions/lading.fish.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), e.g. `lading man | man -l -`, or install it with
    /// `lading man > /usr/local/share/man/man1/lading.1`.
    Man,
    /// Measure the store.
    Bench {
        #[command(subcommand)]
        what: lading_bench::Bench,
    },
    /// Test aid: acquire a job in STATE (default Pending) and hold its lock until killed
    /// (prints the job id). With --advance-on-input, moves it on once a line arrives on
    /// standard input and prints `committed` or the error (exit 4 when the lease was lost).
    #[command(hide = true)]
    HoldJob {
        #[arg(long, default_value = "Pending")]
        state: String,
        #[arg(long)]
        advance_on_input: bool,
    },
    /// Test aid: move every job it can acquire on by one stage (no work), until idle for
    /// --idle-ms; prints `transitions completed`.
    #[command(hide = true)]
    Drive {
        #[arg(long, default_value_t = 1000)]
        idle_ms: u64,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Yaml,
    Json,
}

/// An engine on an existing store (commands that read or administer one never create it).
async fn engine(url: &str) -> anyhow::Result<Engine> {
    let e = Engine::new(
        node::open_existing(url).await?,
        system_clock(),
        node::owner(),
    );
    e.init().await?;
    Ok(e)
}

/// Writes to standard output; a reader that went away (`lading dump | head`) ends the
/// program quietly instead of with a panic.
fn out(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        r => Ok(r?),
    }
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    out(&format!("{}\n", serde_json::to_string_pretty(v)?))
}

/// A record (or a list of transitions, `history`) as JSON or as text for a person.
fn show(v: &serde_json::Value, json: bool, history: bool) -> anyhow::Result<()> {
    match (json, history) {
        (true, _) => print_json(v),
        (false, true) => out(&lading_node::text::history(v)),
        (false, false) => out(&lading_node::text::human(v)),
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // The config is read once: it names the store (after --store and LADING_STORE), and
    // every command that works on the store finds the same one.
    let through_server = cli.server.is_some()
        && matches!(
            cli.command,
            Command::Submit { .. } | Command::Status { .. } | Command::Admin { .. }
        );
    let own_store = matches!(cli.command, Command::Demo { .. } | Command::Bench { .. });
    let needs_config = !own_store && !through_server;
    let cfg = if needs_config {
        node::config(cli.config.as_deref())?
    } else {
        lading_ingest::Config::default()
    };
    let store = cli.store.clone().unwrap_or_else(|| cfg.store_url());
    // Where the store came from, for an error that finds none.
    let store_from = match (&cli.store, &cfg.store, &cli.config) {
        (Some(_), _, _) => "--store or LADING_STORE".to_string(),
        (None, Some(_), Some(c)) => format!("the store of {}", c.display()),
        (None, None, Some(c)) => format!("data_dir {} of {}", cfg.data_dir.display(), c.display()),
        (None, _, None) => format!(
            "the default data_dir {} (no --config or LADING_CONFIG given)",
            cfg.data_dir.display()
        ),
    };
    let r = run_on(cli, cfg, &store).await;
    match r {
        Err(e) if is_no_store(&e) => {
            Err(e.context(format!("the store was looked for from {store_from}")))
        }
        r => r,
    }
}

/// The store a command must not create is not there.
fn is_no_store(e: &anyhow::Error) -> bool {
    e.downcast_ref::<node::NoStore>().is_some()
        || matches!(
            e.downcast_ref::<lading_node::NodeError>()
                .map(|n| n.cause()),
            Some(lading_node::NodeError::NoStore(_))
        )
}

async fn run_on(cli: Cli, cfg: lading_ingest::Config, store: &str) -> anyhow::Result<()> {
    let store = store.to_string();
    match cli.command {
        Command::Demo {
            dir,
            objects,
            files,
        } => {
            lading_node::demo::demo(&dir, objects.max(1), files.max(1), say_line).await?;
        }
        Command::Worker { stages, grace_s } => {
            let (mut spec, what) = node::NodeSpec::for_stages(&stages.stages)?;
            spec.version = Some(VERSION.to_string());
            let node = node::Node::start(node::ingest(&store, cfg).await?, spec).await?;
            let running = format!("lading: running {what} (stop with Ctrl-C)");
            node.run_until_signal(std::time::Duration::from_secs(grace_s), &running, say_line)
                .await?;
        }
        Command::Serve {
            listen,
            stages,
            grace_s,
        } => {
            let (mut spec, what) = node::NodeSpec::for_stages(&stages.stages)?;
            spec.version = Some(VERSION.to_string());
            serve::serve(
                &store,
                cfg,
                listen,
                (spec, what),
                std::time::Duration::from_secs(grace_s),
            )
            .await?
        }
        Command::Submit { .. } | Command::Status { .. } | Command::Admin { .. } => {
            if let Some(server) = cli.server.as_deref() {
                return console(&Client::new(server, cli.token)?, cli.command).await;
            }
            // Reading and administering never create a store; submitting may.
            let ingest = match cli.command {
                Command::Submit { .. } => node::ingest(&store, cfg).await?,
                _ => node::ingest_on(Arc::new(engine(&store).await?), cfg)?,
            };
            let r = match cli.command {
                Command::Admin {
                    action: Admin::Cleanup { older_than_hours },
                } => admin::cleanup(&ingest, older_than_hours).await,
                Command::Admin {
                    action: Admin::Fixity { action, node, ark },
                } => admin::fixity(&ingest, action, node, ark.as_deref()).await,
                Command::Admin {
                    action: Admin::CheckConfig,
                } => admin::check_config(&ingest).await,
                Command::Admin {
                    action:
                        Admin::Restore {
                            ark,
                            version,
                            format,
                            output,
                        },
                } => admin::restore(&ingest, &ark, version, format, &output).await,
                cmd => console(&Local(ingest.clone()), cmd).await,
            };
            ingest.engine.tree().close().await?;
            r?
        }
        Command::Dump { path, format } => {
            let tree = node::open_existing(&store).await?;
            lading_core::tree::validate_path(&path)?;
            let map = lading_engine::dump(tree.as_ref(), &path).await?;
            match format {
                Format::Json => print_json(&map)?,
                Format::Yaml => out(&serde_yaml_ng::to_string(&map)?)?,
            }
            tree.close().await?;
        }
        Command::Jobs { action } => jobs_cmd::run(&store, action).await?,
        // Answered in `main`, before any store or runtime.
        Command::Completions { .. } | Command::Man => {}
        Command::Bench { what } => {
            // The benches that reach storage nodes read them from the config.
            let nodes = matches!(
                what,
                lading_bench::Bench::Storage { .. }
                    | lading_bench::Bench::Pipeline { node: Some(_), .. }
            );
            let cfg = if nodes {
                node::config(cli.config.as_deref())?
            } else {
                lading_ingest::Config::default()
            };
            lading_bench::run(what, cli.store.as_deref(), &cfg).await?
        }
        Command::Drive { idle_ms } => {
            let e = engine(&store).await?;
            let (t, c) = lading_bench::drive(&e, std::time::Duration::from_millis(idle_ms)).await?;
            println!("{t} {c}");
            e.tree().close().await?;
        }
        Command::HoldJob {
            state,
            advance_on_input,
        } => {
            let state = JobState::parse_named(&state).map_err(anyhow::Error::msg)?;
            lading_bench::hold_job(&engine(&store).await?, state, advance_on_input).await?;
        }
    }
    Ok(())
}

/// `submit --wait` saw its batch end Failed (exit code 5).
#[derive(Debug, thiserror::Error)]
#[error("batch {0} ended Failed")]
struct BatchFailed(String);

/// Submit, status and admin: the same on a store and through a server.
async fn console<O: Ops>(ops: &O, cmd: Command) -> anyhow::Result<()>
where
    anyhow::Error: From<O::Error>,
{
    match cmd {
        Command::Submit {
            payload,
            profile,
            payload_type,
            submitter,
            title,
            wait,
        } => {
            let req = SubmitRequest {
                payload_url: Some(payload),
                profile,
                payload_type: Some(payload_type),
                submitter,
                title,
                ..Default::default()
            };
            let bid = ops.submit(req).await?.id;
            println!("{bid}");
            if wait {
                progress::follow(ops, &bid).await?;
                let (b, report) = lading_server::ops::report(ops, &bid).await?;
                print!("{report}");
                if b.status.status == lading_core::BatchState::Failed {
                    return Err(BatchFailed(bid).into());
                }
            }
        }
        Command::Status { id, json, history } => {
            let v = ops.record(id.as_deref()).await?;
            if history {
                let list = v["status"].get("history").cloned();
                show(&list.unwrap_or(serde_json::json!([])), json, true)?
            } else {
                show(&v, json, false)?
            }
        }
        Command::Admin { action } => admin::admin(ops, action).await?,
        _ => unreachable!("only submit, status and admin"),
    }
    Ok(())
}

/// A verb on a store this process opened: the error of the layer that refused.
fn ops_exit_code(o: &lading_server::ops::OpsError) -> u8 {
    use lading_server::ops::OpsError as O;
    match o {
        O::Engine(e) => engine_exit_code(e),
        O::Submit(e) => submit_exit_code(e),
        O::Api(a) => lading_node::client::exit_code(a.status.as_u16()),
        O::BadId(_) | O::Unsupported(_) => 4,
        O::Json(_) => 1,
    }
}

/// A failure of the process's setup, a verb or the API's client: the error of the layer that
/// refused, under what was being done.
fn node_exit_code(n: &lading_node::NodeError) -> u8 {
    use lading_node::NodeError as N;
    match n.cause() {
        N::Http(h) => h.exit_code(),
        N::Ops(o) => ops_exit_code(o),
        N::Engine(e) => engine_exit_code(e),
        N::Tree(e) => tree_exit_code(e),
        N::Submit(e) => submit_exit_code(e),
        N::NoStore(_) => 3,
        N::Config(_) | N::Json(_) | N::Client(_) | N::Io(_) | N::Other(_) => 1,
        N::Context { .. } => 1,
    }
}

fn exit_code(err: &anyhow::Error) -> u8 {
    if let Some(o) = err.downcast_ref::<lading_server::ops::OpsError>() {
        return ops_exit_code(o);
    }
    if let Some(n) = err.downcast_ref::<lading_node::NodeError>() {
        return node_exit_code(n);
    }
    if let Some(b) = err.downcast_ref::<lading_bench::BenchError>() {
        use lading_bench::BenchError as B;
        return match b {
            B::Node(n) => node_exit_code(n),
            B::Engine(e) => engine_exit_code(e),
            B::Tree(e) => tree_exit_code(e),
            B::Submit(e) => submit_exit_code(e),
            _ => 1,
        };
    }
    if let Some(h) = err.downcast_ref::<lading_node::client::HttpError>() {
        return h.exit_code();
    }
    if let Some(a) = err.downcast_ref::<lading_server::ApiError>() {
        return lading_node::client::exit_code(a.status.as_u16());
    }
    if err.downcast_ref::<node::NoStore>().is_some() {
        return 3;
    }
    if err.downcast_ref::<BatchFailed>().is_some() {
        return 5;
    }
    // A submission the service refuses is bad input.
    if let Some(e) = err.downcast_ref::<lading_ingest::SubmitError>() {
        return submit_exit_code(e);
    }
    if let Some(e) = err.downcast_ref::<lading_core::TreeError>() {
        return tree_exit_code(e);
    }
    use lading_jobs::JobsError;
    match err.downcast_ref::<JobsError>() {
        Some(JobsError::NoJob { .. } | JobsError::NoType(_)) => return 3,
        Some(JobsError::Invalid(_) | JobsError::Halt { .. }) => return 4,
        _ => {}
    }
    match err.downcast_ref::<EngineError>() {
        Some(e) => engine_exit_code(e),
        None if err.downcast_ref::<lading_core::layout::BadId>().is_some() => 4,
        None => 1,
    }
}

fn submit_exit_code(e: &lading_ingest::SubmitError) -> u8 {
    use lading_ingest::SubmitError as S;
    match e {
        S::Engine(e) => engine_exit_code(e),
        S::Inventory(_) => 1,
        _ => 4,
    }
}

fn engine_exit_code(e: &EngineError) -> u8 {
    match e {
        EngineError::NoBatch(_) | EngineError::NoJob(_) | EngineError::NoAccess(_) => 3,
        EngineError::Illegal(_)
        | EngineError::Locked(_)
        | EngineError::ForeignLocked(_)
        | EngineError::Invalid(_) => 4,
        EngineError::Tree(t) => tree_exit_code(t),
        _ => 1,
    }
}

/// A path that is not in the tree is unknown (3); one that cannot be a path is bad input (4).
fn tree_exit_code(e: &lading_core::TreeError) -> u8 {
    match e.root() {
        lading_core::TreeError::NoNode(_) => 3,
        lading_core::TreeError::InvalidPath(..) => 4,
        _ => 1,
    }
}

/// The command line, each global option shown only under the commands it applies to: the
/// store and config under those that open a store, `--server` and `--token` under those that
/// can work through a server. (Elsewhere they are still accepted, and `--server` refused.)
fn command() -> clap::Command {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    cmd.build();
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    for name in names {
        let store = !matches!(name.as_str(), "demo" | "completions" | "man" | "help");
        let server = matches!(name.as_str(), "submit" | "status" | "admin");
        cmd = cmd.mut_subcommand(&name, |sc| hide_globals(sc, store, server));
    }
    cmd
}

fn hide_globals(mut sc: clap::Command, store: bool, server: bool) -> clap::Command {
    let hidden = [
        ("store", !store),
        ("config", !store),
        ("server", !server),
        ("token", !server),
    ];
    // In place (`mut_arg` would move the argument behind the ones the build added).
    sc = sc.mut_args(|a| {
        let hide = hidden.iter().any(|(id, h)| *h && a.get_id() == *id);
        if hide { a.hide(true) } else { a }
    });
    let names: Vec<String> = sc
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    for name in names {
        sc = sc.mut_subcommand(&name, |c| hide_globals(c, store, server));
    }
    sc
}

fn main() -> ExitCode {
    // Everything Lading creates (stores, inventory, tokens, uploads, working and stored
    // files) is its own user's alone: files 0600, folders 0700. `storage_umask` widens the
    // stored objects.
    // SAFETY: umask only sets the process's file-creation mask.
    unsafe {
        libc::umask(0o077);
    }
    let matches = command().get_matches();
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if cli.server.is_some()
        && !matches!(
            cli.command,
            Command::Submit { .. } | Command::Status { .. } | Command::Admin { .. }
        )
    {
        let name = matches.subcommand_name().unwrap_or("this command");
        if matches.value_source("server") == Some(clap::parser::ValueSource::EnvVariable) {
            eprintln!(
                "lading: LADING_SERVER is set, but `lading {name}` works on the store itself, not through a server"
            );
        } else {
            eprintln!(
                "error: `lading {name}` works on the store itself and cannot use --server (submit, status and admin can)"
            );
            return ExitCode::from(2);
        }
    }
    match &cli.command {
        Command::Completions { shell } => {
            let mut cmd = command();
            let mut buf = Vec::new();
            clap_complete::generate(*shell, &mut cmd, "lading", &mut buf);
            return match out(&String::from_utf8_lossy(&buf)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(1)
                }
            };
        }
        Command::Man => {
            let mut buf = Vec::new();
            let page = clap_mangen::Man::new(command());
            let r = page
                .render(&mut buf)
                .map_err(anyhow::Error::from)
                .and_then(|()| out(&String::from_utf8_lossy(&buf)));
            return match r {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(1)
                }
            };
        }
        _ => {}
    }
    let long_running = matches!(cli.command, Command::Serve { .. } | Command::Worker { .. });
    init_logs(cli.log_format, if long_running { "info" } else { "warn" });
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}
