//! The inventory database: objects, versions and files, so stored content can be found.
//! Recording a version twice changes nothing. It lives in a SQLite file on one machine (the
//! default, `DATA_DIR/inventory.db`) or in PostgreSQL (`inventory = "postgres://USER@HOST:PORT/DB"`)
//! when several hosts record and serve objects: the same tables, the same idempotence.

use crate::files::{ObjectFile, StoredVersion, list_files};
use rusqlite::{Connection, OptionalExtension, params};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use crate::config::Location;

/// The tables, for both databases (SQLite takes `BIGINT` as an integer).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS objects(ark TEXT PRIMARY KEY, created TEXT NOT NULL, collection TEXT);
CREATE TABLE IF NOT EXISTS versions(ark TEXT NOT NULL REFERENCES objects(ark), version INTEGER NOT NULL,
  job TEXT NOT NULL, batch TEXT NOT NULL, path TEXT NOT NULL, created TEXT NOT NULL,
  PRIMARY KEY(ark, version));
CREATE TABLE IF NOT EXISTS files(ark TEXT NOT NULL, version INTEGER NOT NULL, path TEXT NOT NULL,
  size BIGINT NOT NULL, sha256 TEXT NOT NULL, from_version INTEGER, from_path TEXT,
  PRIMARY KEY(ark, version, path), FOREIGN KEY(ark, version) REFERENCES versions(ark, version));
CREATE TABLE IF NOT EXISTS local_ids(collection TEXT NOT NULL, local_id TEXT NOT NULL,
  ark TEXT NOT NULL, PRIMARY KEY(collection, local_id));
CREATE TABLE IF NOT EXISTS copies(ark TEXT NOT NULL, version INTEGER NOT NULL, path TEXT NOT NULL,
  node BIGINT NOT NULL, status TEXT NOT NULL, checked TEXT, found TEXT,
  PRIMARY KEY(ark, version, path, node));
CREATE TABLE IF NOT EXISTS deletions(id TEXT PRIMARY KEY, ark TEXT NOT NULL, status TEXT NOT NULL,
  doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS copies_due ON copies(checked, ark, version, path, node);
CREATE INDEX IF NOT EXISTS versions_job ON versions(job);
";

/// A PostgreSQL error, named with the inventory's location (as shown, without a password).
fn pg_err(shown: &str) -> impl FnOnce(postgres::Error) -> InventoryError + '_ {
    move |error| InventoryError::Postgres {
        at: shown.to_string(),
        error,
    }
}

/// Taken while PostgreSQL's tables are made, so hosts starting together do not race on
/// `CREATE TABLE IF NOT EXISTS` (which is not safe against itself).
const PG_SCHEMA_LOCK: i64 = 0x4c61_6469_6e67;

/// The versions of one object: (version, file count, total bytes).
pub type Versions = Vec<(u32, u64, u64)>;

/// What one `record` call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// False when the version was already in the inventory.
    pub new: bool,
    pub files: usize,
}

/// A version's number recorded already for another job's copy ([`InventoryError::Taken`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "{ark} v{version} is recorded already, as job {other_job}'s copy at {other_path}; job {job}'s copy at {path} is not recorded (is the object stored in two places?)"
)]
pub struct Taken {
    pub ark: String,
    pub version: u32,
    pub job: String,
    pub path: String,
    pub other_job: String,
    pub other_path: String,
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error(transparent)]
    Sql(#[from] rusqlite::Error),
    #[error("PostgreSQL inventory at {at}: {error}")]
    Postgres { at: String, error: postgres::Error },
    #[error("the inventory setting {0:?} is not a PostgreSQL URL it can use: {1}")]
    BadUrl(String, String),
    #[error("reading the stored version: {0}")]
    Io(#[from] std::io::Error),
    /// The version's number is recorded already, for another job's copy: nothing is
    /// recorded (the object is stored in two places, e.g. under two profiles whose storage
    /// differs, and one place's numbering does not know the other's).
    #[error("{0}")]
    Taken(Box<Taken>),
}

/// The path, or the URL without its password.
impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Sqlite(p) => write!(f, "{}", p.display()),
            Location::Postgres(u) => match url::Url::parse(u) {
                Ok(mut parsed) if parsed.password().is_some() => {
                    let _ = parsed.set_password(Some("***"));
                    write!(f, "{parsed}")
                }
                Ok(_) => f.write_str(u),
                Err(_) => f.write_str("postgres://(unreadable URL)"),
            },
        }
    }
}

