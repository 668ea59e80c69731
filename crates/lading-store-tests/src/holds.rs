//! Holds, pauses and waking: a held collection, a paused queue, a worker woken by new work
//! or by its batch's locks, admin actions against locks, duplicate batches, and space
//! admission under contention.

use super::*;

pub async fn concurrent_admissions_never_reserve_more_than_is_free(h: &dyn Harness) {
    const MIB: u64 = 1 << 20;
    let (a, _sa) = engine(h, "a").await;
    let (b, _sb) = engine(h, "b").await;
    let (_bid, _jobs) = batch_with_jobs(&a, 9, &[]).await;
    for _ in 0..9 {
        let l = estimating(&a).await;
        a.job_transition(l, Event::Success, None).await.unwrap();
    }
    // Nine jobs of 1 MiB, admitted at the same moment by two sessions into 6 MiB.
    let mut set = tokio::task::JoinSet::new();
    for i in 0..9 {
        let e = if i % 2 == 0 { a.clone() } else { b.clone() };
        let mut l = take_job(&e, JobState::Provisioning).await;
        set.spawn(async move {
            let r = e
                .reserve_space(&mut l, "host:/work", MIB, 6 * MIB, 0)
                .await
                .unwrap();
            (e, l, r)
        });
    }
    let mut admitted = Vec::new();
    let mut waiting = Vec::new();
    while let Some(r) = set.join_next().await {
        let (e, l, r) = r.unwrap();
        match r {
            None => admitted.push((e, l)),
            Some(held) => {
                assert!(held > 0 && held + MIB > 6 * MIB, "refused with {held} held");
                waiting.push((e, l));
            }
        }
    }
    assert_eq!(admitted.len(), 6, "6 MiB hold six jobs of 1 MiB");
    let held: u64 = a
        .reservations()
        .await
        .unwrap()
        .iter()
        .map(|(_, r)| r.bytes)
        .sum();
    assert_eq!(held, 6 * MIB);
    // Another root is another file system.
    let (e, mut l) = waiting.pop().unwrap();
    assert_eq!(
        e.reserve_space(&mut l, "other:/work", MIB, 6 * MIB, 0)
            .await
            .unwrap(),
        None
    );
    e.job_transition(l, Event::Success, None).await.unwrap();
    // A download that ends (either way) gives its space back, in its own move.
    let (e, l) = admitted.pop().unwrap();
    let l = e.job_advance(l, Event::Success, None).await.unwrap();
    assert_eq!(l.state(), JobState::Downloading);
    assert!(l.status.extra.contains_key(lading_engine::RESERVED_FIELD));
    e.job_transition(l, Event::Fail, Some("digest mismatch".into()))
        .await
        .unwrap();
    let (e, l) = admitted.pop().unwrap();
    let l = e.job_advance(l, Event::Success, None).await.unwrap();
    let st = e.job_transition(l, Event::Success, None).await.unwrap();
    assert_eq!(st.status, JobState::Processing);
    assert!(!st.extra.contains_key(lading_engine::RESERVED_FIELD));
    assert_eq!(
        a.reservations().await.unwrap().len(),
        5,
        "4 left on host:/work, 1 on other"
    );
    // Now two of the waiting fit.
    let mut fits = 0;
    for (e, mut l) in waiting {
        if e.reserve_space(&mut l, "host:/work", MIB, 6 * MIB, 0)
            .await
            .unwrap()
            .is_none()
        {
            fits += 1;
        }
        e.release_job_lease(l).await.unwrap();
    }
    assert_eq!(fits, 2);
    for (e, l) in admitted {
        e.release_job_lease(l).await.unwrap();
    }
}

pub async fn held_collection_holds_batches_and_jobs_until_released(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    // A job of collection "coll" is queued, then the collection is held.
    let mut sub = Map::new();
    sub.insert("collection".into(), json!("coll"));
    let bid = e
        .create_batch(sub.clone().try_into().unwrap())
        .await
        .unwrap();
    let lease = take_batch(&e, BatchState::Pending).await;
    let mut cfg = Map::new();
    cfg.insert("collection".into(), json!("coll"));
    let jid = e.create_job(&lease, spec(cfg)).await.unwrap();
    e.batch_transition(lease, Event::To(BatchState::Processing), None)
        .await
        .unwrap();
    assert!(e.hold_collection("coll").await.unwrap());
    let held_batch = e.create_batch(sub.try_into().unwrap()).await.unwrap();
    assert!(
        e.acquire_batch(BatchState::Pending)
            .await
            .unwrap()
            .is_none()
    );
    assert!(e.acquire_job(JobState::Pending).await.unwrap().is_none());
    assert_eq!(
        e.batch(&held_batch).await.unwrap().status.status,
        BatchState::Held
    );
    assert_eq!(e.job(&jid).await.unwrap().status.status, JobState::Held);
    assert_eq!(e.release_collection("coll").await.unwrap(), 2);
    assert!(!e.collection_held("coll").await.unwrap());
    assert_eq!(
        e.batch(&held_batch).await.unwrap().status.status,
        BatchState::Pending
    );
    let l = e
        .acquire_job(JobState::Pending)
        .await
        .unwrap()
        .expect("released job is pending again");
    assert_eq!(l.job, jid);
    let _ = bid;
}

