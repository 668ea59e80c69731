//! Waiting workers: a parked waiter is woken by the change it waits for, sets again only
//! the watch that fired, and reads a status again only once it changed.

use super::*;

/// A wait of `e`'s, spawned (`wait`, given the engine and 8 s, less than the waiters' slow
/// sweep of 10 s: a missed wake-up ends the wait empty-handed instead of being covered by the
/// sweep), once it has looked and parked; and the count of its parks.
async fn parked_waiter<T, F, Fut>(
    e: &Arc<Engine>,
    wait: F,
) -> (
    tokio::task::JoinHandle<T>,
    tokio::sync::watch::Receiver<u64>,
)
where
    T: Send + 'static,
    F: FnOnce(Arc<Engine>, Duration) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let mut parked = e.parked();
    let before = *parked.borrow_and_update();
    let waiter = tokio::spawn(wait(e.clone(), Duration::from_secs(8)));
    parked.wait_for(|n| *n > before).await.unwrap();
    (waiter, parked)
}

/// [`parked_waiter`] for a Pending job.
async fn parked_pending_waiter(
    e: &Arc<Engine>,
) -> (
    tokio::task::JoinHandle<Result<Option<lading_engine::JobLease>, EngineError>>,
    tokio::sync::watch::Receiver<u64>,
) {
    parked_waiter(e, |e, d| async move {
        e.wait_job_or(JobState::Pending, d, std::future::pending())
            .await
    })
    .await
}

/// A waiting worker woken by a change sets again only the watch that fired: the others it
/// set are still armed (on ZooKeeper each watch set is a round trip).
pub async fn a_woken_waiter_sets_again_only_the_watch_that_fired(h: &dyn Harness) {
    let (admin, _s) = engine(h, "admin").await;
    let (w, counting, _c) = counted_engine(h, "waiter").await;
    let bid = admin.create_batch(Default::default()).await.unwrap();
    let lease = take_batch(&admin, BatchState::Pending).await;
    assert_eq!(lease.batch, bid);
    assert!(admin.pause_queue("ingest").await.unwrap());
    // A wake-up missed at the resume below ends the wait empty-handed.
    let (waiter, _) = parked_pending_waiter(&w).await;
    let folder = job_state_folder(JobState::Pending);
    let lock = queue_lock("ingest");
    let count = |p: &str| counting.watches_on(p);
    // Each new job wakes the waiter (its folder's watch fires): it sets that watch again,
    // finds the queue paused, takes nothing and waits again.
    let mut jobs = Vec::new();
    for _ in 0..5 {
        let set = count(&folder);
        jobs.push(
            admin
                .create_job(&lease, JobSpec::default())
                .await
                .expect("create job"),
        );
        let mut watches = counting.set.subscribe();
        let woke = watches.wait_for(|_| count(&folder) > set);
        if tokio::time::timeout(WAIT, woke).await.is_err() {
            panic!(
                "the waiter, woken by the new job, watches its folder again: {:?}",
                counting.watched.lock().unwrap()
            );
        }
        assert!(!waiter.is_finished(), "a paused queue hands out nothing");
    }
    // One by the wait, one by the pause flag's cache, and at most one more should the pause's
    // own event reach the first round late (the SQLite store tells watchers after it answers
    // the write); not one per round (6 or more).
    assert!(
        count(&lock) <= 3,
        "the pause flag's watch has not fired and is not set again: {:?}",
        counting.watched.lock().unwrap()
    );
    // It still fires: resuming the queue hands the waiter the first job.
    admin
        .batch_transition(lease, Event::To(BatchState::Processing), None)
        .await
        .unwrap();
    assert!(admin.resume_queue("ingest").await.unwrap());
    let got = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("a job once the queue is resumed, without waiting for the sweep");
    assert_eq!(got.job, jobs[0]);
    let stored = admin.job(&jobs[0]).await.unwrap();
    assert_eq!(stored.status.status, JobState::Pending);
    assert!(stored.locked, "held by the waiter's lease");
    w.release_job_lease(got).await.unwrap();
}

