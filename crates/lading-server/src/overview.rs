//! `GET /api/v1/overview`: what the console's first page shows beside the counts — jobs
//! completed and failed per minute over the last hour, how long each state's longest-waiting
//! job has been in it, and the held collections.
//!
//! The per-minute figures are every host's: they are counted from the transitions the event
//! hub follows (the tree's change stream), and on start the last hour is read back from the
//! jobs' histories, so a restart does not empty the chart. Each transition is counted once:
//! the follower reports those from a given second on (`live_from`), the reading back counts
//! those before it, and in the few seconds after it, which both may see, a transition is
//! known by its job, time and end state.

use crate::{Admin, ApiError, AppState};
use axum::Json;
use axum::extract::State;
use lading_engine::{ChangeEvent, ChangeKind, Engine};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// The chart's span, in minutes.
pub const MINUTES: u64 = 60;
const HOUR_MS: u64 = MINUTES * 60_000;
/// The seconds after `live_from` that both the follower and the reading back may see (the
/// follower starts within two seconds of it). A job that ends twice the same way within one
/// second of this overlap is counted once.
const OVERLAP_MS: u64 = 3_000;
/// How long the oldest ages are reused before the tree is read again.
const OLDEST_TTL: Duration = Duration::from_secs(5);

/// Jobs that ended (Completed or Failed) per minute in the last hour, and the oldest ages as
/// last read.
pub struct Tally {
    /// Minute start (ms) → (completed, failed).
    ended: Mutex<BTreeMap<u64, (u64, u64)>>,
    /// Transitions from this time on (ms) are counted as they come; those before it are read
    /// back.
    live_from: Mutex<u64>,
    /// From when the figures are complete (ms): the hour before `live_from` once it was read
    /// back, `live_from` until then.
    complete_from: Mutex<u64>,
    /// Transitions counted in the overlap: (time, job, failed?).
    overlap: Mutex<HashSet<(u64, String, bool)>>,
    oldest: tokio::sync::Mutex<Option<(Instant, OldestPerState)>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Tally {
    pub fn new(live_from_ms: u64) -> Tally {
        Tally {
            ended: Mutex::new(BTreeMap::new()),
            live_from: Mutex::new(live_from_ms),
            complete_from: Mutex::new(live_from_ms),
            overlap: Mutex::new(HashSet::new()),
            oldest: tokio::sync::Mutex::new(None),
        }
    }

    /// Where live counting starts (the follower's first second), before any event came.
    pub fn set_live_from(&self, ms: u64) {
        *lock(&self.live_from) = ms;
        *lock(&self.complete_from) = ms;
    }

    /// Counts a live transition (a job reaching Completed or Failed).
    pub fn note(&self, ev: &ChangeEvent, now_ms: u64) {
        self.count(ev, now_ms, true);
    }

    /// Whether a transition at `at` of `job` is counted: each source has its side of
    /// `live_from`, and in the overlap the first to see it.
    fn take(&self, at: u64, job: &str, failed: bool, live: bool) -> bool {
        let from = *lock(&self.live_from);
        if at < from {
            return !live;
        }
        if at >= from + OVERLAP_MS {
            return live;
        }
        lock(&self.overlap).insert((at, job.to_string(), failed))
    }

    fn count(&self, ev: &ChangeEvent, now_ms: u64, live: bool) {
        let failed = match (ev.kind, ev.to.as_str()) {
            (ChangeKind::Job, "Completed") => false,
            (ChangeKind::Job, "Failed") => true,
            _ => return,
        };
        // 0 (a time that is not one) is past the hour.
        let at = ev.time.ms();
        if at + HOUR_MS < now_ms || !self.take(at, &ev.id, failed, live) {
            return;
        }
        let mut e = lock(&self.ended);
        let c = e.entry(at / 60_000 * 60_000).or_default();
        if failed {
            c.1 += 1;
        } else {
            c.0 += 1;
        }
    }

    /// Reads the hour before live counting began back from the tree (in the background at
    /// start).
    pub async fn read_back(&self, engine: &Engine) {
        let live_from = *lock(&self.live_from);
        let since = live_from.saturating_sub(HOUR_MS);
        match engine.transitions_since(since, None).await {
            Ok(past) => {
                let now = engine.clock().now_ms();
                for (_, ev) in past {
                    self.count(&ev, now, false);
                }
                *lock(&self.complete_from) = since;
            }
            Err(e) => tracing::warn!("cannot read the last hour's transitions back: {e}"),
        }
    }

    /// Completed and failed jobs per minute, the last [`MINUTES`] minutes, oldest first (the
    /// last one is the minute under way).
    pub fn per_minute(&self, now_ms: u64) -> Vec<Minute> {
        let first = (now_ms / 60_000 + 1).saturating_sub(MINUTES) * 60_000;
        let mut e = lock(&self.ended);
        // Forget what is older than the chart.
        let keep = e.split_off(&first);
        *e = keep;
        (0..MINUTES)
            .map(|k| {
                let start = first + k * 60_000;
                let (completed, failed) = e.get(&start).copied().unwrap_or_default();
                Minute {
                    start_ms: start,
                    completed,
                    failed,
                }
            })
            .collect()
    }

    async fn oldest(&self, engine: &Engine) -> Result<OldestPerState, ApiError> {
        let mut cached = self.oldest.lock().await;
        if let Some((at, v)) = cached.as_ref()
            && at.elapsed() < OLDEST_TTL
        {
            return Ok(v.clone());
        }
        let v: OldestPerState = engine
            .oldest_per_state()
            .await?
            .into_iter()
            .map(|(st, o)| (st.name().to_string(), o))
            .collect();
        *cached = Some((Instant::now(), v.clone()));
        Ok(v)
    }
}

#[utoipa::path(get, path = "/api/v1/overview", tag = "admin", summary = "Jobs completed and failed per minute over the last hour (every host's), how long each state's longest-waiting job has been in it, and the held collections", responses((status = 200, description = "`per_minute`: 60 minutes, oldest first, each `start_ms`, `completed`, `failed`; `complete_from_ms`: from when the counts are complete (the last hour once read back after a start); `oldest`: per job state `since_ms` (null when empty) and `exact` (false when the state has more jobs than were read); `held_collections`: names", body = Overview), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub async fn overview(
    State(s): State<AppState>,
    Admin(_): Admin,
) -> Result<Json<Overview>, ApiError> {
    let engine = &s.ingest.engine;
    let now = engine.clock().now_ms();
    let tally = s.events.tally();
    let complete_from = *lock(&tally.complete_from);
    Ok(Json(Overview {
        now_ms: now,
        per_minute: tally.per_minute(now),
        complete_from_ms: complete_from,
        oldest: tally.oldest(engine).await?,
        held_collections: engine.held_collections().await?,
        dependencies: lading_engine::deps::published(engine).await,
    }))
}

