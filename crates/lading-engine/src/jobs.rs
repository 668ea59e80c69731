//! Jobs: creation, acquisition in priority-then-age order, leases and waiting.

use super::*;
use crate::claims::Locked;
use crate::contention::Seen;

impl Engine {
    /// Creates a Pending job in a batch the caller holds (batch intake).
    pub async fn create_job(&self, lease: &BatchLease, spec: JobSpec) -> Result<JobId> {
        self.check_batch_lease(lease)?;
        let priority = spec.priority.unwrap_or(DEFAULT_PRIORITY);
        check_priority(priority)?;
        let bid = &lease.batch;
        if self
            .tree
            .exists(&batch_ref_folder(bid, "batch-processing"))
            .await?
            .is_none()
        {
            // Intake creates jobs after the Processing move made the folders, or before it; make
            // sure the folders exist without disturbing Merritt's "no states = pending" rule
            // for batches nobody holds.
            let mut ops = vec![
                Op::check(batch_node(bid, "lock"), None),
                Op::check(batch_node(bid, "status"), Some(lease.status_version)),
            ];
            if self.tree.exists(&batch_states(bid)).await?.is_none() {
                ops.push(Op::create(batch_states(bid), None));
            }
            for f in BATCH_FOLDERS {
                if self.tree.exists(&batch_ref_folder(bid, f)).await?.is_none() {
                    ops.push(Op::create(batch_ref_folder(bid, f), None));
                }
            }
            match self.tree.multi_on(lease.session, ops).await {
                Ok(_) => {}
                // A concurrent create_job of the same intake made them first.
                Err(e) if matches!(e.root(), TreeError::NodeExists(_)) => {}
                Err(e) => return Err(self.lease_error(e, bid.as_str())),
            }
        }
        let path = self
            .tree
            .create(JOB_PREFIX, None, CreateMode::PersistentSequential)
            .await?;
        let jid = JobId::parse(lading_core::tree::split_path(&path).1)?;
        let mut status = JobStatus {
            status: JobState::Pending,
            last_successful_status: None,
            last_modified: self.now(),
            retry_count: 0,
            message: None,
            extra: Map::new(),
        };
        self.born(&mut status.extra, &status.last_modified);
        // The lock's existence alone does not fence: after its session expired, a backend
        // goes on under a new one, and the lock may be another's by then. The batch's status
        // version does once whoever took the batch since has moved it (found by `lading-sim`);
        // until then only the lease's session does: committed on the session that took the
        // lease, the create fails once that session is gone. Committed on whatever session the
        // tree had, an intake that lost its batch while making a job went on beside the
        // intake of the process that took the batch over, and the two made two jobs for one
        // object (found by `lading-sim`, seed 537660223).
        let ops = vec![
            Op::check(batch_node(bid, "lock"), None),
            Op::check(batch_node(bid, "status"), Some(lease.status_version)),
            Op::create(job_node(&jid, "bid"), Some(bid.to_string().into_bytes())),
            Op::create(
                job_node(&jid, "configuration"),
                json_bytes(&spec.configuration),
            ),
            Op::create(job_node(&jid, "status"), json_bytes(&status)),
            Op::create(
                job_node(&jid, "priority"),
                Some(priority.to_string().into_bytes()),
            ),
            Op::create(
                job_node(&jid, "space_needed"),
                Some(spec.space_needed.to_string().into_bytes()),
            ),
            Op::create(job_node(&jid, "identifiers"), json_bytes(&spec.identifiers)),
            Op::create(job_node(&jid, "metadata"), json_bytes(&spec.metadata)),
            Op::create(job_ref(JobState::Pending, priority, &jid), None),
            Op::create(batch_ref(bid, "batch-processing", &jid), None),
        ];
        if let Err(e) = self.tree.multi_on(lease.session, ops).await {
            let _ = self.tree.delete(&path, None).await;
            return Err(self.lease_error(e, bid.as_str()));
        }
        self.publish(
            crate::ChangeKind::Job,
            jid.as_str(),
            Some(bid),
            None,
            JobState::Pending.name(),
        );
        Ok(jid)
    }

