//! Storage and inventory locks as an operator sees them. Lading's are ephemeral (they end
//! with the session that holds them); Merritt's `lockObjectStorage` and
//! `lockObjectInventory` make persistent ones, which a crashed Merritt process leaves behind,
//! blocking that object for good. They are listed, and an admin may clear one.

use crate::{Engine, EngineError, Result};
use lading_core::TreeError;
use lading_core::layout::{INVENTORY_LOCKS, STORAGE_LOCKS};
use serde::Serialize;

/// A persistent (foreign) storage or inventory lock.
#[derive(Debug, Clone, Serialize)]
pub struct ForeignLock {
    /// `storage` or `inventory`.
    pub kind: &'static str,
    /// The lock node's name (the ark, escaped as a node name).
    pub name: String,
    /// When it was made, ms since the epoch.
    pub since_ms: u64,
}

fn folder(kind: &str) -> Result<&'static str> {
    match kind {
        "storage" => Ok(STORAGE_LOCKS),
        "inventory" => Ok(INVENTORY_LOCKS),
        other => Err(EngineError::Invalid(format!(
            "unknown lock kind {other:?} (storage or inventory)"
        ))),
    }
}

impl Engine {
    /// The persistent storage and inventory locks (made by another tool: Lading's own are
    /// ephemeral).
    pub async fn foreign_locks(&self) -> Result<Vec<ForeignLock>> {
        let mut out = Vec::new();
        for kind in ["storage", "inventory"] {
            let dir = folder(kind)?;
            let names = match self.tree.children(dir).await {
                Ok(n) => n,
                Err(TreeError::NoNode(_)) => continue,
                Err(e) => return Err(e.into()),
            };
            for name in names {
                if let Some(stat) = self.tree.exists(&format!("{dir}/{name}")).await?
                    && stat.ephemeral_owner == 0
                {
                    out.push(ForeignLock {
                        kind,
                        name,
                        since_ms: stat.ctime_ms,
                    });
                }
            }
        }
        Ok(out)
    }

    /// Admin: removes a persistent storage or inventory lock left by another tool. A lock
    /// held by a live session (ephemeral) is refused: it ends with its holder.
    pub async fn clear_foreign_lock(&self, kind: &str, name: &str) -> Result<()> {
        let path = format!("{}/{name}", folder(kind)?);
        lading_core::tree::validate_path(&path)
            .map_err(|e| EngineError::Invalid(format!("lock name {name:?}: {e}")))?;
        let Some(stat) = self.tree.exists(&path).await? else {
            return Err(EngineError::Invalid(format!("no {kind} lock {name:?}")));
        };
        if stat.ephemeral_owner != 0 {
            return Err(EngineError::Invalid(format!(
                "the {kind} lock {name:?} is held by a live session; it ends with its holder"
            )));
        }
        match self.tree.delete(&path, Some(stat.version)).await {
            Ok(()) | Err(TreeError::NoNode(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
