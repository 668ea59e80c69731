//! Merritt's shapes and behaviours: the nodes each transition changes, lazily made folders, `"Failed"` as last successful status, held batches and foreign locks, deletions Merritt makes.

use super::*;

/// Merritt's documented transitions (seed 000), one at a time: after each step exactly the
/// nodes the seed names change, with the data it gives.
pub async fn merritt_transitions_change_exactly_the_documented_nodes(h: &dyn Harness) {
    let (e, s) = engine(h, "golden").await;
    let tree = s.tree.clone();
    let mut steps = Steps::new(tree.as_ref()).await;
    let lock = json!({"owner": "golden", "session": "<session>", "acquired": "<time>"});
    // Batch: API call creates and queues a batch.
    let mut sub = Map::new();
    sub.insert("profile_name".into(), json!("merritt_demo"));
    sub.insert("submitter".into(), json!("depositor"));
    sub.insert("payload_url".into(), json!("http://127.0.0.1/file1.checkm"));
    sub.insert("type".into(), json!("file"));
    let bid = e.create_batch(sub.try_into().unwrap()).await.unwrap();
    steps.check("create batch", json!({
        "+/batches/bid0000000000": null,
        "+/batches/bid0000000000/status": {"status": "Pending", "last_modified": "<time>", "message": ""},
        "+/batches/bid0000000000/submission": {"batchID": "<uuid>", "payload_url": "http://127.0.0.1/file1.checkm", "profile_name": "merritt_demo", "submissionDate": "<time>", "submitter": "depositor", "type": "file"},
        "+/batch-uuids/<uuid>": "bid0000000000",
        // Lading's own index of batches by submitter (outside Merritt's layout).
        "+/batch-submitters/depositor": null,
        "+/batch-submitters/depositor/bid0000000000": null,
    })).await;
    // Batch: acquire pending batch — create lock.
    let lease = take_batch(&e, BatchState::Pending).await;
    assert_eq!(lease.batch, bid);
    steps
        .check(
            "acquire batch",
            json!({"+/batches/bid0000000000/lock": lock}),
        )
        .await;
    // Job creation: a new job id is written in 3 places.
    let mut cfg = Map::new();
    cfg.insert("profile_name".into(), json!("merritt_demo"));
    cfg.insert("payload_url".into(), json!("file1.checkm"));
    cfg.insert("local_id".into(), json!(["loc001"]));
    let jid = e.create_job(&lease, spec(cfg)).await.unwrap();
    steps.check("create job", json!({
        "+/jobs/jid0000000000": null,
        "+/jobs/jid0000000000/bid": "bid0000000000",
        "+/jobs/jid0000000000/configuration": {"local_id": ["loc001"], "payload_url": "file1.checkm", "profile_name": "merritt_demo"},
        "+/jobs/jid0000000000/identifiers": {"primary_id": "", "local_id": []},
        "+/jobs/jid0000000000/metadata": {},
        "+/jobs/jid0000000000/priority": 5,
        "+/jobs/jid0000000000/space_needed": 0,
        "+/jobs/jid0000000000/status": {"status": "Pending", "last_successful_status": null, "last_modified": "<time>", "retry_count": 0, "message": ""},
        "+/jobs/states/pending/05-jid0000000000": null,
        "+/batches/bid0000000000/states": null,
        "+/batches/bid0000000000/states/batch-completed": null,
        "+/batches/bid0000000000/states/batch-deleted": null,
        "+/batches/bid0000000000/states/batch-failed": null,
        "+/batches/bid0000000000/states/batch-processing": null,
        "+/batches/bid0000000000/states/batch-processing/jid0000000000": null,
    })).await;
    // Batch: Pending → Processing; delete the lock.
    e.batch_transition(lease, Event::To(BatchState::Processing), None)
        .await
        .unwrap();
    steps.check("batch Pending -> Processing", json!({
            "~/batches/bid0000000000/status": {"status": "Processing", "last_modified": "<time>", "message": ""},
            "-/batches/bid0000000000/lock": null,
        }))
    .await;
    // Job: acquire pending job — create lock; Pending → Estimating.
    let l = take_job(&e, JobState::Pending).await;
    assert_eq!(l.job, jid);
    steps
        .check("acquire job", json!({"+/jobs/jid0000000000/lock": lock}))
        .await;
    e.job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    steps.check("job Pending -> Estimating", json!({
        "~/jobs/jid0000000000/status": {"status": "Estimating", "last_successful_status": null, "last_modified": "<time>", "retry_count": 0, "message": ""},
        "-/jobs/states/pending/05-jid0000000000": null,
        "+/jobs/states/estimating/05-jid0000000000": null,
        "-/jobs/jid0000000000/lock": null,
    })).await;
    // Every working stage: the status moves on, last_successful_status is the stage left.
    let stages = [
        (
            JobState::Estimating,
            "Provisioning",
            "estimating",
            "provisioning",
        ),
        (
            JobState::Provisioning,
            "Downloading",
            "provisioning",
            "downloading",
        ),
        (
            JobState::Downloading,
            "Processing",
            "downloading",
            "processing",
        ),
        (JobState::Processing, "Storing", "processing", "storing"),
        (JobState::Storing, "Recording", "storing", "recording"),
        (JobState::Recording, "Notify", "recording", "notify"),
    ];
    for (from, to, old_folder, new_folder) in stages {
        let l = e.acquire_job(from).await.unwrap().unwrap();
        e.job_transition(l, Event::Success, None).await.unwrap();
        let mut want = Map::new();
        want.insert(
            "~/jobs/jid0000000000/status".into(),
            json!({"status": to, "last_successful_status": from.name(), "last_modified": "<time>", "retry_count": 0, "message": ""}),
        );
        want.insert(
            format!("-/jobs/states/{old_folder}/05-jid0000000000"),
            Value::Null,
        );
        want.insert(
            format!("+/jobs/states/{new_folder}/05-jid0000000000"),
            Value::Null,
        );
        steps.check("job stage", Value::Object(want)).await;
    }
    // Job: Notify → Completed; the batch reference moves, and the batch, whose last job that
    // was, goes to Reporting.
    let l = take_job(&e, JobState::Notify).await;
    e.job_transition(l, Event::Success, None).await.unwrap();
    steps.check("job Notify -> Completed", json!({
        "~/jobs/jid0000000000/status": {"status": "Completed", "last_successful_status": "Notify", "last_modified": "<time>", "retry_count": 0, "message": ""},
        "-/jobs/states/notify/05-jid0000000000": null,
        "+/jobs/states/completed/05-jid0000000000": null,
        "-/batches/bid0000000000/states/batch-processing/jid0000000000": null,
        "+/batches/bid0000000000/states/batch-completed/jid0000000000": null,
        "~/batches/bid0000000000/status": {"status": "Reporting", "last_modified": "<time>", "message": ""},
    })).await;
}

