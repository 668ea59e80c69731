//! Reporting: the status report, and noticing batches whose last job has finished
//! (whoever moved it).

use super::*;

/// What [`Engine::try_report`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportTry {
    /// This call moved the batch on to Reporting.
    Moved,
    /// Not Processing, gone, or with jobs still in `batch-processing`.
    NotFinished,
    /// Finished, but another session holds the batch's lock (see
    /// [`Engine::watch_batch_lock`]).
    Held,
    /// `batch-processing` is empty, but the last job to leave it has not landed in another
    /// folder yet: a writer that moves a reference in two requests (Merritt's
    /// `Job.setBatchStatePath` deletes the old one, then makes the new) is between them. Try
    /// again shortly; [`Engine::report_landed`] reports without it once it is given up on.
    Landing,
}

impl Engine {
    /// Writes `/batches/BID/status-report` under the batch lease.
    pub async fn write_status_report(
        &self,
        lease: &BatchLease,
        report: &StatusReport,
    ) -> Result<()> {
        self.check_batch_lease(lease)?;
        let path = batch_node(&lease.batch, "status-report");
        let mut report = report.clone();
        report.last_modified = self.now();
        let write = if self.tree.exists(&path).await?.is_some() {
            Op::set(&path, json_bytes(&report), None)
        } else {
            Op::create(&path, json_bytes(&report))
        };
        self.tree
            .multi_on(
                lease.session,
                vec![Op::check(batch_node(&lease.batch, "lock"), None), write],
            )
            .await
            .map_err(|e| self.lease_error(e, lease.batch.as_str()))?;
        Ok(())
    }

