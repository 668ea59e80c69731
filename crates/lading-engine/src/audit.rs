//! The audit log of admin operations on many jobs at once (SPEC §12): who, when, what action
//! on which filter, how many jobs it matched, did and could not do (with why), and whether it
//! is still running. One sequential node per operation under `/audit`, the last
//! [`KEPT`] kept. Not part of Merritt's layout.

use crate::Result;
use lading_core::{CreateMode, Tree, TreeError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where operations are recorded.
pub const AUDIT: &str = "/audit";
/// Operations kept; older ones are removed when a new one starts.
pub const KEPT: usize = 1000;
/// Refusals kept per operation (all are counted).
pub const REFUSALS_KEPT: usize = 100;

/// One job an operation could not act on, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Refusal {
    pub job: String,
    pub why: String,
}

/// An admin operation on the jobs a filter selects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AdminOperation {
    /// Its node name (`op-0000000012`); set when read.
    #[serde(default)]
    pub id: String,
    /// The admin token's name.
    pub who: String,
    /// `requeue`, `hold`, `release` or `delete`.
    pub action: String,
    /// The filter, as given.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub filter: Value,
    /// At most this many jobs are acted on (the count the admin confirmed).
    pub max: u64,
    pub started_at_ms: u64,
    /// The process running it (host and pid).
    pub host: String,
    pub pid: u32,
    /// `running`, `finished`, or `interrupted` (its process ended before it did).
    pub state: String,
    /// Jobs the filter matched so far.
    pub matched: u64,
    /// Jobs acted on.
    pub done: u64,
    /// Jobs it could not act on (a job locked by a worker, a state the action does not
    /// apply to); the first [`REFUSALS_KEPT`] are listed.
    pub refused_count: u64,
    #[serde(default)]
    pub refused: Vec<Refusal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
}

impl AdminOperation {
    /// Counts a job it could not act on.
    pub fn refuse(&mut self, job: &str, why: String) {
        self.refused_count += 1;
        if self.refused.len() < REFUSALS_KEPT {
            self.refused.push(Refusal {
                job: job.to_string(),
                why,
            });
        }
    }
}

fn data(op: &AdminOperation) -> Option<Vec<u8>> {
    Some(serde_json::to_vec(op).unwrap_or_default())
}

/// Records `op` as started; returns its id. Removes the oldest beyond [`KEPT`].
pub async fn start(tree: &dyn Tree, op: &AdminOperation) -> Result<String> {
    if tree.exists(AUDIT).await?.is_none() {
        match tree.create(AUDIT, None, CreateMode::Persistent).await {
            Ok(_) => {}
            Err(e) if matches!(e.root(), TreeError::NodeExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let path = tree
        .create(
            &format!("{AUDIT}/op-"),
            data(op),
            CreateMode::PersistentSequential,
        )
        .await?;
    let names = tree.children(AUDIT).await?;
    for old in names.iter().take(names.len().saturating_sub(KEPT)) {
        match tree.delete(&format!("{AUDIT}/{old}"), None).await {
            Ok(()) => {}
            Err(e) if matches!(e.root(), TreeError::NoNode(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(path.rsplit('/').next().unwrap_or_default().to_string())
}

/// Writes `op`'s progress (or outcome).
pub async fn update(tree: &dyn Tree, op: &AdminOperation) -> Result<()> {
    tree.set(&format!("{AUDIT}/{}", op.id), data(op), None)
        .await?;
    Ok(())
}

/// The last `limit` operations, newest first.
pub async fn list(tree: &dyn Tree, limit: usize) -> Result<Vec<AdminOperation>> {
    let names = match tree.children(AUDIT).await {
        Ok(n) => n,
        Err(e) if matches!(e.root(), TreeError::NoNode(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let names: Vec<&String> = names.iter().rev().take(limit).collect();
    let paths: Vec<String> = names.iter().map(|n| format!("{AUDIT}/{n}")).collect();
    let nodes = tree.get_many(&paths).await?;
    Ok(names
        .into_iter()
        .zip(nodes)
        .filter_map(|(name, node)| {
            let mut op: AdminOperation =
                lading_core::json::from_bytes(node?.data.as_deref()?).ok()?;
            op.id = name.clone();
            Some(op)
        })
        .collect())
}
