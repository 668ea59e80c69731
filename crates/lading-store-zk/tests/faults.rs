//! Faults against real ZooKeeper servers: a leader killed under load, replies lost in a
//! connection drop, sessions expiring mid-transition, and bad input at open.

use lading_core::time::system_clock;
use lading_core::{Event, JobState, Tree, TreeError};
use lading_engine::{Engine, EngineError};
use lading_store_tests::{WAIT, batch_with_jobs};
use lading_store_zk::{ZkOptions, ZkTree};
use lading_testkit::zk::{Relay, ZkEnsemble, ZkNode, ZkServer, free_port};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn opts(session_ms: u64) -> ZkOptions {
    ZkOptions {
        session_timeout: Duration::from_millis(session_ms),
        connect_timeout: Duration::from_secs(20),
        ..ZkOptions::default()
    }
}

async fn chroot(hosts: &str) -> String {
    let c = format!("/t-{}", uuid::Uuid::new_v4().simple());
    ZkTree::ensure_chroot(hosts, &c).await.expect("chroot");
    format!("zk://{hosts}{c}")
}

async fn engine_on(url: &str, owner: &str, session_ms: u64) -> (Arc<Engine>, Arc<ZkTree>) {
    let t = Arc::new(ZkTree::open(url, opts(session_ms)).await.expect("open"));
    let e = Arc::new(Engine::new(t.clone(), system_clock(), owner));
    e.init().await.expect("init");
    (e, t)
}

const STAGES: [JobState; 8] = JobState::LATEST_FIRST;

