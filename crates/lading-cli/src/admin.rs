//! `lading admin …`: job, batch, collection, queue, outbox and lock administration, on the
//! store directly or through a server (`--server`).

use super::*;

#[derive(Subcommand)]
pub(crate) enum Admin {
    /// Jobs: hold (Pending → Held), release (Held → Pending), requeue a Failed job (to the
    /// stage that failed, or --to STATE), delete (Failed/Held → Deleted; Completed/Deleted are
    /// purged). `requeue --batch BID [--stage S]` requeues every Failed job of a batch (only
    /// those that failed at stage S).
    Job {
        #[arg(value_enum)]
        action: JobAction,
        /// The job (jid…); not with --batch.
        #[arg(required_unless_present = "batch", conflicts_with = "batch")]
        job: Option<String>,
        /// Requeue target state.
        #[arg(long)]
        to: Option<String>,
        /// requeue only: every Failed job of this batch (bid…).
        #[arg(long)]
        batch: Option<String>,
        /// With --batch: only the jobs that failed at this stage (e.g. Downloading).
        #[arg(long, requires = "batch")]
        stage: Option<String>,
    },
    /// Batches: hold, release, delete, update-reporting.
    Batch {
        #[arg(value_enum)]
        action: BatchAction,
        batch: String,
    },
    /// Collections: hold or release (release puts their Held batches and jobs back to Pending).
    Collection {
        #[arg(value_enum)]
        action: HoldAction,
        name: String,
    },
    /// Queues (ingest, accessSmall, accessLarge): pause or resume.
    Queue {
        #[arg(value_enum)]
        action: PauseAction,
        name: String,
    },
    /// The outbox of mails and callbacks: list it, or retry an entry (e.g. one given up on,
    /// after its receiver was fixed).
    Outbox {
        #[arg(value_enum)]
        action: OutboxAction,
        /// The entry to retry (its name, e.g. e0000000007).
        entry: Option<String>,
    },
    /// Clear a lock left by another tool: a persistent storage or inventory lock (a crashed
    /// Merritt process), or the lock on a Held batch (a failed Merritt consumer's);
    /// `lading status` lists them under `foreign_locks`.
    ClearLock {
        /// storage, inventory or batch.
        kind: String,
        /// The lock's name, as `lading status` shows it.
        name: String,
    },
    /// Remove Completed and Deleted batches (and their jobs) last changed more than
    /// --older-than-hours ago.
    Cleanup {
        #[arg(long, default_value_t = 24 * 7)]
        older_than_hours: u64,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum OutboxAction {
    List,
    Retry,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum JobAction {
    Hold,
    Release,
    Requeue,
    Delete,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum BatchAction {
    Hold,
    Release,
    Delete,
    UpdateReporting,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum HoldAction {
    Hold,
    Release,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum PauseAction {
    Pause,
    Resume,
}

pub(crate) async fn admin(e: &Arc<Engine>, action: Admin, cfg: Config) -> anyhow::Result<()> {
    match action {
        Admin::Job {
            action,
            job,
            to,
            batch,
            stage,
        } => {
            let target = match to.as_deref() {
                None => None,
                Some(s) => Some(JobState::parse_named(s).map_err(EngineError::Invalid)?),
            };
            if (target.is_some() || batch.is_some()) && !matches!(action, JobAction::Requeue) {
                return Err(
                    EngineError::Invalid("--to and --batch apply to requeue only".into()).into(),
                );
            }
            if let Some(batch) = batch {
                let bid = BatchId::parse(&batch)?;
                let stage = match stage.as_deref() {
                    None => None,
                    Some(s) => Some(JobState::parse_named(s).map_err(EngineError::Invalid)?),
                };
                return print_requeued(
                    e.requeue_failed(&bid, stage, target)
                        .await?
                        .into_iter()
                        .map(|(jid, r)| {
                            (
                                jid.to_string(),
                                r.map(|st| st.status.to_string()).map_err(|e| e.to_string()),
                            )
                        }),
                );
            }
            let jid = JobId::parse(job.as_deref().unwrap_or_default())?;
            let st = match action {
                JobAction::Hold => Some(e.hold_job(&jid).await?),
                JobAction::Release => Some(e.release_job(&jid).await?),
                JobAction::Requeue => Some(e.requeue_job(&jid, target).await?),
                JobAction::Delete => e.delete_job(&jid).await?,
            };
            match st {
                Some(st) => println!("{jid}: {}", st.status),
                None => println!("{jid}: purged"),
            }
        }
        Admin::Batch { action, batch } => {
            let bid = BatchId::parse(&batch)?;
            let st = match action {
                BatchAction::Hold => e.hold_batch(&bid).await?,
                BatchAction::Release => e.release_batch(&bid).await?,
                BatchAction::Delete => e.delete_batch(&bid).await?,
                BatchAction::UpdateReporting => e.update_reporting(&bid).await?,
            };
            println!("{bid}: {}", st.status);
        }
        Admin::Collection { action, name } => match action {
            HoldAction::Hold => {
                let new = e.hold_collection(&name).await?;
                println!(
                    "collection {name}: held{}",
                    if new { "" } else { " (already)" }
                );
            }
            HoldAction::Release => {
                let was_held = e.collection_held(&name).await?;
                let n = e.release_collection(&name).await?;
                if was_held || n > 0 {
                    println!(
                        "collection {name}: released, {n} held batches and jobs back to Pending"
                    );
                } else {
                    println!("collection {name}: was not held; nothing released");
                }
            }
        },
        Admin::Queue { action, name } => {
            let changed = match action {
                PauseAction::Pause => e.pause_queue(&name).await?,
                PauseAction::Resume => e.resume_queue(&name).await?,
            };
            let word = if matches!(action, PauseAction::Pause) {
                "paused"
            } else {
                "resumed"
            };
            println!(
                "queue {name}: {word}{}",
                if changed { "" } else { " (already)" }
            );
        }
        Admin::Outbox { action, entry } => match (action, entry) {
            (OutboxAction::List, _) => {
                let items = e.outbox().await?;
                print_outbox(&serde_json::to_value(&items)?);
            }
            (OutboxAction::Retry, Some(name)) => {
                e.retry_effect(&name).await?;
                println!("{name}: due now");
            }
            (OutboxAction::Retry, None) => {
                bail!("name the entry to retry (lading admin outbox list)")
            }
        },
        Admin::ClearLock { kind, name } => {
            e.clear_foreign_lock(&kind, &name).await?;
            println!("{kind} lock {name}: cleared");
        }
        Admin::Cleanup { older_than_hours } => {
            let ingest = Ingest::new(e.clone(), cfg);
            let c = lading_ingest::cleanup::cleanup(
                &ingest,
                e.clock().now_ms(),
                older_than_hours.saturating_mul(3_600_000),
            )
            .await?;
            println!(
                "removed {} batches and {} jobs (with their working directories and uploads) and {} access requests (with their zips) finished more than {older_than_hours} h ago; gave back {} quota slots and folders; dropped {} submitter-index entries of batches another tool deleted",
                c.batches, c.jobs, c.access, c.quotas, c.index_entries
            );
        }
    }
    Ok(())
}

/// What a bulk requeue did: a line per job, and exit 4 when any was refused.
fn print_requeued(
    results: impl Iterator<Item = (String, Result<String, String>)>,
) -> anyhow::Result<()> {
    let (mut done, mut refused) = (0, 0);
    for (jid, r) in results {
        match r {
            Ok(st) => {
                done += 1;
                println!("{jid}: {st}");
            }
            Err(e) => {
                refused += 1;
                println!("{jid}: not requeued: {e}");
            }
        }
    }
    println!("{done} requeued, {refused} refused");
    if refused > 0 {
        std::io::Write::flush(&mut std::io::stdout())?;
        std::process::exit(4);
    }
    Ok(())
}

/// The command-line name of a value (`update-reporting`), which is also the API's.
fn value_name(v: impl ValueEnum) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

/// `lading admin …` through a server.
pub(crate) async fn admin_remote(
    c: &lading_server::client::Client,
    action: Admin,
) -> anyhow::Result<()> {
    let v = match action {
        Admin::Job {
            action,
            job: _,
            to,
            batch: Some(batch),
            stage,
        } => {
            if !matches!(action, JobAction::Requeue) {
                bail!("--batch applies to requeue only");
            }
            let body = json!({"to": to, "stage": stage});
            let v = c
                .call(
                    "POST",
                    &format!("/api/v1/batches/{batch}/requeue-failed"),
                    Some(body),
                )
                .await?;
            let field =
                |x: &serde_json::Value, k: &str| x[k].as_str().unwrap_or_default().to_string();
            let done = v["requeued"].as_array().into_iter().flatten();
            let refused = v["refused"].as_array().into_iter().flatten();
            return print_requeued(
                done.map(|x| (field(x, "id"), Ok(field(x, "status"))))
                    .chain(refused.map(|x| (field(x, "id"), Err(field(x, "error"))))),
            );
        }
        Admin::Job {
            action, job, to, ..
        } => {
            let job = job.unwrap_or_default();
            let body = to.map(|t| json!({ "to": t }));
            c.call(
                "POST",
                &format!("/api/v1/jobs/{job}/{}", value_name(action)),
                body,
            )
            .await?
        }
        Admin::Batch { action, batch } => {
            c.call(
                "POST",
                &format!("/api/v1/batches/{batch}/{}", value_name(action)),
                None,
            )
            .await?
        }
        Admin::Collection { action, name } => {
            let m = if matches!(action, HoldAction::Hold) {
                "PUT"
            } else {
                "DELETE"
            };
            c.call(m, &format!("/api/v1/collections/{name}/hold"), None)
                .await?
        }
        Admin::Queue { action, name } => {
            let m = if matches!(action, PauseAction::Pause) {
                "PUT"
            } else {
                "DELETE"
            };
            c.call(m, &format!("/api/v1/queues/{name}/pause"), None)
                .await?
        }
        Admin::Outbox { action, entry } => match (action, entry) {
            (OutboxAction::List, _) => {
                let v = c.call("GET", "/api/v1/outbox", None).await?;
                print_outbox(&v["entries"]);
                return Ok(());
            }
            (OutboxAction::Retry, Some(name)) => {
                c.call("POST", &format!("/api/v1/outbox/{name}/retry"), None)
                    .await?;
                println!("{name}: due now");
                return Ok(());
            }
            (OutboxAction::Retry, None) => {
                bail!("name the entry to retry (lading admin outbox list)")
            }
        },
        Admin::ClearLock { kind, name } => {
            c.call("DELETE", &format!("/api/v1/locks/{kind}/{name}"), None)
                .await?;
            println!("{kind} lock {name}: cleared");
            return Ok(());
        }
        Admin::Cleanup { .. } => {
            bail!("cleanup works on the store and its folders; run it without --server")
        }
    };
    match (v["id"].as_str(), v["status"].as_str()) {
        (Some(id), Some(st)) => println!("{id}: {st}"),
        (Some(id), None) if v["purged"] == true => println!("{id}: purged"),
        _ => println!("{v}"),
    }
    Ok(())
}

/// One line per outbox entry: name, kind, key, state, attempts, last error.
fn print_outbox(entries: &serde_json::Value) {
    let list = entries.as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        println!("the outbox is empty");
    }
    for v in list {
        let state = if v["dead"] == true {
            "dead"
        } else if v["delivering"] == true {
            "delivering"
        } else {
            "waiting"
        };
        println!(
            "{}  {}  {}  {state}  attempts {}{}",
            v["name"].as_str().unwrap_or("?"),
            v["kind"].as_str().unwrap_or("?"),
            v["key"].as_str().unwrap_or("?"),
            v["attempts"],
            v["last_error"]
                .as_str()
                .map(|e| format!("  last error: {e}"))
                .unwrap_or_default()
        );
    }
}
