//! A processor of generic jobs on the shared runtime ([`lading_worker::run_loops`]): each
//! loop accepts a job of one type (or a batch of them), runs a command per job, and ends each
//! run with its outcome. `lading jobs run` is this.
//!
//! The command gets the job's data as JSON on its standard input and `LADING_JOB_TYPE` and
//! `LADING_JOB_ID` in its environment. When it exits 0, what it printed (JSON, up to 16 MiB)
//! becomes the job's data. Any other exit is an error: the run fails with the exit status and
//! the last lines of what the command wrote to its standard error (or, when that is empty, its
//! standard output), and the type's retry policy decides what comes next. What it writes to
//! standard error is passed through as well. The jobs held are heartbeaten every third of the
//! type's timeout; when a job is removed, or re-enqueued because this process stalled
//! (`Halt`), its command is killed and nothing is written. A stop lets running commands
//! finish; an abort kills them and puts their jobs back to pending at once.
//!
//! With a batch size above 1, a loop accepts up to that many jobs at once, runs their
//! commands one after the other, and finishes them all in one `multi`.

use crate::{AcceptOptions, Job, Jobs, JobsError, Outcome};
use lading_worker::{Acquire, Shutdown};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Most of a command's standard output read (its result).
const MAX_OUTPUT: u64 = 16 << 20;
/// What of a failed command's output the error keeps: its last lines, this many bytes.
const ERROR_TAIL: usize = 2048;
/// Lines of it.
const ERROR_LINES: usize = 10;

/// Runs a command per job of one type.
pub struct CommandProcessor {
    jobs: Arc<Jobs>,
    ty: String,
    command: Vec<String>,
    timeout_s: u64,
    batch: usize,
}

/// How one command's run ended.
enum Ran {
    /// It ended; finish the job with this.
    Done(Outcome),
    /// The job is no longer ours (removed, or re-enqueued): nothing to write.
    Halted,
    /// An abort: the job goes back to pending.
    Aborted,
}

impl CommandProcessor {
    /// A processor for type `ty`; `command` is the program and its arguments.
    pub async fn new(
        jobs: Arc<Jobs>,
        ty: &str,
        command: Vec<String>,
    ) -> Result<CommandProcessor, JobsError> {
        let Some(program) = command.first() else {
            return Err(JobsError::Invalid("the command is empty".into()));
        };
        // Found before any job is taken, so a typo fails the processor, not the jobs.
        if !runnable(program) {
            return Err(JobsError::Invalid(format!(
                "cannot run {program:?}: no such executable{}",
                if program.contains('/') {
                    ""
                } else {
                    " on PATH"
                }
            )));
        }
        let timeout_s = jobs.get_type_timeout(ty).await?;
        Ok(CommandProcessor {
            jobs,
            ty: ty.to_string(),
            command,
            timeout_s,
            batch: 1,
        })
    }

    /// Accepts up to `n` jobs at once (1 to [`crate::MAX_BATCH`]) and finishes them together.
    pub fn with_batch(mut self, n: usize) -> Result<CommandProcessor, JobsError> {
        if !(1..=crate::MAX_BATCH).contains(&n) {
            return Err(JobsError::Invalid(format!(
                "a batch is 1 to {} jobs, not {n}",
                crate::MAX_BATCH
            )));
        }
        self.batch = n;
        Ok(self)
    }

    /// Runs `concurrency` loops until shut down.
    pub async fn run(self, concurrency: usize, shutdown: Shutdown) {
        lading_worker::run_loops(Arc::new(self), concurrency, shutdown).await
    }

