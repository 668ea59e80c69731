//! Batches: exactly-once reporting, update reports, requeue at every state, and requeue of failed jobs by stage.

use super::*;

pub async fn batch_reports_exactly_once_when_jobs_finish_concurrently(h: &dyn Harness) {
    for round in 0..3 {
        let (e, _s) = engine(h, "setup").await;
        let (bid, _jobs) = batch_with_jobs(&e, 12, &[]).await;
        // Bring every job to Notify.
        while let Some(l) = e.acquire_job(JobState::Pending).await.unwrap() {
            let mut l = e
                .job_advance(l, Event::To(JobState::Estimating), None)
                .await
                .unwrap();
            while l.state() != JobState::Notify {
                l = e.job_advance(l, Event::Success, None).await.unwrap();
            }
            e.release_job_lease(l).await.unwrap();
        }
        let mut engines = Vec::new();
        for w in 0..4 {
            engines.push(engine(h, &format!("w{round}{w}")).await);
        }
        let mut receivers: Vec<_> = engines.iter().map(|(ew, _)| ew.subscribe()).collect();
        receivers.push(e.subscribe());
        let mut leases = Vec::new();
        let mut i = 0;
        while let Some(l) = engines[i % 4]
            .0
            .acquire_job(JobState::Notify)
            .await
            .unwrap()
        {
            leases.push((engines[i % 4].0.clone(), l));
            i += 1;
        }
        assert_eq!(leases.len(), 12);
        let mut handles = Vec::new();
        for (idx, (ew, l)) in leases.into_iter().enumerate() {
            handles.push(tokio::spawn(async move {
                let ev = if idx % 5 == 0 {
                    Event::Fail
                } else {
                    Event::Success
                };
                ew.job_transition(l, ev, None)
                    .await
                    .expect("final transition");
            }));
        }
        for hd in handles {
            hd.await.unwrap();
        }
        let info = e.batch(&bid).await.unwrap();
        assert_eq!(info.status.status, BatchState::Reporting);
        assert!(info.jobs["batch-processing"].is_empty());
        assert_eq!(
            info.jobs["batch-completed"].len() + info.jobs["batch-failed"].len(),
            12
        );
        // Exactly one Processing → Reporting move, across every engine's events.
        let mut moves = 0;
        for rx in receivers.iter_mut() {
            while let Ok(ev) = rx.try_recv() {
                if ev.kind == lading_engine::ChangeKind::Batch
                    && ev.id == bid.as_str()
                    && ev.to == "Reporting"
                {
                    moves += 1;
                }
            }
        }
        assert_eq!(moves, 1, "the batch moved to Reporting exactly once");
        // The sweep finds nothing more to do.
        assert_eq!(e.sweep_reporting().await.unwrap(), 0);
        assert!(!e.maybe_report(&bid).await.unwrap());
    }
}

pub async fn report_and_update_reporting(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let (bid, jobs) = batch_with_jobs(&e, 2, &[]).await;
    run_job_to_completion(&e, JobState::Pending).await.unwrap();
    let l = take_job(&e, JobState::Pending).await;
    e.job_transition(l, Event::Fail, Some("bad manifest row".into()))
        .await
        .unwrap();
    let lease = e
        .acquire_batch(BatchState::Reporting)
        .await
        .unwrap()
        .expect("reporting batch");
    let report = e.build_report(&bid).await.unwrap();
    assert_eq!(
        (report.completed_jobs.clone(), report.failed_jobs.clone()),
        (vec![jobs[0].to_string()], vec![jobs[1].to_string()])
    );
    e.write_status_report(&lease, &report).await.unwrap();
    e.batch_transition(lease, Event::Fail, Some("1 job failed".into()))
        .await
        .unwrap();
    // Merritt's way: an admin asks for an updated report of the Failed batch.
    let st = e.update_reporting(&bid).await.unwrap();
    assert_eq!(st.status, BatchState::UpdateReporting);
    let lease = take_batch(&e, BatchState::UpdateReporting).await;
    e.batch_transition(lease, Event::Fail, Some("1 of 2 jobs failed".into()))
        .await
        .unwrap();
    // Requeuing the failed job reopens the batch; done, it reports again by itself.
    e.requeue_job(&jobs[1], None).await.unwrap();
    assert_eq!(
        e.batch(&bid).await.unwrap().status.status,
        BatchState::Processing
    );
    run_job_to_completion(&e, JobState::Pending).await.unwrap();
    let mut lease = e
        .acquire_batch(BatchState::Reporting)
        .await
        .unwrap()
        .expect("the reopened batch reports again");
    let report = e.build_report(&bid).await.unwrap();
    assert_eq!(report.completed_jobs.len(), 2);
    assert!(report.failed_jobs.is_empty());
    lease.report = Some(report);
    e.batch_transition(lease, Event::Success, None)
        .await
        .unwrap();
    let info = e.batch(&bid).await.unwrap();
    assert_eq!(info.status.status, BatchState::Completed);
    assert_eq!(info.status_report.unwrap().completed_jobs.len(), 2);
    // Cleanup purges a completed batch and its jobs.
    assert_eq!(e.purge_batch(&bid).await.unwrap(), 2);
    assert!(matches!(e.batch(&bid).await, Err(EngineError::NoBatch(_))));
    assert!(matches!(e.job(&jobs[0]).await, Err(EngineError::NoJob(_))));
    assert_eq!(e.job_counts().await.unwrap().values().sum::<u64>(), 0);
}

