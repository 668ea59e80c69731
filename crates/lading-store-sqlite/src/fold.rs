//! Bringing the `nodes` table up to date with the change log ("materializing"), a slice of
//! rows at a time between two groups, so that no commit waits behind a whole
//! materialization (one of 10,000 rows took 20–45 ms, and every commit queued meanwhile
//! waited for it: the batched jobs bench's p99).
//!
//! A fold takes each node changed between the table's `applied` entry and the log entry it
//! brings the table to (`to`), with its last image, sorts them in the table's key order and
//! writes [`MATERIALIZE_SLICE`] of them per writer round, each slice its own transaction;
//! the last one moves `applied` to `to`. Which rows to write is worked out off the writer's
//! thread, from the writer's own recent commits in memory (a fold of 64 commits of the
//! jobs bench goes through ~50,000 changes to ~12,000 rows: 10–30 ms); the writer goes on
//! committing meanwhile and takes the rows up once they are ready. Only when another
//! process's commits came between does the writer read them from the log itself.
//! Rules that keep this safe:
//! - **A table ahead of `applied` loads right.** Between slices (and after a crash) some rows
//!   hold images newer than `applied`. Loading replays the log after `applied` over the rows,
//!   so each node changed since ends at its last image whatever its row held, and a node not
//!   changed since has the same image in every fold. The replay may meet a row's node out of
//!   order (a delete of a node whose row was already written anew), so the children index is
//!   rebuilt after it (`schema::full_load`). Guarded by
//!   `tests/log.rs::a_table_caught_up_in_part_loads_the_same_tree`.
//! - **A fold after one that did not finish deletes every node gone since `applied`**, even
//!   one made after it: the unfinished fold may have written its row. Guarded by
//!   `tests/log.rs::a_fold_after_an_unfinished_one_deletes_rows_it_left` (and
//!   `two_writers_in_turns_leave_a_table_that_matches_the_tree`, folds of a row or two).
//! - **No fold writes older images after a newer one began.** Several processes may fold
//!   the same file. Each fold records its `to` as `lading_meta.fold_to` when it begins (a fold
//!   always reaches the log's end, so `to` only grows), and each slice first checks that no
//!   later fold began; an overtaken fold stops, and the later one writes every row it would
//!   have. Guarded by `tests/log.rs::two_writers_in_turns_leave_a_table_that_matches_the_tree`
//!   (with slices of one row).

use super::*;
use std::time::Instant;

/// Rows a materialization under way writes per writer round (about 1 ms of SQLite's time).
pub const MATERIALIZE_SLICE: usize = 512;

/// A materialization under way.
pub(crate) struct Fold {
    /// The log entry the table is being brought to.
    to: i64,
    /// Each changed node's last image (`None`: the row goes), in the table's key order.
    rows: Vec<log::Row>,
    /// Rows written so far.
    next: usize,
    /// Time spent on it so far, in µs.
    us: u64,
}

/// A fold's rows, worked out by [`prepare`] off the writer's thread.
pub(crate) struct Prepared {
    /// The table's `applied` the rows start from, and the log entry they bring it to.
    from: i64,
    to: i64,
    /// Each row, and whether its node existed at `from` (a delete of one that did not is
    /// needed only when the table may be ahead).
    rows: Vec<(log::Row, bool)>,
}

