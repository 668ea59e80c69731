//! `lading admin …`: job, batch, collection, queue, outbox and lock administration, on the
//! store directly or through a server (`--server`): one path over [`Ops`].

use super::*;
use lading_core::layout::{BatchId, JobId};
use lading_server::api::{ActionResult, BatchAction, JobAction, RequeueFailedRequest};
use lading_server::ops::Ops;

#[derive(Subcommand)]
pub(crate) enum Admin {
    /// Jobs: hold (Pending → Held), release (Held → Pending), requeue a Failed job (to the
    /// stage that failed, or --to STATE), delete (Failed/Held → Deleted; Completed/Deleted are
    /// purged). `requeue --batch BID [--stage S]` requeues every Failed job of a batch (only
    /// those that failed at stage S).
    Job {
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(JobAction::NAMES))]
        action: String,
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
    /// Find jobs and act on many at once: `list` the jobs a filter selects (a page), `count`
    /// them, or `bulk ACTION` them (requeue, hold, release, delete). Without --max, `bulk`
    /// only says how many jobs it would touch; with --max N it acts on at most N (the count
    /// confirmed), as one operation recorded in the audit log, and prints its outcome (exit 4
    /// when a job was refused).
    Jobs {
        #[arg(value_enum)]
        what: JobsWhat,
        /// bulk: the action.
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(JobAction::NAMES))]
        action: Option<String>,
        #[command(flatten)]
        filter: FilterArgs,
        /// bulk: act on at most this many jobs (the count `bulk` without it printed).
        #[arg(long)]
        max: Option<u64>,
        /// list: page size.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// list: start after this cursor (the `next` a page printed).
        #[arg(long)]
        after: Option<String>,
    },
    /// Batches: hold, release, delete, update-reporting.
    Batch {
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(BatchAction::NAMES))]
        action: String,
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
    /// The fixity checker: `run` reads back every stored copy (of --node, of --ark) and
    /// compares it with the inventory, printing one line per bad or missing copy (exit 1
    /// when there is any); `repair` then copies a verified good copy from another node over
    /// each and checks it again (exit 1 when one is left unrepaired).
    Fixity {
        #[arg(value_enum)]
        action: FixityAction,
        /// Only this storage node (0: the storage root of profiles without nodes).
        #[arg(long)]
        node: Option<u32>,
        /// Only this object.
        #[arg(long)]
        ark: Option<String>,
    },
    /// Give a stored version back: as a zip of its files, or (--format bag) as a BagIt bag in
    /// a tar, valid under the profile it was deposited with (NAME.tar, untarring to NAME/).
    /// Read from this host's nodes or storage root.
    Restore {
        /// The object's identifier.
        ark: String,
        /// The version (default: the newest).
        #[arg(long)]
        version: Option<u32>,
        #[arg(long, value_enum, default_value = "zip")]
        format: RestoreFormat,
        /// The file to write.
        #[arg(short = 'o', long = "output")]
        output: std::path::PathBuf,
    },
    /// Deletion of stored objects, only when a second admin approves (through --server with an
    /// admin token: who asks and who approves are the tokens' names). `delete ARK [--version
    /// V] --reason TEXT` records a request; another admin's `approve-deletion ID` removes the
    /// files from every storage node and keeps a tombstone (who, when, why, the digests);
    /// `cancel-deletion ID` drops a request; `deletions [--ark ARK]` lists them, `deletion ID`
    /// shows one.
    Object {
        #[command(subcommand)]
        action: ObjectAction,
    },
    /// Check the setup as `serve` and `worker` do when they start (the config, every
    /// profile, the nodes they name), then probe every outside service once (each storage
    /// node, the SMTP server): one line each; exit 1 when anything is wrong.
    CheckConfig,
    /// Remove Completed and Deleted batches (and their jobs) last changed more than
    /// --older-than-hours ago.
    Cleanup {
        #[arg(long, default_value_t = 24 * 7)]
        older_than_hours: u64,
    },
}

