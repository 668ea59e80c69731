//! The embedded backend: the coordination tree in one SQLite file.
//!
//! Shape, and why:
//! - **The tree lives in memory; SQLite makes it durable.** Each handle loads the tree at
//!   open ([`mem::Mem`]). Reads are memory lookups. The writer validates a `multi` against
//!   memory (versions, parents, emptiness) — no reads, no savepoints on the commit path.
//! - **A commit is one log entry.** What a group changed is appended to the `changes` table as
//!   one row of node images (`log`); that row is the durable record. The `nodes` table is
//!   brought up to date in bulk: after 64 commits when no request is waiting (so no request
//!   waits long behind it), after [`MATERIALIZE_AFTER`] at the latest, on a quiet second, and at
//!   close: each node changed meanwhile is written once with its last image, and a node made
//!   and dropped in between (a lease, a state reference) never reaches it. The rows go a
//!   slice at a time between groups, worked out off the writer's thread (`fold.rs`), so no
//!   commit waits behind the whole of it. Opening loads the rows, then replays the log after
//!   them (`lading_meta.applied`).
//! - **One writer thread per session handle, group commit.** Every `multi` is sent to the
//!   writer, which takes everything queued (up to [`MAX_GROUP`] requests), applies each to an
//!   overlay (a failing `multi` is undone alone), and makes the whole group durable with one
//!   commit — one fsync for many transitions. Only then is the overlay folded into memory and
//!   the callers answered, so nobody reads a change that could still be lost. A group that
//!   changed only ephemeral nodes (leases) is answered without an fsync: it can only be lost
//!   with the machine, together with every session that could have held them.
//! - **Checkpoints stay off the commit path.** No connection checkpoints on commit. A
//!   checkpointer thread with its own connection copies the WAL into the file every
//!   [`CHECKPOINT_EVERY`] commits (a passive checkpoint: it takes no lock a writer needs) and
//!   syncs the file after it (SQLite would not, with frames added meanwhile). Once the WAL
//!   holds [`WAL_RESTART_FRAMES`] frames, the writer itself copies the little the
//!   checkpointer has not, between two groups, so that its next commit starts the WAL over
//!   from the beginning; its sync covers only that little. Before, the writer checkpointed
//!   all 8,000 frames itself (40–50 ms without a commit), and then synced every page the
//!   checkpointer had copied since the last restart (70–140 ms).
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
mod fold;
mod log;
/// The in-memory tree and its validated `multi`; also the simulator's tree (`lading-sim`).
pub mod mem;
mod schema;
mod writer;
pub use schema::describe_sessions;
use schema::*;
use writer::*;

pub use fold::MATERIALIZE_SLICE;
pub use mem::MAX_DATA_BYTES;

use foldhash::HashMap;
use lading_core::time::{SharedClock, format_ts, system_clock};
use lading_core::tree::{Change, ChangeFeed, Changes, is_under, split_path, validate_path};
use lading_core::{
    BoxFuture, Names, Node, Op, OpResult, Tree, TreeError, TreeFuture, Watch, WatchKind,
};
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
    /// Rows a materialization writes between two groups ([`MATERIALIZE_SLICE`]): how long
    /// a commit can wait behind it.
    pub materialize_slice: usize,
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
            materialize_slice: MATERIALIZE_SLICE,
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
    /// The ops, and the session they must commit under (none: whichever is current).
    Multi(Vec<Op>, Option<u64>, Reply),
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
    /// Change feeds: their prefixes and where to send.
    feeds: Vec<(Vec<String>, tokio::sync::mpsc::UnboundedSender<Change>)>,
}

/// A change feed of this handle: every commit it folds in, its own and other processes'.
struct Feed {
    rx: tokio::sync::mpsc::UnboundedReceiver<Change>,
    shared: Arc<Shared>,
}