    /// Runs the command for `held[i]`, heartbeating every job in `held` meanwhile (a job a
    /// heartbeat finds gone is dropped from it).
    async fn run_one(
        &self,
        held: &mut [Option<Job>],
        i: usize,
        shutdown: &mut Shutdown,
    ) -> Result<Ran, String> {
        let j = &self.jobs;
        let (ty, id, data) = match &held[i] {
            Some(job) => (job.ty.clone(), job.id.clone(), job.data().clone()),
            None => return Ok(Ran::Halted),
        };
        let child = tokio::process::Command::new(&self.command[0])
            .args(&self.command[1..])
            .env("LADING_JOB_TYPE", &ty)
            .env("LADING_JOB_ID", &id)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => return Err(format!("cannot run {:?}: {e}", self.command[0])),
        };
        if let Some(mut stdin) = child.stdin.take() {
            let data = serde_json::to_vec(&data).map_err(|e| e.to_string())?;
            // A command that does not read its input is fine.
            let _ = stdin.write_all(&data).await;
        }
        let mut stdout = child.stdout.take();
        let output = tokio::spawn(async move {
            let mut buf = Vec::new();
            if let Some(out) = stdout.as_mut() {
                let _ = out.take(MAX_OUTPUT).read_to_end(&mut buf).await;
            }
            buf
        });
        // Passed through to ours, and its tail kept for the error.
        let mut stderr = child.stderr.take();
        let errors = tokio::spawn(async move {
            let mut tail: Vec<u8> = Vec::new();
            let mut chunk = [0u8; 8192];
            if let Some(err) = stderr.as_mut() {
                while let Ok(n) = err.read(&mut chunk).await {
                    if n == 0 {
                        break;
                    }
                    {
                        use std::io::Write;
                        let _ = std::io::stderr().lock().write_all(&chunk[..n]);
                    }
                    tail.extend_from_slice(&chunk[..n]);
                    if tail.len() > 2 * ERROR_TAIL {
                        tail.drain(..tail.len() - ERROR_TAIL);
                    }
                }
            }
            tail
        });
        let beat = Duration::from_millis((self.timeout_s * 1000 / 3).max(100));
        let status = loop {
            tokio::select! {
                // In order, not at random: a run is the same every time (`lading-sim`).
                biased;
                s = child.wait() => break Some(s.map_err(|e| e.to_string())?),
                _ = tokio::time::sleep(beat) => {
                    for slot in held.iter_mut() {
                        let Some(job) = slot.as_mut() else { continue };
                        match j.update(job, None).await {
                            Ok(()) => {}
                            Err(e @ JobsError::Halt { .. }) => {
                                tracing::warn!(job = %job.id, error = %e, "dropped");
                                *slot = None;
                            }
                            Err(e) => tracing::warn!(job = %job.id, error = %e, "heartbeat failed"),
                        }
                    }
                    if held[i].is_none() {
                        tracing::warn!(job = %id, "command stopped");
                        let _ = child.kill().await;
                        return Ok(Ran::Halted);
                    }
                }
                _ = shutdown.aborted() => {
                    let _ = child.kill().await;
                    break None;
                }
            }
        };
        let Some(status) = status else {
            return Ok(Ran::Aborted);
        };
        let out = output.await.unwrap_or_default();
        let err = errors.await.unwrap_or_default();
        if status.success() {
            return Ok(Ran::Done(Outcome::Success(
                lading_core::json::from_bytes::<Value>(&out).ok(),
            )));
        }
        let said = if err.iter().any(|b| !b.is_ascii_whitespace()) {
            err
        } else {
            out
        };
        let tail = last_lines(&String::from_utf8_lossy(&said));
        let message = if tail.is_empty() {
            format!("the command failed ({status}); it printed nothing")
        } else {
            format!("the command failed ({status}):\n{tail}")
        };
        Ok(Ran::Done(Outcome::Error {
            message,
            data: None,
        }))
    }

    /// Back to pending now rather than after the activity timeout.
    async fn put_back(&self, mut job: Job) {
        let r = async {
            self.jobs.resubmit(&mut job, None).await?;
            self.jobs.finish(&mut job, None).await
        };
        if let Err(e) = r.await {
            tracing::warn!(job = %job.id, error = %e, "could not put it back");
        }
    }
}

/// The last [`ERROR_LINES`] lines of `text`, at most [`ERROR_TAIL`] bytes.
fn last_lines(text: &str) -> String {
    let text = text.trim_end();
    let mut start = text.len().saturating_sub(ERROR_TAIL);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let tail = &text[start..];
    let lines: Vec<&str> = tail.lines().collect();
    lines[lines.len().saturating_sub(ERROR_LINES)..].join("\n")
}