/// The waiters of one process share its watches: four workers waiting on a paused queue set
/// one watch on the pause flag and one on their folder between them, not one each (on
/// ZooKeeper a data watch set is a round trip: in `lading-sim` each waiter of each stage set
/// its own, about 55 per job). The shared watch still wakes each of them.
pub async fn the_waiters_of_one_process_share_its_watches(h: &dyn Harness) {
    let (admin, _s) = engine(h, "admin").await;
    let bid = admin.create_batch(Default::default()).await.unwrap();
    let lease = take_batch(&admin, BatchState::Pending).await;
    assert_eq!(lease.batch, bid);
    let mut jobs = Vec::new();
    for _ in 0..4 {
        jobs.push(admin.create_job(&lease, JobSpec::default()).await.unwrap());
    }
    assert!(admin.pause_queue("ingest").await.unwrap());
    // The waiters' process starts after these writes: on ZooKeeper its session's folder cache
    // hears of another session's writes by events that may arrive after a waiter has parked,
    // and each such event rightly fires the folder's watch (a local one, no round trip).
    let (w, counting, _c) = counted_engine(h, "waiters").await;
    let mut waiters = Vec::new();
    for _ in 0..4 {
        waiters.push(parked_pending_waiter(&w).await.0);
    }
    let count = |p: &str| counting.watches_on(p);
    // One each, and at most one more should the pause's own event reach the first waiter
    // after it set its watch (the SQLite store tells watchers after it answers the write);
    // not one per waiter (4 or more).
    let (lock, folder) = (queue_lock("ingest"), job_state_folder(JobState::Pending));
    assert!(
        count(&lock) <= 2 && count(&folder) <= 2,
        "four waiters of one process set one watch on each node: {:?}",
        counting.watched.lock().unwrap()
    );
    // The shared watch wakes all four: each takes a job of its own once the queue resumes.
    admin
        .batch_transition(lease, Event::To(BatchState::Processing), None)
        .await
        .unwrap();
    assert!(admin.resume_queue("ingest").await.unwrap());
    let mut got = Vec::new();
    for waiter in waiters {
        let lease = waiter
            .await
            .unwrap()
            .unwrap()
            .expect("a job once the queue is resumed, without waiting for the sweep");
        got.push(lease);
    }
    let mut taken: Vec<_> = got.iter().map(|l| l.job.clone()).collect();
    taken.sort();
    jobs.sort();
    assert_eq!(taken, jobs, "each waiter took a job of its own");
    for l in got {
        let stored = admin.job(&l.job).await.unwrap();
        assert_eq!(stored.status.status, JobState::Pending);
        assert!(stored.locked, "held by its waiter's lease");
        w.release_job_lease(l).await.unwrap();
    }
}

/// A waiter refused a job because a worker of its own process holds the job's claim sets no
/// watch on that lock (the refusal was local): it is woken when that worker lets go of it.
/// And only then: a claim let go that no local waiter was refused wakes nobody (every claim
/// let go used to wake every such waiter of the process, the most frequent wake-up in
/// `lading-sim`).
pub async fn a_waiter_refused_a_local_claim_is_woken_by_its_release_alone(h: &dyn Harness) {
    let (e, _s) = engine(h, "one").await;
    let (_, jobs) = batch_with_jobs(&e, 2, &[]).await;
    // The second job in Estimating, leased there; the first leased in Pending.
    let other = estimating(&e).await;
    assert_eq!(other.job, jobs[0]);
    let first = take_job(&e, JobState::Pending).await;
    assert_eq!(first.job, jobs[1]);
    let (waiter, mut parked) = parked_pending_waiter(&e).await;
    let parked_once = *parked.borrow_and_update();
    // Letting go of a claim the waiter never asked for, five times.
    e.release_job_lease(other).await.unwrap();
    for _ in 0..4 {
        let again = take_job(&e, JobState::Estimating).await;
        assert_eq!(again.job, jobs[0]);
        e.release_job_lease(again).await.unwrap();
    }
    still_parked(&mut parked, parked_once, 1, &waiter, "the waiter").await;
    // Letting go of the one it was refused.
    e.release_job_lease(first).await.unwrap();
    let got = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("the job, once its local holder let go, without waiting for the sweep");
    assert_eq!(got.job, jobs[1]);
    e.release_job_lease(got).await.unwrap();
}

