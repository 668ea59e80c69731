//! Creating jobs: `add` with seed 004's rules for an id that exists, and removal.

use super::*;

impl Jobs {
    /// Adds a job, or — when `id` exists — updates it as seed 004 says: pending → its data
    /// and (when given) scheduled time are updated; running → flagged to be re-enqueued with
    /// this data when it finishes; finished → pending again. `scheduled_time` is seconds since
    /// the epoch (default: now).
    pub async fn add(
        &self,
        ty: &str,
        id: &str,
        data: Value,
        scheduled_time: Option<u64>,
    ) -> Result<Added> {
        let opts = AddOptions {
            scheduled_time,
            priority: None,
        };
        self.add_with(ty, id, data, opts).await
    }

    /// [`add`](Self::add) with a priority (an extension: lower runs first among due jobs).
    /// A failed job is pending again, like a finished one, with its attempts reset.
    pub async fn add_with(
        &self,
        ty: &str,
        id: &str,
        data: Value,
        opts: AddOptions,
    ) -> Result<Added> {
        check_id(id)?;
        if let Some(p) = opts.priority {
            check_priority(p)?;
        }
        self.require_type(ty).await?;
        let sched = opts.scheduled_time.map(secs_to_ms).transpose()?;
        let path = job_path(ty, id);
        // Where a read is a round trip, the create is tried first: a new id (the usual case)
        // costs one round trip, and an existing one fails the create and is read.
        let mut assume_new = !self.tree.local_reads();
        for _ in 0..MAX_OPTIMISTIC {
            let now = self.now_ms();
            let first_try = std::mem::take(&mut assume_new);
            let current = if first_try {
                None
            } else {
                self.read(ty, id).await?
            };
            let (ops, added) = match current {
                None => {
                    let s = sched.unwrap_or(now);
                    let prio = opts.priority.unwrap_or(0);
                    let rec = Record::new(data.clone(), s, prio, now);
                    (
                        vec![
                            Op::create(&path, Some(rec.to_bytes())),
                            Op::create(pending_path(ty, prio, s, id), None),
                        ],
                        Added::Created,
                    )
                }
                Some((mut rec, v)) => {
                    let mut ops = Vec::new();
                    let added = match rec.state {
                        State::Pending => {
                            rec.data = data.clone();
                            let s = sched.unwrap_or(rec.scheduled_ms);
                            let p = opts.priority.unwrap_or(rec.priority);
                            if (s, p) != (rec.scheduled_ms, rec.priority) {
                                ops.push(Op::delete(
                                    pending_path(ty, rec.priority, rec.scheduled_ms, id),
                                    None,
                                ));
                                ops.push(Op::create(pending_path(ty, p, s, id), None));
                                rec.scheduled_ms = s;
                                rec.priority = p;
                            }
                            Added::Updated
                        }
                        State::Running => {
                            rec.resubmit = true;
                            rec.resubmit_ms = sched;
                            rec.next_data = Some(data.clone());
                            if let Some(p) = opts.priority {
                                rec.priority = p;
                            }
                            Added::Resubmitted
                        }
                        State::Finished | State::Failed => {
                            ops.extend(rec.leave_end(ty, id));
                            rec.data = data.clone();
                            rec.attempts = 0;
                            rec.last_error = None;
                            if let Some(p) = opts.priority {
                                rec.priority = p;
                            }
                            ops.push(rec.enqueue(ty, id, sched.unwrap_or(now)));
                            Added::Requeued
                        }
                    };
                    rec.updated_ms = now;
                    ops.insert(0, Op::set(&path, Some(rec.to_bytes()), Some(v)));
                    (ops, added)
                }
            };
            // The optimistic create goes with whatever other adds are waiting.
            let r = if first_try {
                self.adds.multi(&self.tree, ops).await
            } else {
                self.tree.multi(ops).await
            };
            match r {
                Ok(_) => return Ok(added),
                Err(e) if is_race(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(JobsError::Conflict(path))
    }

    /// [`add_with`](Self::add_with) of many jobs: the new ones in one `multi`, any that
    /// exist (or appear meanwhile) one by one as `add_with` does. One result per item, in
    /// order; at most [`MAX_BATCH`] items.
    pub async fn add_many(
        &self,
        ty: &str,
        items: Vec<(String, Value)>,
        opts: AddOptions,
    ) -> Result<Vec<Added>> {
        if items.len() > MAX_BATCH {
            return Err(JobsError::Invalid(format!(
                "a batch is at most {MAX_BATCH} jobs, not {}",
                items.len()
            )));
        }
        for (id, _) in &items {
            check_id(id)?;
        }
        if let Some(p) = opts.priority {
            check_priority(p)?;
        }
        self.require_type(ty).await?;
        let sched = opts.scheduled_time.map(secs_to_ms).transpose()?;
        let prio = opts.priority.unwrap_or(0);
        let paths: Vec<String> = items.iter().map(|(id, _)| job_path(ty, id)).collect();
        let found = self.tree.get_many(&paths).await?;
        let mut out: Vec<Option<Added>> = items.iter().map(|_| None).collect();
        // New ids, tried together; a clash (an add of the same id meanwhile) leaves that
        // one to `add_with`.
        let mut new: Vec<usize> = (0..items.len()).filter(|&i| found[i].is_none()).collect();
        let mut seen = HashSet::new();
        new.retain(|&i| seen.insert(items[i].0.as_str()));
        while !new.is_empty() {
            let now = self.now_ms();
            let s = sched.unwrap_or(now);
            let mut ops = Vec::with_capacity(2 * new.len());
            for &i in &new {
                let (id, data) = &items[i];
                let rec = Record::new(data.clone(), s, prio, now);
                ops.push(Op::create(&paths[i], Some(rec.to_bytes())));
                ops.push(Op::create(pending_path(ty, prio, s, id), None));
            }
            match self.tree.multi(ops).await {
                Ok(_) => {
                    for &i in &new {
                        out[i] = Some(Added::Created);
                    }
                    break;
                }
                Err(e) if is_race(&e) && e.failed_op().is_some() => {
                    new.remove(e.failed_op().unwrap_or(0) / 2);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut results = Vec::with_capacity(items.len());
        for (i, (id, data)) in items.into_iter().enumerate() {
            results.push(match out[i] {
                Some(a) => a,
                None => self.add_with(ty, &id, data, opts).await?,
            });
        }
        Ok(results)
    }

    /// An admin's retry of a failed job: pending now, its attempts reset (its last error
    /// kept until the next run ends). `WrongState` for a job that is not failed.
    pub async fn retry(&self, ty: &str, id: &str) -> Result<JobView> {
        check_id(id)?;
        self.require_type(ty).await?;
        let path = job_path(ty, id);
        for _ in 0..MAX_OPTIMISTIC {
            let (mut rec, v) = self.read_existing(ty, id).await?;
            if rec.state != State::Failed {
                return Err(JobsError::WrongState {
                    ty: ty.into(),
                    id: id.into(),
                    state: rec.state,
                    why: "only a failed job can be retried",
                });
            }
            let now = self.now_ms();
            let mut ops = rec.leave_end(ty, id);
            rec.attempts = 0;
            rec.updated_ms = now;
            ops.push(rec.enqueue(ty, id, now));
            ops.insert(0, Op::set(&path, Some(rec.to_bytes()), Some(v)));
            match self.tree.multi(ops).await {
                Ok(_) => {
                    return Ok(JobView {
                        ty: ty.into(),
                        id: id.into(),
                        record: rec,
                    });
                }
                Err(e) if is_race(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(JobsError::Conflict(path))
    }

    /// Removes a job. A processor running it gets `Halt` at its next `update` or `finish`.
    pub async fn remove(&self, ty: &str, id: &str) -> Result<()> {
        check_id(id)?;
        check_type(ty)?;
        let path = job_path(ty, id);
        for _ in 0..MAX_OPTIMISTIC {
            let (mut rec, v) = self.read_existing(ty, id).await?;
            let mut ops = vec![Op::delete(&path, Some(v))];
            match (rec.state, &rec.lock) {
                (State::Pending, _) => ops.push(Op::delete(
                    pending_path(ty, rec.priority, rec.scheduled_ms, id),
                    None,
                )),
                (State::Running, Some(lock)) => {
                    ops.push(Op::delete(active_path(ty, id, lock), None))
                }
                _ => ops.extend(rec.leave_end(ty, id)),
            }
            match self.tree.multi(ops).await {
                Ok(_) => return Ok(()),
                Err(e) if is_race(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(JobsError::Conflict(path))
    }
}
