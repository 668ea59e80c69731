//! Per-object locks: storage and inventory locks on an ark (ephemeral, [`Engine::lock_storage`],
//! [`Engine::lock_inventory`]), and locks as an operator sees them. Lading's are ephemeral (they end
//! with the session that holds them); Merritt's `lockObjectStorage` and
//! `lockObjectInventory` make persistent ones, which a crashed Merritt process leaves behind,
//! blocking that object for good. They are listed, and an admin may clear one.
//!
//! A batch lock is ephemeral in both tools, but a Merritt consumer that fails on a batch
//! (it throws on a Held batch it took for pending) keeps its lock for as long as its process
//! lives. Lading never leaves a lock on a Held batch (its holds take and drop the lock in
//! one `multi`), so a lock seen there is foreign: listed as kind `batch`, and clearable.

use crate::{ArkLock, Engine, EngineError, Result, lost};
use lading_core::BatchState;
use lading_core::layout::{
    BatchId, INVENTORY_LOCKS, STORAGE_LOCKS, batch_node, inventory_lock, storage_lock,
};
use lading_core::{CreateMode, Op, TreeError};
use serde::{Deserialize, Serialize};

/// A lock left by another tool: a persistent storage or inventory lock, or a lock on a Held
/// batch.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForeignLock {
    /// `storage`, `inventory` or `batch`.
    pub kind: String,
    /// The lock node's name (the ark, escaped as a node name), or the batch id.
    pub name: String,
    /// When it was made, ms since the epoch.
    pub since_ms: u64,
}

fn folder(kind: &str) -> Result<&'static str> {
    match kind {
        "storage" => Ok(STORAGE_LOCKS),
        "inventory" => Ok(INVENTORY_LOCKS),
        other => Err(EngineError::Invalid(format!(
            "unknown lock kind {other:?} (storage, inventory or batch)"
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
                        kind: kind.into(),
                        name,
                        since_ms: stat.ctime_ms,
                    });
                }
            }
        }
        for bid in self.batch_ids().await? {
            match self.batch_status(&bid).await {
                Ok((s, _)) if s.status == BatchState::Held => {}
                Ok(_) | Err(EngineError::NoBatch(_)) => continue,
                Err(e) => return Err(e),
            }
            if let Some(stat) = self.tree.exists(&batch_node(&bid, "lock")).await? {
                out.push(ForeignLock {
                    kind: "batch".into(),
                    name: bid.to_string(),
                    since_ms: stat.ctime_ms,
                });
            }
        }
        Ok(out)
    }

    /// Admin: removes a persistent storage or inventory lock left by another tool. A lock
    /// held by a live session (ephemeral) is refused: it ends with its holder.
    pub async fn clear_foreign_lock(&self, kind: &str, name: &str) -> Result<()> {
        if kind == "batch" {
            return self.clear_held_batch_lock(name).await;
        }
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

    /// Admin: removes the lock on a Held batch (left by a Merritt consumer that failed on it,
    /// and kept for as long as that process's session lives). Refused for a batch in any
    /// other state, where the lock may be a live worker's.
    async fn clear_held_batch_lock(&self, name: &str) -> Result<()> {
        let bid = BatchId::parse(name)
            .map_err(|_| EngineError::Invalid(format!("{name:?} is not a batch id")))?;
        let (status, _) = self.batch_status(&bid).await?;
        if status.status != BatchState::Held {
            return Err(EngineError::Invalid(format!(
                "batch {bid} is {}, not Held: only a Held batch's lock is another tool's for sure",
                status.status.name()
            )));
        }
        let path = batch_node(&bid, "lock");
        let Some(stat) = self.tree.exists(&path).await? else {
            return Err(EngineError::Invalid(format!("batch {bid} has no lock")));
        };
        match self.tree.delete(&path, Some(stat.version)).await {
            Ok(()) | Err(TreeError::NoNode(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Engine {
    pub(crate) async fn ark_lock(&self, path: String) -> Result<ArkLock> {
        // Made on the session the lock will carry (see `Tree::multi_on`).
        let session = self.tree.session_id();
        let create = vec![Op::create_mode(
            &path,
            self.lock_data(),
            CreateMode::Ephemeral,
        )];
        match self
            .tree
            .multi_on(session, create)
            .await
            .map_err(|e| e.root().clone())
        {
            Ok(_) => Ok(ArkLock { path, session }),
            Err(TreeError::NodeExists(p)) => Err(EngineError::Locked(p)),
            Err(e) => Err(e.into()),
        }
    }

    /// Takes `/locks/storage/ARK` (fails with `Locked` while another holds it).
    pub async fn lock_storage(&self, ark: &str) -> Result<ArkLock> {
        if ark.is_empty() {
            return Err(EngineError::Invalid("empty ark".into()));
        }
        self.ark_lock(storage_lock(ark)).await
    }

    /// Takes `/locks/inventory/ARK`.
    pub async fn lock_inventory(&self, ark: &str) -> Result<ArkLock> {
        if ark.is_empty() {
            return Err(EngineError::Invalid("empty ark".into()));
        }
        self.ark_lock(inventory_lock(ark)).await
    }

    /// Whether `lock` is still there and its session's: after an unlock whose answer was
    /// lost, a lock by that name may be another holder's, made since, and not this one's to
    /// delete.
    pub async fn holds(&self, lock: &ArkLock) -> Result<bool> {
        Ok(self
            .tree
            .get(&lock.path)
            .await?
            .is_some_and(|n| n.stat.ephemeral_owner == lock.session))
    }

    pub async fn unlock_ark(&self, lock: ArkLock) -> Result<()> {
        if lock.session != self.tree.session_id() {
            return Err(lost(&lock.path));
        }
        // On its own session: one replaced meanwhile took the lock with it, and the lock
        // another holder has made since is not this one's to delete.
        match self
            .tree
            .multi_on(lock.session, vec![Op::delete(&lock.path, None)])
            .await
            .map_err(|e| e.root().clone())
        {
            Ok(_) => Ok(()),
            Err(TreeError::NoNode(_) | TreeError::SessionExpired) => Err(lost(&lock.path)),
            Err(e) => Err(e.into()),
        }
    }
}
