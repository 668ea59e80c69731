//! The one supervisor of a process's services. Every long-running piece of a node (each
//! stage's loops, the access queues, the outbox deliverer, the quota waker, the sweeps and
//! housekeeping, the generic-jobs monitor and fixity audit, the HTTP server) is a named service
//! started here with the one [`Shutdown`]: one stop signal ([`Supervisor::handle`]) ends them
//! all, in two phases. A [`Phase::First`] service stops with the signal; a [`Phase::Last`]
//! one (a deliverer of what the stages record while they finish) is told to stop only once
//! every first-phase service has ended. A service that ends with an error, or panics, stops
//! the rest, and [`Supervisor::join`] names it.

use crate::{Shutdown, ShutdownHandle};
use std::collections::HashMap;
use std::future::Future;
use tokio::task::{Id, JoinSet};

/// When a service is told to stop (see the module's docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    First,
    Last,
}

type Ended = Result<(), String>;

/// The services of one phase, by task id.
#[derive(Default)]
struct Group {
    tasks: JoinSet<Ended>,
    names: HashMap<Id, &'static str>,
}

impl Group {
    /// Waits for every service of the group; the first error, named. An error stops the
    /// others through `on_error`.
    async fn join(&mut self, on_error: &ShutdownHandle) -> Option<String> {
        let mut first = None;
        while let Some(r) = self.tasks.join_next_with_id().await {
            let (id, failed) = match r {
                Ok((id, Ok(()))) => (id, None),
                Ok((id, Err(e))) => (id, Some(e)),
                Err(e) if e.is_panic() => (e.id(), Some("panicked".to_string())),
                Err(e) => (e.id(), None),
            };
            let name = self.names.remove(&id).unwrap_or("a service");
            match failed {
                Some(e) => {
                    tracing::error!(service = name, error = %e, "service failed; stopping the others");
                    on_error.stop();
                    first.get_or_insert(format!("{name}: {e}"));
                }
                None => tracing::debug!(service = name, "service ended"),
            }
        }
        first
    }
}

/// Starts, stops and waits for a process's services (see the module's docs).
pub struct Supervisor {
    handle: ShutdownHandle,
    shutdown: Shutdown,
    last_handle: ShutdownHandle,
    last_shutdown: Shutdown,
    first: Group,
    last: Group,
}

impl Default for Supervisor {
    fn default() -> Self {
        Supervisor::new()
    }
}

impl Supervisor {
    pub fn new() -> Supervisor {
        let (handle, shutdown) = Shutdown::new();
        let (last_handle, last_shutdown) = Shutdown::new();
        Supervisor {
            handle,
            shutdown,
            last_handle,
            last_shutdown,
            first: Group::default(),
            last: Group::default(),
        }
    }

    /// The one stop signal: `stop` (finish what runs, take nothing new) or `abort`.
    pub fn handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// The first phase's [`Shutdown`], as its services get it.
    pub fn shutdown(&self) -> Shutdown {
        self.shutdown.clone()
    }

    /// Starts the service `name` in `phase`: `f` is given the phase's [`Shutdown`] and must end
    /// once it says so.
    pub fn spawn<Fut>(&mut self, name: &'static str, phase: Phase, f: impl FnOnce(Shutdown) -> Fut)
    where
        Fut: Future<Output = Ended> + Send + 'static,
    {
        let (group, sd) = match phase {
            Phase::First => (&mut self.first, self.shutdown.clone()),
            Phase::Last => (&mut self.last, self.last_shutdown.clone()),
        };
        let id = group.tasks.spawn(f(sd)).id();
        group.names.insert(id, name);
    }

    /// How many services run now.
    pub fn len(&self) -> usize {
        self.first.tasks.len() + self.last.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until every service has ended: those of the first phase (by the stop signal, or
    /// on their own), then those of the last, told to stop (or to abort, when the signal was
    /// an abort) once the first have ended. The first error, naming its service.
    pub async fn join(mut self) -> Result<(), String> {
        let first = self.first.join(&self.handle).await;
        if self.shutdown.is_aborting() {
            self.last_handle.abort();
        } else {
            self.last_handle.stop();
        }
        let last = self.last.join(&self.last_handle).await;
        match first.or(last) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn a_stop_ends_the_first_phase_then_the_last() {
        let mut s = Supervisor::new();
        let first_done = Arc::new(AtomicBool::new(false));
        let f = first_done.clone();
        s.spawn("stages", Phase::First, |sd| async move {
            sd.into_stopped().await;
            tokio::task::yield_now().await;
            f.store(true, Ordering::SeqCst);
            Ok(())
        });
        let f = first_done.clone();
        s.spawn("outbox", Phase::Last, |sd| async move {
            sd.into_stopped().await;
            assert!(
                f.load(Ordering::SeqCst),
                "the last phase stopped before the first ended"
            );
            Ok(())
        });
        s.handle().stop();
        assert_eq!(s.join().await, Ok(()));
    }

    #[tokio::test]
    async fn a_failing_service_stops_the_others_and_is_named() {
        let mut s = Supervisor::new();
        s.spawn("http", Phase::First, |sd| async move {
            sd.into_stopped().await;
            Ok(())
        });
        s.spawn("sweep", Phase::First, |_| async {
            Err("the disk is gone".into())
        });
        s.spawn("outbox", Phase::Last, |sd| async move {
            sd.into_stopped().await;
            Ok(())
        });
        assert_eq!(s.join().await, Err("sweep: the disk is gone".into()));
    }

    #[tokio::test]
    async fn a_panicking_service_is_named() {
        let mut s = Supervisor::new();
        s.spawn("waker", Phase::First, |_| async { panic!("boom") });
        assert_eq!(s.join().await, Err("waker: panicked".into()));
    }
}
