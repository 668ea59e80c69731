//! A processor of generic jobs on the shared runtime ([`lading_worker::run_loops`]): each
//! loop accepts a job of one type, runs a command for it, and finishes it. `lading jobs run`
//! is this.
//!
//! The command gets the job's data as JSON on its standard input and `LADING_JOB_TYPE` and
//! `LADING_JOB_ID` in its environment; what it prints (JSON, up to 16 MiB) becomes the job's
//! result when it exits 0. The job is heartbeaten every third of its type's timeout; when the
//! job is removed, or re-enqueued because this process stalled (`Halt`), the command is
//! killed and nothing is written. A stop lets running commands finish; an abort kills them
//! and puts their jobs back to pending at once.

use crate::{AcceptOptions, Job, Jobs, JobsError};
use lading_worker::{Acquire, Shutdown};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Runs a command per job of one type.
pub struct CommandProcessor {
    jobs: Arc<Jobs>,
    ty: String,
    command: Vec<String>,
    timeout_s: u64,
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
        })
    }

    /// Runs `concurrency` loops until shut down.
    pub async fn run(self, concurrency: usize, shutdown: Shutdown) {
        lading_worker::run_loops(Arc::new(self), concurrency, shutdown).await
    }

    async fn run_one(&self, mut job: Job, shutdown: &mut Shutdown) -> Result<(), String> {
        let j = &self.jobs;
        let child = tokio::process::Command::new(&self.command[0])
            .args(&self.command[1..])
            .env("LADING_JOB_TYPE", &job.ty)
            .env("LADING_JOB_ID", &job.id)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                self.put_back(job).await;
                return Err(format!("cannot run {:?}: {e}", self.command[0]));
            }
        };
        if let Some(mut stdin) = child.stdin.take() {
            let data = serde_json::to_vec(job.data()).map_err(|e| e.to_string())?;
            // A command that does not read its input is fine.
            let _ = stdin.write_all(&data).await;
        }
        let mut stdout = child.stdout.take();
        let output = tokio::spawn(async move {
            let mut buf = Vec::new();
            if let Some(out) = stdout.as_mut() {
                use tokio::io::AsyncReadExt;
                let _ = out.take(16 << 20).read_to_end(&mut buf).await;
            }
            buf
        });
        let beat = Duration::from_millis((self.timeout_s * 1000 / 3).max(100));
        let status = loop {
            tokio::select! {
                s = child.wait() => break Some(s.map_err(|e| e.to_string())?),
                _ = tokio::time::sleep(beat) => {
                    match j.update(&mut job, None).await {
                        Ok(()) => {}
                        Err(e @ JobsError::Halt { .. }) => {
                            eprintln!("lading: {}: {e}; command stopped", job.id);
                            let _ = child.kill().await;
                            return Ok(());
                        }
                        Err(e) => eprintln!("lading: {}: heartbeat failed: {e}", job.id),
                    }
                }
                _ = shutdown.aborted() => {
                    let _ = child.kill().await;
                    break None;
                }
            }
        };
        let Some(status) = status else {
            self.put_back(job).await;
            return Ok(());
        };
        let out = output.await.unwrap_or_default();
        let result = status
            .success()
            .then(|| serde_json::from_slice::<Value>(&out).ok())
            .flatten();
        match j.finish(&mut job, result).await {
            Ok(()) if status.success() => println!("{}: finished", job.id),
            Ok(()) => println!("{}: finished ({status}; data kept)", job.id),
            Err(e @ JobsError::Halt { .. }) => eprintln!("lading: {}: {e}", job.id),
            Err(e) => return Err(e.to_string()),
        }
        Ok(())
    }

    /// Back to pending now rather than after the activity timeout.
    async fn put_back(&self, mut job: Job) {
        let r = async {
            self.jobs.resubmit(&mut job, None).await?;
            self.jobs.finish(&mut job, None).await
        };
        if let Err(e) = r.await {
            eprintln!("lading: {}: could not put it back: {e}", job.id);
        }
    }
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
    type Lease = Job;
    const WHAT: &'static str = "generic job";
    fn state_name(&self) -> &str {
        &self.ty
    }
    async fn wait(&self, stop: Shutdown) -> Result<Option<Job>, String> {
        let opts = AcceptOptions {
            timeout: IDLE_WAIT,
            ..Default::default()
        };
        tokio::select! {
            r = self.jobs.accept(&self.ty, &opts) => r.map_err(|e| e.to_string()),
            _ = stop.into_stopped() => Ok(None),
        }
    }
    async fn handle(&self, job: Job, shutdown: &mut Shutdown) -> Option<Job> {
        let id = job.id.clone();
        if let Err(e) = self.run_one(job, shutdown).await {
            eprintln!("lading: {id}: {e}");
        }
        None
    }
    async fn release(&self, job: Job) {
        self.put_back(job).await
    }
}
