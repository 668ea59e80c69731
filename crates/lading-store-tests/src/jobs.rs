//! Jobs: the pipeline walk, acquisition order and cost, leases, fencing, deferral and requeue.

use super::*;
use lading_core::{Names, TreeFuture};

pub async fn job_walks_the_pipeline_and_the_tree_matches_the_layout(h: &dyn Harness) {
    let (e, s) = engine(h, "golden").await;
    let (bid, jobs) = batch_with_jobs(&e, 2, &[]).await;
    assert_eq!(jobs.len(), 2);
    assert_eq!(
        run_job_to_completion(&e, JobState::Pending).await,
        Some(jobs[0].clone())
    );
    // Second job fails in Downloading.
    let l = take_job(&e, JobState::Pending).await;
    e.job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    for st in [JobState::Estimating, JobState::Provisioning] {
        let l = e.acquire_job(st).await.unwrap().unwrap();
        e.job_transition(l, Event::Success, None).await.unwrap();
    }
    let l = take_job(&e, JobState::Downloading).await;
    let failed = e
        .job_transition(l, Event::Fail, Some("digest mismatch".into()))
        .await
        .unwrap();
    assert_eq!(failed.last_successful_status, Some(JobState::Provisioning));
    assert_eq!(
        e.batch(&bid).await.unwrap().status.status,
        BatchState::Reporting
    );

    let got = normalised_dump(s.tree.as_ref()).await;
    let mut expected: BTreeMap<String, Value> =
        serde_json::from_str(GOLDEN).expect("golden parses");
    // Empty folders of every job state exist; add them rather than listing all twelve.
    for st in JobState::ALL {
        expected.entry(job_state_folder(*st)).or_insert(Value::Null);
    }
    let diff: Vec<String> = got
        .keys()
        .chain(expected.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|k| got.get(*k) != expected.get(*k))
        .map(|k| format!("{k}: got {:?}, expected {:?}", got.get(k), expected.get(k)))
        .collect();
    assert!(
        diff.is_empty(),
        "tree differs from the golden layout:\n{}",
        diff.join("\n")
    );
}

/// What one step changed in the tree: `+path` added, `-path` removed, `~path` rewritten, each
/// with its (normalised) data.
pub(crate) fn step_diff(
    before: &BTreeMap<String, Value>,
    after: &BTreeMap<String, Value>,
) -> BTreeMap<String, Value> {
    let mut d = BTreeMap::new();
    for (k, v) in after {
        match before.get(k) {
            None => {
                d.insert(format!("+{k}"), v.clone());
            }
            Some(old) if old != v => {
                d.insert(format!("~{k}"), v.clone());
            }
            _ => {}
        }
    }
    for k in before.keys() {
        if !after.contains_key(k) {
            d.insert(format!("-{k}"), Value::Null);
        }
    }
    d
}

/// A tree followed step by step: each [`Steps::check`] compares what changed since the last
/// step with what this step should change.
pub(crate) struct Steps<'a> {
    tree: &'a dyn Tree,
    prev: BTreeMap<String, Value>,
}

impl<'a> Steps<'a> {
    pub(crate) async fn new(tree: &'a dyn Tree) -> Steps<'a> {
        let prev = normalised_dump(tree).await;
        Steps { tree, prev }
    }

    pub(crate) async fn check(&mut self, label: &str, expected: Value) {
        let now = normalised_dump(self.tree).await;
        let got = step_diff(&self.prev, &now);
        let want: BTreeMap<String, Value> =
            serde_json::from_value(expected).expect("expected diff");
        assert_eq!(
            serde_json::to_string_pretty(&got).unwrap(),
            serde_json::to_string_pretty(&want).unwrap(),
            "step {label}"
        );
        self.prev = now;
    }
}

pub async fn illegal_transition_is_refused_and_changes_nothing(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let (_bid, jobs) = batch_with_jobs(&e, 1, &[]).await;
    let before = normalised_dump(s.tree.as_ref()).await;
    let l = take_job(&e, JobState::Pending).await;
    let err = e
        .job_transition(l.clone(), Event::To(JobState::Completed), None)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "illegal job transition from Pending to Completed"
    );
    e.release_job_lease(l).await.unwrap();
    let err = e.requeue_job(&jobs[0], None).await.unwrap_err();
    assert!(matches!(err, EngineError::Illegal(_)), "{err}");
    let err = e.delete_job(&jobs[0]).await.unwrap_err();
    assert!(
        err.to_string()
            .starts_with("cannot delete this job: it is Pending; only a Failed or Held job"),
        "{err}"
    );
    unchanged(&s, &before, "refused moves leave the tree as it was").await;
}

