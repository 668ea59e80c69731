//! What the HTTP tests share: a real server on a loopback port over a real SQLite store, with
//! an ingest config (profiles, data folders) in a temporary directory, and a client.

#![allow(dead_code)]

use lading_core::time::system_clock;
use lading_engine::Engine;
use lading_ingest::{Config, Ingest, TokenSettings};
use lading_jobs::Jobs;
use lading_server::Auth;
use lading_store_sqlite::{SqliteOptions, SqliteTree};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::sync::Arc;

#[allow(unused_imports)]
pub use lading_testkit::events::{Api, multipart};

pub const ADMIN: &str = "admin-token-0123456789";
pub const SUBMITTER: &str = "submitter-token-0123456789";
pub const BOB: &str = "bob-token-0123456789";
/// A processor token for the generic-job type `thumbs` only.
pub const THUMBS: &str = "thumbs-processor-token-0123456789";

pub struct Server {
    /// The API, as any client calls it (`s.get(token, path)`, `s.base`, `s.http`).
    pub api: Api,
    pub jobs: Arc<Jobs>,
    pub ingest: Arc<Ingest>,
    node: Option<lading_node::node::Node>,
    allow: Vec<String>,
    pub dir: tempfile::TempDir,
}

/// Asserts an answer has this status and its `field` this text.
pub fn answered(got: (StatusCode, &Value), status: StatusCode, field: &str, text: &str) {
    let (st, v) = got;
    assert_eq!((st, v[field].as_str()), (status, Some(text)), "{v}");
}

/// A server whose depositors may name the unused loopback port 9 (submissions that are
/// never fetched).
pub async fn start() -> Server {
    start_allowing(&["http://127.0.0.1:9/"]).await
}

/// A server whose depositors may name the URL prefixes `allow` besides public addresses.
pub async fn start_allowing(allow: &[&str]) -> Server {
    let allow: Vec<String> = allow.iter().map(|a| a.to_string()).collect();
    start_in(tempfile::tempdir().unwrap(), allow, false).await
}

/// A server that also runs every stage, as `lading serve` does: what is submitted to it is
/// ingested (into its storage root).
pub async fn start_working() -> Server {
    start_working_allowing(&["http://127.0.0.1:9/"]).await
}

/// [`start_working`], depositors allowed to name the URL prefixes `allow`.
pub async fn start_working_allowing(allow: &[&str]) -> Server {
    let allow = allow.iter().map(|a| a.to_string()).collect();
    start_in(tempfile::tempdir().unwrap(), allow, true).await
}

/// A server on the store and data in `dir` (new or left by an earlier server).
async fn start_in(dir: tempfile::TempDir, allow: Vec<String>, stages: bool) -> Server {
    let tree =
        Arc::new(SqliteTree::open(dir.path().join("lading.db"), SqliteOptions::default()).unwrap());
    let engine = Arc::new(Engine::new(tree, system_clock(), "test"));
    engine.init().await.unwrap();
    let cfg = Config {
        data_dir: dir.path().join("data"),
        reserve_bytes: 0,
        unestimated_min_free_bytes: 0,
        provisioning_round_ms: 200,
        report_settle_s: 0,
        max_upload_bytes: 1 << 20,
        payload: lading_ingest::PayloadSettings {
            allow: allow.clone(),
            ..Default::default()
        },
        ..Config::default()
    };
    std::fs::create_dir_all(cfg.profiles_dir()).unwrap();
    std::fs::write(
        cfg.profiles_dir().join("demo.toml"),
        "collection = \"demo\"\n",
    )
    .unwrap();
    let ingest = Ingest::new(engine, cfg);
    let auth = Auth::new(&[
        TokenSettings {
            name: "root".into(),
            token: ADMIN.into(),
            role: "admin".into(),
            types: Vec::new(),
            collections: Vec::new(),
        },
        TokenSettings {
            name: "alice".into(),
            token: SUBMITTER.into(),
            role: "submitter".into(),
            types: Vec::new(),
            collections: vec!["demo".into()],
        },
        TokenSettings {
            name: "bob".into(),
            token: BOB.into(),
            role: "submitter".into(),
            types: Vec::new(),
            collections: vec!["demo".into()],
        },
        TokenSettings {
            name: "thumbnailer".into(),
            token: THUMBS.into(),
            role: "processor".into(),
            types: vec!["thumbs".into()],
            collections: Vec::new(),
        },
    ])
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let node = lading_node::node::Node::start(
        ingest,
        lading_node::node::NodeSpec {
            http: Some((listener, auth)),
            ..if stages {
                lading_node::node::Node::every_stage()
            } else {
                Default::default()
            }
        },
    )
    .await
    .unwrap();
    Server {
        api: Api::new(format!("http://{}", node.addr.unwrap())),
        jobs: node.jobs.clone(),
        ingest: node.ingest.clone(),
        node: Some(node),
        allow,
        dir,
    }
}