pub fn open(db: &Path) -> Result<Connection, InventoryError> {
    if let Some(p) = db.parent() {
        std::fs::create_dir_all(p)?;
    }
    let c = Connection::open(db)?;
    c.busy_timeout(std::time::Duration::from_secs(30))?;
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.pragma_update(None, "foreign_keys", "ON")?;
    // Plans that do not depend on the values bound. Otherwise SQLite marks a statement to be
    // planned again when a `LIMIT ?`, a column compared with `?` in a join, or an `ORDER BY`
    // gets a new value, and rusqlite clears a statement's values when it returns it to the
    // cache: every cached read of the inventory was parsed and planned again at every use
    // (`lading-sim` seeds 1-4: 165 times, in 173 reads).
    c.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    c.execute_batch(SCHEMA)?;
    // Inventories made before objects had owners: the column is added, empty.
    let has_owner: bool = c
        .prepare("SELECT 1 FROM pragma_table_info('objects') WHERE name = 'collection'")?
        .exists([])?;
    if !has_owner {
        c.execute_batch("ALTER TABLE objects ADD COLUMN collection TEXT")?;
    }
    // Inventories made before files were carried over between versions.
    let has_from: bool = c
        .prepare("SELECT 1 FROM pragma_table_info('files') WHERE name = 'from_version'")?
        .exists([])?;
    if !has_from {
        c.execute_batch(
            "ALTER TABLE files ADD COLUMN from_version INTEGER; ALTER TABLE files ADD COLUMN from_path TEXT;",
        )?;
    }
    Ok(c)
}

fn open_postgres(url: &str, shown: &str) -> Result<postgres::Client, InventoryError> {
    let pg = |error| InventoryError::Postgres {
        at: shown.to_string(),
        error,
    };
    let mut config: postgres::Config = url
        .parse()
        .map_err(|e: postgres::Error| InventoryError::BadUrl(shown.to_string(), e.to_string()))?;
    config
        .connect_timeout(Duration::from_secs(10))
        .application_name("lading");
    let mut c = config.connect(postgres::NoTls).map_err(pg)?;
    let mut tx = c.transaction().map_err(pg)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&PG_SCHEMA_LOCK])
        .map_err(pg)?;
    tx.batch_execute(SCHEMA).map_err(pg)?;
    tx.batch_execute(
        "ALTER TABLE files ADD COLUMN IF NOT EXISTS from_version INTEGER;
         ALTER TABLE files ADD COLUMN IF NOT EXISTS from_path TEXT;",
    )
    .map_err(pg)?;
    tx.commit().map_err(pg)?;
    Ok(c)
}

enum Conn {
    Sqlite(Connection),
    Postgres(postgres::Client),
}

/// An open inventory, shared by a process's recording handlers and readers (one connection:
/// opening one per record cost more than the record). Every call blocks: call it from a
/// blocking thread, or through [`Inventory::run`].
pub struct Inventory {
    location: Location,
    conn: Mutex<Option<Conn>>,
    /// What a record's `created` time is read from.
    clock: lading_core::time::SharedClock,
}

impl Inventory {
    pub fn new(location: Location) -> Inventory {
        Inventory {
            location,
            conn: Mutex::new(None),
            clock: lading_core::time::system_clock(),
        }
    }

    /// The same inventory with `clock` for the times it records (the engine's).
    pub fn with_clock(mut self, clock: lading_core::time::SharedClock) -> Inventory {
        self.clock = clock;
        self
    }

    pub fn location(&self) -> &Location {
        &self.location
    }

