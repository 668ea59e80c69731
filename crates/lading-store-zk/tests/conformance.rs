//! The backend conformance suite, run unchanged against a real ZooKeeper server.
//!
//! One standalone server serves this test binary; every test gets a fresh, empty store of its
//! own under a unique chroot.

use lading_core::{BoxFuture, Tree};
use lading_store_tests::{Harness, Session};
use lading_store_zk::server::ZkServer;
use lading_store_zk::{ZkOptions, ZkTree};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use zookeeper_client as zk;

fn server() -> &'static ZkServer {
    static SERVER: OnceLock<ZkServer> = OnceLock::new();
    SERVER.get_or_init(|| ZkServer::start().expect("start ZooKeeper"))
}

struct ZkHarness {
    url: String,
    hosts: String,
    chroot: String,
}

fn harness() -> ZkHarness {
    let hosts = server().connect_string();
    let chroot = format!("/t-{}", uuid::Uuid::new_v4().simple());
    ZkHarness {
        url: format!("zk://{hosts}{chroot}"),
        hosts,
        chroot,
    }
}

fn options() -> ZkOptions {
    ZkOptions {
        session_timeout: Duration::from_secs(4),
        ..ZkOptions::default()
    }
}

impl Harness for ZkHarness {
    fn open(&self) -> BoxFuture<'_, Session> {
        Box::pin(async move {
            ZkTree::ensure_chroot(&self.hosts, &self.chroot)
                .await
                .expect("chroot");
            let t = Arc::new(ZkTree::open(&self.url, options()).await.expect("open"));
            let (t2, hosts) = (t.clone(), self.hosts.clone());
            Session {
                tree: t as Arc<dyn Tree>,
                expire: Box::new(move || {
                    let (t, hosts) = (t2.clone(), hosts.clone());
                    Box::pin(async move {
                        // Another connection on the same session closes it, as the server
                        // does when a stalled client misses its timeout.
                        let info = t.session_info().expect("open session");
                        let mut tries = 0;
                        loop {
                            tries += 1;
                            assert!(tries <= 10, "could not make the session expire");
                            match zk::Client::connector()
                                .with_session(info.clone())
                                .with_session_timeout(Duration::from_secs(4))
                                .connect(&hosts)
                                .await
                            {
                                // Dropping the twin closes the session it shares.
                                Ok(twin) => drop(twin),
                                Err(zk::Error::SessionExpired) => {}
                                Err(e) => {
                                    eprintln!("twin connect: {e}; again");
                                    continue;
                                }
                            }
                            if t.wait_expired(Duration::from_secs(5)).await {
                                break;
                            }
                        }
                        // The process notices on its next contact and opens a new session.
                        let _ = t.multi(vec![]).await;
                    })
                }),
            }
        })
    }
}

lading_store_tests::conformance_tests!(harness());
