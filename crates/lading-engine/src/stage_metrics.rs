//! Stage metrics kept in the store for a day (SPEC §12), shared by every process: per stage,
//! one node per hour of the day (`/stage-metrics/STAGE.HH`, 24 per stage, reused as the
//! day turns), each holding that hour's minutes — handler runs that moved the work on,
//! failed, or waited; a histogram of handler times; the largest queue depth seen. Processes
//! add what they counted with a version-checked rewrite, so no count is lost to a race.
//! Not part of Merritt's layout.

use crate::Result;
use lading_core::{CreateMode, Tree, TreeError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where the hours are kept.
pub const STAGE_METRICS: &str = "/stage-metrics";
const MINUTE_MS: u64 = 60_000;
const HOUR_MS: u64 = 3_600_000;
/// Hours kept per stage.
pub const HOURS_KEPT: u64 = 24;
/// Upper bounds (ms) of the handler-time histogram's buckets; the last bucket is larger.
pub const TIME_BUCKETS_MS: &[u64] = &[
    5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 300_000,
];
/// Tries of a rewrite that lost a race before the counts are put back for the next flush.
const TRIES: usize = 20;

/// One stage's figures for one minute.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MinuteCounts {
    /// Handler runs that moved the work on.
    #[serde(default)]
    pub done: u64,
    /// Handler runs that failed (fatal, or an error about the work itself).
    #[serde(default)]
    pub failed: u64,
    /// Handler runs that waited (a dependency down, space, a quota).
    #[serde(default)]
    pub waited: u64,
    /// Handler runs per bucket of [`TIME_BUCKETS_MS`] (and one more for larger).
    #[serde(default)]
    pub times: Vec<u64>,
    /// The largest queue depth (work waiting in the stage) seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u64>,
}

impl MinuteCounts {
    /// Counts one handler run that took `ms`.
    pub fn add_time(&mut self, ms: u64) {
        if self.times.is_empty() {
            self.times = vec![0; TIME_BUCKETS_MS.len() + 1];
        }
        let b = TIME_BUCKETS_MS
            .iter()
            .position(|le| ms <= *le)
            .unwrap_or(TIME_BUCKETS_MS.len());
        self.times[b] += 1;
    }

    /// Adds `o`'s counts (the depth: the larger).
    pub fn merge(&mut self, o: &MinuteCounts) {
        self.done += o.done;
        self.failed += o.failed;
        self.waited += o.waited;
        if self.times.len() < o.times.len() {
            self.times.resize(o.times.len(), 0);
        }
        for (a, b) in self.times.iter_mut().zip(&o.times) {
            *a += b;
        }
        self.depth = match (self.depth, o.depth) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    /// The handler time under which a share `p` of the runs ended: the bound of the bucket
    /// it falls in (none without runs; the largest bound for the open bucket).
    pub fn percentile_ms(&self, p: f64) -> Option<u64> {
        let total: u64 = self.times.iter().sum();
        if total == 0 {
            return None;
        }
        let want = ((total as f64) * p).ceil().max(1.0) as u64;
        let mut acc = 0;
        for (i, n) in self.times.iter().enumerate() {
            acc += n;
            if acc >= want {
                return Some(
                    TIME_BUCKETS_MS
                        .get(i)
                        .copied()
                        .unwrap_or(*TIME_BUCKETS_MS.last().unwrap_or(&0)),
                );
            }
        }
        None
    }
}

/// One stage's hour, as stored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Hour {
    start_ms: u64,
    /// By minute of the hour (0–59).
    minutes: BTreeMap<u8, MinuteCounts>,
}

fn slot_path(stage: &str, hour_start_ms: u64) -> String {
    let slot = (hour_start_ms / HOUR_MS) % HOURS_KEPT;
    format!("{STAGE_METRICS}/{stage}.{slot:02}")
}

fn minute_start(ms: u64) -> u64 {
    ms - ms % MINUTE_MS
}