/// A batch of two jobs, the first completed and the second Failed, with the batch in `state`
/// (Processing: the second job failed while the first still ran).
pub(crate) async fn batch_with_a_failed_job(
    e: &Engine,
    state: BatchState,
) -> (BatchId, Vec<JobId>) {
    let (bid, jobs) = batch_with_jobs(e, 2, &[]).await;
    if state == BatchState::Processing {
        // The second fails first: the first is still in the pipeline.
        let l = take_job(e, JobState::Pending).await;
        let l = if l.job == jobs[1] {
            l
        } else {
            // Held while the other is taken.
            let second = take_job(e, JobState::Pending).await;
            e.release_job_lease(l).await.unwrap();
            second
        };
        assert_eq!(l.job, jobs[1]);
        e.job_transition(l, Event::Fail, Some("bad row".into()))
            .await
            .unwrap();
        return (bid, jobs);
    }
    run_job_to_completion(e, JobState::Pending).await.unwrap();
    let l = take_job(e, JobState::Pending).await;
    e.job_transition(l, Event::Fail, Some("bad row".into()))
        .await
        .unwrap();
    if state == BatchState::Reporting {
        let jobs = failed_last(e, &bid, jobs).await;
        return (bid, jobs);
    }
    let lease = take_batch(e, BatchState::Reporting).await;
    e.batch_transition(lease, Event::Fail, Some("1 of 2 jobs failed".into()))
        .await
        .unwrap();
    if state == BatchState::UpdateReporting {
        e.update_reporting(&bid).await.unwrap();
    }
    let jobs = failed_last(e, &bid, jobs).await;
    (bid, jobs)
}

/// `jobs` with the batch's failed job last (acquisition picks among equals at random).
pub(crate) async fn failed_last(e: &Engine, bid: &BatchId, mut jobs: Vec<JobId>) -> Vec<JobId> {
    let failed = e.batch(bid).await.unwrap().jobs["batch-failed"].clone();
    jobs.sort_by_key(|j| failed.contains(j));
    jobs
}

pub async fn requeue_at_every_batch_state_reports_again(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    for state in [
        BatchState::Processing,
        BatchState::Reporting,
        BatchState::Failed,
        BatchState::UpdateReporting,
    ] {
        let (bid, jobs) = batch_with_a_failed_job(&e, state).await;
        assert_eq!(e.batch(&bid).await.unwrap().status.status, state);
        let st = e
            .requeue_job(&jobs[1], Some(JobState::Pending))
            .await
            .unwrap();
        assert_eq!(st.status, JobState::Pending);
        let info = e.batch(&bid).await.unwrap();
        assert_eq!(info.status.status, BatchState::Processing, "from {state}");
        assert!(!info.locked, "from {state}");
        if state != BatchState::Processing {
            let msg = info.status.message.unwrap_or_default();
            assert!(
                msg.contains("reopened") && msg.contains(jobs[1].as_str()),
                "{msg}"
            );
        }
        // The rest of the batch's work, then one report that sees every job completed.
        while run_job_to_completion(&e, JobState::Pending).await.is_some() {}
        let lease = e
            .acquire_batch(BatchState::Reporting)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("batch from {state} reports again"));
        assert_eq!(lease.batch, bid);
        let report = e.build_report(&bid).await.unwrap();
        assert_eq!(report.completed_jobs.len(), 2, "from {state}");
        e.batch_transition(lease, Event::Success, None)
            .await
            .unwrap();
        assert_eq!(
            e.batch(&bid).await.unwrap().status.status,
            BatchState::Completed
        );
        // A Completed batch has nothing to requeue: refused, nothing changes.
        let before = e.batch(&bid).await.unwrap().status;
        let err = e.requeue_job(&jobs[0], None).await.unwrap_err();
        assert!(matches!(err, EngineError::Illegal(_)), "{err}");
        assert_eq!(e.batch(&bid).await.unwrap().status, before);
    }
}

