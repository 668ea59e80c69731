//! Where and when jobs run: a submitter's quota keeps its own jobs waiting while others go
//! ahead, and a job that changes hosts is fetched and processed again where it goes. On both
//! stores.

#[macro_use]
mod common;

use common::*;
use lading_core::{BatchState, JobState};
use lading_ingest::checkm::{self, ManifestKind};
use lading_ingest::{Submission, inventory};

on_both_backends!(
    a_submitters_quota_keeps_its_jobs_waiting_while_others_go_ahead,
    a_job_that_changes_hosts_is_fetched_and_processed_again_where_it_goes,
);

/// Hosts with their own working folders share one storage root: a job downloaded on host A,
/// processed on host B and stored on A is fetched again on B (A's files are not there) and
/// processed again on A (B's processed copy is not there), and stores every file, verified.
async fn a_job_that_changes_hosts_is_fetched_and_processed_again_where_it_goes(w: World) {
    let files: [(&str, &[u8]); 2] = [("a.txt", b"first file"), ("dir/b.txt", b"second file")];
    let m = w.object_manifest("o.checkm", &files);
    let a = w.ingest();
    let b = w.other_host("host-b").await;
    assert_ne!(a.cfg.work_dir(), b.cfg.work_dir());
    let bid = w.submit(&a, &m, "manifest").await;
    let run = w.run_stages(&a, EARLY);
    let job = w.first_job(&bid).await;
    w.job_reaches(&job, JobState::Processing).await;
    run.stop().await;
    assert_eq!(w.server.gets("o.checkm.d/a.txt"), 1);
    // Host B processes: the downloads are on A, so B fetches the files itself.
    let run = w.run_stages(&b, &["processing"]);
    w.job_reaches(&job, JobState::Storing).await;
    run.stop().await;
    assert_eq!(w.server.gets("o.checkm.d/a.txt"), 2, "fetched again on B");
    assert_eq!(
        w.server.gets("o.checkm.d/dir/b.txt"),
        2,
        "fetched again on B"
    );
    assert!(
        b.cfg
            .work_dir()
            .join(job.as_str())
            .join("producer/dir/b.txt")
            .is_file()
    );
    // Host A stores: its folder holds the downloads but not B's processing, so A processes
    // again (from its own verified downloads, nothing fetched) before it stores.
    w.runs_to_completion(&a, &bid).await;
    assert_eq!(
        w.server.gets("o.checkm.d/a.txt"),
        2,
        "A's downloads were reused"
    );
    let v = w.stored(&job).await;
    let dir = std::path::Path::new(&v.path);
    assert_eq!(
        stored_files(dir),
        vec![
            "lading-version.json",
            "producer/a.txt",
            "producer/dir/b.txt",
            "system/manifest.checkm",
            "system/mrt-ingest-manifest.checkm",
        ]
    );
    for (name, bytes) in files {
        assert_eq!(
            std::fs::read(dir.join("producer").join(name)).unwrap(),
            bytes
        );
    }
    let versions = inventory::Inventory::new(w.cfg.inventory())
        .versions(&v.ark)
        .unwrap();
    assert_eq!(versions.len(), 1, "recorded once");
    // B's folder stays while the job exists; once cleanup (on A) removes the batch, B's sweep
    // removes it, but only once nothing touched it for the age asked (by default the
    // retention; zero here), and leaves alone what is not a job's.
    use lading_ingest::cleanup::sweep_work_dirs;
    use std::time::Duration;
    let (zero, hour) = (Duration::ZERO, Duration::from_secs(3600));
    let b_dir = b.cfg.work_dir().join(job.as_str());
    std::fs::create_dir_all(b.cfg.work_dir().join("not-a-job")).unwrap();
    assert_eq!(sweep_work_dirs(&b, zero).await.unwrap(), 0);
    assert!(b_dir.is_dir());
    let now = w.engine.clock().now_ms();
    let c = lading_ingest::cleanup::cleanup(&a, now + 1, 0)
        .await
        .unwrap();
    assert_eq!(c.batches, 1);
    assert!(!a.cfg.work_dir().join(job.as_str()).exists());
    assert_eq!(
        sweep_work_dirs(&b, hour).await.unwrap(),
        0,
        "touched within the hour"
    );
    assert!(b_dir.is_dir());
    assert_eq!(sweep_work_dirs(&b, zero).await.unwrap(), 1);
    assert!(!b_dir.exists());
    assert!(b.cfg.work_dir().join("not-a-job").is_dir());
}

