//! The backend conformance suite, run unchanged against a real ZooKeeper server.
//!
//! One standalone server serves this test binary; every test gets a fresh, empty store of its
//! own under a unique chroot.

use lading_core::{BoxFuture, Tree};
use lading_store_tests::{Harness, Session};
use lading_store_zk::{ZkOptions, ZkTree};
use lading_testkit::zk::{Relay, ZkNode, ZkServer};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

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

const SESSION: Duration = Duration::from_millis(2000);

impl Harness for ZkHarness {
    fn open(&self) -> BoxFuture<'_, Session> {
        Box::pin(async move {
            ZkTree::ensure_chroot(&self.hosts, &self.chroot)
                .await
                .expect("chroot");
            // Each session talks through its own relay, so it alone can be cut off.
            let relay = Arc::new(Relay::start(server().node.port).await.expect("relay"));
            let url = self
                .url
                .replace(&self.hosts, &format!("127.0.0.1:{}", relay.port));
            let opts = ZkOptions {
                session_timeout: SESSION,
                ..ZkOptions::default()
            };
            let t = Arc::new(ZkTree::open(&url, opts).await.expect("open"));
            let t2 = t.clone();
            Session {
                tree: t as Arc<dyn Tree>,
                expire: Box::new(move || {
                    let (t, relay) = (t2.clone(), relay.clone());
                    Box::pin(async move {
                        // The process is cut off (as if stalled) past its session timeout: the
                        // server expires the session and removes its ephemeral nodes.
                        let id = t.session_id();
                        relay.partition(true);
                        ZkNode::session_gone(server().node.port, id).await;
                        relay.partition(false);
                        assert!(t.wait_expired(Duration::from_secs(30)).await, "expiry seen");
                        // The process notices on its next contact and opens a new session.
                        let _ = t.multi(vec![]).await;
                    })
                }),
            }
        })
    }
}

lading_store_tests::conformance_tests!(harness());
