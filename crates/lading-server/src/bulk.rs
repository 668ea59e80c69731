//! Finding jobs and acting on many at once (SPEC §12): a [`JobFilter`] (a state, and the
//! collection, profile, submitter, batch, id/ARK/local id/title, message text, failed stage,
//! failure kind and age a job must have), the scan that pages through a state's jobs applying
//! it, the count an admin confirms, and the bulk operation that requeues, holds, releases or
//! deletes what it selects — at most the confirmed count — recorded in the audit log
//! (`lading_engine::audit`) with its progress and outcome.

use crate::api::JobAction;
use crate::{ApiError, AppState};
use lading_core::JobState;
use lading_core::layout::JobId;
use lading_engine::audit::{self, AdminOperation};
use lading_engine::{Engine, EngineError, JobInfo};
use lading_ingest::Ingest;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

type Result<T> = std::result::Result<T, ApiError>;

/// A filter field's text, trimmed; none when blank.
fn trimmed(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|t| !t.is_empty())
}

/// Longest text a filter field may hold.
const MAX_FIELD: usize = 200;
/// Job references read per page of a scan.
const SCAN_PAGE: usize = 500;
/// Most jobs a count (or a bulk operation) looks at.
pub const MAX_SCANNED: u64 = 200_000;
/// A bulk operation's progress is written every this many jobs.
const PROGRESS_EVERY: u64 = 50;

/// Which jobs: a state, and what else they must match (every field given must).
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct JobFilter {
    /// The job state (`Failed`, `Pending`, …).
    pub state: String,
    /// The collection (its mnemonic) the job deposits into.
    pub collection: Option<String>,
    /// The profile the job was submitted with.
    pub profile: Option<String>,
    /// The submitter (token name) of the job.
    pub submitter: Option<String>,
    /// The batch (`bid…`).
    pub batch: Option<String>,
    /// Id, ARK, local id or title containing this (case-insensitive).
    pub q: Option<String>,
    /// The status message containing this (case-insensitive).
    pub message: Option<String>,
    /// Failed jobs: the stage they failed at.
    pub stage: Option<String>,
    /// Failed jobs: `fatal` or `exhausted` (retries used up).
    pub failure_kind: Option<String>,
    /// Last changed at least this many minutes ago.
    pub older_than_min: Option<u64>,
}

/// A [`JobFilter`] checked: its state parsed, its texts bounded and lower-cased.
#[derive(Debug, Clone)]
pub struct Filter {
    pub state: JobState,
    pub given: JobFilter,
    lower: [Option<String>; 2],
}

fn field<'a>(name: &str, v: &'a Option<String>) -> Result<Option<&'a str>> {
    match v.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(t) if t.len() > MAX_FIELD => Err(ApiError::bad_request(format!(
            "{name} is {} bytes long; at most {MAX_FIELD}",
            t.len()
        ))),
        Some(t) => Ok(Some(t)),
    }
}

impl JobFilter {
    /// Checks the filter: a known state, a known failure kind, texts of bounded length.
    pub fn check(self) -> Result<Filter> {
        let state = JobState::parse_named(&self.state).map_err(ApiError::bad_request)?;
        for (name, v) in [
            ("collection", &self.collection),
            ("profile", &self.profile),
            ("submitter", &self.submitter),
            ("batch", &self.batch),
            ("stage", &self.stage),
        ] {
            field(name, v)?;
        }
        if let Some(k) = field("failure_kind", &self.failure_kind)?
            && !matches!(k, "fatal" | "exhausted")
        {
            return Err(ApiError::bad_request(format!(
                "unknown failure_kind {k:?} (fatal or exhausted)"
            )));
        }
        let lower = [
            field("q", &self.q)?.map(str::to_lowercase),
            field("message", &self.message)?.map(str::to_lowercase),
        ];
        Ok(Filter {
            state,
            given: self,
            lower,
        })
    }
}

