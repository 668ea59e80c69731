//! The inventory's deletion requests and tombstones ([`crate::deletion`]): one row each, its
//! status beside the record as JSON, changed only from the status it was read in.

use super::*;
use crate::files::Origin;

/// Where a deletion is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeletionStatus {
    /// Asked for; waits for a second admin.
    Requested,
    /// Approved; its files are being removed (or wait for a node).
    Approved,
    /// Done: the record is the tombstone.
    Deleted,
    Cancelled,
}

impl DeletionStatus {
    pub fn name(self) -> &'static str {
        match self {
            DeletionStatus::Requested => "requested",
            DeletionStatus::Approved => "approved",
            DeletionStatus::Deleted => "deleted",
            DeletionStatus::Cancelled => "cancelled",
        }
    }
}

/// One file a deletion removes (or keeps), with the nodes that held it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeletionFile {
    pub version: u32,
    pub path: String,
    pub size: u64,
    pub sha256: String,
    /// The storage nodes it was removed from (0: the storage root).
    pub nodes: Vec<u32>,
    /// The storage root's folder of the version, where node 0 held it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
}

/// A deletion request, and once done its tombstone.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Deletion {
    pub id: String,
    pub ark: String,
    /// One version; `None`: the whole object.
    pub version: Option<u32>,
    pub reason: String,
    pub status: DeletionStatus,
    pub requested_by: String,
    pub requested_at: String,
    /// Who approved or cancelled it, and when.
    pub decided_by: Option<String>,
    pub decided_at: Option<String>,
    /// When the last copy was removed.
    pub deleted_at: Option<String>,
    /// The versions it deletes (fixed at approval).
    #[serde(default)]
    pub versions: Vec<u32>,
    /// What is removed, with digests (fixed at approval).
    #[serde(default)]
    pub files: Vec<DeletionFile>,
    /// Files of the deleted versions a version not deleted still uses: kept.
    #[serde(default)]
    pub kept: Vec<DeletionFile>,
    /// While approved: why the removal waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

impl Deletion {
    /// What a reader of a deleted version is told (no names, no reason: a depositor may read
    /// it; an admin reads the deletion itself).
    pub fn gone(&self, version: u32) -> String {
        format!(
            "version {version} of {} was deleted at {} (deletion {})",
            self.ark,
            self.decided_at.as_deref().unwrap_or("?"),
            self.id
        )
    }

    /// What it covers, in words: `ARK` or `ARK v2`.
    pub fn target(&self) -> String {
        match self.version {
            Some(v) => format!("{} v{v}", self.ark),
            None => self.ark.clone(),
        }
    }
}

impl Inventory {
    /// The approved or done deletion that covers version `version` of `ark`, if any.
    pub fn deletion_of(&self, ark: &str, version: u32) -> Result<Option<Deletion>, InventoryError> {
        for doc in self.deletion_docs(ark)? {
            let d: Deletion = serde_json::from_str(&doc).map_err(|e| {
                InventoryError::Io(std::io::Error::other(format!("deletion record: {e}")))
            })?;
            if matches!(d.status, DeletionStatus::Approved | DeletionStatus::Deleted)
                && d.versions.contains(&version)
            {
                return Ok(Some(d));
            }
        }
        Ok(None)
    }
}

impl Inventory {
    /// Records a new deletion request (`doc`, its JSON) under `id`.
    pub fn insert_deletion(
        &self,
        id: &str,
        ark: &str,
        status: &str,
        doc: &str,
    ) -> Result<(), InventoryError> {
        const Q: &str = "INSERT INTO deletions(id, ark, status, doc) VALUES ($1, $2, $3, $4)";
        self.with(|c, shown| match c {
            Conn::Sqlite(c) => {
                c.prepare_cached(&sqlite_params(Q))?
                    .execute(params![id, ark, status, doc])?;
                Ok(())
            }
            Conn::Postgres(c) => c
                .execute(Q, &[&id, &ark, &status, &doc])
                .map(|_| ())
                .map_err(pg_err(shown)),
        })
    }

    /// Moves deletion `id` from status `from` to `to` with its new record; false when it is
    /// no longer in `from` (another admin or process changed it first).
    pub fn update_deletion(
        &self,
        id: &str,
        from: &str,
        to: &str,
        doc: &str,
    ) -> Result<bool, InventoryError> {
        const Q: &str = "UPDATE deletions SET status = $3, doc = $4 WHERE id = $1 AND status = $2";
        self.with(|c, shown| match c {
            Conn::Sqlite(c) => Ok(c
                .prepare_cached(&sqlite_params(Q))?
                .execute(params![id, from, to, doc])?
                == 1),
            Conn::Postgres(c) => c
                .execute(Q, &[&id, &from, &to, &doc])
                .map(|n| n == 1)
                .map_err(pg_err(shown)),
        })
    }

    /// Deletion `id`'s record, if there is one.
    pub fn deletion_doc(&self, id: &str) -> Result<Option<String>, InventoryError> {
        self.text(
            "SELECT doc FROM deletions WHERE id = ?1",
            "SELECT doc FROM deletions WHERE id = $1",
            id,
            None,
        )
    }

    /// The records of every deletion of `ark` (of every object when `ark` is empty), oldest
    /// first.
    pub fn deletion_docs(&self, ark: &str) -> Result<Vec<String>, InventoryError> {
        const Q: &str = "SELECT doc FROM deletions WHERE $1 = '' OR ark = $1 ORDER BY id";
        self.rows_by(Q, ark, |r| r.get(0), |r| r.get(0))
    }

    /// Every file of every version of `ark`: (version, file), by version and path.
    pub fn object_files(&self, ark: &str) -> Result<Vec<(u32, ObjectFile)>, InventoryError> {
        const Q: &str = "SELECT version, path, size, sha256, from_version, from_path FROM files
             WHERE ark = $1 ORDER BY version, path";
        let file = |path, size: i64, sha256, fv: Option<i64>, fp: Option<String>| ObjectFile {
            path,
            size: size as u64,
            sha256,
            from: fv.zip(fp).map(|(version, path)| Origin {
                version: version as u32,
                path,
            }),
        };
        self.rows_by(
            Q,
            ark,
            |r| {
                Ok((
                    r.get(0)?,
                    file(r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?),
                ))
            },
            |r| {
                (
                    r.get::<_, i32>(0) as u32,
                    file(
                        r.get(1),
                        r.get(2),
                        r.get(3),
                        r.get::<_, Option<i32>>(4).map(i64::from),
                        r.get(5),
                    ),
                )
            },
        )
    }
}