#[utoipa::path(get, path = "/api/v1/dependencies", tag = "admin", summary = "The outside services work depends on and their health (SPEC §11): every storage node, the SMTP server, callback and payload hosts; each up or down since a time with the cause, the jobs waiting on it, and the processes that see it down", responses((status = 200, description = "the dependencies, by kind and name", body = Vec<lading_engine::deps::Health>), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub async fn dependencies(
    State(s): State<AppState>,
    Admin(_): Admin,
) -> Json<Vec<lading_engine::deps::Health>> {
    let engine = &s.ingest.engine;
    Json(lading_engine::deps::published(engine).await)
}

#[utoipa::path(get, path = "/api/v1/processes", tag = "admin", summary = "Every Lading process that announced itself (SPEC §12): host, pid, version with its commit, roles, stages with their concurrency, when it started and was last heard from, what it runs now; a process whose session ended is listed as gone (`alive` false) for a day, with what it ran when last heard from", responses((status = 200, description = "the processes, alive ones first", body = Vec<lading_engine::processes::ProcessInfo>), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub async fn processes(
    State(s): State<AppState>,
    Admin(_): Admin,
) -> Result<Json<Vec<lading_engine::processes::ProcessInfo>>, ApiError> {
    let tree = s.ingest.engine.tree().as_ref();
    Ok(Json(lading_engine::processes::list(tree).await?))
}

/// What `GET /api/v1/metrics/stages` answers.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StageMetrics {
    pub now_ms: u64,
    /// Per stage that ran in the last day (every process's runs), by stage name.
    pub stages: Vec<lading_engine::stage_metrics::StageSeries>,
}

#[utoipa::path(get, path = "/api/v1/metrics/stages", tag = "admin", summary = "Per stage, every process's handler runs kept in the store for a day (SPEC §12): per minute over the last hour and per hour over the last day, runs that moved the work on, failed and waited, handler time p50 and p95 (the bounds of histogram buckets), and the largest queue depth seen; with the totals of the hour and the day", responses((status = 200, description = "the stages' series", body = StageMetrics), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this")))]
pub async fn stage_metrics(
    State(s): State<AppState>,
    Admin(_): Admin,
) -> Result<Json<StageMetrics>, ApiError> {
    let e = &s.ingest.engine;
    let now_ms = e.clock().now_ms();
    let stages = lading_engine::stage_metrics::read(e.tree().as_ref(), now_ms).await?;
    Ok(Json(StageMetrics { now_ms, stages }))
}

/// Per job state, how long its longest-waiting job has been in it.
type OldestPerState = BTreeMap<String, lading_engine::Oldest>;

/// What `GET /api/v1/overview` answers.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Overview {
    pub now_ms: u64,
    /// The last 60 minutes, oldest first (the last is the minute under way).
    pub per_minute: Vec<Minute>,
    /// From when the counts are complete (the last hour once read back after a start).
    pub complete_from_ms: u64,
    /// Per job state, how long its longest-waiting job has been in it.
    pub oldest: BTreeMap<String, lading_engine::Oldest>,
    pub held_collections: Vec<String>,
    /// The outside services work depends on, and their health.
    #[serde(default)]
    pub dependencies: Vec<lading_engine::deps::Health>,
}

/// Jobs that completed and failed in one minute (every host's).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Minute {
    pub start_ms: u64,
    pub completed: u64,
    pub failed: u64,
}
