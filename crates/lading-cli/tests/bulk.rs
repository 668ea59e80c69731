//! `lading admin jobs`, run as an operator would: find jobs by filters, count them, and act
//! on many at once — on the store and through a server.

mod common;

use common::{lading, text};
use std::process::Command;

/// `lading admin jobs`: find jobs by filters, count them, and act on many at once — asked
/// first (without --max it only counts), then at most the count confirmed — on the store
/// and through a server alike, each operation in the audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_jobs_finds_counts_and_acts_in_bulk_on_a_store_and_through_a_server() {
    use lading_core::{Event, JobState};
    // A server that runs no stage: what is requeued stays where the operation put it.
    let s = common::serve::serve_running(None, &[], "", "", &["--stages", "none"]);
    let db = s.dir.path().join("lading.db");
    let e = common::engine(&db).await;
    let (_, jobs) = lading_store_tests::batch_with_jobs(&e, 4, &[]).await;
    for i in 0..4 {
        let l = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
        let msg = if i < 3 {
            "connection refused"
        } else {
            "checksum mismatch"
        };
        e.job_transition(l, Event::Fail, Some(msg.into()))
            .await
            .unwrap();
    }
    let filter = [
        "--state",
        "Failed",
        "--message",
        "REFUSED",
        "--profile",
        "demo_profile",
    ];
    let run = |args: &[&str]| {
        let mut all = vec!["admin", "jobs"];
        all.extend_from_slice(args);
        let o = lading(&db, &all);
        (o.status.code(), text(&o).0, text(&o).1)
    };
    let (code, out, err) = run(&[&["list"], &filter[..]].concat());
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(
        out.lines()
            .all(|l| l.contains("failed at Pending (fatal)") && l.ends_with("connection refused")),
        "{out}"
    );
    // Without --max, bulk says what it would touch, and touches nothing.
    let (code, out, _) = run(&[&["bulk", "requeue"], &filter[..]].concat());
    assert_eq!(code, Some(0));
    assert_eq!(
        out,
        "3 Failed jobs match\nto act on them, run again with --max 3\n"
    );
    assert_eq!(
        e.job(&jobs[0]).await.unwrap().status.status,
        JobState::Failed
    );
    // A bad filter is named, and changes nothing.
    let (code, _, err) = run(&["bulk", "requeue", "--state", "Broken", "--max", "3"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("Broken"), "{err}");
    // On the store: at most the count given.
    let (code, out, err) = run(&[&["bulk", "requeue", "--max", "2"], &filter[..]].concat());
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.ends_with(": 2 of 2 matched jobs requeue, 0 refused\n"),
        "{out}"
    );
    assert_eq!(
        e.job(&jobs[0]).await.unwrap().status.status,
        JobState::Pending
    );
    assert_eq!(
        e.job(&jobs[2]).await.unwrap().status.status,
        JobState::Failed
    );
    // Through the server, as its admin: the last one; the audit log has both.
    let o = Command::new(env!("CARGO_BIN_EXE_lading"))
        .args([
            "--server",
            &s.base,
            "--token",
            common::serve::ADMIN,
            "admin",
            "jobs",
            "bulk",
            "delete",
            "--max",
            "5",
        ])
        .args(filter)
        .env_remove("LADING_STORE")
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.ends_with(": 1 of 1 matched jobs delete, 0 refused\n"),
        "{out}"
    );
    assert_eq!(
        e.job(&jobs[2]).await.unwrap().status.status,
        JobState::Deleted
    );
    assert_eq!(
        e.job(&jobs[3]).await.unwrap().status.status,
        JobState::Failed,
        "not refused"
    );
    let (_, log) = s.get(common::serve::ADMIN, "/api/v1/audit").await;
    let who: Vec<(&str, &str)> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["action"].as_str().unwrap(), o["who"].as_str().unwrap()))
        .collect();
    assert_eq!(who[0], ("delete", "root"), "{log}");
    assert_eq!(who[1].0, "requeue", "{log}");
}
