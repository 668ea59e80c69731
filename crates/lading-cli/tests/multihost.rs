//! One queue across hosts, as separate processes: a 3-node ZooKeeper ensemble, the inventory
//! on a real PostgreSQL, a storage folder shared by every host, and per host its own data and
//! working folders. `lading serve` runs the API (and intake and reporting) on host A;
//! `lading worker` runs the job stages on hosts B and C. A batch of 100 objects is submitted
//! through A's API; B is SIGKILLed mid-run and the ZooKeeper leader is killed mid-run; C
//! finishes. Then: one report mail, A's event stream showed every transition B and C made,
//! every job's history is complete, and A serves every stored object with its files.

use lading_testkit::payload_server::PayloadServer;
use lading_testkit::pg::PgServer;
use lading_testkit::smtp::Smtp;
use lading_testkit::zk::{ZkEnsemble, free_port};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ADMIN: &str = "multihost-admin-token-0123456789";
const DEPOSITOR: &str = "multihost-depositor-token-0123456789";
const OBJECTS: usize = 100;
/// Longest wait for any one step.
const WAIT: Duration = Duration::from_secs(240);

struct Host {
    name: &'static str,
    dir: PathBuf,
    child: Option<Child>,
    /// From the thread copying its stderr into `log`: `true` at the line that says it runs,
    /// `false` when stderr closes (the process ended).
    said: std::sync::mpsc::Receiver<bool>,
}

impl Host {
    fn start(name: &'static str, root: &Path, store: &str, config: &str, args: &[&str]) -> Host {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("lading.toml"),
            format!("data_dir = \"{}\"\n{config}", dir.join("data").display()),
        )
        .unwrap();
        // It holds tokens: readable by its owner only.
        std::fs::set_permissions(
            dir.join("lading.toml"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let mut log = std::fs::File::create(dir.join("log")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_lading"))
            .args(["--store", store, "--config"])
            .arg(dir.join("lading.toml"))
            .args(args)
            .env_remove("LADING_STORE")
            .env("LADING_ZK_SESSION_TIMEOUT_MS", "4000")
            .env("LADING_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, said) = std::sync::mpsc::channel();
        let err = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in err.lines().map_while(Result::ok) {
                let _ = writeln!(log, "{line}");
                if line.contains("running") {
                    let _ = tx.send(true);
                }
            }
            let _ = tx.send(false);
        });
        let h = Host {
            name,
            dir,
            child: Some(child),
            said,
        };
        match h.said.recv_timeout(WAIT) {
            Ok(true) => h,
            _ => panic!("{name} did not start:\n{}", h.log()),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, and a clean exit within the grace period.
    fn stop(&mut self) {
        let mut c = self.child.take().unwrap();
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        // Its stderr closes when it ends.
        loop {
            match self.said.recv_timeout(WAIT) {
                Ok(true) => continue,
                Ok(false) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    let _ = c.kill();
                    panic!("{} did not stop", self.name);
                }
            }
        }
        let st = c.wait().unwrap();
        assert!(st.success(), "{} exited {st}:\n{}", self.name, self.log());
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A's event stream, read by a task: every `change` event's data, and the `reset`s.
#[derive(Default)]
struct Seen {
    changes: Vec<Value>,
    resets: usize,
}

/// Follows A's event stream (resuming after `last`, when given) into `seen`.
async fn follow(
    base: String,
    seen: Arc<Mutex<Seen>>,
    wake: Arc<tokio::sync::Notify>,
    last: Option<String>,
) {
    let http = reqwest::Client::new();
    let mut req = http.get(format!("{base}/api/v1/events")).bearer_auth(ADMIN);
    if let Some(l) = last {
        req = req.header("Last-Event-ID", l);
    }
    let mut resp = req.send().await.unwrap().error_for_status().unwrap();
    let mut buf = String::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(i) = buf.find("\n\n") {
            let block: String = buf.drain(..i + 2).collect();
            let mut event = "";
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = if v.trim() == "reset" {
                        "reset"
                    } else {
                        "change"
                    };
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim());
                }
            }
            let mut s = seen.lock().unwrap();
            match event {
                "reset" => s.resets += 1,
                "change" => s.changes.push(serde_json::from_str(&data).unwrap()),
                _ => {}
            }
            drop(s);
            wake.notify_waiters();
        }
    }
}