pub async fn unknown_ids_get_typed_errors(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let missing = JobId::parse("jid9999999999").unwrap();
    assert!(matches!(e.job(&missing).await, Err(EngineError::NoJob(j)) if j == "jid9999999999"));
    assert!(matches!(
        e.hold_job(&missing).await,
        Err(EngineError::NoJob(_))
    ));
    let b = BatchId::parse("bid9999999999").unwrap();
    assert!(matches!(e.batch(&b).await, Err(EngineError::NoBatch(_))));
    assert!(matches!(
        e.delete_batch(&b).await,
        Err(EngineError::NoBatch(_))
    ));
    assert!(matches!(
        e.pause_queue("nosuch").await,
        Err(EngineError::Invalid(_))
    ));
}

pub async fn corrupt_node_is_named_and_nothing_changes(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let (_bid, jobs) = batch_with_jobs(&e, 1, &[]).await;
    s.tree
        .set(&job_node(&jobs[0], "status"), bytes("{not json"), None)
        .await
        .unwrap();
    let before = normalised_dump(s.tree.as_ref()).await;
    let err = e.acquire_job(JobState::Pending).await.unwrap_err();
    match &err {
        EngineError::Corrupt { path, reason } => {
            assert_eq!(path, &job_node(&jobs[0], "status"));
            assert!(reason.contains("invalid JSON"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    assert!(matches!(
        e.hold_job(&jobs[0]).await,
        Err(EngineError::Corrupt { .. })
    ));
    unchanged(&s, &before, "no lock or move left behind").await;
}

pub async fn acquisition_follows_priority_then_age(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let (_bid, jobs) = batch_with_jobs(&e, 4, &[7, 3, 7, 3]).await;
    let mut order = Vec::new();
    while let Some(l) = e.acquire_job(JobState::Pending).await.unwrap() {
        order.push(l.job.clone());
        e.job_transition(l, Event::To(JobState::Estimating), None)
            .await
            .unwrap();
    }
    assert_eq!(
        order,
        vec![
            jobs[1].clone(),
            jobs[3].clone(),
            jobs[0].clone(),
            jobs[2].clone()
        ]
    );
}

pub async fn set_priority_moves_the_reference(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let (_bid, jobs) = batch_with_jobs(&e, 2, &[]).await;
    let mut l = estimating(&e).await;
    e.set_priority(&mut l, 12).await.unwrap();
    e.set_space_needed(&l, 1_000_000_000).await.unwrap();
    e.job_transition(l, Event::Success, None).await.unwrap();
    let at = |state, prio| job_ref(state, prio, &jobs[0]);
    let t = s.tree.as_ref();
    assert!(
        t.exists(&at(JobState::Provisioning, 12))
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        t.exists(&at(JobState::Estimating, 5))
            .await
            .unwrap()
            .is_none()
    );
    let info = e.job(&jobs[0]).await.unwrap();
    assert_eq!((info.priority, info.space_needed), (12, 1_000_000_000));
    assert!(matches!(
        e.set_priority(&mut take_job(&e, JobState::Pending).await, 100)
            .await,
        Err(EngineError::Invalid(_))
    ));
}

/// Runs `work` on `per` workers in each of `sessions` sessions (as that many processes would
/// have), and gathers what they return once every one has ended (each within `WAIT`).
async fn workers<T: Send + 'static, Fut>(
    h: &dyn Harness,
    sessions: usize,
    per: usize,
    work: impl Fn(Arc<Engine>) -> Fut,
) -> Vec<T>
where
    Fut: std::future::Future<Output = Vec<T>> + Send + 'static,
{
    let mut handles = Vec::new();
    for w in 0..sessions {
        let (ew, sw) = engine(h, &format!("worker{w}")).await;
        for _ in 0..per {
            handles.push(tokio::spawn(work(ew.clone())));
        }
        std::mem::forget(sw); // sessions stay open for the test's life
    }
    let mut all = Vec::new();
    for hd in handles {
        let done = tokio::time::timeout(WAIT, hd).await;
        all.extend(done.expect("worker finished").expect("worker ok"));
    }
    all
}

pub async fn concurrent_workers_each_job_handed_to_exactly_one(h: &dyn Harness) {
    let (e, _s) = engine(h, "setup").await;
    let (_bid, jobs) = batch_with_jobs(&e, 60, &[]).await;
    // Three sessions (as three processes would have), four workers each.
    let all = workers(h, 3, 4, |ew| async move {
        let mut got = Vec::new();
        while let Some(l) = ew.acquire_job(JobState::Pending).await.expect("acquire") {
            got.push(l.job.clone());
            tokio::task::yield_now().await;
            ew.job_transition(l, Event::To(JobState::Estimating), None)
                .await
                .expect("transition");
        }
        got
    })
    .await;
    let unique: HashSet<_> = all.iter().cloned().collect();
    assert_eq!(all.len(), jobs.len(), "every job handed out exactly once");
    assert_eq!(unique.len(), jobs.len());
    assert_eq!(e.job_counts().await.unwrap()[&JobState::Estimating], 60);
}

/// Acquiring from several states at once: a lone worker takes the first state's head in the
/// order given; workers of several sessions racing over the states' heads (each picking at
/// random in a bounded window) still get every job exactly once, and each move chains into
/// the next job in its `multi`.
pub async fn acquiring_over_several_states_hands_each_job_out_once(h: &dyn Harness) {
    let (e, _s) = engine(h, "setup").await;
    let (_bid, jobs) = batch_with_jobs(&e, 40, &[]).await;
    let order = [JobState::Estimating, JobState::Pending];
    // Alone: the Pending head, then (Estimating first) that same job again.
    let l = e.acquire_any(&order).await.unwrap().expect("a job");
    assert_eq!(l.job, jobs[0]);
    e.job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    let l = e.acquire_any(&order).await.unwrap().expect("a job");
    assert_eq!(
        (l.job.clone(), l.state()),
        (jobs[0].clone(), JobState::Estimating)
    );
    e.job_transition(l, Event::Success, None).await.unwrap();
    // Three sessions, three workers each, moving every job Pending → Estimating →
    // Provisioning.
    let all = workers(h, 3, 3, |ew| async move {
        let mut moved = Vec::new();
        let mut next = ew.acquire_any(&order).await.expect("acquire");
        loop {
            let Some(l) = next.take() else {
                match ew.acquire_any(&order).await.expect("acquire") {
                    Some(l) => {
                        next = Some(l);
                        continue;
                    }
                    None => break,
                }
            };
            moved.push((l.job.clone(), l.state()));
            let ev = if l.state() == JobState::Pending {
                Event::To(JobState::Estimating)
            } else {
                Event::Success
            };
            let (_, n) = ew
                .job_transition_then_acquire(l, ev, None, &order)
                .await
                .expect("transition");
            next = n;
        }
        moved
    })
    .await;
    let unique: HashSet<_> = all.iter().cloned().collect();
    assert_eq!(all.len(), unique.len(), "no job moved twice from one state");
    assert_eq!(all.len(), 2 * (jobs.len() - 1), "every move made once");
    let counts = e.job_counts().await.unwrap();
    assert_eq!(counts[&JobState::Provisioning], 40, "{counts:?}");
}

/// A worker that moves a job on may lock its next job in the same `multi`: the next one in
/// queue order, locked against everyone else; when another session got it first, the move is
/// made alone; a paused queue hands nothing out this way either; a lost lease moves nothing
/// and locks nothing.
pub async fn moving_a_job_can_lock_the_next_in_the_same_multi(h: &dyn Harness) {
    let (e1, s1) = engine(h, "w1").await;
    let (e2, _s2) = engine(h, "w2").await;
    let (_bid, jobs) = batch_with_jobs(&e1, 4, &[]).await;
    let next = [JobState::Pending];
    let l0 = take_job(&e1, JobState::Pending).await;
    assert_eq!(l0.job, jobs[0]);
    let (st, l1) = e1
        .job_transition_then_acquire(l0, Event::To(JobState::Estimating), None, &next)
        .await
        .unwrap();
    assert_eq!(st.status, JobState::Estimating);
    let l1 = l1.expect("the next Pending job comes with the move");
    assert_eq!(l1.job, jobs[1], "queue order");
    assert_eq!(l1.state(), JobState::Pending);
    let moved = take_job(&e2, JobState::Estimating).await;
    assert_eq!(moved.job, jobs[0], "the moved job's lock is gone");
    e2.release_job_lease(moved).await.unwrap();
    // This session takes one of the last two, the other session the other: this one never
    // met that lock. The job that came with the move is locked against the other session.
    let ly = take_job(&e1, JobState::Pending).await;
    let lx = take_job(&e2, JobState::Pending).await;
    let mut three = vec![l1.job.clone(), ly.job.clone(), lx.job.clone()];
    three.sort();
    assert_eq!(three, jobs[1..].to_vec());
    assert!(e2.acquire_job(JobState::Pending).await.unwrap().is_none());

    // The only candidate is locked by the other session: the move is made alone.
    moved_alone(&e1, l1, &next, "the next job was locked elsewhere").await;
    assert_eq!(
        e1.job(&jobs[1]).await.unwrap().status.status,
        JobState::Estimating
    );
    // The other session's lease is intact.
    e2.job_transition(lx, Event::To(JobState::Estimating), None)
        .await
        .unwrap();

    // A lost lease moves nothing and locks nothing.
    let (e3, _s3) = engine(h, "w3").await;
    let (_bid, more) = batch_with_jobs(&e3, 2, &[]).await;
    (s1.expire)().await;
    let y = ly.job.clone();
    let err = e1
        .job_transition_then_acquire(ly, Event::To(JobState::Estimating), None, &next)
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::LeaseLost(_)), "{err}");
    assert_eq!(e3.job(&y).await.unwrap().status.status, JobState::Pending);
    let mut free = HashSet::new();
    while let Some(l) = e3.acquire_job(JobState::Pending).await.unwrap() {
        free.insert(l.job.clone());
    }
    assert_eq!(free, HashSet::from([y, more[0].clone(), more[1].clone()]));

    // A paused queue: the move is made, nothing more is handed out.
    let (e4, _s4) = engine(h, "w4").await;
    let (_bid, last) = batch_with_jobs(&e4, 2, &[]).await;
    let l = take_job(&e4, JobState::Pending).await;
    assert!(last.contains(&l.job));
    e4.pause_queue("ingest").await.unwrap();
    moved_alone(&e4, l, &next, "a paused queue hands out nothing").await;
    e4.resume_queue("ingest").await.unwrap();
}

/// Moves `l` to Estimating asking for the next job in `next`, and asserts the move was made
/// and no job came with it (`why`).
async fn moved_alone(e: &Engine, l: lading_engine::JobLease, next: &[JobState], why: &str) {
    let to = Event::To(JobState::Estimating);
    let (st, none) = e
        .job_transition_then_acquire(l, to, None, next)
        .await
        .unwrap();
    assert_eq!(st.status, JobState::Estimating);
    assert!(none.is_none(), "{why}");
}

pub async fn lost_lease_cannot_commit_transition(h: &dyn Harness) {
    let (e1, s1) = engine(h, "stalled").await;
    let (e2, _s2) = engine(h, "healthy").await;
    let (_bid, jobs) = batch_with_jobs(&e1, 1, &[]).await;
    let l = estimating(&e1).await;
    assert!(
        e2.acquire_job(JobState::Estimating)
            .await
            .unwrap()
            .is_none(),
        "locked while held"
    );
    (s1.expire)().await;
    // The stalled worker wakes up and tries to commit: refused, nothing changes.
    let err = e1
        .job_transition(l.clone(), Event::Success, None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, EngineError::LeaseLost(ref j) if j == jobs[0].as_str()),
        "{err}"
    );
    assert!(matches!(
        e1.set_space_needed(&l, 5).await,
        Err(EngineError::LeaseLost(_))
    ));
    // Another worker picks it up in the state it was in.
    let l2 = take_job(&e2, JobState::Estimating).await;
    assert_eq!(l2.job, jobs[0]);
    assert_eq!(e2.job(&jobs[0]).await.unwrap().space_needed, 0);
    e2.job_transition(l2, Event::Success, None).await.unwrap();
    assert_eq!(
        e2.job(&jobs[0]).await.unwrap().status.status,
        JobState::Provisioning
    );
}

