//! The inventory database (SQLite): objects, versions and files, so stored content can be
//! found. Recording a version twice changes nothing.

use crate::stages::{ObjectFile, StoredVersion, list_files};
use rusqlite::{Connection, OptionalExtension, params};
use std::path::Path;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS objects(ark TEXT PRIMARY KEY, created TEXT NOT NULL, collection TEXT);
CREATE TABLE IF NOT EXISTS versions(ark TEXT NOT NULL REFERENCES objects(ark), version INTEGER NOT NULL,
  job TEXT NOT NULL, batch TEXT NOT NULL, path TEXT NOT NULL, created TEXT NOT NULL,
  PRIMARY KEY(ark, version));
CREATE TABLE IF NOT EXISTS files(ark TEXT NOT NULL, version INTEGER NOT NULL, path TEXT NOT NULL,
  size INTEGER NOT NULL, sha256 TEXT NOT NULL, PRIMARY KEY(ark, version, path),
  FOREIGN KEY(ark, version) REFERENCES versions(ark, version));
";

/// What one `record` call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// False when the version was already in the inventory.
    pub new: bool,
    pub files: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error(transparent)]
    Sql(#[from] rusqlite::Error),
    #[error("reading the stored version: {0}")]
    Io(#[from] std::io::Error),
}

pub fn open(db: &Path) -> Result<Connection, InventoryError> {
    if let Some(p) = db.parent() {
        std::fs::create_dir_all(p)?;
    }
    let c = Connection::open(db)?;
    c.busy_timeout(std::time::Duration::from_secs(30))?;
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.pragma_update(None, "foreign_keys", "ON")?;
    c.execute_batch(SCHEMA)?;
    // Inventories made before objects had owners: the column is added, empty.
    let has_owner: bool = c
        .prepare("SELECT 1 FROM pragma_table_info('objects') WHERE name = 'collection'")?
        .exists([])?;
    if !has_owner {
        c.execute_batch("ALTER TABLE objects ADD COLUMN collection TEXT")?;
    }
    Ok(c)
}

/// An open inventory, shared by a process's recording handlers (one connection: opening
/// one per record cost more than the record).
pub struct Inventory {
    path: std::path::PathBuf,
    conn: std::sync::Mutex<Option<Connection>>,
}

impl Inventory {
    pub fn new(path: impl Into<std::path::PathBuf>) -> Inventory {
        Inventory {
            path: path.into(),
            conn: std::sync::Mutex::new(None),
        }
    }

    /// Records a stored version and its files in one transaction. `producer` lists the
    /// object's own files as processing hashed them (so they are not read again); the rest of
    /// the version (Lading's manifest and version record, a few small files) is hashed here.
    /// Blocking: call from a blocking thread.
    pub fn record(
        &self,
        v: &StoredVersion,
        producer: Option<&[ObjectFile]>,
    ) -> Result<Recorded, InventoryError> {
        let files = match producer {
            None => list_files(Path::new(&v.path))?,
            Some(known) => {
                let root = Path::new(&v.path);
                let mut all: Vec<ObjectFile> = known
                    .iter()
                    .map(|f| ObjectFile {
                        path: format!("{}/{}", crate::stages::PRODUCER, f.path),
                        ..f.clone()
                    })
                    .collect();
                for e in std::fs::read_dir(root)? {
                    let e = e?;
                    let name = e.file_name().to_string_lossy().into_owned();
                    if name == crate::stages::PRODUCER {
                        continue;
                    }
                    if e.file_type()?.is_dir() {
                        all.extend(list_files(&e.path())?.into_iter().map(|f| ObjectFile {
                            path: format!("{name}/{}", f.path),
                            ..f
                        }));
                    } else {
                        let (size, sha256) = crate::fetch::file_sha256(&e.path())?;
                        all.push(ObjectFile {
                            path: name,
                            size,
                            sha256,
                        });
                    }
                }
                all.sort_by(|a, b| a.path.cmp(&b.path));
                all
            }
        };
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(open(&self.path)?);
        }
        let c = guard.as_mut().expect("opened above");
        let r = record_into(c, v, &files);
        if r.is_err() {
            // A broken connection is not reused.
            *guard = None;
        }
        r
    }

    /// Runs `f` on the shared connection (opened on first use). Blocking.
    fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, InventoryError>,
    ) -> Result<T, InventoryError> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(open(&self.path)?);
        }
        let r = f(guard.as_ref().expect("opened above"));
        if r.is_err() {
            *guard = None;
        }
        r
    }

    /// The collection that owns `ark` (the one whose profile created it), if it is recorded;
    /// `Some("")` for an object recorded before owners were kept. Blocking.
    pub fn owner(&self, ark: &str) -> Result<Option<String>, InventoryError> {
        self.with(|c| {
            Ok(c.query_row(
                "SELECT COALESCE(collection, '') FROM objects WHERE ark = ?1",
                params![ark],
                |r| r.get(0),
            )
            .optional()?)
        })
    }

    /// The batch that stored version `version` of `ark`, if it is recorded. Blocking.
    pub fn version_batch(&self, ark: &str, version: u32) -> Result<Option<String>, InventoryError> {
        self.with(|c| {
            Ok(c.query_row(
                "SELECT batch FROM versions WHERE ark = ?1 AND version = ?2",
                params![ark, version],
                |r| r.get(0),
            )
            .optional()?)
        })
    }
}

