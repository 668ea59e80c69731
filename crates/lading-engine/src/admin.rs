//! Admin actions on batches and jobs (hold, release, requeue, delete, update-reporting)
//! and purges.

use super::*;

impl Engine {
    /// Admin action on an unlocked batch.
    pub(crate) async fn admin_batch(
        &self,
        batch: &BatchId,
        to: BatchState,
        message: Option<String>,
    ) -> Result<BatchStatus> {
        let (status, version) = self.batch_status(batch).await?;
        let lease = BatchLease {
            batch: batch.clone(),
            status,
            effects: Vec::new(),
            report: None,
            status_version: version,
            session: self.tree.session_id(),
        };
        let lock = batch_node(batch, "lock");
        let ops = vec![Op::create_mode(&lock, None, CreateMode::Ephemeral)];
        // Take the lock inside the multi: fails with Locked if a worker has it.
        let to_state = lease.status.status.resolve(Event::To(to))?;
        let mut next = lease.status.clone();
        next.status = to_state;
        next.last_modified = self.now();
        push_history(
            &mut next.extra,
            Some(lease.status.status.name()),
            to_state.name(),
            &next.last_modified,
            &self.owner,
            0,
            Some(message.as_deref().unwrap_or("by an admin")),
        );
        next.message = message;
        let mut ops = ops;
        ops.push(Op::set(
            batch_node(batch, "status"),
            json_bytes(&next),
            Some(version),
        ));
        ops.extend(self.states_ops(batch, to_state).await?);
        ops.push(Op::delete(&lock, None));
        match self.tree.multi(ops).await {
            Ok(_) => {}
            Err(e) if matches!(e.root(), TreeError::NodeExists(_)) => {
                return Err(if lease.status.status == BatchState::Held {
                    EngineError::ForeignLocked(batch.to_string())
                } else {
                    EngineError::Locked(batch.to_string())
                });
            }
            Err(e) if matches!(e.root(), TreeError::BadVersion { .. }) => {
                return Err(EngineError::Conflict(batch.to_string()));
            }
            Err(e) => return Err(e.into()),
        }
        self.publish(
            crate::ChangeKind::Batch,
            batch.as_str(),
            None,
            Some(lease.status.status.name()),
            to_state.name(),
        );
        Ok(next)
    }