    /// Acquires the next job in `state`: lowest priority number first, then oldest. Reads the
    /// head of the state folder a page at a time, so the cost does not grow with the queue.
    /// In Pending, a job of a held collection is moved to Held instead of being returned; a
    /// paused ingest queue hands out nothing.
    pub async fn acquire_job(&self, state: JobState) -> Result<Option<JobLease>> {
        let folder = job_state_folder(state);
        let mut after: Option<String> = None;
        let mut scanned = 0;
        // Pause and holds are read only once there is something to take: an idle worker polling
        // an empty state costs no round trip on a backend that caches its queues.
        let mut holds = None;
        while scanned < MAX_SCAN {
            let page = self
                .tree
                .children_page(&folder, after.as_deref(), PAGE)
                .await?;
            if after.is_none() && page.len() < PAGE {
                // The whole folder: busy marks of jobs gone from it are let go.
                self.contention.keep_busy_listed(&folder, &page);
            }
            if page.is_empty() {
                return Ok(None);
            }
            // A short page is the last (see `Tree::children_page`): no empty one is read
            // after it (every round of a waiter on a non-empty state read one).
            let last = (page.len() == PAGE).then(|| page.last().cloned()).flatten();
            let holds = match holds {
                Some(h) => h,
                None => {
                    if self.queue_paused_watched("ingest").await? {
                        return Ok(None);
                    }
                    let h = state == JobState::Pending && self.any_collection_held().await?;
                    holds = Some(h);
                    h
                }
            };
            // Jobs found locked by others a moment ago go last: tried only when nothing else
            // is free, so a lock that has just gone is still found. Those proved still locked
            // (a watch on the lock, set before it was found held, has not fired) are passed
            // over until the watch fires.
            let mut names = Vec::new();
            let mut busy: Option<(&String, tokio::time::Instant)> = None;
            let mut held = 0;
            for n in &page {
                // Deferred jobs (parked for a quota slot, waiting to retry) are passed over
                // in memory and do not count: thousands of them never hide a due job.
                if self.contention.is_deferred(&folder, n, self.clock.now_ms()) {
                    continue;
                }
                match self.contention.seen(&folder, n, self.tree.session_id()) {
                    Seen::Free => names.push(n),
                    // At most one of them per call, the one found locked longest ago:
                    // every such job is still tried in turn, without a burst of refused
                    // writes.
                    Seen::Busy(at) => {
                        if busy.is_none_or(|(_, b)| at < b) {
                            busy = Some((n, at));
                        }
                        held += 1;
                    }
                    Seen::Held => held += 1,
                }
            }
            scanned += names.len() + held;
            let busy = busy.map(|(n, _)| n);
            let free = names.len();
            names.extend(busy);
            // Once this process has met other workers at the head of a queue, it spreads its
            // picks from the start; a lone worker takes strictly the head.
            let mut contended = self.contention.contended_lately(&folder);
            for i in 0..names.len() {
                if contended && i < free {
                    let j = i + spread_pick(&names[i..free], &*self.random);
                    names.swap(i, j);
                }
                let name = names[i];
                let Some((_, jid)) = parse_job_ref(name) else {
                    continue;
                };
                let lock = job_node(&jid, "lock");
                // Pending before the attempt: if it finds the lock held, the lock is there
                // for as long as this watch has not fired.
                let proof = self.pending_watch(&lock, WatchKind::Data);
                let session = match self
                    .take_lock_as(&lock, Op::check(join(&folder, name), None))
                    .await?
                {
                    Locked::Taken(session) => session,
                    refused => {
                        match proof.filter(|_| refused == Locked::Held) {
                            Some(w) => self
                                .contention
                                .mark_held(&folder, name, w, WAIT_LOCKS, self.sweep),
                            None => {
                                self.contention
                                    .mark_busy(&folder, name, self.tree.session_id())
                            }
                        }
                        contended = true;
                        continue;
                    }
                };
                let Some(mut c) = self.candidate(state, &folder, name, false) else {
                    continue;
                };
                c.session = session;
                if let Some(lease) = self.lease_locked(&c, holds).await? {
                    return Ok(Some(lease));
                }
            }
            if last.is_none() {
                break;
            }
            after = last;
        }
        Ok(None)
    }

