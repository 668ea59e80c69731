//! How a long-running process ends (`lading serve`, `worker`, `jobs run`): the first
//! SIGINT/SIGTERM stops taking work and lets running work finish within a grace period; a
//! second signal, or the end of the grace, cuts it off (its jobs are released); and whatever
//! the store or the runtime does, the process is gone [`STOP_MARGIN`] after that (the
//! [`watchdog`] times the signals in the handler itself).

use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// SIGINT and SIGTERM, listened to from creation: a signal that arrives between two waits
/// is kept for the next one (a listener made afresh for the second wait could miss a second
/// signal sent right after the first was answered).
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    /// Waits for the next SIGINT or SIGTERM.
    pub async fn next(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

/// How long a stopping process may spend after its grace period (releasing leases, closing
/// the store) before it exits anyway.
pub const STOP_MARGIN: Duration = Duration::from_millis(1500);

/// The watchdog's record of the signals: how many came, and when the first and the second
/// did (ns on the monotonic clock), written by the signal handler itself.
static SIGNALS: AtomicU32 = AtomicU32::new(0);
static FIRST_NS: AtomicU64 = AtomicU64::new(0);
static SECOND_NS: AtomicU64 = AtomicU64::new(0);

/// How long after a second signal the process is gone, whatever it is doing.
pub const SECOND_MARGIN: Duration = Duration::from_millis(1000);

fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; it is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Ends the process `grace` + [`STOP_MARGIN`] after the first SIGINT/SIGTERM, or
/// [`SECOND_MARGIN`] after a second, whatever it is waiting for (a store that cannot be
/// reached, a busy database, a runtime whose threads are all blocked): the times are taken
/// by the signal handler itself and watched by a thread of its own, so a stop completes in
/// time even when the runtime cannot hear the signal. Leases still held then end with the
/// store session, as after a crash; nothing committed is lost.
pub fn watchdog(grace: Duration, say: fn(&str)) -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the action only touches atomics and calls clock_gettime, both
        // async-signal-safe; it is chained with tokio's own handler by the registry.
        unsafe {
            signal_hook_registry::register(sig, || {
                let now = monotonic_ns();
                match SIGNALS.fetch_add(1, Ordering::SeqCst) {
                    0 => FIRST_NS.store(now, Ordering::SeqCst),
                    1 => SECOND_NS.store(now, Ordering::SeqCst),
                    _ => {}
                }
            })?;
        }
    }
    // Deliberately not a service of the runtime: its whole point is to end the process when
    // the runtime cannot (every thread blocked). It looks at the handler's atomics every
    // 20 ms, which is all a signal handler can safely leave for it.
    std::thread::Builder::new()
        .name("lading-stop-watchdog".into())
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(20));
                let n = SIGNALS.load(Ordering::SeqCst);
                if n == 0 {
                    continue;
                }
                let mut deadline =
                    FIRST_NS.load(Ordering::SeqCst) + (grace + STOP_MARGIN).as_nanos() as u64;
                if n >= 2 {
                    let second = SECOND_NS.load(Ordering::SeqCst);
                    deadline = deadline.min(second + SECOND_MARGIN.as_nanos() as u64);
                }
                if monotonic_ns() >= deadline {
                    say(
                        "lading: could not stop cleanly in time (is the store reachable?); exiting now, \
                         held jobs are released when the store session ends",
                    );
                    std::process::exit(0);
                }
            }
        })?;
    Ok(())
}

/// Runs `work` until it ends by itself or a signal comes. The first signal calls `stop` (no
/// new work) and waits for `work` to end; a second signal, or the end of `grace` (when
/// given), calls `abort` (running work is cut off and its jobs released) and waits again.
/// `say` tells the person at the terminal each step, starting with `running` once the
/// signals are listened to (a signal sent on reading it is answered, not fatal).
pub async fn until_signal<E: From<std::io::Error>>(
    work: impl Future<Output = Result<(), E>>,
    stop: impl FnOnce(),
    abort: impl FnOnce(),
    grace: Option<Duration>,
    running: &str,
    say: fn(&str),
) -> Result<(), E> {
    let mut signals = Signals::new()?;
    if let Some(g) = grace {
        watchdog(g, say)?;
    }
    say(running);
    tokio::pin!(work);
    tokio::select! {
        r = &mut work => return r,
        _ = signals.next() => {}
    }
    match grace {
        Some(g) => {
            say(&format!(
                "lading: stopping; running jobs get {} s to finish (signal again to stop now)",
                g.as_secs()
            ));
        }
        None => say("lading: stopping; running jobs finish first (signal again to stop now)"),
    }
    stop();
    let grace_over = async {
        match grace {
            Some(g) => tokio::time::sleep(g).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = &mut work => r?,
        _ = signals.next() => {
            say("lading: stopping now; running jobs are released");
            abort();
            work.await?;
        }
        _ = grace_over => {
            say("lading: grace period over; running jobs are released");
            abort();
            work.await?;
        }
    }
    say("lading: stopped");
    Ok(())
}