pub async fn a_worker_whose_session_expired_can_acquire_again(h: &dyn Harness) {
    // Regressions: the engine remembered its claims across a session expiry and never handed
    // those jobs out again in that process; and the SQLite store gave a new session the id of
    // the one it replaced, so the dead session's leases looked alive.
    let (e, s) = engine(h, "w").await;
    let (_bid, jobs) = batch_with_jobs(&e, 1, &[]).await;
    let lease = take_job(&e, JobState::Pending).await;
    // The handler holding it is cancelled: the lease is dropped, never released.
    drop(lease);
    let before = s.tree.session_id();
    (s.expire)().await;
    assert_ne!(
        s.tree.session_id(),
        before,
        "a new session never reuses an old id"
    );
    let again = take_job(&e, JobState::Pending).await;
    assert_eq!(again.job, jobs[0]);
}

pub async fn stale_lease_after_a_takeover_is_lost(h: &dyn Harness) {
    // Same session, but the status moved underneath (admin action after the lock was gone).
    let (e, s) = engine(h, "w").await;
    let (_bid, jobs) = batch_with_jobs(&e, 1, &[]).await;
    let l = take_job(&e, JobState::Pending).await;
    s.tree
        .delete(&job_node(&jobs[0], "lock"), None)
        .await
        .unwrap();
    e.hold_job(&jobs[0]).await.unwrap();
    let err = e
        .job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::LeaseLost(_)), "{err}");
    assert_eq!(e.job(&jobs[0]).await.unwrap().status.status, JobState::Held);
}