/// The first report's mail of `bid`, as an effect.
pub(crate) fn report_mail(bid: &BatchId, payload: Value) -> lading_engine::Effect {
    lading_engine::Effect {
        kind: lading_engine::EffectKind::Mail,
        key: "<report-1>".into(),
        batch: Some(bid.clone()),
        job: None,
        payload,
    }
}

pub async fn a_reporter_that_loses_its_batch_to_a_requeue_records_nothing(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let (bid, jobs) = batch_with_a_failed_job(&e, BatchState::Reporting).await;
    let mut lease = take_batch(&e, BatchState::Reporting).await;
    lease.report = Some(e.build_report(&bid).await.unwrap());
    lease.effects.push(report_mail(&bid, json!({})));
    // While the reporter works, an admin requeues the failed job.
    e.requeue_job(&jobs[1], None).await.unwrap();
    let err = e
        .batch_transition(lease, Event::Fail, Some("1 of 2 jobs failed".into()))
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::LeaseLost(_)), "{err}");
    let info = e.batch(&bid).await.unwrap();
    assert_eq!(info.status.status, BatchState::Processing);
    assert!(!info.locked, "the reporter let go of the batch");
    assert!(
        info.status_report.is_none(),
        "no report of a move that failed"
    );
    assert!(e.outbox().await.unwrap().is_empty(), "no mail either");
    assert!(s.tree.children(OUTBOX).await.unwrap().is_empty());
    // The requeued job finishes; the batch reports once, then, with its mail in the outbox.
    run_job_to_completion(&e, JobState::Pending).await.unwrap();
    let mut lease = take_batch(&e, BatchState::Reporting).await;
    lease.report = Some(e.build_report(&bid).await.unwrap());
    lease
        .effects
        .push(report_mail(&bid, json!({"to": ["a@example.org"]})));
    e.batch_transition(lease, Event::Success, None)
        .await
        .unwrap();
    let out = e.outbox().await.unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].entry.effect.key, "<report-1>");
    assert_eq!(out[0].entry.attempts, 0);
    assert_eq!(
        e.batch(&bid)
            .await
            .unwrap()
            .status_report
            .unwrap()
            .completed_jobs
            .len(),
        2
    );
}

pub async fn deleting_the_last_failed_job_says_an_update_report_is_due(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let (bid, jobs) = batch_with_a_failed_job(&e, BatchState::Failed).await;
    e.delete_job(&jobs[1]).await.unwrap();
    let st = e.batch(&bid).await.unwrap().status;
    assert_eq!(st.status, BatchState::Failed);
    assert_eq!(
        st.message.as_deref(),
        Some("no failed jobs left (1 completed); 1 deleted: an update report is due")
    );
}

/// A retried intake skips the rows whose jobs it can read, so a job of a batch still in
/// intake is not purged (it would be made again); once the batch is Processing it is.
/// Found by lading-sim (seeds 401313012 and 401314180).
/// A writer stamps a transition from its own clock, then commits: the commit (the status's
/// modification time, the store's clock) may fall in a later second than the stamp. A client
/// resuming from an id of that later second is still owed the transition (found by
/// `lading-sim`, whose resuming client never got such a one).
pub async fn a_transition_stamped_before_its_commits_second_is_owed_to_a_resuming_client(
    h: &dyn Harness,
) {
    let (e, s) = engine(h, "w").await;
    let bid = e.create_batch(Default::default()).await.unwrap();
    let status = batch_node(&bid, "status");
    let made = s.tree.get(&status).await.unwrap().unwrap().stat.mtime_ms;
    // A writer whose clock reads 10 s behind the store's (or that stamped, then waited).
    let late = lading_core::time::ManualClock::new(made - 10_000);
    let (w, _ws) = engine_on_clock(h, "late", late).await;
    w.hold_batch(&bid).await.unwrap();
    let committed = s.tree.get(&status).await.unwrap().unwrap().stat.mtime_ms;
    let owed = e.transitions_since(committed, None).await.unwrap();
    assert!(
        owed.iter()
            .any(|(_, ev)| ev.id == bid.as_str() && ev.to == "Held"),
        "{owed:?}"
    );
}