/// On both backends (see `on_both_backends!`).
async fn a_submitters_quota_keeps_its_jobs_waiting_while_others_go_ahead(w: World) {
    // One job of this profile in flight per submitter; processing takes a while.
    w.profile(
        "quota",
        "collection = \"demo\"\ncommand = \"sleep 0.3\"\nmax_in_flight_per_submitter = 1\n",
    );
    const ALICE_JOBS: usize = 8;
    let rows: Vec<Vec<String>> = (0..ALICE_JOBS)
        .map(|i| vec![w.file(&format!("a{i}.bin"), b"alice's").0])
        .collect();
    let alice_list = checkm::write(ManifestKind::SingleFileBatch, &[checkm::FILE_URL], &rows);
    let (alice_url, _) = w.file("alice.checkm", alice_list.as_bytes());
    let (bob_url, _) = w.file("bob.bin", b"bob's");
    let ingest = w.ingest();
    let submit = |who: &str, url: String, ty: &str| {
        let s = Submission {
            profile: "quota".into(),
            submitter: who.into(),
            payload_url: url,
            payload_type: ty.into(),
            ..Default::default()
        };
        let ingest = ingest.clone();
        async move { lading_ingest::submit(&ingest, &s).await.unwrap() }
    };
    // Every transition this process commits, from before the first job moves: how many of
    // alice's jobs are in flight is counted at each change, not sampled.
    let mut events = w.engine.subscribe();
    let alice = submit("alice", alice_url, "single-file-batch-manifest").await;
    let run = w.run_all(&ingest);
    w.batch_reaches(&alice, &[BatchState::Processing]).await;
    let bob = submit("bob", bob_url, "file").await;
    let jobs = w.jobs_of(&alice).await;
    assert_eq!(jobs.len(), ALICE_JOBS);
    let mut states: std::collections::HashMap<String, String> = jobs
        .iter()
        .map(|j| (j.to_string(), "Pending".to_string()))
        .collect();
    let (mut most, mut bob_done_first) = (0, false);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let ev = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| panic!("alice's jobs stuck: {states:#?}"))
            .expect("no change event was missed");
        if ev.kind == lading_engine::ChangeKind::Job && states.contains_key(&ev.id) {
            assert_ne!(ev.to, "Failed", "{} failed: {:?}", ev.id, ev.message);
            states.insert(ev.id.clone(), ev.to.clone());
        }
        let done = states.values().filter(|s| *s == "Completed").count();
        let flying = states.len() - done - states.values().filter(|s| *s == "Pending").count();
        most = most.max(flying);
        if ev.kind == lading_engine::ChangeKind::Batch
            && ev.id == bob.as_str()
            && ev.to == "Completed"
        {
            bob_done_first = done < ALICE_JOBS;
        }
        if done == ALICE_JOBS {
            break;
        }
    }
    assert_eq!(most, 1, "alice never had more than one job in flight");
    assert!(bob_done_first, "bob's job was not held behind alice's");
    // Waiting costs nothing: a job over the quota is parked until a slot frees and woken
    // then, not looked at again every round (polling every 500 ms made about 30 waits here).
    let figures = ingest.stats.figures();
    let pending = figures.get("Pending").expect("the Pending stage ran");
    assert!(
        pending.waits >= 1,
        "a job over the quota waited in Pending: {figures:?}"
    );
    assert!(
        pending.waits <= 2 * ALICE_JOBS as u64,
        "parked jobs were polled: {figures:?}"
    );
    assert!(
        w.engine
            .tree()
            .children("/quota-waiters/quota/alice")
            .await
            .unwrap_or_default()
            .is_empty(),
        "no job is left parked"
    );
    w.completes(&alice).await;
    w.completes(&bob).await;
    run.stop().await;
    // Slots are given back lazily; cleanup gives back the rest and drops the empty folders,
    // whatever the batches' age (both batches are young and stay).
    let t = w.engine.tree();
    assert!(t.exists("/quotas/quota/alice").await.unwrap().is_some());
    let before = lading_engine::dump(t.as_ref(), "/batches").await.unwrap();
    let now = w.engine.clock().now_ms();
    let c = lading_ingest::cleanup::cleanup(&ingest, now, 3_600_000)
        .await
        .unwrap();
    assert_eq!(c.batches, 0);
    assert!(c.quotas >= 3, "{c:?}");
    assert!(t.exists("/quotas/quota").await.unwrap().is_none());
    assert_eq!(
        lading_engine::dump(t.as_ref(), "/batches").await.unwrap(),
        before,
        "the batches are as they were"
    );
    // A new reservation makes its folders again.
    let bob2 = submit("bob", w.file("bob2.bin", b"again").0, "file").await;
    let run = w.run_all(&ingest);
    w.completes(&bob2).await;
    run.stop().await;
}