pub async fn requeue_returns_a_failed_job_to_the_stage_that_failed(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let (bid, jobs) = batch_with_jobs(&e, 1, &[]).await;
    let mut l = estimating(&e).await;
    while l.state() != JobState::Recording {
        l = e.job_advance(l, Event::Success, None).await.unwrap();
    }
    e.job_transition(l, Event::Fail, Some("inventory down".into()))
        .await
        .unwrap();
    assert_eq!(
        e.batch(&bid).await.unwrap().status.status,
        BatchState::Reporting
    );
    let st = e.requeue_job(&jobs[0], None).await.unwrap();
    assert_eq!(
        (st.status, st.retry_count, st.last_successful_status),
        (JobState::Recording, 1, Some(JobState::Storing))
    );
    let info = e.batch(&bid).await.unwrap();
    assert_eq!(info.jobs["batch-processing"], vec![jobs[0].clone()]);
    assert!(info.jobs["batch-failed"].is_empty());
    // An explicit target from the table is accepted too.
    let l = take_job(&e, JobState::Recording).await;
    e.job_transition(l, Event::Fail, None).await.unwrap();
    let st = e
        .requeue_job(&jobs[0], Some(JobState::Downloading))
        .await
        .unwrap();
    assert_eq!((st.status, st.retry_count), (JobState::Downloading, 2));
}

