//! The worker framework on a real SQLite store: outcomes, attempts, backoff, panics, timeouts
//! and shutdown.

use lading_core::layout::JobId;
use lading_core::time::system_clock;
use lading_core::tree::BoxFuture;
use lading_core::{Event, JobState};
use lading_engine::Engine;
use lading_store_sqlite::{SqliteOptions, SqliteTree};
use lading_worker::{JobCtx, JobStage, Outcome, Shutdown, ShutdownHandle, StageConfig, Worker};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

struct Setup {
    _dir: tempfile::TempDir,
    tree: Arc<SqliteTree>,
    engine: Arc<Engine>,
    work_root: std::path::PathBuf,
}

async fn setup(jobs: usize) -> (Setup, Vec<JobId>) {
    let dir = tempfile::tempdir().unwrap();
    let tree =
        Arc::new(SqliteTree::open(dir.path().join("lading.db"), SqliteOptions::default()).unwrap());
    let engine = Arc::new(Engine::new(tree.clone(), system_clock(), "test-worker"));
    engine.init().await.unwrap();
    let (_bid, ids) = lading_store_tests::batch_with_jobs(&engine, jobs, &[]).await;
    let work_root = dir.path().join("work");
    (
        Setup {
            _dir: dir,
            tree,
            engine,
            work_root,
        },
        ids,
    )
}

/// A Pending-state stage whose behaviour a test scripts per attempt.
struct Scripted {
    calls: AtomicU32,
    attempts_seen: Mutex<Vec<u32>>,
    script: Box<dyn Fn(u32) -> BoxFuture<'static, Outcome> + Send + Sync>,
}

impl JobStage for Scripted {
    fn state(&self) -> JobState {
        JobState::Pending
    }
    fn success(&self) -> Event<JobState> {
        Event::To(JobState::Estimating)
    }
    fn run(&self, job: Arc<JobCtx>) -> BoxFuture<'static, Outcome> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        self.attempts_seen.lock().unwrap().push(job.attempt);
        job.log(&format!("call {n}"));
        (self.script)(n)
    }
}

fn scripted(
    f: impl Fn(u32) -> BoxFuture<'static, Outcome> + Send + Sync + 'static,
) -> Arc<Scripted> {
    Arc::new(Scripted {
        calls: AtomicU32::new(0),
        attempts_seen: Mutex::new(Vec::new()),
        script: Box::new(f),
    })
}

fn quick(max_attempts: u32) -> StageConfig {
    StageConfig {
        concurrency: 1,
        timeout: Duration::from_secs(20),
        max_attempts,
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
    }
}

fn start(
    s: &Setup,
    stage: Arc<dyn JobStage>,
    cfg: StageConfig,
) -> (ShutdownHandle, tokio::task::JoinHandle<()>) {
    let worker = Worker::new(s.engine.clone(), &s.work_root);
    let (handle, shutdown) = Shutdown::new();
    let task = tokio::spawn(async move { worker.run(vec![(stage, cfg)], vec![], shutdown).await });
    (handle, task)
}

