//! The profiles' processing command (`scan`), as the simulated world runs it in place of
//! `sh -c` ([`lading_ingest::command::Commands`]). It looks at what Processing hands it, as
//! a scanner would: its working folder must be the job's, its environment must name the job
//! and its primary identifier, and the object must be whole (files there, none half
//! downloaded). What it finds wrong is reported, a violation at the end. As the seed says, a
//! run takes a while, finds a "virus" (the command fails, and so does the job), cannot be
//! started, or hangs past the stage's timeout (Lading drops it and tries again); the last
//! two only while the faults go on.

use lading_core::BoxFuture;
use lading_core::random::{Random, Seeded};
use lading_ingest::command::{Commands, Ran, Run};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The command the simulated profiles name.
pub const SCAN: &str = "scan producer";

/// Runs [`SCAN`]; what it finds wrong goes to `wrong`.
pub struct Scanner {
    pub dice: Arc<Seeded>,
    pub wrong: Arc<dyn Fn(String) + Send + Sync>,
    /// How long a hanging run takes: past the stages' timeout.
    pub hang: Duration,
    /// Whether the faults go on: once they stop, every run starts and none hangs.
    pub faults: Arc<std::sync::atomic::AtomicBool>,
}

impl Commands for Scanner {
    fn run<'a>(&'a self, run: Run<'a>) -> BoxFuture<'a, std::io::Result<Ran>> {
        Box::pin(async move {
            // What the run is handed, as it starts: a handler whose lease was lost may still
            // be running it when the job has gone on elsewhere, its batch ended and cleanup
            // removed the folder (found by this check, seed 537648712, when it looked after
            // the run's time).
            if run.command != SCAN {
                (self.wrong)(format!("a command {:?} instead of {SCAN:?}", run.command));
            }
            for why in look(&run) {
                (self.wrong)(format!("processing ran {SCAN:?} {why}"));
            }
            let took = self.dice.below(300);
            let roll = if self.faults.load(std::sync::atomic::Ordering::Relaxed) {
                self.dice.below(100)
            } else {
                3 + self.dice.below(97)
            };
            tokio::time::sleep(Duration::from_millis(took as u64)).await;
            match roll {
                0..2 => Err(std::io::Error::other("sh: cannot fork")),
                2..3 => {
                    // Hangs past the stage's timeout, or until the faults stop (the world is
                    // well again: the run ends).
                    let until = tokio::time::Instant::now() + self.hang;
                    while tokio::time::Instant::now() < until
                        && self.faults.load(std::sync::atomic::Ordering::Relaxed)
                    {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Ok(ran(true, "exit status: 0", vec![]))
                }
                3..6 => Ok(ran(
                    false,
                    "exit status: 1",
                    vec!["scanning".into(), "producer: infected (simulated)".into()],
                )),
                _ => Ok(ran(
                    true,
                    "exit status: 0",
                    vec!["scanning".into(), "clean".into()],
                )),
            }
        })
    }
}

fn ran(success: bool, status: &str, output: Vec<String>) -> Ran {
    Ran {
        success,
        status: status.into(),
        output,
        dropped: 0,
    }
}

/// What is wrong with what a run was handed: its folder, its environment, its object.
fn look(run: &Run<'_>) -> Vec<String> {
    let mut found = Vec::new();
    let env = |k: &str| {
        run.env
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.as_str())
    };
    let job = env("LADING_JOB_ID").unwrap_or_default();
    if job.is_empty() || !run.workdir.ends_with(job) {
        found.push(format!("in {} for job {job:?}", run.workdir.display()));
    }
    if env("LADING_WORKDIR") != Some(&*run.workdir.display().to_string()) {
        found.push(format!("told LADING_WORKDIR {:?}", env("LADING_WORKDIR")));
    }
    for k in ["LADING_BATCH_ID", "LADING_PRIMARY_ID", "LADING_PROFILE"] {
        if env(k).is_none_or(str::is_empty) {
            found.push(format!("for {job} without {k}"));
        }
    }
    let mut files = 0;
    let mut partial = Vec::new();
    walk(&run.workdir.join("producer"), &mut |p| {
        files += 1;
        if p.extension().is_some_and(|e| e == "part") {
            partial.push(p.display().to_string());
        }
    });
    if files == 0 {
        found.push(format!("for {job} on an object with no files"));
    }
    if !partial.is_empty() {
        found.push(format!(
            "for {job} on a half-downloaded object: {partial:?}"
        ));
    }
    found
}

fn walk(dir: &Path, f: &mut impl FnMut(&Path)) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&p, f);
        } else {
            f(&p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(job: &str, workdir: &Path) -> Vec<(&'static str, String)> {
        vec![
            ("LADING_JOB_ID", job.into()),
            ("LADING_BATCH_ID", "bid1".into()),
            ("LADING_PRIMARY_ID", "ark:/99999/fk4x".into()),
            ("LADING_PROFILE", "sim".into()),
            ("LADING_WORKDIR", workdir.display().to_string()),
        ]
    }

    /// A whole object in the job's folder passes; a half-downloaded one, an empty one, and
    /// a run in another job's folder or without its identifier are each named.
    #[test]
    fn the_scanner_names_what_it_was_wrongly_handed() {
        let root = tempfile::tempdir().unwrap();
        let wd = root.path().join("jid1");
        std::fs::create_dir_all(wd.join("producer/dir0")).unwrap();
        let look_at = |env: Vec<(&'static str, String)>, wd: &Path| {
            look(&Run {
                command: SCAN,
                workdir: wd,
                env,
            })
        };
        let empty = look_at(env("jid1", &wd), &wd);
        assert!(empty.iter().any(|w| w.contains("no files")), "{empty:?}");
        std::fs::write(wd.join("producer/dir0/f0.bin"), b"x").unwrap();
        assert_eq!(look_at(env("jid1", &wd), &wd), Vec::<String>::new());
        std::fs::write(wd.join("producer/dir0/f1.bin.part"), b"x").unwrap();
        let half = look_at(env("jid1", &wd), &wd);
        assert!(
            half.iter().any(|w| w.contains("half-downloaded")),
            "{half:?}"
        );
        std::fs::remove_file(wd.join("producer/dir0/f1.bin.part")).unwrap();
        let other = look_at(env("jid2", &wd), &wd);
        assert!(
            other.iter().any(|w| w.contains("for job \"jid2\"")),
            "{other:?}"
        );
        let mut no_ark = env("jid1", &wd);
        no_ark.retain(|(k, _)| *k != "LADING_PRIMARY_ID");
        let no_ark = look_at(no_ark, &wd);
        assert!(
            no_ark.iter().any(|w| w.contains("LADING_PRIMARY_ID")),
            "{no_ark:?}"
        );
    }
}