/// Merritt's `Batch.acquirePendingBatch` creates only `states`, and `Job.createJob` only
/// `states/batch-processing`; the other reference folders appear when Merritt's own code
/// first moves a job there. Lading's moves create them when missing.
pub async fn merritt_lazily_made_batch_folders_are_created_by_the_move(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let (bid, jobs) = batch_with_jobs(&e, 3, &[]).await;
    for f in ["batch-completed", "batch-failed", "batch-deleted"] {
        s.tree
            .delete(&batch_ref_folder(&bid, f), None)
            .await
            .unwrap();
    }
    run_job_to_completion(&e, JobState::Pending).await.unwrap();
    let l = take_job(&e, JobState::Pending).await;
    let failed = l.job.clone();
    e.job_transition(l, Event::Fail, Some("bad row".into()))
        .await
        .unwrap();
    e.delete_job(&failed).await.unwrap();
    let info = e.batch(&bid).await.unwrap();
    assert_eq!(info.jobs["batch-completed"].len(), 1);
    assert_eq!(info.jobs["batch-deleted"], vec![failed.clone()]);
    assert_eq!(info.jobs["batch-processing"].len(), 1);
    // The third job (its batch made by a Merritt that created only `states`) fails too.
    for f in ["batch-failed"] {
        s.tree
            .delete(&batch_ref_folder(&bid, f), None)
            .await
            .unwrap();
    }
    let l = take_job(&e, JobState::Pending).await;
    assert!(jobs.contains(&l.job));
    e.job_transition(l, Event::Fail, Some("bad row".into()))
        .await
        .unwrap();
    let info = e.batch(&bid).await.unwrap();
    assert_eq!(info.jobs["batch-failed"].len(), 1);
    assert_eq!(
        info.status.status,
        BatchState::Reporting,
        "the batch reports"
    );
}

