//! Reading jobs and batches: typed reads of their nodes, listings and counts.

use super::*;

/// The nodes of a job's record, in the order [`Engine::job`] reads them.
pub(crate) const RECORD_NODES: [&str; 8] = [
    "status",
    "bid",
    "priority",
    "space_needed",
    "configuration",
    "identifiers",
    "metadata",
    "lock",
];

/// A node's data as JSON of type `T`, with the node's version. Data that is not JSON is
/// "invalid JSON"; JSON of another shape, "unexpected JSON".
pub(crate) fn decode_json<T: DeserializeOwned>(
    path: &str,
    node: &lading_core::Node,
) -> Result<(T, i32)> {
    let v =
        lading_core::json::from_bytes(node.data.as_deref().unwrap_or_default()).map_err(|e| {
            EngineError::Corrupt {
                path: path.to_string(),
                reason: if e.is_data() {
                    format!("unexpected JSON: {e}")
                } else {
                    format!("invalid JSON: {e}")
                },
            }
        })?;
    Ok((v, node.stat.version))
}

/// A status node's state alone: the rest is skipped over, not built (a job's history is up
/// to 32 strings). What reads only states (the quota's stale-slot sweep reads every held
/// slot's job) decoded whole statuses: 1.2% of a simulator run.
#[derive(serde::Deserialize)]
struct StateOnly<S> {
    status: S,
}

impl Engine {
    pub(crate) async fn read_json<T: DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<Option<(T, i32)>> {
        let node = self.tree.get(path).await?;
        node.map(|n| decode_json(path, &n)).transpose()
    }

    pub(crate) async fn read_string(&self, path: &str) -> Result<Option<String>> {
        let Some(node) = self.tree.get(path).await? else {
            return Ok(None);
        };
        String::from_utf8(node.data.unwrap_or_default())
            .map(|s| Some(s.trim().to_string()))
            .map_err(|_| EngineError::Corrupt {
                path: path.into(),
                reason: "not UTF-8 text".into(),
            })
    }

    pub(crate) async fn read_u64(&self, path: &str) -> Result<Option<u64>> {
        match self.read_string(path).await? {
            None => Ok(None),
            Some(s) if s.is_empty() => Ok(Some(0)),
            Some(s) => s.parse().map(Some).map_err(|_| EngineError::Corrupt {
                path: path.into(),
                reason: format!("not a decimal integer: {s:?}"),
            }),
        }
    }

    pub(crate) async fn job_status(&self, job: &JobId) -> Result<(JobStatus, i32)> {
        self.read_json(&job_node(job, "status"))
            .await?
            .ok_or_else(|| EngineError::NoJob(job.to_string()))
    }

    /// A job's state alone: one read of its status (`NoJob` when it is gone).
    pub async fn job_state(&self, job: &JobId) -> Result<JobState> {
        self.read_json::<StateOnly<JobState>>(&job_node(job, "status"))
            .await?
            .map(|(s, _)| s.status)
            .ok_or_else(|| EngineError::NoJob(job.to_string()))
    }