/// Whether any of `fields` of `obj` (strings, or arrays of strings) contains `needle`
/// (already lower-case).
pub(crate) fn any_field_contains(obj: &Value, fields: &[&str], needle: &str) -> bool {
    fields.iter().any(|f| match &obj[*f] {
        Value::String(v) => v.to_lowercase().contains(needle),
        Value::Array(a) => a.iter().any(|v| {
            v.as_str()
                .is_some_and(|v| v.to_lowercase().contains(needle))
        }),
        _ => false,
    })
}

fn same(want: Option<&str>, have: Option<&str>) -> bool {
    want.is_none_or(|w| have.is_some_and(|h| h.eq_ignore_ascii_case(w)))
}

impl Filter {
    /// Whether the filter needs the job's record (anything beyond its state and id).
    fn needs_record(&self) -> bool {
        let g = &self.given;
        [
            &g.collection,
            &g.profile,
            &g.submitter,
            &g.batch,
            &g.message,
            &g.stage,
            &g.failure_kind,
        ]
        .iter()
        .any(|v| v.as_deref().is_some_and(|t| !t.trim().is_empty()))
            || g.older_than_min.is_some()
            || self.lower[0].is_some()
    }

    /// Whether `info` matches, at `now_ms`.
    fn matches(&self, info: &JobInfo, now_ms: u64) -> bool {
        let g = &self.given;
        let cfg = info.configuration.typed().ok().cloned().unwrap_or_default();
        let st = &info.status;
        let id = info.id.as_str().to_lowercase();
        same(trimmed(&g.collection), cfg.collection.as_deref())
            && same(trimmed(&g.profile), cfg.profile())
            && same(trimmed(&g.submitter), cfg.submitter.as_deref())
            && same(trimmed(&g.batch), Some(info.bid.as_str()))
            && same(trimmed(&g.stage), lading_engine::failed_stage(st))
            && same(
                trimmed(&g.failure_kind),
                (self.state == JobState::Failed)
                    .then(|| lading_engine::failure_kind(st).unwrap_or("fatal")),
            )
            && self.lower[1].as_deref().is_none_or(|m| {
                st.message
                    .as_deref()
                    .is_some_and(|t| t.to_lowercase().contains(m))
            })
            && self.lower[0].as_deref().is_none_or(|n| {
                id.contains(n)
                    || (info.identifiers.primary_id.iter())
                        .chain(&info.identifiers.local_id)
                        .any(|v| v.to_lowercase().contains(n))
                    || ["erc_what", "title"].iter().any(|k| {
                        (info.metadata.get(k)).is_some_and(|v| v.to_lowercase().contains(n))
                    })
                    || any_field_contains(
                        info.configuration.raw(),
                        &["primary_id", "local_id", "erc_what", "title"],
                        n,
                    )
            })
            && g.older_than_min.is_none_or(|min| {
                lading_core::time::parse_ts(&st.last_modified)
                    .is_some_and(|at| at + min * 60_000 <= now_ms)
            })
    }
}

/// A page of a scan: the jobs that matched (with their records, when read), where the next
/// page starts, and how many references were looked at.
pub struct Scanned {
    pub jobs: Vec<(u8, JobId, Option<JobInfo>)>,
    pub next_after: Option<String>,
    pub scanned: u64,
}

/// Up to `limit` jobs matching `f` after the cursor `after` (`PP-JID`), looking at no more
/// than `max_scanned` references.
pub async fn scan(
    e: &Engine,
    f: &Filter,
    after: Option<&str>,
    limit: usize,
    max_scanned: u64,
) -> Result<Scanned> {
    let now = e.clock().now_ms();
    let mut out = Scanned {
        jobs: Vec::new(),
        next_after: after.map(str::to_string),
        scanned: 0,
    };
    while out.jobs.len() < limit && out.scanned < max_scanned {
        let want = if f.needs_record() {
            SCAN_PAGE
        } else {
            limit - out.jobs.len()
        };
        let page = e
            .list_jobs(f.state, out.next_after.as_deref(), want)
            .await?;
        let full = page.len() == want;
        for (prio, j) in page {
            out.scanned += 1;
            out.next_after = Some(format!("{prio:02}-{j}"));
            if !f.needs_record() {
                out.jobs.push((prio, j, None));
            } else {
                match e.job(&j).await {
                    Ok(info) if f.matches(&info, now) => out.jobs.push((prio, j, Some(info))),
                    Ok(_) | Err(EngineError::NoJob(_)) => {}
                    Err(err) => return Err(err.into()),
                }
            }
            if out.jobs.len() == limit || out.scanned == max_scanned {
                return Ok(out);
            }
        }
        if !full {
            out.next_after = None;
            break;
        }
    }
    Ok(out)
}

