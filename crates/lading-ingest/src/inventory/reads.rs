//! The inventory's reads by name, version and job: an object's names, a version's files and
//! copies, the versions a job stored.

use super::*;

/// A stored version's files as the inventory has them, for one job.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct JobVersion {
    pub ark: String,
    pub version: u32,
    pub created: String,
    /// (path, size, sha256), by path; at most [`MAX_LISTED`] per job.
    pub files: Vec<(String, u64, String)>,
}

/// Files listed per job by [`Inventory::job_versions`], at most.
pub const MAX_LISTED: usize = 5000;

impl Inventory {
    /// The versions `job` stored, with their files (sizes and digests), oldest first.
    /// Names `ark` collection `collection`'s object `name` (a bag's name, a local
    /// identifier); the first object given a name keeps it.
    pub fn name_object(
        &self,
        collection: &str,
        name: &str,
        ark: &str,
    ) -> Result<(), InventoryError> {
        self.with(|c, shown| match c {
            Conn::Sqlite(c) => {
                c.prepare_cached(
                    "INSERT OR IGNORE INTO local_ids(collection, local_id, ark) VALUES (?1, ?2, ?3)",
                )?
                .execute(params![collection, name, ark])?;
                Ok(())
            }
            Conn::Postgres(c) => c
                .execute(
                    "INSERT INTO local_ids(collection, local_id, ark) VALUES ($1, $2, $3)
                     ON CONFLICT DO NOTHING",
                    &[&collection, &name, &ark],
                )
                .map(|_| ())
                .map_err(pg_err(shown)),
        })
    }

    /// The object collection `collection` named `name`, if any.
    pub fn object_named(
        &self,
        collection: &str,
        name: &str,
    ) -> Result<Option<String>, InventoryError> {
        self.with(|c, shown| match c {
            Conn::Sqlite(c) => Ok(c
                .prepare_cached(
                    "SELECT ark FROM local_ids WHERE collection = ?1 AND local_id = ?2",
                )?
                .query_row(params![collection, name], |r| r.get(0))
                .optional()?),
            Conn::Postgres(c) => c
                .query_opt(
                    "SELECT ark FROM local_ids WHERE collection = $1 AND local_id = $2",
                    &[&collection, &name],
                )
                .map(|r| r.map(|r| r.get(0)))
                .map_err(pg_err(shown)),
        })
    }

    /// The files of version `version` of `ark`: (path, sha256), by path.
    pub fn version_files(
        &self,
        ark: &str,
        version: u32,
    ) -> Result<Vec<(String, String)>, InventoryError> {
        self.with(|c, shown| match c {
            Conn::Sqlite(c) => {
                let mut st = c.prepare_cached(
                    "SELECT path, sha256 FROM files WHERE ark = ?1 AND version = ?2 ORDER BY path",
                )?;
                let rows = st
                    .query_map(params![ark, version], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            }
            Conn::Postgres(c) => c
                .query(
                    "SELECT path, sha256 FROM files WHERE ark = $1 AND version = $2 ORDER BY path",
                    &[&ark, &(version as i32)],
                )
                .map(|rows| rows.iter().map(|r| (r.get(0), r.get(1))).collect())
                .map_err(pg_err(shown)),
        })
    }

    /// How each node's copies of the files of version `version` of `ark` were last found
    /// (`ok`, `bad`, `missing`), wherever each file is stored (a file carried over from an
    /// earlier version is stored there): (node, status) per file and node.
    pub fn version_copies(
        &self,
        ark: &str,
        version: u32,
    ) -> Result<Vec<(u32, String)>, InventoryError> {
        const Q: &str = "SELECT c.node, c.status FROM files f JOIN copies c ON c.ark = f.ark
               AND c.version = COALESCE(f.from_version, f.version) AND c.path = COALESCE(f.from_path, f.path)
             WHERE f.ark = $1 AND f.version = $2 ORDER BY c.node";
        self.with(|c, shown| match c {
            Conn::Sqlite(c) => {
                let mut st = c.prepare_cached(&sqlite_params(Q))?;
                let rows = st
                    .query_map(params![ark, version], |r| {
                        Ok((r.get::<_, i64>(0)? as u32, r.get(1)?))
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            }
            Conn::Postgres(c) => c
                .query(Q, &[&ark, &(version as i32)])
                .map(|rows| {
                    rows.iter()
                        .map(|r| (r.get::<_, i64>(0) as u32, r.get(1)))
                        .collect()
                })
                .map_err(pg_err(shown)),
        })
    }

    pub fn job_versions(&self, job: &str) -> Result<Vec<JobVersion>, InventoryError> {
        const Q: &str = "SELECT v.ark, v.version, v.created, f.path, f.size, f.sha256
             FROM versions v JOIN files f ON f.ark = v.ark AND f.version = v.version
             WHERE v.job = $1 ORDER BY v.version, f.path LIMIT 5000";
        type Row = (String, u32, String, String, u64, String);
        let rows: Vec<Row> = self.with(|c, shown| match c {
            Conn::Sqlite(c) => {
                let mut st = c.prepare_cached(&Q.replace("$1", "?1"))?;
                let rows = st
                    .query_map(params![job], |r| {
                        Ok((
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                            r.get::<_, i64>(4)? as u64,
                            r.get(5)?,
                        ))
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            }
            Conn::Postgres(c) => c
                .query(Q, &[&job])
                .map(|rows| {
                    rows.iter()
                        .map(|r| {
                            (
                                r.get(0),
                                r.get::<_, i32>(1) as u32,
                                r.get(2),
                                r.get(3),
                                r.get::<_, i64>(4) as u64,
                                r.get(5),
                            )
                        })
                        .collect()
                })
                .map_err(pg_err(shown)),
        })?;
        let mut out: Vec<JobVersion> = Vec::new();
        for (ark, version, created, path, size, sha) in rows {
            if !out
                .last()
                .is_some_and(|v| v.ark == ark && v.version == version)
            {
                out.push(JobVersion {
                    ark,
                    version,
                    created,
                    files: Vec::new(),
                });
            }
            if let Some(v) = out.last_mut() {
                v.files.push((path, size, sha));
            }
        }
        Ok(out)
    }
}