pub async fn batch_worker_is_woken_when_a_batch_needs_reporting(h: &dyn Harness) {
    let (e, _s) = engine(h, "jobs").await;
    let (reporter, _s2) = engine(h, "reporter").await;
    let (bid, _jobs) = batch_with_jobs(&e, 1, &[]).await;
    // The reporter has looked once and found nothing to report; then it waits.
    assert!(
        reporter
            .acquire_batch(BatchState::Reporting)
            .await
            .unwrap()
            .is_none()
    );
    let mut parks = Parks::of(&reporter);
    let wait = |state| {
        let r = reporter.clone();
        tokio::spawn(async move { r.wait_batch_or(state, WAIT, std::future::pending()).await })
    };
    let waiting = wait(BatchState::Reporting);
    // Once it has looked and is waiting, not before.
    parks.next().await;
    run_job_to_completion(&e, JobState::Pending).await.unwrap();
    let lease = woken(
        waiting,
        "woken well before the sweep",
        "the batch to report",
    )
    .await;
    assert_eq!(lease.batch, bid);
    // A new Pending batch wakes an intake worker too.
    parks.restart();
    let waiting = wait(BatchState::Pending);
    parks.next().await;
    let mut sub = Map::new();
    sub.insert("profile_name".into(), json!("demo_profile"));
    let new = e.create_batch(sub.try_into().unwrap()).await.unwrap();
    let got = woken(waiting, "woken by the new batch", "the new batch").await;
    assert_eq!(got.batch, new);
    // A batch is made in two steps (its node, then its status): a waiter that wakes and looks
    // in between must still be woken when the status arrives, not by the sweep 10 s later.
    parks.restart();
    let waiting = wait(BatchState::Pending);
    parks.next().await;
    let path = e
        .tree()
        .create(BATCH_PREFIX, None, CreateMode::PersistentSequential)
        .await
        .unwrap();
    // Woken by the node, it looks, finds no status, and waits again.
    parks.next().await;
    let status = json!({"status": "Pending", "last_modified": "2026-11-21 00:00:00 +0000"});
    e.tree()
        .multi(vec![
            Op::create(format!("{path}/submission"), bytes("{}")),
            Op::create(format!("{path}/status"), bytes(&status.to_string())),
        ])
        .await
        .unwrap();
    let got = woken(
        waiting,
        "woken by the status of a batch seen half made",
        "the batch",
    )
    .await;
    assert_eq!(format!("/batches/{}", got.batch), path);
}

