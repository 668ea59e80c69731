//! The console's figures over real HTTP on a real SQLite store: jobs ended per minute (counted
//! once, and read back after a restart), the oldest job per state, held collections, and a
//! job's stored files, working files and log tail.

mod common;

use common::*;
use lading_core::{Event, JobState};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;

/// Calls `GET path` until `ok` holds for the answer (at most 60 s: CI runs many suites at once).
async fn until(s: &Server, path: &str, ok: impl Fn(&Value) -> bool) -> Value {
    // The overview read back after a restart has no signal.
    lading_testkit::poll::until(path, Duration::from_secs(60), async || {
        let (st, v) = s.get(ADMIN, path).await;
        assert_eq!(st, StatusCode::OK, "{v}");
        if ok(&v) { Ok(v) } else { Err(v) }
    })
    .await
}

fn totals(ov: &Value) -> (u64, u64) {
    let m = ov["per_minute"].as_array().unwrap();
    assert_eq!(m.len(), 60);
    (
        m.iter().map(|x| x["completed"].as_u64().unwrap()).sum(),
        m.iter().map(|x| x["failed"].as_u64().unwrap()).sum(),
    )
}

/// A processing batch of `n` jobs, made through the engine as a worker would.
async fn batch_of(s: &Server, n: usize) -> Vec<String> {
    let (_, jobs) = lading_store_tests::batch_with_jobs(&s.ingest.engine, n, &[]).await;
    jobs.iter().map(ToString::to_string).collect()
}