/// [`Inventory::owner`] off the async runtime.
pub async fn owner_of(
    inv: &std::sync::Arc<Inventory>,
    ark: &str,
) -> Result<Option<String>, InventoryError> {
    let (inv, ark) = (inv.clone(), ark.to_string());
    tokio::task::spawn_blocking(move || inv.owner(&ark))
        .await
        .map_err(|e| InventoryError::Io(std::io::Error::other(e)))?
}

fn record_into(
    c: &mut Connection,
    v: &StoredVersion,
    files: &[ObjectFile],
) -> Result<Recorded, InventoryError> {
    let tx = c.transaction()?;
    let now = lading_core::time::format_ts(lading_core::time::system_clock().now_ms());
    tx.execute(
        "INSERT OR IGNORE INTO objects(ark, created, collection) VALUES (?1, ?2, ?3)",
        params![v.ark, now, v.collection],
    )?;
    if v.collection.is_some() {
        // An object recorded before owners were kept gets its first recorded owner.
        tx.execute(
            "UPDATE objects SET collection = ?2 WHERE ark = ?1 AND collection IS NULL",
            params![v.ark, v.collection],
        )?;
    }
    let new = tx.execute(
        "INSERT OR IGNORE INTO versions(ark, version, job, batch, path, created) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![v.ark, v.version, v.job, v.batch, v.path, now],
    )? == 1;
    for f in files {
        tx.execute(
            "INSERT OR IGNORE INTO files(ark, version, path, size, sha256) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![v.ark, v.version, f.path, f.size as i64, f.sha256],
        )?;
    }
    tx.commit()?;
    Ok(Recorded {
        new,
        files: files.len(),
    })
}

/// Versions recorded for `ark`: (version, file count, total bytes).
pub fn versions_of(db: &Path, ark: &str) -> Result<Vec<(u32, u64, u64)>, InventoryError> {
    let c = open(db)?;
    let mut st = c.prepare(
        "SELECT v.version, COUNT(f.path), COALESCE(SUM(f.size), 0) FROM versions v
         LEFT JOIN files f ON f.ark = v.ark AND f.version = v.version
         WHERE v.ark = ?1 GROUP BY v.version ORDER BY v.version",
    )?;
    let rows = st
        .query_map(params![ark], |r| {
            Ok((
                r.get::<_, u32>(0)?,
                r.get::<_, i64>(1)? as u64,
                r.get::<_, i64>(2)? as u64,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

/// Where version `version` of `ark` is stored, if it was recorded.
pub fn version_path(db: &Path, ark: &str, version: u32) -> Result<Option<String>, InventoryError> {
    let c = open(db)?;
    Ok(c.query_row(
        "SELECT path FROM versions WHERE ark = ?1 AND version = ?2",
        params![ark, version],
        |r| r.get(0),
    )
    .optional()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recording_a_version_twice_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = dir.path().join("obj/v1");
        std::fs::create_dir_all(v1.join("producer")).unwrap();
        std::fs::write(v1.join("producer/a.txt"), b"alpha").unwrap();
        let v = StoredVersion {
            ark: "ark:/99999/fk4x".into(),
            version: 1,
            path: v1.to_string_lossy().into_owned(),
            job: "jid0000000001".into(),
            batch: "bid0000000001".into(),
            collection: Some("demo".into()),
        };
        let inv = Inventory::new(dir.path().join("inventory.db"));
        let first = inv.record(&v, None).unwrap();
        assert_eq!(
            first,
            Recorded {
                new: true,
                files: 1
            }
        );
        let again = inv.record(&v, None).unwrap();
        assert_eq!(
            again,
            Recorded {
                new: false,
                files: 1
            }
        );
        assert_eq!(
            versions_of(&dir.path().join("inventory.db"), "ark:/99999/fk4x").unwrap(),
            vec![(1, 1, 5)]
        );
        assert_eq!(
            inv.owner("ark:/99999/fk4x").unwrap().as_deref(),
            Some("demo")
        );
        assert_eq!(inv.owner("ark:/99999/nope").unwrap(), None);
        assert_eq!(
            inv.version_batch("ark:/99999/fk4x", 1).unwrap().as_deref(),
            Some("bid0000000001")
        );
    }
}
