//! Processing: accepting a due job (waiters that share a type's wake-ups), heartbeats, resubmission and finishing, with fencing by lock token.

use super::*;

impl Jobs {
    /// Takes the earliest due pending job of `ty` and marks it running under a new lock.
    /// Waits up to `opts.timeout` for one to become due; `None` when none did.
    pub async fn accept(&self, ty: &str, opts: &AcceptOptions) -> Result<Option<Job>> {
        self.require_type(ty).await?;
        if let Some(s) = opts.max_sched_time {
            secs_to_ms(s)?;
        }
        let deadline = Instant::now() + opts.timeout;
        // Acceptors of any due job share their type's waiters. One bounded by a scheduled time
        // can neither stand in for them nor they for it: it leads waiters of its own (its own
        // watch, and nobody to wake).
        let waiters = match opts.max_sched_time {
            None => self.waiters(ty),
            Some(_) => Arc::new(Waiters::default()),
        };
        let dir = pending_dir(ty);
        let mut leading: Option<Leading> = None;
        loop {
            let unclaimed = self.unclaimed.notified();
            // Enabled before the look: a wake-up during it is kept (and handed on to another
            // waiter if this acceptor takes a job and never waits).
            let woken = waiters.notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let mut skipped = false;
            let next_due = match self
                .try_accept(ty, opts, &mut skipped, &[], usize::MAX)
                .await?
            {
                Ok((job, _)) => return Ok(Some(job)),
                Err(next_due) => next_due,
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            if leading.is_none() {
                let mut leader = waiters.leader.lock().unwrap();
                if !*leader {
                    *leader = true;
                    leading = Some(Leading {
                        waiters: &waiters,
                        watch: None,
                    });
                }
            }
            if let Some(l) = leading.as_mut()
                && l.watch.is_none()
            {
                // Watch first, then look once more: a job added in between is not missed.
                l.watch = Some(self.tree.watch(&dir, WatchKind::Children).await?);
                continue;
            }
            let mut wait = deadline - now;
            if let Some(due) = next_due {
                let ms = due.saturating_sub(self.now_ms()) + 1;
                wait = wait.min(Duration::from_millis(ms));
            }
            self.idle_acceptors.fetch_add(1, Ordering::Relaxed);
            let _idle = Idle(&self.idle_acceptors);
            let watch = leading.as_mut().and_then(|l| l.watch.as_mut());
            let fired = async {
                match watch {
                    Some(w) => w.await,
                    None => std::future::pending().await,
                }
            };
            let fired = tokio::select! {
                _ = fired => true,
                _ = woken => false,
                // Only a pass that stepped over a local peer's claim waits for it to end (a
                // wake-up for every lost race would stir every idle acceptor).
                _ = unclaimed, if skipped => false,
                _ = tokio::time::sleep(wait) => false,
            };
            if fired && let Some(l) = leading.as_mut() {
                // Armed again before the look: a change after the look fires it.
                l.watch = Some(self.tree.watch(&dir, WatchKind::Children).await?);
            }
        }
    }

    pub(crate) fn waiters(&self, ty: &str) -> Arc<Waiters> {
        let mut m = self.waiters.lock().unwrap();
        match m.get(ty) {
            Some(w) => w.clone(),
            None => m.entry(ty.to_string()).or_default().clone(),
        }
    }

    /// One pass over the due head. `Err(next)` when nothing could be taken; `next` is when the
    /// first not-yet-due job becomes due, if waiting for it can help. `skipped` is set when
    /// a job was passed over because another acceptor of this process was claiming it.
    ///
    /// Each claim's `multi` starts with `prefix` (its results come first); an error in the
    /// prefix is returned as is. At most `max_claims` claims are tried.
    pub(crate) async fn try_accept(
        &self,
        ty: &str,
        opts: &AcceptOptions,
        skipped: &mut bool,
        prefix: &[Op],
        mut max_claims: usize,
    ) -> Result<std::result::Result<(Job, Vec<OpResult>), Option<u64>>> {
        let now = self.now_ms();
        let limit = match opts.max_sched_time {
            Some(s) => secs_to_ms(s)?,
            None => now,
        };
        let dir = pending_dir(ty);
        let mut after: Option<String> = None;
        // The head is nearly always enough: a short first page, full ones after it.
        let mut page_len = FIRST_PAGE;
        loop {
            let page = self
                .tree
                .children_page(&dir, after.as_deref(), page_len)
                .await?;
            let mut due: Vec<(&str, u64, &str)> = Vec::new();
            let mut next = None;
            for name in &page {
                let Some((ms, id)) = parse_pending(name) else {
                    continue;
                };
                if ms > limit {
                    // Later jobs become due as time passes only when the limit is "now".
                    next = opts.max_sched_time.is_none().then_some(ms);
                    break;
                }
                due.push((name, ms, id));
            }
            if opts.no_schedule && due.len() > 1 {
                let r = spread(due.len());
                due.rotate_left(r);
            }
            let more_pages = next.is_none() && page.len() == page_len;
            let n_due = due.len();
            for (i, (name, ms, id)) in due.into_iter().enumerate() {
                if max_claims == 0 {
                    return Ok(Err(None));
                }
                if !self.claim_entry(ty, name) {
                    *skipped = true;
                    continue;
                }
                max_claims -= 1;
                let r = self.claim(ty, id, ms, prefix).await;
                self.unclaim_entry(ty, name);
                match r {
                    Ok(Some(got)) => {
                        // More may be due than this acceptor takes: wake a waiting one.
                        if (i + 1 < n_due || more_pages)
                            && self.idle_acceptors.load(Ordering::Relaxed) > 0
                        {
                            self.waiters(ty).notify.notify_one();
                        }
                        return Ok(Ok(got));
                    }
                    Ok(None) => self.unclaimed.notify_waiters(),
                    Err(e) => {
                        self.unclaimed.notify_waiters();
                        return Err(e);
                    }
                }
            }
            if next.is_some() || page.len() < page_len {
                return Ok(Err(next));
            }
            after = page.last().cloned();
            page_len = PAGE;
        }
    }

    /// Marks pending entry `name` of `ty` as being claimed by this process; `false` when a
    /// local acceptor already is.
    pub(crate) fn claim_entry(&self, ty: &str, name: &str) -> bool {
        let mut c = self.claims.lock().unwrap();
        match c.get_mut(ty) {
            Some(set) => !set.contains(name) && set.insert(name.to_string()),
            None => {
                c.insert(ty.to_string(), HashSet::from([name.to_string()]));
                true
            }
        }
    }

    pub(crate) fn unclaim_entry(&self, ty: &str, name: &str) {
        if let Some(set) = self.claims.lock().unwrap().get_mut(ty) {
            set.remove(name);
        }
    }

    /// Marks one pending job running, in one `multi` after `prefix`; `None` when another
    /// acceptor (or an `add`/`remove`) got there first. Returns the job and the results of
    /// the whole `multi`.
    pub(crate) async fn claim(
        &self,
        ty: &str,
        id: &str,
        scheduled_ms: u64,
        prefix: &[Op],
    ) -> Result<Option<(Job, Vec<OpResult>)>> {
        let Some((mut rec, v)) = self.read(ty, id).await? else {
            return Ok(None);
        };
        if rec.state != State::Pending || rec.scheduled_ms != scheduled_ms {
            return Ok(None);
        }
        let lock = lock_token();
        rec.state = State::Running;
        rec.lock = Some(lock.clone());
        rec.owner = Some(self.owner.clone());
        rec.updated_ms = self.now_ms();
        rec.runs += 1;
        let mut ops = prefix.to_vec();
        ops.extend([
            Op::delete(pending_path(ty, scheduled_ms, id), None),
            Op::set(
                job_path(ty, id),
                Some(serde_json::to_vec(&rec).unwrap()),
                Some(v),
            ),
            Op::create(
                active_path(ty, id, &lock),
                Some(self.owner.as_bytes().to_vec()),
            ),
        ]);
        match self.tree.multi(ops).await {
            Ok(res) => {
                let version = match res.get(prefix.len() + 1) {
                    Some(OpResult::Set(stat)) => stat.version,
                    _ => v + 1,
                };
                let job = Job {
                    ty: ty.into(),
                    id: id.into(),
                    lock,
                    record: rec,
                    version,
                };
                Ok(Some((job, res)))
            }
            Err(e) if is_race(&e) && e.failed_op().is_none_or(|i| i >= prefix.len()) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The job `id` as held under `lock` — for a processor that keeps only the id and the lock
    /// (an HTTP client). `Halt` when that lock no longer holds it.
    pub async fn held(&self, ty: &str, id: &str, lock: &str) -> Result<Job> {
        check_type(ty)?;
        check_id(id)?;
        let halt = |why| JobsError::Halt {
            ty: ty.into(),
            id: id.into(),
            why,
        };
        match self.read(ty, id).await? {
            None => Err(halt("removed")),
            Some((rec, _)) if rec.lock.as_deref() != Some(lock) => {
                Err(halt("not held under this lock"))
            }
            Some((record, version)) => Ok(Job {
                ty: ty.into(),
                id: id.into(),
                lock: lock.into(),
                record,
                version,
            }),
        }
    }

    /// The ops writing `change(record)` fenced by the job's lock (a check of the lock, or its
    /// delete when `finishing`; the record's set; what `change` adds), and the new record.
    pub(crate) fn fenced_ops(
        &self,
        job: &Job,
        finishing: bool,
        change: &impl Fn(&mut Record, u64) -> Vec<Op>,
    ) -> (Vec<Op>, Record) {
        let active = active_path(&job.ty, &job.id, &job.lock);
        let mut rec = job.record.clone();
        let extra = change(&mut rec, self.now_ms());
        let mut ops = vec![
            if finishing {
                Op::delete(active, None)
            } else {
                Op::check(active, None)
            },
            Op::set(
                job_path(&job.ty, &job.id),
                Some(serde_json::to_vec(&rec).unwrap()),
                Some(job.version),
            ),
        ];
        ops.extend(extra);
        (ops, rec)
    }

    /// Writes `change(record)` fenced by the job's lock: retried over concurrent `add`s,
    /// `Halt` once the lock is gone. `finishing` also releases the lock.
    pub(crate) async fn fenced(
        &self,
        job: &mut Job,
        finishing: bool,
        change: impl Fn(&mut Record, u64) -> Vec<Op>,
    ) -> Result<()> {
        let path = job_path(&job.ty, &job.id);
        let halt = |why| JobsError::Halt {
            ty: job.ty.clone(),
            id: job.id.clone(),
            why,
        };
        for _ in 0..MAX_OPTIMISTIC {
            let (ops, rec) = self.fenced_ops(job, finishing, &change);
            match self.tree.multi(ops).await {
                Ok(res) => {
                    job.held(rec, &res);
                    return Ok(());
                }
                Err(e) if e.failed_op() == Some(0) && is_race(&e) => {
                    return Err(halt("removed, re-enqueued or accepted again"));
                }
                Err(e) if is_race(&e) => {
                    // The record changed under us (an add asked for a resubmit): re-read.
                    match self.read(&job.ty, &job.id).await? {
                        None => return Err(halt("removed")),
                        Some((rec, _)) if rec.lock.as_deref() != Some(job.lock.as_str()) => {
                            return Err(halt("held under another lock"));
                        }
                        Some((rec, v)) => {
                            job.record = rec;
                            job.version = v;
                        }
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(JobsError::Conflict(path))
    }

    /// Heartbeat, and new data when given. `Halt` means stop running the job.
    pub async fn update(&self, job: &mut Job, data: Option<Value>) -> Result<()> {
        self.fenced(job, false, |rec, now| {
            if let Some(d) = &data {
                rec.data = d.clone();
            }
            rec.updated_ms = now;
            Vec::new()
        })
        .await
    }

    /// Marks the job for re-enqueueing when it finishes (at `scheduled_time`, seconds, or now).
    pub async fn resubmit(&self, job: &mut Job, scheduled_time: Option<u64>) -> Result<()> {
        let sched = scheduled_time.map(secs_to_ms).transpose()?;
        self.fenced(job, false, |rec, now| {
            rec.resubmit = true;
            rec.resubmit_ms = sched;
            rec.updated_ms = now;
            Vec::new()
        })
        .await
    }

    /// Finishes the job (with its final data, when given) — or, when a resubmission was
    /// requested, makes it pending again. `Halt`: nothing was written.
    pub async fn finish(&self, job: &mut Job, data: Option<Value>) -> Result<()> {
        let change = finishing(job, data);
        self.fenced(job, true, change).await
    }

    /// [`finish`](Self::finish), then [`accept`](Self::accept) of the same type — with the
    /// finish and the next job's claim in one `multi` when a job is due, so a busy processor
    /// pays one round trip per job instead of two. Not while other acceptors of this process
    /// wait for work: then there is no backlog, and new jobs are left to them.
    ///
    /// Whatever happens to the claim, the finish means what `finish` means: `Halt` when the
    /// lock no longer holds the job (then nothing was written and no job was taken). Waits up
    /// to `opts.timeout` for a next job, as `accept` does.
    pub async fn finish_then_accept(
        &self,
        job: &mut Job,
        data: Option<Value>,
        opts: &AcceptOptions,
    ) -> Result<Option<Job>> {
        if let Some(s) = opts.max_sched_time {
            secs_to_ms(s)?;
        }
        let ty = job.ty.clone();
        // Acceptors of this process are idle: no backlog, and a due job is theirs.
        if self.idle_acceptors.load(Ordering::Relaxed) == 0 {
            let change = finishing(job, data.clone());
            let (ops, rec) = self.fenced_ops(job, true, &change);
            let n = ops.len();
            let mut skipped = false;
            match self
                .try_accept(&ty, opts, &mut skipped, &ops, NEXT_CLAIMS)
                .await
            {
                Ok(Ok((next, res))) => {
                    job.held(rec, &res);
                    return Ok(Some(next));
                }
                // Nothing due, or lost every race for it: finish alone, then accept.
                Ok(Err(_)) => {}
                // The finish part was refused (the record changed, or the lock is gone):
                // `finish` re-reads, retries or halts as it always does.
                Err(JobsError::Tree(e)) if e.failed_op().is_some_and(|i| i < n) => {}
                Err(e) => return Err(e),
            }
        }
        self.finish(job, data).await?;
        self.accept(&ty, opts).await
    }
}