pub async fn a_job_of_a_batch_still_in_intake_is_not_purged(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let bid = e.create_batch(Default::default()).await.unwrap();
    let lease = e.acquire_batch(BatchState::Pending).await.unwrap().unwrap();
    let job = e.create_job(&lease, JobSpec::default()).await.unwrap();
    // The intake stops here (as if its session expired): the batch stays Pending.
    e.release_batch_lease(lease).await.unwrap();
    assert_eq!(
        run_job_to_completion(&e, JobState::Pending).await,
        Some(job.clone())
    );
    let before = normalised_dump(s.tree.as_ref()).await;
    let err = e.delete_job(&job).await.unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "job {job} cannot be purged yet: its batch {bid} is Pending"
        )),
        "{err}"
    );
    unchanged(&s, &before, "a refused delete changes nothing").await;
    e.hold_batch(&bid).await.unwrap();
    let held = normalised_dump(s.tree.as_ref()).await;
    let err = e.purge_job(&job).await.unwrap_err();
    assert!(err.to_string().contains("is Held"), "{err}");
    unchanged(&s, &held, "a refused purge changes nothing").await;
    e.release_batch(&bid).await.unwrap();
    // The intake's retry finds the job and moves the batch on; now the purge goes through.
    let lease = e.acquire_batch(BatchState::Pending).await.unwrap().unwrap();
    assert_eq!(
        e.batch(&bid).await.unwrap().jobs["batch-completed"],
        vec![job.clone()]
    );
    e.batch_transition(lease, Event::To(BatchState::Processing), None)
        .await
        .unwrap();
    e.delete_job(&job).await.unwrap();
    assert!(matches!(e.job(&job).await, Err(EngineError::NoJob(_))));
}

/// A job that failed while its batch's intake still holds the batch is not requeued until
/// the intake is done: a retried intake skips the objects it made by listing the batch's
/// folders, and a job moved back from Failed between two of those reads was in neither (its
/// object got a second job, found by `lading-sim`, seed 7012214). The refusal names the
/// batch and changes nothing, and the intake keeps its lease (a requeue that fenced it left
/// the batch Pending, found by `lading-sim` earlier).
pub async fn a_requeue_waits_while_intake_holds_the_batch_and_leaves_it_its_lease(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let (admin, _s2) = engine(h, "admin").await;
    let bid = e.create_batch(Default::default()).await.unwrap();
    let lease = e.acquire_batch(BatchState::Pending).await.unwrap().unwrap();
    let first = e.create_job(&lease, JobSpec::default()).await.unwrap();
    // The first job fails while the intake is still making the others; an admin requeues it.
    let l = take_job(&e, JobState::Pending).await;
    e.job_transition(l, Event::Fail, Some("bad input".into()))
        .await
        .unwrap();
    let before = normalised_dump(s.tree.as_ref()).await;
    let err = admin.requeue_job(&first, None).await.unwrap_err();
    assert!(matches!(err, EngineError::Locked(_)), "{err:?}");
    assert!(
        err.to_string().contains(&format!(
            "batch {bid} (its intake is taking in its objects) is locked by a worker; try again"
        )),
        "{err}"
    );
    unchanged(
        &s,
        &before,
        "a requeue refused during intake changes nothing",
    )
    .await;
    // The intake goes on: its lease still holds for the next job and the move on.
    let second = e.create_job(&lease, JobSpec::default()).await.unwrap();
    let moved = e
        .batch_transition(lease, Event::To(BatchState::Processing), None)
        .await
        .unwrap();
    assert_eq!(moved.status, BatchState::Processing);
    assert!(
        s.tree
            .exists(&format!("/batches/{bid}/lock"))
            .await
            .unwrap()
            .is_none(),
        "the intake let go of the batch"
    );
    // Now the requeue goes through.
    admin.requeue_job(&first, None).await.unwrap();
    let mut processing = e.batch(&bid).await.unwrap().jobs["batch-processing"].clone();
    processing.sort();
    assert_eq!(processing, vec![first.clone(), second]);
    assert_eq!(
        e.job(&first).await.unwrap().status.status,
        JobState::Pending
    );
}

