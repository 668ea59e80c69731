//! The embedded backend: the coordination tree in one SQLite file.
//!
//! Shape, and why:
//! - **The tree lives in memory; SQLite makes it durable.** Each handle loads the tree at
//!   open ([`mem::Mem`]). Reads are memory lookups. The writer validates a `multi` against
//!   memory (versions, parents, emptiness) — no reads, no savepoints on the commit path.
//! - **A commit is one log entry.** What a group changed is appended to the `changes` table as
//!   one row of node images ([`log`]); that row is the durable record. The `nodes` table is
//!   brought up to date in bulk: after 64 commits when no request is waiting (so no request
//!   waits long behind it), after [`MATERIALIZE_AFTER`] at the latest, on a quiet second, and at
//!   close: each node changed meanwhile is written once with its last image, and a node made
//!   and dropped in between (a lease, a state reference) never reaches it. Opening loads the
//!   rows, then replays the log after them (`lading_meta.applied`).
//! - **One writer thread per session handle, group commit.** Every `multi` is sent to the
//!   writer, which takes everything queued (up to [`MAX_GROUP`] requests), applies each to an
//!   overlay (a failing `multi` is undone alone), and makes the whole group durable with one
//!   commit — one fsync for many transitions. Only then is the overlay folded into memory and
//!   the callers answered, so nobody reads a change that could still be lost. A group that
//!   changed only ephemeral nodes (leases) is answered without an fsync: it can only be lost
//!   with the machine, together with every session that could have held them.
//! - **Checkpoints stay off the commit path.** No connection checkpoints on commit. A
//!   checkpointer thread with its own connection copies the WAL into the file every
//!   [`CHECKPOINT_EVERY`] commits (a passive checkpoint: it takes no lock a writer needs).
//!   Once the WAL holds [`WAL_RESTART_FRAMES`] frames, the writer itself copies the little the
//!   checkpointer has not, between two groups, so that its next commit starts the WAL over
//!   from the beginning. Before, the writer checkpointed all 8,000 frames itself and no
//!   commit was made for the 40–50 ms that took.
//! - **Several processes share one file** through the change log. Before it validates
//!   anything, a writer (holding SQLite's write lock) folds in what others committed. A reader
//!   asks SQLite (`PRAGMA data_version`) only when the commit counter in `<db>-commits` moved
//!   (one `pread`; see `counter.rs`), and the handle's poll asks every `poll_interval_ms`
//!   whatever the counter says. A handle that fell behind the pruned log reloads the whole
//!   tree.
//! - **Sessions like ZooKeeper's.** A handle registers a session with a timeout and
//!   heartbeats it. Any process sharing the file reaps sessions that lapsed or whose process
//!   is gone (same host, pid no longer alive), deleting their ephemeral nodes. A handle whose
//!   own session lapsed fails that commit with `SessionExpired`, then continues under a fresh
//!   session: leases taken under the old one are lost for good.
//! - **Watches** fire after commit, for this handle's changes and for changes folded in from
//!   other processes alike.
//!
//! Memory: the whole tree is held by every open handle (about 200 bytes per node plus data).

mod counter;
mod log;
mod mem;

pub use mem::MAX_DATA_BYTES;

use foldhash::{HashMap, HashSet, HashSetExt};
use lading_core::time::{SharedClock, format_ts, system_clock};
use lading_core::tree::{split_path, validate_path};
use lading_core::{BoxFuture, Node, Op, OpResult, Tree, TreeError, Watch, WatchKind};
use mem::{Below, Mem, MemNode, Overlay};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::oneshot;

/// Most requests one commit carries.
pub const MAX_GROUP: usize = 1024;
const FORMAT: &str = "lading-tree-2";
/// The earlier format: every commit wrote its rows, the log held paths only. Upgraded on open.
const FORMAT_1: &str = "lading-tree-1";
/// Change-log rows kept past materialization; a handle further behind reloads the tree.
const CHANGES_KEPT: i64 = 10_000;
/// Commits after which the writer brings the `nodes` table up to date.
pub const MATERIALIZE_AFTER: i64 = 512;
/// Commits after which the writer brings the table up to date when no request is waiting.
pub const MATERIALIZE_IDLE_AFTER: i64 = 64;

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
    /// How often other processes' commits are looked for when nobody reads.
    pub poll_interval_ms: u64,
    /// How often the `nodes` table is brought up to date when fewer than
    /// [`MATERIALIZE_AFTER`] commits came.
    pub materialize_every_ms: u64,
    /// Commits after which the table is brought up to date at the latest
    /// ([`MATERIALIZE_AFTER`]), and after which it is when no request is waiting
    /// ([`MATERIALIZE_IDLE_AFTER`]).
    pub materialize_after: i64,
    pub materialize_idle_after: i64,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            session_timeout_ms: 10_000,
            durable: true,
            owner: default_owner(),
            clock: system_clock(),
            poll_interval_ms: 20,
            materialize_every_ms: 1000,
            materialize_after: MATERIALIZE_AFTER,
            materialize_idle_after: MATERIALIZE_IDLE_AFTER,
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
    /// Bring the `nodes` table up to date with the change log.
    Materialize,
    /// Test hook: make this handle's session lapse now.
    Expire(oneshot::Sender<()>),
    Close(oneshot::Sender<Result<(), TreeError>>),
}

#[derive(Default)]
struct Watches {
    map: HashMap<(String, WatchKind), Vec<oneshot::Sender<()>>>,
}

impl Watches {
    /// Registers a watch. Watches dropped before firing are swept out of their list whenever
    /// it doubles, so a node that never changes (a pause flag every waiting worker watches)
    /// does not collect them without bound.
    fn add(&mut self, path: &str, kind: WatchKind, tx: oneshot::Sender<()>) {
        let list = self.map.entry((path.to_string(), kind)).or_default();
        if list.len() >= 8 && list.len().is_power_of_two() {
            list.retain(|t| !t.is_closed());
        }
        list.push(tx);
    }

    fn fire(&mut self, path: &str, kind: WatchKind) {
        if self.map.is_empty() {
            return;
        }
        if let Some(list) = self.map.remove(&(path.to_string(), kind)) {
            for tx in list {
                let _ = tx.send(());
            }
        }
    }

