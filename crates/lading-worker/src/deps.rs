//! Waiting on a dependency (SPEC §11): what a job's status records of a wait, the limit of a
//! wait, and the prober that decides when a dependency is back and wakes the work waiting on
//! it (see `lading_engine::deps` for the registry itself).

use crate::Outcome;
use lading_core::layout::JobStatus;
use lading_engine::deps::{
    DepSettings, Dependency, WAIT_SINCE_FIELD, WAITED_MS_FIELD, WAITING_ON_FIELD, WAITS_FIELD,
    Waiter,
};
use lading_engine::{Engine, JobLease};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// Jobs woken at first when a dependency is back; each round after doubles it.
pub const RAMP_FIRST: usize = 8;
/// The pause between two rounds of waking.
pub const RAMP_PAUSE: Duration = Duration::from_millis(200);

fn field_u64(status: &JobStatus, k: &str) -> Option<u64> {
    status.extra.get(k).and_then(Value::as_u64)
}

/// Ends a wait recorded in `status`, if any: its time is added to the job's total.
pub fn end_wait(status: &mut JobStatus, now_ms: u64) {
    if let Some(since) = field_u64(status, WAIT_SINCE_FIELD) {
        let total = field_u64(status, WAITED_MS_FIELD).unwrap_or(0) + now_ms.saturating_sub(since);
        status
            .extra
            .insert(WAITED_MS_FIELD.into(), Value::from(total));
    }
    status.extra.remove(WAIT_SINCE_FIELD);
    status.extra.remove(WAITING_ON_FIELD);
}

/// `09:03:07 UTC` of a time in ms since the epoch.
fn clock_time(ms: u64) -> String {
    let s = ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02} UTC", s / 3600, s / 60 % 60, s % 60)
}

/// The message of a job that gave up waiting.
pub fn gave_up(dep: &Dependency, cause: &str, since_ms: u64, s: &DepSettings) -> String {
    let key = if s.max_wait_by_kind.contains_key(&dep.kind) {
        format!("dependencies.max_wait_h_by_kind.{}", dep.kind)
    } else {
        "dependencies.max_wait_h".to_string()
    };
    format!(
        "{} unavailable since {}, longer than a job may wait ({} h, {key}): {cause}",
        dep.label(),
        clock_time(since_ms),
        s.max_wait_for(dep).as_secs_f64() / 3600.0
    )
}

/// The failure of a job whose wait (in this stage) is over the limit, if it is.
pub fn over_limit(engine: &Engine, lease: &JobLease, o: &Outcome, now_ms: u64) -> Option<String> {
    let Outcome::Unavailable { dependency, cause } = o else {
        return None;
    };
    let since = field_u64(&lease.status, WAIT_SINCE_FIELD)?;
    let s = engine.deps().settings();
    s.waited_too_long(dependency, since, now_ms)
        .then(|| gave_up(dependency, cause, since, &s))
}

/// When a job that waits on a dependency is looked at again if no prober wakes it first (the
/// process that deferred it ended): after `recheck`, and, the longer it has waited, after up
/// to sixteen times that (as long as it has waited so far), so a long outage costs the store a
/// few writes per job per hour, not one a minute. A prober of a live process wakes it at once
/// when the dependency is back, however long the deferral.
pub fn recheck_at(s: &DepSettings, status: &JobStatus, now_ms: u64) -> u64 {
    let recheck = s.recheck.as_millis() as u64;
    let waited =
        field_u64(status, WAIT_SINCE_FIELD).map_or(0, |since| now_ms.saturating_sub(since));
    now_ms + waited.clamp(recheck, recheck.saturating_mul(16))
}

/// Records that the leased job waits on `dep`: marks `dep` down (starting its prober when
/// none runs here), keeps the job among its waiters, and writes the wait into the status the
/// deferral will commit. Returns the job's message.
pub fn start_wait(
    engine: &Arc<Engine>,
    lease: &mut JobLease,
    dep: &Dependency,
    cause: &str,
    now_ms: u64,
) -> String {
    let (down_since, start) = engine.deps().down(dep, cause, now_ms);
    if start {
        spawn_prober(engine.clone(), dep.clone());
    }
    engine.deps().wait(
        &dep.key(),
        Waiter {
            priority: lease.priority,
            job: lease.job.clone(),
            state: lease.state(),
        },
    );
    let extra = &mut lease.status.extra;
    if !extra.contains_key(WAIT_SINCE_FIELD) {
        let waits = extra.get(WAITS_FIELD).and_then(Value::as_u64).unwrap_or(0) + 1;
        extra.insert(WAITS_FIELD.into(), Value::from(waits));
        extra.insert(WAIT_SINCE_FIELD.into(), Value::from(now_ms));
    }
    extra.insert(WAITING_ON_FIELD.into(), Value::from(dep.key()));
    format!(
        "waiting: {} unavailable since {}: {cause}",
        dep.label(),
        clock_time(down_since)
    )
}

