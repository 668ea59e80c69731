//! What the tests that run `lading` processes on a SQLite store share.

#![allow(dead_code)]

use lading_core::time::system_clock;
use lading_engine::Engine;
use lading_store_sqlite::{SqliteOptions, SqliteTree};
use std::path::Path;
use std::process::Child;
use std::sync::Arc;
use std::time::Duration;

/// Longest a test waits for another process's progress.
pub const UNTIL: Duration = Duration::from_secs(90);

/// A child process that is SIGKILLed when dropped, also when the test fails half-way.
pub struct Reap(pub Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An engine of this test process's own on the store the processes share.
pub async fn engine(db: &Path) -> Arc<Engine> {
    let tree = Arc::new(SqliteTree::open(db, SqliteOptions::default()).unwrap());
    let e = Arc::new(Engine::new(tree, system_clock(), "observer"));
    e.init().await.unwrap();
    e
}

/// Waits until `cond` holds, looked at again and again: another process's progress has no event
/// this process could wait on (its commits reach this handle only when it reads).
pub async fn until(what: &str, cond: impl AsyncFnMut() -> bool) {
    lading_testkit::poll::until_true(what, UNTIL, cond).await
}
