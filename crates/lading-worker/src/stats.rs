//! Per-stage figures a worker keeps: outcomes and handler latencies, for `lading bench
//! pipeline` and the metrics endpoint.

use crate::Outcome;
use lading_engine::processes::RunningWork;
use lading_engine::stage_metrics::MinuteCounts;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// Latency samples kept per stage; past it, samples are replaced at random (a reservoir), so
/// percentiles stay representative with bounded memory.
const SAMPLES_KEPT: usize = 100_000;

/// Upper bounds (seconds) of the latency histogram buckets, as Prometheus reports them.
pub const BUCKETS_S: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

#[derive(Debug, Default, Clone)]
struct Stage {
    done: u64,
    waits: u64,
    transient: u64,
    fatal: u64,
    seen: u64,
    samples_ms: Vec<f64>,
    /// Handler runs per bucket of [`BUCKETS_S`] (not cumulative), the last for larger ones.
    buckets: Vec<u64>,
    sum_s: f64,
}

/// A stage's latency histogram: cumulative counts per bucket bound, total count, sum.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Histogram {
    pub cumulative: Vec<(f64, u64)>,
    pub count: u64,
    pub sum_s: f64,
}

/// Figures of one stage.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StageFigures {
    pub done: u64,
    pub waits: u64,
    pub transient: u64,
    pub fatal: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Default)]
pub struct Stats {
    stages: Mutex<BTreeMap<String, Stage>>,
    /// What this process's stages run now, by a number of its own.
    running: Mutex<BTreeMap<u64, RunningWork>>,
    next_run: AtomicU64,
    /// Told when `running` changes (its announcer writes the process's record anew).
    changed: Notify,
    /// Per stage and minute (start, ms), what was counted and not yet added to the store's
    /// stage metrics (at most [`MINUTES_HELD`] minutes per stage: without a flusher, the
    /// oldest go).
    minutes: Mutex<BTreeMap<String, BTreeMap<u64, MinuteCounts>>>,
}

/// Minutes of counts held per stage for the flusher.
const MINUTES_HELD: usize = 120;

/// A piece of work this process runs: removed from [`Stats::running_now`] when dropped.
pub struct Running<'a> {
    stats: &'a Stats,
    n: u64,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut running = self.stats.running.lock().unwrap_or_else(|p| p.into_inner());
        running.remove(&self.n);
        self.stats.changed.notify_one();
    }
}

impl Stats {
    /// Notes that a job or batch (`kind`) runs in `stage` from `since_ms` until the returned
    /// guard is dropped.
    pub fn running(&self, kind: &str, id: &str, stage: &str, since_ms: u64) -> Running<'_> {
        let n = self.next_run.fetch_add(1, Ordering::Relaxed);
        let work = RunningWork {
            kind: kind.to_string(),
            id: id.to_string(),
            stage: stage.to_string(),
            since_ms,
        };
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(n, work);
        self.changed.notify_one();
        Running { stats: self, n }
    }

    /// Takes the per-minute counts not yet added to the store, by stage.
    pub fn take_minutes(&self) -> BTreeMap<String, BTreeMap<u64, MinuteCounts>> {
        std::mem::take(&mut *self.minutes.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Puts back counts of `stage` the store did not take, for the next flush.
    pub fn put_back_minutes(&self, stage: &str, counts: BTreeMap<u64, MinuteCounts>) {
        let mut minutes = self.minutes.lock().unwrap_or_else(|p| p.into_inner());
        let of_stage = minutes.entry(stage.to_string()).or_default();
        for (minute, c) in counts {
            of_stage.entry(minute).or_default().merge(&c);
        }
        while of_stage.len() > MINUTES_HELD {
            of_stage.pop_first();
        }
    }

    /// What runs now, longest running first.
    pub fn running_now(&self) -> Vec<RunningWork> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<RunningWork> = running.values().cloned().collect();
        v.sort_by(|a, b| (a.since_ms, &a.id).cmp(&(b.since_ms, &b.id)));
        v
    }

    /// Resolves once what runs has changed since the last call returned.
    pub async fn running_changed(&self) {
        self.changed.notified().await
    }

    /// Counts a handler run of `stage` that ended at `now_ms` with `outcome` after `took`.
    pub fn record(&self, stage: &str, outcome: &Outcome, took: Duration, now_ms: u64) {
        {
            let mut minutes = self.minutes.lock().unwrap_or_else(|p| p.into_inner());
            let of_stage = minutes.entry(stage.to_string()).or_default();
            let m = of_stage.entry(now_ms - now_ms % 60_000).or_default();
            match outcome {
                Outcome::Done => m.done += 1,
                Outcome::Wait { .. } | Outcome::Unavailable { .. } => m.waited += 1,
                Outcome::Transient(_) | Outcome::Fatal(_) => m.failed += 1,
            }
            m.add_time(took.as_millis() as u64);
            while of_stage.len() > MINUTES_HELD {
                of_stage.pop_first();
            }
        }
        let mut stages = self.stages.lock().unwrap_or_else(|p| p.into_inner());
        let s = stages.entry(stage.to_string()).or_default();
        match outcome {
            Outcome::Done => s.done += 1,
            Outcome::Wait { .. } | Outcome::Unavailable { .. } => s.waits += 1,
            Outcome::Transient(_) => s.transient += 1,
            Outcome::Fatal(_) => s.fatal += 1,
        }
        s.seen += 1;
        if s.buckets.is_empty() {
            s.buckets = vec![0; BUCKETS_S.len() + 1];
        }
        let secs = took.as_secs_f64();
        let b = BUCKETS_S
            .iter()
            .position(|le| secs <= *le)
            .unwrap_or(BUCKETS_S.len());
        s.buckets[b] += 1;
        s.sum_s += secs;
        let ms = secs * 1000.0;
        if s.samples_ms.len() < SAMPLES_KEPT {
            s.samples_ms.push(ms);
        } else {
            let i = (uuid::Uuid::new_v4().as_u128() % s.seen as u128) as usize;
            if i < SAMPLES_KEPT {
                s.samples_ms[i] = ms;
            }
        }
    }

    /// Latency histograms per stage, by stage name.
    pub fn histograms(&self) -> BTreeMap<String, Histogram> {
        let stages = self.stages.lock().unwrap_or_else(|p| p.into_inner());
        stages
            .iter()
            .map(|(name, s)| {
                let mut acc = 0;
                let cumulative = BUCKETS_S
                    .iter()
                    .zip(&s.buckets)
                    .map(|(le, n)| {
                        acc += n;
                        (*le, acc)
                    })
                    .collect();
                let h = Histogram {
                    cumulative,
                    count: s.seen,
                    sum_s: s.sum_s,
                };
                (name.clone(), h)
            })
            .collect()
    }

    /// Figures per stage, by stage name.
    pub fn figures(&self) -> BTreeMap<String, StageFigures> {
        let stages = self.stages.lock().unwrap_or_else(|p| p.into_inner());
        stages
            .iter()
            .map(|(name, s)| {
                let mut v = s.samples_ms.clone();
                v.sort_by(f64::total_cmp);
                let pct = |p: f64| {
                    if v.is_empty() {
                        0.0
                    } else {
                        v[((v.len() - 1) as f64 * p).round() as usize]
                    }
                };
                let f = StageFigures {
                    done: s.done,
                    waits: s.waits,
                    transient: s.transient,
                    fatal: s.fatal,
                    p50_ms: pct(0.5),
                    p99_ms: pct(0.99),
                    max_ms: v.last().copied().unwrap_or(0.0),
                };
                (name.clone(), f)
            })
            .collect()
    }
}
