//! Conformance of the generic job API (seed 004) over the tree: every guarantee of
//! `lading-jobs`, on every backend.

use crate::{Harness, Session, WAIT};
use lading_core::time::{ManualClock, SharedClock, system_clock};
use lading_jobs::{AcceptOptions, Added, Job, Jobs, JobsError, ROOT, State};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) async fn jobs_on(
    h: &dyn Harness,
    clock: SharedClock,
    owner: &str,
) -> (Arc<Jobs>, Session) {
    let s = h.open().await;
    (Arc::new(Jobs::new(s.tree.clone(), clock, owner)), s)
}

async fn jobs(h: &dyn Harness) -> (Arc<Jobs>, Session) {
    jobs_on(h, system_clock(), "tester").await
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

pub(crate) const NOW: AcceptOptions = AcceptOptions {
    max_sched_time: None,
    timeout: Duration::ZERO,
    no_schedule: false,
};

fn within(t: Duration) -> AcceptOptions {
    AcceptOptions { timeout: t, ..NOW }
}

/// Everything under the generic-jobs subtree, as path → data.
pub(crate) async fn subtree(j: &Jobs) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let mut todo = vec![ROOT.to_string()];
    while let Some(p) = todo.pop() {
        let Some(n) = j.tree().get(&p).await.unwrap() else {
            continue;
        };
        let v = n
            .data
            .as_deref()
            .map(|d| {
                serde_json::from_slice(d).unwrap_or_else(|_| json!(String::from_utf8_lossy(d)))
            })
            .unwrap_or(Value::Null);
        out.insert(p.clone(), v);
        for c in j.tree().children(&p).await.unwrap() {
            todo.push(format!("{p}/{c}"));
        }
    }
    out
}

pub(crate) fn names_under(t: &BTreeMap<String, Value>, dir: &str) -> Vec<String> {
    t.keys()
        .filter_map(|k| k.strip_prefix(&format!("{dir}/")))
        .map(str::to_string)
        .collect()
}

fn halted(r: Result<(), JobsError>) -> bool {
    matches!(r, Err(JobsError::Halt { .. }))
}