/// Moves the next job in `from` on, stage by stage, until `to`.
async fn walk(s: &Server, mut from: JobState, to: JobState) {
    let e = s.ingest.engine.clone();
    while from != to {
        let l = e.acquire_job(from).await.unwrap().unwrap();
        let ev = match (to, from) {
            (JobState::Failed, _) => Event::Fail,
            (_, JobState::Pending) => Event::To(JobState::Estimating),
            _ => Event::Success,
        };
        from = e.job_transition(l, ev, None).await.unwrap().status;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_jobs_are_counted_per_minute_once_and_read_back_after_a_restart() {
    let s = start().await;
    let ids = batch_of(&s, 3).await;
    assert_eq!(ids.len(), 3);
    walk(&s, JobState::Pending, JobState::Completed).await;
    walk(&s, JobState::Pending, JobState::Completed).await;
    walk(&s, JobState::Pending, JobState::Failed).await;
    let ov = until(&s, "/api/v1/overview", |v| totals(v) == (2, 1)).await;
    // All in the minute under way (the last), none elsewhere.
    let last = &ov["per_minute"][59];
    assert_eq!(
        (last["completed"].as_u64(), last["failed"].as_u64()),
        (Some(2), Some(1))
    );
    assert!(last["start_ms"].as_u64().unwrap() <= ov["now_ms"].as_u64().unwrap());
    // Oldest per state: the failed job's, none pending.
    let failed = &ov["oldest"]["Failed"];
    assert_eq!(failed["exact"], json!(true));
    let since = failed["since_ms"].as_u64().expect("a failed job");
    assert!(
        since <= ov["now_ms"].as_u64().unwrap() && since + 60_000 > ov["now_ms"].as_u64().unwrap()
    );
    assert_eq!(ov["oldest"]["Pending"]["since_ms"], Value::Null);
    assert_eq!(ov["oldest"]["Completed"]["exact"], json!(true));
    assert_eq!(ov["held_collections"], json!([]));
    // Held collections are listed.
    let (st, _) = s
        .call(ADMIN, "PUT", "/api/v1/collections/letters/hold", None)
        .await;
    assert_eq!(st, StatusCode::OK);
    let (_, ov) = s.get(ADMIN, "/api/v1/overview").await;
    assert_eq!(ov["held_collections"], json!(["letters"]));
    // The operator's figures only.
    let (st, v) = s.get(SUBMITTER, "/api/v1/overview").await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");

    // After a restart the hour is read back from the jobs' histories: the same counts, once.
    let s = s.restart().await;
    let ov = until(&s, "/api/v1/overview", |v| {
        v["complete_from_ms"].as_u64().unwrap() + 3_000_000 < v["now_ms"].as_u64().unwrap()
    })
    .await;
    assert_eq!(totals(&ov), (2, 1), "{ov:#}");
    // The failed job, requeued and failing again, is counted on top, once. (Past the seconds
    // after the start that the reading back also covers, where a job failing twice in the
    // same second the same way would count once.)
    let live_from = ov["complete_from_ms"].as_u64().unwrap() + 3_600_000;
    until(&s, "/api/v1/overview", |v| {
        v["now_ms"].as_u64().unwrap() >= live_from + 3_000
    })
    .await;
    let e = s.ingest.engine.clone();
    let (_, job) = e
        .list_jobs(JobState::Failed, None, 10)
        .await
        .unwrap()
        .remove(0);
    assert!(ids.contains(&job.to_string()));
    e.requeue_job(&job, None).await.unwrap();
    walk(&s, JobState::Pending, JobState::Failed).await;
    let ov = until(&s, "/api/v1/overview", |v| totals(v) == (2, 2)).await;
    assert_eq!(totals(&ov), (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_files_are_its_stored_versions_working_files_and_log_tail() {
    let s = start().await;
    let ids = batch_of(&s, 1).await;
    let jid = ids[0].clone();
    // A stored version, recorded as the Recording stage does.
    let version = s.dir.path().join("store/v1");
    std::fs::create_dir_all(version.join("producer")).unwrap();
    std::fs::write(version.join("producer/letter.txt"), "hello").unwrap();
    let inv = s.ingest.inventory.clone();
    let v = lading_ingest::stages::StoredVersion {
        ark: "ark:/99999/fk4files".into(),
        version: 1,
        path: version.to_string_lossy().into_owned(),
        job: jid.clone(),
        batch: "bid-x".into(),
        collection: None,
        node: None,
    };
    inv.run(move |i| i.record(&v, None)).await.unwrap();
    // Its working folder on this host: the object's files, Lading's interim state, a log.
    let work = s.ingest.cfg.work_dir().join(&jid);
    std::fs::create_dir_all(work.join("producer/scans")).unwrap();
    std::fs::create_dir_all(work.join(".lading")).unwrap();
    std::fs::write(work.join("producer/scans/p1.tif"), b"0123456789").unwrap();
    std::fs::write(work.join(".lading/owner"), "x").unwrap();
    let log: String = (1..=60).map(|i| format!("line {i}\n")).collect();
    std::fs::write(work.join("job.log"), log).unwrap();

    let (st, f) = s.get(ADMIN, &format!("/api/v1/jobs/{jid}/files")).await;
    assert_eq!(st, StatusCode::OK, "{f}");
    assert_eq!(f["stored"][0]["ark"], "ark:/99999/fk4files");
    assert_eq!(f["stored"][0]["version"], 1);
    assert_eq!(
        f["stored"][0]["files"],
        json!([[
            "producer/letter.txt",
            5,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        ]])
    );
    assert_eq!(f["working"]["present"], true);
    assert_eq!(
        f["working"]["files"],
        json!([{"path": "producer/scans/p1.tif", "size": 10}]),
        "interim state and the log are not the object's files"
    );
    let lines: Vec<&str> = f["log"]["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(lines.len(), 50);
    assert_eq!((lines[0], lines[49]), ("line 11", "line 60"));
    assert_eq!(f["log"]["truncated"], true);

    // A job with nothing anywhere, bad ids, and submitters.
    let other = batch_of(&s, 1).await;
    let fresh = other.iter().find(|j| **j != jid).unwrap();
    let (st, f) = s.get(ADMIN, &format!("/api/v1/jobs/{fresh}/files")).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        (f["stored"].clone(), f["working"]["present"].clone()),
        (json!([]), json!(false))
    );
    assert_eq!(f["log"]["lines"], json!([]));
    let (st, v) = s.get(ADMIN, "/api/v1/jobs/not-a-jid/files").await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("not-a-jid"), "{v}");
    let (st, _) = s.get(ADMIN, "/api/v1/jobs/jid9999999999/files").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // Another submitter's job is not found (as one that does not exist).
    let (st, _) = s.get(SUBMITTER, &format!("/api/v1/jobs/{jid}/files")).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // A log that is a link elsewhere is not followed.
    std::fs::remove_file(work.join("job.log")).unwrap();
    let secret = s.dir.path().join("secret.txt");
    std::fs::write(&secret, "not for the page\n").unwrap();
    std::os::unix::fs::symlink(&secret, work.join("job.log")).unwrap();
    std::os::unix::fs::symlink(s.dir.path(), work.join("producer/outside")).unwrap();
    let (_, f) = s.get(ADMIN, &format!("/api/v1/jobs/{jid}/files")).await;
    assert_eq!(f["log"]["lines"], json!([]), "{f}");
    let listed: Vec<&str> = f["working"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        ["producer/outside", "producer/scans/p1.tif"],
        "a link is listed, not entered"
    );
    // Reading changed nothing.
    assert!(work.join("job.log").exists() && work.join(".lading/owner").exists());
}