    /// Several jobs' states in one read of their statuses (`None` for a job that is gone):
    /// one round trip where [`Engine::job_state`] for each would make one per job.
    pub async fn job_states(&self, jobs: &[JobId]) -> Result<Vec<Option<JobState>>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let paths: Vec<String> = jobs.iter().map(|j| job_node(j, "status")).collect();
        let nodes = self.tree.get_many(&paths).await?;
        nodes
            .into_iter()
            .zip(&paths)
            .map(|(node, path)| {
                let Some(node) = node else { return Ok(None) };
                let (state, _) = decode_json::<StateOnly<JobState>>(path, &node)?;
                Ok(Some(state.status))
            })
            .collect()
    }

    /// A batch's state alone: one read of its status (`NoBatch` when it is gone).
    pub async fn batch_state(&self, batch: &BatchId) -> Result<BatchState> {
        self.read_json::<StateOnly<BatchState>>(&batch_node(batch, "status"))
            .await?
            .map(|(s, _)| s.status)
            .ok_or_else(|| EngineError::NoBatch(batch.to_string()))
    }

    pub(crate) async fn job_priority(&self, job: &JobId) -> Result<u8> {
        let p = self
            .read_u64(&job_node(job, "priority"))
            .await?
            .unwrap_or(DEFAULT_PRIORITY as u64);
        u8::try_from(p)
            .ok()
            .filter(|p| *p <= 99)
            .ok_or_else(|| EngineError::Corrupt {
                path: job_node(job, "priority"),
                reason: format!("priority {p} is outside 0..=99"),
            })
    }

    pub(crate) async fn job_batch(&self, job: &JobId) -> Result<BatchId> {
        if let Some(b) = self.known_batch(job) {
            return Ok(b);
        }
        let node = self.tree.get(&job_node(job, "bid")).await?;
        self.remember_batch(job, node.as_ref())
    }

    /// The batch of `job`, if this engine has read it before.
    pub(crate) fn known_batch(&self, job: &JobId) -> Option<BatchId> {
        self.job_batches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(job)
            .cloned()
    }

    /// The batch id in `job`'s `bid` node (as read), remembered.
    pub(crate) fn remember_batch(
        &self,
        job: &JobId,
        node: Option<&lading_core::Node>,
    ) -> Result<BatchId> {
        let path = job_node(job, "bid");
        let node = node.ok_or_else(|| EngineError::NoJob(job.to_string()))?;
        let s = String::from_utf8_lossy(node.data.as_deref().unwrap_or_default()).into_owned();
        let bid = BatchId::parse(s.trim()).map_err(|e| EngineError::Corrupt {
            path,
            reason: e.to_string(),
        })?;
        let mut cache = self.job_batches.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= JOB_BATCHES_KEPT {
            cache.clear();
        }
        cache.insert(job.clone(), bid.clone());
        Ok(bid)
    }

    /// A job's status from its node (as read).
    pub(crate) fn decode_status(
        &self,
        job: &JobId,
        node: Option<&lading_core::Node>,
    ) -> Result<(JobStatus, i32)> {
        let node = node.ok_or_else(|| EngineError::NoJob(job.to_string()))?;
        decode_json(&job_node(job, "status"), node)
    }

    pub(crate) async fn batch_status(&self, batch: &BatchId) -> Result<(BatchStatus, i32)> {
        self.read_json(&batch_node(batch, "status"))
            .await?
            .ok_or_else(|| EngineError::NoBatch(batch.to_string()))
    }

    /// [`Engine::batch_status`] as acquisition reads it: remembered under the process's shared
    /// watch on the status (see [`crate::watched`]). What is done with it is guarded by the
    /// version read, so a status one watch event late costs a refused write.
    /// Shared, not copied: acquisition reads every live batch's status at each look, and a
    /// copy of each (its extra fields a map) was 0.6% of a simulator run.
    pub(crate) async fn batch_status_watched(
        &self,
        batch: &BatchId,
    ) -> Result<Arc<(BatchStatus, i32)>> {
        let path = batch_node(batch, "status");
        self.watched_read(&path, WatchKind::Data, async {
            self.batch_status(batch).await.map(Arc::new)
        })
        .await
    }

    /// A job's full record, read as one snapshot.
    pub async fn job(&self, job: &JobId) -> Result<JobInfo> {
        let paths = Self::record_paths(job);
        let nodes = self.tree.get_many(&paths).await?;
        Self::record_of(job, &paths, &nodes)
    }

    /// The record of the job a lease is of: as read with the lease, when it was read whole
    /// (a worker's acquisition reads it in the same round trip as the job's status), else
    /// read now. Taken from the lease, and used only while the lease's status is the one it
    /// was read with (a move made since, e.g. `job_advance`, makes it stale).
    pub async fn leased_job(&self, lease: &mut JobLease) -> Result<JobInfo> {
        let version = lease.status_version;
        let current = |nodes: &Arc<Vec<Option<lading_core::Node>>>| {
            nodes
                .first()
                .and_then(Option::as_ref)
                .is_some_and(|n| n.stat.version == version)
        };
        match lease.record.take().filter(current) {
            Some(nodes) => Self::record_of(&lease.job, &Self::record_paths(&lease.job), &nodes),
            None => self.job(&lease.job).await,
        }
    }

    /// The nodes a job's record is made of, in the order [`Engine::record_of`] reads them:
    /// status and batch first (all a lease needs).
    pub(crate) fn record_paths(job: &JobId) -> Vec<String> {
        RECORD_NODES.iter().map(|n| job_node(job, n)).collect()
    }

    /// A job's record from the nodes [`Engine::record_paths`] names, as read.
    fn record_of(
        job: &JobId,
        paths: &[String],
        nodes: &[Option<lading_core::Node>],
    ) -> Result<JobInfo> {
        let text = |i: usize| -> Result<Option<String>> {
            match &nodes[i] {
                None => Ok(None),
                Some(n) => std::str::from_utf8(n.data.as_deref().unwrap_or_default())
                    .map(|s| Some(s.trim().to_string()))
                    .map_err(|_| EngineError::Corrupt {
                        path: paths[i].clone(),
                        reason: "not UTF-8 text".into(),
                    }),
            }
        };
        // Each read straight from its bytes into its type (through a `Value` first, every
        // status was parsed twice).
        fn json<T: DeserializeOwned>(
            nodes: &[Option<lading_core::Node>],
            paths: &[String],
            i: usize,
        ) -> Result<Option<T>> {
            nodes[i]
                .as_ref()
                .map(|n| decode_json(&paths[i], n).map(|(v, _)| v))
                .transpose()
        }
        let number = |i: usize| -> Result<Option<u64>> {
            match text(i)? {
                None => Ok(None),
                Some(s) if s.is_empty() => Ok(Some(0)),
                Some(s) => s.parse().map(Some).map_err(|_| EngineError::Corrupt {
                    path: paths[i].clone(),
                    reason: format!("not a decimal integer: {s:?}"),
                }),
            }
        };
        let status: JobStatus =
            json(nodes, paths, 0)?.ok_or_else(|| EngineError::NoJob(job.to_string()))?;
        let bid = text(1)?.ok_or_else(|| EngineError::NoJob(job.to_string()))?;
        let bid = BatchId::parse(&bid).map_err(|e| EngineError::Corrupt {
            path: paths[1].clone(),
            reason: e.to_string(),
        })?;
        let p = number(2)?.unwrap_or(DEFAULT_PRIORITY as u64);
        let priority =
            u8::try_from(p)
                .ok()
                .filter(|p| *p <= 99)
                .ok_or_else(|| EngineError::Corrupt {
                    path: paths[2].clone(),
                    reason: format!("priority {p} is outside 0..=99"),
                })?;
        Ok(JobInfo {
            id: job.clone(),
            bid,
            status,
            priority,
            space_needed: number(3)?.unwrap_or(0),
            configuration: Recorded::of(&paths[4], json(nodes, paths, 4)?.unwrap_or(Value::Null)),
            identifiers: json(nodes, paths, 5)?.unwrap_or_default(),
            metadata: json(nodes, paths, 6)?.unwrap_or_default(),
            locked: nodes[7].is_some(),
        })
    }

    /// A job's `configuration` node (none stored: the default).
    pub async fn job_configuration(&self, job: &JobId) -> Result<Recorded<JobConfiguration>> {
        let path = job_node(job, "configuration");
        let raw = self.read_json(&path).await?.map(|(v, _)| v);
        Ok(Recorded::of(&path, raw.unwrap_or(Value::Null)))
    }

    /// A batch's submission (none stored: the default); an unknown batch is an error.
    pub async fn batch_submission(&self, batch: &BatchId) -> Result<Recorded<BatchSubmission>> {
        let path = batch_node(batch, "submission");
        match self.read_json(&path).await? {
            Some((v, _)) => Ok(Recorded::of(&path, v)),
            None => {
                self.batch_status(batch).await?;
                Ok(Recorded::default())
            }
        }
    }

    /// A batch's `batchID` as its submission holds it (`""` when it holds none), remembered:
    /// a submission is written once, when the batch is made, and batch ids are never reused.
    pub async fn batch_uuid(&self, batch: &BatchId) -> Result<String> {
        let known = self
            .batch_uuids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(batch)
            .cloned();
        if let Some(u) = known {
            return Ok(u);
        }
        let submission = self.batch_submission(batch).await?;
        let uuid = submission.text("batchID").unwrap_or_default().to_string();
        let mut cache = self.batch_uuids.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= JOB_BATCHES_KEPT {
            cache.clear();
        }
        cache.insert(batch.clone(), uuid.clone());
        Ok(uuid)
    }

    /// A batch's full record.
    pub async fn batch(&self, batch: &BatchId) -> Result<BatchInfo> {
        let (status, _) = self.batch_status(batch).await?;
        let path = batch_node(batch, "submission");
        let raw = self.read_json(&path).await?.map(|(v, _)| v);
        let submission = Recorded::of(&path, raw.unwrap_or(Value::Null));
        let status_report = self
            .read_json(&batch_node(batch, "status-report"))
            .await?
            .map(|(v, _)| v);
        let mut jobs = BTreeMap::new();
        for folder in BATCH_FOLDERS {
            match self.tree.children(&batch_ref_folder(batch, folder)).await {
                Ok(c) => {
                    // A name that is no job id is no job of the batch.
                    let ids = c.iter().filter_map(|n| JobId::parse(n).ok()).collect();
                    jobs.insert(folder.to_string(), ids);
                }
                Err(TreeError::NoNode(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let locked = self
            .tree
            .exists(&batch_node(batch, "lock"))
            .await?
            .is_some();
        Ok(BatchInfo {
            id: batch.clone(),
            status,
            submission,
            status_report,
            jobs,
            locked,
        })
    }

    /// Every job of `batch`, in any of its reference folders. The folders are read in
    /// [`BATCH_FOLDERS`] order, and read again until a pass finds no job the earlier ones
    /// missed: a job moved back to an earlier folder between two reads (a requeue by a tool
    /// that does not take the batch's lock, as Merritt's own may) is seen by the next pass.
    /// A retried intake relies on it to skip the objects it made.
    pub async fn batch_jobs(&self, batch: &BatchId) -> Result<std::collections::BTreeSet<JobId>> {
        let mut all = std::collections::BTreeSet::new();
        // Each pass that goes on found a job a move hid from the one before; a few moves
        // back within one intake are all a tool makes.
        for _ in 0..8 {
            let mut new = false;
            for folder in BATCH_FOLDERS {
                match self.tree.children(&batch_ref_folder(batch, folder)).await {
                    // A name that is no job id is no job of the batch.
                    Ok(c) => {
                        for id in c.iter().filter_map(|n| JobId::parse(n).ok()) {
                            new |= all.insert(id);
                        }
                    }
                    Err(TreeError::NoNode(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if !new {
                break;
            }
        }
        Ok(all)
    }

    /// Finds a batch by the uuid in its submission.
    /// A batch named by its id (`bid…`), its uuid, or Merritt's form of the uuid
    /// (`bid-UUID`, what Merritt's ingest service answers as `bat:batchID`).
    pub async fn find_batch(&self, id: &str) -> Result<Option<BatchId>> {
        if let Some(uuid) = id.strip_prefix("bid-") {
            return self.batch_by_uuid(uuid).await;
        }
        if id.starts_with(BatchId::PREFIX) {
            return BatchId::parse(id)
                .map(Some)
                .map_err(|e| EngineError::Invalid(e.to_string()));
        }
        self.batch_by_uuid(id).await
    }

    pub async fn batch_by_uuid(&self, uuid: &str) -> Result<Option<BatchId>> {
        layout::check_name("batch uuid", uuid)?;
        match self.read_string(&batch_uuid_path(uuid)).await? {
            None => Ok(None),
            Some(s) => BatchId::parse(&s)
                .map(Some)
                .map_err(|e| EngineError::Corrupt {
                    path: batch_uuid_path(uuid),
                    reason: e.to_string(),
                }),
        }
    }

    /// Number of jobs per state (from the state folders; one count each).
    pub async fn job_counts(&self) -> Result<BTreeMap<JobState, u64>> {
        let mut out = BTreeMap::new();
        for s in JobState::ALL {
            let n = match self.tree.count_children(&job_state_folder(*s)).await {
                Ok(n) => n,
                Err(TreeError::NoNode(_)) => 0,
                Err(e) => return Err(e.into()),
            };
            out.insert(*s, n);
        }
        Ok(out)
    }

    /// Per job state, when the job that has been in it longest entered it (ms since the
    /// epoch: the creation time of its reference in the state's folder, which a move makes
    /// afresh), or `None` for an empty state. At most [`OLDEST_SCAN`] references of a state
    /// are read; `exact` is false when it has more (the figure is then the oldest of those).
    pub async fn oldest_per_state(&self) -> Result<BTreeMap<JobState, Oldest>> {
        let mut out = BTreeMap::new();
        for s in JobState::ALL {
            let folder = job_state_folder(*s);
            let names = match self
                .tree
                .children_page(&folder, None, OLDEST_SCAN + 1)
                .await
            {
                Ok(n) => n,
                Err(TreeError::NoNode(_)) => Vec::new(),
                Err(e) => return Err(e.into()),
            };
            let exact = names.len() <= OLDEST_SCAN;
            let mut since_ms: Option<u64> = None;
            for chunk in names[..names.len().min(OLDEST_SCAN)].chunks(512) {
                let paths: Vec<String> = chunk.iter().map(|n| format!("{folder}/{n}")).collect();
                for node in self.tree.get_many(&paths).await?.into_iter().flatten() {
                    let t = node.stat.ctime_ms;
                    since_ms = Some(since_ms.map_or(t, |m| m.min(t)));
                }
            }
            out.insert(*s, Oldest { since_ms, exact });
        }
        Ok(out)
    }

    /// Jobs in a state, in acquisition order, a page at a time: (priority, id).
    pub async fn list_jobs(
        &self,
        state: JobState,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(u8, JobId)>> {
        let names = self
            .tree
            .children_page(&job_state_folder(state), after, limit)
            .await?;
        Ok(names.iter().filter_map(|n| parse_job_ref(n)).collect())
    }

    /// All batch ids, in creation order.
    pub async fn batch_ids(&self) -> Result<Vec<BatchId>> {
        Ok(self
            .tree
            .children(BATCHES)
            .await?
            .iter()
            .filter_map(|n| BatchId::parse(n).ok())
            .collect())
    }

    /// Removes submitter-index entries whose batch is gone: another tool (Merritt's
    /// `Batch.deleteCompletedBatches`) deleted the batch without knowing Lading's index. An
    /// entry is made in the same `multi` as its batch's submission, so a missing batch is a
    /// deleted one. Returns how many entries went.
    pub async fn prune_submitter_index(&self) -> Result<usize> {
        let mut pruned = 0;
        let submitters = match self.tree.children(BATCH_SUBMITTERS).await {
            Ok(s) => s,
            Err(TreeError::NoNode(_)) => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        for who in submitters {
            let dir = format!("{BATCH_SUBMITTERS}/{who}");
            let entries = match self.tree.children(&dir).await {
                Ok(e) => e,
                Err(TreeError::NoNode(_)) => continue,
                Err(e) => return Err(e.into()),
            };
            for name in entries {
                let Ok(bid) = BatchId::parse(&name) else {
                    continue;
                };
                if self.tree.exists(&batch_path(&bid)).await?.is_none() {
                    match self.tree.delete(&format!("{dir}/{name}"), None).await {
                        Ok(()) => pruned += 1,
                        Err(TreeError::NoNode(_)) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        Ok(pruned)
    }

    /// The ids of the batches `submitter` submitted, in creation order (reads only those).
    pub async fn batch_ids_of(&self, submitter: &str) -> Result<Vec<BatchId>> {
        let mut ids: Vec<BatchId> = self
            .tree
            .children(&submitter_batches(submitter))
            .await
            .or_else(|e| match e {
                TreeError::NoNode(_) => Ok(Vec::new()),
                e => Err(e),
            })?
            .iter()
            .filter_map(|n| BatchId::parse(n).ok())
            .collect();
        ids.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        Ok(ids)
    }

    /// How many of `submitter`'s batches are still open (Pending, Held, Processing, Reporting
    /// or UpdateReporting), counted newest first and no further than `stop_at`. A status that
    /// cannot be read as one counts as open; a batch being created or purged does not.
    pub async fn open_batches_of(&self, submitter: &str, stop_at: usize) -> Result<usize> {
        let ids = self.batch_ids_of(submitter).await?;
        let mut open = 0;
        for chunk in ids.rchunks(256) {
            let paths: Vec<String> = chunk.iter().map(|b| batch_node(b, "status")).collect();
            for node in self.tree.get_many(&paths).await?.into_iter().flatten() {
                let bytes = node.data.unwrap_or_default();
                let done = lading_core::json::from_bytes::<BatchStatus>(&bytes).is_ok_and(|s| {
                    matches!(
                        s.status,
                        BatchState::Completed | BatchState::Failed | BatchState::Deleted
                    )
                });
                open += usize::from(!done);
            }
            if open >= stop_at {
                break;
            }
        }
        Ok(open)
    }

    /// Batch states with their number of batches (reads every batch status).
    pub async fn batch_counts(&self) -> Result<BTreeMap<BatchState, u64>> {
        let mut out: BTreeMap<BatchState, u64> = BatchState::ALL.iter().map(|s| (*s, 0)).collect();
        for b in self.batch_ids().await? {
            match self.batch_status(&b).await {
                Ok((s, _)) => *out.entry(s.status).or_default() += 1,
                Err(EngineError::NoBatch(_)) => {} // being created or purged
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}
