//! The embedded backend: the coordination tree in one SQLite file.
//!
//! Shape, and why:
//! - **One writer thread per session handle, group commit.** Every `multi` is sent to the
//!   writer, which takes everything queued (up to [`MAX_GROUP`] requests), applies each inside
//!   its own savepoint (a failing `multi` rolls back alone), and makes the whole group durable
//!   with one commit — one fsync for many transitions.
//! - **Readers are a small pool of connections** used inline; WAL lets them run beside the
//!   writer, and they see every commit whose reply has been delivered.
//! - **Sessions like ZooKeeper's.** A handle registers a session with a timeout and
//!   heartbeats it. Any process sharing the file reaps sessions that lapsed or whose process
//!   is gone (same host, pid no longer alive), deleting their ephemeral nodes. A handle whose
//!   own session lapsed fails that commit with `SessionExpired`, then continues under a fresh
//!   session: leases taken under the old one are lost for good.
//! - **Watches** fire from the writer after commit; commits by other processes are noticed
//!   by a poller (a per-session commit counter) and wake every local watch, which is allowed:
//!   watchers always re-read.

use lading_core::time::{SharedClock, format_ts, system_clock};
use lading_core::tree::{join_path, split_path, validate_path};
use lading_core::{
    BoxFuture, CreateMode, Node, Op, OpResult, Stat, Tree, TreeError, Watch, WatchKind,
};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::oneshot;

/// Most requests one commit carries.
pub const MAX_GROUP: usize = 1024;
/// Largest node data accepted, as in ZooKeeper's default `jute.maxbuffer`.
pub const MAX_DATA_BYTES: usize = 1024 * 1024;
const FORMAT: &str = "lading-tree-1";
const READ_POOL_MAX: usize = 8;

/// How a store is opened.
#[derive(Clone)]
pub struct SqliteOptions {
    /// A session that has not heartbeated for this long is expired by any process.
    pub session_timeout_ms: u64,
    /// `synchronous=FULL` (durable against power loss). `false` gives `NORMAL`.
    pub durable: bool,
    /// Who this session is, for lock data and `lading dump`.
    pub owner: String,
    pub clock: SharedClock,
    /// How often other processes' commits are looked for.
    pub poll_interval_ms: u64,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            session_timeout_ms: 10_000,
            durable: true,
            owner: default_owner(),
            clock: system_clock(),
            poll_interval_ms: 20,
        }
    }
}

/// `host:pid`, the default identity of a session.
pub fn default_owner() -> String {
    format!("{}:{}", hostname(), std::process::id())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Start time of a process (field 22 of `/proc/PID/stat`), to tell a live pid from a reused one.
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields after it follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

type Reply = oneshot::Sender<Result<Vec<OpResult>, TreeError>>;

enum Req {
    Multi(Vec<Op>, Reply),
    Heartbeat,
    Reap,
    /// Test hook: make this handle's session lapse now.
    Expire(oneshot::Sender<()>),
    Close(oneshot::Sender<Result<(), TreeError>>),
}

#[derive(Default)]
struct Watches {
    map: HashMap<(String, WatchKind), Vec<oneshot::Sender<()>>>,
}

impl Watches {
    fn fire(&mut self, path: &str, kind: WatchKind) {
        if let Some(list) = self.map.remove(&(path.to_string(), kind)) {
            for tx in list {
                let _ = tx.send(());
            }
        }
    }
    fn fire_all(&mut self) {
        for (_, list) in self.map.drain() {
            for tx in list {
                let _ = tx.send(());
            }
        }
    }
}

/// Counters of the writer, for benchmarks and diagnostics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WriterStats {
    /// Durable commits made.
    pub commits: u64,
    /// `multi` requests applied (committed or refused).
    pub multis: u64,
}

struct Shared {
    path: PathBuf,
    commits: AtomicU64,
    multis: AtomicU64,
    session: AtomicU64,
    watches: Mutex<Watches>,
    readers: Mutex<Vec<Connection>>,
    opts: SqliteOptions,
    stopping: AtomicBool,
}

