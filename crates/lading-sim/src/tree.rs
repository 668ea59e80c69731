//! The simulated coordination tree: ZooKeeper's semantics in memory, shared by every
//! simulated process, with faults drawn from the seed.
//!
//! The nodes and the all-or-nothing `multi` are the SQLite backend's own in-memory model
//! (`lading_store_sqlite::mem`), so what the simulator checks is what that backend does. On
//! top of it, per session: ephemeral nodes that end with it, expiry (the next call fails with
//! `SessionExpired`, later calls run under a new session, as the real backends do), one-shot
//! watches. Faults, when on: a connection lost before a commit or after it (the caller cannot
//! tell which), a lost read, a slow call, a watch delivered late (so watches of one change
//! may arrive out of order), a paused process.
//!
//! Every commit is checked by [`crate::check::after_commit`] while the tree is still locked,
//! so an invariant is seen the moment it breaks, and written to the trace.

use crate::check;
use lading_core::random::{Random, Seeded};
use lading_core::tree::{
    BoxFuture, Change, ChangeFeed, Changes, Names, TreeFuture, is_under, split_path, validate_path,
};
use lading_core::{Node, Op, OpResult, Tree, TreeError, Watch, WatchKind};
use lading_store_sqlite::mem::{Mem, MemNode, Overlay, validate_ops};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;

/// Fault rates (per call) and bounds, drawn from the seed.
#[derive(Debug, Clone)]
pub struct Faults {
    /// A `multi`'s reply is lost before it was applied (the backend reads back, sends again).
    pub loss_before: f64,
    /// A `multi`'s reply is lost after it was applied (the backend reads back).
    pub loss_after: f64,
    /// The backend gives up on a `multi` that was not applied: the caller sees connection loss.
    pub gave_up_before: f64,
    /// The backend gives up on a `multi` that was applied: the caller sees connection loss.
    pub gave_up_after: f64,
    /// A read fails with connection loss.
    pub read_loss: f64,
    /// A call first waits up to `slow_max_ms`.
    pub slow: f64,
    pub slow_max_ms: u64,
    /// A watch is delivered up to this late.
    pub watch_delay_max_ms: u64,
    /// A change feed reconnects (as ZooKeeper's does after a lost connection): the changes
    /// of a while are never sent, and the feed says so ([`Change::Lost`]) after them.
    pub feed_gap: f64,
}

impl Faults {
    pub fn default_on() -> Faults {
        Faults {
            loss_before: 0.01,
            loss_after: 0.01,
            gave_up_before: 0.001,
            gave_up_after: 0.0,
            read_loss: 0.002,
            slow: 0.05,
            slow_max_ms: 400,
            watch_delay_max_ms: 200,
            feed_gap: 0.002,
        }
    }
}

/// A change feed's sending side: the handle it is of, its prefixes, and how many changes its
/// current gap still drops.
struct Feeding {
    handle: u64,
    prefixes: Vec<String>,
    tx: tokio::sync::mpsc::UnboundedSender<Change>,
    gap: u32,
}

/// A watch set and not fired yet: in the order set (`seq`), by the session that set it.
struct Waiting {
    seq: u64,
    session: u64,
    tx: oneshot::Sender<()>,
}

/// Watches waiting, data watches first and children watches second, each by path. Hashed:
/// each commit takes out the watches of every node it changed (with ordered (path, kind)
/// keys, compared string by string, that was 1% of a run). No order comes from the maps:
/// what fires together is delivered in the order it was set.
type Watches = [foldhash::HashMap<String, Vec<Waiting>>; 2];

fn kind_index(kind: WatchKind) -> usize {
    match kind {
        WatchKind::Data => 0,
        WatchKind::Children => 1,
    }
}

/// Watches set since the last sweep of those nobody waits for any more.
const WATCH_SWEEP: u64 = 4096;

/// How many trace lines a violation report shows.
pub const TRACE_TAIL: usize = 60;

