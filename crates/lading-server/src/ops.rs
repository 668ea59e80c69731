//! What an operator does to a Lading service — submit, look, administer, follow a batch —
//! the same whether the command line opened the store itself ([`Local`]) or talks to a
//! `lading serve` (`lading_node::client::Client`): one trait, two implementations, the API's typed answers
//! ([`crate::api`]). The HTTP handlers of the admin verbs call [`Local`] too, so a verb is
//! written once.

use crate::api::{
    ActionResult, BatchAction, CollectionHold, JobAction, QueuePause, Refusal,
    RequeueFailedRequest, Requeued, SubmitRequest, Submitted,
};
use lading_core::JobState;
use lading_core::layout::{AccessId, AccessQueue, BatchId, JobId, QUEUE_NAMES};
use lading_engine::{
    AccessInfo, BatchInfo, ChangeEvent, EngineError, JobInfo, OutboxItem, Summary,
};
use lading_ingest::Ingest;
pub use lading_ingest::deletion::Deletion;
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// Why an operator verb on a store this process opened ([`Local`]) was refused or failed:
/// the error of the layer that said so, kept typed, so that the API maps its status and the
/// command line its exit code from the variant.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Submit(#[from] lading_ingest::SubmitError),
    #[error(transparent)]
    Api(#[from] crate::ApiError),
    #[error(transparent)]
    BadId(#[from] lading_core::layout::BadId),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A verb this way of running cannot do; the text says what to do instead.
    #[error("{0}")]
    Unsupported(&'static str),
}

type Result<T, E = OpsError> = std::result::Result<T, E>;

/// A deletion verb ([`Ops::deletion`]).
#[derive(Debug, Clone)]
pub enum DeletionVerb {
    Request {
        ark: String,
        version: Option<u32>,
        reason: String,
    },
    Approve(String),
    Cancel(String),
    /// Every deletion (of one object).
    List(Option<String>),
    Show(String),
}

/// The operator's verbs. Errors keep their type (an [`EngineError`], a
/// `lading_node::client::HttpError`, …) so the command line can pick its exit code.
#[allow(async_fn_in_trait)]
pub trait Ops {
    /// What a refusal or failure is: [`OpsError`] on a store this process opened; the
    /// client's own errors over HTTP.
    type Error: From<OpsError> + From<serde_json::Error> + std::fmt::Debug + std::fmt::Display;

    /// Submits a batch. Through a server, a `payload_url` without `://` is a local file,
    /// uploaded.
    async fn submit(&self, req: SubmitRequest) -> Result<Submitted, Self::Error>;
    /// Jobs and batches per state, paused queues, the outbox, foreign locks.
    async fn summary(&self) -> Result<Summary, Self::Error>;
    /// A batch, by `bid…` or its uuid.
    async fn batch(&self, id: &str) -> Result<BatchInfo, Self::Error>;
    async fn job(&self, id: &JobId) -> Result<JobInfo, Self::Error>;
    /// An access request (`qid…`), in whichever queue it is.
    async fn access(&self, id: &AccessId) -> Result<AccessInfo, Self::Error>;
    async fn job_action(
        &self,
        id: &JobId,
        act: JobAction,
        to: Option<&str>,
    ) -> Result<ActionResult, Self::Error>;
    async fn batch_action(
        &self,
        id: &BatchId,
        action: BatchAction,
    ) -> Result<ActionResult, Self::Error>;
    /// Every Failed job of a batch back to the stage it failed at (or `req.to`).
    async fn requeue_failed(
        &self,
        id: &BatchId,
        req: RequeueFailedRequest,
    ) -> Result<Requeued, Self::Error>;
    async fn collection(&self, name: &str, hold: bool) -> Result<CollectionHold, Self::Error>;
    async fn queue(&self, name: &str, pause: bool) -> Result<QueuePause, Self::Error>;
    async fn outbox(&self) -> Result<Vec<OutboxItem>, Self::Error>;
    async fn retry_outbox(&self, name: &str) -> Result<(), Self::Error>;
    async fn clear_lock(&self, kind: &str, name: &str) -> Result<(), Self::Error>;
    /// A page of the jobs a filter selects (`GET /api/v1/jobs`).
    async fn find_jobs(
        &self,
        filter: &crate::bulk::JobFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<crate::api::JobRowPage, Self::Error>;
    /// How many jobs a filter selects.
    async fn count_jobs(
        &self,
        filter: &crate::bulk::JobFilter,
    ) -> Result<crate::bulk::JobCount, Self::Error>;
    /// A bulk operation, run to its end: its outcome as the audit log records it.
    async fn bulk(
        &self,
        req: crate::bulk::BulkRequest,
    ) -> Result<lading_engine::audit::AdminOperation, Self::Error>;
    /// The changes of a batch and its jobs from now on.
    async fn changes(&self, batch: &BatchId) -> Result<Changes, Self::Error>;
    /// The copies of what a job stored, per version and storage node.
    async fn copies(
        &self,
        job: &JobId,
    ) -> Result<Vec<lading_ingest::inventory::NodeCopies>, Self::Error>;
    /// Deletion requests: ask, approve, cancel, list, show. Through a server only (who asked
    /// and who approved are token names); the answer is the deletions the verb touched.
    async fn deletion(&self, verb: DeletionVerb) -> Result<Vec<Deletion>, Self::Error>;

    /// A record as the API shows it: the summary (no id), a job (`jid…`), an access
    /// request (`qid…`) or a batch (`bid…` or its uuid), with its history expanded.
    async fn record(&self, id: Option<&str>) -> Result<Value, Self::Error> {
        Ok(match id {
            None => serde_json::to_value(self.summary().await?)?,
            Some(id) if id.starts_with(JobId::PREFIX) => {
                let id = JobId::parse(id).map_err(OpsError::from)?;
                let mut v = serde_json::to_value(self.job(&id).await?)?;
                // Where its version's copies are and how they were last found (the
                // inventory's; a token that may not read it sees the job alone).
                if let Ok(c) = self.copies(&id).await
                    && !c.is_empty()
                {
                    v["copies"] = serde_json::to_value(c)?;
                }
                v
            }
            Some(id) if id.starts_with(AccessId::PREFIX) => {
                let id = AccessId::parse(id).map_err(OpsError::from)?;
                serde_json::to_value(self.access(&id).await?)?
            }
            Some(id) => serde_json::to_value(self.batch(id).await?)?,
        })
    }
}

/// The verbs on a store this process opened.
#[derive(Clone)]
pub struct Local(pub Arc<Ingest>);

fn parse_state(name: Option<&str>) -> Result<Option<JobState>> {
    Ok(name
        .map(|s| JobState::parse_named(s).map_err(EngineError::Invalid))
        .transpose()?)
}

impl Ops for Local {
    type Error = OpsError;

    async fn copies(&self, job: &JobId) -> Result<Vec<lading_ingest::inventory::NodeCopies>> {
        let j = job.to_string();
        Ok(self
            .0
            .inventory
            .run(move |i| i.job_copies(&j))
            .await
            .map_err(|e| crate::ApiError::internal(format!("inventory: {e}")))?)
    }

    async fn submit(&self, req: SubmitRequest) -> Result<Submitted> {
        let url = req.payload_url.clone().unwrap_or_default();
        let submitter = req
            .submitter
            .clone()
            .unwrap_or_else(|| std::env::var("USER").unwrap_or("lading".into()));
        let sub = req.into_submission(submitter, url, Default::default());
        let bid = lading_ingest::submit(&self.0, &sub).await?;
        Ok(Submitted::pending(&bid, None))
    }

    async fn summary(&self) -> Result<Summary> {
        let mut s = self.0.engine.summary().await?;
        // The inventory's fixity figures, when it can be read (the queue's counts do not
        // wait on it).
        match self.0.inventory.run(|i| i.fixity_summary()).await {
            Ok(f) if f.copies > 0 => s.fixity = Some(f),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "status: no fixity figures"),
        }
        Ok(s)
    }

    async fn batch(&self, id: &str) -> Result<BatchInfo> {
        let e = &self.0.engine;
        let bid = e.find_batch(id).await?.ok_or_else(|| {
            EngineError::NoBatch(format!("{id} (no batch, job, access id or batch uuid)"))
        })?;
        let mut b = e.batch(&bid).await?;
        lading_engine::expand_history(&mut b.status.extra);
        Ok(b)
    }

    async fn job(&self, id: &JobId) -> Result<JobInfo> {
        let mut j = self.0.engine.job(id).await?;
        lading_engine::expand_history(&mut j.status.extra);
        Ok(j)
    }

    async fn access(&self, aid: &AccessId) -> Result<AccessInfo> {
        let e = &self.0.engine;
        let mut info = match e.access(AccessQueue::Small, aid).await {
            Err(EngineError::NoAccess(_)) => e.access(AccessQueue::Large, aid).await?,
            r => r?,
        };
        // A request made before digests were kept holds its secret: never shown.
        info.token.secret = None;
        Ok(info)
    }

    async fn job_action(
        &self,
        jid: &JobId,
        act: JobAction,
        to: Option<&str>,
    ) -> Result<ActionResult> {
        let e = &self.0.engine;
        if to.is_some() && act != JobAction::Requeue {
            return Err(EngineError::Invalid("\"to\" applies to requeue only".into()).into());
        }
        let st = match act {
            JobAction::Hold => Some(e.hold_job(jid).await?),
            JobAction::Release => Some(e.release_job(jid).await?),
            JobAction::Requeue => Some(e.requeue_job(jid, parse_state(to)?).await?),
            JobAction::Delete => e.delete_job(jid).await?,
        };
        Ok(ActionResult {
            id: jid.to_string(),
            purged: st.is_none(),
            status: st.map(|s| s.status.to_string()),
        })
    }

    async fn batch_action(&self, bid: &BatchId, action: BatchAction) -> Result<ActionResult> {
        let e = &self.0.engine;
        let st = match action {
            BatchAction::Hold => e.hold_batch(bid).await?,
            BatchAction::Release => e.release_batch(bid).await?,
            BatchAction::Delete => e.delete_batch(bid).await?,
            BatchAction::UpdateReporting => e.update_reporting(bid).await?,
        };
        Ok(ActionResult {
            id: bid.to_string(),
            status: Some(st.status.to_string()),
            purged: false,
        })
    }

    async fn requeue_failed(&self, bid: &BatchId, req: RequeueFailedRequest) -> Result<Requeued> {
        let (stage, to) = (
            parse_state(req.stage.as_deref())?,
            parse_state(req.to.as_deref())?,
        );
        let mut out = Requeued {
            id: bid.to_string(),
            requeued: Vec::new(),
            refused: Vec::new(),
        };
        for (jid, r) in self.0.engine.requeue_failed(bid, stage, to).await? {
            match r {
                Ok(st) => out.requeued.push(ActionResult {
                    id: jid.to_string(),
                    status: Some(st.status.to_string()),
                    purged: false,
                }),
                Err(err) => {
                    let api = crate::ApiError::from(err);
                    out.refused.push(Refusal {
                        id: jid.to_string(),
                        error: api.message,
                        kind: api.kind.to_string(),
                    });
                }
            }
        }
        Ok(out)
    }

    async fn collection(&self, name: &str, hold: bool) -> Result<CollectionHold> {
        let e = &self.0.engine;
        if hold {
            let changed = e.hold_collection(name).await?;
            return Ok(CollectionHold {
                collection: name.into(),
                held: true,
                changed,
                released: None,
            });
        }
        let was_held = e.collection_held(name).await?;
        let n = e.release_collection(name).await?;
        Ok(CollectionHold {
            collection: name.into(),
            held: false,
            changed: was_held || n > 0,
            released: Some(n),
        })
    }

    async fn queue(&self, name: &str, pause: bool) -> Result<QueuePause> {
        // An unknown queue is unknown (404, exit 3), like an unknown job or batch.
        if !QUEUE_NAMES.contains(&name) {
            return Err(crate::ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                "not_found",
                format!("no queue {name:?} (one of: {})", QUEUE_NAMES.join(", ")),
            )
            .into());
        }
        let e = &self.0.engine;
        let changed = if pause {
            e.pause_queue(name).await?
        } else {
            e.resume_queue(name).await?
        };
        Ok(QueuePause {
            queue: name.into(),
            paused: pause,
            changed,
        })
    }

    async fn outbox(&self) -> Result<Vec<OutboxItem>> {
        Ok(self.0.engine.outbox().await?)
    }

    async fn retry_outbox(&self, name: &str) -> Result<()> {
        self.0.engine.retry_effect(name).await?;
        Ok(())
    }

    async fn clear_lock(&self, kind: &str, name: &str) -> Result<()> {
        Ok(self.0.engine.clear_foreign_lock(kind, name).await?)
    }

    async fn find_jobs(
        &self,
        filter: &crate::bulk::JobFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<crate::api::JobRowPage> {
        let f = filter.clone().check()?;
        Ok(crate::bulk::rows(&self.0.engine, &f, after, limit.clamp(1, 1000)).await?)
    }

    async fn count_jobs(&self, filter: &crate::bulk::JobFilter) -> Result<crate::bulk::JobCount> {
        Ok(crate::bulk::count(&self.0.engine, &filter.clone().check()?).await?)
    }

    async fn bulk(
        &self,
        req: crate::bulk::BulkRequest,
    ) -> Result<lading_engine::audit::AdminOperation> {
        // On the store, as the operating system's user (a server records the token's name).
        let who = std::env::var("USER").unwrap_or_else(|_| "lading".into());
        let p = crate::bulk::prepare(&self.0, &who, req).await?;
        Ok(crate::bulk::run(&self.0, p).await)
    }

    async fn deletion(&self, _verb: DeletionVerb) -> Result<Vec<Deletion>> {
        Err(OpsError::Unsupported(
            "deletions go through a server (--server with an admin token): who asks and who \
             approves are the tokens' names, and a second admin must approve",
        ))
    }

    async fn changes(&self, batch: &BatchId) -> Result<Changes> {
        Ok(Changes::Local {
            events: self.0.engine.subscribe(),
            batch: batch.to_string(),
        })
    }
}

/// Longest server-sent event a client keeps while waiting for its end.
const MAX_EVENT: usize = 64 << 10;

/// A state change of a batch or one of its jobs.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Change {
    /// `batch` or `job`.
    pub kind: String,
    pub id: String,
    pub to: String,
}

/// The changes of one batch: this process's own commits ([`Local`]; other processes'
/// changes are not seen, so read the state again when it is quiet), or a server's event
/// stream.
pub enum Changes {
    Local {
        events: tokio::sync::broadcast::Receiver<ChangeEvent>,
        batch: String,
    },
    Remote {
        resp: reqwest::Response,
        buf: String,
        /// Parsed and not yet given out; `None` is a reset.
        ready: VecDeque<Option<Change>>,
    },
    /// The stream ended: nothing more comes.
    Ended,
}

impl Changes {
    /// How long to wait for a change before reading the state again anyway.
    pub fn quiet(&self) -> Duration {
        match self {
            Changes::Remote { .. } => Duration::from_secs(5),
            _ => Duration::from_secs(1),
        }
    }

    /// The next change; `None` when some may have been missed (read the state again). Once
    /// the stream has ended this waits forever.
    pub async fn next(&mut self) -> Option<Change> {
        loop {
            match self {
                Changes::Ended => std::future::pending::<()>().await,
                Changes::Local { events, batch } => match events.recv().await {
                    Ok(ev)
                        if (ev.kind == lading_engine::ChangeKind::Batch && ev.id == *batch)
                            || ev.batch.as_deref() == Some(batch.as_str()) =>
                    {
                        return Some(Change {
                            kind: ev.kind.to_string(),
                            id: ev.id,
                            to: ev.to,
                        });
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return None,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        *self = Changes::Ended;
                        return None;
                    }
                },
                Changes::Remote { resp, buf, ready } => {
                    if let Some(c) = ready.pop_front() {
                        return c;
                    }
                    match resp.chunk().await {
                        Ok(Some(chunk)) => {
                            buf.push_str(&String::from_utf8_lossy(&chunk));
                            while let Some(i) = buf.find("\n\n") {
                                let block: String = buf.drain(..i + 2).collect();
                                ready.extend(sse_block(&block));
                            }
                            // An event that never ends is not one: dropped, and read as a
                            // reset (everything is read again).
                            if buf.len() > MAX_EVENT {
                                buf.clear();
                                ready.push_back(None);
                            }
                        }
                        Ok(None) | Err(_) => {
                            *self = Changes::Ended;
                            return None;
                        }
                    }
                }
            }
        }
    }
}

/// The changes one server-sent event carries: a reset (`None`), a change, or nothing (a
/// comment, a keep-alive).
fn sse_block(block: &str) -> Option<Option<Change>> {
    let mut event = "";
    let mut data = String::new();
    for line in block.lines() {
        if let Some(e) = line.strip_prefix("event:") {
            event = e.trim();
        } else if let Some(d) = line.strip_prefix("data:") {
            data.push_str(d.trim());
        }
    }
    match event {
        "reset" => Some(None),
        "change" => serde_json::from_str(&data).ok().map(Some),
        _ => None,
    }
}

/// Reads what a batch's jobs are at: the jobs in its completed and failed folders from the
/// folder's name, the others one by one (all of them when `all`, else only those not in
/// `known` yet).
pub async fn job_states<O: Ops>(
    ops: &O,
    batch: &BatchInfo,
    known: &mut std::collections::HashMap<String, String>,
    all: bool,
) -> Result<(), O::Error> {
    for (folder, ids) in &batch.jobs {
        for j in ids {
            let st = match folder.as_str() {
                "batch-completed" => "Completed".to_string(),
                "batch-failed" => "Failed".to_string(),
                "batch-deleted" => "Deleted".to_string(),
                _ if !all && known.contains_key(j.as_str()) => continue,
                _ => match ops.job(j).await {
                    Ok(job) => job.status.status.name().to_string(),
                    // Gone between the two reads: the next read places it.
                    Err(_) => continue,
                },
            };
            known.insert(j.to_string(), st);
        }
    }
    Ok(())
}

/// The report `submit --wait` ends with: the batch's state and message, then each job
/// (id order) with its state, primary identifier and message.
pub async fn report<O: Ops>(ops: &O, batch: &str) -> Result<(BatchInfo, String), O::Error> {
    let b = ops.batch(batch).await?;
    let mut ids: Vec<&JobId> = b.jobs.values().flatten().collect();
    ids.sort();
    let message = |m: &Option<String>| m.clone().unwrap_or_default();
    let mut out = format!(
        "batch {}: {}{}\n",
        b.id,
        b.status.status,
        b.status
            .message
            .as_deref()
            .filter(|m| !m.is_empty())
            .map(|m| format!(" ({m})"))
            .unwrap_or_default()
    );
    for j in ids {
        let job = ops.job(j).await?;
        out.push_str(&format!(
            "  {}  {:<10} {}  {}\n",
            job.id,
            job.status.status.name(),
            job.identifiers.primary_id.as_deref().unwrap_or("-"),
            message(&job.status.message)
        ));
    }
    Ok((b, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(body: String) -> Changes {
        let resp = axum::http::Response::new(body);
        Changes::Remote {
            resp: reqwest::Response::from(resp),
            buf: String::new(),
            ready: VecDeque::new(),
        }
    }

    #[tokio::test]
    async fn a_servers_event_stream_reads_as_changes_resets_and_bounded_events() {
        let change = r#"{"kind":"job","id":"jid0000000001","to":"Storing","from":"Processing"}"#;
        let mut c = remote(format!(
            ": keep-alive\n\nevent: change\nid: 7\ndata: {change}\n\nevent: reset\ndata: missed\n\n"
        ));
        let first = c.next().await.expect("a change");
        assert_eq!((first.kind.as_str(), first.to.as_str()), ("job", "Storing"));
        assert!(c.next().await.is_none(), "a reset reads as None");
        assert!(c.next().await.is_none(), "the end of the stream too");
        assert!(matches!(c, Changes::Ended));
        // An event that never ends is dropped past the bound, read as a reset.
        let mut c = remote(format!(
            "event: change\ndata: {}",
            "x".repeat(MAX_EVENT + 10)
        ));
        assert!(c.next().await.is_none());
        match &c {
            Changes::Remote { buf, .. } => assert!(buf.is_empty(), "nothing of it kept"),
            _ => panic!("the stream has not ended yet"),
        }
    }
}
