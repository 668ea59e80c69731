//! `lading jobs …`: the generic job API (CouchDB's couch_jobs) from the command line, and a processor
//! that runs a command per job.

use clap::Subcommand;
use lading_core::time::system_clock;
use lading_jobs::{AddOptions, CommandProcessor, Cron, Every, Jobs, JobsError, State, TypeUpdate};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

#[derive(Subcommand)]
pub enum JobsCmd {
    /// Print a type's activity timeout, or set it (seconds; creates the type). A running job
    /// not updated for this long is re-enqueued by the activity monitor.
    Timeout {
        r#type: String,
        seconds: Option<u64>,
    },
    /// Print a type's settings, or change some (`--timeout-s` makes the type). A failed run
    /// is retried up to --max-attempts runs in all, after --backoff-base-ms doubled per
    /// error (with jitter, at most an hour); --rate-per-s caps accepts per second across
    /// every processor; finished and failed jobs are removed after --keep-finished-s and
    /// --keep-failed-s. For the last three, 0 means none (no limit, kept).
    Type {
        r#type: String,
        #[command(flatten)]
        settings: TypeFlags,
    },
    /// Every type, with its settings and its jobs per state.
    Types,
    /// Retry a failed job: pending now, its attempts reset.
    Retry { r#type: String, id: String },
    /// Add a job per tick of a schedule, exactly once per tick however many monitors run:
    /// the job NAME@TICK (TICK in seconds since the epoch). Replaces a schedule of that name.
    Schedule {
        r#type: String,
        name: String,
        /// Every this many seconds (ticks at multiples of it since the epoch).
        #[arg(long, conflicts_with = "cron", required_unless_present = "cron")]
        every_s: Option<u64>,
        /// A cron expression, "m h dom mon dow", UTC.
        #[arg(long)]
        cron: Option<String>,
        /// The data of each job, JSON.
        #[arg(long, default_value = "{}")]
        data: String,
        #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
        priority: i32,
    },
    /// A type's schedules, with their next tick.
    Schedules { r#type: String },
    /// Remove a schedule (the jobs it added stay).
    Unschedule { r#type: String, name: String },
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
        /// Lower runs first among due jobs: -1000 to 1000 (default 0).
        #[arg(long, allow_hyphen_values = true)]
        priority: Option<i32>,
    },
    /// List a type's jobs in id order.
    List {
        r#type: String,
        /// pending, running, finished or failed.
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
        /// Each loop accepts up to this many jobs at once, runs them one after the other and
        /// finishes them together (fewer round trips for short jobs).
        #[arg(long, default_value_t = 1)]
        batch: usize,
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Run only the activity monitor, until SIGINT/SIGTERM.
    Monitor,
}

fn parse_state(s: &str) -> anyhow::Result<State> {
    Ok(State::parse_named(s)?)
}

/// `--data`: JSON, or an error that says so.
fn parse_data(text: &str) -> Result<Value, JobsError> {
    serde_json::from_str(text).map_err(|e| JobsError::Invalid(format!("--data is not JSON: {e}")))
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
        JobsCmd::Types
            | JobsCmd::List { .. }
            | JobsCmd::Show { .. }
            | JobsCmd::Watch { .. }
            | JobsCmd::Schedules { .. }
    );
    let tree = if reads {
        lading_node::node::open_existing(store).await?
    } else {
        crate::open_store(store).await?
    };
    let jobs = Arc::new(Jobs::new(
        tree.clone(),
        system_clock(),
        lading_node::node::owner(),
    ));
    let r = dispatch(&jobs, cmd).await;
    tree.close().await?;
    r
}

/// Prints `NAME: DONE` once `r`, what was done to it, succeeded.
fn said<T, E: Into<anyhow::Error>>(name: &str, done: &str, r: Result<T, E>) -> anyhow::Result<()> {
    r.map_err(Into::into)?;
    println!("{name}: {done}");
    Ok(())
}

/// The settings `lading jobs type` changes (those not given stay as they are).
#[derive(clap::Args, Debug)]
pub struct TypeFlags {
    #[arg(long)]
    timeout_s: Option<u64>,
    #[arg(long)]
    max_attempts: Option<u32>,
    #[arg(long)]
    backoff_base_ms: Option<u64>,
    #[arg(long)]
    rate_per_s: Option<u32>,
    #[arg(long)]
    keep_finished_s: Option<u64>,
    #[arg(long)]
    keep_failed_s: Option<u64>,
}

impl TypeFlags {
    fn update(self) -> TypeUpdate {
        TypeUpdate {
            timeout_s: self.timeout_s,
            max_attempts: self.max_attempts,
            backoff_base_ms: self.backoff_base_ms,
            rate_per_s: self.rate_per_s,
            keep_finished_s: self.keep_finished_s,
            keep_failed_s: self.keep_failed_s,
        }
    }
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
        JobsCmd::Type { r#type, settings } => {
            let update = settings.update();
            let settings = if update == TypeUpdate::default() {
                j.read_type(&r#type).await?
            } else {
                j.update_type(&r#type, &update).await?
            };
            crate::print_json(&settings)?;
        }
        JobsCmd::Types => {
            let mut out = std::collections::BTreeMap::new();
            for (ty, settings) in j.types().await? {
                let v = j.type_view(&ty, &settings).await?;
                out.insert(ty, v);
            }
            crate::print_json(&out)?;
        }
        JobsCmd::Schedule {
            r#type,
            name,
            every_s,
            cron,
            data,
            priority,
        } => {
            let data = parse_data(&data)?;
            let every = match (every_s, cron) {
                (Some(n), _) => Every::Seconds(n),
                (None, Some(c)) => Every::Cron(Cron::parse(&c)?),
                (None, None) => anyhow::bail!("give --every-s N or --cron \"m h dom mon dow\""),
            };
            let s = j
                .set_schedule(&r#type, &name, every, data, priority)
                .await?;
            let next = s.next_tick_ms().map(lading_core::time::format_rfc3339);
            println!("{name}: next tick {}", next.unwrap_or_default());
        }
        JobsCmd::Schedules { r#type } => {
            let list = j.schedules(&r#type).await?;
            let out: Vec<_> = list.iter().map(|(name, s)| s.view(name)).collect();
            crate::print_json(&out)?;
        }
        JobsCmd::Unschedule { r#type, name } => {
            said(&name, "removed", j.remove_schedule(&r#type, &name).await)?
        }
        JobsCmd::Add {
            r#type,
            id,
            data,
            at,
            in_s,
            priority,
        } => {
            let data = parse_data(&data)?;
            let when = at.or(in_s.map(|s| now_s() + s));
            let opts = AddOptions {
                scheduled_time: when,
                priority,
            };
            let added = j.add_with(&r#type, &id, data, opts).await?;
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
            crate::show(&serde_json::to_value(&list)?, json, false)?;
        }
        JobsCmd::Show { r#type, id, json } => crate::show(
            &serde_json::to_value(j.get_job(&r#type, &id).await?)?,
            json,
            false,
        )?,
        JobsCmd::Retry { r#type, id } => {
            said(&id, "pending (retried)", j.retry(&r#type, &id).await)?
        }
        JobsCmd::Remove { r#type, id } => said(&id, "removed", j.remove(&r#type, &id).await)?,
        JobsCmd::Watch {
            r#type,
            id,
            until,
            timeout_s,
        } => watch(j, &r#type, &id, until, timeout_s).await?,
        JobsCmd::Run {
            r#type,
            concurrency,
            batch,
            command,
        } => process(j, &r#type, concurrency.max(1), batch, command).await?,
        JobsCmd::Monitor => {
            let node = lading_node::node::Node::start_jobs(
                j.clone(),
                lading_node::node::JobsSpec {
                    processor: None,
                    version: crate::VERSION.to_string(),
                },
            );
            let handle = node.handle();
            let mut signals = lading_node::signals::Signals::new()?;
            eprintln!("lading: activity monitor running (stop with Ctrl-C)");
            signals.next().await;
            handle.stop();
            node.run().await.map_err(anyhow::Error::msg)?;
        }
    }
    Ok(())
}

/// `lading jobs watch`: prints each state job `id` of `ty` reaches, until `until` (or a
/// removal, or `timeout_s`, which is an error when `until` was not reached).
async fn watch(
    j: &Arc<Jobs>,
    ty: &str,
    id: &str,
    until: Option<String>,
    timeout_s: Option<u64>,
) -> anyhow::Result<()> {
    let until = until.as_deref().map(parse_state).transpose()?;
    let (sub, state) = j.subscribe(ty, id).await?;
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

/// The processor of `lading jobs run`: `concurrency` loops of [`CommandProcessor`] until
/// SIGINT/SIGTERM (a second signal kills running commands and puts their jobs back), with
/// the activity monitor beside them.
async fn process(
    j: &Arc<Jobs>,
    ty: &str,
    concurrency: usize,
    batch: usize,
    command: Vec<String>,
) -> anyhow::Result<()> {
    let shown = command.join(" ");
    let processor = CommandProcessor::new(j.clone(), ty, command)
        .await?
        .with_batch(batch)?;
    let processor: lading_node::node::Service = Box::new(move |sd| {
        Box::pin(async move {
            processor.run(concurrency, sd).await;
            Ok(())
        })
    });
    let node = lading_node::node::Node::start_jobs(
        j.clone(),
        lading_node::node::JobsSpec {
            processor: Some((format!("generic jobs {ty}"), concurrency, processor)),
            version: crate::VERSION.to_string(),
        },
    );
    let handle = node.handle();
    let running = format!(
        "lading: processing {ty} jobs with {concurrency} at a time: {shown} (stop with Ctrl-C)"
    );
    let work = async { node.run().await.map_err(anyhow::Error::msg) };
    let (stop, abort) = (handle.clone(), handle);
    let (stop, abort) = (move || stop.stop(), move || abort.abort());
    lading_node::signals::until_signal(work, stop, abort, None, &running, crate::say_line).await
}