impl Writer {
    /// Writes the next slice (at most `budget` rows) of the materialization under way,
    /// beginning one first when none is: from this writer's recent commits (handed to a
    /// thread of their own to fold; until they are ready, nothing happens here unless
    /// `wait`), or from the log. Without a fold to make (nothing changed, or a later one is
    /// under way elsewhere) it only looks.
    pub(crate) fn materialize_slice(&mut self, budget: usize, wait: bool) -> rusqlite::Result<()> {
        if self.fold.is_none() && self.preparing.is_none() {
            self.hand_off_recent();
        }
        let mut prepared = None;
        if self.fold.is_none()
            && let Some(rx) = self.preparing.take()
        {
            let got = if wait {
                rx.recv().map_err(|_| mpsc::TryRecvError::Disconnected)
            } else {
                rx.try_recv()
            };
            match got {
                Ok(p) => prepared = Some(p),
                Err(mpsc::TryRecvError::Empty) => {
                    self.preparing = Some(rx);
                    return Ok(());
                }
                // The folding thread died: the log has it all.
                Err(mpsc::TryRecvError::Disconnected) => self.recent = None,
            }
        }
        let t = Instant::now();
        self.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        if self.fold.is_none() {
            self.begin_fold(prepared)?;
        }
        let Some(mut fold) = self.fold.take() else {
            return self.conn.prepare_cached("COMMIT")?.execute([]).map(drop);
        };
        // A fold that began later writes newer images of every row this one would write.
        if fold_to(&self.conn)? > fold.to {
            return self.conn.prepare_cached("COMMIT")?.execute([]).map(drop);
        }
        let end = fold.next.saturating_add(budget).min(fold.rows.len());
        // What the table is written reaches the WAL too (see `Writer::logged_since_restart`).
        self.logged_since_restart += write_rows(&self.conn, &fold.rows[fold.next..end])?;
        let written = (end - fold.next) as u64;
        fold.next = end;
        let done = end == fold.rows.len();
        if done && applied(&self.conn)? < fold.to {
            self.conn
                .prepare_cached("UPDATE lading_meta SET value = ?1 WHERE key = 'applied'")?
                .execute([fold.to.to_string()])?;
            // Keep the newest entry always: sequence numbers must never be reused.
            self.conn
                .prepare_cached("DELETE FROM changes WHERE seq <= ?1")?
                .execute([(fold.to - CHANGES_KEPT).min(fold.to - 1)])?;
        }
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        let us = t.elapsed().as_micros() as u64;
        fold.us += us;
        let s = &self.shared;
        s.materialized_rows.fetch_add(written, Ordering::Relaxed);
        s.materialize_slices.fetch_add(1, Ordering::Relaxed);
        s.materialize_slice_max_us.fetch_max(us, Ordering::Relaxed);
        if done {
            self.applied = self.applied.max(fold.to);
            s.materializations.fetch_add(1, Ordering::Relaxed);
            s.materialize_us.fetch_add(fold.us, Ordering::Relaxed);
        } else {
            self.fold = Some(fold);
        }
        Ok(())
    }

    /// Brings the table all the way up to date (at close): the fold under way, then one of
    /// whatever came after it.
    pub(crate) fn materialize_all(&mut self) -> rusqlite::Result<()> {
        // A few rounds at most: the fold under way, a fold skipped for a later one elsewhere
        // (which turns this writer to the log), and the fold after them.
        for _ in 0..4 {
            if self.fold.is_none() && self.preparing.is_none() && self.last_seq <= self.applied {
                break;
            }
            self.materialize_slice(usize::MAX, true)?;
        }
        Ok(())
    }

    /// Hands this writer's recent commits to a thread that folds them into rows, when they
    /// are all the log holds after the table; commits from here on are recent after them.
    fn hand_off_recent(&mut self) {
        let usable =
            matches!(&self.recent, Some(r) if r.from == self.applied && !r.commits.is_empty());
        let Some(recent) = self.recent.take().filter(|_| usable) else {
            return;
        };
        let to = recent.commits.last().map_or(recent.from, |c| c.0);
        self.recent = Some(Recent {
            from: to,
            commits: Vec::new(),
        });
        let (tx, rx) = mpsc::sync_channel(1);
        let job = move || {
            let _ = tx.send(prepare(recent));
        };
        match std::thread::Builder::new()
            .name("lading-fold".into())
            .spawn(job)
        {
            Ok(_) => self.preparing = Some(rx),
            // No thread to be had: the next fold reads the log.
            Err(e) => {
                self.recent = None;
                tracing::warn!(error = %e, "could not start a thread to fold commits");
            }
        }
    }