    /// The completed and failed jobs of a batch, as a report.
    pub async fn build_report(&self, batch: &BatchId) -> Result<StatusReport> {
        let list = |f: &'static str| async move {
            match self.tree.children(&batch_ref_folder(batch, f)).await {
                Ok(c) => Ok(c),
                Err(TreeError::NoNode(_)) => Ok(vec![]),
                Err(e) => Err(EngineError::from(e)),
            }
        };
        Ok(StatusReport {
            last_modified: self.now(),
            completed_jobs: list("batch-completed").await?,
            failed_jobs: list("batch-failed").await?,
            extra: Map::new(),
        })
    }

    /// Moves the batch to Reporting if it is Processing and its last job has left
    /// `batch-processing`. Safe to call any number of times, from anywhere: exactly one caller
    /// wins. Returns whether this call moved it.
    pub async fn maybe_report(&self, batch: &BatchId) -> Result<bool> {
        Ok(self.try_report(batch).await? == ReportTry::Moved)
    }

    /// [`Engine::maybe_report`], saying why it did not move the batch.
    pub async fn try_report(&self, batch: &BatchId) -> Result<ReportTry> {
        self.report_if_finished(batch, true).await
    }

    /// [`Engine::try_report`] for a batch found [`ReportTry::Landing`] for long enough: the
    /// reference that left `batch-processing` is taken to be gone for good (a writer that
    /// crashed between its two requests, a job deleted while running), and the batch is
    /// reported with the jobs its folders hold.
    pub async fn report_landed(&self, batch: &BatchId) -> Result<ReportTry> {
        self.report_if_finished(batch, false).await
    }

    async fn report_if_finished(&self, batch: &BatchId, wait_landing: bool) -> Result<ReportTry> {
        for attempt in 0..MAX_OPTIMISTIC {
            // The first look as acquisition's, when it finds the batch running (as most calls
            // do; a late one then fails the version check below). Anything else, and after a
            // refused write, is the tree's own answer: a status one watch event late must not
            // leave a finished batch unreported.
            let read = match attempt {
                0 => match self.batch_status_watched(batch).await {
                    Ok(s) if s.0.status == BatchState::Processing => Ok((*s).clone()),
                    _ => self.batch_status(batch).await,
                },
                _ => self.batch_status(batch).await,
            };
            let (status, version) = match read {
                Ok(s) => s,
                Err(EngineError::NoBatch(_)) => return Ok(ReportTry::NotFinished),
                Err(e) => return Err(e),
            };
            if status.status != BatchState::Processing {
                return Ok(ReportTry::NotFinished);
            }
            // One child is enough to know it is not empty; a count would cost the batch size.
            match self
                .tree
                .children_page(&batch_ref_folder(batch, "batch-processing"), None, 1)
                .await
            {
                Ok(c) if c.is_empty() => {}
                Ok(_) | Err(TreeError::NoNode(_)) => return Ok(ReportTry::NotFinished),
                Err(e) => return Err(e.into()),
            }
            if wait_landing && !self.last_job_landed(batch).await? {
                return Ok(ReportTry::Landing);
            }
            let mut next = status.clone();
            next.status = BatchState::Reporting;
            next.last_modified = self.now();
            next.message = None;
            push_history(
                &mut next.extra,
                Some(status.status.name()),
                BatchState::Reporting.name(),
                &next.last_modified,
                &self.owner,
                0,
                Some("its last job ended"),
            );
            let lock = batch_node(batch, "lock");
            let r = self
                .tree
                .multi(vec![
                    Op::create_mode(&lock, None, CreateMode::Ephemeral),
                    Op::set(
                        batch_node(batch, "status"),
                        json_bytes(&next),
                        (!sabotage::on(sabotage::REPORT_UNGUARDED)).then_some(version),
                    ),
                    Op::delete(&lock, None),
                ])
                .await;
            match r {
                Ok(_) => {
                    self.publish(
                        crate::ChangeKind::Batch,
                        batch.as_str(),
                        None,
                        Some(BatchState::Processing.name()),
                        BatchState::Reporting.name(),
                    );
                    return Ok(ReportTry::Moved);
                }
                // Someone holds the batch: a live holder checks again when it lets go, but
                // one that crashed lets go only when its session ends, and checks nothing.
                Err(e) if matches!(e.root(), TreeError::NodeExists(_)) => {
                    return Ok(ReportTry::Held);
                }
                Err(e) if matches!(e.root(), TreeError::BadVersion { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(EngineError::Conflict(batch.to_string()))
    }

    /// Whether the last change to `batch`'s `batch-processing` folder is matched by a change to
    /// another of its folders at least as late: true when its last job left in one transaction
    /// (Lading's moves), false while a two-request move is between its requests. Known where
    /// the tree keeps the order of child changes (ZooKeeper's `pzxid`); elsewhere every writer
    /// is Lading's, and true.
    async fn last_job_landed(&self, batch: &BatchId) -> Result<bool> {
        let order = |folder: &'static str| async move {
            match self.tree.exists(&batch_ref_folder(batch, folder)).await {
                Ok(s) => Ok(s.and_then(|s| s.pzxid)),
                Err(TreeError::NoNode(_)) => Ok(None),
                Err(e) => Err(EngineError::from(e)),
            }
        };
        let Some(left) = order("batch-processing").await? else {
            return Ok(true);
        };
        for folder in ["batch-completed", "batch-failed", "batch-deleted"] {
            if order(folder).await?.is_some_and(|landed| landed >= left) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Runs [`Engine::maybe_report`] over every Processing batch: the safety net for a worker
    /// that crashed between a job's last transition and the batch check.
    pub async fn sweep_reporting(&self) -> Result<usize> {
        let mut moved = 0;
        for b in self.batch_ids().await? {
            if self.maybe_report(&b).await? {
                moved += 1;
            }
        }
        Ok(moved)
    }

    /// The Processing batches to keep an eye on (the newest, at most a few hundred), each with
    /// a watch on its `batch-processing` folder, which fires when the batch may have finished,
    /// whoever moved its last job (another Lading process, Merritt's own tools); and the
    /// watches that say the list itself is out of date: one on the batches folder, and one on
    /// the status of each batch not yet running (it may start) or reporting or reported but
    /// for good (a requeue may reopen it). Check the batches with
    /// [`Engine::report_finished`] once the watches are set (a batch that finished before is
    /// caught then), and each one again after its watch fires ([`Engine::watch_finishing_one`]).
    pub async fn watch_finishing(&self) -> Result<Finishing> {
        let mut f = Finishing {
            batches: Vec::new(),
            stale: vec![self.shared_watch(BATCHES, WatchKind::Children).await?],
        };
        for b in self.batch_ids().await?.into_iter().rev() {
            if f.batches.len() >= WATCH_PROCESSING {
                break;
            }
            if self
                .terminal_batches
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(&b)
            {
                continue;
            }
            let status = batch_node(&b, "status");
            let starting = self.shared_watch(&status, WatchKind::Data).await?;
            // Remembered under that same watch: every wake of this list read every status.
            match self.batch_status_watched(&b).await.map(|s| s.0.status) {
                Ok(BatchState::Processing) => {}
                // Not started yet, or still being made (Merritt writes its status after its
                // node): the list is read again when its status is written.
                Ok(BatchState::Pending | BatchState::Held) => {
                    f.stale.push(starting);
                    continue;
                }
                // Reporting or reported: an admin's requeue reopens it (back to Processing),
                // and the list is read again then. Dropped, a reopened batch whose last job
                // finished while its reporter still held the lock was left in Processing
                // (found by `lading-sim`, seed 5015369 on 447bdb2).
                Ok(BatchState::Reporting | BatchState::UpdateReporting | BatchState::Failed) => {
                    f.stale.push(starting);
                    continue;
                }
                Err(EngineError::NoBatch(_)) => {
                    f.stale.push(starting);
                    continue;
                }
                Ok(_) => continue,
                Err(e) => return Err(e),
            }
            if let Some(w) = self.watch_finishing_one(&b).await? {
                f.batches.push((b, w));
            }
        }
        Ok(f)
    }

    /// A watch on `batch`'s `batch-processing` folder (see [`Engine::watch_finishing`]);
    /// `None` when it has none.
    pub async fn watch_finishing_one(&self, batch: &BatchId) -> Result<Option<Watch>> {
        let folder = batch_ref_folder(batch, "batch-processing");
        match self.shared_watch(&folder, WatchKind::Children).await {
            Ok(w) => Ok(Some(w)),
            Err(TreeError::NoNode(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// A watch on `batch`'s lock, when it is still held: it fires when the lock goes. `None`
    /// when it is gone already (the batch can be tried at once). For a finished batch that
    /// [`Engine::try_report`] found [`ReportTry::Held`].
    pub async fn watch_batch_lock(&self, batch: &BatchId) -> Result<Option<Watch>> {
        let lock = batch_node(batch, "lock");
        let w = self.shared_watch(&lock, WatchKind::Data).await?;
        // Gone before its watch was set: the watch would wait for a new lock.
        Ok(self.tree.exists(&lock).await?.map(|_| w))
    }

    /// Moves each of `batches` whose jobs have all finished on to Reporting; returns how
    /// many moved.
    pub async fn report_finished(&self, batches: &[BatchId]) -> Result<usize> {
        let mut moved = 0;
        for b in batches {
            if self.maybe_report(b).await? {
                moved += 1;
            }
        }
        Ok(moved)
    }

    /// The message of a Failed batch after one of its jobs moves from the reference folder
    /// `from` to `to`: the counts as they will be, and whether an update report is due.
    pub(crate) async fn batch_counts_message(
        &self,
        batch: &BatchId,
        from: &str,
        to: &str,
    ) -> Result<String> {
        let mut n = [0usize; 3];
        for (i, f) in ["batch-completed", "batch-failed", "batch-deleted"]
            .into_iter()
            .enumerate()
        {
            let c = match self.tree.count_children(&batch_ref_folder(batch, f)).await {
                Ok(c) => c as usize,
                Err(TreeError::NoNode(_)) => 0,
                Err(e) => return Err(e.into()),
            };
            n[i] = c + usize::from(f == to) - usize::from(f == from && c > 0);
        }
        let mut m = batch_summary(n[0], n[1], n[2]);
        if n[1] == 0 {
            m.push_str(": an update report is due");
        }
        Ok(m)
    }
}
