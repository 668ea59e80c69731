//! Children of long folders, kept in memory and fresh by one persistent recursive watch.
//!
//! Listing a folder of 100,000 queue references costs megabytes per call (and a Java client
//! refuses the reply outright). So for folders under the configured roots, each session keeps a
//! sorted copy of the children, loaded once ("primed") and then updated from the watch's
//! `NodeCreated` / `NodeDeleted` events. The head of a queue is then read without a round trip.
//!
//! Freshness rules:
//! - Events arrive in order. (ZooKeeper 3.8 sends them without a zxid, so they are counted.)
//! - A folder being primed buffers events from before its listing was sent, then applies them
//!   over the listing: the last event for a child decides, so the result is exact.
//! - A folder's watchers are woken by a change only: an event, or a listing afresh that
//!   differs from what was kept. A first listing is no change (ZooKeeper delivers the event of
//!   any write it shows before the listing's reply), so waiters that share a watch do not
//!   wake each other by reading.
//! - After our own `multi` the tree waits until the events of its creates and deletes have
//!   been applied, so a session reads its own writes from the cache.
//! - A reference the server says is gone (or there) when the cache said otherwise is fixed at
//!   once; the event that explains it follows.
//! - Events lost during a disconnection cannot be recovered (ZOOKEEPER-4698), so a reconnect
//!   forgets every folder; each is primed again on its next read. As a safety net every folder
//!   is also listed afresh after `REFRESH`.

use lading_core::tree::split_path;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// A primed folder is listed afresh after this long (the slow safety sweep).
const REFRESH: Duration = Duration::from_secs(30);
/// How many recent events are remembered for `wait_seen`.
const RECENT: usize = 1 << 16;

enum Folder {
    Priming {
        generation: u64,
        buffered: Vec<(bool, String)>,
        /// The children as they were kept, when this is a listing afresh.
        before: Option<BTreeSet<String>>,
    },
    Ready(BTreeSet<String>, Instant),
}

#[derive(Default)]
struct Inner {
    folders: HashMap<String, Folder>,
    /// Per-folder change signal (a counter), created on demand.
    signals: HashMap<String, watch::Sender<u64>>,
    /// Recent events: (number, created?, path).
    recent: VecDeque<(u64, bool, String)>,
    generation: u64,
}

pub(crate) struct Cache {
    roots: Vec<String>,
    inner: Mutex<Inner>,
    /// Number of events applied so far.
    applied: watch::Sender<u64>,
}

/// What a read of a cached folder found.
pub(crate) enum Lookup<T> {
    Hit(T),
    /// Not primed: the caller lists it (`begin_prime` / `finish_prime`).
    Miss,
}

impl Cache {
    pub(crate) fn new(roots: Vec<String>) -> Cache {
        Cache {
            roots,
            inner: Mutex::new(Inner::default()),
            applied: watch::channel(0).0,
        }
    }

