//! Live processes (SPEC §12), as an operator sees them through the API: a `lading serve` and
//! two `lading worker`s on one store each announce themselves (host, pid, version with its
//! commit, roles, stages with their concurrency), say which jobs they run now, and a worker
//! killed with SIGKILL is listed gone with what it ran when last heard from; the stage
//! metrics count every process's runs; the console shows both in a real browser. A submitter
//! may read neither.

mod common;

use common::serve::{ADMIN, ALICE, Serve, serve_running};
use common::{Reap, until};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};

/// A payload host that answers HEAD (so estimating passes) and never answers a GET: a
/// download holds its job in Downloading for as long as the test needs it there.
fn silent_payload_host() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held: Vec<TcpStream> = Vec::new();
        for mut conn in listener.incoming().map_while(Result::ok) {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            if head.starts_with(b"HEAD ") {
                let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n");
            } else {
                held.push(conn);
            }
        }
    });
    url
}

/// The processes the API lists.
async fn processes(s: &common::serve::Serve) -> Vec<Value> {
    let (st, v) = s.get(ADMIN, "/api/v1/processes").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    v.as_array().unwrap().clone()
}

fn by_pid(list: &[Value], pid: u32) -> Option<&Value> {
    list.iter().find(|p| p["pid"] == pid)
}

/// The ids of the jobs `p` says it runs, in `stage`.
fn running_in(p: &Value, stage: &str) -> Vec<String> {
    p["running"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["kind"] == "job" && w["stage"] == stage)
        .map(|w| w["id"].as_str().unwrap().to_string())
        .collect()
}