    /// Fires the watches a change of `path` concerns: its own, and its parent's children.
    fn fire_changed(&mut self, path: &str) {
        self.fire(path, WatchKind::Data);
        if path != "/" {
            self.fire(split_path(path).0, WatchKind::Children);
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
    /// `fdatasync`s of the WAL, and the time spent in them.
    pub fsyncs: u64,
    pub fsync_us: u64,
    /// Time the writer spent applying and committing groups (materializing included).
    pub writer_busy_us: u64,
    /// Times the `nodes` table was brought up to date, the rows written, and the time taken.
    pub materializations: u64,
    pub materialized_rows: u64,
    pub materialize_us: u64,
    /// Background checkpoints of the WAL, and the time they took.
    pub checkpoints: u64,
    pub checkpoint_us: u64,
    /// Checkpoints the writer made to finish one (the WAL then starts over), and the time
    /// they held up commits.
    pub wal_restarts: u64,
    pub wal_restart_us: u64,
}

/// The connection readers use to notice other processes' commits.
struct SyncConn {
    conn: Connection,
    data_version: i64,
}

/// Groups committed by this handle's writer but not yet durable and folded into memory.
#[derive(Default)]
struct Pending {
    groups: std::collections::VecDeque<(i64, Arc<Overlay>)>,
    /// Set when an fsync failed: memory and file may disagree, so nothing more is done.
    poisoned: Option<String>,
}

/// Most committed groups waiting for their fsync at once.
const MAX_PENDING: usize = 16;

/// The writer wakes the checkpointer after this many commits.
pub const CHECKPOINT_EVERY: u32 = 64;
/// Once the WAL holds this many frames (about 32 MB), the writer copies what the checkpointer
/// has not yet copied, so that its next commit starts the WAL over from its beginning.
pub const WAL_RESTART_FRAMES: i64 = 8000;
/// ...and after this many commits whatever the checkpointer said (it may be stuck behind
/// another process's checkpoint).
const WAL_RESTART_COMMITS: u32 = 16_384;

struct Shared {
    path: PathBuf,
    session: AtomicU64,
    mem: RwLock<Mem>,
    pending: Mutex<Pending>,
    pending_changed: std::sync::Condvar,
    sync: Mutex<SyncConn>,
    /// Whether another process has committed since memory last caught up.
    counter: counter::Counter,
    watches: Mutex<Watches>,
    commits: AtomicU64,
    multis: AtomicU64,
    fsyncs: AtomicU64,
    fsync_us: AtomicU64,
    writer_busy_us: AtomicU64,
    /// Frames in the WAL when the checkpointer last looked (0 once the writer has tried to
    /// finish the round, whether or not the WAL started over).
    wal_frames: std::sync::atomic::AtomicI64,
    checkpoints: AtomicU64,
    checkpoint_us: AtomicU64,
    wal_restarts: AtomicU64,
    wal_restart_us: AtomicU64,
    materializations: AtomicU64,
    materialized_rows: AtomicU64,
    materialize_us: AtomicU64,
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn lock_read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
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
        .map_err(|e| {
            if is_busy(&e) {
                busy(path, e)
            } else {
                TreeError::NotOurs(path.display().to_string(), e.to_string())
            }
        })?;
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
    .map_err(|e| busy_or_backend(path, e))?;
    conn.execute_batch(
        // No connection checkpoints on commit: the checkpointer thread copies the WAL into
        // the file in the background, and the writer only finishes its last stretch.
        "PRAGMA cache_size=-32768; PRAGMA temp_store=MEMORY; PRAGMA wal_autocheckpoint=0;",
    )
    .map_err(|e| busy_or_backend(path, e))?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// What a busy error's message says, so opening can tell it apart and try again.
const BUSY: &str = " is busy: ";

fn busy(path: &Path, e: rusqlite::Error) -> TreeError {
    TreeError::Backend(format!("{}{BUSY}{e}", path.display()))
}

fn busy_or_backend(path: &Path, e: rusqlite::Error) -> TreeError {
    if is_busy(&e) {
        busy(path, e)
    } else {
        backend(e)
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Refuses a file that holds anything but a Lading store (or nothing).
fn check_ours(conn: &Connection, path: &Path) -> Result<(), TreeError> {
    let not_ours = |why: String| TreeError::NotOurs(path.display().to_string(), why);
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type='table'")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(|e| {
            if is_busy(&e) {
                // Another process is creating or changing the store right now: that says
                // nothing about whose file it is.
                busy(path, e)
            } else {
                not_ours(e.to_string())
            }
        })?;
    if !tables.is_empty() && !tables.iter().any(|t| t == "lading_meta") {
        return Err(not_ours(format!(
            "it holds other tables ({})",
            tables.join(", ")
        )));
    }
    Ok(())
}

/// Creates the schema, or checks an existing file is of our format.
fn init_schema(conn: &Connection, path: &Path, now: u64) -> Result<(), TreeError> {
    let not_ours = |why: String| TreeError::NotOurs(path.display().to_string(), why);
    let has_meta: bool = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='lading_meta'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(|e| busy_or_backend(path, e))?
        > 0;
    if has_meta {
        let format: Option<String> = conn
            .query_row(
                "SELECT value FROM lading_meta WHERE key='format'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| busy_or_backend(path, e))?;
        return match format.as_deref() {
            Some(FORMAT) => Ok(()),
            // Every row of format 1 is current, so its log (paths only) is simply replaced.
            Some(FORMAT_1) => conn
                .execute_batch(
                    "BEGIN IMMEDIATE;
                     DROP TABLE IF EXISTS changes;
                     DROP INDEX IF EXISTS nodes_owner;
                     CREATE TABLE changes(seq INTEGER PRIMARY KEY, body BLOB NOT NULL);
                     INSERT OR REPLACE INTO lading_meta(key, value) VALUES ('applied', '0');
                     UPDATE lading_meta SET value = 'lading-tree-2' WHERE key = 'format';
                     COMMIT;",
                )
                .map_err(|e| {
                    let _ = conn.execute_batch("ROLLBACK");
                    busy_or_backend(path, e)
                }),
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
         CREATE TABLE IF NOT EXISTS changes(seq INTEGER PRIMARY KEY, body BLOB NOT NULL);
         CREATE TABLE IF NOT EXISTS sessions(
            id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,
            start_time INTEGER, timeout_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL);",
    )
    .map_err(|e| busy_or_backend(path, e))?;
    conn.execute(
        "INSERT OR IGNORE INTO lading_meta(key, value) VALUES ('format', ?1), ('applied', '0')",
        [FORMAT],
    )
    .map_err(|e| busy_or_backend(path, e))?;
    conn.execute(
        "INSERT OR IGNORE INTO nodes(parent, name, data, version, owner, ctime, mtime) VALUES ('', '', NULL, 0, 0, ?1, ?1)",
        [now as i64],
    )
    .map_err(|e| busy_or_backend(path, e))?;
    conn.execute_batch("COMMIT;")
        .map_err(|e| busy_or_backend(path, e))?;
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

fn path_of(parent: String, name: String) -> String {
    if parent.is_empty() {
        "/".into()
    } else {
        lading_core::tree::join_path(&parent, &name)
    }
}

fn row_node(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<MemNode> {
    Ok(MemNode {
        data: r.get(at)?,
        version: r.get(at + 1)?,
        owner: r.get::<_, i64>(at + 2)? as u64,
        ctime: r.get::<_, i64>(at + 3)? as u64,
        mtime: r.get::<_, i64>(at + 4)? as u64,
        seq: r.get(at + 5)?,
    })
}

fn last_change(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    // Two single-aggregate subqueries: each is one index probe. `coalesce(min(..))` in one
    // select would scan the whole log.
    conn.prepare_cached("SELECT coalesce((SELECT min(seq) FROM changes), 0), coalesce((SELECT max(seq) FROM changes), 0)")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
}

/// The last change-log entry the `nodes` table reflects.
fn applied(conn: &Connection) -> rusqlite::Result<i64> {
    let v: String = conn
        .prepare_cached("SELECT value FROM lading_meta WHERE key = 'applied'")?
        .query_row([], |r| r.get(0))?;
    v.parse().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn corrupt(why: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Blob, why.into())
}

/// Calls `f` with each change-log entry after `after`, in commit order.
fn each_change(
    conn: &Connection,
    after: i64,
    mut f: impl FnMut(i64, Vec<log::Entry>),
) -> rusqlite::Result<()> {
    let mut stmt =
        conn.prepare_cached("SELECT seq, body FROM changes WHERE seq > ?1 ORDER BY seq")?;
    let mut rows = stmt.query([after])?;
    while let Some(r) = rows.next()? {
        let seq: i64 = r.get(0)?;
        let body = r.get_ref(1)?.as_blob()?;
        f(
            seq,
            log::decode(body).map_err(|e| corrupt(format!("change {seq}: {e}")))?,
        );
    }
    Ok(())
}

fn fold_entries(mem: &mut Mem, entries: Vec<log::Entry>, mut paths: Option<&mut HashSet<String>>) {
    for e in entries {
        match e.node {
            Some(n) => mem.put(e.path.clone(), n),
            None => mem.remove(&e.path),
        }
        if let Some(ps) = paths.as_deref_mut() {
            ps.insert(e.path);
        }
    }
}

/// Loads the whole tree: the materialized rows, then the log after them. Call inside a
/// transaction so rows and log agree.
fn full_load(conn: &Connection, mem: &mut Mem) -> rusqlite::Result<()> {
    mem.clear();
    let mut stmt =
        conn.prepare("SELECT parent, name, data, version, owner, ctime, mtime, seq FROM nodes")?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        mem.put(path_of(r.get(0)?, r.get(1)?), row_node(r, 2)?);
    }
    let applied = applied(conn)?;
    let mut synced = applied.max(last_change(conn)?.1);
    each_change(conn, applied, |seq, entries| {
        fold_entries(mem, entries, None);
        synced = synced.max(seq);
    })?;
    mem.synced = synced;
    Ok(())
}

/// What a sync found.
enum Synced {
    Nothing,
    Paths(Vec<String>),
    Reloaded,
}

/// Folds other connections' commits into `mem`. Call inside a transaction.
fn sync_from(conn: &Connection, mem: &mut Mem) -> rusqlite::Result<Synced> {
    let (first, last) = last_change(conn)?;
    if last <= mem.synced {
        return Ok(Synced::Nothing);
    }
    if first > mem.synced + 1 {
        full_load(conn, mem)?;
        return Ok(Synced::Reloaded);
    }
    let mut paths: HashSet<String> = HashSet::new();
    each_change(conn, mem.synced, |_, entries| {
        fold_entries(mem, entries, Some(&mut paths))
    })?;
    mem.synced = last;
    Ok(Synced::Paths(paths.into_iter().collect()))
}

fn new_session(conn: &Connection, opts: &SqliteOptions) -> rusqlite::Result<u64> {
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
}

/// Sessions that lapsed, or whose process on this host is gone.
fn dead_sessions(conn: &Connection, now: u64, keep: u64) -> rusqlite::Result<Vec<u64>> {
    let host = hostname();
    let sessions: Vec<(i64, String, u32, Option<i64>, i64)> = conn
        .prepare_cached("SELECT id, host, pid, start_time, expires_ms FROM sessions")?
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(sessions
        .into_iter()
        .filter(|(id, h, pid, start, expires)| {
            let lapsed = (*expires as u64) < now;
            let gone = *h == host
                && *pid != std::process::id()
                && process_start_time(*pid).map(|t| t as i64) != *start;
            *id as u64 != keep && (lapsed || gone)
        })
        .map(|s| s.0 as u64)
        .collect())
}

struct Writer {
    conn: Connection,
    shared: Arc<Shared>,
    /// Where committed groups go to be made durable and answered.
    to_syncer: mpsc::Sender<Committed>,
    /// The last change-log entry this writer made or folded in.
    last_seq: i64,
    /// The last entry this writer knows the `nodes` table reflects (another process may have
    /// gone further).
    applied: i64,
    /// Bring the `nodes` table up to date after this group (asked for, or closing).
    materialize: bool,
    /// The images a materialization folds together (kept between rounds for its memory).
    folded: log::Coalesced,
    /// Wakes the checkpointer (a full channel means it is already awake).
    checkpointer: mpsc::SyncSender<()>,
    /// Commits since the checkpointer was last woken, and since the WAL last started over.
    since_checkpoint: u32,
    since_restart: u32,
}

enum Done {
    Open,
    Closed,
}

/// A group the writer committed, on its way to the syncer: made durable, folded into memory,
/// then answered, in commit order.
struct Committed {
    /// The change-log entry, or `None` when the group changed no node.
    seq: Option<i64>,
    /// Whether the group must be fsynced before it is answered: it changed a persistent node.
    /// A group that only made, changed or dropped ephemeral nodes needs none (see
    /// [`only_ephemeral`]).
    needs_sync: bool,
    overlay: Arc<Overlay>,
    synced: Synced,
    replies: Vec<(Reply, Result<Vec<OpResult>, TreeError>)>,
    after: Vec<oneshot::Sender<()>>,
    close: Option<oneshot::Sender<Result<(), TreeError>>>,
}

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Req>) {
        let mut carry: Option<Req> = None;
        loop {
            let first = match carry.take() {
                Some(r) => r,
                None => match rx.recv() {
                    Ok(r) => r,
                    Err(_) => break,
                },
            };
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(r) => group.push(r),
                    Err(_) => break,
                }
            }
            let t = std::time::Instant::now();
            let commits = self.shared.commits.load(Ordering::Relaxed);
            let done = self.apply_group(group);
            if self.shared.commits.load(Ordering::Relaxed) > commits {
                self.since_checkpoint += 1;
                self.since_restart += 1;
                if self.since_checkpoint >= CHECKPOINT_EVERY {
                    self.since_checkpoint = 0;
                    let _ = self.checkpointer.try_send(());
                }
            }
            // Nobody waiting: a good moment to catch the table up on a smaller backlog.
            carry = rx.try_recv().ok();
            let backlog = self.last_seq - self.applied;
            let opts = &self.shared.opts;
            let idle = carry.is_none() && backlog >= opts.materialize_idle_after;
            if self.materialize || idle || backlog >= opts.materialize_after {
                self.materialize = false;
                if let Err(e) = self.materialize_now() {
                    let _ = self.conn.execute_batch("ROLLBACK");
                    // The log keeps everything; try again after as many commits again.
                    self.applied = self.last_seq;
                    tracing::warn!(error = %e, "could not bring the nodes table up to date");
                }
            }
            if self.shared.wal_frames.load(Ordering::Relaxed) >= WAL_RESTART_FRAMES
                || self.since_restart >= WAL_RESTART_COMMITS
            {
                self.restart_wal();
            }
            self.shared
                .writer_busy_us
                .fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
            if let Done::Closed = done {
                break;
            }
        }
    }

    /// Copies into the file what of the WAL the checkpointer has not copied yet (little, as it
    /// keeps up in the background), so that the next commit starts the WAL over instead of
    /// growing it. Nothing else commits meanwhile, so the copy can be complete.
    fn restart_wal(&mut self) {
        let t = std::time::Instant::now();
        match checkpoint(&self.conn) {
            Ok((false, frames, copied)) if frames == copied => {
                self.since_restart = 0;
                self.shared.wal_frames.store(0, Ordering::Relaxed);
                let s = &self.shared;
                s.wal_restarts.fetch_add(1, Ordering::Relaxed);
                s.wal_restart_us
                    .fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
            }
            // The checkpointer is at it, or a reader holds old frames: again once the
            // checkpointer has been round once more.
            Ok(_) => {
                self.shared.wal_frames.store(0, Ordering::Relaxed);
                self.since_restart = self
                    .since_restart
                    .min(WAL_RESTART_COMMITS - CHECKPOINT_EVERY);
            }
            Err(e) => {
                self.since_restart = 0;
                tracing::warn!(error = %e, "could not checkpoint the WAL");
            }
        }
    }

    /// Brings the `nodes` table up to date with the change log, in one transaction: each node
    /// changed since the last materialization is written once, with its last image. Needs no
    /// fsync of its own: the WAL keeps commits in order, so losing this one at a crash only
    /// leaves more log to replay.
    fn materialize_now(&mut self) -> rusqlite::Result<()> {
        let t = std::time::Instant::now();
        self.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let mut rows = 0u64;
        let from = applied(&self.conn)?;
        let folded = &mut self.folded;
        folded.clear();
        let mut to = from;
        each_change(&self.conn, from, |seq, entries| {
            folded.add(entries);
            to = seq;
        })?;
        if to > from {
            let mut upsert = self.conn.prepare_cached(
                "INSERT INTO nodes(parent, name, data, version, owner, ctime, mtime, seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT(parent, name) DO UPDATE SET data = excluded.data, version = excluded.version,
                   owner = excluded.owner, ctime = excluded.ctime, mtime = excluded.mtime, seq = excluded.seq",
            )?;
            let mut del = self
                .conn
                .prepare_cached("DELETE FROM nodes WHERE parent = ?1 AND name = ?2")?;
            // In the table's key order: neighbouring rows share pages, so the transaction
            // dirties (and the WAL and the next checkpoint copy) far fewer of them.
            let mut writes: Vec<log::RowWrite> = folded.writes().collect();
            writes.sort_unstable_by(|a, b| key(a.path()).cmp(&key(b.path())));
            for w in writes {
                rows += 1;
                match w {
                    log::RowWrite::Upsert(path, n) => {
                        let (parent, name) = key(path);
                        upsert.execute(params![
                            parent,
                            name,
                            n.data,
                            n.version,
                            n.owner as i64,
                            n.ctime as i64,
                            n.mtime as i64,
                            n.seq
                        ])?;
                    }
                    log::RowWrite::Delete(path) => {
                        let (parent, name) = key(path);
                        del.execute([parent, name])?;
                    }
                }
            }
            self.conn
                .prepare_cached("UPDATE lading_meta SET value = ?1 WHERE key = 'applied'")?
                .execute([to.to_string()])?;
            // Keep the newest entry always: sequence numbers must never be reused.
            self.conn
                .prepare_cached("DELETE FROM changes WHERE seq <= ?1")?
                .execute([(to - CHANGES_KEPT).min(to - 1)])?;
        }
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        self.applied = to.max(from);
        if to > from {
            let s = &self.shared;
            s.materializations.fetch_add(1, Ordering::Relaxed);
            s.materialized_rows.fetch_add(rows, Ordering::Relaxed);
            s.materialize_us
                .fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Removes a session and its ephemeral nodes (into the overlay).
    fn drop_session(
        &self,
        ov: &mut Overlay,
        base: &dyn mem::Below,
        id: u64,
    ) -> rusqlite::Result<()> {
        for p in ov.owned_by(base, id) {
            ov.force_delete(base, &p);
        }
        self.conn
            .prepare_cached("DELETE FROM sessions WHERE id = ?1")?
            .execute([id as i64])?;
        tracing::debug!(session = id, "session removed");
        Ok(())
    }

    /// Applies one group in one transaction and hands it to the syncer.
    fn apply_group(&mut self, group: Vec<Req>) -> Done {
        let now = self.shared.opts.clock.now_ms();
        let shared = self.shared.clone();
        let mut ov = Overlay::default();
        // The overlay as queued for the syncer, once committed.
        let mut pending_overlay: Option<Arc<Overlay>> = None;
        let mut replies: Vec<(Reply, Result<Vec<OpResult>, TreeError>)> = Vec::new();
        let mut after: Vec<oneshot::Sender<()>> = Vec::new();
        let mut close: Option<oneshot::Sender<Result<(), TreeError>>> = None;
        let mut synced = Synced::Nothing;
        let mut needs_sync = false;

        if let Some(why) = lock(&shared.pending).poisoned.clone() {
            for req in group {
                match req {
                    Req::Multi(_, reply) => {
                        let _ = reply.send(Err(TreeError::Backend(why.clone())));
                    }
                    Req::Expire(done) => {
                        let _ = done.send(());
                    }
                    Req::Close(done) => {
                        let _ = done.send(Err(TreeError::Backend(why.clone())));
                        return Done::Closed;
                    }
                    Req::Heartbeat | Req::Reap | Req::Materialize => {}
                }
            }
            return Done::Open;
        }
        shared.wait_pending(|n| n < MAX_PENDING);

        let result = (|| -> rusqlite::Result<Option<i64>> {
            self.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
            // Did another process commit since our last group? Then fold that in first, in
            // order: our own pending groups go before it.
            if last_change(&self.conn)?.1 > self.last_seq {
                shared.wait_pending(|n| n == 0);
                synced = sync_from(
                    &self.conn,
                    &mut shared.mem.write().unwrap_or_else(|p| p.into_inner()),
                )?;
                self.last_seq = shared.mem.read().unwrap_or_else(|p| p.into_inner()).synced;
            }
            let pending: Vec<Arc<Overlay>> = lock(&shared.pending)
                .groups
                .iter()
                .map(|(_, o)| o.clone())
                .collect();
            let mem_guard = shared.mem.read().unwrap_or_else(|p| p.into_inner());
            let base = mem::Layers {
                mem: &mem_guard,
                pending: &pending,
            };
            let session = shared.session.load(Ordering::SeqCst);
            let live = self
                .conn
                .prepare_cached("SELECT 1 FROM sessions WHERE id = ?1 AND expires_ms >= ?2")?
                .exists(params![session as i64, now as i64])?;
            let mut session_ok = live;
            if !live {
                // Our session lapsed (or another process reaped it): its ephemerals go, and
                // every multi of this group fails; later requests run under a new session.
                self.drop_session(&mut ov, &base, session)?;
                let fresh = new_session(&self.conn, &shared.opts)?;
                shared.session.store(fresh, Ordering::SeqCst);
                tracing::warn!(
                    old = session,
                    new = fresh,
                    "session expired; opened a new one"
                );
            }
            let session = shared.session.load(Ordering::SeqCst);
            for req in group {
                match req {
                    Req::Multi(ops, reply) => {
                        let r = if session_ok {
                            ov.apply_multi(&base, &ops, session, now)
                        } else {
                            Err(TreeError::SessionExpired)
                        };
                        replies.push((reply, r));
                    }
                    Req::Heartbeat => {
                        self.conn
                            .prepare_cached("UPDATE sessions SET expires_ms = ?2 WHERE id = ?1")?
                            .execute(params![
                                session as i64,
                                (now + shared.opts.session_timeout_ms) as i64
                            ])?;
                    }
                    Req::Reap => {
                        for id in dead_sessions(&self.conn, now, session)? {
                            self.drop_session(&mut ov, &base, id)?;
                        }
                    }
                    Req::Materialize => self.materialize |= self.last_seq > self.applied,
                    Req::Expire(done) => {
                        self.conn.execute(
                            "UPDATE sessions SET expires_ms = 0 WHERE id = ?1",
                            [session as i64],
                        )?;
                        session_ok = false;
                        after.push(done);
                    }
                    Req::Close(done) => {
                        self.drop_session(&mut ov, &base, session)?;
                        self.materialize = true;
                        close = Some(done);
                    }
                }
            }
            // Whether each changed node is in the committed file: decides UPDATE, INSERT, DELETE,
            // or nothing (a lock made and dropped within the group never reaches SQL).
            let writes: Vec<(&String, Option<&MemNode>, bool)> = ov
                .changed
                .iter()
                .map(|(p, n)| (p, n.as_ref(), base.get(p).is_some()))
                .collect();
            needs_sync = !only_ephemeral(&ov, &base);
            drop(mem_guard);
            // A lock made and dropped within the group is in neither the file nor the log.
            let body = log::encode(
                writes
                    .into_iter()
                    .filter(|(_, node, existed)| node.is_some() || *existed)
                    .map(|(p, n, existed)| (p.as_str(), n, existed)),
            );
            if body.len() == 1 {
                self.conn.prepare_cached("COMMIT")?.execute([])?;
                return Ok(None);
            }
            self.conn
                .prepare_cached("INSERT INTO changes(body) VALUES (?1)")?
                .execute([&body])?;
            let seq = self.conn.last_insert_rowid();
            // Commit and enter the pending queue as one step for readers: a reader folding in
            // the change log must never see our row committed but not yet pending (it would
            // take an un-fsynced change into memory, and the syncer would later re-apply it
            // out of order).
            let committed = Arc::new(std::mem::take(&mut ov));
            let sync_guard = lock(&shared.sync);
            self.conn.prepare_cached("COMMIT")?.execute([])?;
            self.last_seq = seq;
            lock(&shared.pending)
                .groups
                .push_back((seq, committed.clone()));
            drop(sync_guard);
            // Counted before anyone is answered: whoever learns of this commit finds the
            // counter moved.
            if let Err(e) = shared.counter.count_own() {
                tracing::warn!(error = %e, "could not count a commit; other processes will see it at their next poll");
            }
            pending_overlay = Some(committed);
            Ok(Some(seq))
        })();

        let closing = close.is_some();
        match result {
            Ok(seq) => {
                shared.commits.fetch_add(1, Ordering::Relaxed);
                shared
                    .multis
                    .fetch_add(replies.len() as u64, Ordering::Relaxed);
                let _ = seq;
                let overlay = pending_overlay
                    .take()
                    .unwrap_or_else(|| Arc::new(std::mem::take(&mut ov)));
                let item = Committed {
                    seq,
                    needs_sync: needs_sync && seq.is_some(),
                    overlay,
                    synced,
                    replies,
                    after,
                    close,
                };
                if let Err(mpsc::SendError(item)) = self.to_syncer.send(item) {
                    // The syncer is gone (only at shutdown): answer here.
                    for (reply, _) in item.replies {
                        let _ =
                            reply.send(Err(TreeError::Backend("store handle is closing".into())));
                    }
                }
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                tracing::error!(error = %e, "group commit failed");
                for (reply, r) in replies {
                    let r = match r {
                        Ok(_) => Err(TreeError::Backend(format!("commit failed: {e}"))),
                        refused => refused,
                    };
                    let _ = reply.send(r);
                }
                for done in after {
                    let _ = done.send(());
                }
                if let Some(done) = close {
                    let _ = done.send(Err(TreeError::Backend(format!("commit failed: {e}"))));
                }
            }
        }
        if closing { Done::Closed } else { Done::Open }
    }
}

/// Whether every node the overlay changes is ephemeral, before and after. Such a group is
/// committed but not fsynced before it is answered, which is safe because of what ephemeral
/// nodes are: it can only be lost with the machine (a process crash loses nothing the kernel
/// holds), and then every session that could own or have seen those nodes is dead, so the
/// tree after restart is the one reaping those sessions would leave anyway. Anything durable
/// that was decided after seeing the group comes later in the WAL, and its fsync covers the
/// group too. A lease is taken this way with no fsync; the transition that ends it has one.
fn only_ephemeral(ov: &Overlay, base: &dyn Below) -> bool {
    ov.changed.iter().all(|(p, n)| {
        n.as_ref().is_none_or(|n| n.owner != 0) && base.get(p).is_none_or(|n| n.owner != 0)
    })
}

/// A passive checkpoint on `conn`: whether another checkpoint was under way, the frames in the
/// WAL, and how many of them are now copied into the database file.
fn checkpoint(conn: &Connection) -> rusqlite::Result<(bool, i64, i64)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get::<_, i64>(0)? != 0, r.get(1)?, r.get(2)?))
    })
}