/// One session on an SQLite store file.
pub struct SqliteTree {
    shared: Arc<Shared>,
    tx: Mutex<Option<mpsc::Sender<Req>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

fn backend(e: rusqlite::Error) -> TreeError {
    TreeError::Backend(e.to_string())
}

fn open_conn(path: &Path, durable: bool) -> Result<Connection, TreeError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| TreeError::NotOurs(path.display().to_string(), e.to_string()))?;
    conn.busy_timeout(Duration::from_secs(30))
        .map_err(backend)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(|e| TreeError::NotOurs(path.display().to_string(), e.to_string()))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(TreeError::Backend(format!(
            "could not switch {} to WAL (got {mode})",
            path.display()
        )));
    }
    conn.execute_batch(if durable {
        "PRAGMA synchronous=FULL;"
    } else {
        "PRAGMA synchronous=NORMAL;"
    })
    .map_err(backend)?;
    conn.execute_batch(
        "PRAGMA cache_size=-32768; PRAGMA temp_store=MEMORY; PRAGMA wal_autocheckpoint=10000;",
    )
    .map_err(backend)?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// Refuses a file that holds anything but a Lading store (or nothing).
fn check_ours(conn: &Connection, path: &Path) -> Result<(), TreeError> {
    let not_ours = |why: String| TreeError::NotOurs(path.display().to_string(), why);
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type='table'")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(|e| not_ours(e.to_string()))?;
    if !tables.is_empty() && !tables.iter().any(|t| t == "lading_meta") {
        return Err(not_ours(format!(
            "it holds other tables ({})",
            tables.join(", ")
        )));
    }
    Ok(())
}

