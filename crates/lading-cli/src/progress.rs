//! The progress of a batch as `submit --wait` draws it, the same with or without `--server`:
//! a bar per stage (jobs past it of all jobs), a line with the batch's state and its failed
//! jobs counted apart. Nothing is drawn before the batch has jobs; on a standard error that
//! is not a terminal nothing is drawn at all.

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use lading_server::ops::{Changes, Ops, job_states};
use std::collections::HashMap;

/// Job stages in order.
const STAGES: [lading_core::JobState; 8] = lading_core::JobState::PIPELINE;

/// How far a job in `state` got: its stage's place, past the last for Completed; failed
/// and deleted jobs are counted apart, not as progress.
fn rank(state: &str) -> usize {
    STAGES
        .iter()
        .position(|s| s.name() == state)
        .unwrap_or(if state == "Completed" {
            STAGES.len()
        } else {
            0
        })
}

pub struct StageProgress {
    multi: MultiProgress,
    bars: Vec<ProgressBar>,
    line: Option<ProgressBar>,
    /// Job id → its state.
    pub jobs: HashMap<String, String>,
    pub batch_state: String,
}

impl StageProgress {
    pub fn new() -> StageProgress {
        StageProgress {
            multi: MultiProgress::new(),
            bars: Vec::new(),
            line: None,
            jobs: HashMap::new(),
            batch_state: String::new(),
        }
    }

    /// Draws the current counts (the bars appear with the first job).
    pub fn draw(&mut self) {
        if self.jobs.is_empty() {
            return;
        }
        if self.bars.is_empty() {
            let style = ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len}")
                .expect("a valid template")
                .progress_chars("=> ");
            for s in STAGES[1..].iter().map(|s| s.name()).chain(["Completed"]) {
                let b = self.multi.add(ProgressBar::new(0));
                b.set_style(style.clone());
                b.set_prefix(s.to_string());
                self.bars.push(b);
            }
            self.line = Some(self.multi.add(ProgressBar::new_spinner()));
        }
        let total = self.jobs.len() as u64;
        for (i, b) in self.bars.iter().enumerate() {
            // Bar i is stage i+1 (done for a job past it), the last one Completed.
            let past = (i + 1).min(STAGES.len() - 1);
            let n = self.jobs.values().filter(|s| rank(s) > past).count() as u64;
            b.set_length(total);
            b.set_position(n);
        }
        let failed = self.jobs.values().filter(|s| *s == "Failed").count();
        let deleted = self.jobs.values().filter(|s| *s == "Deleted").count();
        if let Some(l) = &self.line {
            l.set_message(format!(
                "batch {}; {failed} failed{}",
                self.batch_state,
                if deleted > 0 {
                    format!(", {deleted} deleted")
                } else {
                    String::new()
                }
            ));
        }
    }

    pub fn finish(&self) {
        for b in &self.bars {
            b.finish();
        }
        if let Some(l) = &self.line {
            l.finish();
        }
    }
}

fn ended(state: &str) -> bool {
    matches!(state, "Completed" | "Failed" | "Deleted")
}

/// Shows a batch's progress per stage until it ends: its changes as they come, and the
/// batch and its jobs read again when it is quiet (on a store: changes other processes make
/// are not seen) or after changes were missed.
pub async fn follow<O: Ops>(ops: &O, bid: &str) -> anyhow::Result<()>
where
    anyhow::Error: From<O::Error>,
{
    // The stream first, then the state: nothing in between is missed.
    let mut changes = ops
        .changes(&lading_core::layout::BatchId::parse(bid)?)
        .await?;
    let local = matches!(changes, Changes::Local { .. });
    let mut p = StageProgress::new();
    let mut all = true;
    loop {
        let b = ops.batch(bid).await?;
        p.batch_state = b.status.status.name().to_string();
        job_states(ops, &b, &mut p.jobs, all).await?;
        p.draw();
        if ended(&p.batch_state) {
            break;
        }
        loop {
            match tokio::time::timeout(changes.quiet(), changes.next()).await {
                Ok(Some(c)) if c.kind == "job" => {
                    p.jobs.insert(c.id, c.to);
                }
                Ok(Some(c)) if c.kind == "batch" => p.batch_state = c.to,
                Ok(Some(_)) => {}
                // Some were missed: everything again.
                Ok(None) => {
                    all = true;
                    break;
                }
                // Quiet: on a store, everything again (other processes' changes).
                Err(_) => {
                    all = local;
                    break;
                }
            }
            p.draw();
            if ended(&p.batch_state) {
                break;
            }
        }
    }
    p.finish();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_jobs_are_not_progress_and_nothing_is_drawn_without_jobs() {
        assert_eq!(rank("Failed"), 0);
        assert_eq!(rank("Completed"), STAGES.len());
        assert_eq!(rank("Storing"), 5);
        let mut p = StageProgress::new();
        p.batch_state = "Pending".into();
        p.draw();
        assert!(p.bars.is_empty(), "no bars before the first job");
        p.jobs.insert("j1".into(), "Failed".into());
        p.jobs.insert("j2".into(), "Completed".into());
        p.draw();
        let completed = p.bars.last().unwrap();
        assert_eq!((completed.position(), completed.length()), (1, Some(2)));
        p.jobs.insert("j3".into(), "Notify".into());
        p.draw();
        let notify = &p.bars[p.bars.len() - 2];
        assert_eq!(
            (notify.position(), notify.length()),
            (1, Some(3)),
            "past Notify: only the completed one"
        );
        let estimating = &p.bars[0];
        assert_eq!(
            estimating.position(),
            2,
            "past Estimating: the completed one and the one at Notify"
        );
    }
}
