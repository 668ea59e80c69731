//! Batches: creation, acquisition, waiting, leases and their transitions.

use super::*;

impl Engine {
    /// Creates a Pending batch from a submission (SPEC §2 `submission` fields; a `batchID` uuid
    /// is generated when missing and indexed under `/batch-uuids`).
    pub async fn create_batch(&self, submission: BatchSubmission) -> Result<BatchId> {
        let mut submission = lading_core::layout::to_object(&submission);
        let uuid = match submission.get("batchID") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            None | Some(Value::Null) => uuid::Uuid::new_v4().to_string(),
            Some(other) => {
                return Err(EngineError::Invalid(format!(
                    "batchID must be a string, got {other}"
                )));
            }
        };
        check_name("batch uuid", &uuid)?;
        if self.tree.exists(&batch_uuid_path(&uuid)).await?.is_some() {
            return Err(EngineError::Invalid(format!(
                "a batch with batchID {uuid} already exists"
            )));
        }
        submission.insert("batchID".into(), Value::String(uuid.clone()));
        submission
            .entry("submissionDate")
            .or_insert_with(|| Value::String(self.now()));
        let path = self
            .tree
            .create(BATCH_PREFIX, None, CreateMode::PersistentSequential)
            .await?;
        // This process's next look lists the batches again (see `acquire_batch`).
        self.watched.forget(BATCHES, WatchKind::Children);
        let bid = BatchId::parse(lading_core::tree::split_path(&path).1)?;
        let mut status = BatchStatus {
            status: BatchState::Pending,
            last_modified: self.now(),
            message: None,
            extra: Map::new(),
        };
        self.born(&mut status.extra, &status.last_modified);
        let mut ops = vec![
            Op::create(batch_node(&bid, "submission"), json_bytes(&submission)),
            Op::create(batch_node(&bid, "status"), json_bytes(&status)),
            Op::create(batch_uuid_path(&uuid), Some(bid.to_string().into_bytes())),
        ];
        if let Some(who) = lading_core::layout::submitter_in(&submission) {
            // BATCH_SUBMITTERS itself is made by `init`.
            let dir = submitter_batches(who);
            self.ensure(&dir).await?;
            ops.push(Op::create(format!("{dir}/{bid}"), None));
        }
        let r = self.tree.multi(ops).await;
        if let Err(e) = r {
            // Leave no empty shell behind.
            let _ = self.tree.delete(&path, None).await;
            if matches!(e.root(), TreeError::NodeExists(p) if p.starts_with(BATCH_UUIDS)) {
                return Err(EngineError::Invalid(format!(
                    "a batch with batchID {uuid} already exists"
                )));
            }
            return Err(e.into());
        }
        self.publish(
            crate::ChangeKind::Batch,
            bid.as_str(),
            None,
            None,
            BatchState::Pending.name(),
        );
        Ok(bid)
    }

    /// Acquires a batch in `state` (Pending, Reporting or UpdateReporting), oldest first. A
    /// pending batch of a held collection is moved to Held instead of being returned; a paused
    /// ingest queue hands out nothing.
    pub async fn acquire_batch(&self, state: BatchState) -> Result<Option<BatchLease>> {
        if self.queue_paused_watched("ingest").await? {
            return Ok(None);
        }
        let holds = state == BatchState::Pending && self.any_collection_held().await?;
        let mut after: Option<String> = None;
        let mut live = Vec::new();
        let mut locked = Vec::new();
        loop {
            let page = match &after {
                // The first page, remembered under a watch on the folder: batches come and go
                // far less often than their statuses change, and every status change woke
                // each batch waiter of each process to list them all again.
                None => {
                    self.watched_read(BATCHES, WatchKind::Children, async {
                        Ok(self.tree.children_page(BATCHES, None, PAGE).await?)
                    })
                    .await?
                }
                Some(a) => self.tree.children_page(BATCHES, Some(a), PAGE).await?,
            };
            // A short page is the last (see `Tree::children_page`): no empty one is read
            // after it.
            let last = (page.len() == PAGE).then(|| page.last().cloned()).flatten();
            for name in &page {
                let Ok(bid) = BatchId::parse(name) else {
                    continue;
                };
                let known = self
                    .terminal_batches
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&bid)
                    .copied();
                if known.is_some_and(|t| t != state) {
                    continue;
                }
                let read = match self.batch_status_watched(&bid).await {
                    Ok(s) => s,
                    Err(EngineError::NoBatch(_)) => {
                        // Being created (its node comes first, its status in a second
                        // `multi`): a waiter must watch for the status, or it would sleep
                        // through the batch's arrival until the sweep.
                        if live.len() < WAIT_BATCHES {
                            live.push(bid.clone());
                        }
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let (status, version) = (&read.0, read.1);
                if matches!(status.status, BatchState::Completed | BatchState::Deleted) {
                    let mut t = self
                        .terminal_batches
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    if t.len() >= JOB_BATCHES_KEPT {
                        t.clear();
                    }
                    t.insert(bid.clone(), status.status);
                } else if live.len() < WAIT_BATCHES {
                    live.push(bid.clone());
                }
                if status.status != state {
                    continue;
                }
                let lock = batch_node(&bid, "lock");
                let guard = Op::check(batch_node(&bid, "status"), Some(version));
                let Some(session) = self.take_lock(&lock, guard).await? else {
                    if locked.len() < WAIT_BATCHES {
                        locked.push(bid.clone());
                    }
                    continue;
                };
                let lease = BatchLease {
                    batch: bid.clone(),
                    status: status.clone(),
                    effects: Vec::new(),
                    report: None,
                    status_version: version,
                    session,
                };
                if holds
                    && let Some(c) = self.batch_collection(&bid).await?
                    && self.collection_held(&c).await?
                {
                    self.batch_transition(
                        lease,
                        Event::To(BatchState::Held),
                        Some(format!("collection {c} is held")),
                    )
                    .await?;
                    continue;
                }
                return Ok(Some(lease));
            }
            if last.is_none() {
                *self.live_batches.lock().unwrap_or_else(|p| p.into_inner()) = live;
                self.locked_batches
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(state, locked);
                return Ok(None);
            }
            after = last;
        }
    }

    /// Waits until a batch in `state` can be acquired, `timeout` passes, or `cancel`
    /// completes (see [`Engine::wait_job_or`]). Woken by new batches, by status changes of
    /// the live batches the last scan saw, by lock changes of those it found in `state` but
    /// locked, and by the ingest pause flag; a slow sweep backs them up. (Every waiter
    /// watching every live batch's lock woke each process's batch waiters at every lock
    /// taken anywhere.)
    pub async fn wait_batch_or(
        &self,
        state: BatchState,
        timeout: Duration,
        cancel: impl std::future::Future<Output = ()>,
    ) -> Result<Option<BatchLease>> {
        let armed = &claims::Armed::default();
        self.wait_until(timeout, cancel, armed, None, || async move {
            armed.watch(self, BATCHES, WatchKind::Children).await?;
            armed
                .watch(self, &queue_lock("ingest"), WatchKind::Data)
                .await?;
            let live = self
                .live_batches
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let locked = self.locked_in(state);
            for bid in &live {
                armed
                    .watch(self, &batch_node(bid, "status"), WatchKind::Data)
                    .await?;
            }
            for bid in &locked {
                armed
                    .watch(self, &batch_node(bid, "lock"), WatchKind::Data)
                    .await?;
            }
            if let Some(l) = self.acquire_batch(state).await? {
                return Ok(Round::Got(l));
            }
            // Batches the scan just found live but that were not watched yet.
            let now_live = self
                .live_batches
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if now_live.iter().any(|b| !live.contains(b))
                || self.locked_in(state).iter().any(|b| !locked.contains(b))
            {
                return Ok(Round::Again);
            }
            Ok(Round::Wait { due: self.sweep })
        })
        .await
    }

    /// The batches of `state` the last scan found locked (see `locked_batches`).
    fn locked_in(&self, state: BatchState) -> Vec<BatchId> {
        self.locked_batches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&state)
            .cloned()
            .unwrap_or_default()
    }

    pub(crate) fn check_batch_lease(&self, lease: &BatchLease) -> Result<()> {
        if lease.session != self.tree.session_id() {
            return Err(lost(lease.batch.as_str()));
        }
        Ok(())
    }

    /// Moves a leased batch and releases its lock. Pending → Processing creates the batch's
    /// `states` folders (as Merritt does on acquisition) and then checks whether the batch is
    /// already finished.
    pub async fn batch_transition(
        &self,
        lease: BatchLease,
        event: Event<BatchState>,
        message: Option<String>,
    ) -> Result<BatchStatus> {
        let lock = batch_node(&lease.batch, "lock");
        let r = self
            .batch_transition_inner(&lease, event, message, false)
            .await;
        // The lock may still be this session's (the batch moved under it, a reply lost).
        self.settle(&lock, lease.session, &r).await;
        let (status, _) = r?;
        if status.status == BatchState::Processing {
            self.maybe_report(&lease.batch).await?;
        }
        Ok(status)
    }

    /// Like [`Engine::batch_transition`] but keeps the lock (e.g. intake failing a batch
    /// goes Pending → Processing → Failed, and nobody may report it in between).
    pub async fn batch_advance(
        &self,
        mut lease: BatchLease,
        event: Event<BatchState>,
        message: Option<String>,
    ) -> Result<BatchLease> {
        match self
            .batch_transition_inner(&lease, event, message, true)
            .await
        {
            Ok((status, version)) => {
                lease.status = status;
                lease.status_version = version;
                lease.effects.clear();
                lease.report = None;
                Ok(lease)
            }
            Err(e) => {
                let e = Err(e);
                self.settle(&batch_node(&lease.batch, "lock"), lease.session, &e)
                    .await;
                e
            }
        }
    }

    pub(crate) async fn batch_transition_inner(
        &self,
        lease: &BatchLease,
        event: Event<BatchState>,
        message: Option<String>,
        keep_lock: bool,
    ) -> Result<(BatchStatus, i32)> {
        self.check_batch_lease(lease)?;
        let bid = &lease.batch;
        let to = lease.status.status.resolve(event)?;
        let mut status = lease.status.clone();
        status.status = to;
        status.last_modified = self.now();
        if to != lease.status.status {
            push_history(
                &mut status.extra,
                Some(lease.status.status.name()),
                to.name(),
                &status.last_modified,
                &self.owner,
                0,
                message.as_deref(),
            );
        }
        status.message = message;
        let lock = batch_node(bid, "lock");
        let mut ops = vec![
            Op::check(&lock, None),
            Op::set(
                batch_node(bid, "status"),
                json_bytes(&status),
                Some(lease.status_version),
            ),
        ];
        ops.extend(self.states_ops(bid, to).await?);
        if let Some(report) = &lease.report {
            let path = batch_node(bid, "status-report");
            let mut report = report.clone();
            report.last_modified = self.now();
            ops.push(if self.tree.exists(&path).await?.is_some() {
                Op::set(&path, json_bytes(&report), None)
            } else {
                Op::create(&path, json_bytes(&report))
            });
        }
        ops.extend(self.effect_ops(&lease.effects));
        if !keep_lock {
            ops.push(Op::delete(&lock, None));
        }
        if let Err(e) = self.tree.multi_on(lease.session, ops).await {
            // Someone moved the batch under us (an admin requeue reopened it), or the reply
            // was lost: the callers abandon the lock, which may still be this session's.
            return Err(self.lease_error(e, bid.as_str()));
        }
        self.publish(
            crate::ChangeKind::Batch,
            bid.as_str(),
            None,
            Some(lease.status.status.name()),
            to.name(),
        );
        Ok((status, lease.status_version + 1))
    }

    pub(crate) fn lease_error(&self, e: TreeError, what: &str) -> EngineError {
        match (e.failed_op(), e.root()) {
            (Some(_), TreeError::NoNode(p)) if p.ends_with("/lock") => lost(what),
            (Some(_), TreeError::BadVersion { path, .. }) if path.ends_with("/status") => {
                lost(what)
            }
            (_, TreeError::SessionExpired) => lost(what),
            _ => e.into(),
        }
    }

    /// Gives a batch back without moving it.
    pub async fn release_batch_lease(&self, lease: BatchLease) -> Result<()> {
        let lock = batch_node(&lease.batch, "lock");
        if let Err(e) = self.check_batch_lease(&lease) {
            self.unclaim_on(&lock, lease.session);
            return Err(e);
        }
        self.release_lock(&lock, lease.batch.as_str(), lease.session)
            .await
    }

    /// The ops that give a batch moving to `to` its `states` folders when it has none. A batch
    /// going Processing needs them for its jobs; Merritt takes any batch without `states` for
    /// pending, so a held batch gets them too and Merritt's consumers leave it alone.
    pub(crate) async fn states_ops(&self, bid: &BatchId, to: BatchState) -> Result<Vec<Op>> {
        if !matches!(to, BatchState::Processing | BatchState::Held)
            || self.tree.exists(&batch_states(bid)).await?.is_some()
        {
            return Ok(Vec::new());
        }
        let mut ops = vec![Op::create(batch_states(bid), None)];
        ops.extend(
            BATCH_FOLDERS
                .iter()
                .map(|f| Op::create(batch_ref_folder(bid, f), None)),
        );
        Ok(ops)
    }
}