/// Whether `program` names an executable file (a path, or a name found on `PATH`).
fn runnable(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let is_exec = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return is_exec(std::path::Path::new(program));
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| is_exec(&d.join(program))))
}

/// How long one acceptance waits before asking again (it also ends on a stop).
const IDLE_WAIT: Duration = Duration::from_secs(3600);

impl Acquire for CommandProcessor {
    type Lease = Vec<Job>;
    const WHAT: &'static str = "generic job";
    fn state_name(&self) -> &str {
        &self.ty
    }
    async fn wait(&self, stop: Shutdown) -> Result<Option<Vec<Job>>, String> {
        let opts = AcceptOptions {
            timeout: IDLE_WAIT,
            ..Default::default()
        };
        tokio::select! {
            // In order, not at random: a run is the same every time (`lading-sim`).
            biased;
            r = self.jobs.accept_many(&self.ty, self.batch, &opts) => match r {
                Ok(v) if v.is_empty() => Ok(None),
                Ok(v) => Ok(Some(v)),
                Err(e) => Err(e.to_string()),
            },
            _ = stop.into_stopped() => Ok(None),
        }
    }
    async fn handle(&self, jobs: Vec<Job>, shutdown: &mut Shutdown) -> Option<Vec<Job>> {
        let mut held: Vec<Option<Job>> = jobs.into_iter().map(Some).collect();
        let mut outcomes: Vec<Option<Outcome>> = held.iter().map(|_| None).collect();
        for i in 0..held.len() {
            let span = match &held[i] {
                Some(j) => tracing::info_span!("generic_job", r#type = %j.ty, job = %j.id),
                None => tracing::Span::none(),
            };
            match tracing::Instrument::instrument(self.run_one(&mut held, i, shutdown), span).await
            {
                Ok(Ran::Done(o)) => outcomes[i] = Some(o),
                Ok(Ran::Halted) => held[i] = None,
                Ok(Ran::Aborted) => break,
                Err(e) => {
                    let id = held[i].as_ref().map_or("?", |j| j.id.as_str()).to_string();
                    tracing::warn!(job = %id, error = %e, "run");
                    if let Some(job) = held[i].take() {
                        self.put_back(job).await;
                    }
                }
            }
        }
        // Jobs ended are finished together; jobs not run (an abort) go back.
        let mut done = Vec::new();
        let mut ends = Vec::new();
        for (slot, o) in held.into_iter().zip(outcomes) {
            match (slot, o) {
                (Some(job), Some(o)) => {
                    done.push(job);
                    ends.push(o);
                }
                (Some(job), None) => self.put_back(job).await,
                (None, _) => {}
            }
        }
        let results = self.jobs.finish_many(&mut done, ends).await;
        for (job, r) in done.iter().zip(results) {
            let rec = job.record();
            match r {
                Ok(()) => match (&rec.state, &rec.last_error) {
                    (crate::State::Finished, _) => println!("{}: finished", job.id),
                    (crate::State::Failed, Some(e)) => {
                        println!("{}: failed after {} attempts: {e}", job.id, rec.attempts)
                    }
                    (crate::State::Pending, Some(e)) => println!(
                        "{}: attempt {} failed, retried later: {e}",
                        job.id, rec.attempts
                    ),
                    (state, _) => println!("{}: {state}", job.id),
                },
                Err(e) => tracing::warn!(job = %job.id, error = %e, "run"),
            }
        }
        None
    }
    async fn release(&self, jobs: Vec<Job>) {
        for job in jobs {
            self.put_back(job).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_keeps_the_last_lines() {
        let text: String = (1..=30).map(|i| format!("line {i}\n")).collect();
        let t = last_lines(&text);
        assert!(t.starts_with("line 21\n") && t.ends_with("line 30"), "{t}");
        let long = "x".repeat(10_000);
        assert_eq!(last_lines(&long).len(), ERROR_TAIL);
    }
}