#[derive(Subcommand)]
pub(crate) enum ObjectAction {
    /// Request the deletion of an object (or one version of it).
    Delete {
        ark: String,
        /// Only this version (default: the whole object).
        #[arg(long)]
        version: Option<u32>,
        /// Why (kept in the tombstone).
        #[arg(long)]
        reason: String,
    },
    /// Approve another admin's deletion request: its files are removed from every node.
    ApproveDeletion { id: String },
    /// Cancel a deletion request.
    CancelDeletion { id: String },
    /// Every deletion request and tombstone (of one object).
    Deletions {
        #[arg(long)]
        ark: Option<String>,
    },
    /// One deletion, as JSON (a done one is the tombstone).
    Deletion { id: String },
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum OutboxAction {
    List,
    Retry,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum RestoreFormat {
    Zip,
    Bag,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum FixityAction {
    Run,
    Repair,
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

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum JobsWhat {
    List,
    Count,
    Bulk,
}

/// What jobs must match (`lading admin jobs …`), as `GET /api/v1/jobs` filters.
#[derive(clap::Args)]
pub(crate) struct FilterArgs {
    /// The state (Failed, Pending, …).
    #[arg(long)]
    state: String,
    #[arg(long)]
    collection: Option<String>,
    #[arg(long)]
    profile: Option<String>,
    #[arg(long)]
    submitter: Option<String>,
    /// The batch (bid…).
    #[arg(long)]
    batch: Option<String>,
    /// Id, ARK, local id or title containing this.
    #[arg(long)]
    search: Option<String>,
    /// The status message containing this (any case).
    #[arg(long)]
    message: Option<String>,
    /// Failed jobs: the stage they failed at.
    #[arg(long)]
    failed_at: Option<String>,
    /// Failed jobs: fatal or exhausted.
    #[arg(long)]
    failure_kind: Option<String>,
    /// Last changed at least this many minutes ago.
    #[arg(long)]
    older_than_min: Option<u64>,
}

impl FilterArgs {
    fn filter(self) -> lading_server::bulk::JobFilter {
        lading_server::bulk::JobFilter {
            state: self.state,
            collection: self.collection,
            profile: self.profile,
            submitter: self.submitter,
            batch: self.batch,
            q: self.search,
            message: self.message,
            stage: self.failed_at,
            failure_kind: self.failure_kind,
            older_than_min: self.older_than_min,
        }
    }
}

/// `lading admin jobs list|count|bulk`.
async fn jobs<O: Ops>(
    ops: &O,
    what: JobsWhat,
    action: Option<String>,
    filter: lading_server::bulk::JobFilter,
    (max, limit, after): (Option<u64>, usize, Option<String>),
) -> anyhow::Result<()>
where
    anyhow::Error: From<O::Error>,
{
    match (what, action, max) {
        (JobsWhat::List, _, _) => {
            let page = ops.find_jobs(&filter, after.as_deref(), limit).await?;
            for j in &page.jobs {
                let failed = match (&j.failed_stage, &j.failure_kind) {
                    (Some(st), Some(k)) => format!("  failed at {st} ({k})"),
                    _ => String::new(),
                };
                println!(
                    "{}  {}{failed}  {}",
                    j.id,
                    page.state,
                    j.message.as_deref().unwrap_or("")
                );
            }
            if let Some(n) = &page.next_after {
                println!("next page: --after {n}");
            }
        }
        (JobsWhat::Count, _, _) | (JobsWhat::Bulk, _, None) => {
            let c = ops.count_jobs(&filter).await?;
            let more = if c.complete {
                ""
            } else {
                " (of the first jobs looked at; there are more)"
            };
            println!("{} {} jobs match{more}", c.matched, c.state);
            if matches!(what, JobsWhat::Bulk) && c.matched > 0 {
                println!("to act on them, run again with --max {}", c.matched);
            }
        }
        (JobsWhat::Bulk, None, Some(_)) => {
            anyhow::bail!("bulk needs an action: requeue, hold, release or delete")
        }
        (JobsWhat::Bulk, Some(action), Some(max)) => {
            let op = ops
                .bulk(lading_server::bulk::BulkRequest {
                    action,
                    filter,
                    max,
                })
                .await?;
            for r in &op.refused {
                println!("{}: refused: {}", r.job, r.why);
            }
            println!(
                "operation {}: {} of {} matched jobs {}, {} refused",
                op.id, op.done, op.matched, op.action, op.refused_count
            );
            if op.refused_count > 0 {
                std::io::Write::flush(&mut std::io::stdout())?;
                std::process::exit(4);
            }
        }
    }
    Ok(())
}

/// `lading admin …` (but `cleanup`, which works on the store's folders: see [`cleanup`]).
pub(crate) async fn admin<O: Ops>(ops: &O, action: Admin) -> anyhow::Result<()>
where
    anyhow::Error: From<O::Error>,
{
    match action {
        Admin::Job {
            action,
            job,
            to,
            batch,
            stage,
        } => {
            let action = JobAction::parse(&action).context("a job action")?;
            if batch.is_none() {
                let job = JobId::parse(job.as_deref().unwrap_or_default())?;
                let r = ops.job_action(&job, action, to.as_deref()).await?;
                return print_action(&r);
            }
            if action != JobAction::Requeue {
                return Err(EngineError::Invalid("--batch applies to requeue only".into()).into());
            }
            let batch = BatchId::parse(&batch.unwrap_or_default())?;
            let r = ops
                .requeue_failed(&batch, RequeueFailedRequest { stage, to })
                .await?;
            for j in &r.requeued {
                println!("{}: {}", j.id, j.status.as_deref().unwrap_or("-"));
            }
            for j in &r.refused {
                println!("{}: not requeued: {}", j.id, j.error);
            }
            println!("{} requeued, {} refused", r.requeued.len(), r.refused.len());
            if !r.refused.is_empty() {
                std::io::Write::flush(&mut std::io::stdout())?;
                std::process::exit(4);
            }
        }
        Admin::Jobs {
            what,
            action,
            filter,
            max,
            limit,
            after,
        } => jobs(ops, what, action, filter.filter(), (max, limit, after)).await?,
        Admin::Batch { action, batch } => {
            let action = BatchAction::parse(&action).context("a batch action")?;
            let batch = BatchId::parse(&batch)?;
            print_action(&ops.batch_action(&batch, action).await?)?;
        }
        Admin::Collection { action, name } => {
            let r = ops
                .collection(&name, matches!(action, HoldAction::Hold))
                .await?;
            match r.released {
                None => println!(
                    "collection {name}: held{}",
                    if r.changed { "" } else { " (already)" }
                ),
                Some(n) if r.changed => println!(
                    "collection {name}: released, {n} held batches and jobs back to Pending"
                ),
                Some(_) => println!("collection {name}: was not held; nothing released"),
            }
        }
        Admin::Queue { action, name } => {
            let r = ops
                .queue(&name, matches!(action, PauseAction::Pause))
                .await?;
            println!(
                "queue {name}: {}{}",
                if r.paused { "paused" } else { "resumed" },
                if r.changed { "" } else { " (already)" }
            );
        }
        Admin::CheckConfig => {
            anyhow::bail!(
                "lading admin check-config checks this host's config, not through --server"
            )
        }
        Admin::Restore { .. } => {
            anyhow::bail!(
                "lading admin restore reads this host's nodes; through a server, POST \
                 /api/v1/access with \"format\": \"bag\""
            )
        }
        Admin::Fixity { .. } => {
            anyhow::bail!(
                "lading admin fixity runs on this host's store and nodes, not through --server"
            )
        }
        Admin::Outbox { action, entry } => match (action, entry) {
            (OutboxAction::List, _) => {
                let list = ops.outbox().await?;
                if list.is_empty() {
                    println!("the outbox is empty");
                }
                for v in list {
                    let state = if v.entry.dead {
                        "dead"
                    } else if v.delivering {
                        "delivering"
                    } else {
                        "waiting"
                    };
                    println!(
                        "{}  {}  {}  {state}  attempts {}{}",
                        v.name,
                        v.entry.effect.kind,
                        v.entry.effect.key,
                        v.entry.attempts,
                        v.entry
                            .last_error
                            .map(|e| format!("  last error: {e}"))
                            .unwrap_or_default()
                    );
                }
            }
            (OutboxAction::Retry, Some(name)) => {
                ops.retry_outbox(&name).await?;
                println!("{name}: due now");
            }
            (OutboxAction::Retry, None) => {
                bail!("name the entry to retry (lading admin outbox list)")
            }
        },
        Admin::Object { action } => object(ops, action).await?,
        Admin::ClearLock { kind, name } => {
            ops.clear_lock(&kind, &name).await?;
            println!("{kind} lock {name}: cleared");
        }
        Admin::Cleanup { .. } => {
            bail!("cleanup works on the store and its folders; run it without --server")
        }
    }
    Ok(())
}

/// `lading admin object …`: one line per deletion (the whole record for `deletion ID`).
async fn object<O: Ops>(ops: &O, action: ObjectAction) -> anyhow::Result<()>
where
    anyhow::Error: From<O::Error>,
{
    use lading_server::ops::DeletionVerb as V;
    let (verb, whole) = match action {
        ObjectAction::Delete {
            ark,
            version,
            reason,
        } => (
            V::Request {
                ark,
                version,
                reason,
            },
            false,
        ),
        ObjectAction::ApproveDeletion { id } => (V::Approve(id), false),
        ObjectAction::CancelDeletion { id } => (V::Cancel(id), false),
        ObjectAction::Deletions { ark } => (V::List(ark), false),
        ObjectAction::Deletion { id } => (V::Show(id), true),
    };
    let listing = matches!(verb, V::List(_));
    let all = ops.deletion(verb).await?;
    if whole {
        return print_json(&all.first());
    }
    if listing && all.is_empty() {
        println!("no deletions");
    }
    for d in all {
        let by = d
            .decided_by
            .as_deref()
            .map(|b| format!(", decided by {b}"))
            .unwrap_or_default();
        let waiting = d
            .waiting
            .as_deref()
            .map(|w| format!("; waiting: {w}"))
            .unwrap_or_default();
        println!(
            "{}  {}  {}  requested by {}{by}; {} files removed, {} kept{waiting}",
            d.id,
            d.target(),
            d.status.name(),
            d.requested_by,
            d.files.len(),
            d.kept.len(),
        );
    }
    Ok(())
}

fn print_action(r: &ActionResult) -> anyhow::Result<()> {
    match &r.status {
        Some(st) => println!("{}: {st}", r.id),
        None => println!("{}: purged", r.id),
    }
    Ok(())
}

/// `lading admin cleanup`, on the store and its folders.
/// `lading admin fixity run|repair`, on this host's inventory and nodes.
pub(crate) async fn fixity(
    ingest: &Ingest,
    action: FixityAction,
    node: Option<u32>,
    ark: Option<&str>,
) -> anyhow::Result<()> {
    let audit = match action {
        FixityAction::Run => lading_ingest::fixity::check(ingest, node, ark, None).await,
        FixityAction::Repair => lading_ingest::fixity::repair(ingest, node, ark).await,
    }
    .map_err(anyhow::Error::msg)?;
    for f in &audit.findings {
        println!("{f}");
    }
    let left = audit
        .findings
        .iter()
        .filter(|f| !f.status.starts_with("repaired"))
        .count();
    println!(
        "{} copies checked ({} bytes read): {} bad or missing{}",
        audit.checked,
        audit.bytes,
        audit.findings.len(),
        match action {
            FixityAction::Run => String::new(),
            FixityAction::Repair => format!(", {} repaired", audit.findings.len() - left),
        }
    );
    if left > 0 {
        std::io::Write::flush(&mut std::io::stdout())?;
        std::process::exit(1);
    }
    Ok(())
}

/// `lading admin restore`: version `version` (default the newest) of `ark` into `output`.
pub(crate) async fn restore(
    ingest: &Ingest,
    ark: &str,
    version: Option<u32>,
    format: RestoreFormat,
    output: &std::path::Path,
) -> anyhow::Result<()> {
    let a = ark.to_string();
    let versions = ingest.inventory.run(move |i| i.versions(&a)).await?;
    let version = match version {
        Some(v) => v,
        None => versions
            .iter()
            .map(|(v, _, _)| *v)
            .max()
            .with_context(|| format!("no version of {ark:?} is recorded"))?,
    };
    if !versions.iter().any(|(v, _, _)| *v == version) {
        bail!("no version {version} of {ark:?} is recorded");
    }
    let src = lading_ingest::access::source(ingest, ark, version, None)
        .await
        .map_err(anyhow::Error::msg)?;
    match format {
        RestoreFormat::Bag => {
            let now = ingest.engine.clock().now_ms();
            let r = lading_ingest::restore::bag_to_file(&src, ark, version, now, output)
                .await
                .with_context(|| format!("writing {}", output.display()))?;
            println!(
                "{ark} v{version}: bag {} ({} files, {} bytes; manifests {}) in {}",
                r.name,
                r.payload_files,
                r.payload_bytes,
                r.algorithms.join(", "),
                output.display()
            );
        }
        RestoreFormat::Zip => {
            lading_ingest::access::source_zip_to_file(&src, output)
                .await
                .with_context(|| format!("writing {}", output.display()))?;
            println!("{ark} v{version}: zip in {}", output.display());
        }
    }
    Ok(())
}

pub(crate) async fn cleanup(ingest: &Ingest, older_than_hours: u64) -> anyhow::Result<()> {
    let c = lading_ingest::cleanup::cleanup(
        ingest,
        ingest.engine.clock().now_ms(),
        older_than_hours.saturating_mul(3_600_000),
    )
    .await?;
    println!(
        "removed {} batches and {} jobs (with their working directories and uploads) and {} access requests (with their zips) finished more than {older_than_hours} h ago; gave back {} quota slots and folders; dropped {} submitter-index entries of batches another tool deleted",
        c.batches, c.jobs, c.access, c.quotas, c.index_entries
    );
    Ok(())
}

/// `lading admin check-config`: the setup was read and checked when the ingest service was
/// made (a broken one never gets here); each dependency is probed once.
pub(crate) async fn check_config(ingest: &lading_ingest::Ingest) -> anyhow::Result<()> {
    println!("config and profiles: ok");
    let deps = ingest.engine.deps();
    let mut down = 0;
    for h in deps.list() {
        let dep = lading_engine::deps::Dependency::new(&h.kind, &h.name, &h.address);
        let Some(probe) = deps.probe_of(&dep.key()) else {
            continue;
        };
        match probe().await {
            Ok(()) => println!("ok    {} ({})", h.label, h.address),
            Err(cause) => {
                down += 1;
                println!("down  {} ({}): {cause}", h.label, h.address);
            }
        }
    }
    if down > 0 {
        std::io::Write::flush(&mut std::io::stdout())?;
        std::process::exit(1);
    }
    Ok(())
}