/// Creates the schema, or checks an existing file is ours.
fn init_schema(conn: &Connection, path: &Path, now: u64) -> Result<(), TreeError> {
    let not_ours = |why: String| TreeError::NotOurs(path.display().to_string(), why);
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type='table'")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(|e| not_ours(e.to_string()))?;
    if !tables.is_empty() {
        if !tables.iter().any(|t| t == "lading_meta") {
            return Err(not_ours(format!(
                "it holds other tables ({})",
                tables.join(", ")
            )));
        }
        let format: Option<String> = conn
            .query_row(
                "SELECT value FROM lading_meta WHERE key='format'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(backend)?;
        return match format.as_deref() {
            Some(FORMAT) => Ok(()),
            other => Err(not_ours(format!(
                "unknown format {other:?}, this build reads {FORMAT}"
            ))),
        };
    }
    conn.execute_batch(
        "BEGIN IMMEDIATE;
         CREATE TABLE IF NOT EXISTS lading_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
         CREATE TABLE IF NOT EXISTS nodes(
            parent TEXT NOT NULL, name TEXT NOT NULL, data BLOB,
            version INTEGER NOT NULL, owner INTEGER NOT NULL,
            ctime INTEGER NOT NULL, mtime INTEGER NOT NULL, seq INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY(parent, name)) WITHOUT ROWID;
         CREATE INDEX IF NOT EXISTS nodes_owner ON nodes(owner) WHERE owner <> 0;
         CREATE TABLE IF NOT EXISTS sessions(
            id INTEGER PRIMARY KEY, owner TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,
            start_time INTEGER, timeout_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL,
            commits INTEGER NOT NULL DEFAULT 0);",
    )
    .map_err(backend)?;
    conn.execute(
        "INSERT OR IGNORE INTO lading_meta(key, value) VALUES ('format', ?1)",
        [FORMAT],
    )
    .map_err(backend)?;
    conn.execute(
        "INSERT OR IGNORE INTO nodes(parent, name, data, version, owner, ctime, mtime) VALUES ('', '', NULL, 0, 0, ?1, ?1)",
        [now as i64],
    )
    .map_err(backend)?;
    conn.execute_batch("COMMIT;").map_err(backend)?;
    Ok(())
}

/// `(parent, name)` keys of a path; the root is `("", "")`.
fn key(path: &str) -> (&str, &str) {
    if path == "/" {
        ("", "")
    } else {
        split_path(path)
    }
}

fn new_session(conn: &Connection, opts: &SqliteOptions) -> Result<u64, TreeError> {
    let now = opts.clock.now_ms();
    let pid = std::process::id();
    conn.query_row(
        "INSERT INTO sessions(owner, host, pid, start_time, timeout_ms, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING id",
        params![
            opts.owner,
            hostname(),
            pid,
            process_start_time(pid).map(|t| t as i64),
            opts.session_timeout_ms as i64,
            (now + opts.session_timeout_ms) as i64
        ],
        |r| r.get::<_, i64>(0),
    )
    .map(|id| id as u64)
    .map_err(backend)
}

/// Deletes sessions that lapsed or whose process is gone, with their ephemeral nodes.
/// Returns the paths removed (for watches).
fn reap(conn: &Connection, now: u64, keep: u64) -> rusqlite::Result<Vec<String>> {
    let host = hostname();
    let sessions: Vec<(i64, String, u32, Option<i64>, i64)> = conn
        .prepare_cached("SELECT id, host, pid, start_time, expires_ms FROM sessions")?
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut removed = Vec::new();
    for (id, h, pid, start, expires) in sessions {
        if id as u64 == keep {
            continue;
        }
        let lapsed = (expires as u64) < now;
        let dead = h == host
            && pid != std::process::id()
            && process_start_time(pid).map(|t| t as i64) != start;
        if lapsed || dead {
            removed.extend(drop_session(conn, id as u64)?);
        }
    }
    Ok(removed)
}

fn drop_session(conn: &Connection, id: u64) -> rusqlite::Result<Vec<String>> {
    let paths: Vec<String> = conn
        .prepare_cached("DELETE FROM nodes WHERE owner = ?1 RETURNING parent, name")?
        .query_map([id as i64], |r| {
            Ok(join_path(&r.get::<_, String>(0)?, &r.get::<_, String>(1)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    conn.execute("DELETE FROM sessions WHERE id = ?1", [id as i64])?;
    tracing::debug!(session = id, ephemerals = paths.len(), "session removed");
    Ok(paths)
}

/// A change made by a committed op, for watches.
enum Change {
    Data(String),
    Child(String),
}

struct Writer {
    conn: Connection,
    shared: Arc<Shared>,
}

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Req>) {
        while let Ok(first) = rx.recv() {
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(r) => group.push(r),
                    Err(_) => break,
                }
            }
            if !self.apply_group(group) {
                break;
            }
        }
    }

    /// Applies one group in one transaction. Returns false when the handle closed.
    fn apply_group(&mut self, group: Vec<Req>) -> bool {
        let now = self.shared.opts.clock.now_ms();
        let mut replies: Vec<(Reply, Result<Vec<OpResult>, TreeError>)> = Vec::new();
        let mut changes: Vec<Change> = Vec::new();
        let mut after: Vec<oneshot::Sender<()>> = Vec::new();
        let mut close: Option<oneshot::Sender<Result<(), TreeError>>> = None;
        let mut fire_all = false;

        let result = (|| -> rusqlite::Result<()> {
            self.conn.execute_batch("BEGIN IMMEDIATE")?;
            let session = self.shared.session.load(Ordering::SeqCst);
            // Counts this commit for other processes' pollers, and proves the session is live.
            let live = self
                .conn
                .prepare_cached(
                    "UPDATE sessions SET commits = commits + 1 WHERE id = ?1 AND expires_ms >= ?2",
                )?
                .execute(params![session as i64, now as i64])?
                == 1;
            let mut session_ok = live;
            if !live {
                // Our session lapsed (or another process reaped it): its ephemerals go, and
                // everything in this group fails; later requests run under a new session.
                for p in drop_session(&self.conn, session)? {
                    changes.push(Change::Data(p.clone()));
                    changes.push(Change::Child(split_path(&p).0.to_string()));
                }
                let fresh = new_session(&self.conn, &self.shared.opts)
                    .map_err(|_| rusqlite::Error::InvalidQuery)?;
                self.shared.session.store(fresh, Ordering::SeqCst);
                tracing::warn!(
                    old = session,
                    new = fresh,
                    "session expired; opened a new one"
                );
            }
            let session = self.shared.session.load(Ordering::SeqCst);
            for req in group {
                match req {
                    Req::Multi(ops, reply) => {
                        if !session_ok {
                            replies.push((reply, Err(TreeError::SessionExpired)));
                            continue;
                        }
                        self.conn.prepare_cached("SAVEPOINT op")?.execute([])?;
                        let mut local = Vec::new();
                        match self.apply_ops(&ops, session, now, &mut local) {
                            Ok(results) => {
                                self.conn.prepare_cached("RELEASE op")?.execute([])?;
                                changes.extend(local);
                                replies.push((reply, Ok(results)));
                            }
                            Err(OpFailure::Tree(e)) => {
                                self.conn.prepare_cached("ROLLBACK TO op")?.execute([])?;
                                self.conn.prepare_cached("RELEASE op")?.execute([])?;
                                replies.push((reply, Err(e)));
                            }
                            Err(OpFailure::Sql(e)) => return Err(e),
                        }
                    }
                    Req::Heartbeat => {
                        self.conn.execute(
                            "UPDATE sessions SET expires_ms = ?2 WHERE id = ?1",
                            params![
                                session as i64,
                                (now + self.shared.opts.session_timeout_ms) as i64
                            ],
                        )?;
                    }
                    Req::Reap => {
                        let removed = reap(&self.conn, now, session)?;
                        fire_all |= !removed.is_empty();
                        for p in removed {
                            changes.push(Change::Data(p.clone()));
                            changes.push(Change::Child(split_path(&p).0.to_string()));
                        }
                    }
                    Req::Expire(done) => {
                        self.conn.execute(
                            "UPDATE sessions SET expires_ms = 0 WHERE id = ?1",
                            [session as i64],
                        )?;
                        session_ok = false;
                        after.push(done);
                    }
                    Req::Close(done) => {
                        for p in drop_session(&self.conn, session)? {
                            changes.push(Change::Data(p.clone()));
                            changes.push(Change::Child(split_path(&p).0.to_string()));
                        }
                        close = Some(done);
                    }
                }
            }
            self.conn.execute_batch("COMMIT")?;
            self.shared.commits.fetch_add(1, Ordering::Relaxed);
            self.shared
                .multis
                .fetch_add(replies.len() as u64, Ordering::Relaxed);
            Ok(())
        })();

        match result {
            Ok(()) => {
                let mut w = self
                    .shared
                    .watches
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if fire_all {
                    w.fire_all();
                }
                for c in &changes {
                    match c {
                        Change::Data(p) => w.fire(p, WatchKind::Data),
                        Change::Child(p) => w.fire(p, WatchKind::Children),
                    }
                }
                drop(w);
                for (reply, r) in replies {
                    let _ = reply.send(r);
                }
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                tracing::error!(error = %e, "group commit failed");
                for (reply, _) in replies {
                    let _ = reply.send(Err(TreeError::Backend(format!("commit failed: {e}"))));
                }
            }
        }
        for done in after {
            let _ = done.send(());
        }
        if let Some(done) = close {
            let _ = done.send(Ok(()));
            return false;
        }
        true
    }

    fn apply_ops(
        &self,
        ops: &[Op],
        session: u64,
        now: u64,
        changes: &mut Vec<Change>,
    ) -> Result<Vec<OpResult>, OpFailure> {
        let mut out = Vec::with_capacity(ops.len());
        for (index, op) in ops.iter().enumerate() {
            let wrap = |e: TreeError| {
                OpFailure::Tree(TreeError::Multi {
                    index,
                    op_path: op.path().to_string(),
                    cause: Box::new(e),
                })
            };
            validate_path(op.path()).map_err(wrap)?;
            let r = self.apply_op(op, session, now, changes);
            match r {
                Ok(res) => out.push(res),
                Err(OpFailure::Tree(e)) => return Err(wrap(e)),
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn version_of(&self, path: &str) -> rusqlite::Result<Option<(i32, u64)>> {
        let (p, n) = key(path);
        self.conn
            .prepare_cached("SELECT version, owner FROM nodes WHERE parent = ?1 AND name = ?2")?
            .query_row([p, n], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))
            .optional()
    }

    fn expect(&self, path: &str, version: Option<i32>) -> Result<i32, OpFailure> {
        let (actual, _) = self
            .version_of(path)?
            .ok_or_else(|| TreeError::NoNode(path.into()))?;
        match version {
            Some(v) if v != actual => Err(TreeError::BadVersion {
                path: path.into(),
                expected: v,
                actual,
            }
            .into()),
            _ => Ok(actual),
        }
    }

    fn apply_op(
        &self,
        op: &Op,
        session: u64,
        now: u64,
        changes: &mut Vec<Change>,
    ) -> Result<OpResult, OpFailure> {
        match op {
            Op::Check { path, version } => {
                self.expect(path, *version)?;
                Ok(OpResult::Check)
            }
            Op::Create { path, data, mode } => {
                if path == "/" {
                    return Err(TreeError::NodeExists("/".into()).into());
                }
                check_size(path, data)?;
                let (parent, name) = split_path(path);
                let (pp, pn) = key(parent);
                let owner = if *mode == CreateMode::Ephemeral {
                    session
                } else {
                    0
                };
                // One guarded statement per op on the hot path; the failure path asks why.
                let (full, inserted) = if *mode == CreateMode::PersistentSequential {
                    let seq: Option<i64> = self
                        .conn
                        .prepare_cached(
                            "UPDATE nodes SET seq = seq + 1 WHERE parent = ?1 AND name = ?2 AND owner = 0 RETURNING seq - 1",
                        )?
                        .query_row([pp, pn], |r| r.get(0))
                        .optional()?;
                    let Some(seq) = seq else {
                        return Err(self.why_no_parent(parent)?.into());
                    };
                    let name = format!("{name}{seq:010}");
                    let n = self
                        .conn
                        .prepare_cached(
                            "INSERT OR IGNORE INTO nodes(parent, name, data, version, owner, ctime, mtime) VALUES (?1, ?2, ?3, 0, ?4, ?5, ?5)",
                        )?
                        .execute(params![parent, name, data, owner as i64, now as i64])?;
                    (join_path(parent, &name), n)
                } else {
                    let n = self
                        .conn
                        .prepare_cached(
                            "INSERT OR IGNORE INTO nodes(parent, name, data, version, owner, ctime, mtime) \
                             SELECT ?1, ?2, ?3, 0, ?4, ?5, ?5 WHERE EXISTS \
                             (SELECT 1 FROM nodes WHERE parent = ?6 AND name = ?7 AND owner = 0)",
                        )?
                        .execute(params![parent, name, data, owner as i64, now as i64, pp, pn])?;
                    if n == 0 {
                        if let Some(e) = self.why_no_parent_opt(parent)? {
                            return Err(e.into());
                        }
                    }
                    (path.clone(), n)
                };
                if inserted == 0 {
                    return Err(TreeError::NodeExists(full).into());
                }
                changes.push(Change::Data(full.clone()));
                changes.push(Change::Child(parent.to_string()));
                Ok(OpResult::Create(full))
            }
            Op::Set {
                path,
                data,
                version,
            } => {
                check_size(path, data)?;
                let (p, n) = key(path);
                let row: Option<(i32, i64, i64)> = self
                    .conn
                    .prepare_cached(
                        "UPDATE nodes SET data = ?3, version = version + 1, mtime = ?4 \
                         WHERE parent = ?1 AND name = ?2 AND (?5 IS NULL OR version = ?5) RETURNING version, ctime, owner",
                    )?
                    .query_row(params![p, n, data, now as i64, version], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()?;
                let Some((v, ctime, owner)) = row else {
                    self.expect(path, *version)?;
                    return Err(TreeError::Backend(format!("set of {path} changed nothing")).into());
                };
                changes.push(Change::Data(path.clone()));
                Ok(OpResult::Set(Stat {
                    version: v,
                    ephemeral_owner: owner as u64,
                    ctime_ms: ctime as u64,
                    mtime_ms: now,
                }))
            }
            Op::Delete { path, version } => {
                if path == "/" {
                    return Err(
                        TreeError::InvalidPath("/".into(), "the root cannot be deleted").into(),
                    );
                }
                let (p, n) = key(path);
                let deleted = self
                    .conn
                    .prepare_cached(
                        "DELETE FROM nodes WHERE parent = ?1 AND name = ?2 AND (?3 IS NULL OR version = ?3) \
                         AND NOT EXISTS (SELECT 1 FROM nodes WHERE parent = ?4)",
                    )?
                    .execute(params![p, n, version, path])?;
                if deleted == 0 {
                    self.expect(path, *version)?;
                    return Err(TreeError::NotEmpty(path.clone()).into());
                }
                changes.push(Change::Data(path.clone()));
                changes.push(Change::Child(p.to_string()));
                Ok(OpResult::Delete)
            }
        }
    }

    /// Why a child of `parent` cannot be created: it is missing, or ephemeral.
    fn why_no_parent_opt(&self, parent: &str) -> rusqlite::Result<Option<TreeError>> {
        Ok(match self.version_of(parent)? {
            None => Some(TreeError::NoNode(parent.into())),
            Some((_, owner)) if owner != 0 => {
                Some(TreeError::NoChildrenForEphemerals(parent.into()))
            }
            Some(_) => None,
        })
    }

    fn why_no_parent(&self, parent: &str) -> rusqlite::Result<TreeError> {
        Ok(self
            .why_no_parent_opt(parent)?
            .unwrap_or_else(|| TreeError::Backend(format!("cannot create under {parent}"))))
    }
}

fn check_size(path: &str, data: &Option<Vec<u8>>) -> Result<(), OpFailure> {
    match data {
        Some(d) if d.len() > MAX_DATA_BYTES => Err(TreeError::Backend(format!(
            "data for {path} is {} bytes, over the {MAX_DATA_BYTES}-byte node limit",
            d.len()
        ))
        .into()),
        _ => Ok(()),
    }
}

enum OpFailure {
    Tree(TreeError),
    Sql(rusqlite::Error),
}

impl From<TreeError> for OpFailure {
    fn from(e: TreeError) -> Self {
        OpFailure::Tree(e)
    }
}
impl From<rusqlite::Error> for OpFailure {
    fn from(e: rusqlite::Error) -> Self {
        OpFailure::Sql(e)
    }
}

impl SqliteTree {
    /// Opens (creating if needed) the store at `path` and starts a session.
    pub fn open(path: impl AsRef<Path>, opts: SqliteOptions) -> Result<SqliteTree, TreeError> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| TreeError::Backend(format!("cannot create {}: {e}", dir.display())))?;
        }
        // Look before touching: a file that is not ours must not even be switched to WAL.
        {
            let probe = Connection::open_with_flags(
                &path,
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
            )
            .map_err(|e| TreeError::NotOurs(path.display().to_string(), e.to_string()))?;
            check_ours(&probe, &path)?;
        }
        let conn = open_conn(&path, opts.durable)?;
        init_schema(&conn, &path, opts.clock.now_ms())?;
        // Reap what crashed processes left before we start, so their locks do not linger.
        conn.execute_batch("BEGIN IMMEDIATE").map_err(backend)?;
        let reaped = reap(&conn, opts.clock.now_ms(), 0).map_err(backend)?;
        let session = new_session(&conn, &opts)?;
        conn.execute_batch("COMMIT").map_err(backend)?;
        if !reaped.is_empty() {
            tracing::info!(
                count = reaped.len(),
                "removed ephemeral nodes of dead sessions"
            );
        }
        let shared = Arc::new(Shared {
            path: path.clone(),
            session: AtomicU64::new(session),
            commits: AtomicU64::new(0),
            multis: AtomicU64::new(0),
            watches: Mutex::new(Watches::default()),
            readers: Mutex::new(Vec::new()),
            opts: opts.clone(),
            stopping: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel();
        let writer = Writer {
            conn,
            shared: shared.clone(),
        };
        let mut threads = vec![
            std::thread::Builder::new()
                .name("lading-sqlite-writer".into())
                .spawn(move || writer.run(rx))
                .map_err(|e| TreeError::Backend(e.to_string()))?,
        ];
        let poll_conn = open_conn(&path, opts.durable)?;
        let (s2, tx2) = (shared.clone(), tx.clone());
        threads.push(
            std::thread::Builder::new()
                .name("lading-sqlite-maint".into())
                .spawn(move || maintenance(s2, tx2, poll_conn))
                .map_err(|e| TreeError::Backend(e.to_string()))?,
        );
        Ok(SqliteTree {
            shared,
            tx: Mutex::new(Some(tx)),
            threads: Mutex::new(threads),
        })
    }

    /// What the writer has done so far.
    pub fn stats(&self) -> WriterStats {
        WriterStats {
            commits: self.shared.commits.load(Ordering::Relaxed),
            multis: self.shared.multis.load(Ordering::Relaxed),
        }
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Test hook: makes this session lapse now, as if the process had stalled past its
    /// timeout. The next commit fails with `SessionExpired` and opens a new session.
    pub async fn expire_session(&self) {
        let (tx, rx) = oneshot::channel();
        if self.send(Req::Expire(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// Runs the reaper now (it also runs on its own every session timeout).
    pub async fn reap_now(&self) -> Result<(), TreeError> {
        self.send(Req::Reap)?;
        // A no-op multi after it: its reply means the reap committed.
        self.multi(vec![]).await.map(|_| ())
    }

    fn send(&self, req: Req) -> Result<(), TreeError> {
        let guard = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_ref() {
            Some(tx) => tx
                .send(req)
                .map_err(|_| TreeError::Backend("store handle is closed".into())),
            None => Err(TreeError::Backend("store handle is closed".into())),
        }
    }

    fn read<R>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<R>) -> Result<R, TreeError> {
        let conn = {
            let mut pool = self
                .shared
                .readers
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            pool.pop()
        };
        let conn = match conn {
            Some(c) => c,
            None => open_conn(&self.shared.path, self.shared.opts.durable)?,
        };
        let r = f(&conn).map_err(backend);
        let mut pool = self
            .shared
            .readers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if pool.len() < READ_POOL_MAX {
            pool.push(conn);
        }
        r
    }

    fn stop(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tx) = tx {
            let (done, _rx) = oneshot::channel();
            let _ = tx.send(Req::Close(done));
        }
        let threads: Vec<_> = self
            .threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for t in threads {
            let _ = t.join();
        }
        self.shared
            .watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .fire_all();
    }
}

/// Heartbeats the session, reaps others', and notices other processes' commits.
fn maintenance(shared: Arc<Shared>, tx: mpsc::Sender<Req>, conn: Connection) {
    let opts = &shared.opts;
    let tick = Duration::from_millis(opts.poll_interval_ms.max(1));
    let heartbeat_every = (opts.session_timeout_ms / 3).max(1);
    let mut last_heartbeat = std::time::Instant::now();
    let mut last_reap = std::time::Instant::now();
    let mut last_seen: Option<(f64, i64)> = None;
    while !shared.stopping.load(Ordering::SeqCst) {
        std::thread::sleep(tick);
        if last_heartbeat.elapsed().as_millis() as u64 >= heartbeat_every {
            last_heartbeat = std::time::Instant::now();
            if tx.send(Req::Heartbeat).is_err() {
                return;
            }
        }
        if last_reap.elapsed().as_millis() as u64 >= opts.session_timeout_ms {
            last_reap = std::time::Instant::now();
            if tx.send(Req::Reap).is_err() {
                return;
            }
        }
        let me = shared.session.load(Ordering::SeqCst) as i64;
        let seen = conn.query_row(
            "SELECT total(commits), count(*) FROM sessions WHERE id <> ?1",
            [me],
            |r| Ok((r.get::<_, f64>(0)?, r.get::<_, i64>(1)?)),
        );
        if let Ok(seen) = seen {
            if last_seen.is_some_and(|l| l != seen) {
                shared
                    .watches
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .fire_all();
            }
            last_seen = Some(seen);
        }
    }
}

impl Drop for SqliteTree {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Tree for SqliteTree {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    fn session_id(&self) -> u64 {
        self.shared.session.load(Ordering::SeqCst)
    }

    fn get<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<Node>, TreeError>> {
        Box::pin(async move {
            validate_path(path)?;
            let (p, n) = key(path);
            self.read(|c| {
                c.prepare_cached("SELECT data, version, owner, ctime, mtime FROM nodes WHERE parent = ?1 AND name = ?2")?
                    .query_row([p, n], |r| {
                        Ok(Node {
                            data: r.get(0)?,
                            stat: Stat {
                                version: r.get(1)?,
                                ephemeral_owner: r.get::<_, i64>(2)? as u64,
                                ctime_ms: r.get::<_, i64>(3)? as u64,
                                mtime_ms: r.get::<_, i64>(4)? as u64,
                            },
                        })
                    })
                    .optional()
            })
        })
    }

    fn children<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<String>, TreeError>> {
        Box::pin(async move {
            validate_path(path)?;
            let (p, n) = key(path);
            self.read(|c| {
                if !c
                    .prepare_cached("SELECT 1 FROM nodes WHERE parent = ?1 AND name = ?2")?
                    .exists([p, n])?
                {
                    return Ok(None);
                }
                c.prepare_cached(
                    "SELECT name FROM nodes WHERE parent = CAST(?1 AS TEXT) ORDER BY name",
                )?
                .query_map([path], |r| r.get(0))?
                .collect::<rusqlite::Result<Vec<String>>>()
                .map(Some)
            })?
            .ok_or_else(|| TreeError::NoNode(path.into()))
        })
    }

    fn children_page<'a>(
        &'a self,
        path: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, TreeError>> {
        Box::pin(async move {
            validate_path(path)?;
            let (p, n) = key(path);
            self.read(|c| {
                if !c.prepare_cached("SELECT 1 FROM nodes WHERE parent = ?1 AND name = ?2")?.exists([p, n])? {
                    return Ok(None);
                }
                // `CAST(?1 AS TEXT)`, not `?1`: with `ORDER BY name`, a bare parameter makes SQLite
                // re-prepare the cached statement on every use (measured: ~20% of the CPU of a
                // bench run). The limit is part of the SQL for the same reason.
                let limit = limit.min(i64::MAX as usize);
                match after {
                    None => c
                        .prepare_cached(&format!("SELECT name FROM nodes WHERE parent = CAST(?1 AS TEXT) ORDER BY name LIMIT {limit}"))?
                        .query_map(params![path], |r| r.get(0))?
                        .collect::<rusqlite::Result<Vec<String>>>(),
                    Some(after) => c
                        .prepare_cached(&format!("SELECT name FROM nodes WHERE parent = CAST(?1 AS TEXT) AND name > ?2 ORDER BY name LIMIT {limit}"))?
                        .query_map(params![path, after], |r| r.get(0))?
                        .collect::<rusqlite::Result<Vec<String>>>(),
                }
                .map(Some)
            })?
            .ok_or_else(|| TreeError::NoNode(path.into()))
        })
    }

    fn count_children<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<u64, TreeError>> {
        Box::pin(async move {
            validate_path(path)?;
            let (p, n) = key(path);
            self.read(|c| {
                if !c
                    .prepare_cached("SELECT 1 FROM nodes WHERE parent = ?1 AND name = ?2")?
                    .exists([p, n])?
                {
                    return Ok(None);
                }
                c.prepare_cached("SELECT count(*) FROM nodes WHERE parent = ?1")?
                    .query_row([path], |r| r.get::<_, i64>(0))
                    .map(|n| Some(n as u64))
            })?
            .ok_or_else(|| TreeError::NoNode(path.into()))
        })
    }

    fn multi(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<Vec<OpResult>, TreeError>> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            self.send(Req::Multi(ops, tx))?;
            rx.await
                .map_err(|_| TreeError::Backend("store writer stopped".into()))?
        })
    }

    fn watch<'a>(
        &'a self,
        path: &'a str,
        kind: WatchKind,
    ) -> BoxFuture<'a, Result<Watch, TreeError>> {
        Box::pin(async move {
            validate_path(path)?;
            let (tx, rx) = oneshot::channel();
            self.shared
                .watches
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .map
                .entry((path.to_string(), kind))
                .or_default()
                .push(tx);
            Ok(Watch::new(async move {
                let _ = rx.await;
            }))
        })
    }

    fn close(&self) -> BoxFuture<'_, Result<(), TreeError>> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            self.send(Req::Close(tx))?;
            let r = rx.await.unwrap_or(Ok(()));
            self.stop();
            r
        })
    }
}

/// A human-readable summary of the sessions in a store, for `lading dump --sessions`.
pub fn describe_sessions(path: &Path) -> Result<Vec<String>, TreeError> {
    let conn = open_conn(path, true)?;
    let rows = conn
        .prepare("SELECT id, owner, expires_ms FROM sessions ORDER BY id")
        .and_then(|mut s| {
            s.query_map([], |r| {
                Ok(format!(
                    "{} {} expires {}",
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    format_ts(r.get::<_, i64>(2)? as u64)
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(backend)?;
    Ok(rows)
}
