//! Live processes (SPEC §12): every Lading process announces itself under `/processes` — a
//! persistent record (host, pid, version, roles, stages, what it runs now, when it was last
//! heard from) and, beside it, an ephemeral `alive` child of its session. A process whose
//! session ended (a crash, a lost host, a stop) has a record and no `alive`: it is shown gone,
//! with what it was running when last heard from. Gone records are forgotten after a day.
//! Not part of Merritt's layout.

use crate::Result;
use lading_core::layout::escape_node_name;
use lading_core::{CreateMode, Op, Tree, TreeError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where processes announce themselves.
pub const PROCESSES: &str = "/processes";
/// The ephemeral child that says a process's session is alive.
const ALIVE: &str = "alive";
/// How long a gone process's record is kept.
pub const GONE_KEPT_MS: u64 = 24 * 3600 * 1000;
/// At most this many records are read for a listing (each process has one).
const MAX_LISTED: usize = 1000;

/// One piece of work a process runs now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunningWork {
    /// `job` or `batch`.
    pub kind: String,
    /// The job's or batch's id.
    pub id: String,
    /// The stage it runs in.
    pub stage: String,
    pub since_ms: u64,
}

/// What a process says of itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessRecord {
    pub host: String,
    pub pid: u32,
    /// The program's version, with its commit.
    pub version: String,
    /// What it is: `serve` (the HTTP API), `worker` (pipeline stages), `access` (access
    /// queues), `jobs` (generic jobs).
    pub roles: Vec<String>,
    /// Each stage it runs, with how many of its jobs it runs at once.
    pub stages: BTreeMap<String, usize>,
    pub started_at_ms: u64,
    /// When it last wrote this record.
    pub heard_at_ms: u64,
    /// What it runs now (when gone: what it ran when last heard from).
    #[serde(default)]
    pub running: Vec<RunningWork>,
    /// When it stopped gracefully (none: running, or ended without a word).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at_ms: Option<u64>,
}

impl ProcessRecord {
    /// The node name of this process: host, pid and start, so a pid used again is another.
    pub fn node_name(&self) -> String {
        escape_node_name(&format!(
            "{}-{}-{}",
            self.host, self.pid, self.started_at_ms
        ))
    }
}

/// A process as listed: its record, and whether its session is alive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessInfo {
    /// Its node name under `/processes`.
    pub name: String,
    pub alive: bool,
    #[serde(flatten)]
    pub record: ProcessRecord,
}

fn path(name: &str) -> String {
    format!("{PROCESSES}/{name}")
}

fn alive_path(name: &str) -> String {
    format!("{PROCESSES}/{name}/{ALIVE}")
}

fn exists_already(e: &TreeError) -> bool {
    matches!(e.root(), TreeError::NodeExists(_))
}

/// Writes this process's record and makes sure its session's `alive` node is there (a
/// session that lapsed and was replaced has lost the old one).
pub async fn announce(tree: &dyn Tree, record: &ProcessRecord) -> Result<()> {
    let name = record.node_name();
    let data = Some(serde_json::to_vec(record).unwrap_or_default());
    if tree.exists(PROCESSES).await?.is_none() {
        match tree.create(PROCESSES, None, CreateMode::Persistent).await {
            Ok(_) => {}
            Err(e) if exists_already(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if tree.exists(&path(&name)).await?.is_none() {
        let ops = vec![
            Op::create(path(&name), data),
            Op::create_mode(alive_path(&name), None, CreateMode::Ephemeral),
        ];
        return match tree.multi(ops).await {
            Ok(_) => Ok(()),
            Err(e) if exists_already(&e) => Box::pin(announce(tree, record)).await,
            Err(e) => Err(e.into()),
        };
    }
    tree.set(&path(&name), data, None).await?;
    if tree.exists(&alive_path(&name)).await?.is_none() {
        match tree
            .create(&alive_path(&name), None, CreateMode::Ephemeral)
            .await
        {
            Ok(_) => {}
            Err(e) if exists_already(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Says this process stopped: its record keeps when, and its `alive` node goes.
pub async fn stopped(tree: &dyn Tree, record: &ProcessRecord) -> Result<()> {
    let name = record.node_name();
    let data = Some(serde_json::to_vec(record).unwrap_or_default());
    tree.set(&path(&name), data, None).await?;
    match tree.delete(&alive_path(&name), None).await {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.root(), TreeError::NoNode(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Every process that announced itself and is not yet forgotten: the alive first, then the
/// gone, each by host and start.
pub async fn list(tree: &dyn Tree) -> Result<Vec<ProcessInfo>> {
    let names = match tree.children(PROCESSES).await {
        Ok(n) => n,
        Err(e) if matches!(e.root(), TreeError::NoNode(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let names: Vec<String> = names.into_iter().take(MAX_LISTED).collect();
    let records: Vec<String> = names.iter().map(|n| path(n)).collect();
    let alive: Vec<String> = names.iter().map(|n| alive_path(n)).collect();
    let (records, alive) = (tree.get_many(&records).await?, tree.get_many(&alive).await?);
    let mut out: Vec<ProcessInfo> = names
        .into_iter()
        .zip(records.into_iter().zip(alive))
        .filter_map(|(name, (node, alive))| {
            let record = lading_core::json::from_bytes(node?.data.as_deref()?).ok()?;
            Some(ProcessInfo {
                name,
                alive: alive.is_some(),
                record,
            })
        })
        .collect();
    out.sort_by(|a, b| {
        (!a.alive, &a.record.host, a.record.started_at_ms).cmp(&(
            !b.alive,
            &b.record.host,
            b.record.started_at_ms,
        ))
    });
    Ok(out)
}

/// Removes the records of processes gone (no `alive` node) and not heard from for
/// [`GONE_KEPT_MS`] before `now_ms`; returns how many.
pub async fn forget_gone(tree: &dyn Tree, now_ms: u64) -> Result<usize> {
    let now = now_ms;
    let mut n = 0;
    for p in list(tree).await? {
        if p.alive || p.record.heard_at_ms + GONE_KEPT_MS > now {
            continue;
        }
        match tree.delete(&path(&p.name), None).await {
            Ok(()) => n += 1,
            // Forgotten by another process meanwhile, or alive again (a session that
            // came back): either way not this one's to remove.
            Err(e) if matches!(e.root(), TreeError::NoNode(_) | TreeError::NotEmpty(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(n)
}
