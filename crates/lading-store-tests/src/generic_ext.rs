//! Conformance of the extensions of the generic job API beyond couch_jobs: outcomes, retries
//! and the failed state, priorities, schedules, the rate limit, retention, batched accept and
//! finish, and subscriptions that see every transition — on every backend.

use crate::generic::{NOW, jobs_on, names_under, subtree};
use crate::{Harness, WAIT};
use lading_core::time::ManualClock;
use lading_jobs::{AddOptions, Added, Cron, Every, Jobs, JobsError, Outcome, State, TypeUpdate};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const T0: u64 = 1_800_000_000_000;

fn error(message: &str) -> Outcome {
    Outcome::Error {
        message: message.into(),
        data: None,
    }
}

/// A retry of a job that is not failed is refused and changes nothing; the admin's retry
/// of the failed `x` makes it pending, its attempts reset, and a success clears its error.
async fn an_admin_retries_only_a_failed_job(j: &Jobs) {
    // A retry of a job that is not failed: refused, nothing changes.
    j.add("flaky", "ok", json!({}), None).await.unwrap();
    let before = subtree(j).await;
    let e = j.retry("flaky", "ok").await.unwrap_err();
    assert!(
        matches!(
            e,
            JobsError::WrongState {
                state: State::Pending,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("only a failed job can be retried"));
    assert!(matches!(
        j.retry("flaky", "nope").await,
        Err(JobsError::NoJob { .. })
    ));
    assert_eq!(subtree(j).await, before);
    j.remove("flaky", "ok").await.unwrap();

    // The admin's retry: pending now, attempts reset; a success clears the error.
    let v = j.retry("flaky", "x").await.unwrap();
    assert_eq!((v.record.state, v.record.attempts), (State::Pending, 0));
    let t = subtree(j).await;
    assert!(names_under(&t, "/generic-jobs/flaky/failed").is_empty());
    let mut job = j.accept("flaky", &NOW).await.unwrap().unwrap();
    j.finish(&mut job, Some(json!({"done": 1}))).await.unwrap();
    let r = j.get_job("flaky", "x").await.unwrap().record;
    assert_eq!(
        (r.state, r.attempts, r.last_error),
        (State::Finished, 0, None)
    );
}

pub async fn generic_jobs_errors_are_retried_then_failed_and_retried_by_an_admin(h: &dyn Harness) {
    let clock = ManualClock::new(T0);
    let (j, _s) = jobs_on(h, clock.clone(), "retry").await;
    let update = TypeUpdate {
        timeout_s: Some(60),
        max_attempts: Some(3),
        backoff_base_ms: Some(1000),
        ..Default::default()
    };
    j.update_type("flaky", &update).await.unwrap();
    // A bad setting is refused and changes nothing.
    let before = subtree(&j).await;
    for bad in [
        TypeUpdate {
            max_attempts: Some(0),
            ..Default::default()
        },
        TypeUpdate {
            backoff_base_ms: Some(4_000_000),
            ..Default::default()
        },
    ] {
        assert!(matches!(
            j.update_type("flaky", &bad).await,
            Err(JobsError::Invalid(_))
        ));
    }
    assert!(matches!(
        j.update_type("ghost", &TypeUpdate::default()).await,
        Err(JobsError::NoType(_))
    ));
    assert_eq!(subtree(&j).await, before);

    j.add("flaky", "x", json!({"n": 1}), None).await.unwrap();
    // First error: pending again after a backoff of 500–1000 ms (the upper half of the base).
    let mut job = j.accept("flaky", &NOW).await.unwrap().unwrap();
    j.finish_with(&mut job, error("boom 1")).await.unwrap();
    let r = j.get_job("flaky", "x").await.unwrap().record;
    assert_eq!(
        (r.state, r.attempts, r.last_error.as_deref()),
        (State::Pending, 1, Some("boom 1"))
    );
    let wait = r.scheduled_ms - T0;
    assert!((500..=1000).contains(&wait), "backoff {wait} ms");
    assert!(
        j.accept("flaky", &NOW).await.unwrap().is_none(),
        "not due yet"
    );
    clock.advance_ms(1000);
    // Second error: 1000–2000 ms.
    let mut job = j.accept("flaky", &NOW).await.unwrap().unwrap();
    j.finish_with(&mut job, error("boom 2")).await.unwrap();
    let r = j.get_job("flaky", "x").await.unwrap().record;
    let wait = r.scheduled_ms - (T0 + 1000);
    assert!((1000..=2000).contains(&wait), "backoff {wait} ms");
    assert_eq!(r.attempts, 2);
    clock.advance_ms(2000);
    // Third error, the last attempt: failed, in the failed folder, nowhere else.
    let mut job = j.accept("flaky", &NOW).await.unwrap().unwrap();
    let out = Outcome::Error {
        message: "boom 3".into(),
        data: Some(json!({"partial": true})),
    };
    j.finish_with(&mut job, out).await.unwrap();
    assert_eq!(job.record().state, State::Failed);
    let r = j.get_job("flaky", "x").await.unwrap().record;
    assert_eq!(
        (r.state, r.attempts, r.last_error.as_deref(), r.runs),
        (State::Failed, 3, Some("boom 3"), 3)
    );
    assert_eq!(r.data, json!({"partial": true}));
    let t = subtree(&j).await;
    assert!(names_under(&t, "/generic-jobs/flaky/pending").is_empty());
    assert!(names_under(&t, "/generic-jobs/flaky/active").is_empty());
    assert_eq!(
        names_under(&t, "/generic-jobs/flaky/failed"),
        vec![format!("{:013}-x", T0 + 3000)]
    );
    let c = j.counts("flaky").await.unwrap();
    assert_eq!(
        (c[&State::Failed], c[&State::Finished], c[&State::Pending]),
        (1, 0, 0)
    );
    let listed = j
        .list("flaky", Some(State::Failed), None, 10)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert!(j.accept("flaky", &NOW).await.unwrap().is_none());
    clock.advance_ms(3_600_000);
    assert!(
        j.accept("flaky", &NOW).await.unwrap().is_none(),
        "failed stays"
    );

    an_admin_retries_only_a_failed_job(&j).await;

    // With one attempt, the first error fails the job; an add makes it pending again.
    j.update_type(
        "flaky",
        &TypeUpdate {
            max_attempts: Some(1),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    j.add("flaky", "once", json!({}), None).await.unwrap();
    let mut job = j.accept("flaky", &NOW).await.unwrap().unwrap();
    j.finish_with(&mut job, error("no")).await.unwrap();
    assert_eq!(
        j.get_job_state("flaky", "once").await.unwrap(),
        State::Failed
    );
    assert_eq!(
        j.add("flaky", "once", json!({"v": 2}), None).await.unwrap(),
        Added::Requeued
    );
    let t = subtree(&j).await;
    assert!(names_under(&t, "/generic-jobs/flaky/failed").is_empty());
    assert_eq!(names_under(&t, "/generic-jobs/flaky/pending").len(), 1);
}

pub async fn generic_jobs_run_by_priority_then_due_time(h: &dyn Harness) {
    let clock = ManualClock::new(T0);
    let (j, _s) = jobs_on(h, clock.clone(), "prio").await;
    j.set_type_timeout("p", 60).await.unwrap();
    let add = |id: &'static str, prio: i32, at: Option<u64>| {
        let j = j.clone();
        async move {
            let opts = AddOptions {
                scheduled_time: at,
                priority: Some(prio),
            };
            j.add_with("p", id, json!({}), opts).await.unwrap();
        }
    };
    let before = subtree(&j).await;
    for bad in [1001, -1001] {
        let opts = AddOptions {
            scheduled_time: None,
            priority: Some(bad),
        };
        let e = j.add_with("p", "bad", json!({}), opts).await.unwrap_err();
        assert!(e.to_string().contains("priority"), "{e}");
    }
    assert_eq!(subtree(&j).await, before, "nothing stored");
    add("low-late", 5, None).await;
    clock.advance_ms(1);
    add("plain", 0, None).await;
    clock.advance_ms(1);
    add("urgent", -10, None).await;
    // The most urgent of all, but not due for an hour: it must not hold the others back.
    add("urgent-later", -100, Some(T0 / 1000 + 3600)).await;
    let mut order = Vec::new();
    while let Some(mut job) = j.accept("p", &NOW).await.unwrap() {
        order.push(job.id.clone());
        j.finish(&mut job, None).await.unwrap();
    }
    assert_eq!(order, ["urgent", "plain", "low-late"]);
    clock.advance_ms(3_600_000);
    let job = j.accept("p", &NOW).await.unwrap().unwrap();
    assert_eq!(job.id, "urgent-later");

    // Within a priority, earlier due first; an add may change a pending job's priority.
    add("b", 3, None).await;
    add("a", 3, Some(T0 / 1000)).await;
    add("c", 3, None).await;
    add("c", -1, None).await;
    let t = subtree(&j).await;
    assert_eq!(
        names_under(&t, "/generic-jobs/p/pending")
            .iter()
            .filter(|n| n.ends_with("-c"))
            .count(),
        1,
        "one entry for c, under its new priority"
    );
    let got: Vec<String> = j
        .accept_many("p", 3, &NOW)
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(got, ["c", "a", "b"]);
}

pub async fn generic_jobs_schedule_adds_one_job_per_tick_however_many_monitors_race(
    h: &dyn Harness,
) {
    // A minute boundary, so the ticks below are easy to name.
    let start = T0 - T0 % 60_000 + 1_000;
    let clock = ManualClock::new(start);
    let mut monitors = Vec::new();
    let mut sessions = Vec::new();
    for i in 0..4 {
        let (j, s) = jobs_on(h, clock.clone(), &format!("monitor-{i}")).await;
        monitors.push(j);
        sessions.push(s);
    }
    let j = monitors[0].clone();
    j.set_type_timeout("report", 60).await.unwrap();
    // Bad schedules: refused, nothing stored.
    let before = subtree(&j).await;
    assert!(Cron::parse("61 * * * *").is_err());
    assert!(matches!(
        j.set_schedule("report", "s", Every::Seconds(0), json!({}), 0)
            .await,
        Err(JobsError::Invalid(_))
    ));
    assert!(matches!(
        j.set_schedule("report", "bad/name", Every::Seconds(60), json!({}), 0)
            .await,
        Err(JobsError::Invalid(_))
    ));
    assert!(matches!(
        j.set_schedule("nope", "s", Every::Seconds(60), json!({}), 0)
            .await,
        Err(JobsError::NoType(_))
    ));
    assert_eq!(subtree(&j).await, before);

    let s = j
        .set_schedule("report", "hourly", Every::Seconds(60), json!({"k": 1}), 0)
        .await
        .unwrap();
    let first = start - 1_000 + 60_000;
    assert_eq!(s.next_tick_ms(), Some(first));
    let race = || async {
        let mut tasks = Vec::new();
        for m in &monitors {
            let m = m.clone();
            tasks.push(tokio::spawn(async move { m.monitor_pass().await.unwrap() }));
        }
        let mut added = 0;
        for t in tasks {
            added += tokio::time::timeout(WAIT, t)
                .await
                .unwrap()
                .unwrap()
                .scheduled;
        }
        added
    };
    assert_eq!(race().await, 0, "no tick is due yet");
    clock.advance_ms(60_000);
    let mut added = 0;
    for _ in 0..3 {
        added += race().await;
    }
    assert_eq!(added, 1, "one job for the tick, whoever raced");
    let id = format!("hourly@{}", first / 1000);
    let v = j.get_job("report", &id).await.unwrap();
    assert_eq!(
        (v.record.state, v.record.data, v.record.scheduled_ms),
        (State::Pending, json!({"k": 1}), first)
    );
    // Ten ticks missed: the latest one only, once.
    clock.advance_ms(10 * 60_000);
    let mut added = 0;
    for _ in 0..3 {
        added += race().await;
    }
    assert_eq!(added, 1);
    let latest = first + 10 * 60_000;
    assert!(
        j.get_job("report", &format!("hourly@{}", latest / 1000))
            .await
            .is_ok()
    );
    assert_eq!(j.list("report", None, None, 100).await.unwrap().len(), 2);
    // A job already there under the tick's id (added by hand) spends the tick.
    let next = latest + 60_000;
    j.add(
        "report",
        &format!("hourly@{}", next / 1000),
        json!({"mine": 1}),
        None,
    )
    .await
    .unwrap();
    clock.advance_ms(60_000);
    assert_eq!(race().await, 0);
    assert_eq!(j.list("report", None, None, 100).await.unwrap().len(), 3);
    assert_eq!(
        j.get_job_data("report", &format!("hourly@{}", next / 1000))
            .await
            .unwrap(),
        json!({"mine": 1})
    );
    // Listed, replaced, removed.
    let cron = Every::Cron(Cron::parse("0 3 * * *").unwrap());
    j.set_schedule("report", "nightly", cron, json!({}), 0)
        .await
        .unwrap();
    let names: Vec<String> = j
        .schedules("report")
        .await
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["hourly", "nightly"]);
    j.remove_schedule("report", "hourly").await.unwrap();
    assert!(matches!(
        j.remove_schedule("report", "hourly").await,
        Err(JobsError::NoSchedule { .. })
    ));
    clock.advance_ms(60_000);
    assert_eq!(race().await, 0, "a removed schedule adds nothing");
}

pub async fn generic_jobs_rate_limit_holds_across_processors(h: &dyn Harness) {
    let clock = ManualClock::new(T0);
    let (a, _sa) = jobs_on(h, clock.clone(), "a").await;
    let (b, _sb) = jobs_on(h, clock.clone(), "b").await;
    let update = TypeUpdate {
        timeout_s: Some(60),
        rate_per_s: Some(3),
        ..Default::default()
    };
    a.update_type("slow", &update).await.unwrap();
    for i in 0..10 {
        a.add("slow", &format!("j{i}"), json!({}), None)
            .await
            .unwrap();
    }
    let take_all = || async {
        let mut n = 0;
        loop {
            let x = a.accept("slow", &NOW).await.unwrap();
            let y = b.accept_many("slow", 5, &NOW).await.unwrap();
            if x.is_none() && y.is_empty() {
                return n;
            }
            n += usize::from(x.is_some()) + y.len();
        }
    };
    assert_eq!(take_all().await, 3, "three in the first second, from both");
    clock.advance_ms(999);
    assert_eq!(take_all().await, 0, "still the same second");
    clock.advance_ms(1);
    assert_eq!(take_all().await, 3);
    // A waiting acceptor is let through when the next second starts.
    clock.advance_ms(1000);
    assert_eq!(take_all().await, 3);
    let c = a.counts("slow").await.unwrap();
    assert_eq!((c[&State::Running], c[&State::Pending]), (9, 1));
    // Lifting the limit lets the rest through at once.
    let lift = TypeUpdate {
        rate_per_s: Some(0),
        ..Default::default()
    };
    a.update_type("slow", &lift).await.unwrap();
    assert_eq!(a.accept_many("slow", 5, &NOW).await.unwrap().len(), 1);
}

/// A processor whose clock is behind (another host's, or its own read before a slow round
/// trip) counts against the second already counted, not its own earlier one: before, it
/// started that second's count again and let a second limit's worth through (found by
/// lading-sim, seeds 17 and 22).
pub async fn generic_jobs_rate_limit_holds_for_a_processor_whose_clock_is_behind(h: &dyn Harness) {
    let ahead = ManualClock::new(T0 + 1000);
    let behind = ManualClock::new(T0);
    let (a, _sa) = jobs_on(h, ahead.clone(), "ahead").await;
    let (b, _sb) = jobs_on(h, behind.clone(), "behind").await;
    let update = TypeUpdate {
        timeout_s: Some(60),
        rate_per_s: Some(2),
        ..Default::default()
    };
    a.update_type("skewed", &update).await.unwrap();
    for i in 0..6 {
        a.add("skewed", &format!("j{i}"), json!({}), Some(T0 / 1000))
            .await
            .unwrap();
    }
    let rate = || async {
        a.tree()
            .get("/generic-jobs/skewed/rate")
            .await
            .unwrap()
            .map(|n| (n.data, n.stat.version))
    };
    assert!(rate().await.is_none(), "nothing counted yet");
    assert_eq!(a.accept_many("skewed", 5, &NOW).await.unwrap().len(), 2);
    let counted = rate().await;
    assert_eq!(
        b.accept_many("skewed", 5, &NOW).await.unwrap().len(),
        0,
        "the second counted is full, though this clock is a second behind"
    );
    assert_eq!(rate().await, counted, "a refusal writes nothing");
    // Once either clock reaches the next second, two more go.
    behind.advance_ms(2000);
    assert_eq!(b.accept_many("skewed", 5, &NOW).await.unwrap().len(), 2);
    assert_eq!(a.accept_many("skewed", 5, &NOW).await.unwrap().len(), 0);
    let c = a.counts("skewed").await.unwrap();
    assert_eq!((c[&State::Running], c[&State::Pending]), (4, 2));
}

/// A monitor pass reads each type's settings once (it read them three times), and lists a
/// type's ended jobs at most every 10 s (it listed both folders at every pass, every second).
pub async fn generic_jobs_monitor_reads_a_type_once_a_pass_and_ended_jobs_now_and_then(
    h: &dyn Harness,
) {
    let clock = ManualClock::new(T0);
    let s = h.open().await;
    let counting = crate::jobs::CountingTree::over(s.tree.clone());
    let j = Jobs::new(counting.clone(), clock.clone(), "monitor");
    let update = TypeUpdate {
        timeout_s: Some(600),
        keep_finished_s: Some(60),
        keep_failed_s: Some(120),
        ..Default::default()
    };
    j.update_type("tidy", &update).await.unwrap();
    let type_reads = || counting.reads_of("/generic-jobs/tidy");
    let pass = || async {
        let (reads, calls) = (type_reads(), counting.calls());
        j.monitor_pass().await.unwrap();
        (type_reads() - reads, counting.calls() - calls)
    };
    let (reads, first) = pass().await;
    assert_eq!(reads, 1, "one read of the type per pass");
    clock.advance_ms(1_000);
    let (reads, soon) = pass().await;
    assert_eq!(reads, 1, "one read of the type per pass");
    assert_eq!(
        first,
        soon + 2,
        "a second later, the ended jobs are not listed again"
    );
    clock.advance_ms(10_000);
    let (reads, later) = pass().await;
    assert_eq!(reads, 1);
    assert_eq!(later, first, "10 s later they are");
    let t = subtree(&j).await;
    assert!(t.contains_key("/generic-jobs/tidy"), "the type is intact");
}

pub async fn generic_jobs_retention_removes_old_finished_and_failed_jobs(h: &dyn Harness) {
    let clock = ManualClock::new(T0);
    let (j, _s) = jobs_on(h, clock.clone(), "keeper").await;
    let update = TypeUpdate {
        timeout_s: Some(600),
        max_attempts: Some(1),
        keep_finished_s: Some(60),
        keep_failed_s: Some(120),
        ..Default::default()
    };
    j.update_type("tidy", &update).await.unwrap();
    for id in ["ok", "bad", "again"] {
        j.add("tidy", id, json!({}), None).await.unwrap();
    }
    while let Some(mut job) = j.accept("tidy", &NOW).await.unwrap() {
        match job.id.as_str() {
            "bad" => j.finish_with(&mut job, error("no")).await.unwrap(),
            _ => j.finish(&mut job, None).await.unwrap(),
        }
    }
    clock.advance_ms(30_000);
    // Re-added after it finished: not old, whatever its first run's age.
    assert_eq!(
        j.add("tidy", "again", json!({}), None).await.unwrap(),
        Added::Requeued
    );
    assert_eq!(j.monitor_pass().await.unwrap().removed, 0);
    clock.advance_ms(31_000);
    assert_eq!(j.monitor_pass().await.unwrap().removed, 1);
    assert!(matches!(
        j.get_job("tidy", "ok").await,
        Err(JobsError::NoJob { .. })
    ));
    assert_eq!(j.get_job_state("tidy", "bad").await.unwrap(), State::Failed);
    assert_eq!(
        j.get_job_state("tidy", "again").await.unwrap(),
        State::Pending
    );
    clock.advance_ms(60_000);
    assert_eq!(j.monitor_pass().await.unwrap().removed, 1);
    let t = subtree(&j).await;
    assert!(
        t.keys().all(|k| !k.contains("ok") && !k.contains("bad")),
        "no trace left: {t:?}"
    );
    assert!(names_under(&t, "/generic-jobs/tidy/finished").is_empty());
    assert!(names_under(&t, "/generic-jobs/tidy/failed").is_empty());
}

pub async fn generic_jobs_batched_accept_never_hands_one_job_to_two(h: &dyn Harness) {
    const N: usize = 240;
    let (a, _sa) = jobs_on(h, lading_core::time::system_clock(), "batch-a").await;
    let (b, _sb) = jobs_on(h, lading_core::time::system_clock(), "batch-b").await;
    a.set_type_timeout("bulk", 60).await.unwrap();
    for chunk in (0..N).collect::<Vec<_>>().chunks(50) {
        let items = chunk
            .iter()
            .map(|i| (format!("j{i:04}"), json!({"i": i})))
            .collect();
        let added = a
            .add_many("bulk", items, AddOptions::default())
            .await
            .unwrap();
        assert!(added.iter().all(|x| *x == Added::Created));
    }
    // An id added twice in one batch, and one that exists: handled as `add` would.
    let again = vec![
        ("j0000".to_string(), json!({"again": 1})),
        ("extra".to_string(), json!({})),
        ("extra".to_string(), json!({"second": 1})),
    ];
    let r = a
        .add_many("bulk", again, AddOptions::default())
        .await
        .unwrap();
    assert_eq!(r, [Added::Updated, Added::Created, Added::Updated]);
    a.remove("bulk", "extra").await.unwrap();
    assert!(matches!(
        a.accept_many("bulk", 0, &NOW).await,
        Err(JobsError::Invalid(_))
    ));

    let holding: Arc<Mutex<HashSet<String>>> = Default::default();
    let runs: Arc<Mutex<HashMap<String, usize>>> = Default::default();
    let mut tasks = Vec::new();
    for k in 0..6 {
        let j = if k % 2 == 0 { a.clone() } else { b.clone() };
        let (holding, runs) = (holding.clone(), runs.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let mut got = j.accept_many("bulk", 7, &NOW).await.unwrap();
                if got.is_empty() {
                    return;
                }
                for job in &got {
                    assert!(
                        holding.lock().unwrap().insert(job.id.clone()),
                        "{} held by two processors",
                        job.id
                    );
                    *runs.lock().unwrap().entry(job.id.clone()).or_default() += 1;
                }
                for job in &got {
                    holding.lock().unwrap().remove(&job.id);
                }
                let outcomes = got.iter().map(|_| Outcome::Success(None)).collect();
                for r in j.finish_many(&mut got, outcomes).await {
                    r.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(WAIT, t).await.unwrap().unwrap();
    }
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), N);
    assert!(runs.values().all(|n| *n == 1), "each job ran once");
    let c = a.counts("bulk").await.unwrap();
    assert_eq!(
        (c[&State::Pending], c[&State::Running], c[&State::Finished]),
        (0, 0, N as u64)
    );

    // A batch finish with one job gone: that one halts, the others finish.
    for id in ["x1", "x2", "x3"] {
        a.add("bulk", id, json!({}), None).await.unwrap();
    }
    let mut got = a.accept_many("bulk", 10, &NOW).await.unwrap();
    assert_eq!(got.len(), 3);
    a.remove("bulk", "x2").await.unwrap();
    let outcomes = vec![
        Outcome::Success(Some(json!({"r": 1}))),
        Outcome::Success(None),
        error("x3 broke"),
    ];
    let r = a.finish_many(&mut got, outcomes).await;
    assert!(r[0].is_ok() && r[2].is_ok(), "{r:?}");
    assert!(matches!(r[1], Err(JobsError::Halt { .. })), "{r:?}");
    assert_eq!(a.get_job_data("bulk", "x1").await.unwrap(), json!({"r": 1}));
    let x3 = a.get_job("bulk", "x3").await.unwrap().record;
    assert_eq!(
        (x3.state, x3.attempts, x3.last_error.as_deref()),
        (State::Pending, 1, Some("x3 broke"))
    );
    assert!(matches!(
        a.get_job("bulk", "x2").await,
        Err(JobsError::NoJob { .. })
    ));
}

pub async fn generic_jobs_subscribers_see_every_transition_in_order(h: &dyn Harness) {
    let (j, _s) = jobs_on(h, lading_core::time::system_clock(), "subs").await;
    let (watcher, _sw) = jobs_on(h, lading_core::time::system_clock(), "watcher").await;
    let update = TypeUpdate {
        timeout_s: Some(60),
        backoff_base_ms: Some(0),
        ..Default::default()
    };
    j.update_type("seen", &update).await.unwrap();
    j.add("seen", "x", json!({}), None).await.unwrap();
    let (sub, state) = watcher.subscribe("seen", "x").await.unwrap();
    assert_eq!(state, State::Pending);
    // Four transitions before the watcher looks: each is reported, in order.
    let mut job = j.accept("seen", &NOW).await.unwrap().unwrap();
    j.finish_with(&mut job, error("once")).await.unwrap();
    let mut job = j.accept("seen", &NOW).await.unwrap().unwrap();
    j.finish(&mut job, None).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let c = watcher.wait(&[sub], None, WAIT).await.unwrap().unwrap();
        assert_eq!(c.missed, 0);
        seen.push((c.seq, c.state.unwrap()));
    }
    assert_eq!(
        seen,
        [
            (2, State::Running),
            (3, State::Pending),
            (4, State::Running),
            (5, State::Finished)
        ]
    );
    assert!(
        watcher
            .wait(&[sub], None, Duration::from_millis(50))
            .await
            .unwrap()
            .is_none()
    );
    // More transitions than a record remembers: the oldest are counted, never hidden.
    for _ in 0..6 {
        j.add("seen", "x", json!({}), None).await.unwrap();
        let mut job = j.accept("seen", &NOW).await.unwrap().unwrap();
        j.finish(&mut job, None).await.unwrap();
    }
    let c = watcher.wait(&[sub], None, WAIT).await.unwrap().unwrap();
    assert_eq!(c.missed, 18 - lading_jobs::HISTORY as u64);
    let mut last = c.seq;
    while let Some(c) = watcher
        .wait(&[sub], None, Duration::from_millis(50))
        .await
        .unwrap()
    {
        assert_eq!(c.seq, last + 1);
        last = c.seq;
    }
    assert_eq!(last, 23);
    // A filter on a state skips the others, in order.
    j.add("seen", "x", json!({}), None).await.unwrap();
    let mut job = j.accept("seen", &NOW).await.unwrap().unwrap();
    j.finish(&mut job, None).await.unwrap();
    let c = watcher
        .wait(&[sub], Some(State::Finished), WAIT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((c.seq, c.state), (26, Some(State::Finished)));
}
