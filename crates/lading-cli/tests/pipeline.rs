//! `lading worker`, `submit` and `demo` as processes: a worker SIGKILLed mid-download is
//! resumed by another process without fetching verified files again; SIGTERM stops a worker
//! cleanly (also one serving the access queues alone); a worker's default stages include the
//! access queues; a newcomer's `lading demo` runs a batch to its report.

mod common;

use common::{Reap, Setup, engine, object_manifest, until};
use lading_core::BatchState;
use lading_core::layout::BatchId;
use lading_testkit::payload_server::PayloadServer;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

/// A [`Setup`] whose downloads retry quickly, and whose workers log warnings only (these
/// tests read stderr only at the end).
fn setup() -> Setup {
    let mut s = common::setup(
        "",
        "file_attempts = 1\n[stages.downloading]\nmax_attempts = 100\nbackoff_base_ms = 100\nbackoff_max_ms = 200\n",
    );
    s.env.push(("LADING_LOG", "warn"));
    s
}

impl Setup {
    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run lading")
    }

    fn worker(&self) -> Child {
        self.cmd(&["worker", "--grace-s", "5"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a worker")
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("data/work")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_download_is_resumed_by_another_without_refetching() {
    let s = setup();
    let payload = s.dir.path().join("payload");
    std::fs::create_dir_all(&payload).unwrap();
    let server = PayloadServer::start(&payload).await.unwrap();
    let url = object_manifest(
        &server,
        &payload,
        &[("a.bin", &[7u8; 100_000]), ("b.bin", &[9u8; 50_000])],
    );
    // The second file is unavailable for now: the first worker fetches and verifies a.bin,
    // then keeps retrying b.bin.
    server.fail_next("b.bin", 1_000_000);
    let o = s.run(&["submit", &url, "--profile", "demo", "--type", "manifest"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bid = BatchId::parse(String::from_utf8_lossy(&o.stdout).trim()).unwrap();
    let mut first = s.worker();
    let work = s.work();
    until("a.bin verified by the first worker", async || {
        std::fs::read_dir(&work)
            .into_iter()
            .flatten()
            .flatten()
            .any(|d| {
                std::fs::read_to_string(d.path().join(".lading/downloaded.jsonl"))
                    .is_ok_and(|t| t.contains("a.bin"))
            })
    })
    .await;
    until("a failed try of b.bin", async || server.gets("b.bin") >= 1).await;
    first.kill().unwrap(); // SIGKILL: no cleanup runs
    first.wait().unwrap();
    assert_eq!(server.gets("a.bin"), 1);
    server.fail_next("b.bin", 0);
    let second = s.worker();
    let e = engine(&s.db).await;
    until("the batch to complete on the second worker", async || {
        e.batch(&bid).await.unwrap().status.status == BatchState::Completed
    })
    .await;
    assert_eq!(
        server.gets("a.bin"),
        1,
        "a verified file is not fetched again"
    );
    let job = e.batch(&bid).await.unwrap().jobs["batch-completed"][0].clone();
    let log = std::fs::read_to_string(work.join(&job).join("job.log")).unwrap();
    assert!(
        log.contains("a.bin already verified; not fetched again"),
        "{log}"
    );
    // SIGTERM: the worker stops taking work, releases nothing it does not hold, exits 0.
    let st = Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let out = second.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("lading: stopped"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_wait_shows_progress_and_ends_with_the_report() {
    let s = setup();
    let payload = s.dir.path().join("payload");
    std::fs::create_dir_all(&payload).unwrap();
    std::fs::write(payload.join("one.txt"), b"one file").unwrap();
    let url = format!("file://{}", payload.join("one.txt").display());
    let mut worker = Reap(s.worker());
    let o = s.run(&["submit", &url, "--profile", "demo", "--wait"]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{err}");
    assert!(out.contains(": Completed"), "{out}");
    assert!(out.contains("ark:/99999/fk4"), "{out}");
    // A batch that ends Failed: the report, then exit code 5 for scripts.
    let missing = format!("file://{}", payload.join("missing.txt").display());
    let o = s.run(&["submit", &missing, "--profile", "demo", "--wait"]);
    let failed = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(5), "{failed}");
    assert!(failed.contains(": Failed"), "{failed}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("ended Failed"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The failed batch's jobs retried in bulk once the file exists: only those that failed
    // at the stage named (none failed while storing), then all of them; the batch completes.
    let e = engine(&s.db).await;
    let failed_bid = failed
        .split(|c: char| !c.is_ascii_alphanumeric())
        .find(|w| w.starts_with("bid"))
        .expect("the report names the batch")
        .to_string();
    let requeue = ["admin", "job", "requeue", "--batch", &failed_bid, "--stage"];
    let o = s.run(&[&requeue[..], &["Storing"]].concat());
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && said.contains("0 requeued, 0 refused"),
        "{said}"
    );
    let o = s.run(&[&requeue[..], &["Bogus"]].concat());
    assert_eq!(o.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown job state \"Bogus\""));
    std::fs::write(payload.join("missing.txt"), b"here now").unwrap();
    let o = s.run(&requeue[..5]);
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && said.contains("1 requeued, 0 refused"),
        "{said}"
    );
    let bid = lading_core::layout::BatchId::parse(&failed_bid).unwrap();
    until("the retried batch to complete", async || {
        e.batch(&bid).await.unwrap().status.status == lading_core::BatchState::Completed
    })
    .await;
    // The same worker serves the access queues: a request for the stored version gets its zip.
    let ark = out
        .split_whitespace()
        .find(|w| w.starts_with("ark:/99999/fk4"))
        .unwrap()
        .trim_end_matches([',', ';', ')'])
        .to_string();
    let queue = lading_core::layout::AccessQueue::Small;
    let id = e
        .create_access(queue, &serde_json::json!({"ark": ark, "version": 1}))
        .await
        .unwrap();
    let zip = s.dir.path().join(format!("data/access/small-{id}.zip"));
    until("the access request to complete", async || {
        e.access(queue, &id).await.unwrap().status.status == lading_core::AccessState::Completed
    })
    .await;
    assert!(
        std::fs::metadata(&zip).unwrap().len() > 0,
        "{}",
        zip.display()
    );
    worker.0.kill().unwrap();
    worker.0.wait().unwrap();
    // A worker of the access queues alone, as a process of its own.
    let mut access = Reap(
        s.cmd(&["worker", "--stages", "access-large"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let large = lading_core::layout::AccessQueue::Large;
    let id = e
        .create_access(large, &serde_json::json!({"ark": ark, "version": 1}))
        .await
        .unwrap();
    until("the large access request to complete", async || {
        e.access(large, &id).await.unwrap().status.status == lading_core::AccessState::Completed
    })
    .await;
    assert!(
        s.dir
            .path()
            .join(format!("data/access/large-{id}.zip"))
            .exists()
    );
    let st = Command::new("kill")
        .args(["-TERM", &access.0.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let status = access.0.wait().unwrap();
    assert!(
        status.success(),
        "an access worker stops cleanly on SIGTERM: {status:?}"
    );
    // Bad input: an unknown stage is named, with the list.
    let o = s.run(&["worker", "--stages", "access-medium"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("unknown stage \"access-medium\"")
            && err.contains("access-small, access-large"),
        "{err}"
    );
    // Bad input: an unknown profile is refused, and nothing is stored.
    let o = s.run(&["submit", &url, "--profile", "nope"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("unknown profile \"nope\""), "{err}");
    assert_eq!(
        e.batch_ids().await.unwrap().len(),
        2,
        "the completed and the failed batch, nothing more"
    );
}

#[test]
fn demo_runs_a_batch_through_every_stage() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_lading"))
        .args(["demo", "--objects", "2", "--files", "2", "--dir"])
        .arg(dir.path().join("demo"))
        .env_remove("LADING_STORE")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("batch bid0000000000: Completed"), "{out}");
    assert!(out.contains("callbacks received: 2"), "{out}");
    for stage in ["Intake", "Downloading", "Storing", "Recording", "Reporting"] {
        assert!(out.contains(stage), "{stage} in {out}");
    }
}
