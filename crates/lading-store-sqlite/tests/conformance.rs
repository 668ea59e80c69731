//! The backend conformance suite, run against the SQLite store.

use lading_core::{BoxFuture, Tree};
use lading_store_sqlite::{SqliteOptions, SqliteTree};
use lading_store_tests::{Harness, Session};
use std::sync::Arc;

struct SqliteHarness {
    dir: tempfile::TempDir,
    /// Reaps other sessions on demand, as any live process sharing the file would.
    janitor: Arc<SqliteTree>,
}

fn harness() -> SqliteHarness {
    let dir = tempfile::tempdir().expect("tempdir");
    let janitor = Arc::new(
        SqliteTree::open(dir.path().join("lading.db"), SqliteOptions::default()).expect("open"),
    );
    SqliteHarness { dir, janitor }
}

impl Harness for SqliteHarness {
    fn open(&self) -> BoxFuture<'_, Session> {
        Box::pin(async move {
            let t = Arc::new(
                SqliteTree::open(self.dir.path().join("lading.db"), SqliteOptions::default())
                    .expect("open"),
            );
            let (t2, janitor) = (t.clone(), self.janitor.clone());
            Session {
                tree: t as Arc<dyn Tree>,
                expire: Box::new(move || {
                    let (t, j) = (t2.clone(), janitor.clone());
                    Box::pin(async move {
                        t.expire_session().await;
                        j.reap_now().await.expect("reap");
                        // The process notices, as a ZooKeeper client does on reconnect: its
                        // next contact fails and opens a new session.
                        let _ = t.multi(vec![]).await;
                    })
                }),
            }
        })
    }
}

lading_store_tests::conformance_tests!(harness());