pub async fn deferred_job_is_not_taken_before_its_retry_time(h: &dyn Harness) {
    // Both processes on one manual clock: the retry time comes when the test moves it.
    let clock = lading_core::time::ManualClock::new(1_800_000_000_000);
    let (e, _s) = engine_on_clock(h, "w1", clock.clone()).await;
    let (other, _s2) = engine_on_clock(h, "w2", clock.clone()).await;
    let (_bid, jobs) = batch_with_jobs(&e, 2, &[]).await;
    let l = take_job(&e, JobState::Pending).await;
    assert_eq!(l.job, jobs[0]);
    let retry_at_ms = e.clock().now_ms() + 1500;
    let st = e
        .job_defer(l, retry_at_ms, 1, Some("server busy".into()))
        .await
        .unwrap();
    assert_eq!(lading_engine::attempts(&st), 1);
    let stored = e.job(&jobs[0]).await.unwrap();
    assert_eq!(stored.status.status, JobState::Pending);
    assert_eq!(stored.status.message.as_deref(), Some("server busy"));
    assert_eq!(lading_engine::retry_at(&stored.status), Some(retry_at_ms));
    assert!(!stored.locked, "deferring releases the lock");
    // Another process honours the retry time: it takes the next job, then nothing.
    let l2 = take_job(&other, JobState::Pending).await;
    assert_eq!(l2.job, jobs[1]);
    other.release_job_lease(l2).await.unwrap();
    let again = take_job(&other, JobState::Pending).await;
    assert_eq!(again.job, jobs[1]);
    assert!(
        other
            .acquire_job(JobState::Pending)
            .await
            .unwrap()
            .is_none()
    );
    // A waiting worker is woken when the deferred job becomes due, and not before.
    let mut parked = other.parked();
    let before = *parked.borrow_and_update();
    let waiter = {
        let other = other.clone();
        tokio::spawn(async move {
            other
                .wait_job_or(JobState::Pending, WAIT, std::future::pending())
                .await
        })
    };
    parked.wait_for(|n| *n > before).await.unwrap();
    clock.advance_ms(1499);
    assert!(
        other
            .acquire_job(JobState::Pending)
            .await
            .unwrap()
            .is_none(),
        "not a millisecond early"
    );
    assert!(!waiter.is_finished(), "the waiter still waits");
    clock.advance_ms(1);
    let l = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("the deferred job once due");
    assert_eq!(l.job, jobs[0]);
    assert!(e.clock().now_ms() >= retry_at_ms);
    // Leaving the stage forgets its attempts and retry time.
    let st = other
        .job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    assert_eq!(lading_engine::attempts(&st), 0);
    assert_eq!(lading_engine::retry_at(&st), None);
    other.release_job_lease(again).await.unwrap();
}

