//! `lading jobs …`: the generic job API (CouchDB's couch_jobs) from the command line, and a processor
//! that runs a command per job.

use clap::Subcommand;
use lading_core::time::system_clock;
use lading_jobs::{CommandProcessor, Jobs, JobsError, State};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Subcommand)]
pub enum JobsCmd {
    /// Print a type's activity timeout, or set it (seconds; creates the type). A running job
    /// not updated for this long is re-enqueued by the activity monitor.
    Timeout {
        r#type: String,
        seconds: Option<u64>,
    },
    /// Every type, with its timeout and its jobs per state.
    Types,
    /// Add a job. An existing id is updated as couch_jobs does: pending → new data (and time,
    /// if given); running → runs again with this data when it finishes; finished → pending.
    Add {
        r#type: String,
        id: String,
        /// The job's data, JSON.
        #[arg(long, default_value = "{}")]
        data: String,
        /// Due at this time (seconds since the epoch).
        #[arg(long, conflicts_with = "in_s")]
        at: Option<u64>,
        /// Due this many seconds from now.
        #[arg(long = "in")]
        in_s: Option<u64>,
    },
    /// List a type's jobs in id order.
    List {
        r#type: String,
        /// pending, running or finished.
        #[arg(long)]
        state: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Start after this id (the last id of the previous page).
        #[arg(long)]
        after: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one job.
    Show {
        r#type: String,
        id: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove a job; a processor running it is told to halt.
    Remove { r#type: String, id: String },
    /// Print the job's state, then each change, until it reaches --until (or is removed) or
    /// --timeout-s passes (exit 1).
    Watch {
        r#type: String,
        id: String,
        #[arg(long)]
        until: Option<String>,
        #[arg(long)]
        timeout_s: Option<u64>,
    },
    /// Process jobs until SIGINT/SIGTERM: for each, run COMMAND with the job's data as JSON on
    /// standard input and LADING_JOB_TYPE / LADING_JOB_ID set, heartbeating while it runs. If
    /// it exits 0 and prints JSON, that becomes the job's data. Also runs the activity monitor.
    Run {
        r#type: String,
        /// Jobs run at once.
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Run only the activity monitor, until SIGINT/SIGTERM.
    Monitor,
}

fn parse_state(s: &str) -> anyhow::Result<State> {
    State::parse(s).ok_or_else(|| {
        JobsError::Invalid(format!(
            "unknown state {s:?}: expected pending, running or finished"
        ))
        .into()
    })
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub async fn run(store: &str, cmd: JobsCmd) -> anyhow::Result<()> {
    // Reading commands never create a store.
    let reads = matches!(
        cmd,
        JobsCmd::Types | JobsCmd::List { .. } | JobsCmd::Show { .. } | JobsCmd::Watch { .. }
    );
    let tree = if reads {
        lading_server::node::open_existing(store).await?
    } else {
        crate::open_store(store).await?
    };
    let jobs = Arc::new(Jobs::new(
        tree.clone(),
        system_clock(),
        lading_server::node::owner(),
    ));
    let r = dispatch(&jobs, cmd).await;
    tree.close().await?;
    r
}

async fn dispatch(j: &Arc<Jobs>, cmd: JobsCmd) -> anyhow::Result<()> {
    match cmd {
        JobsCmd::Timeout { r#type, seconds } => match seconds {
            Some(s) => {
                j.set_type_timeout(&r#type, s).await?;
                println!("{type}: activity timeout {s} s", type = r#type);
            }
            None => println!("{}", j.get_type_timeout(&r#type).await?),
        },
        JobsCmd::Types => {
            let mut out = serde_json::Map::new();
            for (ty, timeout) in j.types().await? {
                let c = j.counts(&ty).await?;
                let n = |s| c.get(&s).copied().unwrap_or(0);
                out.insert(
                    ty,
                    json!({"timeout_s": timeout, "pending": n(State::Pending),
                           "running": n(State::Running), "finished": n(State::Finished)}),
                );
            }
            crate::print_json(&out)?;
        }
        JobsCmd::Add {
            r#type,
            id,
            data,
            at,
            in_s,
        } => {
            let data: Value = serde_json::from_str(&data)
                .map_err(|e| JobsError::Invalid(format!("--data is not JSON: {e}")))?;
            let when = at.or(in_s.map(|s| now_s() + s));
            let added = j.add(&r#type, &id, data, when).await?;
            println!("{id}: {}", json!(added).as_str().unwrap_or("added"));
        }
        JobsCmd::List {
            r#type,
            state,
            limit,
            after,
            json,
        } => {
            let state = state.as_deref().map(parse_state).transpose()?;
            let list = j.list(&r#type, state, after.as_deref(), limit).await?;
            crate::view::print(&serde_json::to_value(&list)?, json)?;
        }
        JobsCmd::Show { r#type, id, json } => {
            crate::view::print(&serde_json::to_value(j.get_job(&r#type, &id).await?)?, json)?
        }
        JobsCmd::Remove { r#type, id } => {
            j.remove(&r#type, &id).await?;
            println!("{id}: removed");
        }
        JobsCmd::Watch {
            r#type,
            id,
            until,
            timeout_s,
        } => {
            let until = until.as_deref().map(parse_state).transpose()?;
            let (sub, state) = j.subscribe(&r#type, &id).await?;
            println!("{id}: {state}");
            if until == Some(state) {
                return Ok(());
            }
            let deadline = timeout_s.map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
            loop {
                let left = deadline.map_or(Duration::from_secs(3600), |d| {
                    d.saturating_duration_since(tokio::time::Instant::now())
                });
                match j.wait(&[sub], None, left).await? {
                    Some(c) => match c.state {
                        None => {
                            println!("{id}: removed");
                            return Ok(());
                        }
                        Some(s) => {
                            println!("{id}: {s}");
                            if until == Some(s) {
                                return Ok(());
                            }
                        }
                    },
                    None if deadline.is_some() => {
                        let waited = until.map_or("a change".to_string(), |u| format!("{u}"));
                        anyhow::bail!("{id}: still not {waited} when the timeout ran out")
                    }
                    None => {}
                }
            }
        }
        JobsCmd::Run {
            r#type,
            concurrency,
            command,
        } => process(j, &r#type, concurrency.max(1), command).await?,
        JobsCmd::Monitor => {
            let stop = Arc::new(Notify::new());
            let (jj, s) = (j.clone(), stop.clone());
            let task = tokio::spawn(async move { jj.run_monitor(&s).await });
            eprintln!("lading: activity monitor running (stop with Ctrl-C)");
            crate::pipeline::signal().await;
            stop.notify_one();
            task.await?;
        }
    }
    Ok(())
}

/// The processor of `lading jobs run`: `concurrency` loops of [`CommandProcessor`] until
/// SIGINT/SIGTERM (a second signal kills running commands and puts their jobs back), with
/// the activity monitor beside them.
async fn process(
    j: &Arc<Jobs>,
    ty: &str,
    concurrency: usize,
    command: Vec<String>,
) -> anyhow::Result<()> {
    let shown = command.join(" ");
    let processor = CommandProcessor::new(j.clone(), ty, command).await?;
    let (handle, shutdown) = lading_worker::Shutdown::new();
    let monitor_stop = Arc::new(Notify::new());
    let monitor = {
        let (jj, s) = (j.clone(), monitor_stop.clone());
        tokio::spawn(async move { jj.run_monitor(&s).await })
    };
    eprintln!(
        "lading: processing {ty} jobs with {concurrency} at a time: {shown} (stop with Ctrl-C)"
    );
    let mut signals = crate::pipeline::Signals::new()?;
    let all = processor.run(concurrency, shutdown);
    tokio::pin!(all);
    tokio::select! {
        () = &mut all => {}
        _ = signals.next() => {
            eprintln!("lading: stopping; running jobs finish first (signal again to stop now)");
            handle.stop();
            tokio::select! {
                () = &mut all => {}
                _ = signals.next() => {
                    eprintln!("lading: stopping now; running jobs go back to pending");
                    handle.abort();
                    all.await;
                }
            }
        }
    }
    monitor_stop.notify_one();
    monitor.await?;
    eprintln!("lading: stopped");
    Ok(())
}