    /// Acquires a job in any of `states`. A lone process takes the first state's head that is
    /// free, in the order given (as [`Engine::acquire_job`] state by state). Once this process
    /// has lost a lock to another session lately, it picks at random among the free jobs of
    /// every state's head window (the first `WINDOW` of the head's priority): many sessions
    /// looking at the same few heads then rarely pick the same job, so fewer lock attempts are
    /// lost (each is a round trip on ZooKeeper). Order stays priority-then-age within that
    /// bounded window.
    pub async fn acquire_any(&self, states: &[JobState]) -> Result<Option<JobLease>> {
        if self.contention.raced_lately(self.clock.now_ms()) {
            for _ in 0..ANY_TRIES {
                let Some(mut c) = self.pick_candidate(states, false).await? else {
                    break;
                };
                let Some(session) = self
                    .take_lock(&c.lock, Op::check(&c.reference, None))
                    .await?
                else {
                    self.contention
                        .mark_busy(&c.folder, &c.name, self.tree.session_id());
                    continue;
                };
                c.session = session;
                let holds = c.state == JobState::Pending && self.any_collection_held().await?;
                if let Some(lease) = self.lease_locked(&c, holds).await? {
                    return Ok(Some(lease));
                }
            }
        }
        for &s in states {
            if let Some(l) = self.acquire_job(s).await? {
                return Ok(Some(l));
            }
        }
        Ok(None)
    }