/// Two waiters of one process, each refused a different local claim: the release of one
/// claim wakes only the waiter it was refused to. (Whether a waiter had lost a local race was
/// counted for the whole process, so every waiter whose round overlapped any refusal was woken
/// at every contested claim let go: in `lading-sim`, more wake-ups than all the tree's watches
/// together, each a listing of the waiter's folder.)
pub async fn a_claim_let_go_wakes_only_the_waiter_it_was_refused_to(h: &dyn Harness) {
    let s = h.open().await;
    let counting = CountingTree::over(s.tree.clone());
    let e = Arc::new(Engine::new(counting.clone(), system_clock(), "one"));
    e.init().await.unwrap();
    let (_, jobs) = batch_with_jobs(&e, 2, &[]).await;
    let mut held = estimating(&e).await;
    assert_eq!(held.job, jobs[0]);
    let in_pending = take_job(&e, JobState::Pending).await;
    assert_eq!(in_pending.job, jobs[1]);
    let (pending, _) = parked_pending_waiter(&e).await;
    // Only the Pending waiter lists the Pending folder: each look it takes is one listing.
    let folder = job_state_folder(JobState::Pending);
    let looks = || {
        let listed = counting.listed.lock().unwrap();
        listed.iter().filter(|p| **p == folder).count()
    };
    let looked = looks();
    // Four times, a waiter of Estimating is refused the claim on the first job, and gets
    // the job when that claim is let go.
    for _ in 0..4 {
        let (waiter, _) = parked_waiter(&e, |e, d| async move {
            e.wait_job_or(JobState::Estimating, d, std::future::pending())
                .await
        })
        .await;
        e.release_job_lease(held).await.unwrap();
        held = waiter
            .await
            .unwrap()
            .unwrap()
            .expect("the Estimating job, once its local holder let go");
        assert_eq!(held.job, jobs[0]);
    }
    assert!(
        !pending.is_finished(),
        "the Pending waiter is still waiting"
    );
    e.release_job_lease(in_pending).await.unwrap();
    let got = pending
        .await
        .unwrap()
        .unwrap()
        .expect("the Pending job, once its local holder let go");
    assert_eq!(got.job, jobs[1]);
    // Its looks since: the ones its release caused (its signal, and the release's own event
    // in the store), and one the store may add: it tells watchers of a write after it
    // answers it, so an event of the setup can reach the waiter's watch just after it was
    // set (see `still_parked`). Woken at each claim let go, it looked eight times more.
    assert!(
        looks() <= looked + 3,
        "the Pending waiter looked {} more times",
        looks() - looked
    );
    let stored = e.job(&jobs[1]).await.unwrap();
    assert_eq!(stored.status.status, JobState::Pending);
    assert!(stored.locked, "held by the waiter's lease");
    e.release_job_lease(got).await.unwrap();
    e.release_job_lease(held).await.unwrap();
}