/// Waits until `cond` holds of what the stream showed.
async fn until_seen(
    what: &str,
    seen: &Arc<Mutex<Seen>>,
    wake: &tokio::sync::Notify,
    cond: impl Fn(&Seen) -> bool,
) {
    let start = Instant::now();
    loop {
        let notified = wake.notified();
        if cond(&seen.lock().unwrap()) {
            return;
        }
        let left = WAIT.saturating_sub(start.elapsed());
        assert!(!left.is_zero(), "timed out waiting for {what}");
        // Registered before the look above, so a change after it is not missed.
        let _ = tokio::time::timeout(left, notified).await;
    }
}

fn completed_jobs(s: &Seen) -> usize {
    s.changes
        .iter()
        .filter(|e| e["kind"] == "job" && e["to"] == "Completed")
        .count()
}

/// `url` read with the admin's token; it must answer 200.
async fn admin_get(http: &reqwest::Client, url: String) -> reqwest::Response {
    let r = http.get(&url).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(r.status(), 200, "{url}");
    r
}

/// The jobs batch `bid` completed: every object's.
async fn completed_jobs_of(http: &reqwest::Client, base: &str, bid: &str) -> Vec<String> {
    let batch: Value = admin_get(http, format!("{base}/api/v1/batches/{bid}"))
        .await
        .json()
        .await
        .unwrap();
    let jobs: Vec<String> = batch["jobs"]["batch-completed"]
        .as_array()
        .unwrap_or_else(|| panic!("{batch}"))
        .iter()
        .map(|j| j.as_str().unwrap().to_string())
        .collect();
    assert_eq!(jobs.len(), OBJECTS, "{batch}");
    jobs
}

/// The transitions a stream showed, as (id, from, to, host).
fn keys(seen: &[Value]) -> BTreeSet<(String, String, String, String)> {
    seen.iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
            (s("id"), s("from"), s("to"), s("host"))
        })
        .collect()
}

/// The depositor's files under `payload`, served by `server`, and the single-file batch
/// manifest naming them; each file's bytes by name.
fn write_payload(payload: &Path, server: &PayloadServer) -> BTreeMap<String, Vec<u8>> {
    let mut rows = String::new();
    let mut bodies: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for i in 0..OBJECTS {
        let name = format!("f{i:03}.txt");
        let body = format!("object {i}\n").repeat(100).into_bytes();
        std::fs::write(payload.join(&name), &body).unwrap();
        rows.push_str(&format!("{}\n", server.url(&name)));
        bodies.insert(name, body);
    }
    std::fs::write(
        payload.join("batch.checkm"),
        format!(
            "#%checkm_0.7\n#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-single-file-batch-manifest\n#%fields | nfo:fileUrl\n{rows}#%eof\n"
        ),
    )
    .unwrap();

    bodies
}

/// The config every host shares: the storage root, the profiles, the inventory, the mail
/// server (each host has its own data and working folder).
fn shared_config(root: &Path, inventory: &str, smtp_port: u16, server: &PayloadServer) -> String {
    let shared = root.join("shared");
    std::fs::create_dir_all(shared.join("profiles")).unwrap();
    std::fs::write(
        shared.join("profiles/demo.toml"),
        // Processing takes a moment, so the kills land mid-run.
        "collection = \"demo\"\nnotification = [\"ops@example.org\"]\ncommand = \"sleep 0.3\"\n",
    )
    .unwrap();
    format!(
        "storage_root = \"{}\"\nprofiles_dir = \"{}\"\ninventory = \"{inventory}\"\n\
         reserve_bytes = 0\nunestimated_min_free_bytes = 0\nreport_settle_s = 0\n\
         smtp_host = \"127.0.0.1\"\nsmtp_port = {}\nmail_from = \"lading@example.org\"\n\
         [payload]\nallow = [\"http://{}/\"]\n\
         [[tokens]]\nname = \"ops\"\ntoken = \"{ADMIN}\"\nrole = \"admin\"\n\
         [[tokens]]\nname = \"depositor\"\ntoken = \"{DEPOSITOR}\"\nrole = \"submitter\"\ncollections = [\"demo\"]\n",
        shared.join("storage").display(),
        shared.join("profiles").display(),
        smtp_port,
        server.addr,
    )
}