    /// A free job of `states` (see [`Engine::acquire_any`]): when this process lost a lock to
    /// another session lately, one at random from every state's head window; else the first
    /// state's first free one. `claim`: also claim its lock locally. `None` when the queue is paused or nothing
    /// is free; Pending is passed over while a collection is held.
    pub(crate) async fn pick_candidate(
        &self,
        states: &[JobState],
        claim: bool,
    ) -> Result<Option<Candidate>> {
        let mut checked_pause = false;
        let mut pool: Vec<(JobState, String, String)> = Vec::new();
        let contended = self.contention.raced_lately(self.clock.now_ms());
        for &state in states {
            let folder = job_state_folder(state);
            let depth = if contended { 2 * WINDOW } else { 2 * SPREAD };
            let page = self.tree.children_page(&folder, None, depth).await?;
            if page.is_empty() {
                continue;
            }
            if !checked_pause {
                if self.queue_paused_watched("ingest").await? {
                    return Ok(None);
                }
                checked_pause = true;
            }
            if state == JobState::Pending && self.any_collection_held().await? {
                continue;
            }
            let mut free = page.iter().filter(|n| {
                !self.contention.is_deferred(&folder, n, self.clock.now_ms())
                    && !self.contention.is_busy(&folder, n, self.tree.session_id())
            });
            if !contended {
                // Alone at these heads: the first free one, in order.
                for name in free.take(SPREAD) {
                    if let Some(c) = self.candidate(state, &folder, name, claim) {
                        return Ok(Some(c));
                    }
                }
                continue;
            }
            let Some(head) = free.next() else { continue };
            // The head's priority only: a window never reaches past a more urgent job.
            let prefix = &head[..head.len().min(3)];
            pool.push((state, folder.clone(), head.clone()));
            pool.extend(
                free.take(WINDOW - 1)
                    .take_while(|n| n.starts_with(prefix))
                    .map(|n| (state, folder.clone(), n.clone())),
            );
        }
        let n = pool.len();
        let start = self.random.below(n);
        for i in 0..n {
            let (state, folder, name) = &pool[(start + i) % n];
            if let Some(c) = self.candidate(*state, folder, name, claim) {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }

    /// `name` of `folder` as a candidate, its lock claimed locally when `claim` (`None` when a
    /// local worker has it, or the name is not a job reference).
    fn candidate(
        &self,
        state: JobState,
        folder: &str,
        name: &str,
        claim: bool,
    ) -> Option<Candidate> {
        let (priority, jid) = parse_job_ref(name)?;
        let lock = job_node(&jid, "lock");
        if claim && !self.claim(&lock) {
            return None;
        }
        let session = self.claim_session(&lock);
        Some(Candidate {
            reference: join(folder, name),
            name: name.to_string(),
            folder: folder.to_string(),
            lock,
            priority,
            jid,
            state,
            session,
        })
    }

    /// The lease of job `jid`, referenced as `name` in `folder`, once its lock is taken; or
    /// `None` when it is not to be worked on now, and the caller tries another: deferred (its
    /// retry time has not come; the lock is given back) or moved to Held (`holds`: some
    /// collection is held, and it is the job's).
    pub(crate) async fn lease_locked(
        &self,
        c: &Candidate,
        holds: bool,
    ) -> Result<Option<JobLease>> {
        let (folder, name, jid, priority, state) = (
            c.folder.as_str(),
            c.name.as_str(),
            &c.jid,
            c.priority,
            c.state,
        );
        let lease = match self.load_lease(jid, priority, state, c.session).await {
            Ok(l) => l,
            Err(e) => {
                self.abandon_on(&job_node(jid, "lock"), c.session).await;
                return Err(e);
            }
        };
        if let Some(at) = retry_at(&lease.status)
            && at > self.clock.now_ms()
        {
            // Deferred by a worker after a transient error: not due yet.
            self.contention
                .mark_deferred(folder, name, at, self.clock.now_ms());
            self.adopt_waiter(&lease);
            self.release_job_lease(lease).await?;
            return Ok(None);
        }
        if holds
            && let Some(c) = self.job_collection(jid).await?
            && self.collection_held(&c).await?
        {
            self.job_transition(
                lease,
                Event::To(JobState::Held),
                Some(format!("collection {c} is held")),
            )
            .await?;
            return Ok(None);
        }
        Ok(Some(lease))
    }

    /// A job this process could lock next in `states` (see [`Engine::pick_candidate`]), read
    /// from memory on a backend that caches its queues, and claimed locally so no local
    /// worker tries it too.
    pub(crate) async fn claim_next(&self, states: &[JobState]) -> Result<Option<Candidate>> {
        self.pick_candidate(states, true).await
    }

    pub(crate) async fn load_lease(
        &self,
        jid: &JobId,
        priority: u8,
        state: JobState,
        session: u64,
    ) -> Result<JobLease> {
        // Where reads are local and the batch is known, the status alone (the worker that
        // handles the job reads the rest then). Where reads are round trips, the job's whole
        // record in one: the worker has it without another.
        if self.tree.local_reads()
            && let Some(batch) = self.known_batch(jid)
        {
            let (status, version) = self.job_status(jid).await?;
            return self.lease_of(jid, priority, state, (status, version), batch, session);
        }
        let nodes = self.tree.get_many(&Self::record_paths(jid)).await?;
        self.lease_from(jid, priority, state, nodes, session)
    }

    /// A lease from the nodes [`Engine::record_paths`] names, as read: the job's whole record
    /// (its status and batch first), kept with the lease so the worker that handles it does
    /// not read it again.
    pub(crate) fn lease_from(
        &self,
        jid: &JobId,
        priority: u8,
        state: JobState,
        nodes: Vec<Option<lading_core::Node>>,
        session: u64,
    ) -> Result<JobLease> {
        let status = self.decode_status(jid, nodes.first().and_then(Option::as_ref))?;
        let batch = self.remember_batch(jid, nodes.get(1).and_then(Option::as_ref))?;
        let mut lease = self.lease_of(jid, priority, state, status, batch, session)?;
        lease.record = (nodes.len() == crate::read::RECORD_NODES.len()).then(|| Arc::new(nodes));
        Ok(lease)
    }

    /// A lease of `jid`, locked on `session`, from its status (at its version) and batch.
    fn lease_of(
        &self,
        jid: &JobId,
        priority: u8,
        state: JobState,
        (status, version): (JobStatus, i32),
        batch: BatchId,
        session: u64,
    ) -> Result<JobLease> {
        if status.status != state {
            return Err(EngineError::Corrupt {
                path: job_node(jid, "status"),
                reason: format!(
                    "status says {} but the job is referenced under {}",
                    status.status,
                    state.node_name()
                ),
            });
        }
        Ok(JobLease {
            record: None,
            failure_kind: None,
            effects: Vec::new(),
            batch,
            job: jid.clone(),
            status,
            priority,
            status_version: version,
            session,
        })
    }

    /// Waits until a job in `state` can be acquired, or `timeout` passes, or `cancel`
    /// completes (`Ok(None)`). Woken by changes to the state folder (and to the ingest pause
    /// flag), not by polling. Cancel this way rather than by dropping the future: `cancel` is only looked at while waiting,
    /// never in the middle of taking a lock, so nothing is left claimed or locked.
    pub async fn wait_job_or(
        &self,
        state: JobState,
        timeout: Duration,
        cancel: impl std::future::Future<Output = ()>,
    ) -> Result<Option<JobLease>> {
        let armed = &claims::Armed::default();
        self.wait_until(
            timeout,
            cancel,
            armed,
            Some(self.woken_in(state)),
            || async move {
                if !sabotage::on(sabotage::LOST_WAKEUP) {
                    armed
                        .watch(self, &job_state_folder(state), WatchKind::Children)
                        .await?;
                }
                armed
                    .watch(self, &queue_lock("ingest"), WatchKind::Data)
                    .await?;
                if let Some(l) = self.acquire_job(state).await? {
                    return Ok(Round::Got(l));
                }
                // Jobs that are there but locked become free when their lock goes (a worker
                // released it, or its session expired): watch those locks too.
                let folder = job_state_folder(state);
                let mut new = Vec::new();
                for name in self
                    .contention
                    .busy_names(&folder, WAIT_LOCKS, self.tree.session_id())
                    .into_iter()
                    .filter(|_| !sabotage::on(sabotage::LOST_LOCK_WAKEUP))
                {
                    if let Some((_, jid)) = parse_job_ref(&name) {
                        let lock = job_node(&jid, "lock");
                        let pending = self.pending_watch(&lock, WatchKind::Data).is_some();
                        armed.watch(self, &lock, WatchKind::Data).await?;
                        if !pending {
                            new.push((name, lock));
                        }
                    }
                }
                if self.gone_since_found(&folder, &new).await? {
                    return Ok(Round::Again);
                }
                // A job of this state deferred after a transient error becomes due.
                let due = self
                    .contention
                    .next_due(&folder, self.clock.now_ms())
                    .unwrap_or(self.sweep);
                Ok(Round::Wait { due })
            },
        )
        .await
    }

    /// Whether any of `watched` (references of `folder` found locked, and their locks, whose
    /// watches this round set for the first time) has lost its lock already: those are
    /// forgotten as locked, to be tried at once. A look tries one job found locked at most,
    /// and the others' locks are watched only after the attempts that found them locked; a
    /// lock gone in between leaves its watch on no node, which fires only when one is made,
    /// and the job waited for the sweep (found by a conformance test: ten seconds). A lock
    /// gone whose claim a worker of this process still holds (it deleted the lock and has not
    /// heard the answer yet) is not free: the claim's release wakes the waiter refused it.
    /// Taken as free, the job was tried at once, refused the claim, and found gone again: in
    /// `lading-sim` a loop that never waited, so the simulated clock never moved and seed
    /// 2005835 never ended.
    async fn gone_since_found(&self, folder: &str, watched: &[(String, String)]) -> Result<bool> {
        let watched: Vec<&(String, String)> = watched
            .iter()
            .filter(|(_, lock)| !self.claimed_here(lock))
            .collect();
        if watched.is_empty() {
            return Ok(false);
        }
        let locks: Vec<String> = watched.iter().map(|(_, l)| l.clone()).collect();
        let mut gone = false;
        for ((name, _), node) in watched.into_iter().zip(self.tree.get_many(&locks).await?) {
            if node.is_none() {
                self.contention.forget_busy(folder, name);
                gone = true;
            }
        }
        Ok(gone)
    }

    pub(crate) fn check_job_lease(&self, lease: &JobLease) -> Result<()> {
        if lease.session != self.tree.session_id() {
            return Err(lost(lease.job.as_str()));
        }
        Ok(())
    }
}