/// An engine named `owner` on a session of its own over a [`CountingTree`] (the returned
/// session keeps it open).
pub(crate) async fn counted_engine(
    h: &dyn Harness,
    owner: &str,
) -> (Arc<Engine>, Arc<CountingTree>, Session) {
    let s = h.open().await;
    let counting = CountingTree::over(s.tree.clone());
    let e = Arc::new(Engine::new(counting.clone(), system_clock(), owner));
    e.init().await.unwrap();
    (e, counting, s)
}

/// A tree that counts the calls made through it, to measure cost in round trips.
pub struct CountingTree {
    inner: Arc<dyn Tree>,
    pub calls: std::sync::atomic::AtomicUsize,
    /// The writes (`multi`, `multi_on`) made through it, refused ones included.
    pub writes: std::sync::atomic::AtomicUsize,
    /// The paths watches were set on, in order.
    pub watched: std::sync::Mutex<Vec<String>>,
    /// How many watches have been set: a test waits on it.
    pub set: tokio::sync::watch::Sender<usize>,
    /// The paths read one by one (`get`), in order.
    pub read: std::sync::Mutex<Vec<String>>,
    /// The folders listed (`children_page`), in order.
    pub listed: std::sync::Mutex<Vec<String>>,
}

impl CountingTree {
    pub fn over(inner: Arc<dyn Tree>) -> Arc<CountingTree> {
        Arc::new(CountingTree {
            inner,
            calls: Default::default(),
            writes: Default::default(),
            watched: Default::default(),
            set: tokio::sync::watch::Sender::new(0),
            read: Default::default(),
            listed: Default::default(),
        })
    }

