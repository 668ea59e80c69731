//! Values read under a watch: pause and hold flags, batch statuses.
//!
//! A value read after a watch on its node was set stays current until that watch fires: a
//! change since would have fired it. So acquisition reads such a value from memory, at no
//! round trip, for as long as nothing changes ([`Engine::watched_read`]). Everything read this
//! way is also checked where it matters (a batch is locked under a version check of the status
//! it was read with), so a value one watch event late costs a refused write, never a wrong one.
//!
//! One change fires every watch on its node, but the tree may deliver them at different
//! moments. A waiter woken by its own watch must not then read a value whose watch has not
//! fired yet, or it sleeps until its sweep (the simulator found a resumed queue seen 10 s late
//! that way): a waiter forgets what is kept of the node whose watch woke it
//! ([`Watched::forget`]), and whether a value's own watch has fired is asked of the watch at
//! each read.
//!
//! A value is kept only for the session its watch was set on. After an expiry a waiter sets
//! its watches again on the new session, after the change that may have ended the old
//! session's watch; that old watch's event can come later still. A value kept under it and
//! read then would be one change behind with nothing left to wake the waiter (`lading-sim`,
//! seed 241 with one process: a queue resumed at the moment of an expiry was seen paused
//! until the acquisition's timeout, 60 s later).
//!
//! The watches themselves are shared too ([`Engine::shared_watch`]): one per node, kind and
//! session in a process, handed to every waiter that asks while it has not fired, and to the
//! values read under it. A watch set before a waiter's look guards that look as well as one
//! set just for it (a change since would have fired it), so a waiter sets a watch only when
//! none is pending. On ZooKeeper a data watch set is a round trip: each waiter of each stage
//! set its own on the pause flag, on the statuses of the live batches and on the locks it
//! found taken, at every acquisition (about 55 round trips per job in `lading-sim`'s default
//! deployment).

use crate::{Engine, Result};
use foldhash::HashMap;
use futures_util::FutureExt;
use futures_util::future::Shared;
use lading_core::tree::{Watch, WatchKind};
use std::any::Any;
use std::future::Future;
use std::sync::Mutex;
use std::task::{Context, Waker};

/// Values kept at most; past this the whole table is let go (and read again as needed).
const KEPT: usize = 4096;

/// One map per kind of watch, by path: looked up by `&str`, not by a `(String, kind)` key
/// made for each lookup.
type ByKind<V> = [HashMap<String, V>; 2];

fn slot(kind: WatchKind) -> usize {
    match kind {
        WatchKind::Data => 0,
        WatchKind::Children => 1,
    }
}

/// A value, the watch it is current until, and the session that watch was set on.
type Kept = (Box<dyn Any + Send>, Watch, u64);

/// Shared watches kept at most; past this the fired ones are let go, then all.
const SHARED: usize = 4096;

/// Whether `watch` has fired, asked without waiting (a watch that has must not be polled
/// again).
pub(crate) fn fired<W: Future + Unpin>(watch: &mut W) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    std::pin::Pin::new(watch).poll(&mut cx).is_ready()
}

#[derive(Default)]
pub(crate) struct Watched {
    values: Mutex<ByKind<Kept>>,
    /// The pending watch of each node and kind, and the session it was set on.
    shared: Mutex<ByKind<(u64, Shared<Watch>)>>,
}