/// Everything the simulated processes share.
pub struct State {
    pub mem: Mem,
    live: BTreeSet<u64>,
    next_session: u64,
    /// Watches by what they watch: a change looks up only its own (the whole list, read at
    /// every change, took a third of a run).
    watches: Watches,
    watches_set: u64,
    /// Change feeds: their prefixes and where their changes go.
    feeds: Vec<Feeding>,
    next_tree: u64,
    pub faults: Option<Faults>,
    rng: Arc<Seeded>,
    start: tokio::time::Instant,
    /// Commits so far (the simulator's steps).
    pub commits: u64,
    /// Generic jobs accepted, per type and second (see [`check::Accepts`]).
    accepts: check::Accepts,
    /// How long Lading keeps ended batches (cleanup may purge one only after it).
    pub retention_ms: u64,
    pub violations: Vec<String>,
    /// Batches cleanup has purged a job of: a batch's jobs go one commit each before the
    /// batch does, so such a batch may be seen with some of its jobs and not others.
    pub purged_from: BTreeSet<String>,
    /// FNV-1a over every trace line: two runs of one seed agree iff their traces do.
    pub trace_hash: u64,
    pub tail: VecDeque<String>,
    /// Every line, when a full trace was asked for.
    pub full: Option<Vec<String>>,
    /// `LADING_SIM_LIVE=1`: every line to stderr as it happens (a run that does not end).
    live_trace: bool,
    /// The simulated instant of the last tree call, and the calls made at it.
    still: (u64, u64),
    /// The clock stood still too long: every call from now on waits for good.
    halted: bool,
}

/// The simulated wall clock's start (2026-01-01), in ms since the epoch.
pub const EPOCH_MS: u64 = 1_767_225_600_000;

impl State {
    /// Simulated time since the run started, in ms.
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// When the run started: the processes' clock reads [`EPOCH_MS`] then.
    pub fn start(&self) -> tokio::time::Instant {
        self.start
    }

    pub fn trace(&mut self, line: String) {
        self.trace_with(|out| out.push_str(&line));
    }

