//! How a long-running process ends (`lading serve`, `worker`, `jobs run`): the first
//! SIGINT/SIGTERM stops taking work and lets running work finish within a grace period; a
//! second signal, or the end of the grace, cuts it off (its jobs are released); and whatever
//! the store does, the process is gone [`STOP_MARGIN`] after that.

use std::future::Future;
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

/// Ends the process after `after`, whatever it is waiting for (a store that cannot be
/// reached, a busy database): a stop always completes. Leases still held then end with the
/// store session, as after a crash; nothing committed is lost.
pub fn exit_after(after: Duration, say: fn(&str)) {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        say(
            "lading: could not stop cleanly in time (is the store reachable?); exiting now, \
             held jobs are released when the store session ends",
        );
        std::process::exit(0);
    });
}

/// Runs `work` until it ends by itself or a signal comes. The first signal calls `stop` (no
/// new work) and waits for `work` to end; a second signal, or the end of `grace` (when
/// given), calls `abort` (running work is cut off and its jobs released) and waits again.
/// `say` tells the person at the terminal each step, starting with `running` once the
/// signals are listened to (a signal sent on reading it is answered, not fatal).
pub async fn until_signal(
    work: impl Future<Output = anyhow::Result<()>>,
    stop: impl FnOnce(),
    abort: impl FnOnce(),
    grace: Option<Duration>,
    running: &str,
    say: fn(&str),
) -> anyhow::Result<()> {
    let mut signals = Signals::new()?;
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
            exit_after(g + STOP_MARGIN, say);
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
            if grace.is_some() {
                exit_after(Duration::from_millis(500), say);
            }
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