/// Merritt's Java code writes `"Failed"` into `last_successful_status` when it moves a job out
/// of Failed; a requeue after the job fails again still goes to the stage that failed.
pub async fn merritt_last_successful_failed_still_requeues_to_the_stage_that_failed(
    h: &dyn Harness,
) {
    let (e, s) = engine(h, "w").await;
    let (_bid, jobs) = batch_with_jobs(&e, 1, &[]).await;
    let l = estimating(&e).await;
    let l = e.job_advance(l, Event::Success, None).await.unwrap();
    e.job_transition(l, Event::Success, None).await.unwrap();
    // Downloading, as Merritt writes the status after its own requeue.
    s.tree
        .set(
            &job_node(&jobs[0], "status"),
            Some(
                br#"{"status":"Downloading","last_successful_status":"Failed","last_modified":"2026-11-24 10:00:00","retry_count":1,"message":""}"#
                    .to_vec(),
            ),
            None,
        )
        .await
        .unwrap();
    let l = take_job(&e, JobState::Downloading).await;
    e.job_transition(l, Event::Fail, Some("digest mismatch".into()))
        .await
        .unwrap();
    let st = e.requeue_job(&jobs[0], None).await.unwrap();
    assert_eq!(st.status, JobState::Downloading);
}

/// Merritt's pending-batch scan takes any batch without `states` for pending (and then
/// throws on a Held one, leaving its lock): a batch Lading holds has `states`.
pub async fn merritt_pending_scan_skips_a_held_batch(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let bid = e.create_batch(Default::default()).await.unwrap();
    assert!(s.tree.exists(&batch_states(&bid)).await.unwrap().is_none());
    e.hold_batch(&bid).await.unwrap();
    has_states_folders(s.tree.as_ref(), &bid).await;
    // Released, it is Lading's to take, and it goes on as any batch.
    e.release_batch(&bid).await.unwrap();
    let l = take_batch(&e, BatchState::Pending).await;
    assert_eq!(l.batch, bid);
    let st = e
        .batch_transition(l, Event::To(BatchState::Processing), None)
        .await
        .unwrap();
    // No jobs: it reports at once.
    assert!(matches!(
        st.status,
        BatchState::Processing | BatchState::Reporting
    ));
    assert!(!e.batch(&bid).await.unwrap().locked);
}

/// Asserts the batch has its `states` folder and each folder of job references in it (what
/// Merritt's pending scan looks for to pass a batch over).
async fn has_states_folders(tree: &dyn Tree, bid: &BatchId) {
    assert!(tree.exists(&batch_states(bid)).await.unwrap().is_some());
    for f in BATCH_FOLDERS {
        let folder = batch_ref_folder(bid, f);
        assert!(tree.exists(&folder).await.unwrap().is_some(), "{folder}");
    }
}