    /// A trace line written by `write` after its time, in one string (every commit writes
    /// one: formatted, then copied behind its time, they were 2% of a run).
    fn trace_with(&mut self, write: impl FnOnce(&mut String)) {
        let mut line = String::with_capacity(96);
        let ms = self.now_ms().to_string();
        for _ in ms.len()..8 {
            line.push(' ');
        }
        line.push_str(&ms);
        line.push(' ');
        write(&mut line);
        if self.live_trace {
            eprintln!("{line}");
        }
        // Eight bytes at a time (byte by byte, the hash was 1% of a run); each line ends the
        // same way, so two traces hash alike only if their lines do.
        let mut h = self.trace_hash;
        let words = line.as_bytes().chunks_exact(8);
        let rest = words.remainder();
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        let last = (!rest.is_empty()).then_some(last);
        for word in words
            .map(|w| <[u8; 8]>::try_from(w).unwrap_or_default())
            .chain(last)
        {
            h = (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
        self.trace_hash =
            (h.rotate_left(5) ^ line.len() as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
        if self.tail.len() == TRACE_TAIL {
            self.tail.pop_front();
        }
        if let Some(f) = &mut self.full {
            f.push(line.clone());
        }
        self.tail.push_back(line);
    }

    /// Counts a tree call at this simulated instant: true at the call that makes it
    /// [`STILL_CALLS`], when the run is marked halted and a violation says so.
    fn clock_stands_still(&mut self) -> bool {
        let now = self.now_ms();
        if self.still.0 != now {
            self.still = (now, 0);
        }
        self.still.1 += 1;
        if self.still.1 != STILL_CALLS || self.halted {
            return false;
        }
        self.halted = true;
        self.violation(format!(
            "the simulated clock stood still at {now} ms for {STILL_CALLS} tree calls: \
             something loops without ever waiting (the run was ended there)"
        ));
        true
    }

    pub fn violation(&mut self, what: String) {
        self.trace(format!("VIOLATION {what}"));
        self.violations.push(what);
    }

    fn draw(&self) -> f64 {
        self.rng.unit()
    }

    fn new_session(&mut self) -> u64 {
        self.next_session += 1;
        self.live.insert(self.next_session);
        self.next_session
    }

    /// Fires the watches a change of `path` triggers (`created_or_deleted`: its parent's
    /// children changed too), late when faults are on.
    fn fire(&mut self, path: &str, created_or_deleted: bool) {
        let gap = self.faults.as_ref().map_or(0.0, |f| f.feed_gap);
        let mut feeds = std::mem::take(&mut self.feeds);
        let mut gaps = Vec::new();
        feeds.retain_mut(|f| {
            if !f.prefixes.iter().any(|p| is_under(path, p)) {
                return true;
            }
            if f.gap == 0 && gap > 0.0 && self.draw() < gap {
                f.gap = 1 + self.rng.below(20) as u32;
                gaps.push((f.handle, f.gap));
            }
            if f.gap > 0 {
                f.gap -= 1;
                return f.gap > 0 || f.tx.send(Change::Lost).is_ok();
            }
            f.tx.send(Change::Node(path.to_string())).is_ok()
        });
        self.feeds = feeds;
        for (handle, n) in gaps {
            self.trace(format!(
                "change feed of handle {handle}: a gap of {n} changes"
            ));
        }
        let mut fired = self.watches[kind_index(WatchKind::Data)]
            .remove(path)
            .unwrap_or_default();
        if created_or_deleted {
            let parent = split_path(path).0;
            fired.extend(
                self.watches[kind_index(WatchKind::Children)]
                    .remove(parent)
                    .unwrap_or_default(),
            );
        }
        fired.sort_by_key(|w| w.seq);
        for w in fired {
            self.deliver(w.tx);
        }
    }

    fn deliver(&mut self, tx: oneshot::Sender<()>) {
        let delay = match &self.faults {
            Some(f) if f.watch_delay_max_ms > 0 => {
                (self.draw() * f.watch_delay_max_ms as f64) as u64
            }
            _ => 0,
        };
        if delay == 0 {
            let _ = tx.send(());
        } else {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                let _ = tx.send(());
            });
        }
    }

    /// Ends `session` as an expiry does: its ephemeral nodes go, and its watches fire.
    pub fn expire(&mut self, session: u64) {
        if !self.live.remove(&session) {
            return;
        }
        let mut owned = self.mem.owned_by(session);
        owned.sort();
        for p in owned {
            self.mem.remove(&p);
            self.fire(&p, true);
        }
        let mut mine = Vec::new();
        for map in &mut self.watches {
            for list in map.values_mut() {
                let (m, rest): (Vec<_>, Vec<_>) = std::mem::take(list)
                    .into_iter()
                    .partition(|w| w.session == session);
                mine.extend(m);
                *list = rest;
            }
            map.retain(|_, l| !l.is_empty());
        }
        mine.sort_by_key(|w| w.seq);
        for w in mine {
            self.deliver(w.tx);
        }
        self.trace(format!("session {session} expired"));
    }

    pub fn is_live(&self, session: u64) -> bool {
        self.live.contains(&session)
    }
}

/// The shared world of one simulation run.
pub struct World {
    st: Mutex<State>,
    /// Told once the simulated clock stood still for [`STILL_CALLS`] calls: the run ends
    /// there (see [`World::halted`]).
    halt: tokio::sync::Notify,
}

/// Tree calls at one simulated instant past which a run is taken to loop without ever
/// waiting (a livelock: the clock moves only when every process waits). A whole seed makes
/// some tens of thousands of calls (seed 2: 38,817 in all, `LADING_SIM_CALLS=1`).
pub const STILL_CALLS: u64 = 200_000;

thread_local! {
    /// Where the runs on this thread count their commits, once [`count_commits_into`] said
    /// (a run's tree lives on the one thread of its runtime).
    static COMMITS: std::cell::OnceCell<Arc<AtomicU64>> = const { std::cell::OnceCell::new() };
}

/// Counts the commits on every simulated tree of the runs on this thread into `count`: what
/// `lading-sim`'s stall monitor watches, thread by thread, for a run stuck where no tree call
/// comes. Once per thread; a later call changes nothing.
pub fn count_commits_into(count: Arc<AtomicU64>) {
    COMMITS.with(|c| {
        let _ = c.set(count);
    });
}

impl World {
    pub fn new(seed: u64, faults: Option<Faults>, full_trace: bool) -> Arc<World> {
        let mut mem = Mem::default();
        mem.put(Arc::from("/"), MemNode::new(None, 0, 0));
        Arc::new(World {
            st: Mutex::new(State {
                mem,
                live: BTreeSet::new(),
                next_session: 0,
                watches: Default::default(),
                watches_set: 0,
                feeds: Vec::new(),
                next_tree: 0,
                faults,
                rng: Seeded::new(seed ^ 0x7472_6565),
                start: tokio::time::Instant::now(),
                commits: 0,
                accepts: Default::default(),
                retention_ms: u64::MAX,
                violations: Vec::new(),
                purged_from: BTreeSet::new(),
                trace_hash: 0xcbf2_9ce4_8422_2325,
                tail: VecDeque::new(),
                full: full_trace.then(Vec::new),
                live_trace: std::env::var_os("LADING_SIM_LIVE").is_some(),
                still: (0, 0),
                halted: false,
            }),
            halt: tokio::sync::Notify::new(),
        })
    }