/// Copies the WAL into the database file in the background whenever the writer says it has
/// grown, without holding up commits (a passive checkpoint takes no lock a writer needs).
fn checkpointer(shared: Arc<Shared>, conn: Connection, wake: mpsc::Receiver<()>) {
    while wake.recv().is_ok() {
        // The writer is to finish this round: stay out of its way (a checkpoint under way
        // would make its own find the WAL busy, and the WAL grow on).
        if shared.wal_frames.load(Ordering::Relaxed) >= WAL_RESTART_FRAMES {
            continue;
        }
        let t = std::time::Instant::now();
        match checkpoint(&conn) {
            Ok((_, frames, _)) => {
                shared.wal_frames.store(frames, Ordering::Relaxed);
                shared.checkpoints.fetch_add(1, Ordering::Relaxed);
                shared
                    .checkpoint_us
                    .fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(error = %e, "could not checkpoint the WAL"),
        }
    }
}

/// Makes committed groups durable (one `fdatasync` of the WAL for all that are waiting), folds
/// them into memory in commit order, fires watches, and answers the callers.
fn syncer(shared: Arc<Shared>, rx: mpsc::Receiver<Committed>, durable: bool) {
    let wal = PathBuf::from(format!("{}-wal", shared.path.display()));
    let mut wal_file: Option<std::fs::File> = None;
    while let Ok(first) = rx.recv() {
        let mut items = vec![first];
        while let Ok(more) = rx.try_recv() {
            items.push(more);
        }
        let mut failure: Option<String> = None;
        if durable && items.iter().any(|i| i.needs_sync) {
            // The frames were written at COMMIT; this makes them durable (and every commit
            // before them: the WAL is one file written in order).
            let t = std::time::Instant::now();
            // The WAL stays while this handle's connections are open: one descriptor serves
            // every fsync. A failed fsync is never retried (the kernel may have dropped the
            // pages it could not write, and a second fsync would report success): it poisons.
            if wal_file.is_none() {
                wal_file = std::fs::OpenOptions::new().write(true).open(&wal).ok();
            }
            let r = match &wal_file {
                Some(f) => f.sync_data(),
                None => std::fs::OpenOptions::new()
                    .write(true)
                    .open(&wal)
                    .and_then(|f| f.sync_data()),
            };
            shared.fsyncs.fetch_add(1, Ordering::Relaxed);
            shared
                .fsync_us
                .fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
            if let Err(e) = r {
                failure = Some(format!(
                    "fsync of {} failed: {e}; this store handle refuses all further work",
                    wal.display()
                ));
            }
        }
        if let Some(why) = &failure {
            tracing::error!("{why}");
            let mut p = lock(&shared.pending);
            p.poisoned = Some(why.clone());
            p.groups.clear();
            drop(p);
            shared.pending_changed.notify_all();
            for item in items {
                for (reply, _) in item.replies {
                    let _ = reply.send(Err(TreeError::Backend(why.clone())));
                }
                for done in item.after {
                    let _ = done.send(());
                }
                if let Some(done) = item.close {
                    let _ = done.send(Err(TreeError::Backend(why.clone())));
                }
            }
            continue;
        }
        // All of them under one write lock: readers wait once, not once per group.
        if items.iter().any(|i| i.seq.is_some()) {
            let mut mem = shared.mem.write().unwrap_or_else(|p| p.into_inner());
            for item in &items {
                let Some(seq) = item.seq else { continue };
                item.overlay.apply_to(&mut mem);
                mem.synced = seq;
                // Under the memory lock, so the writer sees a group in memory or pending,
                // never in neither.
                let popped = lock(&shared.pending).groups.pop_front();
                debug_assert_eq!(
                    popped.map(|(s, _)| s),
                    Some(seq),
                    "groups are folded in commit order"
                );
            }
        }
        shared.pending_changed.notify_all();
        for item in items {
            let mut w = lock(&shared.watches);
            match &item.synced {
                Synced::Reloaded => w.fire_all(),
                Synced::Paths(ps) => ps.iter().for_each(|p| w.fire_changed(p)),
                Synced::Nothing => {}
            }
            item.overlay.changed.keys().for_each(|p| w.fire_changed(p));
            drop(w);
            for (reply, r) in item.replies {
                let _ = reply.send(r);
            }
            for done in item.after {
                let _ = done.send(());
            }
            if let Some(done) = item.close {
                let _ = done.send(Ok(()));
            }
        }
    }
}

impl Shared {
    /// Blocks until the number of groups awaiting their fsync satisfies `ok` (or poisoned).
    fn wait_pending(&self, ok: impl Fn(usize) -> bool) {
        let mut p = lock(&self.pending);
        while !ok(p.groups.len()) && p.poisoned.is_none() {
            p = self
                .pending_changed
                .wait(p)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Folds in other processes' commits if any happened since the last look (as the
    /// commit counter says; `ask_sqlite`: as SQLite says, which also finds a commit whose
    /// process died before counting it).
    fn refresh(&self, ask_sqlite: bool) -> Result<(), TreeError> {
        // While our own groups await their fsync, memory must take changes in commit order:
        // theirs come after ours, so they wait for the syncer.
        if !lock(&self.pending).groups.is_empty() {
            return Ok(());
        }
        // Read before the look: every commit counted by now is in the file when SQLite is
        // asked below.
        let counted = match self.counter.read() {
            Ok(n) if !ask_sqlite && !self.counter.moved(n) => return Ok(()),
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!(error = %e, "could not read the commit counter; asking SQLite");
                None
            }
        };
        let mut sc = lock(&self.sync);
        // Again under the mutex the writer holds across COMMIT and queueing: now no own commit
        // can be in the file without being pending.
        if !lock(&self.pending).groups.is_empty() {
            return Ok(());
        }
        let dv: i64 = sc
            .conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut st| st.query_row([], |r| r.get(0)))
            .map_err(backend)?;
        if dv == sc.data_version {
            drop(sc);
            counted.inspect(|n| self.counter.caught_up(*n));
            return Ok(());
        }
        sc.conn.execute_batch("BEGIN").map_err(backend)?;
        let synced = {
            let mut mem = self.mem.write().unwrap_or_else(|p| p.into_inner());
            sync_from(&sc.conn, &mut mem)
        };
        let _ = sc.conn.execute_batch("COMMIT");
        let synced = synced.map_err(backend)?;
        sc.data_version = dv;
        drop(sc);
        counted.inspect(|n| self.counter.caught_up(*n));
        let mut w = lock(&self.watches);
        match synced {
            Synced::Reloaded => w.fire_all(),
            Synced::Paths(ps) => ps.iter().for_each(|p| w.fire_changed(p)),
            Synced::Nothing => {}
        }
        Ok(())
    }

    fn read<R>(&self, path: &str, f: impl FnOnce(&Mem) -> R) -> Result<R, TreeError> {
        validate_path(path)?;
        self.refresh(false)?;
        let mem = self.mem.read().unwrap_or_else(|p| p.into_inner());
        Ok(f(&mem))
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
        // Several processes may open a new store at once; one creating it or switching it to
        // WAL can keep the others busy past SQLite's own wait (changing the journal mode does
        // not wait). They try again.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let (conn, sync_conn) = loop {
            match Self::prepare_file(&path, &opts) {
                Err(TreeError::Backend(m))
                    if m.contains(BUSY) && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                r => break r?,
            }
        };
        Self::open_prepared(path, opts, conn, sync_conn)
    }

    /// Checks the file is ours (or empty), makes the schema, and opens the writer's and the
    /// readers' connections.
    fn prepare_file(
        path: &Path,
        opts: &SqliteOptions,
    ) -> Result<(Connection, Connection), TreeError> {
        // Look before touching: a file that is not ours must not even be switched to WAL.
        {
            let probe = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
            )
            .map_err(|e| TreeError::NotOurs(path.display().to_string(), e.to_string()))?;
            // Several processes may open a new store at once: wait out the one creating it.
            probe
                .busy_timeout(Duration::from_secs(30))
                .map_err(backend)?;
            check_ours(&probe, path)?;
            init_schema(&probe, path, opts.clock.now_ms())?;
        }
        // The writer commits without fsync; the syncer thread fsyncs the WAL before anyone is
        // told a commit happened (when `durable`), so the next group need not wait for it.
        let conn = open_conn(path, false)?;
        let sync_conn = open_conn(path, opts.durable)?;
        Ok((conn, sync_conn))
    }

    /// Registers the session, loads the tree and starts the threads.
    fn open_prepared(
        path: PathBuf,
        opts: SqliteOptions,
        conn: Connection,
        sync_conn: Connection,
    ) -> Result<SqliteTree, TreeError> {
        let mut mem = Mem::default();
        // Before the load: every commit counted by now is in it.
        let counter = counter::Counter::open(&path).map_err(|e| {
            TreeError::Backend(format!(
                "could not open the commit counter beside {}: {e}",
                path.display()
            ))
        })?;
        // Register, reap what crashed processes left, and load — in one write transaction so
        // the image and the log position agree.
        let session = (|| -> rusqlite::Result<u64> {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let session = new_session(&conn, &opts)?;
            full_load(&conn, &mut mem)?;
            conn.execute_batch("COMMIT")?;
            Ok(session)
        })()
        .map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            backend(e)
        })?;
        let data_version: i64 = sync_conn
            .query_row("PRAGMA data_version", [], |r| r.get(0))
            .map_err(backend)?;
        let shared = Arc::new(Shared {
            path: path.clone(),
            session: AtomicU64::new(session),
            mem: RwLock::new(mem),
            pending: Mutex::new(Pending::default()),
            pending_changed: std::sync::Condvar::new(),
            sync: Mutex::new(SyncConn {
                conn: sync_conn,
                data_version,
            }),
            counter,
            watches: Mutex::new(Watches::default()),
            commits: AtomicU64::new(0),
            multis: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            fsync_us: AtomicU64::new(0),
            writer_busy_us: AtomicU64::new(0),
            wal_frames: std::sync::atomic::AtomicI64::new(0),
            checkpoints: AtomicU64::new(0),
            checkpoint_us: AtomicU64::new(0),
            wal_restarts: AtomicU64::new(0),
            wal_restart_us: AtomicU64::new(0),
            materializations: AtomicU64::new(0),
            materialized_rows: AtomicU64::new(0),
            materialize_us: AtomicU64::new(0),
            opts: opts.clone(),
            stopping: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel();
        let (to_syncer, from_writer) = mpsc::channel();
        let last_seq = lock_read(&shared.mem).synced;
        let checkpoint_conn = open_conn(&shared.path, false)?;
        let (checkpointer_tx, checkpointer_rx) = mpsc::sync_channel(1);
        let mut writer = Writer {
            conn,
            shared: shared.clone(),
            to_syncer,
            last_seq,
            applied: 0,
            materialize: false,
            folded: log::Coalesced::default(),
            checkpointer: checkpointer_tx,
            since_checkpoint: 0,
            since_restart: 0,
        };
        // Dead sessions' locks must not linger: reap before anyone reads.
        writer.apply_group(vec![Req::Reap]);
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| TreeError::Backend(e.to_string()))
        };
        let s1 = shared.clone();
        let durable = opts.durable;
        let mut threads = vec![spawn(
            "lading-sqlite-sync",
            Box::new(move || syncer(s1, from_writer, durable)),
        )?];
        shared.wait_pending(|n| n == 0);
        threads.push(spawn(
            "lading-sqlite-writer",
            Box::new(move || writer.run(rx)),
        )?);
        let (s2, tx2) = (shared.clone(), tx.clone());
        threads.push(spawn(
            "lading-sqlite-maint",
            Box::new(move || maintenance(s2, tx2)),
        )?);
        let s3 = shared.clone();
        threads.push(spawn(
            "lading-sqlite-ckpt",
            Box::new(move || checkpointer(s3, checkpoint_conn, checkpointer_rx)),
        )?);
        Ok(SqliteTree {
            shared,
            tx: Mutex::new(Some(tx)),
            threads: Mutex::new(threads),
        })
    }

    /// Watches registered and not yet fired (dropped ones included until they are swept).
    pub fn registered_watches(&self) -> usize {
        lock(&self.shared.watches).map.values().map(Vec::len).sum()
    }

    /// What the writer has done so far.
    pub fn stats(&self) -> WriterStats {
        WriterStats {
            commits: self.shared.commits.load(Ordering::Relaxed),
            multis: self.shared.multis.load(Ordering::Relaxed),
            fsyncs: self.shared.fsyncs.load(Ordering::Relaxed),
            fsync_us: self.shared.fsync_us.load(Ordering::Relaxed),
            writer_busy_us: self.shared.writer_busy_us.load(Ordering::Relaxed),
            materializations: self.shared.materializations.load(Ordering::Relaxed),
            materialized_rows: self.shared.materialized_rows.load(Ordering::Relaxed),
            materialize_us: self.shared.materialize_us.load(Ordering::Relaxed),
            checkpoints: self.shared.checkpoints.load(Ordering::Relaxed),
            checkpoint_us: self.shared.checkpoint_us.load(Ordering::Relaxed),
            wal_restarts: self.shared.wal_restarts.load(Ordering::Relaxed),
            wal_restart_us: self.shared.wal_restart_us.load(Ordering::Relaxed),
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
        match lock(&self.tx).as_ref() {
            Some(tx) => tx
                .send(req)
                .map_err(|_| TreeError::Backend("store handle is closed".into())),
            None => Err(TreeError::Backend("store handle is closed".into())),
        }
    }

    fn stop(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Some(tx) = lock(&self.tx).take() {
            let (done, _rx) = oneshot::channel();
            let _ = tx.send(Req::Close(done));
        }
        let threads: Vec<_> = lock(&self.threads).drain(..).collect();
        for t in threads {
            // The maintenance thread sleeps parked between polls.
            t.thread().unpark();
            let _ = t.join();
        }
        lock(&self.shared.watches).fire_all();
    }
}