/// Waits, on the engine's change events, until `job` is in `state`.
async fn reaches(engine: &Engine, job: &JobId, state: JobState) {
    let mut events = engine.subscribe();
    tokio::time::timeout(WAIT, async {
        loop {
            if engine.job(job).await.unwrap().status.status == state {
                return;
            }
            let _ = events.recv().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{job} never reached {}", state.name()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_errors_are_retried_with_backoff_then_fail_with_the_count() {
    let (s, jobs) = setup(1).await;
    let stage = scripted(|_| Box::pin(async { Outcome::Transient("server said 503".into()) }));
    let (h, task) = start(&s, stage.clone(), quick(3));
    reaches(&s.engine, &jobs[0], JobState::Failed).await;
    let info = s.engine.job(&jobs[0]).await.unwrap();
    assert_eq!(
        info.status.message.as_deref(),
        Some("server said 503 (gave up after 3 attempts)")
    );
    assert_eq!(*stage.attempts_seen.lock().unwrap(), vec![1, 2, 3]);
    assert!(!info.locked);
    h.stop();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_error_keeps_the_job_in_its_state_until_it_succeeds() {
    let (s, jobs) = setup(1).await;
    let stage = scripted(|n| {
        Box::pin(async move {
            if n < 3 {
                Outcome::Transient(format!("flaky {n}"))
            } else {
                Outcome::Done
            }
        })
    });
    let (h, task) = start(&s, stage.clone(), quick(5));
    reaches(&s.engine, &jobs[0], JobState::Estimating).await;
    assert_eq!(*stage.attempts_seen.lock().unwrap(), vec![1, 2, 3]);
    let info = s.engine.job(&jobs[0]).await.unwrap();
    assert_eq!(
        lading_engine::attempts(&info.status),
        0,
        "a new stage starts afresh"
    );
    let log = std::fs::read_to_string(s.work_root.join(jobs[0].as_str()).join("job.log")).unwrap();
    assert_eq!(log.lines().count(), 3, "{log}");
    h.stop();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_job_records_its_attempts_and_retry_time() {
    let (s, jobs) = setup(1).await;
    let stage = scripted(|_| Box::pin(async { Outcome::Transient("disk busy".into()) }));
    let mut cfg = quick(5);
    cfg.backoff_base = Duration::from_secs(600);
    cfg.backoff_max = Duration::from_secs(600);
    let before = s.engine.clock().now_ms();
    let (h, task) = start(&s, stage.clone(), cfg);
    // The deferral is no state change: wait on the status node itself.
    let status = lading_core::layout::job_node(&jobs[0], "status");
    let info = tokio::time::timeout(WAIT, async {
        loop {
            let w = s
                .engine
                .tree()
                .watch(&status, lading_core::WatchKind::Data)
                .await
                .unwrap();
            let info = s.engine.job(&jobs[0]).await.unwrap();
            if lading_engine::attempts(&info.status) == 1 && !info.locked {
                return info;
            }
            w.await;
        }
    })
    .await
    .expect("deferred");
    assert_eq!(info.status.status, JobState::Pending);
    assert_eq!(lading_engine::attempts(&info.status), 1);
    let at = lading_engine::retry_at(&info.status).expect("a retry time");
    // Half to all of the 600 s backoff, by the jitter.
    assert!(at >= before + 300_000 && at <= s.engine.clock().now_ms() + 600_000);
    assert!(
        info.status
            .message
            .as_deref()
            .unwrap()
            .starts_with("disk busy (attempt 1 of 5"),
        "{:?}",
        info.status.message
    );
    h.stop();
    task.await.unwrap();
    assert_eq!(stage.calls.load(Ordering::SeqCst), 1, "not retried early");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_error_fails_the_job_at_once() {
    let (s, jobs) = setup(1).await;
    let stage = scripted(|_| Box::pin(async { Outcome::Fatal("bag is invalid".into()) }));
    let (h, task) = start(&s, stage.clone(), quick(5));
    reaches(&s.engine, &jobs[0], JobState::Failed).await;
    let info = s.engine.job(&jobs[0]).await.unwrap();
    assert_eq!(info.status.message.as_deref(), Some("bag is invalid"));
    assert_eq!(stage.calls.load(Ordering::SeqCst), 1);
    h.stop();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_its_job_and_the_worker_goes_on() {
    let (s, jobs) = setup(2).await;
    let stage = scripted(|n| {
        Box::pin(async move {
            if n == 1 {
                panic!("index out of bounds: the len is 0");
            }
            Outcome::Done
        })
    });
    let (h, task) = start(&s, stage, quick(5));
    reaches(&s.engine, &jobs[0], JobState::Failed).await;
    reaches(&s.engine, &jobs[1], JobState::Estimating).await;
    let info = s.engine.job(&jobs[0]).await.unwrap();
    assert_eq!(
        info.status.message.as_deref(),
        Some("handler panicked: index out of bounds: the len is 0")
    );
    h.stop();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_past_its_timeout_counts_as_a_transient_error() {
    let (s, jobs) = setup(1).await;
    let stage = scripted(|_| {
        Box::pin(async {
            std::future::pending::<()>().await;
            Outcome::Done
        })
    });
    let mut cfg = quick(2);
    cfg.timeout = Duration::from_millis(200);
    let (h, task) = start(&s, stage.clone(), cfg);
    reaches(&s.engine, &jobs[0], JobState::Failed).await;
    let info = s.engine.job(&jobs[0]).await.unwrap();
    assert_eq!(
        info.status.message.as_deref(),
        Some("timed out after 0.2 s (gave up after 2 attempts)")
    );
    h.stop();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_releases_a_running_job_in_its_state() {
    let (s, jobs) = setup(1).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let started_tx = Mutex::new(Some(started_tx));
    let stage = scripted(move |_| {
        if let Some(tx) = started_tx.lock().unwrap().take() {
            let _ = tx.send(());
        }
        Box::pin(async {
            std::future::pending::<()>().await;
            Outcome::Done
        })
    });
    let (h, task) = start(&s, stage, quick(5));
    tokio::time::timeout(WAIT, started_rx)
        .await
        .unwrap()
        .unwrap();
    assert!(s.engine.job(&jobs[0]).await.unwrap().locked);
    h.stop();
    // Stopping alone lets the handler run on.
    assert!(s.engine.job(&jobs[0]).await.unwrap().locked);
    h.abort();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    let info = s.engine.job(&jobs[0]).await.unwrap();
    assert_eq!(info.status.status, JobState::Pending);
    assert!(!info.locked, "released for the next worker");
    assert!(
        s.engine
            .acquire_job(JobState::Pending)
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_lets_a_running_handler_finish_and_takes_no_more() {
    let (s, jobs) = setup(2).await;
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
    let stage = scripted(move |n| {
        let _ = started_tx.send(n);
        let mut go = go_rx.clone();
        Box::pin(async move {
            let _ = go.wait_for(|g| *g).await;
            Outcome::Done
        })
    });
    let (h, task) = start(&s, stage.clone(), quick(5));
    assert_eq!(started_rx.recv().await, Some(1));
    h.stop();
    go_tx.send_replace(true);
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    let states: Vec<JobState> = [
        s.engine.job(&jobs[0]).await.unwrap().status.status,
        s.engine.job(&jobs[1]).await.unwrap().status.status,
    ]
    .into();
    assert!(states.contains(&JobState::Estimating), "{states:?}");
    assert!(states.contains(&JobState::Pending), "{states:?}");
    assert_eq!(stage.calls.load(Ordering::SeqCst), 1);
    // The job not taken is free: stopping brought no successor along with the move.
    for j in &jobs {
        assert!(!s.engine.job(j).await.unwrap().locked, "{j} left locked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_stage_locks_each_next_job_in_the_move_of_the_last() {
    let (s, jobs) = setup(5).await;
    let stage = scripted(|_| Box::pin(async { Outcome::Done }));
    let before = s.tree.stats().multis;
    let (h, task) = start(&s, stage.clone(), quick(5));
    for j in &jobs {
        reaches(&s.engine, j, JobState::Estimating).await;
    }
    h.stop();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    assert_eq!(stage.calls.load(Ordering::SeqCst), 5);
    for j in &jobs {
        assert!(!s.engine.job(j).await.unwrap().locked, "{j} left locked");
    }
    // One acquisition of its own, then five moves, the first four each locking the next job.
    assert_eq!(s.tree.stats().multis - before, 6);
}

#[test]
fn backoff_doubles_up_to_the_cap_with_jitter() {
    let cfg = StageConfig {
        backoff_base: Duration::from_secs(2),
        backoff_max: Duration::from_secs(60),
        ..StageConfig::default()
    };
    assert_eq!(cfg.backoff(1, 1.0), Duration::from_secs(2));
    assert_eq!(cfg.backoff(3, 1.0), Duration::from_secs(8));
    assert_eq!(cfg.backoff(3, 0.0), Duration::from_secs(4));
    assert_eq!(cfg.backoff(10, 1.0), Duration::from_secs(60));
    assert_eq!(cfg.backoff(u32::MAX, 1.0), Duration::from_secs(60));
}

/// An idle stage's depth is written once a minute, not at every flush (each write is a
/// round trip to the shared store, from every process, every few seconds); a larger depth,
/// a handler run, or a new minute is written at once.
#[tokio::test]
async fn an_idle_stage_adds_its_depth_once_a_minute() {
    use lading_core::Tree;
    use lading_core::time::{Clock, ManualClock};
    use lading_worker::stage_metrics::{Written, flush};
    let dir = tempfile::tempdir().unwrap();
    let tree =
        Arc::new(SqliteTree::open(dir.path().join("lading.db"), SqliteOptions::default()).unwrap());
    // A minute and a second into an hour.
    let clock = ManualClock::new(1_800_000_000_000 + 61_000);
    let engine = Engine::new(tree.clone(), clock.clone(), "test-worker");
    engine.init().await.unwrap();
    lading_store_tests::batch_with_jobs(&engine, 2, &[]).await;
    let (stats, written) = (lading_worker::Stats::default(), Written::default());
    let stages = [JobState::Pending];
    let version = || async {
        let hours = tree
            .children(lading_engine::stage_metrics::STAGE_METRICS)
            .await
            .unwrap();
        assert_eq!(hours.len(), 1, "one hour of one stage: {hours:?}");
        let path = format!(
            "{}/{}",
            lading_engine::stage_metrics::STAGE_METRICS,
            hours[0]
        );
        tree.get(&path).await.unwrap().unwrap().stat.version
    };
    let depth = || async {
        let series = lading_engine::stage_metrics::read(tree.as_ref(), clock.now_ms())
            .await
            .unwrap();
        let pending = series
            .iter()
            .find(|s| s.stage == JobState::Pending.name())
            .unwrap();
        pending.minutes.last().unwrap().depth
    };
    flush(&engine, &stats, &stages, &written).await;
    let first = version().await;
    assert_eq!(depth().await, Some(2));
    // The same depth in the same minute: nothing written.
    clock.advance_ms(5_000);
    flush(&engine, &stats, &stages, &written).await;
    assert_eq!(
        version().await,
        first,
        "an unchanged depth was written again"
    );
    // A handler run is counted at once.
    stats.record(
        JobState::Pending.name(),
        &Outcome::Done,
        Duration::from_millis(3),
        clock.now_ms(),
    );
    flush(&engine, &stats, &stages, &written).await;
    let counted = version().await;
    assert!(counted > first, "a handler run was not written");
    // A deeper queue is written; the same depth again is not.
    lading_store_tests::batch_with_jobs(&engine, 1, &[]).await;
    flush(&engine, &stats, &stages, &written).await;
    let deeper = version().await;
    assert!(deeper > counted, "a larger depth was not written");
    assert_eq!(depth().await, Some(3));
    flush(&engine, &stats, &stages, &written).await;
    assert_eq!(version().await, deeper);
    // The next minute has no depth yet: written.
    clock.advance_ms(60_000);
    flush(&engine, &stats, &stages, &written).await;
    assert!(
        version().await > deeper,
        "a new minute's depth was not written"
    );
}

/// A Pending-state stage that asks for the job's working folder or not, and says what it got.
struct Folder {
    asks: bool,
    got: Mutex<Vec<Result<std::path::PathBuf, Outcome>>>,
}

impl JobStage for Folder {
    fn state(&self) -> JobState {
        JobState::Pending
    }
    fn success(&self) -> Event<JobState> {
        Event::To(JobState::Estimating)
    }
    fn run(&self, job: Arc<JobCtx>) -> BoxFuture<'static, Outcome> {
        if !self.asks {
            return Box::pin(async { Outcome::Done });
        }
        let got = job.workdir().map(|p| p.to_path_buf());
        self.got.lock().unwrap().push(got.clone());
        Box::pin(async move { got.err().unwrap_or(Outcome::Done) })
    }
}

/// A job's working folder is made when a stage asks for it, marked with its owner; a stage
/// that does not ask leaves no folder at all; one that cannot be made fails the attempt,
/// naming it, and only that stage's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_working_folder_is_made_only_for_a_stage_that_asks_for_it() {
    // Not asked: the job moves on and no folder was made (not even the root).
    let (s, jobs) = setup(1).await;
    let stage = Arc::new(Folder {
        asks: false,
        got: Mutex::new(Vec::new()),
    });
    let (h, task) = start(&s, stage, quick(1));
    reaches(&s.engine, &jobs[0], JobState::Estimating).await;
    h.stop();
    task.await.unwrap();
    assert!(
        !s.work_root.exists(),
        "a folder was made for a stage that asked for none"
    );

    // Asked: made, and marked with the batch and job.
    let (s, jobs) = setup(1).await;
    let stage = Arc::new(Folder {
        asks: true,
        got: Mutex::new(Vec::new()),
    });
    let (h, task) = start(&s, stage.clone(), quick(1));
    reaches(&s.engine, &jobs[0], JobState::Estimating).await;
    h.stop();
    task.await.unwrap();
    let dir = s.work_root.join(jobs[0].as_str());
    assert_eq!(stage.got.lock().unwrap().as_slice(), &[Ok(dir.clone())]);
    let mark = std::fs::read_to_string(dir.join(".lading/owner")).unwrap();
    assert!(mark.ends_with(&format!("/{}", jobs[0])), "{mark}");

    // Cannot be made (the root is a file): the attempt fails, naming the folder; the
    // job's records are as they were but for the failure.
    let (s, jobs) = setup(1).await;
    std::fs::write(&s.work_root, b"not a folder").unwrap();
    let stage = Arc::new(Folder {
        asks: true,
        got: Mutex::new(Vec::new()),
    });
    let (h, task) = start(&s, stage.clone(), quick(1));
    reaches(&s.engine, &jobs[0], JobState::Failed).await;
    h.stop();
    task.await.unwrap();
    let info = s.engine.job(&jobs[0]).await.unwrap();
    let msg = info.status.message.unwrap_or_default();
    assert!(
        msg.contains("cannot create working directory") && msg.contains(jobs[0].as_str()),
        "{msg}"
    );
    assert_eq!(info.status.last_successful_status, None);
    assert_eq!(std::fs::read(&s.work_root).unwrap(), b"not a folder");
}
