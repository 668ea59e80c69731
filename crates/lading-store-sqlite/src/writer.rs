//! The writer thread: `multi`s applied to the in-memory tree and committed in groups, the syncer that makes each group durable before its callers are answered, and the checkpointer.

use super::*;

pub(crate) struct Writer {
    pub(crate) conn: Connection,
    pub(crate) shared: Arc<Shared>,
    /// Where committed groups go to be made durable and answered.
    pub(crate) to_syncer: mpsc::Sender<Committed>,
    /// The last change-log entry this writer made or folded in.
    pub(crate) last_seq: i64,
    /// The last entry this writer knows the `nodes` table reflects (another process may have
    /// gone further).
    pub(crate) applied: i64,
    /// Bring the `nodes` table up to date after this group (asked for, or closing).
    pub(crate) materialize: bool,
    /// The materialization under way, written a slice per round (`fold.rs`).
    pub(crate) fold: Option<fold::Fold>,
    /// Rows of the next fold being worked out on a thread of their own.
    pub(crate) preparing: Option<mpsc::Receiver<fold::Prepared>>,
    /// The images a materialization folds together (kept between rounds for its memory).
    pub(crate) folded: log::Coalesced,
    /// The change-log entry being written (kept between commits for its memory).
    pub(crate) body: Vec<u8>,
    /// This writer's own commits since the table was last brought up to date, while they
    /// are all the log holds after it: materialized from memory, without reading the log
    /// back. `None` once another process's commit came between (then the log is read).
    pub(crate) recent: Option<Recent>,
    /// Wakes the checkpointer (a full channel means it is already awake).
    pub(crate) checkpointer: mpsc::SyncSender<()>,
    /// Commits since the checkpointer was last woken, and since the WAL last started over.
    pub(crate) since_checkpoint: u32,
    pub(crate) since_restart: u32,
    /// Bytes this writer committed since the WAL last started over, of the log and of the
    /// nodes table: each reached the WAL, so their pages count its frames without waiting on
    /// the checkpointer's report (a checkpointer starved of CPU reported none, and the WAL
    /// grew to twice its bound under a steady stream of large commits).
    pub(crate) logged_since_restart: u64,
    /// The log bytes at which the writer tries to start the WAL over (on its own count).
    pub(crate) restart_after: u64,
}

/// The database's page size (SQLite's default, which the store keeps): a WAL frame holds one.
const WAL_PAGE: u64 = 4096;
/// The log bytes after which the writer starts the WAL over on its own count: as many pages
/// as [`WAL_RESTART_FRAMES`].
pub(crate) const LOG_RESTART: u64 = WAL_RESTART_FRAMES as u64 * WAL_PAGE;

/// See [`Writer::recent`].
pub(crate) struct Recent {
    /// The table's `applied` these commits follow.
    pub(crate) from: i64,
    /// Each commit: its log entry, its overlay (frozen), and for each of the overlay's
    /// changes in its order whether the node existed before the commit.
    pub(crate) commits: Vec<(i64, Arc<Overlay>, Vec<bool>)>,
}

impl Recent {
    /// Records a commit when it follows the last one directly.
    fn push(&mut self, seq: i64, overlay: Arc<Overlay>, existed: Vec<bool>) -> bool {
        let last = self.commits.last().map_or(self.from, |c| c.0);
        // Bounded: a table that cannot be brought up to date does not pin every overlay.
        if seq != last + 1 || self.commits.len() >= 4 * MATERIALIZE_AFTER as usize {
            return false;
        }
        self.commits.push((seq, overlay, existed));
        true
    }
}

pub(crate) enum Done {
    Open,
    Closed,
}

