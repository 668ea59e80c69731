//! Test aids the command line offers (hidden): moving jobs on without doing their work, and
//! holding one job's lease, for the tests that kill processes at chosen moments.

use crate::LOOK_ORDER;
use lading_core::{Event, JobState};
use lading_engine::Engine;
use std::io::Write;
use std::time::{Duration, Instant};

/// The move that takes a job in `state` one stage on.
pub(crate) fn one_stage_on(state: JobState) -> Event<JobState> {
    if state == JobState::Pending {
        Event::To(JobState::Estimating)
    } else {
        Event::Success
    }
}

/// Test aid behind `lading drive`: moves any job it can acquire one stage on (no work done),
/// until nothing was found for `idle`. Returns (transitions, jobs completed).
pub async fn drive(e: &Engine, idle: Duration) -> crate::Result<(u64, u64)> {
    let (mut transitions, mut completed) = (0u64, 0u64);
    let mut last_work = Instant::now();
    while last_work.elapsed() < idle {
        let mut got = None;
        for st in LOOK_ORDER {
            if let Some(l) = e.acquire_job(st).await? {
                got = Some(l);
                break;
            }
        }
        let Some(lease) = got else {
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        };
        last_work = Instant::now();
        let ev = one_stage_on(lease.state());
        let st = e.job_transition(lease, ev, None).await?;
        transitions += 1;
        if st.status == JobState::Completed {
            completed += 1;
        }
    }
    Ok((transitions, completed))
}

/// Test aid behind `lading hold-job`: acquires a job in `state` and prints its id, then holds
/// its lease until killed; with `advance_on_input`, moves it on once a line arrives on
/// standard input and prints `committed STATE`, or `error: …` and exits 4 when the lease
/// was lost meanwhile.
pub async fn hold_job(e: &Engine, state: JobState, advance_on_input: bool) -> crate::Result<()> {
    let lease = e
        .acquire_job(state)
        .await?
        .ok_or_else(|| crate::BenchError::Other(format!("no {state} job to hold")))?;
    println!("{}", lease.job);
    std::io::stdout().flush()?;
    if !advance_on_input {
        std::future::pending::<()>().await;
    }
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    match e.job_transition(lease, one_stage_on(state), None).await {
        Ok(s) => println!("committed {}", s.status),
        Err(err @ lading_engine::EngineError::LeaseLost(_)) => {
            println!("error: {err}");
            std::io::stdout().flush()?;
            std::process::exit(4);
        }
        Err(err) => return Err(err.into()),
    }
    Ok(())
}
