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

use crate::{Engine, Result};
use lading_core::tree::{Watch, WatchKind};
use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::task::{Context, Waker};

/// Values kept at most; past this the whole table is let go (and read again as needed).
const KEPT: usize = 4096;

type Key = (String, WatchKind);
/// A value, and the watch it is current until.
type Kept = (Box<dyn Any + Send>, Watch);

#[derive(Default)]
pub(crate) struct Watched {
    values: Mutex<HashMap<Key, Kept>>,
}

impl Watched {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Kept>> {
        self.values.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value kept for `path` while its watch has not fired.
    fn get<T: Clone + 'static>(&self, path: &str, kind: WatchKind) -> Option<T> {
        let mut g = self.lock();
        let key = (path.to_string(), kind);
        let (value, watch) = g.get_mut(&key)?;
        let mut cx = Context::from_waker(Waker::noop());
        if std::pin::Pin::new(watch).poll(&mut cx).is_pending() {
            return value.downcast_ref::<T>().cloned();
        }
        // Fired: polled to its end, so never polled again.
        g.remove(&key);
        None
    }

    fn keep<T: Send + 'static>(&self, path: &str, kind: WatchKind, value: T, watch: Watch) {
        let mut g = self.lock();
        if g.len() >= KEPT {
            g.clear();
        }
        g.insert((path.to_string(), kind), (Box::new(value), watch));
    }

    /// Forgets what is kept of `path`: a watch on it fired elsewhere in this process, or this
    /// process changed it (its own next read must not wait for the watch event).
    pub(crate) fn forget(&self, path: &str, kind: WatchKind) {
        let mut g = self.lock();
        if !g.is_empty() {
            g.remove(&(path.to_string(), kind));
        }
    }
}

impl Engine {
    /// `read`'s value, remembered under a watch on `path` until it fires (see the module's
    /// docs). The watch is set before the read, so no change after the read is missed.
    pub(crate) async fn watched_read<T, F>(&self, path: &str, kind: WatchKind, read: F) -> Result<T>
    where
        T: Clone + Send + 'static,
        F: Future<Output = Result<T>>,
    {
        if let Some(v) = self.watched.get::<T>(path, kind) {
            return Ok(v);
        }
        let watch = self.tree.watch(path, kind).await?;
        let value = read.await?;
        self.watched.keep(path, kind, value.clone(), watch);
        Ok(value)
    }
}