impl ChangeFeed for Feed {
    fn next(&mut self) -> BoxFuture<'_, Option<Change>> {
        Box::pin(self.rx.recv())
    }

    fn get_many<'a>(&'a self, paths: &'a [String]) -> TreeFuture<'a, Vec<Option<Node>>> {
        Box::pin(async move { self.shared.get_many(paths) })
    }

    fn children<'a>(&'a self, path: &'a str) -> Names<'a> {
        Box::pin(async move { self.shared.children(path) })
    }
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

    /// Fires the watches a change of `path` concerns: its own, and its parent's children;
    /// and tells the feeds that follow it.
    fn fire_changed(&mut self, path: &str) {
        if !self.feeds.is_empty() {
            self.feeds.retain(|(prefixes, tx)| {
                !prefixes.iter().any(|p| is_under(path, p))
                    || tx.send(Change::Node(path.to_string())).is_ok()
            });
        }
        self.fire(path, WatchKind::Data);
        if path != "/" {
            self.fire(split_path(path).0, WatchKind::Children);
        }
    }

    fn fire_all(&mut self) {
        self.feeds.retain(|(_, tx)| tx.send(Change::Lost).is_ok());
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
    /// Transactions the rows were written in (a slice each, between two groups), and the
    /// longest one: how long a commit waited behind materializing at most.
    pub materialize_slices: u64,
    pub materialize_slice_max_us: u64,
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
    materialize_slices: AtomicU64,
    materialize_slice_max_us: AtomicU64,
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

/// What a busy error's message says, so opening can tell it apart and try again.
const BUSY: &str = " is busy: ";

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

    fn get_many(&self, paths: &[String]) -> Result<Vec<Option<Node>>, TreeError> {
        for p in paths {
            validate_path(p)?;
        }
        self.refresh(false)?;
        let mem = self.mem.read().unwrap_or_else(|p| p.into_inner());
        Ok(paths
            .iter()
            .map(|p| {
                mem.get(p).map(|n| Node {
                    data: n.data.clone(),
                    stat: n.stat(),
                })
            })
            .collect())
    }

    fn children(&self, path: &str) -> Result<Vec<String>, TreeError> {
        self.read(path, |m| m.children(path).map(|c| c.cloned().collect()))?
            .ok_or_else(|| TreeError::NoNode(path.into()))
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
        let (session, table_at) = (|| -> rusqlite::Result<(u64, i64)> {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let session = new_session(&conn, &opts)?;
            full_load(&conn, &mut mem)?;
            let table_at = applied(&conn)?;
            conn.execute_batch("COMMIT")?;
            Ok((session, table_at))
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
            materialize_slices: AtomicU64::new(0),
            materialize_slice_max_us: AtomicU64::new(0),
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
            applied: table_at,
            materialize: false,
            fold: None,
            preparing: None,
            folded: log::Coalesced::default(),
            body: Vec::new(),
            // With nothing in the log after the table, the first fold is from memory too.
            recent: (last_seq == table_at).then(|| Recent {
                from: table_at,
                commits: Vec::new(),
            }),
            checkpointer: checkpointer_tx,
            since_checkpoint: 0,
            since_restart: 0,
            logged_since_restart: 0,
            restart_after: writer::LOG_RESTART,
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
            materialize_slices: self.shared.materialize_slices.load(Ordering::Relaxed),
            materialize_slice_max_us: self.shared.materialize_slice_max_us.load(Ordering::Relaxed),
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
        let mut w = lock(&self.shared.watches);
        w.fire_all();
        // Their `next` ends.
        w.feeds.clear();
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

impl SqliteTree {
    /// A `multi` to the writer, on session `on` only when given.
    fn multi_req(&self, ops: Vec<Op>, on: Option<u64>) -> TreeFuture<'_, Vec<OpResult>> {
        // Inside the caller's span (a job's, a batch's), so its ids go with it.
        let span =
            tracing::debug_span!("multi", ops = ops.len(), first = ops.first().map(Op::path));
        Box::pin(tracing::Instrument::instrument(
            async move {
                mem::validate_ops(&ops)?;
                let (tx, rx) = oneshot::channel();
                self.send(Req::Multi(ops, on, tx))?;
                rx.await
                    .map_err(|_| TreeError::Backend("store writer stopped".into()))?
            },
            span,
        ))
    }
}

impl Tree for SqliteTree {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    fn session_id(&self) -> u64 {
        self.shared.session.load(Ordering::SeqCst)
    }

    fn get<'a>(&'a self, path: &'a str) -> TreeFuture<'a, Option<Node>> {
        Box::pin(async move {
            self.shared.read(path, |m| {
                m.get(path).map(|n| Node {
                    data: n.data.clone(),
                    stat: n.stat(),
                })
            })
        })
    }

    fn get_many<'a>(&'a self, paths: &'a [String]) -> TreeFuture<'a, Vec<Option<Node>>> {
        Box::pin(async move { self.shared.get_many(paths) })
    }

    fn exists<'a>(&'a self, path: &'a str) -> TreeFuture<'a, Option<lading_core::Stat>> {
        Box::pin(async move { self.shared.read(path, |m| m.get(path).map(MemNode::stat)) })
    }

    fn children<'a>(&'a self, path: &'a str) -> Names<'a> {
        Box::pin(async move { self.shared.children(path) })
    }

    fn children_page<'a>(&'a self, path: &'a str, after: Option<&'a str>, max: usize) -> Names<'a> {
        Box::pin(async move {
            self.shared
                .read(path, |m| m.children_page(path, after, max))?
                .ok_or_else(|| TreeError::NoNode(path.into()))
        })
    }

    fn count_children<'a>(&'a self, path: &'a str) -> TreeFuture<'a, u64> {
        Box::pin(async move {
            self.shared
                .read(path, |m| m.count_children(path))?
                .ok_or_else(|| TreeError::NoNode(path.into()))
        })
    }

    fn multi(&self, ops: Vec<Op>) -> TreeFuture<'_, Vec<OpResult>> {
        self.multi_req(ops, None)
    }

    fn multi_on(&self, session: u64, ops: Vec<Op>) -> TreeFuture<'_, Vec<OpResult>> {
        // The writer compares it with the session it commits under.
        self.multi_req(ops, Some(session))
    }

    fn watch<'a>(&'a self, path: &'a str, kind: WatchKind) -> TreeFuture<'a, Watch> {
        Box::pin(async move {
            validate_path(path)?;
            let (tx, rx) = oneshot::channel();
            lock(&self.shared.watches).add(path, kind, tx);
            Ok(Watch::new(async move {
                let _ = rx.await;
            }))
        })
    }

    fn local_reads(&self) -> bool {
        true
    }

    fn changes<'a>(&'a self, prefixes: &'a [String]) -> Changes<'a> {
        Box::pin(async move {
            for p in prefixes {
                validate_path(p)?;
            }
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            lock(&self.shared.watches)
                .feeds
                .push((prefixes.to_vec(), tx));
            Ok(Some(Box::new(Feed {
                rx,
                shared: self.shared.clone(),
            }) as Box<dyn ChangeFeed>))
        })
    }

    fn close(&self) -> TreeFuture<'_, ()> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            self.send(Req::Close(tx))?;
            let r = rx.await.unwrap_or(Ok(()));
            self.stop();
            r
        })
    }
}
