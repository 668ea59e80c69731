//! Stopping a process's loops and handlers: a stop (finish what is in hand) and an abort
//! (as a crash would), heard in the order each began to wait.

use std::sync::Arc;

/// A flag that only goes up, and whose waiters are woken in the order they began to wait.
/// Not tokio's `watch`: it spreads its receivers over several wake lists at random, so which
/// of a process's loops and handlers heard a stop first differed from run to run, and a
/// seed of `lading-sim` that crashed a process did not always repeat.
#[derive(Default)]
struct Flag {
    up: std::sync::atomic::AtomicBool,
    /// Every handle to raise it is gone: its waiters are let go (it stays down).
    orphaned: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Flag {
    fn raise(&self) {
        self.up.store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    fn orphan(&self) {
        self.orphaned
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    fn is_up(&self) -> bool {
        self.up.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn done(&self) -> bool {
        self.is_up() || self.orphaned.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Completes once the flag is up, or once nobody can raise it.
    async fn wait(&self) {
        while !self.done() {
            let woken = self.notify.notified();
            let mut woken = std::pin::pin!(woken);
            // Listening before the last look: a raise in between is not missed.
            woken.as_mut().enable();
            if self.done() {
                break;
            }
            woken.await;
        }
    }
}

/// The two flags of one stop signal.
#[derive(Default)]
struct Signals {
    stop: Flag,
    abort: Flag,
}

/// The raising side, shared by a handle's clones: when the last goes, waiters are let go.
struct Raiser(Arc<Signals>);

impl Drop for Raiser {
    fn drop(&mut self) {
        self.0.stop.orphan();
        self.0.abort.orphan();
    }
}

/// Tells a running [`Worker`](crate::Worker) to stop: see the crate docs for the two steps.
#[derive(Clone)]
pub struct ShutdownHandle(Arc<Raiser>);

impl ShutdownHandle {
    /// Stop acquiring; let running handlers finish.
    pub fn stop(&self) {
        self.0.0.stop.raise();
    }
    /// Cut running handlers off and release what they hold.
    pub fn abort(&self) {
        self.0.0.stop.raise();
        self.0.0.abort.raise();
    }
}

/// The receiving side of a [`ShutdownHandle`].
#[derive(Clone)]
pub struct Shutdown(Arc<Signals>);

impl Shutdown {
    pub fn new() -> (ShutdownHandle, Shutdown) {
        let signals = Arc::new(Signals::default());
        (
            ShutdownHandle(Arc::new(Raiser(signals.clone()))),
            Shutdown(signals),
        )
    }

    pub fn is_stopping(&self) -> bool {
        self.0.stop.is_up()
    }

    /// Completes when a stop is asked for.
    pub async fn into_stopped(self) {
        self.0.stop.wait().await;
    }

    /// Whether an abort was asked for.
    pub fn is_aborting(&self) -> bool {
        self.0.abort.is_up()
    }

    /// Completes when a stop is asked for (without giving this receiver up).
    pub async fn stopped(&mut self) {
        self.0.stop.wait().await;
    }

    /// Completes when an abort is asked for.
    pub async fn aborted(&mut self) {
        self.0.abort.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stop reaches its waiters in the order they began to wait, every time (a simulated
    /// run must repeat); and when every handle is gone, waiters are let go without a stop.
    #[tokio::test]
    async fn a_stop_wakes_its_waiters_in_the_order_they_waited() {
        for _ in 0..5 {
            let (handle, shutdown) = Shutdown::new();
            let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            for i in 0..40 {
                let (mut sd, heard) = (shutdown.clone(), heard.clone());
                tasks.push(tokio::spawn(async move {
                    if i % 2 == 0 {
                        sd.stopped().await;
                    } else {
                        sd.aborted().await;
                    }
                    heard.lock().unwrap().push(i);
                }));
                // Each is waiting before the next begins.
                tokio::task::yield_now().await;
            }
            assert!(heard.lock().unwrap().is_empty());
            handle.abort();
            for t in tasks {
                t.await.unwrap();
            }
            let heard = heard.lock().unwrap().clone();
            let stops: Vec<i32> = heard.iter().copied().filter(|i| i % 2 == 0).collect();
            let aborts: Vec<i32> = heard.iter().copied().filter(|i| i % 2 == 1).collect();
            assert_eq!(stops, (0..40).step_by(2).collect::<Vec<_>>(), "{heard:?}");
            assert_eq!(aborts, (1..40).step_by(2).collect::<Vec<_>>(), "{heard:?}");
            assert!(shutdown.is_stopping() && shutdown.is_aborting());
        }
        let (handle, shutdown) = Shutdown::new();
        let waiting = tokio::spawn(shutdown.clone().into_stopped());
        tokio::task::yield_now().await;
        drop(handle);
        waiting.await.unwrap();
        assert!(!shutdown.is_stopping(), "let go, not stopped");
    }
}