/// A batch waiter watches the lock only of the batches of its own state that it found
/// locked: a batch of another state taken and given back (intake taking a Pending batch) does
/// not wake a waiting reporter, while the Reporting batch it found locked wakes it once let
/// go. (Watching every live batch's lock woke every batch waiter of every process at each
/// lock taken anywhere.)
pub async fn a_batch_waiter_is_woken_by_the_locks_of_its_own_state_only(h: &dyn Harness) {
    let (e, _s) = engine(h, "jobs").await;
    let (reporter, _s2) = engine(h, "reporter").await;
    let (done, _jobs) = batch_with_jobs(&e, 1, &[]).await;
    run_job_to_completion(&e, JobState::Pending).await.unwrap();
    let held = take_batch(&e, BatchState::Reporting).await;
    assert_eq!(held.batch, done);
    let pending = e.create_batch(Default::default()).await.unwrap();
    let mut parks = Parks::of(&reporter);
    let waiting = {
        let r = reporter.clone();
        tokio::spawn(async move {
            r.wait_batch_or(BatchState::Reporting, WAIT, std::future::pending())
                .await
        })
    };
    parks.next().await;
    let parked = *parks.rx.borrow_and_update();
    // Intake takes the Pending batch and gives it back, five times, a little apart (a
    // waiter woken by each would have looked and parked in between, rather than once for
    // all five).
    for _ in 0..5 {
        let lease = take_batch(&e, BatchState::Pending).await;
        assert_eq!(lease.batch, pending);
        e.release_batch_lease(lease).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Two strays at most: the new batch's own event arriving late, and on ZooKeeper the
    // first round's listing of the batches into the session's cache, which tells that
    // folder's watchers.
    still_parked(&mut parks.rx, parked, 2, &waiting, "the reporter").await;
    // The Reporting batch it found locked is let go: that wakes it.
    e.release_batch_lease(held).await.unwrap();
    let got = woken(waiting, "woken by the lock let go", "the batch to report").await;
    assert_eq!(got.batch, done);
}

/// What a spawned wait for a batch got, within 5 s (`woken`: what should have woken it;
/// `what`: what it should have got).
async fn woken<T>(
    waiting: tokio::task::JoinHandle<Result<Option<T>, EngineError>>,
    woken: &str,
    what: &str,
) -> T {
    let got = tokio::time::timeout(Duration::from_secs(5), waiting).await;
    got.expect(woken).unwrap().unwrap().expect(what)
}

pub async fn paused_queue_hands_out_nothing(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let (_bid, _jobs) = batch_with_jobs(&e, 1, &[]).await;
    e.create_batch(Default::default()).await.unwrap();
    assert!(e.pause_queue("ingest").await.unwrap());
    assert!(!e.pause_queue("ingest").await.unwrap(), "already paused");
    assert!(e.acquire_job(JobState::Pending).await.unwrap().is_none());
    assert!(
        e.acquire_batch(BatchState::Pending)
            .await
            .unwrap()
            .is_none()
    );
    // A waiting worker is woken by the resume, not by polling.
    let e2 = e.clone();
    let waiter = tokio::spawn(async move {
        e2.wait_job_or(JobState::Pending, WAIT, std::future::pending())
            .await
    });
    tokio::task::yield_now().await;
    e.resume_queue("ingest").await.unwrap();
    let got = tokio::time::timeout(WAIT, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(got.is_some(), "resumed queue hands the job out");
}

pub async fn waiting_worker_is_woken_by_new_work(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let (other, _s2) = engine(h, "producer").await;
    let e2 = e.clone();
    let waiter = tokio::spawn(async move {
        e2.wait_job_or(JobState::Pending, WAIT, std::future::pending())
            .await
    });
    tokio::task::yield_now().await;
    let (_bid, jobs) = batch_with_jobs(&other, 1, &[]).await;
    let got = tokio::time::timeout(WAIT, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .expect("woken with the job");
    assert_eq!(got.job, jobs[0]);
}

pub async fn admin_actions_respect_locks_and_the_table(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let (bid, jobs) = batch_with_jobs(&e, 2, &[]).await;
    let l = take_job(&e, JobState::Pending).await;
    let locked = l.job.clone();
    let before = normalised_dump(s.tree.as_ref()).await;
    assert!(matches!(
        e.hold_job(&locked).await,
        Err(EngineError::Locked(_))
    ));
    unchanged(&s, &before, "a refused admin action changes nothing").await;
    e.release_job_lease(l).await.unwrap();
    e.hold_job(&jobs[0]).await.unwrap();
    e.hold_job(&jobs[1]).await.unwrap();
    e.release_job(&jobs[1]).await.unwrap();
    assert!(
        matches!(e.release_job(&jobs[1]).await, Err(EngineError::Illegal(_))),
        "only Held jobs are released"
    );
    // Deleting a held job moves it to Deleted and out of batch-processing.
    let st = e.delete_job(&jobs[0]).await.unwrap().unwrap();
    assert_eq!(st.status, JobState::Deleted);
    let info = e.batch(&bid).await.unwrap();
    assert_eq!(info.jobs["batch-deleted"], vec![jobs[0].clone()]);
    // A batch with a pending job cannot be deleted; its status stays.
    assert!(matches!(
        e.delete_batch(&bid).await,
        Err(EngineError::Illegal(_)) | Err(EngineError::Invalid(_))
    ));
    assert_eq!(
        e.batch(&bid).await.unwrap().status.status,
        BatchState::Processing
    );
    // Hold/release of a pending batch.
    let b2 = e.create_batch(Default::default()).await.unwrap();
    e.hold_batch(&b2).await.unwrap();
    assert!(matches!(
        e.hold_batch(&b2).await,
        Err(EngineError::Illegal(_))
    ));
    e.delete_batch(&b2).await.unwrap();
    assert_eq!(
        e.batch(&b2).await.unwrap().status.status,
        BatchState::Deleted
    );
}

pub async fn duplicate_batch_uuid_is_refused(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let mut sub = Map::new();
    sub.insert(
        "batchID".into(),
        json!("0b7e2a4e-1111-4222-8333-944445555666"),
    );
    let bid = e
        .create_batch(sub.clone().try_into().unwrap())
        .await
        .unwrap();
    assert_eq!(
        e.batch_by_uuid("0b7e2a4e-1111-4222-8333-944445555666")
            .await
            .unwrap(),
        Some(bid)
    );
    let err = e.create_batch(sub.try_into().unwrap()).await.unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    assert_eq!(
        e.batch_ids().await.unwrap().len(),
        1,
        "no half-made batch left behind"
    );
}

/// Counts an engine's waiters parking (see `Engine::parked`): a waiter has looked, found
/// nothing and is waiting.
struct Parks {
    rx: tokio::sync::watch::Receiver<u64>,
    seen: u64,
}

impl Parks {
    /// From now on (take it before starting the waiter).
    fn of(e: &Engine) -> Parks {
        let rx = e.parked();
        let seen = *rx.borrow();
        Parks { rx, seen }
    }

    /// Counts from now (before starting the next waiter).
    fn restart(&mut self) {
        self.seen = *self.rx.borrow_and_update();
    }

    /// Until a waiter has parked since the last time.
    async fn next(&mut self) {
        let seen = self.seen;
        let now = tokio::time::timeout(WAIT, self.rx.wait_for(|p| *p > seen))
            .await
            .expect("a waiter parked")
            .map(|p| *p)
            .expect("the engine is alive");
        self.seen = now;
    }
}