/// Host A serves (intake, pending, reporting and access) on `listen`; B and C work every
/// job stage.
fn start_hosts(root: &Path, store: &str, config: &str, listen: &str) -> (Host, Host, Host) {
    let a = Host::start(
        "host-a",
        root,
        store,
        config,
        &[
            "serve",
            "--listen",
            listen,
            "--stages",
            "intake,pending,reporting,update-reporting,access-small,access-large",
        ],
    );
    let job_stages = "estimating,provisioning,downloading,processing,storing,recording,notify";
    let b = Host::start(
        "host-b",
        root,
        store,
        config,
        &["worker", "--stages", job_stages],
    );
    let c = Host::start(
        "host-c",
        root,
        store,
        config,
        &["worker", "--stages", job_stages],
    );
    (a, b, c)
}

/// Every job's history is complete, and each transition B and C made (`pids`) is among
/// what each stream showed (`shown`); how many each made, and the jobs' arks.
async fn histories(
    http: &reqwest::Client,
    base: &str,
    jobs: &[String],
    shown: [&BTreeSet<(String, String, String, String)>; 2],
    [b_pid, c_pid]: [u32; 2],
) -> (BTreeMap<String, usize>, Vec<String>) {
    let (shown, resumed_shown) = (shown[0], shown[1]);
    let base2 = base;
    let stages = lading_testkit::JOURNEY;
    let mut by_host: BTreeMap<String, usize> = BTreeMap::new();
    let mut arks = Vec::new();
    for jid in jobs {
        let h: Value = admin_get(http, format!("{base2}/api/v1/jobs/{jid}/history"))
            .await
            .json()
            .await
            .unwrap();
        let entries = h["history"].as_array().unwrap();
        let to: Vec<&str> = entries.iter().filter_map(|e| e["to"].as_str()).collect();
        // Every stage, in order (a stage B died in may appear twice).
        let mut next = stages.iter().skip(1).peekable();
        for t in &to {
            if next.peek() == Some(&t) {
                next.next();
            }
        }
        assert!(next.peek().is_none(), "{jid}: incomplete history {to:?}");
        assert_eq!(to.last(), Some(&"Completed"), "{jid}: {to:?}");
        for e in entries {
            let host = e["host"].as_str().unwrap_or("");
            let made_by = |pid: u32| host.ends_with(&format!(":{pid}"));
            if made_by(b_pid) || made_by(c_pid) {
                *by_host
                    .entry(if made_by(b_pid) { "B" } else { "C" }.into())
                    .or_default() += 1;
                let key = (
                    jid.clone(),
                    e["from"].as_str().unwrap_or("").to_string(),
                    e["to"].as_str().unwrap().to_string(),
                    host.to_string(),
                );
                assert!(
                    shown.contains(&key),
                    "A's stream missed {key:?} (history {entries:?})"
                );
                assert!(
                    resumed_shown.contains(&key),
                    "the stream resumed mid-run missed {key:?} (history {entries:?})"
                );
            }
        }
        let job: Value = admin_get(http, format!("{base2}/api/v1/jobs/{jid}"))
            .await
            .json()
            .await
            .unwrap();
        arks.push(
            job["identifiers"]["primary_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    (by_host, arks)
}

/// A serves every stored object, with the depositor's bytes (inventory on PostgreSQL,
/// storage shared).
async fn every_object_served(
    http: &reqwest::Client,
    base2: &str,
    arks: &[String],
    bodies: &BTreeMap<String, Vec<u8>>,
) {
    let mut served = BTreeSet::new();
    for ark in arks {
        let r = admin_get(
            http,
            format!("{base2}/api/v1/objects/download?ark={ark}&version=1"),
        )
        .await;
        let bytes = r.bytes().await.unwrap().to_vec();
        let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
        for i in 0..z.len() {
            let mut f = z.by_index(i).unwrap();
            let name = f.name().unwrap().to_string();
            if let Some(file) = name.strip_prefix("producer/") {
                let mut v = Vec::new();
                std::io::Read::read_to_end(&mut f, &mut v).unwrap();
                assert_eq!(Some(&v), bodies.get(file), "{ark}: {name}");
                served.insert(file.to_string());
            }
        }
    }
    assert_eq!(
        served.len(),
        OBJECTS,
        "every depositor file was served once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_runs_across_three_hosts_through_a_worker_kill_and_a_leader_kill() {
    let mut zk = ZkEnsemble::start(3).expect("a 3-node ZooKeeper ensemble");
    let hosts = zk.connect_string();
    lading_store_zk::ZkTree::ensure_chroot(&hosts, "/lading")
        .await
        .unwrap();
    let store = format!("zk://{hosts}/lading");
    let pg = PgServer::start().expect("PostgreSQL");
    let inventory = pg.create_db("inventory").unwrap();
    let smtp = Smtp::start().await;
    let root = tempfile::tempdir().unwrap();

    // The depositor's files, served over HTTP, and the manifest naming them.
    let payload = root.path().join("payload");
    std::fs::create_dir_all(&payload).unwrap();
    let server = PayloadServer::start(&payload).await.unwrap();
    let bodies = write_payload(&payload, &server);

    let config = shared_config(root.path(), &inventory, smtp.port, &server);
    let port = free_port().unwrap();
    let listen = format!("127.0.0.1:{port}");
    let (mut a, mut b, mut c) = start_hosts(root.path(), &store, &config, &listen);
    let (b_pid, c_pid) = (b.pid(), c.pid());

    let base = format!("http://{listen}");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let wake = Arc::new(tokio::sync::Notify::new());
    let stream = tokio::spawn(follow(base.clone(), seen.clone(), wake.clone(), None));
    // An event id of a moment before the submission, that A never sent: a client resuming
    // from it is owed everything since, read from the tree.
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .saturating_sub(2000);
    let before = format!("{before:013}-bid0000000000-0-0");
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{base}/api/v1/batches"))
        .bearer_auth(DEPOSITOR)
        .json(&json!({
            "payload_url": server.url("batch.checkm"),
            "profile": "demo",
            "type": "single-file-batch-manifest",
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let bid = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    // B dies mid-run, holding leases; then the ZooKeeper leader dies.
    until_seen("10 jobs completed", &seen, &wake, |s| {
        completed_jobs(s) >= 10
    })
    .await;
    b.kill();
    // A client resumes mid-run, while B's leases lapse and C takes over: from the tree
    // (through ZooKeeper), then live.
    let resumed = Arc::new(Mutex::new(Seen::default()));
    let resumed_stream = tokio::spawn(follow(
        base.clone(),
        resumed.clone(),
        wake.clone(),
        Some(before),
    ));
    until_seen("30 jobs completed", &seen, &wake, |s| {
        completed_jobs(s) >= 30
    })
    .await;
    let leader = zk.leader().expect("a leader");
    zk.nodes[leader].kill();
    let at_leader_kill = completed_jobs(&seen.lock().unwrap());
    assert!(
        at_leader_kill < OBJECTS,
        "the batch finished before the leader was killed"
    );
    until_seen("the batch to end", &seen, &wake, |s| {
        s.changes
            .iter()
            .any(|e| e["kind"] == "batch" && e["id"] == bid.as_str() && e["to"] == "Completed")
    })
    .await;

    until_seen("the batch to end, resumed", &resumed, &wake, |s| {
        s.changes
            .iter()
            .any(|e| e["kind"] == "batch" && e["id"] == bid.as_str() && e["to"] == "Completed")
    })
    .await;

    // The report mail, for this batch.
    let mail = smtp.next().await;
    assert!(mail.contains(&bid), "{mail}");
    stream.abort();
    resumed_stream.abort();

    // Every job's history is complete, and the stream showed every transition B and C made.
    let base2 = base.clone();
    let jobs = completed_jobs_of(&http, &base2, &bid).await;
    let (seen, resets) = {
        let s = seen.lock().unwrap();
        (s.changes.clone(), s.resets)
    };
    let shown = keys(&seen);
    let (resumed_shown, resumed_resets) = {
        let r = resumed.lock().unwrap();
        (keys(&r.changes), r.resets)
    };
    let (by_host, arks) = histories(
        &http,
        &base2,
        &jobs,
        [&shown, &resumed_shown],
        [b_pid, c_pid],
    )
    .await;
    assert!(by_host.get("B").copied().unwrap_or(0) > 0, "{by_host:?}");
    assert!(by_host.get("C").copied().unwrap_or(0) > 0, "{by_host:?}");
    eprintln!(
        "transitions by host: {by_host:?}; completed at the leader kill: {at_leader_kill}; \
         events seen by A's stream: {} (resets: {resets}), by the resumed one: {} (resets: \
         {resumed_resets})",
        seen.len(),
        resumed_shown.len()
    );

    every_object_served(&http, &base2, &arks, &bodies).await;

    // Stopped cleanly, and still one report mail.
    a.stop();
    c.stop();
    assert!(
        smtp.messages.lock().await.try_recv().is_err(),
        "a second report mail"
    );
}