    fn bump(&self) {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    pub fn calls(&self) -> usize {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }
    /// How many writes were sent, refused ones included.
    pub fn writes(&self) -> usize {
        self.writes.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn wrote(&self) {
        self.bump();
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    /// How many watches were set on `path`.
    pub fn watches_on(&self, path: &str) -> usize {
        self.watched
            .lock()
            .unwrap()
            .iter()
            .filter(|p| *p == path)
            .count()
    }
    /// How many times `path` was read one by one.
    pub fn reads_of(&self, path: &str) -> usize {
        self.read
            .lock()
            .unwrap()
            .iter()
            .filter(|p| *p == path)
            .count()
    }
}

impl Tree for CountingTree {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn session_id(&self) -> u64 {
        self.inner.session_id()
    }
    fn get<'a>(&'a self, path: &'a str) -> TreeFuture<'a, Option<lading_core::Node>> {
        self.bump();
        self.read.lock().unwrap().push(path.to_string());
        self.inner.get(path)
    }
    /// One round trip for all of them, as on ZooKeeper (a read-only `multi`).
    fn get_many<'a>(
        &'a self,
        paths: &'a [String],
    ) -> TreeFuture<'a, Vec<Option<lading_core::Node>>> {
        self.bump();
        self.read.lock().unwrap().extend(paths.iter().cloned());
        self.inner.get_many(paths)
    }
    fn exists<'a>(&'a self, path: &'a str) -> TreeFuture<'a, Option<lading_core::Stat>> {
        self.bump();
        self.inner.exists(path)
    }
    fn children<'a>(&'a self, path: &'a str) -> Names<'a> {
        self.bump();
        self.inner.children(path)
    }
    fn children_page<'a>(&'a self, path: &'a str, after: Option<&'a str>, max: usize) -> Names<'a> {
        self.bump();
        self.listed.lock().unwrap().push(path.to_string());
        self.inner.children_page(path, after, max)
    }
    fn count_children<'a>(&'a self, path: &'a str) -> TreeFuture<'a, u64> {
        self.bump();
        self.inner.count_children(path)
    }
    fn multi(&self, ops: Vec<Op>) -> TreeFuture<'_, Vec<OpResult>> {
        self.wrote();
        self.inner.multi(ops)
    }
    fn multi_on(&self, session: u64, ops: Vec<Op>) -> TreeFuture<'_, Vec<OpResult>> {
        self.wrote();
        self.inner.multi_on(session, ops)
    }
    fn watch<'a>(&'a self, path: &'a str, kind: WatchKind) -> TreeFuture<'a, lading_core::Watch> {
        Box::pin(async move {
            let w = self.inner.watch(path, kind).await?;
            // Once set: a change from now on fires it.
            self.watched.lock().unwrap().push(path.to_string());
            self.set.send_modify(|n| *n += 1);
            Ok(w)
        })
    }
    fn close(&self) -> TreeFuture<'_, ()> {
        self.inner.close()
    }
}

