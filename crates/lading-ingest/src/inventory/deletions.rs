//! The inventory's deletion requests and tombstones ([`crate::deletion`]): one row each, its
//! status beside the record as JSON, changed only from the status it was read in.

use super::*;
use crate::files::Origin;

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