    /// The batch's side of an admin's move of `job` (of `batch`) from `from` to `to`, added to
    /// `ops`: a job back in `batch-processing` reopens a reported batch (or, in intake, waits
    /// for the intake to be done), and a failed job leaving `batch-failed` keeps the failed
    /// batch's message matching its counts. Returns the batch's own move, if any.
    async fn batch_side_of_move(
        &self,
        job: &JobId,
        batch: &BatchId,
        from: JobState,
        to: JobState,
        ops: &mut Vec<Op>,
    ) -> Result<Option<(BatchState, BatchState)>> {
        let reentering =
            from.batch_folder() != "batch-processing" && to.batch_folder() == "batch-processing";
        let leaving_failed =
            from.batch_folder() == "batch-failed" && to.batch_folder() != "batch-failed";
        let mut batch_moved: Option<(BatchState, BatchState)> = None;
        // A batch that cannot be read now fails the call: skipping it left a reporter holding
        // a reopened batch free to report without the requeued job (found by `lading-sim`).
        let batch_status = if reentering || leaving_failed {
            match self.batch_status(batch).await {
                Ok(s) => Some(s),
                Err(EngineError::NoBatch(_)) => None,
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        if let Some((bstatus, bversion)) = batch_status {
            let mut touched = bstatus.clone();
            touched.last_modified = self.now();
            match bstatus.status {
                BatchState::Deleted if reentering => {
                    return Err(EngineError::Invalid(format!(
                        "job {job} belongs to batch {batch}, which is Deleted: it cannot be requeued"
                    )));
                }
                BatchState::Reporting
                | BatchState::UpdateReporting
                | BatchState::Failed
                | BatchState::Completed
                    if reentering =>
                {
                    touched.status = BatchState::Processing;
                    touched.message = Some(format!(
                        "reopened: job {job} requeued (was {})",
                        bstatus.status
                    ));
                    push_history(
                        &mut touched.extra,
                        Some(bstatus.status.name()),
                        BatchState::Processing.name(),
                        &touched.last_modified,
                        &self.owner,
                        0,
                        touched.message.as_deref(),
                    );
                    batch_moved = Some((bstatus.status, BatchState::Processing));
                }
                BatchState::Failed => {
                    // A failed job deleted: the message keeps matching the counts.
                    touched.message = Some(
                        self.batch_counts_message(batch, from.batch_folder(), to.batch_folder())
                            .await?,
                    );
                }
                _ => {}
            }
            if reentering {
                // When the last job came back: a reopened batch's report waits for the
                // requeues to settle (see `REQUEUED_AT`).
                touched
                    .extra
                    .insert(REQUEUED_AT.into(), self.clock().now_ms().into());
            }
            if reentering && bstatus.status == BatchState::Pending {
                // Still in intake: no report can race the job back (none is made before the
                // intake's move to Processing, which this check orders against), and setting
                // the status would fence the intake holding the batch. Its next job creation
                // was refused, and the batch stayed Pending (found by `lading-sim`).
                ops.push(Op::check(batch_node(batch, "status"), Some(bversion)));
                // Nor may the job come back while an intake holds the batch: a retried
                // intake lists the batch's folders to skip the objects it made, in an order
                // every worker's move follows (Processing before Completed and Failed, those
                // before Deleted), and a job moved back from Failed between two of those
                // reads was in neither: its object got a second job (found by `lading-sim`,
                // seed 7012214). Taken and let go in this `multi`, the batch's lock is never
                // seen; held, the requeue is refused until the intake is done.
                ops.push(Op::create_mode(
                    batch_node(batch, "lock"),
                    None,
                    CreateMode::Ephemeral,
                ));
                ops.push(Op::delete(batch_node(batch, "lock"), None));
            } else if reentering || touched.message != bstatus.message {
                ops.push(Op::set(
                    batch_node(batch, "status"),
                    json_bytes(&touched),
                    Some(bversion),
                ));
            }
        }
        Ok(batch_moved)
    }

    /// Admin: Pending → Held.
    pub async fn hold_batch(&self, batch: &BatchId) -> Result<BatchStatus> {
        self.admin_batch(batch, BatchState::Held, Some("held by admin".into()))
            .await
    }

    /// Admin: Held → Pending.
    pub async fn release_batch(&self, batch: &BatchId) -> Result<BatchStatus> {
        self.admin_batch(batch, BatchState::Pending, None).await
    }

    /// Admin: Failed → UpdateReporting.
    pub async fn update_reporting(&self, batch: &BatchId) -> Result<BatchStatus> {
        self.admin_batch(batch, BatchState::UpdateReporting, None)
            .await
    }

    /// Admin: Failed or Held → Deleted. Every job of the batch must be deletable (Failed,
    /// Held, Completed or Deleted); Failed and Held jobs are marked Deleted too.
    pub async fn delete_batch(&self, batch: &BatchId) -> Result<BatchStatus> {
        let (status, _) = self.batch_status(batch).await?;
        status.status.resolve(Event::To(BatchState::Deleted))?;
        let info = self.batch(batch).await?;
        let jobs: Vec<JobId> = info.jobs.values().flatten().cloned().collect();
        for j in &jobs {
            let (s, _) = self.job_status(j).await?;
            if !s.status.is_deletable() {
                return Err(EngineError::Invalid(format!(
                    "batch {batch} cannot be deleted: its job {j} is {} (only Failed, Held, Completed or Deleted jobs may be)",
                    s.status
                )));
            }
        }
        for j in &jobs {
            let (s, _) = self.job_status(j).await?;
            if matches!(s.status, JobState::Failed | JobState::Held) {
                self.admin_job(j, |p| p.apply(Event::To(JobState::Deleted)))
                    .await?;
            }
        }
        self.admin_batch(batch, BatchState::Deleted, Some("deleted by admin".into()))
            .await
    }

    /// An admin move of an unlocked job. `f` computes the new progress from the current one.
    /// A version that moved meanwhile (the job, or its batch being reported) means reading
    /// again and retrying, a bounded number of times.
    pub(crate) async fn admin_job(
        &self,
        job: &JobId,
        f: impl Fn(JobProgress) -> Result<JobProgress, lading_core::IllegalTransition>,
    ) -> Result<JobStatus> {
        for _ in 0..MAX_OPTIMISTIC {
            if let Some(st) = self.admin_job_once(job, &f).await? {
                return Ok(st);
            }
        }
        Err(EngineError::Conflict(job.to_string()))
    }

    /// One try of [`Engine::admin_job`]; `None` when a version moved.
    pub(crate) async fn admin_job_once(
        &self,
        job: &JobId,
        f: &impl Fn(JobProgress) -> Result<JobProgress, lading_core::IllegalTransition>,
    ) -> Result<Option<JobStatus>> {
        let (old, version) = self.job_status(job).await?;
        let batch = self.job_batch(job).await?;
        let priority = self.job_priority(job).await?;
        let progress = JobProgress {
            state: old.status,
            last_successful: old.last_successful_status,
            retry_count: old.retry_count,
        };
        let next = f(progress)?;
        let mut extra = old.extra.clone();
        if next.state != JobState::Failed {
            clear_failure(&mut extra);
        }
        let status = self.next_job_status(old.status, &next, extra, None, Some("by an admin"));
        let lock = job_node(job, "lock");
        let mut ops = vec![
            Op::create_mode(&lock, None, CreateMode::Ephemeral),
            Op::set(job_node(job, "status"), json_bytes(&status), Some(version)),
        ];
        self.folder_ops(&batch, old.status, next.state, &mut ops)
            .await?;
        self.move_ops(job, &batch, priority, old.status, next.state, &mut ops);
        // Back into batch-processing: bump the batch status version so a concurrent
        // `maybe_report` that saw the folder empty cannot win. A batch already reporting or
        // reported is reopened (back to Processing): it reports again, with the next report
        // number, once its jobs are done; a reporter holding it loses its lease, and nothing it
        // meant to record (the report, its mail) is.
        let batch_moved = self
            .batch_side_of_move(job, &batch, old.status, next.state, &mut ops)
            .await?;
        ops.push(Op::delete(&lock, None));
        match self.tree.multi(ops).await {
            Ok(_) => {}
            Err(e) if matches!(e.root(), TreeError::NodeExists(p) if *p == batch_node(&batch, "lock")) =>
            {
                return Err(EngineError::Locked(format!(
                    "batch {batch} (its intake is taking in its objects)"
                )));
            }
            Err(e) if matches!(e.root(), TreeError::NodeExists(p) if p.ends_with("/lock")) => {
                return Err(EngineError::Locked(job.to_string()));
            }
            Err(e) if matches!(e.root(), TreeError::BadVersion { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        self.publish(
            crate::ChangeKind::Job,
            job.as_str(),
            Some(&batch),
            Some(old.status.name()),
            next.state.name(),
        );
        if let Some((from, to)) = batch_moved {
            self.publish(
                crate::ChangeKind::Batch,
                batch.as_str(),
                None,
                Some(from.name()),
                to.name(),
            );
        }
        if next.state.batch_folder() != "batch-processing"
            && old.status.batch_folder() == "batch-processing"
        {
            self.maybe_report(&batch).await?;
        }
        Ok(Some(status))
    }

    /// Admin: Pending → Held.
    pub async fn hold_job(&self, job: &JobId) -> Result<JobStatus> {
        self.admin_job(job, |p| {
            p.apply(Event::To(JobState::Held))
                .map_err(|e| lading_core::IllegalTransition {
                    why: Some("only a Pending job can be held"),
                    ..e.asked("hold")
                })
        })
        .await
    }

    /// Admin: Held → Pending.
    pub async fn release_job(&self, job: &JobId) -> Result<JobStatus> {
        self.admin_job(job, |p| {
            if p.state != JobState::Held {
                return Err(lading_core::IllegalTransition {
                    kind: "job",
                    from: p.state.to_string(),
                    to: "Pending (release)".into(),
                    why: Some("only a Held job can be released"),
                    asked: Some("release"),
                });
            }
            p.apply(Event::To(JobState::Pending))
        })
        .await
    }

    /// Admin: requeue a Failed job to `target`, by default the stage that failed.
    /// The default target is the recorded `failed_stage` (Lading's own field), so a job whose
    /// `last_successful_status` another tool set to `"Failed"` (Merritt does, moving a job
    /// out of Failed) still goes back to the stage that failed.
    pub async fn requeue_job(&self, job: &JobId, target: Option<JobState>) -> Result<JobStatus> {
        let target = match target {
            Some(t) => Some(t),
            None => {
                let (st, _) = self.job_status(job).await?;
                failed_stage(&st).and_then(JobState::parse).filter(|s| {
                    !matches!(
                        s,
                        JobState::Failed | JobState::Completed | JobState::Deleted | JobState::Held
                    )
                })
            }
        };
        self.admin_job(job, |p| p.requeue(target)).await
    }

    /// Admin: requeue every Failed job of `batch` — only those that failed at `stage`, when
    /// given — each to `target` or to the stage it failed at, as [`requeue_job`] does. One
    /// result per job, in job order: a job moved meanwhile by another admin or process
    /// reports its error and the others go on. `NoBatch` for a batch that does not exist.
    ///
    /// [`requeue_job`]: Self::requeue_job
    pub async fn requeue_failed(
        &self,
        batch: &BatchId,
        stage: Option<JobState>,
        target: Option<JobState>,
    ) -> Result<Vec<(JobId, Result<JobStatus>)>> {
        self.batch_status(batch).await?;
        let mut names = match self
            .tree
            .children(&batch_ref_folder(batch, "batch-failed"))
            .await
        {
            Ok(c) => c,
            Err(TreeError::NoNode(_)) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        names.sort();
        let mut out = Vec::new();
        for name in names {
            let Ok(jid) = JobId::parse(&name) else {
                continue;
            };
            if let Some(want) = stage {
                let failed_at = match self.job_status(&jid).await {
                    Ok((st, _)) => failed_stage(&st).and_then(JobState::parse),
                    Err(e) => {
                        out.push((jid, Err(e)));
                        continue;
                    }
                };
                if failed_at != Some(want) {
                    continue;
                }
            }
            let r = self.requeue_job(&jid, target).await;
            out.push((jid, r));
        }
        Ok(out)
    }

    /// Admin: delete a job. Failed and Held jobs move to Deleted; Completed and Deleted jobs
    /// are purged from the tree. Any other state is refused.
    pub async fn delete_job(&self, job: &JobId) -> Result<Option<JobStatus>> {
        let (status, _) = self.job_status(job).await?;
        match status.status {
            JobState::Failed | JobState::Held => Ok(Some(
                self.admin_job(job, |p| p.apply(Event::To(JobState::Deleted)))
                    .await?,
            )),
            JobState::Completed | JobState::Deleted => {
                self.purge_job(job).await?;
                Ok(None)
            }
            s => Err(lading_core::IllegalTransition {
                kind: "job",
                from: s.to_string(),
                to: JobState::Deleted.to_string(),
                why: Some("only a Failed or Held job can be deleted (a Completed one is purged); a Pending job can be held first"),
                asked: Some("delete"),
            }
            .into()),
        }
    }

    /// Removes every node of a finished job (Completed or Deleted).
    pub async fn purge_job(&self, job: &JobId) -> Result<()> {
        let (status, version) = self.job_status(job).await?;
        if !matches!(status.status, JobState::Completed | JobState::Deleted) {
            return Err(lading_core::IllegalTransition {
                kind: "job",
                from: status.status.to_string(),
                to: "purged".into(),
                why: Some("only a finished one can be purged"),
                asked: Some("purge"),
            }
            .into());
        }
        let batch = self.job_batch(job).await?;
        // A batch still in intake (Pending, or Held before its intake ran again) may be
        // taken in once more, and a retried intake skips exactly the rows whose jobs it can
        // read: a job purged then would be made again. Once a batch has left intake it never
        // comes back to it, so no check on its version is needed.
        match self.batch_status(&batch).await {
            Ok((b, _)) if matches!(b.status, BatchState::Pending | BatchState::Held) => {
                return Err(EngineError::Invalid(format!(
                    "job {job} cannot be purged yet: its batch {batch} is {} (its intake has not finished, and a retried intake would make the job again); purge it once the batch is Processing",
                    b.status
                )));
            }
            Ok(_) | Err(EngineError::NoBatch(_)) => {}
            Err(e) => return Err(e),
        }
        let priority = self.job_priority(job).await?;
        let mut ops = vec![Op::check(job_node(job, "status"), Some(version))];
        for child in self.tree.children(&job_path(job)).await? {
            if child == "lock" {
                return Err(EngineError::Locked(job.to_string()));
            }
            ops.push(Op::delete(job_node(job, &child), None));
        }
        ops.push(Op::delete(job_path(job), None));
        let jref = job_ref(status.status, priority, job);
        if self.tree.exists(&jref).await?.is_some() {
            ops.push(Op::delete(jref, None));
        }
        let bref = batch_ref(&batch, status.status.batch_folder(), job);
        if self.tree.exists(&bref).await?.is_some() {
            ops.push(Op::delete(bref, None));
        }
        self.tree.multi(ops).await.map_err(|e| match e.root() {
            TreeError::BadVersion { .. } => EngineError::Conflict(job.to_string()),
            _ => e.into(),
        })?;
        Ok(())
    }

    /// Removes a finished access request (Completed, Failed or Deleted) from its queue
    /// (cleanup). A locked or unfinished one is refused.
    pub async fn purge_access(&self, queue: AccessQueue, id: &AccessId) -> Result<()> {
        let path = access_path(queue, id);
        let (status, version) = self
            .read_json::<AccessStatus>(&format!("{path}/status"))
            .await?
            .ok_or_else(|| EngineError::NoAccess(id.to_string()))?;
        if !matches!(
            status.status,
            AccessState::Completed | AccessState::Failed | AccessState::Deleted
        ) {
            return Err(lading_core::IllegalTransition {
                kind: "access",
                from: status.status.to_string(),
                to: "purged".into(),
                why: Some("only a finished one can be purged"),
                asked: Some("purge"),
            }
            .into());
        }
        let mut ops = vec![Op::check(format!("{path}/status"), Some(version))];
        for child in self.tree.children(&path).await? {
            if child == "lock" {
                return Err(EngineError::Locked(id.to_string()));
            }
            ops.push(Op::delete(format!("{path}/{child}"), None));
        }
        ops.push(Op::delete(&path, None));
        self.tree.multi(ops).await.map_err(|e| match e.root() {
            TreeError::BadVersion { .. } => EngineError::Conflict(id.to_string()),
            _ => e.into(),
        })?;
        Ok(())
    }

    /// Access requests of a queue, oldest first.
    pub async fn access_ids(&self, queue: AccessQueue) -> Result<Vec<AccessId>> {
        Ok(self
            .tree
            .children(&access_folder(queue))
            .await?
            .iter()
            .filter_map(|n| AccessId::parse(n).ok())
            .collect())
    }

    /// Removes a Completed or Deleted batch with all its jobs (cleanup). Jobs that are not
    /// finished are refused by name.
    pub async fn purge_batch(&self, batch: &BatchId) -> Result<usize> {
        let info = self.batch(batch).await?;
        if !matches!(
            info.status.status,
            BatchState::Completed | BatchState::Deleted
        ) {
            return Err(EngineError::Invalid(format!(
                "batch {batch} is {}, only Completed or Deleted batches are purged",
                info.status.status
            )));
        }
        // Held (by a reporter, or an admin's tool): its jobs are left alone too.
        if info.locked {
            return Err(EngineError::Locked(batch.to_string()));
        }
        let mut purged = 0;
        for jid in info.jobs.values().flatten() {
            match self.purge_job(jid).await {
                Ok(()) => purged += 1,
                Err(EngineError::NoJob(_)) => {}
                Err(e) => return Err(e),
            }
        }
        // Read again, and its version checked in the commit: a batch that moved on since
        // (a job deleted sends it back to reporting) is not removed under its reporter.
        let (now, version) = self.batch_status(batch).await?;
        if !matches!(now.status, BatchState::Completed | BatchState::Deleted) {
            return Err(EngineError::Conflict(batch.to_string()));
        }
        let mut ops = vec![Op::check(batch_node(batch, "status"), Some(version))];
        self.delete_subtree_ops(&batch_path(batch), &mut ops)
            .await?;
        if let Some(uuid) = info.submission.text("batchID")
            && self.tree.exists(&batch_uuid_path(uuid)).await?.is_some()
        {
            ops.push(Op::delete(batch_uuid_path(uuid), None));
        }
        if let Some(who) = info.submission.submitter() {
            let entry = format!("{}/{batch}", submitter_batches(who));
            if self.tree.exists(&entry).await?.is_some() {
                ops.push(Op::delete(entry, None));
            }
        }
        self.tree.multi(ops).await.map_err(|e| match e.root() {
            TreeError::BadVersion { .. } => EngineError::Conflict(batch.to_string()),
            _ => e.into(),
        })?;
        self.watched.forget(BATCHES, WatchKind::Children);
        Ok(purged)
    }

    pub(crate) async fn delete_subtree_ops(&self, path: &str, ops: &mut Vec<Op>) -> Result<()> {
        let mut stack = vec![(path.to_string(), false)];
        while let Some((p, expanded)) = stack.pop() {
            if expanded {
                ops.push(Op::delete(p, None));
                continue;
            }
            let children = self.tree.children(&p).await?;
            stack.push((p.clone(), true));
            for c in children {
                if c == "lock" {
                    return Err(EngineError::Locked(p));
                }
                stack.push((join(&p, &c), false));
            }
        }
        Ok(())
    }
}