    /// Ready once the run was halted: its clock stood still for [`STILL_CALLS`] tree calls
    /// (a violation says when). From then on every tree call waits for good, so whatever
    /// looped stops and the run can end.
    pub async fn halted(&self) {
        self.halt.notified().await
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new session, as a process connecting.
    pub fn connect(self: &Arc<Self>, name: &str) -> Arc<SimTree> {
        let (session, id) = {
            let mut st = self.lock();
            st.next_tree += 1;
            (st.new_session(), st.next_tree)
        };
        Arc::new(SimTree {
            id,
            world: self.clone(),
            name: name.to_string(),
            session: AtomicU64::new(session),
            dead: AtomicBool::new(false),
            paused: Mutex::new(None),
        })
    }
}

/// One process's session on the simulated tree.
pub struct SimTree {
    /// Which handle this is (its feeds end when it is closed).
    id: u64,
    world: Arc<World>,
    name: String,
    session: AtomicU64,
    /// The process crashed: its calls never reach the tree again.
    dead: AtomicBool,
    /// The process is stalled until then.
    paused: Mutex<Option<tokio::time::Instant>>,
}

/// `LADING_SIM_CALLS=1`: every tree call counted by kind and path (ids as `*`), printed when
/// the run ends (where a seed's time goes).
pub static CALLS: std::sync::LazyLock<Option<Mutex<BTreeMap<String, u64>>>> =
    std::sync::LazyLock::new(|| std::env::var_os("LADING_SIM_CALLS").map(|_| Mutex::default()));

fn count(kind: &str, path: &str) {
    if let Some(m) = &*CALLS {
        let shape: Vec<&str> = path
            .split('/')
            .map(|seg| {
                if seg.bytes().any(|b| b.is_ascii_digit()) {
                    "*"
                } else {
                    seg
                }
            })
            .collect();
        let mut key = format!("{kind} {}", shape.join("/"));
        if let Some(pat) = std::env::var_os("LADING_SIM_CALLERS")
            && key.contains(pat.to_str().unwrap_or(""))
        {
            let bt = std::backtrace::Backtrace::force_capture().to_string();
            let frames: Vec<&str> = bt
                .lines()
                .filter(|l| l.contains(" lading_") && !l.contains("lading_sim::tree"))
                .map(|l| l.trim())
                .take(5)
                .collect();
            key = format!("{key} <= {}", frames.join(" < "));
        }
        *m.lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default() += 1;
    }
}

/// Gives every other ready task its turn, once: the caller goes to the back of the run
/// queue. (`tokio::task::yield_now` also waits for the runtime's driver to be polled, a
/// fifth of a seed's time when every tree call yielded.)
fn turn() -> impl Future<Output = ()> {
    let mut yielded = false;
    std::future::poll_fn(move |cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
}

impl SimTree {
    /// The process is gone; its session lives on until it expires.
    pub fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    /// Every call of the process waits until `until` (a GC pause, a stopped VM).
    pub fn pause_until(&self, until: tokio::time::Instant) {
        *self.paused.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
    }

    pub fn world(&self) -> &Arc<World> {
        &self.world
    }

    /// Before each call: a paused process waits, a dead one fails, a slow call waits, and
    /// an expired session fails once and is replaced.
    /// The tree comes back locked, as the call finds it.
    async fn enter(&self, read: bool) -> Result<MutexGuard<'_, State>, TreeError> {
        // A round trip: every other ready process gets its turn.
        turn().await;
        let until = *self.paused.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
        let slow = {
            let st = self.world.lock();
            match &st.faults {
                Some(f) if st.draw() < f.slow => (st.draw() * f.slow_max_ms as f64) as u64,
                _ => 0,
            }
        };
        if slow > 0 {
            tokio::time::sleep(Duration::from_millis(slow)).await;
        }
        let halted = {
            let mut st = self.world.lock();
            if st.clock_stands_still() {
                // `notify_one` keeps the wake-up for a driver not yet waiting on it.
                self.world.halt.notify_one();
            }
            st.halted
        };
        if halted {
            return std::future::pending().await;
        }
        let mut st = self.world.lock();
        if self.dead.load(Ordering::SeqCst) {
            return Err(TreeError::ConnectionLoss(format!("{} is down", self.name)));
        }
        let s = self.session.load(Ordering::SeqCst);
        if !st.is_live(s) {
            let n = st.new_session();
            self.session.store(n, Ordering::SeqCst);
            st.trace(format!("{} session {s} -> {n}", self.name));
            return Err(TreeError::SessionExpired);
        }
        if read && st.faults.as_ref().is_some_and(|f| st.draw() < f.read_loss) {
            return Err(TreeError::ConnectionLoss(
                "a read was lost (simulated)".into(),
            ));
        }
        Ok(st)
    }

    /// Applies `ops` all or nothing, fires the watches, checks the invariants, traces.
    /// A commit's trace line, `NAME sSESSION[how] [ops]`, written at the end of `l`.
    fn commit_line(&self, l: &mut String, session: u64, how: &str, ops: &[Op]) {
        l.push_str(&self.name);
        l.push_str(" s");
        l.push_str(&session.to_string());
        l.push_str(how);
        l.push_str(" [");
        push_short(l, ops);
        l.push(']');
    }

    fn apply(&self, st: &mut State, ops: &[Op], session: u64) -> Result<Vec<OpResult>, TreeError> {
        let probe = check::before_commit(&st.mem, ops);
        let now = st.now_ms();
        // Nodes' times are the wall clock's, as ZooKeeper's are (the processes' clock).
        let clock_ms = EPOCH_MS + now;
        let mut ov = Overlay::default();
        let results = match ov.apply_multi(&st.mem, ops, session, clock_ms) {
            Ok(r) => r,
            Err(e) => {
                st.trace_with(|l| {
                    self.commit_line(l, session, " refused", ops);
                    l.push_str(": ");
                    l.push_str(&e.to_string());
                });
                return Err(e);
            }
        };
        let mut changed: Vec<(String, bool)> = ov
            .changed
            .iter()
            .map(|(p, n)| (p.to_string(), st.mem.get(p).is_some() != n.is_some()))
            .collect();
        changed.sort();
        ov.apply_to(&mut st.mem);
        st.commits += 1;
        COMMITS.with(|c| c.get().map(|n| n.fetch_add(1, Ordering::Relaxed)));
        let deletes = || ops.iter().filter(|o| matches!(o, Op::Delete { .. }));
        if deletes().any(|o| o.path().starts_with("/jobs/") && o.path().ends_with("/status")) {
            for o in deletes() {
                let parts: Vec<&str> = o.path().split('/').skip(1).collect();
                if let ["batches", bid, "states", _, _] = parts[..] {
                    st.purged_from.insert(bid.to_string());
                }
            }
        }
        st.trace_with(|l| self.commit_line(l, session, "", ops));
        for (p, created_or_deleted) in &changed {
            st.fire(p, *created_or_deleted);
        }
        let retention_ms = st.retention_ms;
        for v in check::after_commit(
            &st.mem,
            session,
            ops,
            &probe,
            clock_ms,
            retention_ms,
            &mut st.accepts,
        ) {
            st.violation(format!("{v} (commit by {} s{session})", self.name));
        }
        Ok(results)
    }
}

fn node_of(n: &MemNode) -> Node {
    Node {
        data: n.data.clone(),
        stat: n.stat(),
    }
}

/// `create PATH, set PATH, …`: a `multi` in a trace line (one string, built in place: every
/// commit writes one).
fn short(ops: &[Op]) -> String {
    let mut out = String::with_capacity(ops.iter().map(|o| o.path().len() + 9).sum());
    push_short(&mut out, ops);
    out
}

/// [`short`], written at the end of `out`.
fn push_short(out: &mut String, ops: &[Op]) {
    for (i, o) in ops.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(match o {
            Op::Check { .. } => "check ",
            Op::Create { .. } => "create ",
            Op::Set { .. } => "set ",
            Op::Delete { .. } => "delete ",
        });
        out.push_str(o.path());
    }
}

impl SimTree {
    /// [`Tree::multi`], on `on`'s session only when given (checked as the call reaches the
    /// tree, as a backend checks it where it commits).
    fn multi_at(&self, on: Option<u64>, ops: Vec<Op>) -> TreeFuture<'_, Vec<OpResult>> {
        Box::pin(async move {
            validate_ops(&ops)?;
            if CALLS.is_some() {
                count(
                    if on.is_some() { "multi_on" } else { "multi" },
                    &short(&ops),
                );
            }
            let mut st = self.enter(false).await?;
            let session = self.session_id();
            if on.is_some_and(|s| s != session) {
                return Err(TreeError::SessionExpired);
            }
            let fault = match &st.faults {
                Some(f) => {
                    let d = st.draw();
                    let edges = [
                        f.loss_before,
                        f.loss_after,
                        f.gave_up_before,
                        f.gave_up_after,
                    ];
                    let mut acc = 0.0;
                    edges.iter().position(|e| {
                        acc += e;
                        d < acc
                    })
                }
                None => None,
            };
            let result = match fault {
                // The reply was lost: resolved as the ZooKeeper backend resolves it, by reading
                // the witness back on the same session, and sending again if not applied.
                Some(0) => {
                    st.trace(format!(
                        "{} s{session} reply lost before the commit",
                        self.name
                    ));
                    self.apply(&mut st, &ops, session)
                }
                Some(1) => {
                    let first = self.apply(&mut st, &ops, session);
                    let applied = first.is_ok()
                        && lading_core::tree::lost_reply_witness(&ops).is_some_and(|w| {
                            let n = st.mem.get(w.path()).map(node_of);
                            lading_core::tree::lost_reply_applied(w, n.as_ref(), session)
                        });
                    st.trace(format!(
                        "{} s{session} reply lost after the commit; read back: {}",
                        self.name,
                        if applied { "applied" } else { "sent again" }
                    ));
                    if applied {
                        first
                    } else {
                        self.apply(&mut st, &ops, session)
                    }
                }
                // The backend gave up (the connection stayed down through its retries): the
                // caller cannot tell whether it was applied.
                Some(2) => {
                    st.trace(format!(
                        "{} s{session} gave up, not applied [{}]",
                        self.name,
                        short(&ops)
                    ));
                    Err(TreeError::ConnectionLoss(
                        "the connection stayed down (simulated)".into(),
                    ))
                }
                Some(3) => {
                    let _ = self.apply(&mut st, &ops, session);
                    st.trace(format!("{} s{session} gave up after the commit", self.name));
                    Err(TreeError::ConnectionLoss(
                        "the connection stayed down (simulated)".into(),
                    ))
                }
                _ => self.apply(&mut st, &ops, session),
            };
            // Refused by the tree's checks (a lock held, a version moved), not lost to a fault.
            if CALLS.is_some() && matches!(result, Err(TreeError::Multi { .. })) {
                count("refused", &short(&ops));
            }
            result
        })
    }
}