/// What [`add`] could not write, and why: the caller keeps the counts for its next flush.
#[derive(Debug)]
pub struct Unwritten {
    pub error: crate::EngineError,
    pub counts: BTreeMap<u64, MinuteCounts>,
}

/// Adds `counts` (by minute start, ms) to `stage`'s hours in the store; minutes older than a
/// day are dropped. An hour is written whole or not at all.
pub async fn add(
    tree: &dyn Tree,
    stage: &str,
    counts: BTreeMap<u64, MinuteCounts>,
    now_ms: u64,
) -> std::result::Result<(), Unwritten> {
    let mut by_hour: BTreeMap<u64, BTreeMap<u64, MinuteCounts>> = BTreeMap::new();
    for (minute, c) in counts {
        if minute + HOURS_KEPT * HOUR_MS <= now_ms {
            continue;
        }
        by_hour
            .entry(minute - minute % HOUR_MS)
            .or_default()
            .insert(minute, c);
    }
    let mut error = None;
    let mut unwritten = BTreeMap::new();
    for (hour, minutes) in by_hour {
        if error.is_none() {
            match add_hour(tree, stage, hour, &minutes).await {
                Ok(()) => continue,
                Err(e) => error = Some(e),
            }
        }
        unwritten.extend(minutes);
    }
    match error {
        None => Ok(()),
        Some(error) => Err(Unwritten {
            error,
            counts: unwritten,
        }),
    }
}