/// Heartbeats the session, reaps others', and folds in other processes' commits so watches
/// fire even when nobody reads.
fn maintenance(shared: Arc<Shared>, tx: mpsc::Sender<Req>) {
    let opts = &shared.opts;
    let tick = Duration::from_millis(opts.poll_interval_ms.max(1));
    let heartbeat_every = (opts.session_timeout_ms / 3).max(1);
    let mut last_heartbeat = std::time::Instant::now();
    let mut last_reap = std::time::Instant::now();
    let mut last_materialize = std::time::Instant::now();
    while !shared.stopping.load(Ordering::SeqCst) {
        // Parked, not asleep: closing the handle wakes it at once.
        std::thread::park_timeout(tick);
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
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
        // A quiet store's table catches up with its log within a second.
        if last_materialize.elapsed().as_millis() as u64 >= opts.materialize_every_ms {
            last_materialize = std::time::Instant::now();
            if tx.send(Req::Materialize).is_err() {
                return;
            }
        }
        if let Err(e) = shared.refresh(true) {
            tracing::warn!(error = %e, "could not fold in other processes' commits");
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
            self.shared.read(path, |m| {
                m.get(path).map(|n| Node {
                    data: n.data.clone(),
                    stat: n.stat(),
                })
            })
        })
    }

    fn get_many<'a>(
        &'a self,
        paths: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Option<Node>>, TreeError>> {
        Box::pin(async move {
            for p in paths {
                validate_path(p)?;
            }
            self.shared.refresh(false)?;
            let mem = self.shared.mem.read().unwrap_or_else(|p| p.into_inner());
            Ok(paths
                .iter()
                .map(|p| {
                    mem.get(p).map(|n| Node {
                        data: n.data.clone(),
                        stat: n.stat(),
                    })
                })
                .collect())
        })
    }

    fn exists<'a>(
        &'a self,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Option<lading_core::Stat>, TreeError>> {
        Box::pin(async move { self.shared.read(path, |m| m.get(path).map(MemNode::stat)) })
    }

    fn children<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<String>, TreeError>> {
        Box::pin(async move {
            self.shared
                .read(path, |m| m.children(path).map(|c| c.cloned().collect()))?
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
            self.shared
                .read(path, |m| m.children_page(path, after, limit))?
                .ok_or_else(|| TreeError::NoNode(path.into()))
        })
    }

    fn count_children<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<u64, TreeError>> {
        Box::pin(async move {
            self.shared
                .read(path, |m| m.count_children(path))?
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
            lock(&self.shared.watches).add(path, kind, tx);
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