/// A waiting batch worker reads a batch's status again only once it has changed: each round
/// (woken by every new batch) used to read every live batch's status, a round trip each on
/// ZooKeeper. The status it keeps still gives way at once to a change.
pub async fn a_waiting_batch_worker_reads_a_status_again_only_once_it_changed(h: &dyn Harness) {
    let (admin, _s) = engine(h, "admin").await;
    let (w, counting, _c) = counted_engine(h, "waiter").await;
    let first = admin.create_batch(Default::default()).await.unwrap();
    let (waiter, _) = parked_waiter(&w, |w, d| async move {
        w.wait_batch_or(BatchState::Reporting, d, std::future::pending())
            .await
    })
    .await;
    let status = batch_node(&first, "status");
    let reads = |p: &str| counting.reads_of(p);
    let watches = |p: &str| counting.watches_on(p);
    // Each new batch wakes the waiter (the batches folder's watch fires); it looks at every
    // live batch and waits again.
    for _ in 0..5 {
        let set = watches(BATCHES);
        admin.create_batch(Default::default()).await.unwrap();
        let mut set_now = counting.set.subscribe();
        let woke = set_now.wait_for(|_| watches(BATCHES) > set);
        if tokio::time::timeout(WAIT, woke).await.is_err() {
            panic!("the waiter, woken by the new batch, watches the batches folder again");
        }
        assert!(!waiter.is_finished(), "no batch is Reporting yet");
    }
    // Read once (and once more should its first watch event reach a round late); the old
    // code read it in every round, 6 times.
    assert!(
        reads(&status) <= 2,
        "{} reads of the first batch's unchanged status: {:?}",
        reads(&status),
        counting.read.lock().unwrap()
    );
    // Its change is seen at once: the batch starts, has no jobs, and is Reporting.
    let lease = admin.acquire_batch(BatchState::Pending).await.unwrap();
    let lease = lease.expect("a pending batch");
    assert_eq!(lease.batch, first, "the oldest pending batch comes first");
    admin
        .batch_transition(lease, Event::To(BatchState::Processing), None)
        .await
        .unwrap();
    // (A batch with no jobs moves straight on to Reporting.)
    admin.maybe_report(&first).await.unwrap();
    let got = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("the Reporting batch, without waiting for the sweep");
    assert_eq!(got.batch, first);
    assert_eq!(got.status.status, BatchState::Reporting);
    let stored = admin.batch(&first).await.unwrap();
    assert_eq!(stored.status.status, BatchState::Reporting);
    assert!(stored.locked, "held by the waiter's lease");
    w.release_batch_lease(got).await.unwrap();
}

/// A look at a state whose jobs all fit one page lists the folder once: a page shorter than
/// asked for is the last (each look used to read an empty page after it, on ZooKeeper a
/// listing of the whole folder each time a waiter woke).
pub async fn a_look_at_a_short_folder_lists_it_once(h: &dyn Harness) {
    let s = h.open().await;
    let counting = CountingTree::over(s.tree.clone());
    // No sweep to fall back on: only what the waiter is owed wakes it.
    let e = Arc::new(
        Engine::new(counting.clone(), system_clock(), "looker")
            .with_sweep(Duration::from_secs(3600)),
    );
    e.init().await.unwrap();
    let (other, _s2) = engine(h, "holder").await;
    let (_, jobs) = batch_with_jobs(&e, 2, &[]).await;
    let held = take_job(&other, JobState::Pending).await;
    assert_eq!(held.job, jobs[0]);
    let folder = job_state_folder(JobState::Pending);
    let looks = || {
        let listed = counting.listed.lock().unwrap();
        listed.iter().filter(|p| **p == folder).count()
    };
    // The second job is free: found on the one page.
    let before = looks();
    let got = take_job(&e, JobState::Pending).await;
    assert_eq!(got.job, jobs[1]);
    assert_eq!(looks() - before, 1, "one listing to find the free job");
    // Nothing free: the two jobs are held, one by each process.
    let before = looks();
    assert!(e.acquire_job(JobState::Pending).await.unwrap().is_none());
    assert_eq!(looks() - before, 1, "one listing to find nothing free");
    // Let go before a waiter comes, it is found again: the waiter's first look tries the
    // other job found locked (its own), and watches this one's lock after it went; it reads
    // the lock once watched, finds it gone and looks again at once, not at the sweep.
    other.release_job_lease(held).await.unwrap();
    let again = e
        .wait_job_or(
            JobState::Pending,
            Duration::from_secs(60),
            std::future::pending(),
        )
        .await
        .unwrap()
        .expect("the job let go");
    assert_eq!(again.job, jobs[0]);
}