/// A requeue by a tool that does not take the batch's lock (Merritt's own may not) between
/// two of a retried intake's folder reads hides the job from that pass (it left `batch-failed`
/// for `batch-processing`, which was read already); the next pass finds it, so the intake
/// does not make its object a second job.
pub async fn a_job_moved_back_while_its_batchs_jobs_are_listed_is_still_listed(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let bid = e.create_batch(Default::default()).await.unwrap();
    let lease = e.acquire_batch(BatchState::Pending).await.unwrap().unwrap();
    let first = e.create_job(&lease, JobSpec::default()).await.unwrap();
    let l = take_job(&e, JobState::Pending).await;
    e.job_transition(l, Event::Fail, Some("bad input".into()))
        .await
        .unwrap();
    let second = e.create_job(&lease, JobSpec::default()).await.unwrap();
    let tool = Arc::new(MovedAfterRead {
        inner: s.tree.clone(),
        after: batch_ref_folder(&bid, "batch-processing"),
        ops: std::sync::Mutex::new(Some(vec![
            Op::delete(batch_ref(&bid, "batch-failed", &first), None),
            Op::create(batch_ref(&bid, "batch-processing", &first), None),
        ])),
    });
    let reader = Engine::new(tool.clone(), system_clock(), "reader");
    let listed = reader.batch_jobs(&bid).await.unwrap();
    assert!(
        tool.ops.lock().unwrap().is_none(),
        "the tool's move was made between two reads"
    );
    assert_eq!(
        listed,
        std::collections::BTreeSet::from([first, second]),
        "both jobs listed"
    );
}

/// A tree on which a tool's `ops` are committed once, right after `after` is first listed.
struct MovedAfterRead {
    inner: Arc<dyn Tree>,
    after: String,
    ops: std::sync::Mutex<Option<Vec<Op>>>,
}

impl Tree for MovedAfterRead {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn session_id(&self) -> u64 {
        self.inner.session_id()
    }
    fn get<'a>(&'a self, path: &'a str) -> lading_core::TreeFuture<'a, Option<lading_core::Node>> {
        self.inner.get(path)
    }
    fn children<'a>(&'a self, path: &'a str) -> lading_core::Names<'a> {
        Box::pin(async move {
            let listed = self.inner.children(path).await?;
            let ops = (path == self.after)
                .then(|| self.ops.lock().unwrap().take())
                .flatten();
            if let Some(ops) = ops {
                self.inner.multi(ops).await?;
            }
            Ok(listed)
        })
    }
    fn children_page<'a>(
        &'a self,
        path: &'a str,
        after: Option<&'a str>,
        max: usize,
    ) -> lading_core::Names<'a> {
        self.inner.children_page(path, after, max)
    }
    fn count_children<'a>(&'a self, path: &'a str) -> lading_core::TreeFuture<'a, u64> {
        self.inner.count_children(path)
    }
    fn multi(&self, ops: Vec<Op>) -> lading_core::TreeFuture<'_, Vec<OpResult>> {
        self.inner.multi(ops)
    }
    fn multi_on(&self, session: u64, ops: Vec<Op>) -> lading_core::TreeFuture<'_, Vec<OpResult>> {
        self.inner.multi_on(session, ops)
    }
    fn watch<'a>(
        &'a self,
        path: &'a str,
        kind: WatchKind,
    ) -> lading_core::TreeFuture<'a, lading_core::Watch> {
        self.inner.watch(path, kind)
    }
    fn close(&self) -> lading_core::TreeFuture<'_, ()> {
        self.inner.close()
    }
}

