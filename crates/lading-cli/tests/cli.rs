//! The `lading` binary, run as a user would: exit codes, messages, and that refused commands
//! leave the store as it was.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{lading, text};

/// A store with one finished bench batch of three jobs.
fn store_with_jobs(dir: &Path) -> std::path::PathBuf {
    let db = dir.join("lading.db");
    let o = lading(
        &db,
        &["bench", "queue", "--jobs", "3", "--workers", "2", "--json"],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    let (out, _) = text(&o);
    let v: serde_json::Value =
        serde_json::from_str(out.trim()).expect("bench prints one JSON object");
    for k in [
        "jobs_per_s",
        "transitions_per_s",
        "p50_ms",
        "p99_ms",
        "fsync_per_s",
    ] {
        assert!(v[k].as_f64().is_some_and(|x| x >= 0.0), "{k} in {v}");
    }
    db
}

#[test]
fn dump_prints_the_layout_as_yaml_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let db = store_with_jobs(dir.path());
    let o = lading(&db, &["dump", "/jobs/jid0000000000"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("/jobs/jid0000000000/status:"), "{out}");
    assert!(out.contains("status: Completed"), "{out}");
    let o = lading(&db, &["dump", "--format", "json", "/batches"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["/batches/bid0000000000/status"]["status"], "Reporting");
    assert_eq!(
        v["/batches/bid0000000000/states/batch-completed/jid0000000002"],
        serde_json::Value::Null
    );
}

#[test]
fn status_of_unknown_ids_exits_3_and_names_the_id() {
    let dir = tempfile::tempdir().unwrap();
    let db = store_with_jobs(dir.path());
    let o = lading(&db, &["status", "jid0000000099"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("no such job: jid0000000099"), "{err}");
    let o = lading(&db, &["status", "bid0000000007"]);
    assert_eq!(o.status.code(), Some(3));
    let o = lading(&db, &["status", "not-an-id"]);
    assert_eq!(o.status.code(), Some(3));
    let o = lading(&db, &["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["jobs"]["Completed"], 3);
}

#[test]
fn illegal_admin_transition_exits_4_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = store_with_jobs(dir.path());
    let before = lading(&db, &["dump", "--format", "json"]).stdout;
    let o = lading(&db, &["admin", "job", "hold", "jid0000000001"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(4), "{err}");
    assert!(
        err.contains("cannot hold this job: it is Completed; only a Pending job can be held"),
        "{err}"
    );
    let o = lading(
        &db,
        &[
            "admin",
            "job",
            "requeue",
            "jid0000000001",
            "--to",
            "Nowhere",
        ],
    );
    assert_eq!(o.status.code(), Some(4));
    assert!(text(&o).1.contains("unknown job state \"Nowhere\""));
    // An unknown queue is unknown, as over the API (404).
    let o = lading(&db, &["admin", "queue", "pause", "bogus"]);
    assert_eq!(o.status.code(), Some(3));
    assert!(text(&o).1.contains("no queue \"bogus\""));
    assert_eq!(
        lading(&db, &["dump", "--format", "json"]).stdout,
        before,
        "refused commands leave the store as it was"
    );
}

#[test]
fn admin_verbs_change_state() {
    let dir = tempfile::tempdir().unwrap();
    let db = store_with_jobs(dir.path());
    let o = lading(&db, &["admin", "queue", "pause", "ingest"]);
    assert!(o.status.success());
    let v: serde_json::Value =
        serde_json::from_slice(&lading(&db, &["status", "--json"]).stdout).unwrap();
    assert_eq!(v["paused_queues"], serde_json::json!(["ingest"]));
    assert!(
        lading(&db, &["admin", "queue", "resume", "ingest"])
            .status
            .success()
    );
    assert!(
        lading(&db, &["admin", "collection", "hold", "demo"])
            .status
            .success()
    );
    let o = lading(&db, &["admin", "collection", "release", "demo"]);
    assert!(text(&o).0.contains("released, 0 held"), "{:?}", text(&o));
    // The outbox: counted in the status, listed, and an unknown entry named in the refusal.
    assert_eq!(v["outbox"], serde_json::json!({"waiting": 0, "dead": 0}));
    let o = lading(&db, &["admin", "outbox", "list"]);
    assert_eq!(text(&o).0.trim(), "the outbox is empty", "{:?}", text(&o));
    let o = lading(&db, &["admin", "outbox", "retry", "e0000000009"]);
    assert!(!o.status.success());
    assert!(
        text(&o).1.contains("no outbox entry \"e0000000009\""),
        "{:?}",
        text(&o)
    );
    // A completed job is purged by delete.
    let o = lading(&db, &["admin", "job", "delete", "jid0000000000"]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(
        lading(&db, &["status", "jid0000000000"]).status.code(),
        Some(3)
    );
}

#[test]
fn a_file_that_is_not_a_lading_store_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("notes.txt");
    std::fs::write(&junk, b"these are my notes, not a database\n".repeat(200)).unwrap();
    let o = lading(&junk, &["status"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("not a Lading store"), "{err}");
    assert_eq!(
        std::fs::read(&junk).unwrap(),
        b"these are my notes, not a database\n".repeat(200)
    );
    // Another program's SQLite database.
    let other = dir.path().join("other.db");
    let c = rusqlite::Connection::open(&other).unwrap();
    c.execute_batch("CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT); INSERT INTO customers(name) VALUES ('a');").unwrap();
    drop(c);
    let o = lading(&other, &["dump"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("not a Lading store") && err.contains("customers"),
        "{err}"
    );
    let c = rusqlite::Connection::open(&other).unwrap();
    let n: i64 = c
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1, "no table was added to someone else's database");
    let mode: String = c
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete", "its journal mode was not changed");
}

#[test]
fn a_killed_process_loses_its_locks_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lading.db");
    // One pending job, made with the engine directly.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use lading_core::{BatchState, Event};
        let tree = std::sync::Arc::new(
            lading_store_sqlite::SqliteTree::open(&db, Default::default()).unwrap(),
        );
        let e =
            lading_engine::Engine::new(tree.clone(), lading_core::time::system_clock(), "setup");
        e.init().await.unwrap();
        e.create_batch(Default::default()).await.unwrap();
        let l = e.acquire_batch(BatchState::Pending).await.unwrap().unwrap();
        e.create_job(&l, Default::default()).await.unwrap();
        e.batch_transition(l, Event::To(BatchState::Processing), None)
            .await
            .unwrap();
        lading_core::Tree::close(tree.as_ref()).await.unwrap();
    });
    let mut child = Command::new(env!("CARGO_BIN_EXE_lading"))
        .arg("--store")
        .arg(format!("sqlite:{}", db.display()))
        .arg("hold-job")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "jid0000000000");
    let o = lading(&db, &["dump", "--format", "json", "/jobs/jid0000000000"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v.get("/jobs/jid0000000000/lock").is_some(),
        "the live holder's lock is kept: {v}"
    );
    child.kill().unwrap(); // SIGKILL: no cleanup runs
    child.wait().unwrap();
    let o = lading(&db, &["dump", "--format", "json", "/jobs/jid0000000000"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v.get("/jobs/jid0000000000/lock").is_none(),
        "the dead process's lock is gone: {v}"
    );
    assert_eq!(
        v["/jobs/jid0000000000/status"]["status"], "Pending",
        "the job is where it was"
    );
}

/// Makes a store with one Processing batch of `n` Pending jobs.
fn store_with_pending_jobs(db: &Path, n: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use lading_core::{BatchState, Event};
        let tree = std::sync::Arc::new(
            lading_store_sqlite::SqliteTree::open(db, Default::default()).unwrap(),
        );
        let e =
            lading_engine::Engine::new(tree.clone(), lading_core::time::system_clock(), "setup");
        e.init().await.unwrap();
        e.create_batch(Default::default()).await.unwrap();
        let l = e.acquire_batch(BatchState::Pending).await.unwrap().unwrap();
        for _ in 0..n {
            e.create_job(&l, Default::default()).await.unwrap();
        }
        e.batch_transition(l, Event::To(BatchState::Processing), None)
            .await
            .unwrap();
        lading_core::Tree::close(tree.as_ref()).await.unwrap();
    });
}

#[test]
fn three_processes_sharing_one_store_complete_every_job_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lading.db");
    store_with_pending_jobs(&db, 240);
    let children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_lading"))
                .arg("--store")
                .arg(format!("sqlite:{}", db.display()))
                .args(["drive", "--idle-ms", "1500"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let (mut transitions, mut completed) = (0u64, 0u64);
    for c in children {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{:?}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        let mut it = out.split_whitespace().map(|v| v.parse::<u64>().unwrap());
        transitions += it.next().unwrap();
        completed += it.next().unwrap();
    }
    assert_eq!(completed, 240, "each job completed by exactly one process");
    assert_eq!(transitions, 240 * 8, "every transition made exactly once");
    let v: serde_json::Value =
        serde_json::from_slice(&lading(&db, &["dump", "--format", "json"]).stdout).unwrap();
    let map = v.as_object().unwrap();
    assert_eq!(
        map.keys()
            .filter(|k| k.starts_with("/jobs/states/completed/"))
            .count(),
        240
    );
    assert_eq!(
        map.keys()
            .filter(|k| k.starts_with("/batches/bid0000000000/states/batch-completed/"))
            .count(),
        240
    );
    assert!(
        !map.keys().any(|k| k.ends_with("/lock")),
        "no lock left behind"
    );
    assert_eq!(v["/batches/bid0000000000/status"]["status"], "Reporting");
}

#[test]
fn a_reader_that_stops_early_ends_dump_quietly() {
    // `lading dump | head` must not panic when head goes away.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lading.db");
    let o = lading(
        &db,
        &[
            "bench",
            "queue",
            "--jobs",
            "1000",
            "--workers",
            "4",
            "--json",
        ],
    );
    assert!(o.status.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_lading"))
        .arg("--store")
        .arg(format!("sqlite:{}", db.display()))
        .args(["dump", "--format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 64];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    drop(child.stdout.take()); // the reader goes away with most of the dump unread
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "exit {:?}: {err}", o.status);
    assert!(!err.contains("panicked"), "{err}");
}

/// Merritt's `lockObjectStorage` makes a persistent node; one left by a crashed Merritt
/// process is listed and can be cleared. A live session's lock cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_storage_lock_left_by_merritt_is_listed_and_cleared() {
    use lading_core::{CreateMode, Tree};
    let dir = tempfile::tempdir().unwrap();
    let db = store_with_jobs(dir.path());
    let tree = lading_store_sqlite::SqliteTree::open(&db, Default::default()).unwrap();
    let name = "ark_99999_fk4merritt";
    tree.create(
        &format!("/locks/storage/{name}"),
        None,
        CreateMode::Persistent,
    )
    .await
    .unwrap();
    tree.create(
        "/locks/inventory/ark_99999_fk4live",
        None,
        CreateMode::Ephemeral,
    )
    .await
    .unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&lading(&db, &["status", "--json"]).stdout).unwrap();
    let locks = v["foreign_locks"].as_array().unwrap();
    assert_eq!(locks.len(), 1, "only the persistent one: {v}");
    assert_eq!(
        (locks[0]["kind"].as_str(), locks[0]["name"].as_str()),
        (Some("storage"), Some(name))
    );
    let o = lading(
        &db,
        &["admin", "clear-lock", "inventory", "ark_99999_fk4live"],
    );
    assert!(!o.status.success());
    assert!(
        text(&o).1.contains("held by a live session"),
        "{:?}",
        text(&o)
    );
    let o = lading(
        &db,
        &["admin", "clear-lock", "storage", "ark_99999_fk4nothing"],
    );
    assert!(!o.status.success());
    assert!(
        text(&o)
            .1
            .contains("no storage lock \"ark_99999_fk4nothing\""),
        "{:?}",
        text(&o)
    );
    let o = lading(&db, &["admin", "clear-lock", "storage", name]);
    assert!(o.status.success(), "{:?}", text(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&lading(&db, &["status", "--json"]).stdout).unwrap();
    assert_eq!(v["foreign_locks"], serde_json::json!([]));
    assert!(
        tree.exists("/locks/inventory/ark_99999_fk4live")
            .await
            .unwrap()
            .is_some()
    );
}

/// A command that reads or administers a store never creates one: pointed at a store that
/// does not exist it exits 3 naming it, and no file (nor folder) appears.
#[test]
fn reading_commands_never_create_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("sub/none.db");
    for args in [
        vec!["status"],
        vec!["dump", "/"],
        vec!["admin", "queue", "pause", "ingest"],
        vec!["jobs", "types"],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_lading"))
            .arg("--store")
            .arg(format!("sqlite:{}", db.display()))
            .args(&args)
            .env_remove("LADING_STORE")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{args:?}: {err}");
        assert!(err.contains("no store at"), "{args:?}: {err}");
        assert!(
            !db.exists() && !dir.path().join("sub").exists(),
            "{args:?} made a store"
        );
    }
}

/// `lading --version` names the version and the commit it was built from.
#[test]
fn version_names_the_commit() {
    let o = Command::new(env!("CARGO_BIN_EXE_lading"))
        .arg("--version")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    assert!(
        out.starts_with(&format!("lading {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
    let commit = out
        .split("(commit ")
        .nth(1)
        .unwrap()
        .trim_end_matches([')', '\n']);
    let hash = commit.trim_end_matches("-modified");
    assert!(
        hash == "unknown" || (hash.len() == 12 && hash.chars().all(|c| c.is_ascii_hexdigit())),
        "{out}"
    );
}

/// `--log-format json`: every line a worker writes to stderr is one JSON object (its status
/// lines too), with the level and message; text logs carry no colour codes off a terminal.
#[test]
fn json_logs_are_one_object_per_line_and_text_logs_have_no_colour_off_a_terminal() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lading.db");
    for format in ["json", "text"] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lading"))
            .arg("--store")
            .arg(format!("sqlite:{}", db.display()))
            .args(["--log-format", format, "worker", "--stages", "reporting"])
            .env_remove("LADING_STORE")
            .env_remove("LADING_LOG")
            .env_remove("NO_COLOR")
            .env("LADING_DATA_DIR", dir.path().join("data"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut lines = Vec::new();
        let mut line = String::new();
        // Its first line says it runs; then it is stopped.
        assert!(err.read_line(&mut line).unwrap() > 0, "{format}: no output");
        lines.push(std::mem::take(&mut line));
        // SAFETY: kill only sends a signal to the child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        while err.read_line(&mut line).unwrap() > 0 {
            lines.push(std::mem::take(&mut line));
        }
        assert!(child.wait().unwrap().success(), "{format}: {lines:?}");
        let all = lines.concat();
        assert!(all.contains("stopped"), "{format}: {all}");
        assert!(!all.contains('\u{1b}'), "{format}: colour codes in {all:?}");
        if format == "json" {
            for l in &lines {
                let v: serde_json::Value = serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("not one JSON object: {l:?}: {e}"));
                assert!(v["level"].is_string(), "{l}");
                assert!(v["fields"]["message"].is_string(), "{l}");
            }
        } else {
            assert!(lines[0].starts_with("lading: running"), "{lines:?}");
        }
    }
}

/// Refusals say what is allowed, in plain words, and change nothing: a requeue of a
/// Completed job, an unknown state, an unknown generic-job type, `--server` given to a
/// command that works on the store, releasing a collection that is not held.
#[test]
fn refusals_name_what_is_allowed_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = store_with_jobs(dir.path());
    let before = lading(&db, &["dump", "--format", "json"]).stdout;
    let o = lading(&db, &["admin", "job", "requeue", "jid0000000001"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(4), "{err}");
    assert!(
        err.contains("cannot requeue this job: it is Completed; only a Failed job can be requeued"),
        "{err}"
    );
    assert!(!err.contains("to Completed"), "{err}");
    let o = lading(
        &db,
        &["admin", "job", "requeue", "jid0000000001", "--to", "Bogus"],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(4), "{err}");
    assert!(err.contains("(one of Pending, Held, Estimating"), "{err}");
    let o = lading(
        &db,
        &[
            "--server",
            "http://127.0.0.1:9",
            "--token",
            "t",
            "dump",
            "/",
        ],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot use --server"), "{err}");
    assert!(out.is_empty(), "{out}");
    let o = lading(&db, &["admin", "collection", "release", "nosuch"]);
    let (out, _) = text(&o);
    assert!(o.status.success());
    assert!(out.contains("was not held; nothing released"), "{out}");
    assert_eq!(
        lading(&db, &["dump", "--format", "json"]).stdout,
        before,
        "nothing changed"
    );
    let o = lading(&db, &["jobs", "list", "nosuchtype"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("lading jobs timeout nosuchtype SECONDS"),
        "{err}"
    );
    assert!(!err.contains("set_type_timeout"), "{err}");
    // `--server` on a command that cannot use it creates no store either.
    let none = dir.path().join("none.db");
    let o = lading(&none, &["--server", "http://127.0.0.1:9", "worker"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(!none.exists());
}

#[test]
fn completions_and_the_manual_page_are_printed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lading.db");
    let run = |args: &[&str]| {
        let o = lading(&db, args);
        assert!(o.status.success(), "{args:?}: {}", text(&o).1);
        text(&o).0
    };
    let bash = run(&["completions", "bash"]);
    assert!(
        bash.contains("_lading()") && bash.contains("complete -F _lading"),
        "{bash}"
    );
    assert!(
        bash.contains("requeue") || bash.contains("admin"),
        "subcommands are completed"
    );
    // bash itself accepts the script.
    let script = dir.path().join("lading.bash");
    std::fs::write(&script, &bash).unwrap();
    let st = std::process::Command::new("bash")
        .arg("-n")
        .arg(&script)
        .status()
        .unwrap();
    assert!(st.success(), "bash -n refused the completion script");
    assert!(run(&["completions", "zsh"]).starts_with("#compdef lading"));
    assert!(run(&["completions", "fish"]).contains("complete -c lading"));
    let man = run(&["man"]);
    assert!(
        man.contains(".TH lading 1") && man.contains("submit"),
        "{man}"
    );
    let o = lading(&db, &["completions", "nosh"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("bash, elvish, fish, powershell, zsh"));
    assert!(!db.exists(), "neither made a store");
}

/// The README's exit codes for refused input: a submission the service refuses exits 4, a
/// path not in the tree 3, and neither changes the store.
#[test]
fn refused_submissions_exit_4_and_unknown_paths_3_leaving_the_store_alone() {
    let dir = tempfile::tempdir().unwrap();
    let db = store_with_jobs(dir.path());
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("profiles")).unwrap();
    std::fs::write(data.join("profiles/demo.toml"), "collection = \"demo\"\n").unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_lading"))
            .arg("--store")
            .arg(format!("sqlite:{}", db.display()))
            .args(args)
            .env_remove("LADING_STORE")
            .env("LADING_DATA_DIR", &data)
            .output()
            .unwrap()
    };
    let before = run(&["dump", "--format", "json"]).stdout;
    let cases: [(&[&str], i32, &str); 6] = [
        (
            &["submit", "http://127.0.0.1:9/x", "--profile", "nope"],
            4,
            "unknown profile \"nope\"",
        ),
        (
            &[
                "submit",
                "http://127.0.0.1:9/x",
                "--profile",
                "demo",
                "--type",
                "bogus",
            ],
            4,
            "one of: file, container",
        ),
        (
            &["submit", "not-a-url", "--profile", "demo"],
            4,
            "not an http, https or file URL",
        ),
        (
            &[
                "submit",
                "http://127.0.0.1:9/x",
                "--profile",
                "demo",
                "--submitter",
                " ",
            ],
            4,
            "submitter is empty",
        ),
        (&["dump", "/nope"], 3, "no node at /nope"),
        (&["dump", "nope"], 4, "must start with /"),
    ];
    for (args, code, says) in cases {
        let o = run(args);
        let err = text(&o).1;
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(
        run(&["dump", "--format", "json"]).stdout,
        before,
        "nothing changed"
    );
}

/// Each command's help lists the global options that apply to it, and only those; the man
/// page shows the same.
#[test]
fn global_options_are_shown_only_where_they_apply() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lading.db");
    let help = |args: &[&str]| {
        let mut a = args.to_vec();
        a.push("--help");
        let o = lading(&db, &a);
        assert!(o.status.success(), "{args:?}: {}", text(&o).1);
        text(&o).0
    };
    // (what, --store/--config shown, --server/--token shown)
    let cases: [(&[&str], bool, bool); 10] = [
        (&["completions"], false, false),
        (&["man"], false, false),
        (&["demo"], false, false),
        (&["dump"], true, false),
        (&["worker"], true, false),
        (&["jobs", "list"], true, false),
        (&["bench", "queue"], true, false),
        (&["submit"], true, true),
        (&["status"], true, true),
        (&["admin", "job"], true, true),
    ];
    for (args, store, server) in cases {
        let h = help(args);
        assert_eq!(h.contains("--store <STORE>"), store, "{args:?}: {h}");
        assert_eq!(h.contains("--config <CONFIG>"), store, "{args:?}: {h}");
        assert_eq!(h.contains("--server <SERVER>"), server, "{args:?}: {h}");
        assert_eq!(h.contains("--token <TOKEN>"), server, "{args:?}: {h}");
        assert!(h.contains("--log-format"), "{args:?}: {h}");
    }
    // Hidden is not refused where harmless, and --server is refused where it cannot work.
    let o = lading(
        &db,
        &["completions", "bash", "--config", "/nonexistent.toml"],
    );
    assert!(o.status.success(), "{}", text(&o).1);
    let o = lading(&db, &["dump", "--server", "http://127.0.0.1:9"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o).1);
    assert!(text(&o).1.contains("cannot use --server"));
    assert!(!db.exists(), "nothing made a store");
}

#[test]
fn status_history_lists_each_transition_of_a_job_and_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let db = store_with_jobs(dir.path());
    let o = lading(&db, &["status", "jid0000000000", "--history"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 9, "{out}");
    assert!(lines[0].contains("- → Pending"), "{out}");
    assert!(lines[8].contains("Notify → Completed"), "{out}");
    let o = lading(&db, &["status", "jid0000000000", "--history", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 9);
    assert!(v[3]["host"].as_str().is_some_and(|h| !h.is_empty()));
    let o = lading(&db, &["status", "bid0000000000", "--history"]);
    assert!(
        text(&o).0.contains("Processing → Reporting"),
        "{}",
        text(&o).0
    );
    let o = lading(&db, &["status", "--history"]);
    assert_eq!(o.status.code(), Some(2), "--history needs an id");
}

/// A config's `data_dir` holds its store, for every command that takes the config, from any
/// folder; a command that finds no store says which config and data folder it looked in.
#[test]
fn the_store_lives_in_the_configs_data_dir_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("x/data");
    std::fs::create_dir_all(data.join("profiles")).unwrap();
    std::fs::write(data.join("profiles/demo.toml"), "collection = \"demo\"\n").unwrap();
    let cfg = dir.path().join("lading.toml");
    std::fs::write(
        &cfg,
        format!("data_dir = {:?}\n", data.display().to_string()),
    )
    .unwrap();
    let file = dir.path().join("a.txt");
    std::fs::write(&file, b"a\n").unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_lading"))
            .arg("--config")
            .arg(&cfg)
            .args(args)
            .current_dir(elsewhere.path())
            .env_remove("LADING_STORE")
            .env_remove("LADING_CONFIG")
            .env_remove("LADING_DATA_DIR")
            .output()
            .unwrap()
    };
    let o = run(&[
        "submit",
        &format!("file://{}", file.display()),
        "--profile",
        "demo",
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(data.join("lading.db").exists(), "the store is in data_dir");
    assert!(!elsewhere.path().join("lading-data").exists());
    for args in [
        &["status"][..],
        &["dump", "/batches"],
        &["status", "bid0000000000"],
    ] {
        let o = run(args);
        assert!(o.status.success(), "{args:?}: {:?}", text(&o));
    }
    // The config may name the store itself; --store comes before it.
    let named = dir.path().join("named.db");
    std::fs::write(
        &cfg,
        format!(
            "data_dir = {:?}\nstore = \"sqlite:{}\"\n",
            data.display().to_string(),
            named.display()
        ),
    )
    .unwrap();
    let o = run(&["status"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains(&named.display().to_string()), "{err}");
    assert!(
        err.contains(&format!("the store of {}", cfg.display())),
        "{err}"
    );
    // No store in a config's data folder: the error names the config and the folder.
    let empty = dir.path().join("empty");
    std::fs::write(
        &cfg,
        format!("data_dir = {:?}\n", empty.display().to_string()),
    )
    .unwrap();
    let o = run(&["status"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains(&format!(
            "data_dir {} of {}",
            empty.display(),
            cfg.display()
        )),
        "{err}"
    );
    assert!(!empty.exists(), "nothing was made");
}

/// SPEC §11: a broken setup stops a process at start, not at the first deposit: `serve` and
/// `worker` with a profile whose key is misspelt (`storage_node`) refuse to start, naming the
/// profile's file and the key, and the store is left as it was.
#[test]
fn serve_and_worker_refuse_a_profile_with_a_misspelt_key_naming_file_and_key() {
    let s = common::setup("storage_node = [9501]\n", "listen = \"127.0.0.1:0\"\n");
    for role in ["serve", "worker"] {
        let o = s.cmd(&[role]).stdin(Stdio::null()).output().unwrap();
        let err = text(&o).1;
        assert!(!o.status.success(), "{role} started: {err}");
        assert!(err.contains("demo.toml"), "{role}: {err}");
        assert!(err.contains("storage_node"), "{role}: {err}");
    }
    let o = s.cmd(&["admin", "check-config"]).output().unwrap();
    let (out, err) = text(&o);
    assert!(!o.status.success(), "check-config passed: {out}");
    assert!(
        err.contains("demo.toml") && err.contains("storage_node"),
        "{err}"
    );
}
