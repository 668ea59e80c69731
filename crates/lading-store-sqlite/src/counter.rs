//! The commit counter: how a reader learns, with one `pread`, whether another process has
//! committed since it last looked.
//!
//! Asking SQLite (`PRAGMA data_version`) opens a read transaction: locks on the `-shm` file,
//! and a wait for the writer's mutex while it commits. Done before every read, that was about
//! 15 µs a read on a busy store. Instead every process that commits a change to the tree adds
//! one to an 8-byte counter in `<db>-commits`, after its COMMIT and before it answers anyone,
//! under an exclusive `flock` so that concurrent adds are not lost. A reader compares the
//! counter with the value up to which it knows its memory holds every other process's
//! commits; only when they differ does it ask SQLite.
//!
//! Exact for every commit a reader can know of: a commit is counted before its multi is
//! answered, so anything that learned of it finds the counter moved. A process that dies
//! between COMMIT and its add leaves a commit nobody was told of; the handle's poll (which
//! always asks SQLite) folds it in within `poll_interval_ms`, as does the next group of
//! its own writer. The file is never fsynced: after a restart, memory is loaded from the
//! database, not from the counter.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Counter {
    file: File,
    /// Every other process's commit counted up to this value is in memory.
    known: AtomicU64,
}

impl Counter {
    /// Opens (or creates) the counter beside the database at `db`. Call before loading the
    /// tree, so that every commit already counted is in the load.
    pub fn open(db: &Path) -> std::io::Result<Counter> {
        let path = format!("{}-commits", db.display());
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let c = Counter {
            file,
            known: AtomicU64::new(0),
        };
        let now = c.read()?;
        c.known.store(now, Ordering::SeqCst);
        Ok(c)
    }

    /// The counter's value (0 while no commit was ever counted).
    pub fn read(&self) -> std::io::Result<u64> {
        let mut b = [0u8; 8];
        let mut got = 0;
        while got < b.len() {
            match self.file.read_at(&mut b[got..], got as u64)? {
                0 => break,
                n => got += n,
            }
        }
        Ok(u64::from_le_bytes(b))
    }

    /// Whether a commit of another process may be missing from memory, given the counter's
    /// value `now`.
    pub fn moved(&self, now: u64) -> bool {
        now != self.known.load(Ordering::SeqCst)
    }

    /// Memory holds every commit counted up to `seen` (read before the look that folded them
    /// in).
    pub fn caught_up(&self, seen: u64) {
        self.known.fetch_max(seen, Ordering::SeqCst);
    }

    /// Counts one commit of this process. When nothing else was counted since memory last
    /// caught up, memory stays caught up (this commit reaches it through the syncer).
    pub fn count_own(&self) -> std::io::Result<()> {
        self.file.lock()?;
        let r = (|| -> std::io::Result<u64> {
            let before = self.read()?;
            self.file.write_all_at(&(before + 1).to_le_bytes(), 0)?;
            Ok(before)
        })();
        let unlocked = self.file.unlock();
        let before = r?;
        unlocked?;
        let _ = self
            .known
            .compare_exchange(before, before + 1, Ordering::SeqCst, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_handles_count_is_seen_and_its_own_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let a = Counter::open(&db).unwrap();
        let b = Counter::open(&db).unwrap();
        assert_eq!(a.read().unwrap(), 0);
        a.count_own().unwrap();
        a.count_own().unwrap();
        assert!(!a.moved(a.read().unwrap()), "own commits need no look");
        let now = b.read().unwrap();
        assert_eq!(now, 2);
        assert!(b.moved(now), "the other handle must look");
        b.caught_up(now);
        assert!(!b.moved(b.read().unwrap()));
        // Counted by the other handle between a's last catch-up and a's own count.
        b.count_own().unwrap();
        a.count_own().unwrap();
        assert!(a.moved(a.read().unwrap()), "b's commit is not a's to skip");
        // A reopened handle starts from the file's value.
        let c = Counter::open(&db).unwrap();
        assert!(!c.moved(c.read().unwrap()));
        assert_eq!(c.read().unwrap(), 4);
    }
}