/// An admin's bulk retry: every Failed job of a batch (or only those that failed at one
/// stage) goes back to the stage that failed; other jobs and other batches are untouched.
pub async fn requeue_failed_retries_a_batchs_failed_jobs_by_stage(h: &dyn Harness) {
    let (e, s) = engine(h, "admin").await;
    let (bid, jobs) = batch_with_jobs(&e, 4, &[]).await;
    // Two fail while estimating, one while pending; the fourth stays Pending.
    for i in 0..3 {
        let l = take_job(&e, JobState::Pending).await;
        let l = if i < 2 {
            e.job_advance(l, Event::To(JobState::Estimating), None)
                .await
                .unwrap()
        } else {
            l
        };
        e.job_transition(l, Event::Fail, Some(format!("broke {i}")))
            .await
            .unwrap();
    }
    let state = |j: &JobId| {
        let e = e.clone();
        let j = j.clone();
        async move { e.job(&j).await.unwrap().status.status }
    };
    let failed: Vec<JobId> = {
        let mut v = Vec::new();
        for j in &jobs {
            if state(j).await == JobState::Failed {
                v.push(j.clone());
            }
        }
        v
    };
    assert_eq!(failed.len(), 3);
    // An unknown batch: refused, nothing changed.
    let before = normalised_dump(s.tree.as_ref()).await;
    let nobody = BatchId::parse("bid0000009999").unwrap();
    assert!(matches!(
        e.requeue_failed(&nobody, None, None).await,
        Err(EngineError::NoBatch(_))
    ));
    assert_eq!(normalised_dump(s.tree.as_ref()).await, before);
    // Only those that failed while estimating, back to Estimating.
    let r = e
        .requeue_failed(&bid, Some(JobState::Estimating), None)
        .await
        .unwrap();
    assert_eq!(r.len(), 2, "{r:?}");
    for (j, st) in &r {
        assert_eq!(st.as_ref().unwrap().status, JobState::Estimating, "{j}");
    }
    let mut failed_now = 0;
    for j in &jobs {
        failed_now += usize::from(state(j).await == JobState::Failed);
    }
    assert_eq!(failed_now, 1);
    // The rest: back to where it failed (Pending).
    let r = e.requeue_failed(&bid, None, None).await.unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].1.as_ref().unwrap().status, JobState::Pending);
    // Nothing failed left: an empty answer, nothing changed.
    let before = normalised_dump(s.tree.as_ref()).await;
    assert!(e.requeue_failed(&bid, None, None).await.unwrap().is_empty());
    assert_eq!(normalised_dump(s.tree.as_ref()).await, before);
}

pub async fn an_outbox_claim_is_read_under_its_lock_and_a_failed_record_still_releases_it(
    h: &dyn Harness,
) {
    let (e, _s) = engine(h, "a").await;
    let (other, _s2) = engine(h, "b").await;
    let (_bid, _jobs) = batch_with_jobs(&e, 1, &[]).await;
    let mut l = take_job(&e, JobState::Pending).await;
    l.effects.push(crate::outbox::callback("k1", &l));
    e.job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    // A deliverer holds it; an admin retries it meanwhile: the lock is taken away, so the
    // entry is free at once, and the first deliverer's record of its failure (now stale)
    // leaves no lock behind.
    let c = e
        .claim_effect(&[lading_engine::EffectKind::Callback])
        .await
        .unwrap()
        .unwrap();
    let name = c.name.clone();
    assert!(e.outbox().await.unwrap()[0].delivering);
    e.retry_effect(&name).await.unwrap();
    assert!(!e.outbox().await.unwrap()[0].delivering);
    let c2 = other
        .claim_effect(&[lading_engine::EffectKind::Callback])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c2.entry.attempts, 0);
    let at = e.clock().now_ms() + 60_000;
    other
        .effect_failed(c2, "answered 500", Some(at))
        .await
        .unwrap();
    let stale = e.effect_failed(c, "answered 500 (stale)", Some(at)).await;
    assert!(
        matches!(stale, Err(lading_engine::EngineError::LeaseLost(_))),
        "{stale:?}"
    );
    let item = &e.outbox().await.unwrap()[0];
    assert!(!item.delivering, "no lock left: {item:?}");
    assert_eq!(
        (item.entry.attempts, item.entry.last_error.as_deref()),
        (1, Some("answered 500")),
        "the stale record changed nothing"
    );
    // Not due: neither session claims it (each reads it afresh).
    for x in [&e, &other] {
        assert!(
            matches!(x.claim_effect(&[lading_engine::EffectKind::Callback]).await.unwrap(), Err(Some(t)) if t == at)
        );
    }
    // Due again after an admin's retry: delivered once, gone.
    e.retry_effect(&name).await.unwrap();
    let c = other
        .claim_effect(&[lading_engine::EffectKind::Callback])
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        e.claim_effect(&[lading_engine::EffectKind::Callback])
            .await
            .unwrap(),
        Err(None)
    ));
    other.effect_done(c).await.unwrap();
    assert!(e.outbox().await.unwrap().is_empty());
}