    pub(crate) fn roots(&self) -> &[String] {
        &self.roots
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `folder`'s children are served from the cache.
    pub(crate) fn covers(&self, folder: &str) -> bool {
        self.roots.iter().any(|r| {
            folder.len() > r.len()
                && folder.starts_with(r.as_str())
                && folder.as_bytes()[r.len()] == b'/'
        }) || self.roots.iter().any(|r| r == folder)
    }

    /// At most `limit` children after `after`, in order.
    pub(crate) fn page(
        &self,
        folder: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Lookup<Vec<String>> {
        let inner = self.lock();
        match inner.folders.get(folder) {
            Some(Folder::Ready(set, at)) if at.elapsed() < REFRESH => {
                let it: Box<dyn Iterator<Item = &String>> = match after {
                    Some(a) => Box::new(set.range::<str, _>((
                        std::ops::Bound::Excluded(a),
                        std::ops::Bound::Unbounded,
                    ))),
                    None => Box::new(set.iter()),
                };
                Lookup::Hit(it.take(limit).cloned().collect())
            }
            _ => Lookup::Miss,
        }
    }

    /// Starts priming `folder`; returns the generation to hand to `finish_prime`, or `None` when
    /// another task is already priming it (the caller then reads uncached this once).
    pub(crate) fn begin_prime(&self, folder: &str) -> Option<u64> {
        let mut inner = self.lock();
        let generation = inner.generation;
        if let Some(Folder::Priming { .. }) = inner.folders.get(folder) {
            return None;
        }
        let before = match inner.folders.remove(folder) {
            Some(Folder::Ready(set, _)) => Some(set),
            _ => None,
        };
        inner.folders.insert(
            folder.to_string(),
            Folder::Priming {
                generation,
                buffered: Vec::new(),
                before,
            },
        );
        Some(generation)
    }

    /// Completes priming with the listing read after `begin_prime` (`None`: no such folder).
    /// The folder's watchers are told only of a change: an event that came while it was
    /// listed, or a listing afresh that differs from what was kept. A first listing changes
    /// nothing they could have seen (a watch set just before a waiter's first read would
    /// otherwise fire at that read, and every waiter of the process set another).
    pub(crate) fn finish_prime(&self, folder: &str, generation: u64, listing: Option<Vec<String>>) {
        let mut inner = self.lock();
        if inner.generation != generation {
            return;
        }
        let Some(Folder::Priming {
            buffered, before, ..
        }) = inner.folders.remove(folder)
        else {
            return;
        };
        let mut set: BTreeSet<String> = listing.unwrap_or_default().into_iter().collect();
        let changed = !buffered.is_empty() || before.is_some_and(|b| b != set);
        for (created, name) in buffered {
            if created {
                set.insert(name);
            } else {
                set.remove(&name);
            }
        }
        inner
            .folders
            .insert(folder.to_string(), Folder::Ready(set, Instant::now()));
        if changed {
            Self::signal(&mut inner, folder);
        }
    }

    /// Abandons priming after a failed listing; the folder's watchers are told of the events
    /// that came meanwhile.
    pub(crate) fn abort_prime(&self, folder: &str, generation: u64) {
        let mut inner = self.lock();
        if matches!(inner.folders.get(folder), Some(Folder::Priming { generation: g, .. }) if *g == generation)
            && let Some(Folder::Priming { buffered, .. }) = inner.folders.remove(folder)
            && !buffered.is_empty()
        {
            Self::signal(&mut inner, folder);
        }
    }

    fn signal(inner: &mut Inner, folder: &str) {
        if let Some(s) = inner.signals.get(folder) {
            s.send_modify(|n| *n += 1);
        }
    }

    /// A receiver that changes when `folder`'s children (may) have changed.
    pub(crate) fn subscribe(&self, folder: &str) -> watch::Receiver<u64> {
        let mut inner = self.lock();
        let s = inner
            .signals
            .entry(folder.to_string())
            .or_insert_with(|| watch::channel(0).0);
        let mut rx = s.subscribe();
        rx.borrow_and_update();
        rx
    }

    /// Applies one event of the recursive watch.
    pub(crate) fn apply(&self, path: &str, created: bool) {
        let mut inner = self.lock();
        if path != "/" {
            let (parent, name) = split_path(path);
            Self::edit(&mut inner, parent, name, created);
            // A deleted folder has no children any more.
            if !created && let Some(Folder::Ready(set, _)) = inner.folders.get_mut(path) {
                set.clear();
            }
        }
        let n = *self.applied.borrow() + 1;
        if inner.recent.len() == RECENT {
            inner.recent.pop_front();
        }
        inner.recent.push_back((n, created, path.to_string()));
        self.applied.send_replace(n);
    }

    fn edit(inner: &mut Inner, parent: &str, name: &str, created: bool) {
        let changed = match inner.folders.get_mut(parent) {
            Some(Folder::Ready(set, _)) => {
                if created {
                    set.insert(name.to_string())
                } else {
                    set.remove(name)
                }
            }
            Some(Folder::Priming { buffered, .. }) => {
                buffered.push((created, name.to_string()));
                false
            }
            // Not listed here yet, but maybe watched (a waiter that never lists, such as the
            // quota waker on the ended-job folders): its watchers hear of the change.
            None => true,
        };
        if changed {
            Self::signal(inner, parent);
        }
    }

    /// Sets one child's presence from what the server just said (a failed create or check).
    pub(crate) fn fix(&self, path: &str, present: bool) {
        let (parent, name) = split_path(path);
        let mut inner = self.lock();
        Self::edit(&mut inner, parent, name, present);
    }

    /// Number of events applied so far; hand it to `wait_seen` after a write.
    pub(crate) fn mark(&self) -> u64 {
        *self.applied.borrow()
    }

    /// Waits (bounded) until, after event number `mark`, an event has been applied for each of
    /// `changes` (created?, path). False on timeout.
    pub(crate) async fn wait_seen(
        &self,
        mark: u64,
        changes: &[(bool, String)],
        within: Duration,
    ) -> bool {
        let seen = |inner: &Inner| {
            if inner.recent.front().is_some_and(|(n, _, _)| *n > mark + 1) {
                return true; // older than what is remembered: long applied
            }
            changes.iter().all(|(c, p)| {
                inner
                    .recent
                    .iter()
                    .rev()
                    .take_while(|(n, _, _)| *n > mark)
                    .any(|(_, c2, p2)| c2 == c && p2 == p)
            })
        };
        let mut rx = self.applied.subscribe();
        let wait = async {
            loop {
                if seen(&self.lock()) {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }

    /// Forgets every folder (events may have been lost) and wakes every waiter.
    pub(crate) fn invalidate(&self) {
        let mut inner = self.lock();
        inner.generation += 1;
        inner.folders.clear();
        for s in inner.signals.values() {
            s.send_modify(|n| *n += 1);
        }
    }

    /// Whether `folder` is primed (its children are in memory).
    pub(crate) fn is_ready(&self, folder: &str) -> bool {
        matches!(self.lock().folders.get(folder), Some(Folder::Ready(..)))
    }

    /// Forgets one folder, after it was found to disagree with the server.
    pub(crate) fn forget(&self, folder: &str) {
        let mut inner = self.lock();
        if matches!(inner.folders.get(folder), Some(Folder::Ready(..))) {
            inner.folders.remove(folder);
        }
        Self::signal(&mut inner, folder);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priming_applies_buffered_events_over_the_listing() {
        let c = Cache::new(vec!["/q".into()]);
        assert!(c.covers("/q/pending"));
        assert!(!c.covers("/qq/pending"));
        assert!(matches!(c.page("/q/pending", None, 10), Lookup::Miss));
        let g = c.begin_prime("/q/pending").unwrap();
        assert!(
            c.begin_prime("/q/pending").is_none(),
            "one primer at a time"
        );
        // Events that race with the listing: b deleted after, c created after, a both.
        c.apply("/q/pending/c", true);
        c.apply("/q/pending/b", false);
        c.apply("/q/pending/a", false);
        c.finish_prime("/q/pending", g, Some(vec!["a".into(), "b".into()]));
        let Lookup::Hit(p) = c.page("/q/pending", None, 10) else {
            panic!("primed")
        };
        assert_eq!(p, vec!["c".to_string()]);
        let mark = c.mark();
        c.apply("/q/pending/d", true);
        c.apply("/q/pending/e", true);
        let want = [(true, "/q/pending/e".to_string())];
        assert!(futures_ready(c.wait_seen(
            mark,
            &want,
            Duration::from_millis(1)
        )));
        let want = [(false, "/q/pending/e".to_string())];
        assert!(!futures_ready(c.wait_seen(
            mark,
            &want,
            Duration::from_millis(1)
        )));
        let Lookup::Hit(p) = c.page("/q/pending", Some("c"), 1) else {
            panic!("primed")
        };
        assert_eq!(p, vec!["d".to_string()]);
    }

    #[test]
    fn a_watcher_of_a_folder_never_listed_hears_of_its_changes() {
        // The quota waker watches the ended-job folders and never lists them: a job ending
        // there woke it only at its 60-second fallback.
        let c = Cache::new(vec!["/q".into()]);
        let mut rx = c.subscribe("/q/completed");
        assert!(!rx.has_changed().unwrap());
        c.apply("/q/completed/05-jid0000000001", true);
        assert!(rx.has_changed().unwrap(), "a child created");
        rx.borrow_and_update();
        c.apply("/q/completed/05-jid0000000001", false);
        assert!(rx.has_changed().unwrap(), "a child deleted");
        // Another folder's change is not this one's.
        rx.borrow_and_update();
        c.apply("/q/failed/05-jid0000000002", true);
        assert!(!rx.has_changed().unwrap());
    }

    #[test]
    fn a_listing_wakes_the_folders_watchers_only_for_a_change() {
        let c = Cache::new(vec!["/q".into()]);
        // A watch set just before a waiter's first read: the listing itself changes nothing.
        let mut rx = c.subscribe("/q/pending");
        let g = c.begin_prime("/q/pending").unwrap();
        c.finish_prime("/q/pending", g, Some(vec!["a".into()]));
        assert!(!rx.has_changed().unwrap(), "a first listing is no change");
        // An event while listing is one.
        let g = c.begin_prime("/q/other").unwrap();
        let mut other = c.subscribe("/q/other");
        c.apply("/q/other/b", true);
        assert!(
            !other.has_changed().unwrap(),
            "held until the listing is in"
        );
        c.finish_prime("/q/other", g, Some(vec![]));
        assert!(other.has_changed().unwrap(), "an event came while listing");
        other.borrow_and_update();
        // So is one that came while a listing failed.
        let g = c.begin_prime("/q/third").unwrap();
        let third = c.subscribe("/q/third");
        c.apply("/q/third/c", true);
        c.abort_prime("/q/third", g);
        assert!(
            third.has_changed().unwrap(),
            "an event came while a listing failed"
        );
        // A listing afresh wakes them only when it differs from what was kept.
        let g = c.begin_prime("/q/pending").unwrap();
        c.finish_prime("/q/pending", g, Some(vec!["a".into()]));
        assert!(!rx.has_changed().unwrap(), "the same children");
        let g = c.begin_prime("/q/pending").unwrap();
        c.finish_prime("/q/pending", g, Some(vec!["a".into(), "z".into()]));
        assert!(rx.has_changed().unwrap(), "a child the events missed");
        rx.borrow_and_update();
        let Lookup::Hit(p) = c.page("/q/pending", None, 10) else {
            panic!("primed")
        };
        assert_eq!(p, vec!["a".to_string(), "z".to_string()]);
    }

    fn futures_ready(f: impl std::future::Future<Output = bool>) -> bool {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn invalidation_forgets_folders_and_signals_waiters() {
        let c = Cache::new(vec!["/q".into()]);
        let g = c.begin_prime("/q/x").unwrap();
        let rx = c.subscribe("/q/x");
        c.finish_prime("/q/x", g, None);
        c.invalidate();
        assert!(rx.has_changed().unwrap());
        assert!(matches!(c.page("/q/x", None, 1), Lookup::Miss));
        // A priming begun before the invalidation is discarded.
        let g = c.begin_prime("/q/y").unwrap();
        c.invalidate();
        c.finish_prime("/q/y", g, Some(vec!["z".into()]));
        assert!(matches!(c.page("/q/y", None, 1), Lookup::Miss));
    }
}