/// Starts `dep`'s prober in this process (one per dependency: see
/// `lading_engine::deps::Dependencies::down`): a task of the prober service ([`run_probers`])
/// when it runs, so a stop ends it and a panic is named; a task of its own otherwise (a
/// process that runs no service, e.g. a test's bare loops).
pub fn spawn_prober(engine: Arc<Engine>, dep: Dependency) {
    if !engine.deps().hand_prober(&dep) {
        tokio::spawn(probe(engine, dep));
    }
}

/// The process's prober service: runs every prober started while it runs, until a stop (or
/// a prober panics, which ends it with the dependency named).
pub async fn run_probers(engine: Arc<Engine>, mut stop: crate::Shutdown) -> Result<(), String> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Dependency>();
    engine.deps().set_probers(Some(tx));
    let mut running = tokio::task::JoinSet::new();
    let mut names = std::collections::HashMap::new();
    let ended = loop {
        tokio::select! {
            _ = stop.stopped() => break Ok(()),
            Some(dep) = rx.recv() => {
                let label = dep.label();
                let id = running.spawn(probe(engine.clone(), dep)).id();
                names.insert(id, label);
            }
            Some(done) = running.join_next_with_id(), if !running.is_empty() => match done {
                Ok((id, ())) => {
                    names.remove(&id);
                }
                Err(e) if e.is_panic() => {
                    let what = names.remove(&e.id()).unwrap_or_default();
                    break Err(format!("the prober of {what} panicked"));
                }
                Err(_) => {}
            },
        }
    };
    engine.deps().set_probers(None);
    running.abort_all();
    while running.join_next().await.is_some() {}
    engine.deps().probers_ended();
    ended
}

/// Probes `dep` with a doubling pause until it answers, then wakes its waiters.
async fn probe(engine: Arc<Engine>, dep: Dependency) {
    let key = dep.key();
    engine.publish_dependency(&key).await;
    loop {
        let pause = engine.deps().next_pause(&key);
        tokio::time::sleep(pause).await;
        if !engine.deps().is_down(&key) {
            // Marked up meanwhile (a call succeeded): its waiters were given back there.
            break;
        }
        // With no probe of its own, the waiting jobs are the probe: a few are woken, and a
        // failure of theirs marks it down again.
        let answer = match engine.deps().probe_of(&key) {
            Some(p) => p().await,
            None => Ok(()),
        };
        match answer {
            Ok(()) => {
                let waiters = engine.deps().up(&key);
                engine.publish_dependency(&key).await;
                wake(&engine, &key, waiters).await;
                break;
            }
            Err(cause) => {
                let now = engine.clock().now_ms();
                engine.deps().down(&dep, &cause, now);
                tracing::debug!(dependency = %dep.label(), %cause, "still down");
                // The count of waiting work, as it stands, for every process to see.
                engine.publish_dependency(&key).await;
            }
        }
    }
}

/// Wakes `waiters` (in priority order) a few at first, then twice as many each round, and
/// stops when the dependency is down again (the rest stay waiting for its next return).
async fn wake(engine: &Engine, key: &str, waiters: Vec<Waiter>) {
    let mut round = RAMP_FIRST;
    let mut rest = waiters.into_iter().peekable();
    while rest.peek().is_some() {
        if engine.deps().is_down(key) {
            return;
        }
        for w in rest.by_ref().take(round) {
            engine.deps().forget(&w.job);
            match engine.wake_job(w.state, &w.job).await {
                Ok(_) => {}
                Err(e) => tracing::warn!(job = %w.job, error = %e, "cannot wake a waiting job"),
            }
        }
        round = round.saturating_mul(2);
        if rest.peek().is_some() {
            tokio::time::sleep(RAMP_PAUSE).await;
        }
    }
}