impl std::ops::Deref for Server {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Server {
    /// Stops this server (its store closed) and starts another on the same store and data,
    /// on a new port.
    pub async fn restart(mut self) -> Server {
        if let Some(n) = self.node.take() {
            n.join().await.unwrap();
        }
        let (dir, allow) = (
            std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap()),
            std::mem::take(&mut self.allow),
        );
        start_in(dir, allow, false).await
    }

    pub async fn until_batch(&self, bid: &str, state: &str) -> Value {
        let within = std::time::Duration::from_secs(60);
        (self.api)
            .until_batch(ADMIN, bid, within, |v| v["status"]["status"] == state)
            .await
    }

    /// Submits a batch as `token` whose payload is never fetched (port 9 on loopback, which
    /// `start` allows): the answer, checked to be 201.
    pub async fn submit_unfetched(&self, token: &str) -> Value {
        let body = json!({"payload_url": "http://127.0.0.1:9/x", "profile": "demo"});
        let (st, v) = self.post(token, "/api/v1/batches", body).await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        v
    }

    /// A call as the admin with a body sent as it is, as JSON.
    pub async fn raw(&self, method: &str, path: &str, body: &str) -> (StatusCode, Value) {
        let json = "application/json";
        self.send(ADMIN, method, path, json, body.to_string()).await
    }

    /// Everything stored under the generic-jobs subtree.
    pub async fn stored(&self) -> Value {
        let t = self.jobs.tree();
        let mut out = serde_json::Map::new();
        let mut todo = vec![lading_jobs::ROOT.to_string()];
        while let Some(p) = todo.pop() {
            let Some(n) = t.get(&p).await.unwrap() else {
                continue;
            };
            out.insert(
                p.clone(),
                json!(n.data.map(|d| String::from_utf8_lossy(&d).into_owned())),
            );
            for c in t.children(&p).await.unwrap() {
                todo.push(format!("{p}/{c}"));
            }
        }
        Value::Object(out)
    }

    /// The whole tree, as `lading dump` shows it, but for the records processes keep of
    /// themselves (`/processes`: rewritten every 10 s while they live) and of their stages'
    /// runs (`/stage-metrics`): what a refusal must leave unchanged is the queue.
    pub async fn dump(&self) -> std::collections::BTreeMap<String, Value> {
        let mut all = lading_engine::dump(self.jobs.tree().as_ref(), "/")
            .await
            .unwrap();
        all.retain(|p, _| {
            !["/processes", "/stage-metrics"]
                .iter()
                .any(|r| lading_core::tree::is_under(p, r))
        });
        all
    }
}

impl Server {
    /// Files under the upload folder.
    pub fn uploads(&self) -> Vec<std::path::PathBuf> {
        let root = self.ingest.cfg.data_dir.join("uploads");
        let mut out = Vec::new();
        for d in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            out.push(d.path());
            for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
                out.push(f.path());
            }
        }
        out
    }
}

/// Six Failed jobs: four of collection `letters` (three refused by their host, one with a
/// bad checksum), two of `maps` (refused). Their ids, in that order.
pub async fn failed_jobs_of_two_collections(s: &Server) -> Vec<String> {
    let e = &s.ingest.engine;
    let bid = e.create_batch(Default::default()).await.unwrap();
    let lease = e
        .acquire_batch(lading_core::BatchState::Pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lease.batch, bid);
    let rows = [
        ("letters", "connection refused by the host"),
        ("letters", "Connection REFUSED again"),
        ("letters", "checksum mismatch"),
        ("letters", "connection refused"),
        ("maps", "connection refused"),
        ("maps", "connection refused"),
    ];
    for (collection, _) in rows {
        let cfg = lading_core::layout::JobConfiguration {
            collection: Some(collection.into()),
            profile_name: Some(format!("{collection}_profile")),
            submitter: Some("alice".into()),
            ..Default::default()
        };
        let spec = lading_engine::JobSpec {
            configuration: cfg,
            ..Default::default()
        };
        e.create_job(&lease, spec).await.unwrap();
    }
    e.batch_transition(
        lease,
        lading_core::Event::To(lading_core::BatchState::Processing),
        None,
    )
    .await
    .unwrap();
    let mut ids = Vec::new();
    for (_, message) in rows {
        let l = e
            .acquire_job(lading_core::JobState::Pending)
            .await
            .unwrap()
            .unwrap();
        ids.push(l.job.to_string());
        e.job_transition(l, lading_core::Event::Fail, Some(message.into()))
            .await
            .unwrap();
    }
    ids
}