/// A batch held because its collection is held (the acquisition path, not the admin's) gets
/// its `states` folders too, so Merritt's `Batch.acquirePendingBatch` passes it over.
pub async fn merritt_pending_scan_skips_a_batch_held_by_its_collection(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let mut sub = Map::new();
    sub.insert("collection".into(), json!("held_coll"));
    let bid = e.create_batch(sub.try_into().unwrap()).await.unwrap();
    e.hold_collection("held_coll").await.unwrap();
    assert!(
        e.acquire_batch(BatchState::Pending)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(e.batch(&bid).await.unwrap().status.status, BatchState::Held);
    has_states_folders(s.tree.as_ref(), &bid).await;
}

/// A Merritt consumer that took a Held batch for pending throws and keeps the batch's lock
/// (ephemeral, for as long as its process lives). Lading lists it as a foreign lock, names
/// it when an admin action meets it, and lets an admin clear it; a lock on a batch in any
/// other state is refused, and nothing else changes.
pub async fn merritt_failed_consumers_lock_on_a_held_batch_is_listed_and_cleared(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let (_m, merritt) = engine(h, "merritt").await;
    let bid = e.create_batch(Default::default()).await.unwrap();
    e.hold_batch(&bid).await.unwrap();
    // What Merritt's failed consumer leaves: its lock, made by its own session.
    merritt
        .tree
        .create(&batch_node(&bid, "lock"), None, CreateMode::Ephemeral)
        .await
        .unwrap();
    let locks = e.foreign_locks().await.unwrap();
    assert_eq!(locks.len(), 1, "{locks:?}");
    assert_eq!(
        (locks[0].kind.as_str(), locks[0].name.as_str()),
        ("batch", bid.as_str())
    );
    let err = e.release_batch(&bid).await.unwrap_err();
    assert!(matches!(err, EngineError::ForeignLocked(_)), "{err}");
    assert!(err.to_string().contains("clear-lock batch"), "{err}");
    assert_eq!(e.batch(&bid).await.unwrap().status.status, BatchState::Held);
    // A completed batch's lock is never called foreign, nor cleared.
    let (done, _) = batch_with_jobs(&e, 0, &[]).await;
    let err = e
        .clear_foreign_lock("batch", done.as_str())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not Held"), "{err}");
    let err = e.clear_foreign_lock("batch", "nonsense").await.unwrap_err();
    assert!(err.to_string().contains("not a batch id"), "{err}");
    e.clear_foreign_lock("batch", bid.as_str()).await.unwrap();
    assert!(e.foreign_locks().await.unwrap().is_empty());
    e.release_batch(&bid).await.unwrap();
    let l = take_batch(&e, BatchState::Pending).await;
    assert_eq!(l.batch, bid);
}

/// Merritt's `Batch.deleteCompletedBatches` deletes a completed batch, its jobs and its
/// `/batch-uuids` entry, knowing nothing of Lading's submitter index: the entry it leaves is
/// skipped by readers and pruned by cleanup.
pub async fn merritt_deleting_completed_batches_leaves_no_dangling_index(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let (bid, jobs) = batch_with_jobs(&e, 1, &[]).await;
    assert_eq!(e.batch_ids_of("tester").await.unwrap(), vec![bid.clone()]);
    // Merritt's deletion, node by node: each job's subtree and state reference, then the
    // batch's subtree and its uuid entry.
    let mut doomed = Vec::new();
    let dump = lading_engine::dump(s.tree.as_ref(), &format!("/batches/{bid}"))
        .await
        .unwrap();
    for j in &jobs {
        let jd = lading_engine::dump(s.tree.as_ref(), &format!("/jobs/{j}"))
            .await
            .unwrap();
        doomed.extend(jd.keys().cloned());
        for st in s.tree.children("/jobs/states").await.unwrap() {
            for r in s
                .tree
                .children(&format!("/jobs/states/{st}"))
                .await
                .unwrap()
            {
                if r.ends_with(j.as_str()) {
                    s.tree
                        .delete(&format!("/jobs/states/{st}/{r}"), None)
                        .await
                        .unwrap();
                }
            }
        }
    }
    doomed.extend(dump.keys().cloned());
    doomed.sort_by_key(|p| std::cmp::Reverse(p.matches('/').count()));
    for p in doomed {
        s.tree.delete(&p, None).await.unwrap();
    }
    assert!(e.batch_ids().await.unwrap().is_empty(), "the batch is gone");
    for u in s.tree.children(BATCH_UUIDS).await.unwrap() {
        s.tree
            .delete(&format!("{BATCH_UUIDS}/{u}"), None)
            .await
            .unwrap();
    }
    // The index still names it; readers skip it; pruning drops it, once.
    assert_eq!(e.batch_ids_of("tester").await.unwrap(), vec![bid.clone()]);
    assert!(matches!(e.batch(&bid).await, Err(EngineError::NoBatch(_))));
    assert_eq!(e.prune_submitter_index().await.unwrap(), 1);
    assert!(e.batch_ids_of("tester").await.unwrap().is_empty());
    assert_eq!(e.prune_submitter_index().await.unwrap(), 0);
    // A live batch's entry stays.
    let (live, _) = batch_with_jobs(&e, 1, &[]).await;
    assert_eq!(e.prune_submitter_index().await.unwrap(), 0);
    assert_eq!(e.batch_ids_of("tester").await.unwrap(), vec![live]);
}

/// An access request Merritt's own service made (its token names no `ark`) is left for it:
/// Lading's access workers take only their own.
pub async fn merritt_access_requests_are_taken_in_order_not_skipped(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let merritt = e
        .create_access(
            AccessQueue::Small,
            &json!({"token": "4c0ffee0-0000-4000-8000-000000000001", "delivery-node": 7777,
                    "cloud-content-byte": 12, "status": 202, "url": "https://example.org/t",
                    "anticipated-availability-time": "2026-11-24T10:00:00-08:00"}),
        )
        .await
        .unwrap();
    let ours = e
        .create_access(
            AccessQueue::Small,
            &json!({"ark": "ark:/99999/fk4x", "version": 1}),
        )
        .await
        .unwrap();
    // Merritt's request (no `ark`) is taken first, as the oldest: the stage fails it naming
    // the field, rather than leaving it Pending for ever.
    let l = e.acquire_access(AccessQueue::Small).await.unwrap().unwrap();
    assert_eq!(l.id, merritt);
    assert!(l.token.ark.is_none() && l.unreadable.is_none());
    let l = e.access_advance(l, Event::Success).await.unwrap();
    e.access_transition(l, Event::Fail, Some("no ark".into()))
        .await
        .unwrap();
    let l = e.acquire_access(AccessQueue::Small).await.unwrap().unwrap();
    assert_eq!(l.id, ours);
    let l = e.access_advance(l, Event::Success).await.unwrap();
    e.access_transition(l, Event::Success, None).await.unwrap();
    let info = e.access(AccessQueue::Small, &merritt).await.unwrap();
    assert_eq!(info.status.status, lading_core::AccessState::Failed);
    assert_eq!(info.status.message.as_deref(), Some("no ark"));
    assert!(!info.locked);
}
