//! Merritt's own ways in, end to end on real parts: jobs and batches Merritt's ingest service
//! and its Java library create in the tree (by package name, by submission keys), batches
//! Merritt starts, moves and leaves locked, and assembly requests Lading cannot assemble. On
//! SQLite and on ZooKeeper.

#[macro_use]
mod common;

use common::*;
use lading_core::{BatchState, JobState};

on_both_backends!(
    merritt_ingest_service_submission_keys_run_to_completion,
    merritt_created_jobs_run_to_completed_and_to_failed,
    a_job_merritts_ingest_service_made_from_a_package_name_is_stored,
    merritt_moving_a_batchs_last_job_is_noticed_by_a_watch,
    a_batch_merritt_starts_while_housekeeping_runs_is_noticed_when_it_finishes,
    a_finished_batch_a_crashed_holder_kept_locked_is_noticed_when_its_session_ends,
    a_batch_reopened_by_a_requeue_is_followed_back_to_processing,
    merritt_assembly_requests_lading_cannot_assemble_fail_at_once_naming_why,
);

/// Only ZooKeeper keeps the order of child changes (`pzxid`) that tells a reference in flight
/// from one gone; on the embedded store every writer is Lading's and moves atomically.
mod on_zookeeper_only {
    use super::*;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_waits_for_its_last_job_to_land_from_merritts_two_request_move() {
        super::a_batch_waits_for_its_last_job_to_land_from_merritts_two_request_move(
            World::on(Backend::ZooKeeper).await,
        )
        .await;
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_last_job_that_never_lands_is_reported_without_when_given_up() {
        super::a_last_job_that_never_lands_is_reported_without_when_given_up(
            World::on(Backend::ZooKeeper).await,
        )
        .await;
    }
}

/// Runs a job Merritt's daemon holds from Pending to its last stage, and makes the last move
/// (to Completed) up to its final request: the job's batch reference deleted from
/// `batch-processing` and not yet made in `batch-completed`. Returns the reference to make.
async fn merritt_runs_to_the_last_request(
    t: &dyn lading_core::tree::Tree,
    bid: &lading_core::layout::BatchId,
    jid: &lading_core::layout::JobId,
) -> String {
    merritt::move_job(t, bid, jid, 5, "Pending", "Estimating").await;
    let mut at = JobState::Estimating;
    while let Some(next) = at.success().filter(|n| *n != JobState::Completed) {
        merritt::move_job(t, bid, jid, 5, at.name(), next.name()).await;
        at = next;
    }
    merritt::move_job_leaving(t, bid, jid, 5, at.name(), "Completed")
        .await
        .expect("the last move changes the job's batch folder")
}

/// Merritt's `Job.setBatchStatePath` moves a batch reference in two requests: it deletes the
/// old one, then makes the new. Housekeeping, watching the batch's `batch-processing` folder,
/// wakes between them and finds it empty; reported then, the batch's report left out its
/// last job (a Completed report of an empty batch). It must wait for the job to land, and
/// report it.
async fn a_batch_waits_for_its_last_job_to_land_from_merritts_two_request_move(w: World) {
    let (url, _) = w.file("m/landing.txt", b"merritt's");
    let ingest = w.ingest();
    let run = w.run_stages(&ingest, &["reporting"]);
    let f = &ingest.finishing;
    let (other, bid, theirs) = merritt_batch_of_one_job(&w, &url).await;
    let n = f.landing();
    let landing = merritt_runs_to_the_last_request(&*other, &bid, &theirs).await;
    tokio::time::timeout(WAIT, f.landing_past(n))
        .await
        .expect("housekeeping found the batch's last job between Merritt's two requests");
    let between = w.engine.batch(&bid).await.unwrap();
    assert_eq!(
        between.status.status,
        BatchState::Processing,
        "not reported while its last job is in no folder"
    );
    assert!(between.status_report.is_none(), "no report written yet");
    merritt::land(&*other, &landing).await;
    merritt::unlock_job(&*other, &theirs).await;
    // Half the re-read's period tells the recheck from the give-up.
    tokio::time::timeout(std::time::Duration::from_secs(15), w.completes(&bid))
        .await
        .expect("the batch was reported once its last job landed, before any give-up");
    let report = w.engine.batch(&bid).await.unwrap().status_report.unwrap();
    assert_eq!(report.completed_jobs, vec![theirs.to_string()]);
    assert!(report.failed_jobs.is_empty());
    run.stop().await;
}

/// A reference that left `batch-processing` and never lands (its mover crashed between its
/// two requests): the batch is not reported while it may still land, and is reported, with
/// the jobs its folders hold, when given up on ([`lading_engine::Engine::report_landed`]).
async fn a_last_job_that_never_lands_is_reported_without_when_given_up(w: World) {
    let (url, _) = w.file("m/lost.txt", b"merritt's");
    let (other, bid, theirs) = merritt_batch_of_one_job(&w, &url).await;
    merritt_runs_to_the_last_request(&*other, &bid, &theirs).await;
    use lading_engine::ReportTry;
    for _ in 0..2 {
        assert_eq!(w.engine.try_report(&bid).await.unwrap(), ReportTry::Landing);
    }
    let before = w.engine.batch(&bid).await.unwrap();
    assert_eq!(before.status.status, BatchState::Processing);
    assert_eq!(
        w.engine.job(&theirs).await.unwrap().status.status,
        JobState::Completed,
        "the job itself is untouched"
    );
    assert_eq!(
        w.engine.report_landed(&bid).await.unwrap(),
        ReportTry::Moved
    );
    assert_eq!(
        w.engine.batch(&bid).await.unwrap().status.status,
        BatchState::Reporting
    );
    assert_eq!(
        w.engine.try_report(&bid).await.unwrap(),
        ReportTry::NotFinished
    );
}

/// An assembly request made by Merritt's `Access.createAssembly` carries only `mrt-zk`'s token
/// fields (no `ark`, no `version`); another carries a token that is not JSON. Neither stays
/// Pending: each is failed at once with a message naming what it lacks, and a good request
/// behind them is still assembled.
async fn merritt_assembly_requests_lading_cannot_assemble_fail_at_once_naming_why(w: World) {
    use lading_core::AccessState;
    use lading_core::layout::AccessQueue;
    let tree = w.engine.tree().clone();
    let token = serde_json::json!({
        "token": "4c0ffee0-0000-4000-8000-000000000001", "delivery-node": 7777,
        "cloud-content-byte": 12, "status": 202, "url": "https://example.org/t",
        "anticipated-availability-time": "2026-11-24T10:00:00-08:00",
    });
    let merritt = merritt::create_assembly(&*tree, "small", Ok(&token)).await;
    let garbled = merritt::create_assembly(&*tree, "small", Err(b"{not json")).await;
    let ingest = w.ingest();
    let (handle, stop) = lading_worker::Shutdown::new();
    let task = tokio::spawn(lading_ingest::access::run(
        ingest.clone(),
        AccessQueue::Small,
        stop,
    ));
    let ends = |p: String| {
        let (e, w) = (w.engine.clone(), &w);
        async move {
            w.until(&format!("request {p} to end"), || async {
                // The status node itself: a request whose token is garbled cannot be read
                // whole through the engine (which names the corrupt node).
                let node = e.tree().get(&format!("{p}/status")).await.unwrap().unwrap();
                let st: lading_core::layout::AccessStatus =
                    serde_json::from_slice(&node.data.unwrap()).unwrap();
                (st.status != AccessState::Pending && st.status != AccessState::Processing)
                    .then_some(st)
            })
            .await
        }
    };
    let st = ends(merritt).await;
    assert_eq!(st.status, AccessState::Failed);
    let msg = st.message.unwrap_or_default();
    assert!(msg.contains("no `ark`"), "{msg}");
    let st = ends(garbled.clone()).await;
    assert_eq!(st.status, AccessState::Failed);
    let msg = st.message.unwrap_or_default();
    assert!(msg.contains("token") && msg.contains(&garbled), "{msg}");
    // The token nodes are as Merritt wrote them.
    let node = tree
        .get(&format!("{garbled}/token"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node.data.unwrap_or_default(), b"{not json");
    handle.stop();
    task.await.unwrap();
}

/// A batch submitted by Merritt's ingest service (`HandlerSubmit`), written node by node as
/// `Batch.createBatch` writes it: its keys (`profile`, `type`, `filename` on Merritt's ingest
/// storage, `title`, `creator`, `localID`, `responseForm`) and no `payload_url`.
async fn merritt_ingest_service_submission_keys_run_to_completion(w: World) {
    let (_, ingest) = with_packages(&w, "object.txt", b"from merritt");
    let tree = w.engine.tree().clone();
    let merritt = |filename: &str| {
        serde_json::json!({
            "batchID": uuid(), "profile": "demo", "type": "file", "filename": filename,
            "size": 12, "submitter": "merritt-user", "responseForm": "xml", "title": "A title",
            "creator": "A creator", "date": "2026", "localID": "merritt-local-1",
            "update": false, "note": "n", "notification": "",
        })
    };
    let good = merritt::create_batch(&*tree, &merritt("queue/object.txt")).await;
    let outside = merritt::create_batch(&*tree, &merritt("../secret.txt")).await;
    let run = w.run_all(&ingest);
    assert_eq!(w.batch_ends(&good).await, BatchState::Completed);
    let job = w.jobs_of(&good).await.remove(0);
    let info = w.engine.job(&job).await.unwrap();
    assert_eq!(info.metadata.get("erc_what"), Some("A title"));
    assert_eq!(info.metadata.get("erc_who"), Some("A creator"));
    assert_eq!(info.identifiers.local_id, ["merritt-local-1"]);
    let cfg = info.configuration.typed().unwrap();
    assert_eq!(cfg.profile_name.as_deref(), Some("demo"));
    assert_eq!(cfg.response_type.as_deref(), Some("xml"), "responseForm");
    let s = w.stored(&job).await;
    assert_eq!(
        std::fs::read(std::path::Path::new(&s.path).join("producer/object.txt")).unwrap(),
        b"from merritt"
    );
    // A filename leading out of the package folder is refused, naming the rule.
    assert_eq!(w.batch_ends(&outside).await, BatchState::Failed);
    let msg = w.batch_message(&outside).await;
    assert!(
        msg.contains("not a file inside merritt_package_root"),
        "{msg}"
    );
    assert!(w.jobs_of(&outside).await.is_empty());
    run.stop().await;
    // Without a package root, such a batch fails saying so.
    let plain = w.ingest();
    let unset = merritt::create_batch(&*tree, &merritt("queue/object.txt")).await;
    let run = w.run_all(&plain);
    w.batch_reaches(&unset, &[BatchState::Failed]).await;
    let msg = w.batch_message(&unset).await;
    assert!(
        msg.contains("merritt_package_root is not configured"),
        "{msg}"
    );
    run.stop().await;
}

/// A job as Merritt's ingest service (`HandlerSubmit`) configures it names its payload by
/// the package's `filename` on Merritt's ingest storage and its `type`, with `profile` for
/// the profile and no URL: it is read from under `merritt_package_root` and stored; one
/// naming a package outside that folder fails, naming the rule, and stores nothing.
async fn a_job_merritts_ingest_service_made_from_a_package_name_is_stored(w: World) {
    let (packages, ingest) = with_packages(&w, "handler.txt", b"by HandlerSubmit");
    let tree = w.engine.tree().clone();
    let bid = merritt_batch(&*tree).await;
    let conf = |filename: &str| {
        serde_json::json!({"profile": "demo", "submitter": "merritt-user",
                           "filename": filename, "type": "file", "responseForm": "xml"})
    };
    let ids = serde_json::json!({"primary_id": "", "local_id": ["handler-local"]});
    let meta = serde_json::json!({"erc_who": "who", "erc_what": "what", "erc_when": "when"});
    let ok = merritt::create_job(
        &*tree,
        &bid,
        2,
        &conf("queue/handler.txt"),
        &ids,
        &meta,
        false,
    )
    .await;
    let outside =
        merritt::create_job(&*tree, &bid, 2, &conf("../secret.txt"), &ids, &meta, false).await;
    merritt::unlock_batch(&*tree, &bid).await;
    let run = w.run_all(&ingest);
    assert_eq!(
        w.batch_ends(&bid).await,
        BatchState::Failed,
        "one of two failed"
    );
    run.stop().await;
    let info = w.engine.job(&ok).await.unwrap();
    assert_eq!(info.status.status, JobState::Completed, "{info:?}");
    let s = w.stored(&ok).await;
    assert_eq!(
        std::fs::read(std::path::Path::new(&s.path).join("producer/handler.txt")).unwrap(),
        b"by HandlerSubmit"
    );
    let failed = w.engine.job(&outside).await.unwrap();
    assert_eq!(failed.status.status, JobState::Failed);
    let msg = failed.status.message.unwrap_or_default();
    assert!(
        msg.contains("not a file inside merritt_package_root"),
        "{msg}"
    );
    assert!(
        !msg.contains(&packages.display().to_string()),
        "no server path: {msg}"
    );
    assert!(
        tree.get(&lading_core::layout::job_node(&outside, "store"))
            .await
            .unwrap()
            .is_none(),
        "nothing stored"
    );
}

/// A folder of Merritt packages holding `queue/NAME`, a file beside it (outside it), and an
/// ingest whose `merritt_package_root` is that folder.
fn with_packages(
    w: &World,
    name: &str,
    bytes: &[u8],
) -> (std::path::PathBuf, std::sync::Arc<lading_ingest::Ingest>) {
    let packages = w.dir.path().join("merritt-packages");
    std::fs::create_dir_all(packages.join("queue")).unwrap();
    std::fs::write(packages.join("queue").join(name), bytes).unwrap();
    std::fs::write(w.dir.path().join("secret.txt"), b"not a package").unwrap();
    let mut cfg = w.cfg.clone();
    cfg.merritt_package_root = Some(packages.clone());
    (packages, lading_ingest::Ingest::new(w.engine.clone(), cfg))
}

/// A batch as Merritt's ingest service makes it and its consumer acquires it.
async fn merritt_batch(t: &dyn lading_core::tree::Tree) -> lading_core::layout::BatchId {
    let bid = merritt::create_batch(
        t,
        &serde_json::json!({"batchID": uuid(), "submitter": "merritt-user", "profile": "demo"}),
    )
    .await;
    merritt::acquire_batch(t, &bid).await;
    bid
}

fn uuid() -> String {
    format!(
        "{:08x}-0000-4000-8000-{:012x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            & 0xffff_ffff_ffff
    )
}

/// Merritt's ingest service and consumer make the batch and its jobs node by node
/// (`Batch.createBatch`, `Batch.acquirePendingBatch`, `Job.createJob` with exactly what
/// `Job.createJobConfiguration`, `createJobIdentifiers` and `createJobMetadata` give: no
/// `file`, and only `batch-processing` made among the batch's folders). Lading's workers take
/// one job to Completed and one to Failed, making Merritt's lazily made folders as they go.
async fn merritt_created_jobs_run_to_completed_and_to_failed(w: World) {
    let (good, _) = w.file("m/merritt-file.txt", b"made by merritt");
    let missing = w.server.url("m/missing.txt");
    let tree = w.engine.tree().clone();
    let bid = merritt_batch(&*tree).await;
    let conf = |url: &str| {
        serde_json::json!({"profile_name": "demo", "submitter": "merritt-user",
                           "payload_url": url, "payload_type": "file", "response_type": "tsv"})
    };
    let ids = serde_json::json!({"primary_id": "", "local_id": ["merritt-local"]});
    let meta = serde_json::json!({"erc_who": "who", "erc_what": "what", "erc_when": "when",
                                  "erc_where": "where"});
    let ok = merritt::create_job(&*tree, &bid, 2, &conf(&good), &ids, &meta, false).await;
    let bad = merritt::create_job(&*tree, &bid, 2, &conf(&missing), &ids, &meta, false).await;
    // A configuration of the wrong shape (a number for the URL) is named, not read as empty.
    let mut odd = conf(&good);
    odd["payload_url"] = serde_json::json!(5);
    let corrupt = merritt::create_job(&*tree, &bid, 2, &odd, &ids, &meta, false).await;
    merritt::unlock_batch(&*tree, &bid).await;
    for f in ["batch-completed", "batch-failed"] {
        assert!(
            tree.exists(&format!("/batches/{bid}/states/{f}"))
                .await
                .unwrap()
                .is_none(),
            "Merritt has not made {f}"
        );
    }
    let ingest = w.ingest();
    let run = w.run_all(&ingest);
    assert_eq!(
        w.batch_ends(&bid).await,
        BatchState::Failed,
        "two of three jobs failed"
    );
    let info = w.engine.job(&ok).await.unwrap();
    assert_eq!(info.status.status, JobState::Completed, "{info:?}");
    assert_eq!(info.metadata.get("erc_what"), Some("what"));
    assert!(
        (info.identifiers.primary_id.as_deref())
            .unwrap()
            .starts_with("ark:/"),
        "an empty primary_id is minted: {info:?}"
    );
    let s = w.stored(&ok).await;
    assert_eq!(
        std::fs::read(std::path::Path::new(&s.path).join("producer/merritt-file.txt")).unwrap(),
        b"made by merritt"
    );
    let failed = w.engine.job(&bad).await.unwrap();
    assert_eq!(failed.status.status, JobState::Failed);
    assert!(
        failed
            .status
            .message
            .as_deref()
            .unwrap_or("")
            .contains("404"),
        "{failed:?}"
    );
    let odd = w.engine.job(&corrupt).await.unwrap();
    assert_eq!(odd.status.status, JobState::Failed);
    let said = odd.status.message.clone().unwrap_or_default();
    assert!(
        said.contains(&format!("/jobs/{corrupt}/configuration is corrupt")),
        "{said}"
    );
    assert_eq!(odd.configuration.raw()["payload_url"], 5, "left as it was");
    let why = odd.configuration.typed().unwrap_err();
    assert!(
        why.contains(&format!("/jobs/{corrupt}/configuration is corrupt")),
        "its typed view names the node: {why}"
    );
    let b = w.engine.batch(&bid).await.unwrap();
    assert_eq!(b.jobs["batch-completed"], vec![ok.clone()]);
    let mut failed = b.jobs["batch-failed"].clone();
    failed.sort();
    let mut want = vec![bad.clone(), corrupt.clone()];
    want.sort();
    assert_eq!(failed, want);
    assert!(b.jobs["batch-processing"].is_empty());
    run.stop().await;
}

/// A batch with one job for Lading and one a Merritt worker holds (its lock, from its own
/// session). Lading finishes its job; then Merritt moves its own job to Completed, with raw
/// writes no Lading code sees: only the watch on the batch's folder can notice at once that the
/// batch is done.
async fn merritt_moving_a_batchs_last_job_is_noticed_by_a_watch(w: World) {
    let (url, _) = w.file("m/ours.txt", b"lading's");
    let tree = w.engine.tree().clone();
    let other = w.other_session().await;
    let bid = merritt_batch(&*tree).await;
    let conf = merritt::file_job(&url);
    let none = serde_json::json!({});
    let ours = merritt::create_job(&*tree, &bid, 5, &conf, &none, &none, false).await;
    let theirs = merritt::create_job(&*other, &bid, 5, &conf, &none, &none, true).await;
    merritt::unlock_batch(&*tree, &bid).await;
    let ingest = w.ingest();
    let run = w.run_all(&ingest);
    w.job_reaches(&ours, JobState::Completed).await;
    assert_eq!(
        w.engine.batch(&bid).await.unwrap().status.status,
        BatchState::Processing,
        "Merritt's job is still running"
    );
    merritt::run_to_completed(&*other, &bid, &theirs).await;
    // Housekeeping also re-reads Processing batches every 30 s: half that bound tells the
    // watch from the fallback (a watch fires in milliseconds).
    tokio::time::timeout(std::time::Duration::from_secs(15), w.completes(&bid))
        .await
        .expect("the batch's completion was noticed by the watch, before any re-read");
    run.stop().await;
}

/// Housekeeping is already watching when Merritt makes a batch, starts it (its
/// `batch-processing` folder appears only with the first job) and runs its only job to
/// Completed from its own session. The watches kept from round to round must follow the
/// batch from Pending to Processing (its status) and onto the folder made after the batch
/// started; a list read only when the batch was Pending, or a watch never set again, leaves
/// it to the 30 s re-read.
async fn a_batch_merritt_starts_while_housekeeping_runs_is_noticed_when_it_finishes(w: World) {
    let (url, _) = w.file("m/theirs.txt", b"merritt's");
    let ingest = w.ingest();
    // Reporting only (with housekeeping): no Lading stage takes Merritt's job or batch.
    let run = w.run_stages(&ingest, &["reporting"]);
    // Merritt's steps wait for housekeeping to have set its watches again after them (its
    // hook, not a pause): it reads its list with no batch, with the batch made (Pending),
    // and with the batch started; each round must follow the batch onto what it watches next.
    let f = &ingest.finishing;
    let rearmed = async |past: u64, after: &str| {
        tokio::time::timeout(WAIT, f.armed_past(past))
            .await
            .unwrap_or_else(|_| panic!("housekeeping set its watches again after {after}"))
    };
    rearmed(0, "it started").await;
    let other = w.other_session().await;
    let n = f.armed();
    let bid = merritt::create_batch(
        &*other,
        &serde_json::json!({"batchID": uuid(), "submitter": "merritt-user", "profile": "demo"}),
    )
    .await;
    rearmed(n, "the batch was made").await;
    merritt::acquire_batch(&*other, &bid).await;
    let conf = merritt::file_job(&url);
    let none = serde_json::json!({});
    let n = f.armed();
    let theirs = merritt::create_job(&*other, &bid, 5, &conf, &none, &none, true).await;
    merritt::unlock_batch(&*other, &bid).await;
    rearmed(n, "the batch started").await;
    merritt::run_to_completed(&*other, &bid, &theirs).await;
    // As in `merritt_moving_a_batchs_last_job_is_noticed_by_a_watch`: half the re-read's
    // period tells the watch from the fallback.
    tokio::time::timeout(std::time::Duration::from_secs(15), w.completes(&bid))
        .await
        .expect("the batch's completion was noticed by a watch, before any re-read");
    let report = w.engine.batch(&bid).await.unwrap();
    assert_eq!(report.jobs["batch-completed"], vec![theirs.clone()]);
    run.stop().await;
}

/// A batch's last job ends while a session that has crashed still holds the batch's lock (a
/// reporter that had taken it, say): housekeeping's check is refused, and the holder, gone,
/// never checks again. When its session ends the lock goes, with no change to any job or
/// status: housekeeping must watch the lock it was refused by (found by `lading-sim`, once
/// its safety nets were longer than its liveness bound), not wait for its 30 s re-read.
async fn a_finished_batch_a_crashed_holder_kept_locked_is_noticed_when_its_session_ends(w: World) {
    let (url, _) = w.file("m/held.txt", b"merritt's");
    let ingest = w.ingest();
    let run = w.run_stages(&ingest, &["reporting"]);
    let (other, bid, theirs) = merritt_batch_of_one_job(&w, &url).await;
    // The holder: a session of its own that takes the batch's lock and then stops answering.
    let holder = holding_the_lock(&w, &format!("/batches/{bid}/lock")).await;
    let n = ingest.finishing.held();
    merritt::run_to_completed(&*other, &bid, &theirs).await;
    // Housekeeping's check on the last job's move is refused while the lock stays.
    tokio::time::timeout(WAIT, ingest.finishing.held_past(n))
        .await
        .expect("housekeeping found the finished batch locked by the holder");
    let held = w.engine.batch(&bid).await.unwrap();
    assert_eq!(
        (held.status.status, held.locked),
        (BatchState::Processing, true),
        "not moved while another session holds the batch"
    );
    assert_eq!(
        held.jobs["batch-completed"],
        vec![theirs.clone()],
        "nothing lost"
    );
    holder.close().await.unwrap();
    // Half the re-read's period tells the lock's watch from the fallback.
    tokio::time::timeout(std::time::Duration::from_secs(15), w.completes(&bid))
        .await
        .expect("the batch was noticed when its holder's lock went, before any re-read");
    run.stop().await;
}

/// A batch reported Failed, then reopened by an admin's requeue (back to Processing) while
/// another session holds its lock: housekeeping, which read its list while the batch was
/// Failed, must follow it back (a watch on its status) and notice when the requeued job ends
/// and the holder goes; dropped from the list, it waited for the 30 s re-read, and in
/// `lading-sim` (whose re-reads are an hour apart) for ever (seed 5015369 on 447bdb2).
async fn a_batch_reopened_by_a_requeue_is_followed_back_to_processing(w: World) {
    let (url, _) = w.file("m/reopened.txt", b"merritt's");
    let ingest = w.ingest();
    let run = w.run_stages(&ingest, &["reporting"]);
    let f = &ingest.finishing;
    // Half the re-read's period tells a watch from the fallback (a watch fires in
    // milliseconds).
    let half = std::time::Duration::from_secs(15);
    let (other, bid, theirs) = merritt_batch_of_one_job(&w, &url).await;
    // Merritt's `setBatchStatePath` deletes the job's old batch reference before it makes
    // the new one: a reporter that looks in between finds no job at all. On ZooKeeper it
    // waits for the job to land (`on_zookeeper_only`); the embedded store, which Merritt's
    // tools never write, cannot tell. Not this test's subject: the batch is held while the
    // job moves.
    let mover = holding_the_lock(&w, &format!("/batches/{bid}/lock")).await;
    merritt::move_job(&*other, &bid, &theirs, 5, "Pending", "Failed").await;
    merritt::unlock_job(&*other, &theirs).await;
    mover.close().await.unwrap();
    assert_eq!(w.batch_ends(&bid).await, BatchState::Failed);
    // Housekeeping reads its list again with the batch Failed: a new batch makes it.
    let n = f.armed();
    merritt_batch(&*other).await;
    tokio::time::timeout(WAIT, f.armed_past(n))
        .await
        .expect("housekeeping read its list again after a batch was made");
    // A holder takes the batch's lock (a reporter, say), and an admin requeues the job.
    let holder = holding_the_lock(&w, &format!("/batches/{bid}/lock")).await;
    let n = f.armed();
    w.engine
        .requeue_job(&theirs, Some(JobState::Pending))
        .await
        .unwrap();
    tokio::time::timeout(half, f.armed_past(n))
        .await
        .expect("housekeeping followed the reopened batch, before any re-read");
    // Merritt's daemon runs the job to Completed; housekeeping finds the batch held.
    let n = f.held();
    let daemon = holding_the_lock(&w, &format!("/jobs/{theirs}/lock")).await;
    merritt::run_to_completed(&*daemon, &bid, &theirs).await;
    tokio::time::timeout(half, f.held_past(n))
        .await
        .expect("housekeeping found the reopened batch finished and held, before any re-read");
    holder.close().await.unwrap();
    tokio::time::timeout(half, w.completes(&bid))
        .await
        .expect("the reopened batch was reported when its holder's lock went");
    run.stop().await;
}

/// A session of its own (Merritt's), and a batch it made with one job for `url`, the job
/// still locked by it and the batch unlocked.
async fn merritt_batch_of_one_job(
    w: &World,
    url: &str,
) -> (
    std::sync::Arc<dyn lading_core::tree::Tree>,
    lading_core::layout::BatchId,
    lading_core::layout::JobId,
) {
    let other = w.other_session().await;
    let bid = merritt_batch(&*other).await;
    let conf = merritt::file_job(url);
    let none = serde_json::json!({});
    let theirs = merritt::create_job(&*other, &bid, 5, &conf, &none, &none, true).await;
    merritt::unlock_batch(&*other, &bid).await;
    (other, bid, theirs)
}

/// A session of its own that holds `lock` (an ephemeral node, gone with the session).
async fn holding_the_lock(w: &World, lock: &str) -> std::sync::Arc<dyn lading_core::tree::Tree> {
    let holder = w.other_session().await;
    holder
        .create(lock, Some(Vec::new()), lading_core::CreateMode::Ephemeral)
        .await
        .unwrap();
    holder
}