    /// Makes the fold to write, inside the slice's transaction: from `prepared` (this
    /// writer's recent commits) when the table has not moved since, from the log after it
    /// when nothing was prepared.
    fn begin_fold(&mut self, prepared: Option<Prepared>) -> rusqlite::Result<()> {
        let from = applied(&self.conn)?;
        // A fold that began past `applied` and did not finish (overtaken, failed, or its
        // process died) may have written rows of nodes made since: a node made and gone
        // again within this fold then needs its delete too.
        let ahead = fold_to(&self.conn)? > from;
        let (to, rows) = match prepared {
            Some(p) if p.from == from => {
                let rows = (p.rows.into_iter())
                    .filter(|((_, node), existed)| node.is_some() || *existed || ahead)
                    .map(|(row, _)| row)
                    .collect();
                (p.to, rows)
            }
            // Another process brought the table further: the next fold reads the log.
            Some(_) => {
                self.recent = None;
                return Ok(());
            }
            None => {
                let mut to = from;
                let folded = &mut self.folded;
                each_change(&self.conn, from, |seq, entries| {
                    folded.add(entries);
                    to = seq;
                })?;
                let mut rows = folded.take_rows(ahead);
                sort_rows(&mut rows);
                // Commits after `to` can be folded from memory again.
                self.recent = Some(Recent {
                    from: to,
                    commits: Vec::new(),
                });
                (to, rows)
            }
        };
        if to <= from {
            self.applied = self.applied.max(from);
            return Ok(());
        }
        if fold_to(&self.conn)? > to {
            // Another process folds further: the next fold reads the log up to there.
            self.recent = None;
            return Ok(());
        }
        self.conn
            .prepare_cached(
                "INSERT INTO lading_meta(key, value) VALUES ('fold_to', ?1)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            )?
            .execute([to.to_string()])?;
        self.fold = Some(Fold {
            to,
            rows,
            next: 0,
            us: 0,
        });
        Ok(())
    }
}

/// Folds a writer's recent commits into rows: each node's last image (or its delete), in
/// the table's key order. A node made and dropped in between needs no row.
fn prepare(recent: Recent) -> Prepared {
    let mut to = recent.from;
    // Each node's last image, and whether it existed before the first change.
    let mut last: foldhash::HashMap<&str, (bool, Option<&MemNode>)> = Default::default();
    last.reserve(recent.commits.iter().map(|c| c.1.changed.len()).sum());
    for (seq, ov, existed) in &recent.commits {
        for ((p, n), e) in ov.changed.iter().zip(existed) {
            if n.is_none() && !e {
                continue; // made and dropped within the commit
            }
            last.entry(&**p)
                .and_modify(|s| s.1 = n.as_ref())
                .or_insert((*e, n.as_ref()));
        }
        to = *seq;
    }
    let mut rows: Vec<(log::Row, bool)> = last
        .into_iter()
        .map(|(p, (existed, node))| ((p.to_string(), node.cloned()), existed))
        .collect();
    rows.sort_unstable_by(|a, b| key(&a.0.0).cmp(&key(&b.0.0)));
    Prepared {
        from: recent.from,
        to,
        rows,
    }
}

/// In the table's key order: neighbouring rows share pages, so each slice dirties (and the
/// WAL and the next checkpoint copy) far fewer of them.
fn sort_rows(rows: &mut [log::Row]) {
    rows.sort_unstable_by(|a, b| key(&a.0).cmp(&key(&b.0)));
}

/// The `to` of the latest fold begun on this file (0 before any).
fn fold_to(conn: &Connection) -> rusqlite::Result<i64> {
    let v: Option<String> = conn
        .prepare_cached("SELECT value FROM lading_meta WHERE key = 'fold_to'")?
        .query_row([], |r| r.get(0))
        .optional()?;
    Ok(v.and_then(|v| v.parse().ok()).unwrap_or(0))
}

/// Writes `rows` into the nodes table; the bytes of data written.
fn write_rows(conn: &Connection, rows: &[log::Row]) -> rusqlite::Result<u64> {
    let mut upsert = conn.prepare_cached(
        "INSERT INTO nodes(parent, name, data, version, owner, ctime, mtime, seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT(parent, name) DO UPDATE SET data = excluded.data, version = excluded.version,
           owner = excluded.owner, ctime = excluded.ctime, mtime = excluded.mtime, seq = excluded.seq",
    )?;
    let mut del = conn.prepare_cached("DELETE FROM nodes WHERE parent = ?1 AND name = ?2")?;
    let mut bytes = 0u64;
    for (path, node) in rows {
        bytes += (path.len()
            + node
                .as_ref()
                .and_then(|n| n.data.as_ref())
                .map_or(0, Vec::len)) as u64;
        let (parent, name) = key(path);
        match node {
            Some(n) => {
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
            None => {
                del.execute([parent, name])?;
            }
        }
    }
    Ok(bytes)
}
