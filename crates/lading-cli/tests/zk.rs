//! The `lading` binary against a real ZooKeeper server: every command on a `zk://` store, and
//! worker processes that die or stall while holding leases.

mod common;

use lading_core::time::system_clock;
use lading_core::{Event, JobState};
use lading_engine::Engine;
use lading_store_zk::{ZkOptions, ZkTree};
use lading_testkit::zk::ZkServer;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

fn server() -> &'static ZkServer {
    static S: OnceLock<ZkServer> = OnceLock::new();
    S.get_or_init(|| ZkServer::start().expect("ZooKeeper"))
}

/// A fresh chroot on the shared server, as a store URL.
async fn store() -> String {
    let hosts = server().connect_string();
    let c = format!("/cli-{}", uuid::Uuid::new_v4().simple());
    ZkTree::ensure_chroot(&hosts, &c).await.unwrap();
    format!("zk://{hosts}{c}")
}

async fn engine(url: &str) -> Arc<Engine> {
    let t = Arc::new(ZkTree::open(url, ZkOptions::default()).await.unwrap());
    let e = Arc::new(Engine::new(t, system_clock(), "test"));
    e.init().await.unwrap();
    e
}

fn lading(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lading"))
        .args(["--store", url])
        .args(args)
        .env_remove("LADING_STORE")
        .output()
        .expect("run lading")
}

fn ok(o: &Output) -> String {
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert!(o.status.success(), "stdout {out}\nstderr {err}");
    out
}

/// A worker process holding one job in `state`, with a short session timeout.
fn hold(url: &str, state: &str, advance: bool) -> (Child, String) {
    let mut args = vec!["--store", url, "hold-job", "--state", state];
    if advance {
        args.push("--advance-on-input");
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_lading"))
        .args(&args)
        .env("LADING_ZK_SESSION_TIMEOUT_MS", "2000")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line.trim().to_string())
}