pub async fn generic_jobs_walk_their_states_in_their_own_subtree(h: &dyn Harness) {
    let (j, _s) = jobs(h).await;
    // Bad input: a clear error, and nothing stored.
    assert!(matches!(
        j.add("convert", "a", json!({}), None).await,
        Err(JobsError::NoType(t)) if t == "convert"
    ));
    assert!(subtree(&j).await.is_empty(), "no type: nothing written");
    j.set_type_timeout("convert", 30).await.unwrap();
    assert_eq!(j.get_type_timeout("convert").await.unwrap(), 30);
    assert!(matches!(
        j.set_type_timeout("convert", 0).await,
        Err(JobsError::Invalid(_))
    ));
    for bad in ["", "a/b", "../x", "sp ace", ".x"] {
        assert!(
            matches!(j.add("convert", bad, json!({}), None).await, Err(JobsError::Invalid(m)) if m.contains("job id")),
            "{bad:?} refused"
        );
    }
    assert!(matches!(
        j.add("con/vert", "a", json!({}), None).await,
        Err(JobsError::Invalid(_))
    ));
    let before = subtree(&j).await;
    assert_eq!(
        names_under(&before, "/generic-jobs/convert/jobs"),
        Vec::<String>::new()
    );

    assert_eq!(
        j.add("convert", "doc-1", json!({"n": 1}), None)
            .await
            .unwrap(),
        Added::Created
    );
    assert_eq!(
        j.get_job_state("convert", "doc-1").await.unwrap(),
        State::Pending
    );
    let t = subtree(&j).await;
    let pending = names_under(&t, "/generic-jobs/convert/pending");
    assert_eq!(pending.len(), 1);
    assert!(
        pending[0].starts_with("1000-") && pending[0].ends_with("-doc-1"),
        "priority 0, then the time: {pending:?}"
    );
    assert_eq!(pending[0].len(), 4 + 1 + 13 + 1 + 5);
    assert_eq!(
        t["/generic-jobs/convert"],
        json!({"timeout_s": 30, "max_attempts": 3, "backoff_base_ms": 1000})
    );

    let mut job = j.accept("convert", &NOW).await.unwrap().expect("due job");
    assert_eq!((job.id.as_str(), job.data()), ("doc-1", &json!({"n": 1})));
    assert_eq!(
        j.get_job_state("convert", "doc-1").await.unwrap(),
        State::Running
    );
    let t = subtree(&j).await;
    assert!(names_under(&t, "/generic-jobs/convert/pending").is_empty());
    assert_eq!(
        names_under(&t, "/generic-jobs/convert/active"),
        vec![format!("doc-1~{}", job.lock)]
    );
    assert!(j.accept("convert", &NOW).await.unwrap().is_none());

    j.update(&mut job, Some(json!({"n": 1, "progress": 50})))
        .await
        .unwrap();
    assert_eq!(
        j.get_job_data("convert", "doc-1").await.unwrap()["progress"],
        50
    );
    j.finish(&mut job, Some(json!({"result": "ok"})))
        .await
        .unwrap();
    let view = j.get_job("convert", "doc-1").await.unwrap();
    assert_eq!(view.record.state, State::Finished);
    assert_eq!(view.record.data, json!({"result": "ok"}));
    assert_eq!(view.record.runs, 1);
    let t = subtree(&j).await;
    assert!(names_under(&t, "/generic-jobs/convert/active").is_empty());
    assert!(halted(j.finish(&mut job, None).await), "finished twice");

    // Added again when finished: pending again. When pending: data and time updated.
    assert_eq!(
        j.add("convert", "doc-1", json!({"n": 2}), None)
            .await
            .unwrap(),
        Added::Requeued
    );
    let later = now_s() + 3600;
    assert_eq!(
        j.add("convert", "doc-1", json!({"n": 3}), Some(later))
            .await
            .unwrap(),
        Added::Updated
    );
    let view = j.get_job("convert", "doc-1").await.unwrap();
    assert_eq!(
        (
            view.record.state,
            view.record.scheduled_ms,
            view.record.data
        ),
        (State::Pending, later * 1000, json!({"n": 3}))
    );
    assert_eq!(
        names_under(&subtree(&j).await, "/generic-jobs/convert/pending"),
        vec![format!("1000-{:013}-doc-1", later * 1000)],
        "one pending entry, under its new time"
    );
    let counts = j.counts("convert").await.unwrap();
    assert_eq!(counts[&State::Pending], 1);

    // Unknown ids: typed errors, nothing changes.
    let before = subtree(&j).await;
    assert!(matches!(
        j.remove("convert", "nope").await,
        Err(JobsError::NoJob { .. })
    ));
    assert!(matches!(
        j.get_job_state("convert", "nope").await,
        Err(JobsError::NoJob { .. })
    ));
    assert_eq!(subtree(&j).await, before);
    j.remove("convert", "doc-1").await.unwrap();
    let t = subtree(&j).await;
    assert!(
        t.keys()
            .all(|k| !k.contains("doc-1") && k.starts_with(ROOT)),
        "no trace left: {t:?}"
    );
    // Ingest's layout is untouched by generic jobs.
    assert!(j.tree().get("/jobs").await.unwrap().is_none());
}