impl Watched {
    fn lock(&self) -> std::sync::MutexGuard<'_, ByKind<Kept>> {
        self.values.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value kept for `path` while its watch, set on `session`, has not fired.
    fn get<T: Clone + 'static>(&self, path: &str, kind: WatchKind, session: u64) -> Option<T> {
        let mut g = self.lock();
        let kept = &mut g[slot(kind)];
        let (value, watch, set_on) = kept.get_mut(path)?;
        if *set_on == session && !fired(watch) {
            return value.downcast_ref::<T>().cloned();
        }
        // Fired (polled to its end, so never polled again), or set on a session since
        // replaced (see the module's docs).
        kept.remove(path);
        None
    }

    fn keep<T: Send + 'static>(&self, key: (&str, WatchKind, u64), value: T, watch: Watch) {
        let (path, kind, session) = key;
        let mut g = self.lock();
        if g.iter().map(HashMap::len).sum::<usize>() >= KEPT {
            g.iter_mut().for_each(HashMap::clear);
        }
        g[slot(kind)].insert(path.to_string(), (Box::new(value), watch, session));
    }

    /// A share of the watch on `path` set on `session`, while it has not fired.
    fn share(&self, path: &str, kind: WatchKind, session: u64) -> Option<Watch> {
        let mut g = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let shared = &mut g[slot(kind)];
        // Fired is asked of the watch itself: `peek` says so only once a share was polled.
        match shared.get(path) {
            Some((s, w)) if *s == session && !fired(&mut w.clone()) => Some(Watch::new(w.clone())),
            Some(_) => {
                shared.remove(path);
                None
            }
            None => None,
        }
    }

    fn keep_shared(&self, path: &str, kind: WatchKind, session: u64, watch: Shared<Watch>) {
        let mut g = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let len = |g: &ByKind<_>| g.iter().map(HashMap::len).sum::<usize>();
        if len(&g) >= SHARED {
            for m in g.iter_mut() {
                m.retain(|_, (_, w)| w.peek().is_none());
            }
            if len(&g) >= SHARED {
                g.iter_mut().for_each(HashMap::clear);
            }
        }
        g[slot(kind)].insert(path.to_string(), (session, watch));
    }

    /// Forgets what is kept of `path`: a watch on it fired elsewhere in this process, or this
    /// process changed it (its own next read must not wait for the watch event).
    pub(crate) fn forget(&self, path: &str, kind: WatchKind) {
        let mut g = self.lock();
        g[slot(kind)].remove(path);
    }
}

impl Engine {
    /// A watch on `path`: a share of the process's pending one on this session, or a new one
    /// set now (see the module's docs). Like any watch it fires at the first change after it
    /// was set, which may be before this call.
    pub(crate) async fn shared_watch(
        &self,
        path: &str,
        kind: WatchKind,
    ) -> std::result::Result<Watch, lading_core::TreeError> {
        Ok(self.shared_watch_on(path, kind).await?.0)
    }

    /// [`Engine::shared_watch`], with the session the watch was set on.
    async fn shared_watch_on(
        &self,
        path: &str,
        kind: WatchKind,
    ) -> std::result::Result<(Watch, u64), lading_core::TreeError> {
        let session = self.tree.session_id();
        if let Some(w) = self.watched.share(path, kind, session) {
            return Ok((w, session));
        }
        let w = self.tree.watch(path, kind).await?.shared();
        self.watched.keep_shared(path, kind, session, w.clone());
        Ok((Watch::new(w), session))
    }

    /// This process's watch on `path` on the current session, when one is pending (set by an
    /// earlier call and not fired), with that session; nothing is set.
    pub(crate) fn pending_watch(&self, path: &str, kind: WatchKind) -> Option<(Watch, u64)> {
        let session = self.tree.session_id();
        self.watched
            .share(path, kind, session)
            .map(|w| (w, session))
    }

    /// `read`'s value, remembered under a watch on `path` until it fires (see the module's
    /// docs). The watch is set before the read, so no change after the read is missed.
    pub(crate) async fn watched_read<T, F>(&self, path: &str, kind: WatchKind, read: F) -> Result<T>
    where
        T: Clone + Send + 'static,
        F: Future<Output = Result<T>>,
    {
        if let Some(v) = self.watched.get::<T>(path, kind, self.tree.session_id()) {
            return Ok(v);
        }
        let (watch, session) = self.shared_watch_on(path, kind).await?;
        let value = read.await?;
        self.watched
            .keep((path, kind, session), value.clone(), watch);
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value kept under a watch is read back on that watch's session only: on the next
    /// session it is let go (its watch's event may still be on its way) and read again.
    #[test]
    fn a_value_is_kept_for_its_watchs_session_only() {
        let w = Watched::default();
        let (_tx, rx) = tokio::sync::oneshot::channel::<()>();
        let watch = Watch::new(async move {
            let _ = rx.await;
        });
        w.keep(("/locks/queue/ingest", WatchKind::Data, 7), true, watch);
        assert_eq!(
            w.get::<bool>("/locks/queue/ingest", WatchKind::Data, 7),
            Some(true)
        );
        assert_eq!(
            w.get::<bool>("/locks/queue/ingest", WatchKind::Data, 8),
            None
        );
        assert_eq!(
            w.get::<bool>("/locks/queue/ingest", WatchKind::Data, 7),
            None,
            "let go for good"
        );
    }
}