/// What the stages did reaches the stage metrics (each process adds its counts every 5 s):
/// the serve's Estimating moved both jobs on, once each; the workers saw both jobs in
/// Downloading.
async fn stage_metrics_count_both_jobs(s: &Serve) {
    until("the stage metrics count both jobs", async || {
        let (_, m) = s.get(ADMIN, "/api/v1/metrics/stages").await;
        let stage = |n: &str| {
            m["stages"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["stage"] == n).cloned())
        };
        stage("Estimating").is_some_and(|e| e["last_hour"]["done"] == 2)
            && stage("Downloading").is_some_and(|d| d["last_hour"]["depth"].as_u64() >= Some(2))
    })
    .await;
    let (_, m) = s.get(ADMIN, "/api/v1/metrics/stages").await;
    let est = m["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["stage"] == "Estimating")
        .unwrap();
    let per_minute: u64 = est["minutes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["done"].as_u64().unwrap())
        .sum();
    assert_eq!(per_minute, 2, "{est}");
    assert_eq!(est["hours"].as_array().unwrap().len(), 24, "{est}");
    assert_eq!(est["last_day"]["done"], 2, "{est}");
    assert_eq!(est["last_hour"]["failed"], 0, "{est}");
    assert!(est["last_hour"]["p95_ms"].as_u64().is_some(), "{est}");
}

/// The console shows the same, in a real browser: the three processes, the two downloads
/// each under the worker that runs it (`pids`: the serve's, then the workers'), and
/// Estimating's chart with its two runs.
async fn the_console_shows_the_same(s: &Serve, pids: &[u32; 3]) {
    let base = s.base.clone();
    let br = tokio::task::spawn_blocking(move || {
        let mut br = lading_testkit::browser::Browser::launch();
        let sn = br.page(&format!("{base}/#token={ADMIN}"));
        br.wait_for(&sn, "document.querySelector('[data-processes-alive]')?.dataset.processesAlive === '3'");
        br.open(&sn, "#/processes");
        br.wait_for(&sn, "document.querySelectorAll('#processes tr[data-alive=true] [data-running]').length === 2");
        let shown = br.eval(&sn, "[...document.querySelectorAll('#processes tr[data-alive=true]')].filter(r => r.querySelector('[data-roles]').dataset.roles === 'worker').flatMap(r => [...r.querySelectorAll('[data-running]')].map(a => a.dataset.running + ' ' + a.parentElement.textContent.includes('Downloading'))).sort().join()");
        br.open(&sn, "#/stages/Estimating");
        br.wait_for(&sn, "document.getElementById('stage-done').dataset.total === '2'");
        (br, shown)
    })
    .await
    .unwrap();
    let (br, shown) = br;
    assert!(br.console_errors().is_empty(), "{:?}", br.console_errors());
    drop(br);
    let list = processes(s).await;
    let mut running: Vec<String> = pids[1..]
        .iter()
        .flat_map(|pid| running_in(by_pid(&list, *pid).unwrap(), "Downloading"))
        .map(|j| format!("{j} true"))
        .collect();
    running.sort();
    assert_eq!(shown, json!(running.join(",")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_process_says_what_it_runs_and_one_killed_is_shown_gone_with_its_work() {
    let host = silent_payload_host();
    let s = serve_running(
        None,
        std::slice::from_ref(&host),
        "",
        "[stages.downloading]\nconcurrency = 3\n",
        &[
            "--stages",
            "intake,pending,estimating,provisioning,reporting",
        ],
    );
    let store = format!("sqlite:{}", s.dir.path().join("lading.db").display());
    let worker = || {
        Reap(
            Command::new(env!("CARGO_BIN_EXE_lading"))
                .args(["--store", &store, "--config"])
                .arg(s.dir.path().join("lading.toml"))
                .args(["worker", "--stages", "downloading"])
                .env_remove("LADING_STORE")
                .env("LADING_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let (mut a, b) = (worker(), worker());
    let pids = [s.child.id(), a.0.id(), b.0.id()];
    until("the three processes announce themselves", async || {
        let list = processes(&s).await;
        pids.iter()
            .all(|pid| by_pid(&list, *pid).is_some_and(|p| p["alive"] == true))
    })
    .await;
    let list = processes(&s).await;
    let serve = by_pid(&list, pids[0]).unwrap();
    assert_eq!(
        serve["roles"],
        json!(["serve", "worker", "jobs"]),
        "{serve}"
    );
    assert!(
        serve["stages"]["provisioning"].as_u64() >= Some(1),
        "{serve}"
    );
    assert!(serve["stages"].get("downloading").is_none(), "{serve}");
    for pid in &pids[1..] {
        let w = by_pid(&list, *pid).unwrap();
        assert_eq!(w["roles"], json!(["worker"]), "{w}");
        assert_eq!(w["stages"], json!({"downloading": 3}), "{w}");
        assert!(w["version"].as_str().unwrap().contains("(commit "), "{w}");
        assert_eq!(w["host"], serve["host"], "{w}");
        assert!(
            w["heard_at_ms"].as_u64() >= w["started_at_ms"].as_u64(),
            "{w}"
        );
    }

    // Two objects whose downloads never end: each is listed as run by one of the workers.
    let mut jobs = Vec::new();
    for name in ["one.txt", "two.txt"] {
        let (st, v) = s
            .submit(
                ALICE,
                json!({"payload_url": format!("{host}{name}"), "profile": "alpha"}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        jobs.push(v["id"].as_str().unwrap().to_string());
    }
    let mut held_by_a = Vec::new();
    until("both downloads are listed as running", async || {
        let list = processes(&s).await;
        let (Some(pa), Some(pb)) = (by_pid(&list, pids[1]), by_pid(&list, pids[2])) else {
            return false;
        };
        held_by_a = running_in(pa, "Downloading");
        held_by_a.len() + running_in(pb, "Downloading").len() == 2
    })
    .await;
    for w in by_pid(&processes(&s).await, pids[1]).unwrap()["running"]
        .as_array()
        .unwrap()
    {
        assert!(w["id"].as_str().unwrap().starts_with("jid"), "{w}");
        assert!(w["since_ms"].as_u64().unwrap() > 0, "{w}");
    }

    stage_metrics_count_both_jobs(&s).await;

    the_console_shows_the_same(&s, &pids).await;

    // Worker A dies without a word: once its session is reaped it is listed gone, with the
    // jobs it ran when last heard from; the others stay alive.
    a.0.kill().unwrap();
    a.0.wait().unwrap();
    until("the killed worker is listed gone", async || {
        let list = processes(&s).await;
        by_pid(&list, pids[1]).is_some_and(|p| p["alive"] == false)
    })
    .await;
    let list = processes(&s).await;
    let gone = by_pid(&list, pids[1]).unwrap();
    assert_eq!(running_in(gone, "Downloading"), held_by_a, "{gone}");
    assert!(gone.get("stopped_at_ms").is_none(), "{gone}");
    for pid in [pids[0], pids[2]] {
        assert_eq!(by_pid(&list, pid).unwrap()["alive"], true, "{list:?}");
    }
    assert_eq!(
        list.last().unwrap()["pid"],
        pids[1],
        "the gone are listed last"
    );

    // Processes and stage metrics are an operator's business.
    for path in ["/api/v1/processes", "/api/v1/metrics/stages"] {
        let (st, v) = s.get(ALICE, path).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{path}: {v}");
    }
    drop(b);
}