    /// Runs `f` on a blocking thread.
    pub async fn run<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Inventory) -> Result<T, InventoryError> + Send + 'static,
    ) -> Result<T, InventoryError> {
        let inv = self.clone();
        crate::blocking::run(move || f(&inv))
            .await
            .map_err(|e| InventoryError::Io(std::io::Error::other(e)))?
    }

    /// Runs `f` on the shared connection (opened on first use); a connection that failed is
    /// not reused.
    fn with<T>(
        &self,
        f: impl FnOnce(&mut Conn, &str) -> Result<T, InventoryError>,
    ) -> Result<T, InventoryError> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let shown = self.location.to_string();
        if guard.is_none() {
            *guard = Some(match &self.location {
                Location::Sqlite(p) => Conn::Sqlite(open(p)?),
                Location::Postgres(u) => Conn::Postgres(open_postgres(u, &shown)?),
            });
        }
        let r = f(guard.as_mut().expect("opened above"), &shown);
        if r.is_err() {
            *guard = None;
        }
        r
    }

    /// Records a stored version and its files in one transaction. `producer` lists the
    /// object's own files as processing hashed them (so they are not read again); the rest of
    /// the version (Lading's manifest and version record, a few small files) is hashed here.
    pub fn record(
        &self,
        v: &StoredVersion,
        producer: Option<&[ObjectFile]>,
    ) -> Result<Recorded, InventoryError> {
        let files = self.stored_files(v, producer)?;
        self.record_files(v, &files)
    }

    /// Records a stored version with its files as listed (a version on a bucket node, whose
    /// record lists them), and each file's copy on the version's node as checked now.
    pub fn record_files(
        &self,
        v: &StoredVersion,
        files: &[ObjectFile],
    ) -> Result<Recorded, InventoryError> {
        let now = lading_core::time::format_ts(self.clock.now_ms());
        let r = self.with(|c, shown| match c {
            Conn::Sqlite(c) => record_sqlite(c, v, files, &now),
            Conn::Postgres(c) => record_postgres(c, v, files, &now).map_err(pg_err(shown)),
        })?;
        let r = match r {
            Ok(r) => r,
            Err((other_job, other_path)) => {
                return Err(InventoryError::Taken(Box::new(Taken {
                    ark: v.ark.clone(),
                    version: v.version,
                    job: v.job.clone(),
                    path: v.path.clone(),
                    other_job,
                    other_path,
                })));
            }
        };
        // A file carried over from an earlier version has its copy recorded there.
        let rows: Vec<CopyRow> = files
            .iter()
            .filter(|f| f.from.is_none())
            .map(|f| CopyRow {
                ark: v.ark.clone(),
                version: v.version,
                path: f.path.clone(),
                node: v.node.unwrap_or(0),
                status: "ok".into(),
                found: Some(f.sha256.clone()),
            })
            .collect();
        self.set_copies(&rows)?;
        Ok(r)
    }

    fn stored_files(
        &self,
        v: &StoredVersion,
        producer: Option<&[ObjectFile]>,
    ) -> Result<Vec<ObjectFile>, InventoryError> {
        Ok(match producer {
            None => list_files(Path::new(&v.path))?,
            Some(known) => {
                let root = Path::new(&v.path);
                let mut all: Vec<ObjectFile> = known
                    .iter()
                    .map(|f| ObjectFile {
                        path: format!("{}/{}", crate::files::PRODUCER, f.path),
                        ..f.clone()
                    })
                    .collect();
                for e in std::fs::read_dir(root)? {
                    let e = e?;
                    let name = e.file_name().to_string_lossy().into_owned();
                    if name == crate::files::PRODUCER {
                        continue;
                    }
                    if e.file_type()?.is_dir() {
                        all.extend(list_files(&e.path())?.into_iter().map(|f| ObjectFile {
                            path: format!("{name}/{}", f.path),
                            ..f
                        }));
                    } else {
                        let (size, sha256) = crate::files::file_sha256(&e.path())?;
                        all.push(ObjectFile {
                            path: name,
                            size,
                            sha256,
                            from: None,
                        });
                    }
                }
                all.sort_by(|a, b| a.path.cmp(&b.path));
                all
            }
        })
    }

    /// Records how copies were found (stored, replicated, checked, repaired), now.
    pub fn set_copies(&self, rows: &[CopyRow]) -> Result<(), InventoryError> {
        let now = lading_core::time::format_ts(self.clock.now_ms());
        const Q: &str = "INSERT INTO copies(ark, version, path, node, status, checked, found)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT(ark, version, path, node) DO UPDATE SET status = excluded.status,
               checked = excluded.checked, found = excluded.found
             WHERE copies.status <> 'deleted'";
        self.with(|c, shown| match c {
            Conn::Sqlite(c) => {
                let tx = c.transaction()?;
                {
                    let mut st = tx.prepare_cached(&sqlite_params(Q))?;
                    for r in rows {
                        st.execute(params![
                            r.ark,
                            r.version,
                            r.path,
                            r.node as i64,
                            r.status,
                            now,
                            r.found
                        ])?;
                    }
                }
                tx.commit()?;
                Ok(())
            }
            Conn::Postgres(c) => (|| {
                let mut tx = c.transaction()?;
                let st = tx.prepare(Q)?;
                for r in rows {
                    tx.execute(
                        &st,
                        &[
                            &r.ark,
                            &(r.version as i32),
                            &r.path,
                            &(r.node as i64),
                            &r.status,
                            &now,
                            &r.found,
                        ],
                    )?;
                }
                tx.commit()
            })()
            .map_err(pg_err(shown)),
        })
    }

    /// The copies of the versions `job` stored, per version and node.
    pub fn job_copies(&self, job: &str) -> Result<Vec<NodeCopies>, InventoryError> {
        const Q: &str = "SELECT f.ark, f.version, c.node,
               CAST(SUM(CASE WHEN c.status = 'ok' THEN 1 ELSE 0 END) AS BIGINT),
               CAST(SUM(CASE WHEN c.status = 'bad' THEN 1 ELSE 0 END) AS BIGINT),
               CAST(SUM(CASE WHEN c.status = 'missing' THEN 1 ELSE 0 END) AS BIGINT),
               MAX(c.checked)
             FROM versions v JOIN files f ON f.ark = v.ark AND f.version = v.version
             JOIN copies c ON c.ark = f.ark AND c.version = COALESCE(f.from_version, f.version)
               AND c.path = COALESCE(f.from_path, f.path)
             WHERE v.job = $1 GROUP BY f.ark, f.version, c.node ORDER BY f.ark, f.version, c.node";
        self.rows_by(
            Q,
            job,
            |r| {
                Ok(NodeCopies {
                    ark: r.get(0)?,
                    version: r.get(1)?,
                    node: r.get::<_, i64>(2)? as u32,
                    ok: r.get::<_, i64>(3)? as u64,
                    bad: r.get::<_, i64>(4)? as u64,
                    missing: r.get::<_, i64>(5)? as u64,
                    last_checked: r.get(6)?,
                })
            },
            |r| NodeCopies {
                ark: r.get(0),
                version: r.get::<_, i32>(1) as u32,
                node: r.get::<_, i64>(2) as u32,
                ok: r.get::<_, i64>(3) as u64,
                bad: r.get::<_, i64>(4) as u64,
                missing: r.get::<_, i64>(5) as u64,
                last_checked: r.get(6),
            },
        )
    }

    /// Up to `limit` copies last checked before `before` (a recorded time) or never, the
    /// longest unchecked first: the scheduled audit's next share.
    pub fn copies_due(&self, before: &str, limit: i64) -> Result<Vec<CopyCheck>, InventoryError> {
        const Q: &str = "SELECT c.ark, c.version, c.path, c.node, c.status, c.checked, f.size, f.sha256, v.path
             FROM copies c JOIN files f ON f.ark = c.ark AND f.version = c.version AND f.path = c.path
             JOIN versions v ON v.ark = c.ark AND v.version = c.version
             WHERE (c.checked IS NULL OR c.checked < $1) AND c.status <> 'deleted'
             ORDER BY c.checked, c.ark, c.version, c.path, c.node LIMIT $2";
        self.copy_query(Q, before.to_string(), limit)
    }

    /// Copies recorded in all, and of them bad and missing, and the oldest check.
    pub fn fixity_summary(&self) -> Result<FixitySummary, InventoryError> {
        const Q: &str = "SELECT CAST(COUNT(*) AS BIGINT),
               CAST(COALESCE(SUM(CASE WHEN status = 'bad' THEN 1 ELSE 0 END), 0) AS BIGINT),
               CAST(COALESCE(SUM(CASE WHEN status = 'missing' THEN 1 ELSE 0 END), 0) AS BIGINT),
               MIN(checked) FROM copies WHERE status <> 'deleted'";
        self.with(|c, shown| match c {
            Conn::Sqlite(c) => Ok(c.prepare_cached(Q)?.query_row([], |r| {
                Ok(FixitySummary {
                    copies: r.get::<_, i64>(0)? as u64,
                    bad: r.get::<_, i64>(1)? as u64,
                    missing: r.get::<_, i64>(2)? as u64,
                    oldest_check: r.get(3)?,
                })
            })?),
            Conn::Postgres(c) => c
                .query_one(Q, &[])
                .map(|r| FixitySummary {
                    copies: r.get::<_, i64>(0) as u64,
                    bad: r.get::<_, i64>(1) as u64,
                    missing: r.get::<_, i64>(2) as u64,
                    oldest_check: r.get(3),
                })
                .map_err(pg_err(shown)),
        })
    }

    fn copy_query(&self, q: &str, a: String, b: i64) -> Result<Vec<CopyCheck>, InventoryError> {
        let row =
            |ark, version, path, node: i64, status, checked, size: i64, sha256, version_path| {
                CopyCheck {
                    ark,
                    version,
                    path,
                    node: node as u32,
                    status,
                    checked,
                    size: size as u64,
                    sha256,
                    version_path,
                }
            };
        self.with(|c, shown| match c {
            Conn::Sqlite(c) => {
                let mut st = c.prepare_cached(&sqlite_params(q))?;
                let rows = st
                    .query_map(params![a, b], |r| {
                        Ok(row(
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                            r.get(4)?,
                            r.get(5)?,
                            r.get(6)?,
                            r.get(7)?,
                            r.get(8)?,
                        ))
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            }
            Conn::Postgres(c) => c
                .query(q, &[&a, &b])
                .map(|rows| {
                    rows.iter()
                        .map(|r| {
                            row(
                                r.get(0),
                                r.get::<_, i32>(1) as u32,
                                r.get(2),
                                r.get(3),
                                r.get(4),
                                r.get(5),
                                r.get(6),
                                r.get(7),
                                r.get(8),
                            )
                        })
                        .collect()
                })
                .map_err(pg_err(shown)),
        })
    }

    /// Every recorded copy (of `node`, of `ark`, when given) with what the file should be.
    pub fn copies(
        &self,
        node: Option<u32>,
        ark: Option<&str>,
    ) -> Result<Vec<CopyCheck>, InventoryError> {
        const Q: &str = "SELECT c.ark, c.version, c.path, c.node, c.status, c.checked, f.size, f.sha256, v.path
             FROM copies c JOIN files f ON f.ark = c.ark AND f.version = c.version AND f.path = c.path
             JOIN versions v ON v.ark = c.ark AND v.version = c.version
             WHERE (CAST($1 AS BIGINT) < 0 OR c.node = CAST($1 AS BIGINT)) AND ($2 = '' OR c.ark = $2)
               AND c.status <> 'deleted'
             ORDER BY c.ark, c.version, c.path, c.node";
        let n = node.map_or(-1i64, i64::from);
        let a = ark.unwrap_or("").to_string();
        self.with(|c, shown| match c {
            Conn::Sqlite(c) => {
                let mut st = c.prepare_cached(&sqlite_params(Q))?;
                let rows = st
                    .query_map(params![n, a], |r| {
                        Ok(CopyCheck {
                            ark: r.get(0)?,
                            version: r.get(1)?,
                            path: r.get(2)?,
                            node: r.get::<_, i64>(3)? as u32,
                            status: r.get(4)?,
                            checked: r.get(5)?,
                            size: r.get::<_, i64>(6)? as u64,
                            sha256: r.get(7)?,
                            version_path: r.get(8)?,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            }
            Conn::Postgres(c) => c
                .query(Q, &[&n, &a])
                .map(|rows| {
                    rows.iter()
                        .map(|r| CopyCheck {
                            ark: r.get(0),
                            version: r.get::<_, i32>(1) as u32,
                            path: r.get(2),
                            node: r.get::<_, i64>(3) as u32,
                            status: r.get(4),
                            checked: r.get(5),
                            size: r.get::<_, i64>(6) as u64,
                            sha256: r.get(7),
                            version_path: r.get(8),
                        })
                        .collect()
                })
                .map_err(pg_err(shown)),
        })
    }

    /// One row of one text column, or none.
    fn text(
        &self,
        sqlite: &str,
        postgres: &str,
        ark: &str,
        version: Option<u32>,
    ) -> Result<Option<String>, InventoryError> {
        self.with(|c, shown| match c {
            Conn::Sqlite(c) => Ok(match version {
                None => c
                    .prepare_cached(sqlite)?
                    .query_row(params![ark], |r| r.get(0)),
                Some(v) => c
                    .prepare_cached(sqlite)?
                    .query_row(params![ark, v], |r| r.get(0)),
            }
            .optional()?),
            Conn::Postgres(c) => {
                let row = match version {
                    None => c.query_opt(postgres, &[&ark]),
                    Some(v) => c.query_opt(postgres, &[&ark, &(v as i32)]),
                };
                row.map(|r| r.map(|r| r.get(0))).map_err(pg_err(shown))
            }
        })
    }

    /// The collection that owns `ark` (the one whose profile created it), if it is recorded;
    /// `Some("")` for an object recorded before owners were kept.
    pub fn owner(&self, ark: &str) -> Result<Option<String>, InventoryError> {
        self.text(
            "SELECT COALESCE(collection, '') FROM objects WHERE ark = ?1",
            "SELECT COALESCE(collection, '') FROM objects WHERE ark = $1",
            ark,
            None,
        )
    }

    /// The batch that stored version `version` of `ark`, if it is recorded.
    pub fn version_batch(&self, ark: &str, version: u32) -> Result<Option<String>, InventoryError> {
        self.text(
            "SELECT batch FROM versions WHERE ark = ?1 AND version = ?2",
            "SELECT batch FROM versions WHERE ark = $1 AND version = $2",
            ark,
            Some(version),
        )
    }

    /// Where version `version` of `ark` is stored, if it was recorded.
    pub fn version_path(&self, ark: &str, version: u32) -> Result<Option<String>, InventoryError> {
        self.text(
            "SELECT path FROM versions WHERE ark = ?1 AND version = ?2",
            "SELECT path FROM versions WHERE ark = $1 AND version = $2",
            ark,
            Some(version),
        )
    }

    /// Versions recorded for `ark`: (version, file count, total bytes), oldest first.
    /// The newest recorded version of `ark` and the nodes holding a copy of it (0: the storage
    /// root), in order; `None` for an object with no version recorded.
    pub fn newest_copies(&self, ark: &str) -> Result<Option<(u32, Vec<u32>)>, InventoryError> {
        const Q: &str = "SELECT f.version, c.node FROM files f JOIN copies c ON c.ark = f.ark
               AND c.version = COALESCE(f.from_version, f.version) AND c.path = COALESCE(f.from_path, f.path)
             WHERE f.ark = $1 AND f.version = (SELECT MAX(version) FROM files WHERE ark = $1)
             GROUP BY f.version, c.node ORDER BY c.node";
        let rows = self.rows_by(
            Q,
            ark,
            |r| Ok((r.get::<_, u32>(0)?, r.get::<_, i64>(1)? as u32)),
            |r| (r.get::<_, i32>(0) as u32, r.get::<_, i64>(1) as u32),
        )?;
        Ok(rows
            .first()
            .map(|&(v, _)| (v, rows.iter().map(|&(_, n)| n).collect())))
    }

    pub fn versions(&self, ark: &str) -> Result<Versions, InventoryError> {
        const Q: &str = "SELECT v.version, COUNT(f.path), CAST(COALESCE(SUM(f.size), 0) AS BIGINT)
             FROM versions v LEFT JOIN files f ON f.ark = v.ark AND f.version = v.version
             WHERE v.ark = $1 GROUP BY v.version ORDER BY v.version";
        self.rows_by(
            Q,
            ark,
            |r| {
                Ok((
                    r.get::<_, u32>(0)?,
                    r.get::<_, i64>(1)? as u64,
                    r.get::<_, i64>(2)? as u64,
                ))
            },
            |r| {
                (
                    r.get::<_, i32>(0) as u32,
                    r.get::<_, i64>(1) as u64,
                    r.get::<_, i64>(2) as u64,
                )
            },
        )
    }

    /// The rows `q` answers for its one text parameter `$1`, each read by `sqlite` or by `pg`
    /// (the two backends type their columns differently: PostgreSQL's `INTEGER` is an `i32`).
    fn rows_by<T>(
        &self,
        q: &str,
        arg: &str,
        sqlite: impl Fn(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
        pg: impl Fn(&postgres::Row) -> T,
    ) -> Result<Vec<T>, InventoryError> {
        self.with(|c, shown| match c {
            Conn::Sqlite(c) => {
                let mut st = c.prepare_cached(&sqlite_params(q))?;
                let rows = st
                    .query_map(params![arg], |r| sqlite(r))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            }
            Conn::Postgres(c) => c
                .query(q, &[&arg])
                .map(|rows| rows.iter().map(&pg).collect())
                .map_err(pg_err(shown)),
        })
    }
}

/// How one file's copy on one node was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyRow {
    pub ark: String,
    pub version: u32,
    pub path: String,
    /// The storage node (0: the storage root of a profile without nodes).
    pub node: u32,
    /// `ok`, `bad` (other bytes), `missing`; `deleted` once an approved deletion removes it
    /// (the checker no longer reads it, and no later check changes that).
    pub status: String,
    /// The SHA-256 found, when the file was read.
    pub found: Option<String>,
}

/// A recorded copy with what it should hold.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CopyCheck {
    pub ark: String,
    pub version: u32,
    pub path: String,
    pub node: u32,
    pub status: String,
    pub checked: Option<String>,
    pub size: u64,
    pub sha256: String,
    /// The version's recorded location (a folder, or a node's `s3://` prefix).
    pub version_path: String,
}

/// The fixity of every recorded copy, summed up (the queue's summary shows it).
pub use lading_engine::FixitySummary;

/// A version's copies on one node, summed up.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeCopies {
    pub ark: String,
    pub version: u32,
    pub node: u32,
    pub ok: u64,
    pub bad: u64,
    pub missing: u64,
    /// When a copy of the version on this node was last checked.
    pub last_checked: Option<String>,
}

/// PostgreSQL's `$N` placeholders as SQLite's `?N`.
/// (One pass: a `replace` per number was 0.3% of a simulator run.)
fn sqlite_params(q: &str) -> String {
    let b = q.as_bytes();
    q.char_indices()
        .map(|(i, c)| match c {
            '$' if b.get(i + 1).is_some_and(u8::is_ascii_digit) => '?',
            c => c,
        })
        .collect()
}

impl Drop for Inventory {
    /// A PostgreSQL client blocks on its own runtime to close, which must not happen on a
    /// thread that drives async tasks: it is closed on a thread of its own.
    fn drop(&mut self) {
        let conn = self
            .conn
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(Conn::Postgres(c)) = conn {
            let _ = std::thread::spawn(move || drop(c)).join();
        }
    }
}

/// [`Inventory::owner`] off the async runtime.
pub async fn owner_of(inv: &Arc<Inventory>, ark: &str) -> Result<Option<String>, InventoryError> {
    let ark = ark.to_string();
    inv.run(move |i| i.owner(&ark)).await
}

mod deletions;
pub use deletions::{Deletion, DeletionFile, DeletionStatus};
mod reads;
mod record;
pub use reads::{JobVersion, MAX_LISTED};
use record::{record_postgres, record_sqlite};

#[cfg(test)]
mod tests;
