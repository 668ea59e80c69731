//! Processing: accepting a due job (waiters that share a type's wake-ups), heartbeats, resubmission and finishing, with fencing by lock token.

use super::*;

/// Most jobs one `accept_many` or `finish_many` handles.
pub const MAX_BATCH: usize = 1000;

/// A pending entry seen by an acceptor.
#[derive(Clone, Copy)]
pub(crate) struct Entry<'a> {
    name: &'a str,
    priority: i32,
    ms: u64,
    id: &'a str,
}

/// What a claim got.
pub(crate) enum Claimed {
    Got(Vec<Job>, Vec<OpResult>),
    Lost,
    RateLimited(u64),
}

impl Jobs {
    /// Takes the earliest due pending job of `ty` (of the lowest priority among those due)
    /// and marks it running under a new lock. Waits up to `opts.timeout` for one to become
    /// due; `None` when none did.
    pub async fn accept(&self, ty: &str, opts: &AcceptOptions) -> Result<Option<Job>> {
        Ok(self.accept_many(ty, 1, opts).await?.pop())
    }

    /// [`accept`](Self::accept) of up to `max` jobs (1 to [`MAX_BATCH`]) in one `multi`: the
    /// due head, in the order `accept` would take it. Waits as `accept` does for the first
    /// due job, not for `max` of them; empty when none became due in time.
    pub async fn accept_many(
        &self,
        ty: &str,
        max: usize,
        opts: &AcceptOptions,
    ) -> Result<Vec<Job>> {
        if !(1..=MAX_BATCH).contains(&max) {
            return Err(JobsError::Invalid(format!(
                "a batch is 1 to {MAX_BATCH} jobs, not {max}"
            )));
        }
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
                .try_accept(ty, opts, &mut skipped, &[], usize::MAX, max)
                .await?
            {
                Ok((jobs, _)) => {
                    pass_the_lead(&waiters, &leading);
                    return Ok(jobs);
                }
                Err(next_due) => next_due,
            };
            let now = Instant::now();
            if now >= deadline {
                pass_the_lead(&waiters, &leading);
                return Ok(Vec::new());
            }
            if leading.is_none() {
                let mut leader = waiters
                    .leader
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
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
            self.parked.send_modify(|n| *n += 1);
            let watch = leading.as_mut().and_then(|l| l.watch.as_mut());
            let fired = async {
                match watch {
                    Some(w) => w.await,
                    None => std::future::pending().await,
                }
            };
            let fired = tokio::select! {
                // In order, so a seed's run is repeatable (lading-sim).
                biased;
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
        let mut m = self
            .waiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match m.get(ty) {
            Some(w) => w.clone(),
            None => m.entry(ty.to_string()).or_default().clone(),
        }
    }

    /// One pass over the due head, lowest priority first. `Err(next)` when nothing could be
    /// taken; `next` is when the first not-yet-due job becomes due (or the rate limit lets
    /// the next one through), if waiting for it can help. `skipped` is set when a job was
    /// passed over because another acceptor of this process was claiming it.
    ///
    /// Each claim's `multi` starts with `prefix` (its results come first); an error in the
    /// prefix is returned as is. At most `max_claims` claims are tried, each of up to `want`
    /// jobs.
    pub(crate) async fn try_accept(
        &self,
        ty: &str,
        opts: &AcceptOptions,
        skipped: &mut bool,
        prefix: &[Op],
        mut max_claims: usize,
        want: usize,
    ) -> Result<std::result::Result<(Vec<Job>, Vec<OpResult>), Option<u64>>> {
        let settings = self.require_type(ty).await?;
        let now = self.now_ms();
        let limit = match opts.max_sched_time {
            Some(s) => secs_to_ms(s)?,
            None => now,
        };
        let dir = pending_dir(ty);
        let mut after: Option<String> = None;
        let mut next: Option<u64> = None;
        // The head is nearly always enough: a short first page, full ones after it.
        // (Unless any due job will do and a listing is a round trip whatever its length: then
        // a wider head spreads acceptors out.)
        let mut page_len = if opts.no_schedule && !self.tree.local_reads() {
            PAGE
        } else {
            FIRST_PAGE
        };
        loop {
            let page = self
                .tree
                .children_page(&dir, after.as_deref(), page_len)
                .await?;
            let mut due: Vec<Entry> = Vec::new();
            // Past a priority's first job not yet due, the rest of that priority is later
            // still: the next look starts at the next priority.
            let mut jump = None;
            for name in &page {
                let Some((priority, ms, id, prefixed)) = parse_pending(name) else {
                    continue;
                };
                if ms > limit {
                    // Later jobs become due as time passes only when the limit is "now".
                    if opts.max_sched_time.is_none() {
                        next = Some(next.map_or(ms, |n| n.min(ms)));
                    }
                    if prefixed {
                        jump = Some(format!("{:04}-~", priority + 1000));
                        break;
                    }
                    continue;
                }
                due.push(Entry {
                    name,
                    priority,
                    ms,
                    id,
                });
            }
            if opts.no_schedule && due.len() > 1 {
                let same = due
                    .iter()
                    .take_while(|d| d.priority == due[0].priority)
                    .count();
                let r = self.random.below(same);
                due[..same].rotate_left(r);
            }
            let more_pages = jump.is_some() || page.len() == page_len;
            let mut i = 0;
            while i < due.len() {
                if max_claims == 0 {
                    return Ok(Err(None));
                }
                // A few spare candidates are read with the wanted ones: when another
                // acceptor took one meanwhile, a spare stands in without another round trip.
                let spare = if self.tree.local_reads() { 0 } else { SPARE };
                let mut batch = Vec::new();
                while i < due.len() && batch.len() < want + spare {
                    if self.claim_entry(ty, due[i].name) {
                        batch.push(due[i]);
                    } else {
                        *skipped = true;
                    }
                    i += 1;
                }
                if batch.is_empty() {
                    break;
                }
                max_claims -= 1;
                let r = self
                    .claim_many(ty, &batch, want, opts.no_schedule, prefix, &settings)
                    .await;
                for e in &batch {
                    self.unclaim_entry(ty, e.name);
                }
                match r {
                    Ok(Claimed::Got(jobs, res)) => {
                        // Spares left over are due still: siblings that stepped over them
                        // look again.
                        let spares_left = jobs.len() < batch.len();
                        if spares_left {
                            self.unclaimed.notify_waiters();
                        }
                        // More may be due than this acceptor takes: wake a waiting one.
                        if (i < due.len() || more_pages || spares_left)
                            && self.idle_acceptors.load(Ordering::Relaxed) > 0
                        {
                            self.waiters(ty).notify.notify_one();
                        }
                        return Ok(Ok((jobs, res)));
                    }
                    Ok(Claimed::Lost) => self.unclaimed.notify_waiters(),
                    Ok(Claimed::RateLimited(until)) => {
                        self.unclaimed.notify_waiters();
                        return Ok(Err(Some(until)));
                    }
                    Err(e) => {
                        self.unclaimed.notify_waiters();
                        return Err(e);
                    }
                }
            }
            match jump {
                Some(j) => {
                    after = Some(j);
                    page_len = FIRST_PAGE;
                }
                None if page.len() < page_len => return Ok(Err(next)),
                None => {
                    after = page.last().cloned();
                    page_len = PAGE;
                }
            }
        }
    }

    /// Marks pending entry `name` of `ty` as being claimed by this process; `false` when a
    /// local acceptor already is.
    pub(crate) fn claim_entry(&self, ty: &str, name: &str) -> bool {
        let mut c = self
            .claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match c.get_mut(ty) {
            Some(set) => !set.contains(name) && set.insert(name.to_string()),
            None => {
                c.insert(ty.to_string(), [name.to_string()].into_iter().collect());
                true
            }
        }
    }

    pub(crate) fn unclaim_entry(&self, ty: &str, name: &str) {
        if let Some(set) = self
            .claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_mut(ty)
        {
            set.remove(name);
        }
    }

    /// Marks up to `want` of the pending jobs of `entries` running (the first still
    /// pending), in one `multi` after `prefix`: those another acceptor (or an `add`/`remove`)
    /// got first are left out. `Lost` when that is all of them; `RateLimited(until)` when the
    /// type's rate limit lets none through before `until` (ms). Returns the jobs and the
    /// results of the whole `multi`.
    pub(crate) async fn claim_many(
        &self,
        ty: &str,
        entries: &[Entry<'_>],
        want: usize,
        any_order: bool,
        prefix: &[Op],
        settings: &TypeSettings,
    ) -> Result<Claimed> {
        let paths: Vec<String> = entries.iter().map(|e| job_path(ty, e.id)).collect();
        let nodes = self.tree.get_many(&paths).await?;
        let mut live: Vec<(&Entry, Record, i32)> = Vec::with_capacity(entries.len());
        for ((e, node), path) in entries.iter().zip(nodes).zip(&paths) {
            let Some(node) = node else { continue };
            let rec: Record = lading_core::json::from_bytes(
                node.data.as_deref().unwrap_or(b"null"),
            )
            .map_err(|err| JobsError::Corrupt {
                path: path.clone(),
                reason: err.to_string(),
            })?;
            if rec.state == State::Pending && rec.scheduled_ms == e.ms && rec.priority == e.priority
            {
                live.push((e, rec, node.stat.version));
            }
        }
        // In any order, acceptors that read the same candidates take different ones.
        if any_order && live.len() > want {
            let r = self.random.below(live.len());
            live.rotate_left(r);
        }
        for _ in 0..MAX_OPTIMISTIC {
            if live.is_empty() {
                return Ok(Claimed::Lost);
            }
            let now = self.now_ms();
            let mut take = live.len().min(want);
            let rate_op = match settings.rate_per_s {
                0 => None,
                per_s => {
                    let (op, room, second) = self.rate_op(ty, per_s, now, take).await?;
                    if room == 0 {
                        return Ok(Claimed::RateLimited((second + 1) * 1000));
                    }
                    take = room;
                    Some(op)
                }
            };
            let mut ops = prefix.to_vec();
            let mut jobs = Vec::with_capacity(take);
            for (e, rec, v) in &live[..take] {
                let lock = self.lock_token();
                let mut rec = rec.clone();
                rec.enter(State::Running);
                rec.lock = Some(lock.clone());
                rec.owner = Some(self.owner.clone());
                rec.updated_ms = now;
                rec.runs += 1;
                ops.extend([
                    Op::delete(concat(&[&pending_dir(ty), "/", e.name]), None),
                    Op::set(job_path(ty, e.id), Some(rec.to_bytes()), Some(*v)),
                    Op::create(
                        active_path(ty, e.id, &lock),
                        Some(self.owner.as_bytes().to_vec()),
                    ),
                ]);
                jobs.push(Job {
                    ty: ty.into(),
                    id: e.id.into(),
                    lock,
                    record: rec,
                    version: v + 1,
                });
            }
            ops.extend(rate_op);
            match self.tree.multi(ops).await {
                Ok(res) => {
                    for (k, job) in jobs.iter_mut().enumerate() {
                        if let Some(OpResult::Set(stat)) = res.get(prefix.len() + 3 * k + 1) {
                            job.version = stat.version;
                        }
                    }
                    return Ok(Claimed::Got(jobs, res));
                }
                Err(e) if is_race(&e) => match e.failed_op() {
                    Some(i) if i < prefix.len() => return Err(e.into()),
                    // One job was taken by someone else: the others are tried again.
                    Some(i) if (i - prefix.len()) / 3 < take => {
                        live.remove((i - prefix.len()) / 3);
                    }
                    // The rate node changed: read it again.
                    Some(_) => {}
                    None => return Ok(Claimed::Lost),
                },
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Claimed::Lost)
    }

    /// The op counting `n` more accepts in this second against the type's rate limit, how
    /// many of the `n` it lets through (the op counts only those), and the second counted.
    ///
    /// The second is `now`'s, unless the count is already at a later one: another acceptor
    /// read a later clock (a host ahead of this one, or this one's `now` read before a slow
    /// round trip). Counting at `now`'s second would then start that earlier second's count
    /// again from zero, and let its accepts through twice. The counted second only moves on.
    async fn rate_op(&self, ty: &str, per_s: u32, now: u64, n: usize) -> Result<(Op, usize, u64)> {
        let path = rate_path(ty);
        let mut second = now / 1000;
        let (used, version) = match self.tree.get(&path).await? {
            Some(node) => {
                let v: Value = lading_core::json::from_bytes(node.data.as_deref().unwrap_or(b"{}"))
                    .unwrap_or(Value::Null);
                let counted = v.get("second").and_then(Value::as_u64).unwrap_or(0);
                let used = if counted >= second {
                    second = counted;
                    v.get("count").and_then(Value::as_u64).unwrap_or(0)
                } else {
                    0
                };
                (used, Some(node.stat.version))
            }
            None => (0, None),
        };
        let room = (per_s as u64).saturating_sub(used).min(n as u64) as usize;
        let data = Some(
            serde_json::json!({"second": second, "count": used + room as u64})
                .to_string()
                .into_bytes(),
        );
        let op = match version {
            Some(_) if lading_core::sabotage::on(lading_core::sabotage::RATE_UNGUARDED) => {
                Op::set(path, data, None)
            }
            Some(v) => Op::set(path, data, Some(v)),
            None => Op::create(path, data),
        };
        Ok((op, room, second))
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
                Some(rec.to_bytes()),
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
        self.finish_with(job, Outcome::Success(data)).await
    }

    /// Ends the run with `outcome`: a success finishes the job as [`finish`](Self::finish)
    /// does; an error re-enqueues it after the type's backoff while attempts are left, and
    /// fails it after the last (see [`TypeSettings`]). The job's record afterwards says
    /// which. `Halt`: nothing was written.
    pub async fn finish_with(&self, job: &mut Job, outcome: Outcome) -> Result<()> {
        let settings = self.require_type(&job.ty).await?;
        let change = finishing(job, outcome, settings, self.random.clone());
        self.fenced(job, true, change).await
    }

    /// [`finish_with`](Self::finish_with) of many jobs in one `multi`: one result per job,
    /// in order. A job whose lock is gone gets `Halt` (nothing written for it) and the others
    /// are finished without it.
    pub async fn finish_many(&self, jobs: &mut [Job], outcomes: Vec<Outcome>) -> Vec<Result<()>> {
        if jobs.len() != outcomes.len() {
            let e = JobsError::Invalid(format!(
                "{} jobs and {} outcomes: give one outcome per job",
                jobs.len(),
                outcomes.len()
            ));
            return jobs.iter().map(|_| Err(e.clone())).collect();
        }
        let mut results: Vec<Option<Result<()>>> = (0..jobs.len()).map(|_| None).collect();
        let mut left: Vec<usize> = (0..jobs.len()).collect();
        let mut tries = 0;
        while !left.is_empty() {
            tries += 1;
            if tries > MAX_OPTIMISTIC {
                for &i in &left {
                    results[i] = Some(Err(JobsError::Conflict(job_path(&jobs[i].ty, &jobs[i].id))));
                }
                break;
            }
            let mut ops = Vec::new();
            let mut spans = Vec::with_capacity(left.len());
            let mut recs = Vec::with_capacity(left.len());
            let mut failed = None;
            for &i in &left {
                let settings = match self.require_type(&jobs[i].ty).await {
                    Ok(s) => s,
                    Err(e) => {
                        failed = Some((i, e));
                        break;
                    }
                };
                let change =
                    finishing(&jobs[i], outcomes[i].clone(), settings, self.random.clone());
                let (o, rec) = self.fenced_ops(&jobs[i], true, &change);
                spans.push(ops.len());
                ops.extend(o);
                recs.push(rec);
            }
            if let Some((i, e)) = failed {
                results[i] = Some(Err(e));
                left.retain(|&j| j != i);
                continue;
            }
            match self.tree.multi(ops).await {
                Ok(res) => {
                    for (k, (&i, rec)) in left.iter().zip(recs).enumerate() {
                        jobs[i].held(rec, &res[spans[k]..]);
                        results[i] = Some(Ok(()));
                    }
                    left.clear();
                }
                Err(e) if is_race(&e) && e.failed_op().is_some() => {
                    let f = e.failed_op().unwrap_or(0);
                    let k = spans.iter().rposition(|&s| s <= f).unwrap_or(0);
                    let i = left[k];
                    let job = &mut jobs[i];
                    let halt = |why| JobsError::Halt {
                        ty: job.ty.clone(),
                        id: job.id.clone(),
                        why,
                    };
                    let outcome = if f == spans[k] {
                        Some(halt("removed, re-enqueued or accepted again"))
                    } else {
                        // The record changed under us (an add asked for a resubmit): re-read.
                        match self.read(&job.ty, &job.id).await {
                            Err(e) => Some(e),
                            Ok(None) => Some(halt("removed")),
                            Ok(Some((rec, _)))
                                if rec.lock.as_deref() != Some(job.lock.as_str()) =>
                            {
                                Some(halt("held under another lock"))
                            }
                            Ok(Some((rec, v))) => {
                                job.record = rec;
                                job.version = v;
                                None
                            }
                        }
                    };
                    if let Some(err) = outcome {
                        results[i] = Some(Err(err));
                        left.remove(k);
                    }
                }
                Err(e) => {
                    for &i in &left {
                        results[i] = Some(Err(e.clone().into()));
                    }
                    left.clear();
                }
            }
        }
        results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect()
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
            let settings = self.require_type(&ty).await?;
            let change = finishing(
                job,
                Outcome::Success(data.clone()),
                settings,
                self.random.clone(),
            );
            let (ops, rec) = self.fenced_ops(job, true, &change);
            let n = ops.len();
            let mut skipped = false;
            match self
                .try_accept(&ty, opts, &mut skipped, &ops, NEXT_CLAIMS, 1)
                .await
            {
                Ok(Ok((mut next, res))) => {
                    job.held(rec, &res);
                    return Ok(next.pop());
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

/// An acceptor leaves without leading: when nobody leads either (it may have been the waiter
/// a leaving leader woke to take its place, and took a job instead), it wakes another, or
/// the waiters left would have no watch and a later add would wake none of them. (A leader
/// leaving wakes one through its `Leading`'s drop.)
fn pass_the_lead(waiters: &Waiters, leading: &Option<Leading<'_>>) {
    if leading.is_none()
        && !*waiters
            .leader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        waiters.notify.notify_one();
    }
}
