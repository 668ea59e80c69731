//! Waiting where no signal reaches the test: another process's progress, a page inside a
//! browser, a Java server starting, a server's own clock. The condition is looked at again
//! every [`EVERY`] until it holds or the deadline passes; then the test fails naming what it
//! waited for and the last thing the condition saw.
//!
//! This is the one place the suites wait by sleeping. A test that waits on something this
//! process can be told about (an event stream, a watch, a parked count) waits on that
//! instead; a sleep left in a test is one where time itself is the subject.

use std::fmt::Debug;
use std::time::{Duration, Instant};

/// How often a condition is looked at again.
pub const EVERY: Duration = Duration::from_millis(50);

/// Waits until `cond` gives `Ok`, for at most `within`; `Err` carries what it saw instead,
/// printed if the deadline passes.
pub async fn until<T, E: Debug>(
    what: &str,
    within: Duration,
    mut cond: impl AsyncFnMut() -> Result<T, E>,
) -> T {
    let d = Deadline::new(what, within);
    loop {
        if let Some(t) = d.again(cond().await).await {
            return t;
        }
    }
}

/// [`until`] for a condition written as a closure that returns a future: what a task
/// handed to `tokio::spawn` needs, as the futures of `async` closures are not known to be
/// `Send`.
pub async fn until_with<T, E: Debug, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    within: Duration,
    mut cond: impl FnMut() -> F,
) -> T {
    let d = Deadline::new(what, within);
    loop {
        if let Some(t) = d.again(cond().await).await {
            return t;
        }
    }
}

/// What [`until`] and [`until_with`] share: the deadline, and the pause between looks.
struct Deadline<'a> {
    what: &'a str,
    within: Duration,
    at: Instant,
}

impl<'a> Deadline<'a> {
    fn new(what: &'a str, within: Duration) -> Self {
        Deadline {
            what,
            within,
            at: Instant::now() + within,
        }
    }

    /// The value once the condition holds; otherwise fails past the deadline, or pauses
    /// before the next look.
    async fn again<T, E: Debug>(&self, r: Result<T, E>) -> Option<T> {
        match r {
            Ok(t) => Some(t),
            Err(seen) => {
                assert!(
                    Instant::now() < self.at,
                    "timed out after {:?} waiting for {}; last seen: {seen:?}",
                    self.within,
                    self.what
                );
                // Sleep: nothing can tell this process when the condition changes (see above).
                tokio::time::sleep(EVERY).await;
                None
            }
        }
    }
}

/// [`until`] for a plain condition.
pub async fn until_true(what: &str, within: Duration, mut cond: impl AsyncFnMut() -> bool) {
    until(
        what,
        within,
        async || if cond().await { Ok(()) } else { Err("no") },
    )
    .await
}

/// [`until`] on a thread of its own (no runtime), giving `None` instead of failing when the
/// deadline passes.
pub fn within_blocking<T>(within: Duration, mut cond: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(t) = cond() {
            return Some(t);
        }
        if Instant::now() >= deadline {
            return None;
        }
        // Sleep: as in `until`, on a thread without a runtime.
        std::thread::sleep(EVERY);
    }
}