impl Tree for SimTree {
    fn kind(&self) -> &'static str {
        "sim"
    }

    fn session_id(&self) -> u64 {
        self.session.load(Ordering::SeqCst)
    }

    fn get<'a>(&'a self, path: &'a str) -> TreeFuture<'a, Option<Node>> {
        Box::pin(async move {
            count("get", path);
            validate_path(path)?;
            let st = self.enter(true).await?;
            Ok(st.mem.get(path).map(node_of))
        })
    }

    fn get_many<'a>(&'a self, paths: &'a [String]) -> TreeFuture<'a, Vec<Option<Node>>> {
        Box::pin(async move {
            for p in paths {
                count("get_many", p);
            }
            for p in paths {
                validate_path(p)?;
            }
            let st = self.enter(true).await?;
            Ok(paths.iter().map(|p| st.mem.get(p).map(node_of)).collect())
        })
    }

    fn children<'a>(&'a self, path: &'a str) -> Names<'a> {
        Box::pin(async move {
            count("children", path);
            validate_path(path)?;
            let st = self.enter(true).await?;
            st.mem
                .children(path)
                .map(|c| c.cloned().collect())
                .ok_or_else(|| TreeError::NoNode(path.into()))
        })
    }

    fn children_page<'a>(&'a self, path: &'a str, after: Option<&'a str>, max: usize) -> Names<'a> {
        Box::pin(async move {
            count("children_page", path);
            validate_path(path)?;
            let st = self.enter(true).await?;
            st.mem
                .children_page(path, after, max)
                .ok_or_else(|| TreeError::NoNode(path.into()))
        })
    }

    fn count_children<'a>(&'a self, path: &'a str) -> TreeFuture<'a, u64> {
        Box::pin(async move {
            count("count_children", path);
            validate_path(path)?;
            let st = self.enter(true).await?;
            st.mem
                .count_children(path)
                .ok_or_else(|| TreeError::NoNode(path.into()))
        })
    }

    fn multi(&self, ops: Vec<Op>) -> TreeFuture<'_, Vec<OpResult>> {
        self.multi_at(None, ops)
    }

    fn multi_on(&self, session: u64, ops: Vec<Op>) -> TreeFuture<'_, Vec<OpResult>> {
        self.multi_at(Some(session), ops)
    }

    fn watch<'a>(&'a self, path: &'a str, kind: WatchKind) -> TreeFuture<'a, Watch> {
        Box::pin(async move {
            count("watch", path);
            let mut st = self.enter(true).await?;
            let (tx, rx) = oneshot::channel();
            let session = self.session_id();
            st.watches_set += 1;
            let seq = st.watches_set;
            if seq.is_multiple_of(WATCH_SWEEP) {
                for map in &mut st.watches {
                    for list in map.values_mut() {
                        list.retain(|w| !w.tx.is_closed());
                    }
                    map.retain(|_, l| !l.is_empty());
                }
            }
            let waiting = Waiting { seq, session, tx };
            let map = &mut st.watches[kind_index(kind)];
            match map.get_mut(path) {
                Some(list) => list.push(waiting),
                None => {
                    map.insert(path.to_string(), vec![waiting]);
                }
            }
            Ok(Watch::new(async move {
                let _ = rx.await;
            }))
        })
    }

    fn close(&self) -> TreeFuture<'_, ()> {
        Box::pin(async move {
            let s = self.session_id();
            let mut st = self.world.lock();
            st.expire(s);
            st.feeds.retain(|f| f.handle != self.id);
            self.dead.store(true, Ordering::SeqCst);
            Ok(())
        })
    }

    /// Reads are round trips here, as on ZooKeeper (the deployment several processes on one
    /// tree stand for): the engine takes ZooKeeper's read paths (a lease read with the job's
    /// whole record, the next job's record read beside the move that locks it).
    fn local_reads(&self) -> bool {
        false
    }

    fn changes<'a>(&'a self, prefixes: &'a [String]) -> Changes<'a> {
        Box::pin(async move {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            self.world.lock().feeds.push(Feeding {
                handle: self.id,
                prefixes: prefixes.to_vec(),
                tx,
                gap: 0,
            });
            Ok(Some(Box::new(Feed {
                rx,
                world: self.world.clone(),
            }) as Box<dyn ChangeFeed>))
        })
    }
}

/// A change feed on the simulated tree: every change under its prefixes, in commit order.
struct Feed {
    rx: tokio::sync::mpsc::UnboundedReceiver<Change>,
    world: Arc<World>,
}

impl ChangeFeed for Feed {
    fn next(&mut self) -> BoxFuture<'_, Option<Change>> {
        Box::pin(self.rx.recv())
    }

    fn get_many<'a>(&'a self, paths: &'a [String]) -> TreeFuture<'a, Vec<Option<Node>>> {
        Box::pin(async move {
            let st = self.world.lock();
            Ok(paths.iter().map(|p| st.mem.get(p).map(node_of)).collect())
        })
    }

    fn children<'a>(&'a self, path: &'a str) -> Names<'a> {
        Box::pin(async move {
            let st = self.world.lock();
            st.mem
                .children(path)
                .map(|c| c.cloned().collect())
                .ok_or_else(|| TreeError::NoNode(path.into()))
        })
    }
}
