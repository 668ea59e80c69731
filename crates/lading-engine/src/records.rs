//! What the engine hands out and stores: the leases a worker holds on a job, a batch and an
//! access request, the fence beside a lease, per-object locks, and the records of a job, a
//! batch and an access request as read.

use crate::{Effect, Result, lost};
use lading_core::layout::*;
use lading_core::{JobState, Op, Recorded, Tree, TreeError, Watch};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// A job held by this worker.
#[derive(Debug, Clone)]
pub struct JobLease {
    pub job: JobId,
    pub batch: BatchId,
    pub status: JobStatus,
    pub priority: u8,
    /// Why a `Fail` moves the job, recorded with it: `fatal` (bad input, will not work) or
    /// `exhausted` (the stage's attempts ran out). Set by the worker before it fails the job.
    pub failure_kind: Option<&'static str>,
    /// Outside effects the job's next move causes: recorded in the outbox in that move's
    /// `multi`, delivered after it commits (see [`Effect`]).
    pub effects: Vec<Effect>,
    pub(crate) status_version: i32,
    pub(crate) session: u64,
    /// The job's whole record as read with the lease, until [`crate::Engine::leased_job`]
    /// takes it.
    pub(crate) record: Option<std::sync::Arc<Vec<Option<lading_core::Node>>>>,
}

impl JobLease {
    pub fn state(&self) -> JobState {
        self.status.status
    }
}

/// What fences a lease holder's own write beside its job (see `Engine::job_fence`): the
/// lease's session and the ops that check its lock.
#[derive(Debug, Clone)]
pub struct Fence {
    pub session: u64,
    pub ops: Vec<Op>,
}

impl Fence {
    /// `ops` after the fence's own, in one `multi` on the lease's session: `Err` is the lease
    /// lost (the fence failed or the session is gone), `Ok(Err)` the store's refusal of `ops`.
    pub async fn multi(
        &self,
        tree: &dyn Tree,
        what: &str,
        ops: Vec<Op>,
    ) -> Result<std::result::Result<Vec<lading_core::OpResult>, TreeError>> {
        let mut all = self.ops.clone();
        all.extend(ops);
        match tree.multi_on(self.session, all).await {
            Ok(r) => Ok(Ok(r)),
            Err(e)
                if e.failed_op().is_some_and(|i| i < self.ops.len())
                    || matches!(e.root(), TreeError::SessionExpired) =>
            {
                Err(lost(what))
            }
            Err(e) => Ok(Err(e)),
        }
    }
}

/// A batch held by this worker.
#[derive(Debug, Clone)]
pub struct BatchLease {
    pub batch: BatchId,
    pub status: BatchStatus,
    /// Outside effects the batch's next move causes, recorded in that move's `multi`.
    pub effects: Vec<Effect>,
    /// A `status-report` written in the batch's next move's `multi` (a report exists only
    /// for a move that committed).
    pub report: Option<StatusReport>,
    pub(crate) status_version: i32,
    pub(crate) session: u64,
}

/// An access request held by this worker.
#[derive(Debug, Clone)]
pub struct AccessLease {
    pub queue: AccessQueue,
    pub id: AccessId,
    pub status: AccessStatus,
    pub token: lading_core::layout::AccessToken,
    /// Why the token could not be read (the request is taken so that it fails, named, rather
    /// than being skipped for ever).
    pub unreadable: Option<String>,
    pub(crate) status_version: i32,
    pub(crate) session: u64,
}

/// What [`Engine::watch_finishing`](crate::Engine::watch_finishing) sets: the Processing batches, each with the watch that
/// fires when it may have finished, and the watches that fire when the list is out of date.
pub struct Finishing {
    pub batches: Vec<(BatchId, Watch)>,
    pub stale: Vec<Watch>,
}

/// A per-object lock (`/locks/storage/ARK`, `/locks/inventory/ARK`).
#[derive(Debug, Clone)]
pub struct ArkLock {
    pub(crate) path: String,
    pub(crate) session: u64,
}

/// One of a job's JSON data nodes, with what to write in it
/// ([`Engine::set_job_data`](crate::Engine::set_job_data)).
#[derive(Debug, Clone, Copy)]
pub enum JobData<'a> {
    /// `identifiers`: the primary identifier once minted, the local ones.
    Identifiers(&'a Identifiers),
    /// `metadata`: filled in from an ERC file or a bag's tags.
    Metadata(&'a JobMetadata),
    /// `inventory`: what Recording gives the inventory.
    Inventory(&'a Value),
    /// `store`: where and as which version the object was stored.
    Store(&'a Value),
    /// Lading's interim `store-progress` (a store on a bucket node, resumed from it); `Null`
    /// clears it.
    StoreProgress(&'a Value),
}

impl JobData<'_> {
    /// The node's name under `/jobs/JID`.
    pub fn node(&self) -> &'static str {
        match self {
            JobData::Identifiers(_) => "identifiers",
            JobData::Metadata(_) => "metadata",
            JobData::Inventory(_) => "inventory",
            JobData::Store(_) => "store",
            JobData::StoreProgress(_) => "store-progress",
        }
    }
}

/// What a new job is made of.
#[derive(Debug, Clone, Default)]
pub struct JobSpec {
    pub configuration: JobConfiguration,
    /// 0..=99; lower runs first. `None` means the default, 5.
    pub priority: Option<u8>,
    pub space_needed: u64,
    pub identifiers: Identifiers,
    pub metadata: ErcMetadata,
}

/// Everything stored about a job.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobInfo {
    pub id: JobId,
    pub bid: BatchId,
    pub status: JobStatus,
    pub priority: u8,
    pub space_needed: u64,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub configuration: Recorded<JobConfiguration>,
    pub identifiers: Identifiers,
    pub metadata: JobMetadata,
    pub locked: bool,
}

/// Everything stored about a batch, with its jobs per reference folder.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchInfo {
    pub id: BatchId,
    pub status: BatchStatus,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub submission: Recorded<BatchSubmission>,
    pub status_report: Option<StatusReport>,
    /// The batch's jobs by reference folder (`batch-processing`, `batch-completed`, …).
    pub jobs: BTreeMap<String, Vec<JobId>>,
    pub locked: bool,
}

/// An access request.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AccessInfo {
    pub queue: AccessQueue,
    pub id: String,
    pub status: AccessStatus,
    pub token: lading_core::layout::AccessToken,
    pub locked: bool,
}