fn signal(child: &Child, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_works_on_a_zookeeper_store() {
    let url = store().await;
    let e = engine(&url).await;
    let (bid, jobs) = lading_store_tests::batch_with_jobs(&e, 2, &[]).await;
    let out = ok(&lading(&url, &["status"]));
    assert!(out.contains("Pending"), "{out}");
    let out = ok(&lading(&url, &["status", jobs[0].as_str()]));
    assert!(out.contains("Pending"), "{out}");
    let out = ok(&lading(&url, &["dump", &format!("/batches/{bid}")]));
    assert!(out.contains("batch-processing"), "{out}");
    ok(&lading(&url, &["admin", "job", "hold", jobs[1].as_str()]));
    assert_eq!(e.job(&jobs[1]).await.unwrap().status.status, JobState::Held);
    ok(&lading(&url, &["admin", "queue", "pause", "ingest"]));
    assert!(e.queue_paused("ingest").await.unwrap());
    ok(&lading(&url, &["admin", "queue", "resume", "ingest"]));
    let out = ok(&lading(&url, &["drive", "--idle-ms", "500"]));
    assert_eq!(
        out.trim(),
        "8 1",
        "one job through its 8 stages, the held one left"
    );
    // The bench runs in a fresh chroot under the store and removes it afterwards.
    let out = ok(&lading(
        &url,
        &["bench", "queue", "--jobs", "20", "--workers", "4", "--json"],
    ));
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v["jobs_per_s"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["multis"].as_u64().unwrap() >= 20 * 8, "{v}");
    let children = e.tree().children("/").await.unwrap();
    assert!(
        !children.iter().any(|c| c.starts_with("lading-bench")),
        "bench chroot removed: {children:?}"
    );
    // A wrong chroot is named, and nothing is created.
    let o = lading(
        &format!("zk://{}/no/such/root", server().connect_string()),
        &["status"],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("/no/such/root does not exist"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_job_is_picked_up_in_the_state_it_was_in() {
    let url = store().await;
    let e = engine(&url).await;
    let (_bid, jobs) = lading_store_tests::batch_with_jobs(&e, 1, &[]).await;
    let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    e.job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    let (mut child, held) = hold(&url, "Estimating", false);
    assert_eq!(held, jobs[0].as_str());
    assert!(
        e.acquire_job(JobState::Estimating).await.unwrap().is_none(),
        "locked"
    );
    child.kill().unwrap(); // SIGKILL: no cleanup runs
    child.wait().unwrap();
    // Once the dead session expires its lock goes, and the job is there in Estimating.
    let l = e
        .wait_job_or(
            JobState::Estimating,
            Duration::from_secs(30),
            std::future::pending(),
        )
        .await
        .unwrap()
        .expect("picked up after the session expired");
    assert_eq!(l.job, jobs[0]);
    assert_eq!(l.state(), JobState::Estimating);
    e.job_transition(l, Event::Success, None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_past_its_session_sees_lease_lost_and_commits_nothing() {
    let url = store().await;
    let e = engine(&url).await;
    let (_bid, jobs) = lading_store_tests::batch_with_jobs(&e, 1, &[]).await;
    let (mut child, held) = hold(&url, "Pending", true);
    assert_eq!(held, jobs[0].as_str());
    signal(&child, "-STOP");
    // Another worker gets the job once the stalled session has expired, and moves it on.
    // ZooKeeper expires the session on its own clock.
    let l = lading_testkit::poll::until(
        "the stalled lock to expire",
        Duration::from_secs(30),
        async || {
            e.acquire_job(JobState::Pending)
                .await
                .unwrap()
                .ok_or("still locked")
        },
    )
    .await;
    e.job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    // The stalled worker wakes and tries to commit its own move: refused.
    signal(&child, "-CONT");
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{text}");
    assert!(text.contains("lease lost"), "{text}");
    let info = e.job(&jobs[0]).await.unwrap();
    assert_eq!(
        info.status.status,
        JobState::Estimating,
        "moved once, by the live worker"
    );
    assert_eq!(e.job_counts().await.unwrap()[&JobState::Estimating], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_runs_on_zookeeper_across_worker_processes() {
    let url = store().await;
    let common::Setup { dir, config, .. } = common::setup("", "");
    let payload = dir.path().join("payload");
    std::fs::create_dir_all(&payload).unwrap();
    let mut rows = String::new();
    for i in 0..3 {
        let f = payload.join(format!("f{i}.txt"));
        std::fs::write(&f, format!("file {i}")).unwrap();
        rows.push_str(&format!("file://{}\n", f.display()));
    }
    let manifest = payload.join("singles.checkm");
    std::fs::write(
        &manifest,
        format!(
            "#%checkm_0.7\n#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-single-file-batch-manifest\n#%fields | nfo:fileUrl\n{rows}#%eof\n"
        ),
    )
    .unwrap();
    let worker = |stages: &str| {
        Command::new(env!("CARGO_BIN_EXE_lading"))
            .args(["--store", &url, "--config"])
            .arg(&config)
            .args(["worker", "--stages", stages])
            .env_remove("LADING_STORE")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    // Two processes split the stages between them, as separate daemons would.
    let mut early = worker("intake,pending,estimating,provisioning,downloading");
    let mut late = worker("processing,storing,recording,notify,reporting");
    let o = Command::new(env!("CARGO_BIN_EXE_lading"))
        .args(["--store", &url, "--config"])
        .arg(&config)
        .args(["submit", &format!("file://{}", manifest.display())])
        .args([
            "--profile",
            "demo",
            "--type",
            "single-file-batch-manifest",
            "--wait",
        ])
        .env_remove("LADING_STORE")
        .output()
        .unwrap();
    let out = ok(&o);
    assert!(out.contains(": Completed"), "{out}");
    assert_eq!(out.matches("ark:/99999/fk4").count(), 3, "{out}");
    for c in [&mut early, &mut late] {
        signal(c, "-TERM");
        assert!(c.wait().unwrap().success());
    }
    let e = engine(&url).await;
    let counts = e.job_counts().await.unwrap();
    assert_eq!(counts.get(&JobState::Completed), Some(&3));
}

/// Starts `lading worker` (or `serve`) on `url` and waits until it says it runs; its later
/// stderr lines come through the receiver.
fn running(
    url: &str,
    dir: &std::path::Path,
    args: &[&str],
) -> (Child, std::sync::mpsc::Receiver<String>) {
    running_with(url, dir, args, "4000")
}

/// [`running`] with a session timeout of `session_ms`.
fn running_with(
    url: &str,
    dir: &std::path::Path,
    args: &[&str],
    session_ms: &str,
) -> (Child, std::sync::mpsc::Receiver<String>) {
    let data = dir.join("data");
    std::fs::create_dir_all(data.join("profiles")).unwrap();
    let config = dir.join("lading.toml");
    std::fs::write(&config, format!("data_dir = \"{}\"\n", data.display())).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lading"))
        .args(["--store", url, "--config"])
        .arg(&config)
        .args(args)
        .env_remove("LADING_STORE")
        .env("LADING_ZK_SESSION_TIMEOUT_MS", session_ms)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "the process ended early"
        );
        if line.contains("running") {
            break;
        }
    }
    // Keep draining its stderr so it never blocks on a full pipe.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        while err.read_line(&mut line).unwrap_or(0) > 0 {
            let _ = tx.send(std::mem::take(&mut line));
        }
    });
    (child, rx)
}

/// Waits for every child to exit; how long each took from `start`. A child still running at
/// its limit is killed and named.
fn exit_times(children: &mut [(&str, &mut Child, Duration)], start: Instant) -> Vec<Duration> {
    let n = children.len();
    let limits: Vec<(&str, u32, Duration)> = children
        .iter()
        .map(|(name, c, limit)| (*name, c.id(), *limit))
        .collect();
    std::thread::scope(|scope| {
        // Each exit is waited on by a thread of its own and reported the moment it happens.
        let (tx, rx) = std::sync::mpsc::channel();
        for (i, (_, c, _)) in children.iter_mut().enumerate() {
            let tx = tx.clone();
            scope.spawn(move || {
                let _ = c.wait();
                let _ = tx.send((i, start.elapsed()));
            });
        }
        let mut done: Vec<Option<Duration>> = vec![None; n];
        while let Some(next) = (0..n)
            .filter(|&i| done[i].is_none())
            .map(|i| limits[i].2)
            .min()
        {
            match rx.recv_timeout(next.saturating_sub(start.elapsed())) {
                Ok((i, t)) => done[i] = Some(t),
                Err(_) => {
                    let late: Vec<_> = (0..n)
                        .filter(|&i| done[i].is_none() && start.elapsed() >= limits[i].2)
                        .collect();
                    if late.is_empty() {
                        continue;
                    }
                    // The waiting threads end once the children do.
                    for i in (0..n).filter(|&i| done[i].is_none()) {
                        // SAFETY: kill only sends a signal, to a child of this test.
                        unsafe { libc::kill(limits[i].1 as i32, libc::SIGKILL) };
                    }
                    let (name, _, limit) = limits[late[0]];
                    panic!(
                        "{name} still running {:.1} s after SIGTERM",
                        limit.as_secs_f64()
                    );
                }
            }
        }
        done.into_iter().map(Option::unwrap).collect()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_zookeeper_down_exits_within_the_grace_period() {
    // A server of its own: this test kills it.
    let mut zk = ZkServer::start().expect("ZooKeeper");
    let hosts = zk.connect_string();
    ZkTree::ensure_chroot(&hosts, "/down").await.unwrap();
    let url = format!("zk://{hosts}/down");
    let dir = tempfile::tempdir().unwrap();
    let grace = 2;
    let (mut worker, _) = running(
        &url,
        dir.path(),
        &["worker", "--grace-s", &grace.to_string()],
    );
    let (mut server, _) = running(
        &url,
        &dir.path().join("serve"),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--grace-s",
            &grace.to_string(),
        ],
    );
    // A third, stopped with two signals: the second one ends it at once.
    let (mut twice, twice_says) = running(
        &url,
        &dir.path().join("twice"),
        &["worker", "--grace-s", "60"],
    );
    zk.node.kill();
    let start = Instant::now();
    for c in [&worker, &server, &twice] {
        signal(c, "-TERM");
    }
    // The second signal once the first is handled (two pending signals would be one).
    while !twice_says
        .recv_timeout(Duration::from_secs(10))
        .expect("the worker says it is stopping")
        .contains("stopping")
    {}
    signal(&twice, "-TERM");
    let second = start.elapsed();
    // The bound is the grace period with room for a loaded machine (a stop that hangs on the
    // lost ZooKeeper never ends); the twice-signalled worker's is counted from its second
    // signal, which may come seconds after the first on a busy machine.
    let limit = Duration::from_secs(grace + 6);
    let t = exit_times(
        &mut [
            ("lading worker", &mut worker, limit),
            ("lading serve", &mut server, limit),
            // Its grace is 60 s: only the second signal can end it this soon.
            (
                "lading worker signalled twice",
                &mut twice,
                second + Duration::from_secs(10),
            ),
        ],
        start,
    );
    eprintln!(
        "exit after SIGTERM with ZooKeeper down (grace {grace} s): worker {:.2} s, serve {:.2} s, \
         signalled twice {:.2} s after its second signal",
        t[0].as_secs_f64(),
        t[1].as_secs_f64(),
        t[2].saturating_sub(second).as_secs_f64()
    );
}

/// `lading jobs show` on a zk store, as JSON.
fn generic_job(url: &str, id: &str) -> serde_json::Value {
    serde_json::from_str(&ok(&lading(url, &["jobs", "show", "t", id, "--json"]))).unwrap()
}

fn watch_until(url: &str, id: &str, state: &str) {
    let args = format!("jobs watch t {id} --until {state} --timeout-s 60");
    let args: Vec<&str> = args.split(' ').collect();
    ok(&lading(url, &args));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generic_job_whose_processor_was_sigkilled_is_requeued_on_zookeeper() {
    let url = store().await;
    ok(&lading(&url, &["jobs", "timeout", "t", "1"]));
    ok(&lading(
        &url,
        &["jobs", "add", "t", "long", "--data", r#"{"k": 1}"#],
    ));
    let spawn = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_lading"))
            .args(["--store", &url])
            .args(args)
            .env_remove("LADING_STORE")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut stuck = spawn(&["jobs", "run", "t", "--", "sleep", "30"]);
    watch_until(&url, "long", "running");
    stuck.kill().unwrap();
    stuck.wait().unwrap();
    // Two monitors on the store: the job is re-enqueued once.
    let mut monitors = [spawn(&["jobs", "monitor"]), spawn(&["jobs", "monitor"])];
    watch_until(&url, "long", "pending");
    let mut worker = spawn(&["jobs", "run", "t", "--", "true"]);
    watch_until(&url, "long", "finished");
    let job = generic_job(&url, "long");
    assert_eq!(
        (job["runs"].as_u64(), job["stalls"].as_u64(), &job["data"]),
        (Some(2), Some(1), &serde_json::json!({"k": 1}))
    );
    worker.kill().unwrap();
    worker.wait().unwrap();
    for m in &mut monitors {
        m.kill().unwrap();
        m.wait().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_zookeeper_down_and_a_command_running_exits_within_the_grace_period() {
    let mut zk = ZkServer::start().expect("ZooKeeper");
    let hosts = zk.connect_string();
    ZkTree::ensure_chroot(&hosts, "/busy").await.unwrap();
    let url = format!("zk://{hosts}/busy");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("profiles")).unwrap();
    // Processing runs a command that outlasts everything here.
    std::fs::write(
        data.join("profiles/demo.toml"),
        "collection = \"demo\"\ncommand = \"sleep 60\"\n",
    )
    .unwrap();
    let config = dir.path().join("lading.toml");
    std::fs::write(&config, format!("data_dir = \"{}\"\n", data.display())).unwrap();
    let file = dir.path().join("a.txt");
    std::fs::write(&file, b"a\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_lading"))
        .args(["--store", &url, "--config"])
        .arg(&config)
        .args(["submit", &format!("file://{}", file.display())])
        .args(["--profile", "demo", "--type", "file"])
        .env_remove("LADING_STORE")
        .output()
        .unwrap();
    ok(&o);
    let grace = 3;
    // ZooKeeper's usual session timeout: the session outlives the whole stop.
    let (mut worker, says) = running_with(
        &url,
        dir.path(),
        &["worker", "--grace-s", &grace.to_string()],
        "30000",
    );
    let e = engine(&url).await;
    common::until("the job to be processed", async || {
        e.job_counts().await.unwrap().get(&JobState::Processing) == Some(&1)
    })
    .await;
    // Its command is running: ZooKeeper goes, and the signal comes once the worker has
    // found it gone.
    drop(e);
    zk.node.kill();
    while !says
        .recv_timeout(Duration::from_secs(30))
        .expect("the worker says its ZooKeeper connection is lost")
        .contains("ZooKeeper connection lost")
    {}
    let start = Instant::now();
    signal(&worker, "-TERM");
    // Room for a loaded machine, and still well short of the session (30 s) and of the
    // command (60 s), either of which a stop that waited for it would take.
    let limit = Duration::from_secs(grace + 8);
    let t = exit_times(&mut [("lading worker", &mut worker, limit)], start);
    eprintln!(
        "exit after SIGTERM with ZooKeeper down and a command running (grace {grace} s): {:.2} s",
        t[0].as_secs_f64()
    );
}
