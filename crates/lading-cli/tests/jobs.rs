//! `lading jobs …` as a user runs it: verbs, errors that leave the store alone, a processor
//! that runs a command per job, and the activity monitor recovering a job whose processor was
//! SIGKILLed.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

fn cmd(store: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lading"));
    // In the test's own folder (a command's default data folder is `./lading-data`).
    c.current_dir(store.parent().expect("the store is in a folder"))
        .arg("--store")
        .arg(format!("sqlite:{}", store.display()))
        .args(args)
        .env_remove("LADING_STORE")
        // `serve` logs at info; these tests read its stderr only up to its token.
        .env("LADING_LOG", "warn");
    c
}

fn lading(store: &Path, args: &[&str]) -> Output {
    cmd(store, args).output().expect("run lading")
}

fn ok(store: &Path, args: &[&str]) -> String {
    let o = lading(store, args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn show(store: &Path, id: &str) -> serde_json::Value {
    serde_json::from_str(&ok(store, &["jobs", "show", "t", id, "--json"])).unwrap()
}

fn spawn(store: &Path, args: &[&str]) -> Child {
    cmd(store, args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn lading")
}

/// Polls `lading jobs show` until the job is in `state` (a bound turns a hang into a failure).
fn wait_state(store: &Path, id: &str, state: &str) -> serde_json::Value {
    let args = format!("jobs watch t {id} --until {state} --timeout-s 30");
    let args: Vec<&str> = args.split(' ').collect();
    let o = lading(store, &args);
    assert!(
        o.status.success(),
        "{id} never reached {state}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    show(store, id)
}

#[test]
fn verbs_add_list_show_remove_and_refuse_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lading.db");
    let o = lading(&db, &["jobs", "add", "t", "a"]);
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no activity timeout"));
    ok(&db, &["jobs", "timeout", "t", "30"]);
    assert_eq!(ok(&db, &["jobs", "timeout", "t"]).trim(), "30");
    assert_eq!(
        ok(&db, &["jobs", "add", "t", "a", "--data", r#"{"n":1}"#]).trim(),
        "a: created"
    );
    assert_eq!(
        ok(&db, &["jobs", "add", "t", "b", "--in", "3600"]).trim(),
        "b: created"
    );
    let before = ok(&db, &["dump", "/generic-jobs"]);
    for (args, code, says) in [
        (
            vec!["jobs", "add", "t", "x/y"],
            4,
            "job id \"x/y\" contains '/'",
        ),
        (
            vec!["jobs", "add", "t", "c", "--data", "{oops"],
            4,
            "--data is not JSON",
        ),
        (vec!["jobs", "remove", "t", "zz"], 3, "no job \"zz\""),
        (vec!["jobs", "show", "t", "zz"], 3, "no job \"zz\""),
        (
            vec!["jobs", "list", "t", "--state", "done"],
            4,
            "unknown state",
        ),
        (vec!["jobs", "timeout", "t", "0"], 4, "must be 1 to"),
        (
            vec!["jobs", "timeout", "t", "18446744073709552"],
            4,
            "must be 1 to",
        ),
    ] {
        let o = lading(&db, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(
        ok(&db, &["dump", "/generic-jobs"]),
        before,
        "refused commands changed nothing"
    );
    let list: serde_json::Value = serde_json::from_str(&ok(
        &db,
        &["jobs", "list", "t", "--state", "pending", "--json"],
    ))
    .unwrap();
    let ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(show(&db, "a")["data"]["n"], 1);
    let types: serde_json::Value = serde_json::from_str(&ok(&db, &["jobs", "types"])).unwrap();
    assert_eq!(types["t"]["pending"], 2);
    assert_eq!(ok(&db, &["jobs", "remove", "t", "b"]).trim(), "b: removed");
    let o = lading(&db, &["jobs", "show", "t", "b"]);
    assert_eq!(o.status.code(), Some(3));
}

#[test]
fn a_processor_runs_the_command_and_its_json_becomes_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lading.db");
    ok(
        &db,
        &[
            "jobs",
            "type",
            "t",
            "--timeout-s",
            "30",
            "--max-attempts",
            "2",
            "--backoff-base-ms",
            "100",
        ],
    );
    ok(
        &db,
        &["jobs", "add", "t", "sum", "--data", r#"{"a":2,"b":3}"#],
    );
    ok(
        &db,
        &["jobs", "add", "t", "fails", "--data", r#"{"keep":true}"#],
    );
    for i in 0..5 {
        ok(&db, &["jobs", "add", "t", &format!("b{i}")]);
    }
    // The command reads the job's data on stdin and prints its result as JSON; one job's
    // command says a dozen lines on stderr and exits 7.
    let script = r#"case "$LADING_JOB_ID" in
        fails) for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo "trouble $i" >&2; done; exit 7;;
        *) read -r d; echo "{\"input\": $d, \"id\": \"$LADING_JOB_ID\"}";;
        esac"#;
    // Batches of three: accepted together, run one by one, finished together.
    let mut p = spawn(
        &db,
        &["jobs", "run", "t", "--batch", "3", "--", "sh", "-c", script],
    );
    let sum = wait_state(&db, "sum", "finished");
    let fails = wait_state(&db, "fails", "failed");
    for i in 0..5 {
        wait_state(&db, &format!("b{i}"), "finished");
    }
    p.kill().unwrap();
    p.wait().unwrap();
    assert_eq!(
        sum["data"],
        serde_json::json!({"input": {"a": 2, "b": 3}, "id": "sum"})
    );
    // A non-zero exit is an error: retried once, then failed, with the last lines said.
    assert_eq!(fails["attempts"], 2);
    assert_eq!(fails["runs"], 2);
    assert_eq!(
        fails["data"],
        serde_json::json!({"keep": true}),
        "data kept"
    );
    let err = fails["last_error"].as_str().unwrap();
    assert!(err.contains("exit status: 7"), "{err}");
    assert!(
        err.contains("trouble 12") && err.contains("trouble 3"),
        "{err}"
    );
    assert!(
        !err.contains("trouble 2\n"),
        "only the last ten lines: {err}"
    );
    let listed = ok(&db, &["jobs", "list", "t", "--state", "failed", "--json"]);
    assert!(listed.contains("\"fails\""), "{listed}");
    // Retried by an admin: pending again, attempts reset; a job not failed is refused.
    ok(&db, &["jobs", "retry", "t", "fails"]);
    let again = show(&db, "fails");
    assert_eq!(
        (again["state"].as_str(), again["attempts"].as_u64()),
        (Some("pending"), None)
    );
    let o = lading(&db, &["jobs", "retry", "t", "sum"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("only a failed job can be retried"), "{err}");
    assert_eq!(show(&db, "sum")["state"], "finished", "nothing changed");
}

#[test]
fn a_job_whose_processor_was_sigkilled_is_requeued_by_the_monitor_and_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lading.db");
    ok(&db, &["jobs", "timeout", "t", "1"]);
    ok(&db, &["jobs", "add", "t", "long"]);
    let mut stuck = spawn(&db, &["jobs", "run", "t", "--", "sleep", "30"]);
    let running = wait_state(&db, "long", "running");
    assert_eq!(running["runs"], 1);
    // The processor announced itself (SPEC §12): its type and how many it runs at once.
    let me = lading_testkit::poll::within_blocking(std::time::Duration::from_secs(60), || {
        announced(&db)
            .into_iter()
            .find(|p| p.record.pid == stuck.id() && p.alive)
    })
    .expect("the processor is listed alive");
    assert_eq!(me.record.roles, ["jobs"]);
    assert_eq!(me.record.stages, [("generic jobs t".to_string(), 1)].into());
    assert!(me.record.version.contains("(commit "), "{:?}", me.record);
    // SIGKILL: no heartbeat, no cleanup. Child::kill sends SIGKILL.
    stuck.kill().unwrap();
    stuck.wait().unwrap();
    // An independent monitor process notices the silence and puts the job back.
    let mut monitor = spawn(&db, &["jobs", "monitor"]);
    let pending = wait_state(&db, "long", "pending");
    assert_eq!(
        (pending["stalls"].as_u64(), pending["runs"].as_u64()),
        (Some(1), Some(1))
    );
    // Another processor runs it to the end.
    let mut worker = spawn(&db, &["jobs", "run", "t", "--", "true"]);
    let done = wait_state(&db, "long", "finished");
    assert_eq!(done["runs"], 2);
    for p in [&mut monitor, &mut worker] {
        p.kill().unwrap();
        p.wait().unwrap();
    }
}

/// The processes announced in the store at `db`, read on a session of this test's own.
fn announced(db: &Path) -> Vec<lading_engine::processes::ProcessInfo> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tree = lading_store_sqlite::SqliteTree::open(db, Default::default()).unwrap();
        let list = lading_engine::processes::list(&tree).await.unwrap();
        lading_core::Tree::close(&tree).await.unwrap();
        list
    })
}

/// One HTTP/1.1 request over a plain socket; returns (status, body).
fn http(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

#[test]
fn serve_makes_an_admin_token_and_serves_generic_jobs_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lading.db");
    let data = dir.path().join("data");
    // With no tokens configured, only loopback is allowed.
    let o = cmd(&db, &["serve", "--listen", "0.0.0.0:0"])
        .env("LADING_DATA_DIR", &data)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("refusing to listen on 0.0.0.0"));
    assert!(
        !data.join("admin.token").exists(),
        "refused before anything was made"
    );

    let (mut server, addr, token) = serve(&db, &data);
    assert_eq!(
        std::fs::read_to_string(data.join("admin.token")).unwrap(),
        token
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(data.join("admin.token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "only the owner may read the token");
    }
    assert_eq!(http(&addr, "GET", "/api/v1/health", None, "").0, 200);
    assert_eq!(http(&addr, "GET", "/api/v1/types", None, "").0, 401);
    let t = Some(token.as_str());
    assert_eq!(
        http(&addr, "PUT", "/api/v1/types/t", t, r#"{"timeout_s": 30}"#).0,
        200
    );
    assert_eq!(
        http(&addr, "POST", "/api/v1/types/t/jobs", t, r#"{"id": "web"}"#).0,
        201
    );
    // The store is shared: the command line sees what the API wrote.
    assert_eq!(show(&db, "web")["state"], "pending");
    let (st, body) = http(&addr, "POST", "/api/v1/types/t/accept", t, "{}");
    assert_eq!(st, 200, "{body}");
    let job: serde_json::Value = serde_json::from_str(&body).unwrap();
    let done = format!(
        r#"{{"lock": "{}", "data": {{"ok": true}}}}"#,
        job["lock"].as_str().unwrap()
    );
    assert_eq!(
        http(&addr, "POST", "/api/v1/types/t/jobs/web/finish", t, &done).0,
        200
    );
    assert_eq!(show(&db, "web")["data"]["ok"], true);
    let st = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let status = server.wait().unwrap();
    assert!(status.success(), "SIGTERM: clean exit, got {status}");
}

#[test]
fn the_jobs_and_http_benchmarks_print_their_figures() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| -> serde_json::Value {
        let o = Command::new(env!("CARGO_BIN_EXE_lading"))
            .args(args)
            .current_dir(dir.path())
            .env_remove("LADING_STORE")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).expect("one JSON object")
    };
    let v = run(&["bench", "jobs", "--jobs", "200", "--workers", "4", "--json"]);
    for k in ["jobs_per_s", "p50_ms", "p99_ms"] {
        assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k} in {v}");
    }
    assert_eq!(v["jobs"], 200);
    let b = run(&[
        "bench",
        "jobs",
        "--jobs",
        "200",
        "--workers",
        "4",
        "--batch",
        "16",
        "--json",
    ]);
    assert!(b["jobs_per_s"].as_f64().is_some_and(|x| x > 0.0), "{b}");
    assert_eq!(b["batch"], 16);
    // Its fresh store is deleted afterwards: nothing is left to inspect, and runs add up.
    let left: Vec<_> = std::fs::read_dir(dir.path().join("lading-bench"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "bench jobs left {left:?}");
    // The console's pages on a store of 1,000 jobs (20 Failed): every page answered.
    let c = run(&[
        "bench",
        "console",
        "--jobs",
        "1000",
        "--samples",
        "3",
        "--json",
    ]);
    assert_eq!(
        (c["jobs"].as_u64(), c["failed"].as_u64()),
        (Some(1000), Some(20)),
        "{c}"
    );
    let pages: Vec<&str> = c["pages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["page"].as_str().unwrap())
        .collect();
    assert_eq!(
        pages,
        ["overview", "processes", "filtered jobs (first page)"],
        "{c}"
    );
    assert!(
        c["pages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["max_ms"].as_f64() > Some(0.0)),
        "{c}"
    );
    assert_eq!(c["count"]["scanned"], 20, "{c}");
    let v = run(&[
        "bench",
        "http",
        "--gets",
        "300",
        "--posts",
        "50",
        "--connections",
        "4",
        "--json",
    ]);
    for k in ["get_job", "post_batch"] {
        assert!(
            v[k]["per_s"].as_f64().is_some_and(|x| x > 0.0),
            "{k} in {v}"
        );
        assert!(
            v[k]["p99_ms"].as_f64().is_some_and(|x| x > 0.0),
            "{k} in {v}"
        );
    }
}

/// Starts `lading serve` on a free port with its data in `data`; returns it, its address and
/// the admin token it printed.
fn serve(db: &Path, data: &Path) -> (Child, String, String) {
    use std::io::BufRead;
    let mut server = cmd(db, &["serve", "--listen", "127.0.0.1:0"])
        .env("LADING_DATA_DIR", data)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(server.stderr.take().unwrap()).lines();
    let (mut token, mut addr) = (None, None);
    while token.is_none() || addr.is_none() {
        let line = lines.next().expect("serve ended early").unwrap();
        if let Some(rest) = line.strip_prefix("lading: admin token ") {
            token = rest.split_whitespace().next().map(str::to_string);
        }
        if let Some(rest) = line.strip_prefix("lading: API on http://") {
            addr = rest.strip_suffix("/api/v1").map(str::to_string);
        }
    }
    std::thread::spawn(move || for _ in lines {});
    (server, addr.unwrap(), token.unwrap())
}

#[test]
fn the_command_line_submits_and_administers_through_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lading.db");
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("profiles")).unwrap();
    std::fs::write(data.join("profiles/demo.toml"), "collection = \"demo\"\n").unwrap();
    let file = dir.path().join("hello.txt");
    std::fs::write(&file, b"hello through the server\n").unwrap();
    let (mut server, addr, token) = serve(&db, &data);
    let url = format!("http://{addr}");
    // No store is opened by the client: point --store somewhere that does not exist.
    let client = |args: &[&str], tok: &str| {
        Command::new(env!("CARGO_BIN_EXE_lading"))
            .args([
                "--store",
                "sqlite:/nonexistent/never.db",
                "--server",
                &url,
                "--token",
                tok,
            ])
            .args(args)
            .env_remove("LADING_STORE")
            .output()
            .unwrap()
    };
    let o = client(
        &[
            "submit",
            file.to_str().unwrap(),
            "--profile",
            "demo",
            "--wait",
        ],
        &token,
    );
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{out}\n{err}");
    let bid = out.lines().next().unwrap().trim().to_string();
    assert!(bid.starts_with("bid"), "{out}");
    assert!(out.contains(&format!("batch {bid}: Completed")), "{out}");
    assert!(out.contains("Completed"), "{out}");
    let o = client(&["status", &bid, "--json"], &token);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["status"]["status"], "Completed");
    assert_eq!(
        v["submission"]["payload_url"]
            .as_str()
            .map(|u| u.ends_with("/hello.txt")),
        Some(true)
    );
    // Refusals keep their exit codes and name the problem.
    let o = client(&["admin", "job", "hold", "jid0000009999"], &token);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = client(&["admin", "batch", "hold", &bid], &token);
    assert_eq!(o.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&o.stderr).contains("illegal"));
    let o = client(&["status"], "wrong-token-0123456789");
    assert_eq!(o.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown token"));
    let o = client(&["admin", "queue", "pause", "ingest"], &token);
    assert!(o.status.success());
    let o = client(&["status", "--json"], &token);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["paused_queues"], serde_json::json!(["ingest"]));
    // An access request, its queues paused so it stays as it is while both paths read it.
    for q in ["accessSmall", "accessLarge"] {
        assert!(
            client(&["admin", "queue", "pause", q], &token)
                .status
                .success()
        );
    }
    let o = client(&["status", &bid, "--json"], &token);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let jid = v["jobs"]["batch-completed"][0]
        .as_str()
        .unwrap()
        .to_string();
    let o = client(&["status", &jid, "--json"], &token);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ark = v["identifiers"]["primary_id"].as_str().unwrap().to_string();
    let body = serde_json::json!({"ark": ark, "version": 1}).to_string();
    let asked = http_post(&addr, &token, "/api/v1/access", &body);
    let qid = asked["id"]
        .as_str()
        .expect("an access request id")
        .to_string();
    // One code path: each verb says the same on the store and through the server.
    let same = [
        vec!["status", qid.as_str()],
        vec!["status", qid.as_str(), "--json"],
        vec!["status", bid.as_str()],
        vec!["status", bid.as_str(), "--history"],
        vec!["admin", "queue", "pause", "ingest"],
        vec!["admin", "collection", "release", "nosuch"],
        vec!["admin", "job", "requeue", "--batch", bid.as_str()],
        vec!["admin", "outbox", "list"],
    ];
    for args in same {
        let remote = client(&args, &token);
        let local = lading(&db, &args);
        assert!(remote.status.success(), "{args:?}: {remote:?}");
        assert_eq!(
            String::from_utf8_lossy(&remote.stdout),
            String::from_utf8_lossy(&local.stdout),
            "{args:?}"
        );
    }
    for (args, code) in [
        (vec!["admin", "batch", "hold", "bid0000009999"], 3),
        (vec!["admin", "queue", "pause", "bogus"], 3),
        (vec!["status", "qid0000009999"], 3),
        (vec!["admin", "outbox", "retry", "e0000000042"], 4),
        (vec!["admin", "clear-lock", "storage", "nosuch"], 4),
    ] {
        let remote = client(&args, &token);
        let local = lading(&db, &args);
        assert_eq!(
            (remote.status.code(), local.status.code()),
            (Some(code), Some(code)),
            "{args:?}: {remote:?} {local:?}"
        );
    }
    Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(server.wait().unwrap().success());
}

/// One POST of a JSON body to the server at `addr` as `token`, over a plain socket: the
/// answer's body as JSON.
fn http_post(addr: &str, token: &str, path: &str, body: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(
        c,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    c.take(1 << 20).read_to_string(&mut answer).unwrap();
    let (_, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

/// A processor whose command cannot be run is refused before it takes a job: it exits
/// naming the command, and the job stays pending with its data.
#[test]
fn a_processor_with_a_command_that_cannot_run_takes_no_job() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    ok(&db, &["jobs", "timeout", "t", "30"]);
    ok(&db, &["jobs", "add", "t", "j1", "--data", r#"{"n":1}"#]);
    for command in ["/no/such/program", "no-such-program-on-path"] {
        let o = lading(&db, &["jobs", "run", "t", "--", command]);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("cannot run") && err.contains(command), "{err}");
        let j = show(&db, "j1");
        assert_eq!(
            (j["state"].as_str(), &j["data"]),
            (Some("pending"), &serde_json::json!({"n": 1})),
            "{j}"
        );
    }
}

#[test]
fn a_schedule_ticks_once_per_second_with_three_monitors_racing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lading.db");
    ok(&db, &["jobs", "type", "t", "--timeout-s", "30"]);
    // Bad input: a clear error, nothing stored.
    for (args, says) in [
        (
            vec!["jobs", "schedule", "t", "s", "--cron", "61 * * * *"],
            "outside 0-59",
        ),
        (vec!["jobs", "schedule", "t", "s", "--every-s", "0"], "1 to"),
        (
            vec!["jobs", "type", "t", "--max-attempts", "0"],
            "max_attempts",
        ),
    ] {
        let o = lading(&db, &args);
        assert!(!o.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(ok(&db, &["jobs", "schedules", "t"]).trim(), "[]");
    ok(&db, &["jobs", "schedule", "t", "tick", "--every-s", "1"]);
    let listed: serde_json::Value =
        serde_json::from_str(&ok(&db, &["jobs", "schedules", "t"])).unwrap();
    assert_eq!(listed[0]["name"], "tick");
    assert_eq!(listed[0]["every_s"], 1);
    // Two monitors beside the processor's own; the processor stops itself (SIGTERM to its
    // parent) once its command has run four jobs.
    let mut monitors: Vec<Child> = (0..2).map(|_| spawn(&db, &["jobs", "monitor"])).collect();
    let out = dir.path().join("ran");
    let script = format!(
        "echo \"$LADING_JOB_ID\" >> '{}'; [ \"$(wc -l < '{}')\" -ge 4 ] && kill -TERM $PPID; exit 0",
        out.display(),
        out.display()
    );
    let status = cmd(&db, &["jobs", "run", "t", "--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    for m in &mut monitors {
        m.kill().unwrap();
        m.wait().unwrap();
    }
    assert!(status.success(), "the processor stopped on its signal");
    let ran = std::fs::read_to_string(&out).unwrap();
    let ticks: Vec<u64> = ran
        .lines()
        .map(|l| l.strip_prefix("tick@").unwrap().parse().unwrap())
        .collect();
    assert!(ticks.len() >= 4, "{ran}");
    let distinct: std::collections::BTreeSet<_> = ticks.iter().collect();
    assert_eq!(distinct.len(), ticks.len(), "each tick once: {ran}");
    // Every job is a tick's (the ids say which), and a finished tick was never added again.
    let list: serde_json::Value =
        serde_json::from_str(&ok(&db, &["jobs", "list", "t", "--json"])).unwrap();
    for j in list.as_array().unwrap() {
        assert!(j["id"].as_str().unwrap().starts_with("tick@"), "{j}");
        assert_eq!(
            j["runs"].as_u64().unwrap_or(0),
            u64::from(j["state"] != "pending"),
            "{j}"
        );
    }
    ok(&db, &["jobs", "unschedule", "t", "tick"]);
    assert_eq!(ok(&db, &["jobs", "schedules", "t"]).trim(), "[]");
}