pub async fn generic_jobs_racing_acceptors_hold_each_job_alone(h: &dyn Harness) {
    const N: usize = 60;
    let (a, _sa) = jobs_on(h, system_clock(), "proc-a").await;
    let (b, _sb) = jobs_on(h, system_clock(), "proc-b").await;
    a.set_type_timeout("race", 60).await.unwrap();
    for i in 0..N {
        a.add("race", &format!("j{i:03}"), json!({"i": i}), None)
            .await
            .unwrap();
    }
    let holding: Arc<Mutex<HashSet<String>>> = Default::default();
    let runs: Arc<Mutex<HashMap<String, usize>>> = Default::default();
    let mut tasks = Vec::new();
    for k in 0..8 {
        let j = if k % 2 == 0 { a.clone() } else { b.clone() };
        let (holding, runs) = (holding.clone(), runs.clone());
        // Half the processors finish each job and claim the next in one multi.
        let chained = k % 4 < 2;
        tasks.push(tokio::spawn(async move {
            let mut next = j.accept("race", &NOW).await.unwrap();
            while let Some(mut job) = next {
                assert!(
                    holding.lock().unwrap().insert(job.id.clone()),
                    "{} held by two processors",
                    job.id
                );
                *runs.lock().unwrap().entry(job.id.clone()).or_default() += 1;
                j.update(&mut job, None).await.unwrap();
                // Ask for one more run of some jobs while they run.
                if job.id.ends_with('7') && job.record().runs == 1 {
                    j.add("race", &job.id, json!({"again": true}), None)
                        .await
                        .unwrap();
                }
                holding.lock().unwrap().remove(&job.id);
                next = if chained {
                    j.finish_then_accept(&mut job, None, &NOW).await.unwrap()
                } else {
                    j.finish(&mut job, None).await.unwrap();
                    j.accept("race", &NOW).await.unwrap()
                };
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(WAIT, t).await.unwrap().unwrap();
    }
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), N);
    for (id, n) in runs {
        assert_eq!(n, if id.ends_with('7') { 2 } else { 1 }, "{id} runs");
    }
    let c = a.counts("race").await.unwrap();
    assert_eq!(
        (c[&State::Pending], c[&State::Running], c[&State::Finished]),
        (0, 0, N as u64)
    );
}

pub async fn generic_jobs_finish_then_accept_claims_the_next_job(h: &dyn Harness) {
    let clock = ManualClock::new(1_800_000_000_000);
    let (j, _s) = jobs_on(h, clock.clone(), "chain").await;
    let (other, _so) = jobs_on(h, clock.clone(), "other").await;
    j.set_type_timeout("chain", 60).await.unwrap();
    for id in ["a", "b", "c"] {
        j.add("chain", id, json!({"id": id}), None).await.unwrap();
        clock.advance_ms(1);
    }
    // The finish and the claim of the next due job, in queue order.
    let mut a = j.accept("chain", &NOW).await.unwrap().unwrap();
    assert_eq!(a.id, "a");
    let mut b = j
        .finish_then_accept(&mut a, Some(json!({"done": "a"})), &NOW)
        .await
        .unwrap()
        .expect("b is due");
    assert_eq!((b.id.as_str(), b.data()), ("b", &json!({"id": "b"})));
    let view = j.get_job("chain", "a").await.unwrap();
    assert_eq!(
        (view.record.state, view.record.data, view.record.lock),
        (State::Finished, json!({"done": "a"}), None)
    );
    let t = subtree(&j).await;
    assert_eq!(
        names_under(&t, "/generic-jobs/chain/active"),
        vec![format!("b~{}", b.lock)],
        "exactly the next job is held: {t:?}"
    );
    assert_eq!(j.get_job_state("chain", "b").await.unwrap(), State::Running);
    // The job taken that way is held like any other: fenced, updatable, and nobody else's.
    j.update(&mut b, Some(json!({"progress": 1})))
        .await
        .unwrap();
    let mut c = other.accept("chain", &NOW).await.unwrap().unwrap();
    assert_eq!(c.id, "c", "another processor gets the job after, not b");
    assert!(other.accept("chain", &NOW).await.unwrap().is_none());
    // A resubmission asked for while running still re-enqueues the finished job, which is
    // then the one due.
    j.add("chain", "b", json!({"again": true}), None)
        .await
        .unwrap();
    j.update(&mut b, None).await.unwrap();
    let mut b2 = j
        .finish_then_accept(&mut b, None, &NOW)
        .await
        .unwrap()
        .expect("b is due again");
    assert_eq!((b2.id.as_str(), b2.record().runs), ("b", 2));
    assert_eq!(b2.data(), &json!({"again": true}));
    // Nothing due: the job finishes and nothing is taken.
    assert!(
        j.finish_then_accept(&mut b2, None, &NOW)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        j.get_job_state("chain", "b").await.unwrap(),
        State::Finished
    );
    // A processor whose job was removed is halted; the due job it would have taken stays
    // pending, and the removed job stays gone.
    other.add("chain", "d", json!({}), None).await.unwrap();
    j.add("chain", "e", json!({}), None).await.unwrap();
    let mut d = j.accept("chain", &NOW).await.unwrap().unwrap();
    assert_eq!(d.id, "d");
    other.remove("chain", "d").await.unwrap();
    let before = subtree(&j).await;
    assert!(matches!(
        j.finish_then_accept(&mut d, Some(json!({"x": 1})), &NOW)
            .await,
        Err(JobsError::Halt { .. })
    ));
    assert_eq!(
        subtree(&j).await,
        before,
        "a halted finish writes and takes nothing"
    );
    assert_eq!(j.get_job_state("chain", "e").await.unwrap(), State::Pending);
    // Waiting: with nothing due, it waits up to the timeout for an add, as accept does.
    other.finish(&mut c, None).await.unwrap();
    let mut e = j.accept("chain", &NOW).await.unwrap().unwrap();
    let adder = other.clone();
    let mut parked = j.parked();
    let from = *parked.borrow_and_update();
    // Added once the finish has found nothing due and is waiting.
    let add_later = tokio::spawn(async move {
        tokio::time::timeout(WAIT, parked.wait_for(|p| *p > from))
            .await
            .expect("the finish's acceptance parked")
            .unwrap();
        adder.add("chain", "f", json!({}), None).await.unwrap();
    });
    let f = j
        .finish_then_accept(&mut e, None, &within(WAIT))
        .await
        .unwrap()
        .expect("woken by the add");
    assert_eq!(f.id, "f");
    add_later.await.unwrap();
    assert_eq!(
        j.get_job_state("chain", "e").await.unwrap(),
        State::Finished
    );
}

pub async fn generic_jobs_stale_processor_is_fenced(h: &dyn Harness) {
    let (a, _sa) = jobs_on(h, system_clock(), "stale").await;
    let (b, _sb) = jobs_on(h, system_clock(), "fresh").await;
    a.set_type_timeout("fence", 60).await.unwrap();
    a.add("fence", "x", json!({"v": 0}), None).await.unwrap();
    let mut stale = a.accept("fence", &NOW).await.unwrap().unwrap();
    // The job is removed and added again, and another processor takes the new run.
    b.remove("fence", "x").await.unwrap();
    b.add("fence", "x", json!({"v": 1}), None).await.unwrap();
    let mut fresh = b.accept("fence", &NOW).await.unwrap().unwrap();
    assert_ne!(stale.lock, fresh.lock);
    assert!(halted(
        a.update(&mut stale, Some(json!({"v": "stale"}))).await
    ));
    assert!(halted(a.resubmit(&mut stale, None).await));
    assert!(halted(
        a.finish(&mut stale, Some(json!({"v": "stale"}))).await
    ));
    let view = b.get_job("fence", "x").await.unwrap();
    assert_eq!(
        (
            view.record.state,
            view.record.data.clone(),
            view.record.resubmit
        ),
        (State::Running, json!({"v": 1}), false),
        "the stale processor wrote nothing"
    );
    b.update(&mut fresh, Some(json!({"v": 2}))).await.unwrap();
    b.finish(&mut fresh, None).await.unwrap();
    assert_eq!(
        b.get_job("fence", "x").await.unwrap().record.data,
        json!({"v": 2})
    );
}

pub async fn generic_jobs_scheduled_later_are_not_accepted_early(h: &dyn Harness) {
    let (j, _s) = jobs(h).await;
    j.set_type_timeout("sched", 60).await.unwrap();
    let at = now_s() + 2;
    j.add("sched", "later", json!({}), Some(at)).await.unwrap();
    assert!(j.accept("sched", &NOW).await.unwrap().is_none());
    let explicit = AcceptOptions {
        max_sched_time: Some(at - 1),
        ..NOW
    };
    assert!(j.accept("sched", &explicit).await.unwrap().is_none());
    // A job due now goes first, whatever the order of adding.
    j.add("sched", "now", json!({}), None).await.unwrap();
    let mut first = j.accept("sched", &NOW).await.unwrap().unwrap();
    assert_eq!(first.id, "now");
    j.finish(&mut first, None).await.unwrap();
    // A waiting acceptor gets the scheduled job once it is due, not before.
    let mut job = j.accept("sched", &within(WAIT)).await.unwrap().unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert_eq!(job.id, "later");
    assert!(
        now_ms >= at * 1000,
        "accepted {} ms early",
        at * 1000 - now_ms
    );
    j.finish(&mut job, None).await.unwrap();
    // An acceptor may ask for jobs scheduled up to a later time explicitly.
    j.add("sched", "far", json!({}), Some(now_s() + 3600))
        .await
        .unwrap();
    let ahead = AcceptOptions {
        max_sched_time: Some(now_s() + 7200),
        ..NOW
    };
    assert_eq!(j.accept("sched", &ahead).await.unwrap().unwrap().id, "far");
}

pub async fn generic_jobs_resubmit_while_running_runs_again(h: &dyn Harness) {
    let (j, _s) = jobs(h).await;
    j.set_type_timeout("re", 60).await.unwrap();
    j.add("re", "r", json!({"run": 1}), None).await.unwrap();
    let mut job = j.accept("re", &NOW).await.unwrap().unwrap();
    assert!(!job.is_resubmitted());
    assert_eq!(
        j.add("re", "r", json!({"run": 2}), None).await.unwrap(),
        Added::Resubmitted
    );
    assert_eq!(j.get_job_state("re", "r").await.unwrap(), State::Running);
    j.update(&mut job, None).await.unwrap();
    assert!(job.is_resubmitted(), "update sees the resubmission");
    assert_eq!(job.data(), &json!({"run": 1}), "the running data stays");
    j.finish(&mut job, Some(json!({"result": 1})))
        .await
        .unwrap();
    let view = j.get_job("re", "r").await.unwrap();
    assert_eq!(
        (view.record.state, view.record.data),
        (State::Pending, json!({"run": 2}))
    );
    let mut job = j.accept("re", &NOW).await.unwrap().unwrap();
    assert_eq!(job.record().runs, 2);
    // The processor itself may ask for another run, later.
    let at = now_s() + 3600;
    j.resubmit(&mut job, Some(at)).await.unwrap();
    assert!(job.is_resubmitted());
    j.finish(&mut job, None).await.unwrap();
    let view = j.get_job("re", "r").await.unwrap();
    assert_eq!(
        (view.record.state, view.record.scheduled_ms),
        (State::Pending, at * 1000)
    );
    assert!(j.accept("re", &NOW).await.unwrap().is_none());
}

pub async fn generic_jobs_removed_while_running_halt_the_processor(h: &dyn Harness) {
    let (j, _s) = jobs(h).await;
    let (other, _so) = jobs(h).await;
    j.set_type_timeout("rm", 60).await.unwrap();
    j.add("rm", "gone", json!({"keep": "me"}), None)
        .await
        .unwrap();
    let mut job = j.accept("rm", &NOW).await.unwrap().unwrap();
    other.remove("rm", "gone").await.unwrap();
    assert!(halted(j.update(&mut job, Some(json!({"x": 1}))).await));
    assert!(halted(j.finish(&mut job, Some(json!({"x": 2}))).await));
    assert!(matches!(
        j.get_job_state("rm", "gone").await,
        Err(JobsError::NoJob { .. })
    ));
    let t = subtree(&j).await;
    assert!(
        names_under(&t, "/generic-jobs/rm/active").is_empty()
            && names_under(&t, "/generic-jobs/rm/pending").is_empty()
            && names_under(&t, "/generic-jobs/rm/jobs").is_empty(),
        "{t:?}"
    );
}

pub async fn generic_jobs_activity_monitor_requeues_a_stalled_job_once(h: &dyn Harness) {
    let clock = ManualClock::new(1_800_000_000_000);
    let (p, _sp) = jobs_on(h, clock.clone(), "processor").await;
    let (m1, _s1) = jobs_on(h, clock.clone(), "monitor-1").await;
    let (m2, _s2) = jobs_on(h, clock.clone(), "monitor-2").await;
    p.set_type_timeout("stall", 5).await.unwrap();
    p.add("stall", "s", json!({}), None).await.unwrap();
    clock.advance_ms(1);
    p.add("stall", "alive", json!({}), None).await.unwrap();
    let mut crashed = p.accept("stall", &NOW).await.unwrap().unwrap();
    let mut alive = p.accept("stall", &NOW).await.unwrap().unwrap();
    assert_eq!((crashed.id.as_str(), alive.id.as_str()), ("s", "alive"));
    clock.advance_ms(4_000);
    assert_eq!(m1.monitor_once().await.unwrap(), 0, "not stalled yet");
    p.update(&mut alive, None).await.unwrap();
    clock.advance_ms(2_000);
    // Several monitors at once: the stalled job is re-enqueued exactly once; the one that
    // heartbeated stays running.
    let (r1, r2, r3) = tokio::join!(m1.monitor_once(), m2.monitor_once(), m1.monitor_once());
    assert_eq!(r1.unwrap() + r2.unwrap() + r3.unwrap(), 1);
    let view = p.get_job("stall", "s").await.unwrap();
    assert_eq!((view.record.state, view.record.stalls), (State::Pending, 1));
    assert_eq!(
        p.get_job_state("stall", "alive").await.unwrap(),
        State::Running
    );
    assert!(halted(p.update(&mut crashed, None).await));
    let mut again = m2.accept("stall", &NOW).await.unwrap().unwrap();
    assert_eq!((again.id.as_str(), again.record().runs), ("s", 2));
    m2.finish(&mut again, None).await.unwrap();
    p.finish(&mut alive, None).await.unwrap();
}

pub async fn generic_jobs_subscribers_see_each_state_change(h: &dyn Harness) {
    let (j, _s) = jobs(h).await;
    let (worker, _sw) = jobs(h).await;
    j.set_type_timeout("sub", 60).await.unwrap();
    j.add("sub", "a", json!({}), None).await.unwrap();
    j.add("sub", "b", json!({}), None).await.unwrap();
    let (sa, st) = j.subscribe("sub", "a").await.unwrap();
    assert_eq!(st, State::Pending);
    let (sb, _) = j.subscribe("sub", "b").await.unwrap();
    assert!(
        j.wait(&[sa, sb], None, Duration::from_millis(100))
            .await
            .unwrap()
            .is_none(),
        "no change yet"
    );
    // A waiter is woken by the change, from another session. The job is finished only once
    // the waiter has seen it running: a waiter reads the state when it is woken, so one
    // woken late (a loaded machine) would see the later state, as it should.
    let w = worker.clone();
    let (seen, seen_rx) = tokio::sync::oneshot::channel::<()>();
    let mut parked = j.parked_waits();
    let before = *parked.borrow_and_update();
    let run = tokio::spawn(async move {
        // The subscriber is waiting before the job runs (a late one would also be correct,
        // but would not be woken).
        parked.wait_for(|n| *n > before).await.unwrap();
        let mut job = w.accept("sub", &NOW).await.unwrap().unwrap();
        seen_rx.await.unwrap();
        w.finish(&mut job, None).await.unwrap();
        job.id
    });
    let first = j.wait(&[sa, sb], None, WAIT).await.unwrap().unwrap();
    assert_eq!(first.state, Some(State::Running));
    seen.send(()).unwrap();
    let finished = j
        .wait(&[first.subscription], Some(State::Finished), WAIT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (finished.id.clone(), finished.state),
        (run.await.unwrap(), Some(State::Finished))
    );
    // Removal is reported whatever state is waited for, and ends the subscription.
    let other = if finished.subscription == sa { sb } else { sa };
    worker
        .remove("sub", if other == sa { "a" } else { "b" })
        .await
        .unwrap();
    let gone = j
        .wait(&[other], Some(State::Finished), WAIT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(gone.state, None);
    assert!(matches!(
        j.wait(&[other], None, Duration::ZERO).await,
        Err(JobsError::NoSubscription(_))
    ));
    assert!(j.unsubscribe(finished.subscription));
    assert!(!j.unsubscribe(finished.subscription));
}

/// A client that subscribes and goes away does not leave its subscription behind for ever:
/// one nobody waited on for ten minutes is ended, one being waited on never is.
pub async fn generic_jobs_unused_subscriptions_expire(h: &dyn Harness) {
    let clock = ManualClock::new(1_700_000_000_000);
    let (j, _s) = jobs_on(h, clock.clone(), "tester").await;
    j.set_type_timeout("subx", 60).await.unwrap();
    j.add("subx", "a", json!({}), None).await.unwrap();
    let before = subtree(&j).await;
    let (used, _) = j.subscribe("subx", "a").await.unwrap();
    let (idle, _) = j.subscribe("subx", "a").await.unwrap();
    let (held, _) = j.subscribe("subx", "a").await.unwrap();
    // One is waited on for a long time, another briefly after five minutes.
    let j2 = j.clone();
    let mut parked = j.parked_waits();
    let parked_before = *parked.borrow_and_update();
    let long_wait = tokio::spawn(async move { j2.wait(&[held], None, WAIT * 10).await });
    // Once it waits, its subscription is marked in use.
    parked.wait_for(|n| *n > parked_before).await.unwrap();
    clock.advance_ms(5 * 60_000);
    assert!(
        j.wait(&[used], None, Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    clock.advance_ms(6 * 60_000);
    // The next subscription sweeps: only the one unused for 11 minutes goes.
    let (fresh, _) = j.subscribe("subx", "a").await.unwrap();
    assert_eq!(j.subscription_count(), 4 - 1);
    let err = j.wait(&[idle], None, Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, JobsError::NoSubscription(id) if id == idle));
    assert!(
        err.to_string().contains("expired after 10 minutes unused"),
        "{err}"
    );
    assert_eq!(
        lading_jobs::SUBSCRIPTION_IDLE_MS,
        10 * 60_000,
        "the message says so"
    );
    assert!(
        j.wait(&[used, fresh], None, Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    // The long wait ends (its client went away); ten minutes later its subscription goes.
    long_wait.abort();
    let _ = long_wait.await;
    clock.advance_ms(11 * 60_000);
    let _ = j.subscribe("subx", "a").await.unwrap();
    assert!(matches!(
        j.wait(&[held], None, Duration::ZERO).await,
        Err(JobsError::NoSubscription(_))
    ));
    assert_eq!(
        subtree(&j).await,
        before,
        "subscriptions never touch the tree"
    );
}

pub async fn generic_jobs_waiting_acceptor_is_woken_by_an_add(h: &dyn Harness) {
    let (j, _s) = jobs(h).await;
    let (adder, _sa) = jobs(h).await;
    j.set_type_timeout("wake", 60).await.unwrap();
    let jj = j.clone();
    let mut parked = j.parked();
    let from = *parked.borrow_and_update();
    let waiting: tokio::task::JoinHandle<Option<Job>> =
        tokio::spawn(async move { jj.accept("wake", &within(WAIT)).await.unwrap() });
    // Once it has looked and is waiting, not before.
    tokio::time::timeout(WAIT, parked.wait_for(|p| *p > from))
        .await
        .expect("the acceptor parked")
        .unwrap();
    let started = std::time::Instant::now();
    adder.add("wake", "w", json!({}), None).await.unwrap();
    let job = waiting.await.unwrap().expect("woken with the job");
    assert_eq!(job.id, "w");
    // Woken by the change, not by the end of the 30 s bound.
    assert!(started.elapsed() < WAIT / 2);
    // A zero timeout does not wait.
    assert!(j.accept("wake", &NOW).await.unwrap().is_none());
}

/// Acceptors of one process waiting for any due job share one watch that wakes them one at a
/// time; a burst must still reach as many of them as it has jobs, and a single add one more.
pub async fn generic_jobs_waiting_acceptors_share_out_a_burst(h: &dyn Harness) {
    let (j, _s) = jobs(h).await;
    let (adder, _sa) = jobs(h).await;
    j.set_type_timeout("burst", 60).await.unwrap();
    let mut parked = j.parked();
    let from = *parked.borrow_and_update();
    let mut waiting: tokio::task::JoinSet<Option<Job>> = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let jj = j.clone();
        waiting.spawn(async move { jj.accept("burst", &within(WAIT)).await.unwrap() });
    }
    // One acceptor bounded by a scheduled time waits on its own watch beside them.
    let jj = j.clone();
    waiting.spawn(async move {
        let opts = AcceptOptions {
            max_sched_time: Some(4_000_000_000),
            ..within(WAIT)
        };
        jj.accept("burst", &opts).await.unwrap()
    });
    // All nine have looked, found nothing and are waiting.
    tokio::time::timeout(WAIT, parked.wait_for(|p| *p >= from + 9))
        .await
        .expect("nine acceptors parked")
        .unwrap();
    let mut taken = HashSet::new();
    let mut take = async |what: &str| {
        let job = tokio::time::timeout(WAIT / 2, waiting.join_next())
            .await
            .unwrap_or_else(|_| panic!("{what}"))
            .expect("an acceptor left")
            .unwrap()
            .expect("every acceptor got a job");
        assert!(taken.insert(job.id.clone()), "{} taken twice", job.id);
    };
    // Added together, so they can land in one change and fire the watch once.
    let adds: Vec<_> = (0..5)
        .map(|i| {
            let adder = adder.clone();
            tokio::spawn(async move { adder.add("burst", &format!("b{i}"), json!({}), None).await })
        })
        .collect();
    for a in adds {
        a.await.unwrap().unwrap();
    }
    for _ in 0..5 {
        take("the burst did not reach five acceptors").await;
    }
    // One at a time, each add wakes one more.
    for i in 5..9 {
        adder
            .add("burst", &format!("b{i}"), json!({}), None)
            .await
            .unwrap();
        take(&format!("add {i} woke nobody")).await;
    }
    assert!(waiting.is_empty());
    assert_eq!(taken.len(), 9);
    let c = j.counts("burst").await.unwrap();
    assert_eq!((c[&State::Pending], c[&State::Running]), (0, 9));
    // Nothing is left due, and an acceptor that does not wait says so.
    assert!(j.accept("burst", &NOW).await.unwrap().is_none());
}