/// A group the writer committed, on its way to the syncer: made durable, folded into memory,
/// then answered, in commit order.
pub(crate) struct Committed {
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
    pub(crate) fn run(mut self, rx: mpsc::Receiver<Req>) {
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
            let begin = self.materialize || idle || backlog >= opts.materialize_after;
            self.materialize = false;
            let caught_up = match done {
                Done::Closed => Some(self.materialize_all()),
                Done::Open if begin || self.fold.is_some() || self.preparing.is_some() => {
                    Some(self.materialize_slice(opts.materialize_slice, false))
                }
                Done::Open => None,
            };
            if let Some(Err(e)) = caught_up {
                let _ = self.conn.execute_batch("ROLLBACK");
                // The log keeps everything; try again after as many commits again.
                self.fold = None;
                self.recent = None;
                self.applied = self.last_seq;
                tracing::warn!(error = %e, "could not bring the nodes table up to date");
            }
            if self.shared.wal_frames.load(Ordering::Relaxed) >= WAL_RESTART_FRAMES
                || self.logged_since_restart >= self.restart_after
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
    pub(crate) fn restart_wal(&mut self) {
        let t = std::time::Instant::now();
        let mut r = checkpoint(&self.conn);
        // Past its bound on the writer's own count, which comes only after the checkpointer's
        // when that one keeps up (the count is a floor: pages hold less than a page of data):
        // a checkpointer starved of CPU holds the checkpoint while the commits go on, and the
        // writer waits for it, up to a second, rather than let the WAL grow on. Commits wait
        // meanwhile.
        let mut waited = 0;
        while matches!(&r, Ok((busy, frames, copied)) if *busy || frames != copied)
            && self.logged_since_restart >= LOG_RESTART
            && waited < 1000
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
            waited += 1;
            r = checkpoint(&self.conn);
        }
        match r {
            Ok((false, frames, copied)) if frames == copied => {
                self.since_restart = 0;
                self.logged_since_restart = 0;
                self.restart_after = LOG_RESTART;
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
                // And after some more pages of log, whatever the checkpointer reports.
                self.restart_after = self.logged_since_restart + CHECKPOINT_EVERY as u64 * WAL_PAGE;
            }
            Err(e) => {
                self.since_restart = 0;
                self.logged_since_restart = 0;
                self.restart_after = LOG_RESTART;
                tracing::warn!(error = %e, "could not checkpoint the WAL");
            }
        }
    }