async fn ensure_root(tree: &dyn Tree) -> Result<()> {
    if tree.exists(STAGE_METRICS).await?.is_some() {
        return Ok(());
    }
    match tree
        .create(STAGE_METRICS, None, CreateMode::Persistent)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.root(), TreeError::NodeExists(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn add_hour(
    tree: &dyn Tree,
    stage: &str,
    hour: u64,
    minutes: &BTreeMap<u64, MinuteCounts>,
) -> Result<()> {
    let path = slot_path(stage, hour);
    let mut last = None;
    for _ in 0..TRIES {
        let node = tree.get(&path).await?;
        let (mut h, version) = match &node {
            Some(n) => (
                n.data
                    .as_deref()
                    .and_then(|d| lading_core::json::from_bytes::<Hour>(d).ok())
                    .unwrap_or_default(),
                Some(n.stat.version),
            ),
            None => (Hour::default(), None),
        };
        if h.start_ms != hour {
            // The slot held the same hour of an earlier day (or nothing): it starts anew.
            if h.start_ms > hour {
                return Ok(());
            }
            h = Hour {
                start_ms: hour,
                minutes: BTreeMap::new(),
            };
        }
        for (minute, c) in minutes {
            let i = ((minute - hour) / MINUTE_MS) as u8;
            h.minutes.entry(i).or_default().merge(c);
        }
        let data = Some(serde_json::to_vec(&h).unwrap_or_default());
        let r = match version {
            Some(v) => tree.set(&path, data, Some(v)).await.map(|_| ()),
            None => tree
                .create(&path, data, CreateMode::Persistent)
                .await
                .map(|_| ()),
        };
        match r {
            Ok(()) => return Ok(()),
            // The first hour ever written: the folder is made (looked for only then, not at
            // every flush of every stage).
            Err(e) if version.is_none() && matches!(e.root(), TreeError::NoNode(_)) => {
                ensure_root(tree).await?;
                last = Some(e)
            }
            // Another process wrote it meanwhile: read it again and add to that.
            Err(e)
                if matches!(
                    e.root(),
                    TreeError::BadVersion { .. } | TreeError::NodeExists(_)
                ) =>
            {
                last = Some(e)
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(last.map_or_else(|| TreeError::NoNode(path).into(), Into::into))
}

/// One stage's figures over a stretch of time (a minute, an hour, the last hour, the day).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Figures {
    pub start_ms: u64,
    pub done: u64,
    pub failed: u64,
    pub waited: u64,
    /// Handler time under which half the runs ended (the bound of its histogram bucket).
    pub p50_ms: Option<u64>,
    pub p95_ms: Option<u64>,
    /// The largest queue depth seen (none where no process of the stage looked).
    pub depth: Option<u64>,
}

impl Figures {
    fn of(start_ms: u64, c: &MinuteCounts) -> Figures {
        Figures {
            start_ms,
            done: c.done,
            failed: c.failed,
            waited: c.waited,
            p50_ms: c.percentile_ms(0.5),
            p95_ms: c.percentile_ms(0.95),
            depth: c.depth,
        }
    }
}

/// One stage's last hour (by minute) and last day (by hour), with the totals of each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StageSeries {
    pub stage: String,
    /// The last 60 minutes, oldest first (the last is the minute under way).
    pub minutes: Vec<Figures>,
    /// The last 24 hours, oldest first (the last is the hour under way).
    pub hours: Vec<Figures>,
    pub last_hour: Figures,
    pub last_day: Figures,
}

/// Every stage's series at `now_ms`, by stage name.
pub async fn read(tree: &dyn Tree, now_ms: u64) -> Result<Vec<StageSeries>> {
    let names = match tree.children(STAGE_METRICS).await {
        Ok(n) => n,
        Err(e) if matches!(e.root(), TreeError::NoNode(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let paths: Vec<String> = names
        .iter()
        .map(|n| format!("{STAGE_METRICS}/{n}"))
        .collect();
    let nodes = tree.get_many(&paths).await?;
    // Every stored minute of the last day, by stage and minute start.
    let mut stages: BTreeMap<String, BTreeMap<u64, MinuteCounts>> = BTreeMap::new();
    let (this_minute, this_hour) = (minute_start(now_ms), now_ms - now_ms % HOUR_MS);
    let day_from = this_hour + HOUR_MS - HOURS_KEPT * HOUR_MS;
    for (name, node) in names.iter().zip(nodes) {
        let Some((stage, _slot)) = name.rsplit_once('.') else {
            continue;
        };
        let Some(h) = node
            .and_then(|n| n.data)
            .and_then(|d| lading_core::json::from_bytes::<Hour>(&d).ok())
        else {
            continue;
        };
        if h.start_ms < day_from || h.start_ms > this_hour {
            continue;
        }
        let s = stages.entry(stage.to_string()).or_default();
        for (i, c) in h.minutes {
            s.insert(h.start_ms + u64::from(i) * MINUTE_MS, c);
        }
    }
    let hour_from = this_minute + MINUTE_MS - 60 * MINUTE_MS;
    Ok(stages
        .into_iter()
        .map(|(stage, minutes)| {
            let sum = |from: u64, to: u64| {
                let mut c = MinuteCounts::default();
                for m in minutes.range(from..to).map(|(_, m)| m) {
                    c.merge(m);
                }
                c
            };
            let per_minute = (0..60)
                .map(|i| {
                    let start = hour_from + i * MINUTE_MS;
                    Figures::of(start, &sum(start, start + MINUTE_MS))
                })
                .collect();
            let per_hour = (0..HOURS_KEPT)
                .map(|i| {
                    let start = day_from + i * HOUR_MS;
                    Figures::of(start, &sum(start, start + HOUR_MS))
                })
                .collect();
            StageSeries {
                last_hour: Figures::of(hour_from, &sum(hour_from, u64::MAX)),
                last_day: Figures::of(day_from, &sum(day_from, u64::MAX)),
                minutes: per_minute,
                hours: per_hour,
                stage,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_the_bounds_of_the_buckets_they_fall_in() {
        let mut c = MinuteCounts::default();
        assert_eq!(c.percentile_ms(0.5), None);
        for ms in [1, 2, 3, 40, 40, 40, 40, 40, 40, 90_000] {
            c.add_time(ms);
        }
        assert_eq!(c.percentile_ms(0.5), Some(50));
        assert_eq!(c.percentile_ms(0.95), Some(300_000));
        let mut d = MinuteCounts {
            depth: Some(3),
            ..Default::default()
        };
        d.merge(&c);
        assert_eq!((d.times.iter().sum::<u64>(), d.depth), (10, Some(3)));
    }
}