/// A worker that survives faults: it retries what can be retried, drops a lost lease, and
/// records every transition it committed as (job, from-state).
async fn resilient_worker(
    e: Arc<Engine>,
    stop: Arc<AtomicBool>,
    done: Arc<Mutex<Vec<(String, JobState)>>>,
) {
    while !stop.load(Ordering::SeqCst) {
        let mut got = None;
        let mut failing = false;
        for st in STAGES {
            match e.acquire_job(st).await {
                Ok(Some(l)) => {
                    got = Some(l);
                    break;
                }
                Ok(None) => {}
                Err(err) => {
                    eprintln!("acquire in {st}: {err}");
                    failing = true;
                }
            }
        }
        let Some(lease) = got else {
            // Sleep: a worker polling eight stages (no one watch covers them all) paces its
            // rounds, and backs off further while the ensemble is failing over.
            let pause = if failing { 50 } else { 5 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
            continue;
        };
        let from = lease.state();
        let ev = if from == JobState::Pending {
            Event::To(JobState::Estimating)
        } else {
            Event::Success
        };
        let job = lease.job.to_string();
        match e.job_transition(lease, ev, None).await {
            Ok(_) => done.lock().unwrap().push((job, from)),
            // The lease is gone (or the outcome was refused): someone else will carry on.
            Err(EngineError::LeaseLost(_)) => {}
            Err(err) => eprintln!("transition of {job} from {from}: {err}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_carry_on_when_the_leader_dies_and_no_job_is_lost_or_doubled() {
    let mut ens = ZkEnsemble::start(3).expect("ensemble");
    let hosts = ens.connect_string();
    let url = chroot(&hosts).await;
    let (admin, _t) = engine_on(&url, "admin", 6000).await;
    const N: usize = 150;
    let (bid, jobs) = batch_with_jobs(&admin, N, &[]).await;

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for i in 0..4 {
        let (e, _t) = engine_on(&url, &format!("w{i}"), 6000).await;
        workers.push(tokio::spawn(resilient_worker(
            e,
            stop.clone(),
            done.clone(),
        )));
    }
    // Kill the leader once work is under way.
    lading_testkit::poll::until("work under way", WAIT, async || {
        let n = done.lock().unwrap().len();
        if n >= N { Ok(()) } else { Err(n) }
    })
    .await;
    let leader = ens.wait_leader(Duration::from_secs(10)).expect("a leader");
    ens.nodes[leader].kill();
    let killed_at = done.lock().unwrap().len();
    assert!(killed_at < N * 8, "the leader died while work remained");
    // Work continues after re-election and finishes.
    // Completion across a leader's death, read through another session.
    lading_testkit::poll::until(
        "every job to complete",
        Duration::from_secs(120),
        async || {
            let completed = admin
                .job_counts()
                .await
                .ok()
                .map(|c| c.get(&JobState::Completed).copied().unwrap_or(0));
            if completed == Some(N as u64) {
                Ok(())
            } else {
                Err(completed)
            }
        },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    let done = done.lock().unwrap().clone();
    assert!(
        done.len() > killed_at,
        "transitions were committed after the leader died"
    );
    // Every stage of every job committed exactly once.
    let unique: HashSet<_> = done.iter().cloned().collect();
    assert_eq!(unique.len(), done.len(), "a transition was committed twice");
    // A worker whose session expired during the failover is told its lease is lost even if its
    // last multi had been applied (ambiguous outcomes are reported as lost, never as done), so
    // it may have acknowledged fewer than all 1,200 moves; it can never acknowledge more.
    assert!(
        done.len() <= N * 8,
        "{} transitions for {N} jobs",
        done.len()
    );
    assert!(
        done.len() >= N * 8 - 16,
        "at most one unacknowledged move per session and stage"
    );
    let info = admin.batch(&bid).await.unwrap();
    assert_eq!(info.jobs.get("batch-completed").map_or(0, Vec::len), N);
    for j in &jobs {
        assert_eq!(
            admin.job(j).await.unwrap().status.status,
            JobState::Completed
        );
    }
}

fn server() -> &'static ZkServer {
    static S: std::sync::OnceLock<ZkServer> = std::sync::OnceLock::new();
    S.get_or_init(|| ZkServer::start().expect("ZooKeeper"))
}

/// One Pending job on the shared server; an admin engine connected directly, and a worker
/// engine (session timeout `session_ms`) connected through a relay.
async fn relayed_worker(
    session_ms: u64,
) -> (
    Arc<Engine>,
    Vec<lading_core::layout::JobId>,
    Arc<Engine>,
    Arc<ZkTree>,
    Relay,
) {
    let s = server();
    let url = chroot(&s.connect_string()).await;
    let relay = Relay::start(s.node.port).await.unwrap();
    let relayed = url.replace(&s.connect_string(), &format!("127.0.0.1:{}", relay.port));
    let (admin, _) = engine_on(&url, "admin", 6000).await;
    let (_bid, jobs) = batch_with_jobs(&admin, 1, &[]).await;
    let (e, t) = engine_on(&relayed, "worker", session_ms).await;
    (admin, jobs, e, t, relay)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transition_whose_reply_is_lost_is_read_back_not_repeated() {
    let (admin, jobs, e, t, relay) = relayed_worker(6000).await;
    let lease = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    let before = t.stats();
    // The server applies the transition; its reply is lost with the connection.
    relay.drop_replies(true);
    let relay = Arc::new(relay);
    let r = relay.clone();
    let mut lost = relay.lost();
    let lost_before = *lost.borrow();
    tokio::spawn(async move {
        // Replies are lost until the transition's reply is, then come back.
        let _ = lost.wait_for(|n| *n > lost_before).await;
        r.drop_replies(false);
    });
    let st = e
        .job_transition(lease, Event::To(JobState::Estimating), None)
        .await
        .expect("resolved as applied");
    assert_eq!(st.status, JobState::Estimating);
    let after = t.stats();
    assert_eq!(
        after.read_backs - before.read_backs,
        1,
        "resolved by reading back"
    );
    assert_eq!(after.sessions, before.sessions, "same session throughout");
    let info = admin.job(&jobs[0]).await.unwrap();
    assert_eq!(info.status.status, JobState::Estimating);
    assert_eq!(admin.job_counts().await.unwrap()[&JobState::Estimating], 1);
    assert_eq!(admin.job_counts().await.unwrap()[&JobState::Pending], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_expires_mid_transition_commits_nothing() {
    let (admin, jobs, e, t, relay) = relayed_worker(2000).await;
    let lease = e.acquire_job(JobState::Pending).await.unwrap().unwrap();
    let session = t.session_id();
    // The request is lost and the worker is cut off until its session has expired.
    let mut lost = relay.lost();
    let lost_before = *lost.borrow_and_update();
    relay.drop_requests(true);
    let relay = Arc::new(relay);
    let r = relay.clone();
    tokio::spawn(async move {
        // The lost request cuts the connection; then a partition outlasts the session, until
        // the server has dropped it.
        lost.wait_for(|n| *n > lost_before).await.unwrap();
        r.partition(true);
        r.drop_requests(false);
        ZkNode::session_gone(server().node.port, session).await;
        r.partition(false);
    });
    let err = e
        .job_transition(lease, Event::To(JobState::Estimating), None)
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::LeaseLost(_)), "{err}");
    // Nothing changed; the lock went with the session; the job is free in the state it was in.
    let info = admin.job(&jobs[0]).await.unwrap();
    assert_eq!(info.status.status, JobState::Pending);
    assert_eq!(admin.job_counts().await.unwrap()[&JobState::Pending], 1);
    let l = admin
        .acquire_job(JobState::Pending)
        .await
        .unwrap()
        .expect("free again");
    assert_eq!(l.job, jobs[0]);
    // The worker has moved to a new session and can work again.
    let _ = t.multi(vec![]).await;
    assert_ne!(t.session_id(), session);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_at_start_and_a_wrong_chroot_are_named() {
    let port = free_port().unwrap();
    let o = ZkOptions {
        connect_timeout: Duration::from_secs(2),
        ..ZkOptions::default()
    };
    let err = ZkTree::open(&format!("zk://127.0.0.1:{port}/lading"), o)
        .await
        .err()
        .expect("nothing listens there");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("127.0.0.1:{port}")) && msg.contains("answered"),
        "{msg}"
    );

    let s = server();
    let err = ZkTree::open(
        &format!("zk://{}/no-such-chroot", s.connect_string()),
        ZkOptions::default(),
    )
    .await
    .err()
    .expect("missing chroot refused");
    assert!(
        err.to_string().contains("/no-such-chroot does not exist"),
        "{err}"
    );
    for bad in [
        "zk://",
        "zk://host",
        "zk://h:notaport/x",
        "zk://h:1/bad//path",
    ] {
        assert!(
            matches!(
                ZkTree::open(bad, ZkOptions::default()).await,
                Err(TreeError::Backend(_) | TreeError::InvalidPath(..))
            ),
            "{bad} refused"
        );
    }
}

/// A write larger than ZooKeeper takes in one request (its `jute.maxbuffer`: a Merritt form's
/// escaped ERC fields came to 1.57 MB) is refused before it is sent, naming the limit; the
/// session is not dropped, nothing is written, and the next write goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_over_zookeepers_request_limit_is_refused_and_the_session_stays() {
    let server = ZkServer::start().expect("ZooKeeper");
    let url = chroot(&server.connect_string()).await;
    let (e, t) = engine_on(&url, "big", 6000).await;
    let session = t.session_id();
    let huge = "\u{1}".repeat(400_000); // 6 bytes each once escaped in JSON
    let sub = lading_core::layout::BatchSubmission {
        profile_name: Some("demo".into()),
        submitter: Some("someone".into()),
        erc: lading_core::layout::ErcMetadata {
            erc_what: Some(huge),
            ..Default::default()
        },
        ..Default::default()
    };
    let err = e.create_batch(sub).await.unwrap_err();
    match &err {
        EngineError::Tree(t) => assert!(
            matches!(t.root(), TreeError::TooLarge { limit, bytes, .. } if bytes > limit),
            "{err}"
        ),
        other => panic!("{other}"),
    }
    assert!(
        err.to_string().contains("more than the store takes"),
        "{err}"
    );
    assert_eq!(t.session_id(), session, "the session was not dropped");
    assert!(e.batch_ids().await.unwrap().is_empty(), "nothing written");
    // The next write goes through on the same session.
    e.create_batch(lading_core::layout::BatchSubmission {
        profile_name: Some("demo".into()),
        submitter: Some("someone".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(t.session_id(), session);
}