    /// Removes a session and its ephemeral nodes (into the overlay).
    pub(crate) fn drop_session(
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

    /// Whether this process's session is live; one that lapsed (or another process reaped)
    /// is dropped with its ephemerals (into `ov`) and a new one opened, and false is
    /// returned: every multi of this group fails, later requests run under the new session.
    fn session_live(
        &self,
        ov: &mut Overlay,
        base: &dyn mem::Below,
        now: u64,
    ) -> rusqlite::Result<bool> {
        let shared = &self.shared;
        let session = shared.session.load(Ordering::SeqCst);
        let live = self
            .conn
            .prepare_cached("SELECT 1 FROM sessions WHERE id = ?1 AND expires_ms >= ?2")?
            .exists(params![session as i64, now as i64])?;
        if !live {
            self.drop_session(ov, base, session)?;
            let fresh = new_session(&self.conn, &shared.opts)?;
            shared.session.store(fresh, Ordering::SeqCst);
            tracing::warn!(
                old = session,
                new = fresh,
                "session expired; opened a new one"
            );
        }
        Ok(live)
    }

    /// Hands a committed group to the syncer, which answers it once it is durable (or, gone
    /// at shutdown, answers here).
    fn hand_to_syncer(&self, item: Committed) {
        if let Err(mpsc::SendError(item)) = self.to_syncer.send(item) {
            for (reply, _) in item.replies {
                let _ = reply.send(Err(TreeError::Backend("store handle is closing".into())));
            }
        }
    }

    /// Writes the group's change-log entry (encoded in `self.body`) and commits, entering the
    /// pending queue in the same step; the entry's sequence number and the overlay committed
    /// (taken from `ov`). `existed`: whether each change's node was in the file before.
    fn log_and_commit(
        &mut self,
        ov: &mut Overlay,
        existed: Vec<bool>,
    ) -> rusqlite::Result<(i64, Arc<Overlay>)> {
        self.conn
            .prepare_cached("INSERT INTO changes(body) VALUES (?1)")?
            .execute([&self.body[..]])?;
        if self.body.capacity() > 4 << 20 {
            // One huge group does not pin its memory.
            self.body = Vec::new();
        }
        let seq = self.conn.last_insert_rowid();
        // Commit and enter the pending queue as one step for readers: a reader folding in
        // the change log must never see our row committed but not yet pending (it would
        // take an un-fsynced change into memory, and the syncer would later re-apply it
        // out of order).
        let committed = Arc::new(std::mem::take(ov));
        let sync_guard = lock(&self.shared.sync);
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        self.last_seq = seq;
        if let Some(r) = &mut self.recent
            && !r.push(seq, committed.clone(), existed)
        {
            self.recent = None;
        }
        lock(&self.shared.pending)
            .groups
            .push_back((seq, committed.clone()));
        drop(sync_guard);
        // Counted before anyone is answered: whoever learns of this commit finds the
        // counter moved.
        if let Err(e) = self.shared.counter.count_own() {
            tracing::warn!(error = %e, "could not count a commit; other processes will see it at their next poll");
        }
        Ok((seq, committed))
    }

    /// Applies one group in one transaction and hands it to the syncer.
    pub(crate) fn apply_group(&mut self, group: Vec<Req>) -> Done {
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
            return refuse_all(group, &why);
        }
        shared.wait_pending(|n| n < MAX_PENDING);

        let result = (|| -> rusqlite::Result<Option<i64>> {
            self.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
            // Did another process commit since our last group? Then fold that in first, in
            // order: our own pending groups go before it.
            if last_change(&self.conn)?.1 > self.last_seq {
                // The log now holds others' changes: the next materialization reads it.
                self.recent = None;
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
            let mut session_ok = self.session_live(&mut ov, &base, now)?;
            let session = shared.session.load(Ordering::SeqCst);
            for req in group {
                match req {
                    Req::Multi(ops, on, reply) => {
                        let r = if session_ok && on.is_none_or(|s| s == session) {
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
            let writes: Vec<(&str, Option<&MemNode>, bool)> = ov
                .changed
                .iter()
                .map(|(p, n)| (&**p, n.as_ref(), base.get(p).is_some()))
                .collect();
            needs_sync = !only_ephemeral(&ov, &base);
            drop(mem_guard);
            // A lock made and dropped within the group is in neither the file nor the log.
            let existed: Vec<bool> = match self.recent {
                Some(_) => writes.iter().map(|w| w.2).collect(),
                None => Vec::new(),
            };
            let body = &mut self.body;
            log::encode_into(
                body,
                writes
                    .into_iter()
                    .filter(|(_, node, existed)| node.is_some() || *existed),
            );
            if body.len() == 1 {
                self.conn.prepare_cached("COMMIT")?.execute([])?;
                return Ok(None);
            }
            self.logged_since_restart += body.len() as u64;
            let (seq, committed) = self.log_and_commit(&mut ov, existed)?;
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
                let overlay = pending_overlay
                    .take()
                    .unwrap_or_else(|| Arc::new(std::mem::take(&mut ov)));
                self.hand_to_syncer(Committed {
                    seq,
                    needs_sync: needs_sync && seq.is_some(),
                    overlay,
                    synced,
                    replies,
                    after,
                    close,
                });
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                tracing::error!(error = %e, "group commit failed");
                failed(&e, replies, after, close);
            }
        }
        if closing { Done::Closed } else { Done::Open }
    }
}

/// Answers a group the store can no longer write (`why`: what poisoned it).
fn refuse_all(group: Vec<Req>, why: &str) -> Done {
    for req in group {
        match req {
            Req::Multi(_, _, reply) => {
                let _ = reply.send(Err(TreeError::Backend(why.to_string())));
            }
            Req::Expire(done) => {
                let _ = done.send(());
            }
            Req::Close(done) => {
                let _ = done.send(Err(TreeError::Backend(why.to_string())));
                return Done::Closed;
            }
            Req::Heartbeat | Req::Reap | Req::Materialize => {}
        }
    }
    Done::Open
}

/// Answers a group whose commit failed with `e`: each multi that would have applied fails
/// with it (one refused says why it was), waiters are let go, a close fails.
fn failed(
    e: &rusqlite::Error,
    replies: Vec<(Reply, Result<Vec<OpResult>, TreeError>)>,
    after: Vec<oneshot::Sender<()>>,
    close: Option<oneshot::Sender<Result<(), TreeError>>>,
) {
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

/// Whether every node the overlay changes is ephemeral, before and after. Such a group is
/// committed but not fsynced before it is answered, which is safe because of what ephemeral
/// nodes are: it can only be lost with the machine (a process crash loses nothing the kernel
/// holds), and then every session that could own or have seen those nodes is dead, so the
/// tree after restart is the one reaping those sessions would leave anyway. Anything durable
/// that was decided after seeing the group comes later in the WAL, and its fsync covers the
/// group too. A lease is taken this way with no fsync; the transition that ends it has one.
pub(crate) fn only_ephemeral(ov: &Overlay, base: &dyn Below) -> bool {
    ov.changed.iter().all(|(p, n)| {
        n.as_ref().is_none_or(|n| n.owner != 0) && base.get(p).is_none_or(|n| n.owner != 0)
    })
}

/// A passive checkpoint on `conn`: whether another checkpoint was under way, the frames in the
/// WAL, and how many of them are now copied into the database file.
pub(crate) fn checkpoint(conn: &Connection) -> rusqlite::Result<(bool, i64, i64)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get::<_, i64>(0)? != 0, r.get(1)?, r.get(2)?))
    })
}

/// Copies the WAL into the database file in the background whenever the writer says it has
/// grown, without holding up commits (a passive checkpoint takes no lock a writer needs), and
/// in the second half of the WAL's life, makes what it copied durable with an `fdatasync`
/// of the file.
///
/// SQLite syncs the file only after a checkpoint that found no frame added while it copied,
/// which under a steady load is never the case in the background: every page copied over a
/// whole WAL's life then waited for the writer's restart (the one checkpoint nothing runs
/// beside), whose sync took 70–140 ms on this machine's disk while no commit could be made —
/// the longest waits `lading bench jobs` saw. Synced here, the restart syncs only the pages
/// of its last stretch (5–15 ms). A sync more is never unsafe.
pub(crate) fn checkpointer(shared: Arc<Shared>, conn: Connection, wake: mpsc::Receiver<()>) {
    let mut file: Option<Arc<std::fs::File>> = None;
    while wake.recv().is_ok() {
        // The writer is to finish this round: stay out of its way (a checkpoint under way
        // would make its own find the WAL busy, and the WAL grow on).
        if shared.wal_frames.load(Ordering::Relaxed) >= WAL_RESTART_FRAMES {
            continue;
        }
        let t = std::time::Instant::now();
        match checkpoint(&conn) {
            Ok((_, frames, copied)) => {
                // In the second half of the WAL's life only: each sync competes with the
                // commits' own for the disk, and the few before the restart suffice.
                if copied > 0 && frames >= WAL_RESTART_FRAMES / 2 {
                    sync_database(&shared, &mut file);
                }
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

/// `fdatasync` of the database file. A failure is logged: SQLite's own sync at the restart
/// still comes before the WAL is reused, so nothing rests on this one.
fn sync_database(shared: &Shared, file: &mut Option<Arc<std::fs::File>>) {
    if file.is_none() {
        match database_file(&shared.path) {
            Ok(f) => *file = Some(f),
            Err(e) => {
                tracing::warn!(error = %e, "could not open the database file to sync it");
                return;
            }
        }
    }
    if let Some(f) = file
        && let Err(e) = f.sync_data()
    {
        tracing::warn!(error = %e, "could not sync the database file after a checkpoint");
    }
}

/// A descriptor of the database file at `path` for syncing it, opened once per process and
/// never closed: closing any descriptor of a file drops every POSIX lock the process holds on
/// it, SQLite's own among them (SQLite's "how to corrupt" §2.2.1), and a process may keep
/// other handles on the file open after one closes.
fn database_file(path: &Path) -> std::io::Result<Arc<std::fs::File>> {
    static OPEN: std::sync::OnceLock<
        Mutex<std::collections::HashMap<PathBuf, Arc<std::fs::File>>>,
    > = std::sync::OnceLock::new();
    let key = std::fs::canonicalize(path)?;
    let mut open = lock(OPEN.get_or_init(Default::default));
    if let Some(f) = open.get(&key) {
        return Ok(f.clone());
    }
    let f = Arc::new(std::fs::OpenOptions::new().write(true).open(&key)?);
    open.insert(key, f.clone());
    Ok(f)
}

/// Makes committed groups durable (one `fdatasync` of the WAL for all that are waiting), folds
/// them into memory in commit order, fires watches, and answers the callers.
pub(crate) fn syncer(shared: Arc<Shared>, rx: mpsc::Receiver<Committed>, durable: bool) {
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