/// How many jobs a filter matches.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobCount {
    pub state: String,
    pub matched: u64,
    /// Job references looked at.
    pub scanned: u64,
    /// False when the scan stopped at its limit (200,000 jobs) before the state's end.
    pub complete: bool,
}

/// Counts the jobs `f` matches.
pub async fn count(e: &Engine, f: &Filter) -> Result<JobCount> {
    let s = scan(e, f, None, usize::MAX, MAX_SCANNED).await?;
    Ok(JobCount {
        state: f.state.name().into(),
        matched: s.jobs.len() as u64,
        scanned: s.scanned,
        complete: s.next_after.is_none(),
    })
}

/// What `POST /api/v1/jobs/bulk` takes.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    /// `requeue` (to the stage each failed at), `hold`, `release` or `delete`.
    pub action: String,
    pub filter: JobFilter,
    /// Act on at most this many jobs: the count the admin was shown and confirmed.
    pub max: u64,
}

/// A bulk operation checked and recorded as started (`who` asked), ready to [`run`].
pub struct Prepared {
    pub op: AdminOperation,
    action: JobAction,
    filter: Filter,
}

/// Checks a bulk request and records its operation as started.
pub async fn prepare(ingest: &Ingest, who: &str, req: BulkRequest) -> Result<Prepared> {
    let action = JobAction::parse(&req.action).ok_or_else(|| {
        ApiError::bad_request(format!(
            "unknown action {:?} ({})",
            req.action,
            JobAction::NAMES.join(", ")
        ))
    })?;
    if req.max == 0 {
        return Err(ApiError::bad_request(
            "max must be at least 1: the number of jobs confirmed",
        ));
    }
    let filter = req.filter.check()?;
    let e = &ingest.engine;
    let owner = e.owner().to_string();
    let (host, pid) = owner.rsplit_once(':').unwrap_or((owner.as_str(), ""));
    let mut op = AdminOperation {
        id: String::new(),
        who: who.to_string(),
        action: req.action.clone(),
        filter: serde_json::to_value(&filter.given).unwrap_or_default(),
        max: req.max,
        started_at_ms: e.clock().now_ms(),
        host: host.to_string(),
        pid: pid.parse().unwrap_or_else(|_| std::process::id()),
        state: "running".into(),
        matched: 0,
        done: 0,
        refused_count: 0,
        refused: Vec::new(),
        finished_at_ms: None,
    };
    op.id = audit::start(e.tree().as_ref(), &op).await?;
    Ok(Prepared { op, action, filter })
}

/// Starts a bulk operation as `who`; it runs on in this process, its progress in the audit
/// log. Returns its record as started.
pub async fn start(s: &AppState, who: &str, req: BulkRequest) -> Result<AdminOperation> {
    let p = prepare(&s.ingest, who, req).await?;
    let started = p.op.clone();
    let ingest = s.ingest.clone();
    tokio::spawn(async move {
        run(&ingest, p).await;
    });
    Ok(started)
}

