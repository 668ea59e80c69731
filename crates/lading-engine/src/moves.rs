//! Job moves: the `multi` that moves a job between states (its status, its state reference,
//! its batch reference, effects), chained acquisition, deferral and per-job data.

use super::*;

impl Engine {
    /// The ops that move a job's references from `old` to `new` state (and batch folder).
    /// Ops creating the batch reference folder a job moves into when no one has made it yet:
    /// Merritt creates `states/batch-processing` when it first needs it and the others only
    /// when its own code moves a job there, so a batch it made may lack them. Folders seen
    /// are remembered (they are never removed while the batch lives).
    pub(crate) async fn folder_ops(
        &self,
        batch: &BatchId,
        old: JobState,
        new: JobState,
        ops: &mut Vec<Op>,
    ) -> Result<()> {
        let folder = new.batch_folder();
        if folder == old.batch_folder() {
            return Ok(());
        }
        let path = batch_ref_folder(batch, folder);
        if self
            .known_folders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&path)
        {
            return Ok(());
        }
        if self.tree.exists(&path).await?.is_some() {
            let mut known = self.known_folders.lock().unwrap_or_else(|p| p.into_inner());
            if known.len() >= JOB_BATCHES_KEPT {
                known.clear();
            }
            known.insert(path);
            return Ok(());
        }
        if self.tree.exists(&batch_states(batch)).await?.is_none() {
            ops.push(Op::create(batch_states(batch), None));
        }
        ops.push(Op::create(path, None));
        Ok(())
    }

    pub(crate) fn move_ops(
        &self,
        job: &JobId,
        batch: &BatchId,
        priority: u8,
        old: JobState,
        new: JobState,
        ops: &mut Vec<Op>,
    ) {
        if old != new {
            ops.push(Op::delete(job_ref(old, priority, job), None));
            ops.push(Op::create(job_ref(new, priority, job), None));
        }
        let (of, nf) = (old.batch_folder(), new.batch_folder());
        if of != nf {
            ops.push(Op::delete(batch_ref(batch, of, job), None));
            ops.push(Op::create(batch_ref(batch, nf, job), None));
        }
    }

    /// Moves a leased job by success, fail or an explicit target, in one `multi`, and
    /// releases the lock. Returns the new status.
    pub async fn job_transition(
        &self,
        lease: JobLease,
        event: Event<JobState>,
        message: Option<String>,
    ) -> Result<JobStatus> {
        let lock = job_node(&lease.job, "lock");
        let r = self
            .job_transition_inner(&lease, event, message, false)
            .await;
        // The lock may still be this session's (a status changed under it, a reply lost).
        self.settle(&lock, lease.session, &r).await;
        let (status, _) = r?;
        if status.status.batch_folder() != "batch-processing" {
            self.maybe_report(&lease.batch).await?;
        }
        Ok(status)
    }

    /// Like [`Engine::job_transition`] but keeps the lock: the caller goes on to work on the
    /// job's next stage itself. Returns the updated lease.
    pub async fn job_advance(
        &self,
        mut lease: JobLease,
        event: Event<JobState>,
        message: Option<String>,
    ) -> Result<JobLease> {
        let (status, version) = match self
            .job_transition_inner(&lease, event, message, true)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                let e = Err(e);
                self.settle(&job_node(&lease.job, "lock"), lease.session, &e)
                    .await;
                return e;
            }
        };
        lease.status = status;
        lease.status_version = version;
        if lease.status.status.batch_folder() != "batch-processing" {
            self.maybe_report(&lease.batch).await?;
        }
        Ok(lease)
    }

    pub(crate) async fn job_transition_inner(
        &self,
        lease: &JobLease,
        event: Event<JobState>,
        message: Option<String>,
        keep_lock: bool,
    ) -> Result<(JobStatus, i32)> {
        let (mut ops, status) = self.transition_plan(lease, event, message).await?;
        let lock = job_node(&lease.job, "lock");
        if !keep_lock {
            ops.push(Op::delete(&lock, None));
        }
        if let Err(e) = self.move_multi(lease.session, ops).await {
            // The callers abandon the lock, which may still be this session's.
            return Err(self.lease_error(e, lease.job.as_str()));
        }
        self.publish_move(lease, &status);
        Ok((status, lease.status_version + 1))
    }

    /// The `multi` of a job's move. Under the `split-move` sabotage the status goes alone
    /// first (the lock check and the status set), then the references and the rest.
    /// On the lease's `session` only (see `Tree::multi_on`).
    async fn move_multi(
        &self,
        session: u64,
        mut ops: Vec<Op>,
    ) -> std::result::Result<(), TreeError> {
        if sabotage::on(sabotage::NO_FENCING) {
            // No session check either: whatever session the tree has now carries it.
            return self.tree.multi(ops).await.map(|_| ());
        }
        if sabotage::on(sabotage::SPLIT_MOVE) && ops.len() > 2 {
            let rest = ops.split_off(2);
            self.tree.multi_on(session, ops).await?;
            ops = rest;
        }
        self.tree.multi_on(session, ops).await.map(|_| ())
    }

    pub(crate) fn publish_move(&self, lease: &JobLease, status: &JobStatus) {
        self.publish(
            crate::ChangeKind::Job,
            lease.job.as_str(),
            Some(&lease.batch),
            Some(lease.status.status.name()),
            status.status.name(),
        );
    }

    /// The ops of a leased job's move (the lock is checked, not dropped) and its new status.
    pub(crate) async fn transition_plan(
        &self,
        lease: &JobLease,
        event: Event<JobState>,
        message: Option<String>,
    ) -> Result<(Vec<Op>, JobStatus)> {
        if !sabotage::on(sabotage::NO_FENCING) {
            self.check_job_lease(lease)?;
        }
        let old = &lease.status;
        let progress = JobProgress {
            state: old.status,
            last_successful: old.last_successful_status,
            retry_count: old.retry_count,
        };
        let next = progress.apply(event)?;
        let mut extra = old.extra.clone();
        if next.state != old.status {
            if next.state == JobState::Failed {
                // What failed, how, after how many attempts: kept with the failed job.
                let attempts = extra
                    .get(ATTEMPTS_FIELD)
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
                    + 1;
                extra.insert(FAILED_STAGE_FIELD.into(), Value::from(old.status.name()));
                extra.insert(
                    FAILURE_KIND_FIELD.into(),
                    Value::from(lease.failure_kind.unwrap_or("fatal")),
                );
                extra.insert(FAILED_ATTEMPTS_FIELD.into(), Value::from(attempts));
            } else {
                clear_failure(&mut extra);
            }
            // Attempts and retry times belong to the stage being left.
            extra.remove(ATTEMPTS_FIELD);
            extra.remove(RETRY_AT_FIELD);
        }
        // A space reservation lasts until the download ends, either way.
        let release = extra.contains_key(RESERVED_FIELD)
            && !matches!(next.state, JobState::Provisioning | JobState::Downloading);
        if release {
            extra.remove(RESERVED_FIELD);
        }
        let why = message.clone();
        let status = self.next_job_status(old.status, &next, extra, message, why.as_deref());
        let lock = job_node(&lease.job, "lock");
        let mut ops = vec![
            Op::check(&lock, None),
            Op::set(
                job_node(&lease.job, "status"),
                json_bytes(&status),
                Some(lease.status_version),
            ),
        ];
        if sabotage::on(sabotage::NO_FENCING) {
            ops = vec![Op::set(
                job_node(&lease.job, "status"),
                json_bytes(&status),
                None,
            )];
        }
        self.folder_ops(&lease.batch, old.status, next.state, &mut ops)
            .await?;
        self.move_ops(
            &lease.job,
            &lease.batch,
            lease.priority,
            old.status,
            next.state,
            &mut ops,
        );
        if release {
            ops.push(Op::delete(
                reserve::reservation_path(lease.job.as_str()),
                None,
            ));
        }
        ops.extend(self.effect_ops(&lease.effects));
        Ok((ops, status))
    }

    /// Moves a leased job as [`Engine::job_transition`] does and, in the same `multi`, locks
    /// the next job to work on in the first of `next` that has one free: a daemon going
    /// straight on to its next job pays one round trip per job, not two. Every stage still
    /// releases its job and takes the next one by its lock, so nothing else changes for
    /// other workers. When someone else locked that job first, the move is tried once more
    /// with the next free job, then made alone with no lease coming back (acquire as usual
    /// then); an engine that keeps losing such races mostly moves alone for a while
    /// (`Contention::next_score`). Returns the new status and the next lease.
    pub async fn job_transition_then_acquire(
        &self,
        lease: JobLease,
        event: Event<JobState>,
        message: Option<String>,
        next: &[JobState],
    ) -> Result<(JobStatus, Option<JobLease>)> {
        let lock = job_node(&lease.job, "lock");
        let (mut move_ops, status) = match self.transition_plan(&lease, event, message).await {
            Ok(p) => p,
            Err(e) => {
                let e = Err(e);
                self.settle(&lock, lease.session, &e).await;
                return e;
            }
        };
        move_ops.push(Op::delete(&lock, None));
        let mut tries = if self.contention.take_next_along() {
            0
        } else {
            NEXT_TRIES
        };
        let mut taken: Option<Candidate> = None;
        while tries < NEXT_TRIES {
            let c = match self.claim_next(next).await {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => {
                    self.abandon_on(&lock, lease.session).await;
                    return Err(e);
                }
            };
            tries += 1;
            // Its lock is made in the move's `multi`, on the lease's session: claimed under
            // another (the session changed since the lease), the move fails anyway, and the
            // claim is let go here (left, it kept this process off the job for good: found
            // by `lading-sim`).
            if c.session != lease.session {
                self.unclaim(&c.lock);
                break;
            }
            let mut ops = move_ops.clone();
            let ours = ops.len();
            ops.push(Op::check(&c.reference, None));
            ops.push(Op::create_mode(
                &c.lock,
                self.lock_data(),
                CreateMode::Ephemeral,
            ));
            // The next job's record is read once the move has committed (in
            // `lease_locked`), never beside it: a read sent with the `multi` may be served
            // before it and see a status that a deferral rewrote in between (the reference
            // stays put, so the move's check passes), and a lease at that stale version is
            // refused at its next move (`lading-sim` seed 124).
            let moved = self.move_multi(lease.session, ops).await;
            match moved {
                Ok(_) => {
                    self.contention.score_next(1);
                    taken = Some(c);
                    break;
                }
                Err(e) => {
                    if !(e.failed_op().is_some_and(|i| i >= ours) && lost_race(&e)) {
                        // Unknown whether it was made: both locks may be this session's.
                        self.abandon_on(&c.lock, lease.session).await;
                        self.abandon_on(&lock, lease.session).await;
                        return Err(self.lease_error(e, lease.job.as_str()));
                    }
                    self.unclaim_on(&c.lock, lease.session);
                    // Another worker took that job, or it moved on: try the next free one
                    // with the move again (each try costs what the move alone would).
                    self.contention
                        .mark_busy(&c.folder, &c.name, self.tree.session_id());
                    if claims::held_by_another(&e, ours + 1) {
                        self.contention.note_raced(self.clock.now_ms());
                    }
                    self.contention.score_next(-2);
                }
            }
        }
        if taken.is_none()
            && let Err(e) = self.move_multi(lease.session, move_ops).await
        {
            self.abandon_on(&lock, lease.session).await;
            return Err(self.lease_error(e, lease.job.as_str()));
        }
        self.unclaim_on(&lock, lease.session);
        self.publish_move(&lease, &status);
        let reported = if status.status.batch_folder() != "batch-processing" {
            self.maybe_report(&lease.batch).await
        } else {
            Ok(false)
        };
        // The move is made whatever happens to the next job: a job that cannot be leased now
        // (deferred, or unreadable: its lock is dropped) is left for a full acquisition.
        let next = match taken {
            None => None,
            Some(c) => match self.lease_locked(&c, false).await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(job = %c.jid, error = %e, "cannot lease the next job");
                    None
                }
            },
        };
        match reported {
            Ok(_) => Ok((status, next)),
            Err(e) => {
                if let Some(n) = next {
                    let _ = self.release_job_lease(n).await;
                }
                Err(e)
            }
        }
    }

    /// Makes a job deferred in `state` due now (it waited for something that has come, e.g.
    /// a quota slot): its retry time is cleared and its reference re-made, so waiting workers
    /// look again, in one `multi` that also takes and drops its lock (so no worker holds it
    /// meanwhile). This process forgets the deferral at once; another process that saw the
    /// job deferred takes it when its own record of the retry time runs out. Returns false
    /// when the job is not in `state`, not deferred (due already) or locked.
    pub async fn wake_job(&self, state: JobState, job: &JobId) -> Result<bool> {
        let (mut status, version) = self.job_status(job).await?;
        if status.status != state {
            return Ok(false);
        }
        let priority = self.job_priority(job).await?;
        let folder = job_state_folder(state);
        let name = job_ref_name(priority, job);
        let forget = || self.contention.forget_deferred(&folder, &name);
        if retry_at(&status).is_none_or(|at| at <= self.clock.now_ms()) {
            // Due already (its deferral ran out, or is not written yet: a quota's park
            // records the waiter before the worker defers the job): nothing to wake.
            forget();
            return Ok(false);
        }
        status.extra.remove(RETRY_AT_FIELD);
        // Forgotten before the commit: a worker woken by it must not find it still deferred
        // here (should the commit fail, the next look at the job defers it again).
        forget();
        let lock = job_node(job, "lock");
        let reference = job_ref(state, priority, job);
        let r = self
            .tree
            .multi(vec![
                Op::create(&lock, None),
                Op::set(job_node(job, "status"), json_bytes(&status), Some(version)),
                Op::delete(&reference, None),
                Op::create(&reference, None),
                Op::delete(&lock, None),
            ])
            .await;
        match r {
            Ok(_) => {
                // And after it: a worker of this process that looked at the job while the
                // commit was on its way found it still deferred and recorded that again, and
                // would have passed it over until its old retry time (found by `lading-sim`).
                // A waiter that did so on the commit's own watch event is waiting again
                // (seed 96): it is told to look once more.
                forget();
                if !sabotage::on(sabotage::LOST_WAKE_SIGNAL) {
                    self.woken_in(state).notify_waiters();
                }
                Ok(true)
            }
            Err(e)
                if matches!(
                    e.root(),
                    TreeError::NodeExists(_) | TreeError::BadVersion { .. } | TreeError::NoNode(_)
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Gives a job back in its state, not to be taken again before `retry_at_ms` (ms since the
    /// epoch), recording `attempts` of its current stage and the reason: one `multi` that
    /// rewrites the status (version-checked) and deletes the lock. Every worker, in every
    /// process, honours the retry time.
    pub async fn job_defer(
        &self,
        lease: JobLease,
        retry_at_ms: u64,
        attempts: u32,
        message: Option<String>,
    ) -> Result<JobStatus> {
        let lock = job_node(&lease.job, "lock");
        if let Err(e) = self.check_job_lease(&lease) {
            self.unclaim_on(&lock, lease.session);
            return Err(e);
        }
        let mut status = lease.status.clone();
        status.last_modified = self.now();
        status.message = message;
        status
            .extra
            .insert(ATTEMPTS_FIELD.to_string(), Value::from(attempts));
        status
            .extra
            .insert(RETRY_AT_FIELD.to_string(), Value::from(retry_at_ms));
        let ops = vec![
            Op::check(&lock, None),
            Op::set(
                job_node(&lease.job, "status"),
                json_bytes(&status),
                Some(lease.status_version),
            ),
            Op::delete(&lock, None),
        ];
        if let Err(e) = self.tree.multi_on(lease.session, ops).await {
            self.abandon_on(&lock, lease.session).await;
            return Err(self.lease_error(e, lease.job.as_str()));
        }
        self.unclaim_on(&lock, lease.session);
        self.contention.mark_deferred(
            &job_state_folder(lease.state()),
            &job_ref_name(lease.priority, &lease.job),
            retry_at_ms,
            self.clock.now_ms(),
        );
        Ok(status)
    }

    /// Gives a job back without moving it (e.g. a transient error; another worker retries).
    pub async fn release_job_lease(&self, lease: JobLease) -> Result<()> {
        let lock = job_node(&lease.job, "lock");
        if let Err(e) = self.check_job_lease(&lease) {
            self.unclaim_on(&lock, lease.session);
            return Err(e);
        }
        self.release_lock(&lock, lease.job.as_str(), lease.session)
            .await
    }

    /// Changes a leased job's priority: rewrites `priority` and renames its `PP-JID` reference.
    pub async fn set_priority(&self, lease: &mut JobLease, priority: u8) -> Result<()> {
        check_priority(priority)?;
        self.check_job_lease(lease)?;
        if priority == lease.priority {
            return Ok(());
        }
        let state = lease.state();
        let ops = vec![
            Op::check(job_node(&lease.job, "lock"), None),
            Op::check(job_node(&lease.job, "status"), Some(lease.status_version)),
            Op::set(
                job_node(&lease.job, "priority"),
                Some(priority.to_string().into_bytes()),
                None,
            ),
            Op::delete(job_ref(state, lease.priority, &lease.job), None),
            Op::create(job_ref(state, priority, &lease.job), None),
        ];
        self.tree
            .multi_on(lease.session, ops)
            .await
            .map_err(|e| self.lease_error(e, lease.job.as_str()))?;
        lease.priority = priority;
        Ok(())
    }

    /// Sets `space_needed` of a leased job.
    pub async fn set_space_needed(&self, lease: &JobLease, bytes: u64) -> Result<()> {
        self.set_job_node(lease, "space_needed", bytes.to_string().into_bytes())
            .await
    }

    /// Writes one of a leased job's JSON data nodes.
    pub async fn set_job_data(&self, lease: &JobLease, data: JobData<'_>) -> Result<()> {
        let bytes = match data {
            JobData::Identifiers(v) => to_bytes(v),
            JobData::Metadata(v) => to_bytes(v),
            JobData::Inventory(v) | JobData::Store(v) | JobData::StoreProgress(v) => to_bytes(v),
        };
        self.set_job_node(lease, data.node(), bytes).await
    }

    /// What fences a write of the lease holder's own beside the job (a quota slot, a note
    /// that it waits): its ops first in that write's `multi`, sent on the lease's session
    /// ([`Fence::multi`]), make it fail once the lease is lost. `LeaseLost` at once when this
    /// process's session is not the lease's.
    pub fn job_fence(&self, lease: &JobLease) -> Result<Fence> {
        self.check_job_lease(lease)?;
        Ok(Fence {
            session: lease.session,
            ops: vec![Op::check(job_node(&lease.job, "lock"), None)],
        })
    }

    pub(crate) async fn set_job_node(
        &self,
        lease: &JobLease,
        name: &str,
        bytes: Vec<u8>,
    ) -> Result<()> {
        self.check_job_lease(lease)?;
        let path = job_node(&lease.job, name);
        let write = if self.tree.exists(&path).await?.is_some() {
            Op::set(&path, Some(bytes), None)
        } else {
            Op::create(&path, Some(bytes))
        };
        self.tree
            .multi_on(
                lease.session,
                vec![Op::check(job_node(&lease.job, "lock"), None), write],
            )
            .await
            .map_err(|e| self.lease_error(e, lease.job.as_str()))?;
        Ok(())
    }
}