/// Round trips one acquisition costs with `queued` other jobs queued behind the head.
pub(crate) async fn acquisition_round_trips(h: &dyn Harness, queued: u32) -> usize {
    let s = h.open().await;
    let counting = CountingTree::over(s.tree.clone());
    let e = Engine::new(counting.clone(), system_clock(), "counter");
    e.init().await.unwrap();
    // Queue references directly (cheaper than whole jobs) behind one real job at the head.
    let folder = job_state_folder(JobState::Pending);
    let names: Vec<u32> = (0..queued).collect();
    for chunk in names.chunks(500) {
        let ops = chunk
            .iter()
            .map(|i| Op::create(format!("{folder}/50-jid9{queued:05}{i:06}"), None))
            .collect();
        s.tree.multi(ops).await.unwrap();
    }
    let b = e.create_batch(Default::default()).await.unwrap();
    let lease = take_batch(&e, BatchState::Pending).await;
    assert_eq!(lease.batch, b);
    let jid = e
        .create_job(
            &lease,
            JobSpec {
                priority: Some(1),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    e.batch_transition(lease, Event::To(BatchState::Processing), None)
        .await
        .unwrap();
    let before = counting.calls();
    let mut got = take_job(&e, JobState::Pending).await;
    let cost = counting.calls() - before;
    assert_eq!(got.job, jid, "the head of the queue is found");
    // The worker that handles it has its whole record already: read with the lease.
    let before = counting.calls();
    let info = e.leased_job(&mut got).await.unwrap();
    assert_eq!(
        counting.calls(),
        before,
        "the leased job's record is read again"
    );
    assert_eq!((info.id, info.priority), (jid.clone(), 1));
    assert!(e.job_counts().await.unwrap()[&JobState::Pending] > queued as u64);
    e.job_transition(got, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    cost
}

pub async fn acquisition_cost_does_not_grow_with_the_queue(h: &dyn Harness) {
    let small = acquisition_round_trips(h, 100).await;
    let large = acquisition_round_trips(h, 3000).await;
    assert_eq!(
        small, large,
        "round trips per acquisition: {small} with 100 queued, {large} with 3,000"
    );
    assert!(small <= 8, "acquisition takes {small} round trips");
}

/// Every transition of a job and of its batch is kept with it (time, from, to, host,
/// message), so any host can read it after the fact; an admin's moves say so.
pub async fn history_records_every_transition_with_its_time_and_host(h: &dyn Harness) {
    let (e, _s) = engine(h, "host-a:1").await;
    let (bid, jobs) = batch_with_jobs(&e, 1, &[]).await;
    let (other, _so) = engine(h, "host-b:2").await;
    let l = estimating(&other).await;
    other
        .job_transition(l, Event::Fail, Some("no space".into()))
        .await
        .unwrap();
    e.requeue_job(&jobs[0], Some(JobState::Pending))
        .await
        .unwrap();
    let info = e.job(&jobs[0]).await.unwrap();
    // As the API shows them.
    let shown = |extra: &serde_json::Map<String, Value>| -> Vec<Value> {
        lading_engine::history(extra)
            .iter()
            .map(|x| serde_json::to_value(x).unwrap())
            .collect()
    };
    let hist = shown(&info.status.extra);
    let steps: Vec<(Value, Value, Value)> = hist
        .iter()
        .map(|x| (x["from"].clone(), x["to"].clone(), x["host"].clone()))
        .collect();
    assert_eq!(
        steps,
        [
            (Value::Null, json!("Pending"), json!("host-a:1")),
            (json!("Pending"), json!("Estimating"), json!("host-b:2")),
            (json!("Estimating"), json!("Failed"), json!("host-b:2")),
            (json!("Failed"), json!("Pending"), json!("host-a:1")),
        ]
    );
    assert_eq!(hist[2]["message"], "no space");
    assert_eq!(hist[3]["message"], "by an admin");
    assert!(
        hist.iter()
            .all(|x| x["at"].as_str().is_some_and(|t| t.len() == 25))
    );
    // The batch: made, processing, reporting when its job failed, reopened by the requeue.
    let b = e.batch(&bid).await.unwrap();
    let to: Vec<Value> = shown(&b.status.extra)
        .iter()
        .map(|x| x["to"].clone())
        .collect();
    assert_eq!(
        to,
        [
            json!("Pending"),
            json!("Processing"),
            json!("Reporting"),
            json!("Processing")
        ]
    );
    // Bounded: a job moved back and forth keeps its last transitions only.
    for _ in 0..20 {
        e.hold_job(&jobs[0]).await.unwrap();
        e.release_job(&jobs[0]).await.unwrap();
    }
    let hist = shown(&e.job(&jobs[0]).await.unwrap().status.extra);
    assert_eq!(hist.len(), lading_engine::MAX_HISTORY);
    // Hosts are stored once per run of the same host; the oldest kept still names its own.
    assert!(hist.iter().all(|x| x["host"] == "host-a:1"), "{hist:?}");
    assert_eq!(hist.last().unwrap()["to"], "Pending");
    assert_eq!(hist.last().unwrap()["from"], "Held");
}