/// The operations this process runs now, by id.
fn running_here() -> std::sync::MutexGuard<'static, std::collections::HashSet<String>> {
    static RUNNING: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<String>>> =
        std::sync::OnceLock::new();
    RUNNING
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Acts on each job the operation's filter selects, at most its `max`, writing progress as
/// it goes; returns its outcome.
pub async fn run(ingest: &Arc<Ingest>, p: Prepared) -> AdminOperation {
    let Prepared {
        mut op,
        action,
        filter: f,
    } = p;
    running_here().insert(op.id.clone());
    let e = &ingest.engine;
    let tree = e.tree().clone();
    let mut after: Option<String> = None;
    let mut scanned = 0;
    'pages: loop {
        let page = match scan(e, &f, after.as_deref(), SCAN_PAGE, MAX_SCANNED - scanned).await {
            Ok(p) => p,
            Err(err) => {
                op.refuse("", format!("the scan stopped: {}", err.message));
                break;
            }
        };
        scanned += page.scanned;
        for (_, j, _) in &page.jobs {
            if op.matched == op.max {
                break 'pages;
            }
            op.matched += 1;
            // The per-job action's own path (as `POST /api/v1/jobs/{id}/{action}`).
            let r = match action {
                JobAction::Hold => e.hold_job(j).await.map(|_| ()),
                JobAction::Release => e.release_job(j).await.map(|_| ()),
                JobAction::Requeue => e.requeue_job(j, None).await.map(|_| ()),
                JobAction::Delete => e.delete_job(j).await.map(|_| ()),
            };
            match r {
                Ok(()) => op.done += 1,
                Err(err) => op.refuse(j.as_str(), ApiError::from(err).message),
            }
            if op.matched.is_multiple_of(PROGRESS_EVERY) {
                let _ = audit::update(tree.as_ref(), &op).await;
            }
        }
        after = page.next_after;
        if after.is_none() || scanned >= MAX_SCANNED {
            break;
        }
    }
    op.state = "finished".into();
    op.finished_at_ms = Some(e.clock().now_ms());
    if let Err(err) = audit::update(tree.as_ref(), &op).await {
        tracing::warn!(operation = op.id, error = %err, "cannot record a bulk operation's outcome");
    }
    running_here().remove(&op.id);
    tracing::info!(
        operation = op.id,
        who = op.who,
        action = op.action,
        matched = op.matched,
        done = op.done,
        refused = op.refused_count,
        "bulk operation finished"
    );
    op
}

/// A page of the jobs `f` selects after `after`, as listed: Failed ones with how and where
/// they failed.
pub async fn rows(
    e: &Engine,
    f: &Filter,
    after: Option<&str>,
    limit: usize,
) -> Result<crate::api::JobRowPage> {
    let page = scan(e, f, after, limit, 500 + limit as u64).await?;
    let mut jobs = Vec::new();
    for (prio, j, info) in page.jobs {
        let mut row = crate::api::JobRow {
            id: j.to_string(),
            priority: prio,
            failure_kind: None,
            failed_stage: None,
            message: None,
        };
        if f.state == JobState::Failed {
            // What failed and how, so failures can be told apart at a glance.
            let st = match info {
                Some(info) => info.status,
                None => match e.job(&j).await {
                    Ok(info) => info.status,
                    Err(EngineError::NoJob(_)) => continue,
                    Err(err) => return Err(err.into()),
                },
            };
            row.failure_kind = Some(lading_engine::failure_kind(&st).unwrap_or("fatal").into());
            row.failed_stage = lading_engine::failed_stage(&st).map(str::to_string);
            row.message = st.message;
        }
        jobs.push(row);
    }
    Ok(crate::api::JobRowPage {
        state: f.state.name().into(),
        jobs,
        next_after: page.next_after,
    })
}

/// The audit log, newest first; an operation still `running` whose process is gone is
/// `interrupted`.
pub async fn log(e: &Engine, limit: usize) -> Result<Vec<AdminOperation>> {
    let tree = e.tree().as_ref();
    let mut ops = audit::list(tree, limit).await?;
    if ops.iter().any(|o| o.state == "running") {
        let alive: Vec<(String, u32)> = lading_engine::processes::list(tree)
            .await?
            .into_iter()
            .filter(|p| p.alive)
            .map(|p| (p.record.host, p.record.pid))
            .collect();
        for o in ops.iter_mut().filter(|o| o.state == "running") {
            let here = o.pid == std::process::id() && running_here().contains(&o.id);
            if !here && !alive.contains(&(o.host.clone(), o.pid)) {
                o.state = "interrupted".into();
            }
        }
    }
    Ok(ops)
}
