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
        check_id(id)?;
        self.require_type(ty).await?;
        let sched = scheduled_time.map(secs_to_ms).transpose()?;
        let path = job_path(ty, id);
        for _ in 0..MAX_OPTIMISTIC {
            let now = self.now_ms();
            let (ops, added) = match self.read(ty, id).await? {
                None => {
                    let s = sched.unwrap_or(now);
                    let rec = Record {
                        state: State::Pending,
                        data: data.clone(),
                        scheduled_ms: s,
                        resubmit: false,
                        resubmit_ms: None,
                        next_data: None,
                        lock: None,
                        owner: None,
                        updated_ms: now,
                        added_ms: now,
                        runs: 0,
                        stalls: 0,
                        extra: Default::default(),
                    };
                    (
                        vec![
                            Op::create(&path, Some(serde_json::to_vec(&rec).unwrap())),
                            Op::create(pending_path(ty, s, id), None),
                        ],
                        Added::Created,
                    )
                }
                Some((mut rec, v)) => {
                    let mut ops = Vec::new();
                    let added = match rec.state {
                        State::Pending => {
                            rec.data = data.clone();
                            if let Some(s) = sched.filter(|s| *s != rec.scheduled_ms) {
                                ops.push(Op::delete(pending_path(ty, rec.scheduled_ms, id), None));
                                ops.push(Op::create(pending_path(ty, s, id), None));
                                rec.scheduled_ms = s;
                            }
                            Added::Updated
                        }
                        State::Running => {
                            rec.resubmit = true;
                            rec.resubmit_ms = sched;
                            rec.next_data = Some(data.clone());
                            Added::Resubmitted
                        }
                        State::Finished => {
                            rec.state = State::Pending;
                            rec.data = data.clone();
                            rec.scheduled_ms = sched.unwrap_or(now);
                            ops.push(Op::create(pending_path(ty, rec.scheduled_ms, id), None));
                            Added::Requeued
                        }
                    };
                    rec.updated_ms = now;
                    ops.insert(
                        0,
                        Op::set(&path, Some(serde_json::to_vec(&rec).unwrap()), Some(v)),
                    );
                    (ops, added)
                }
            };
            match self.tree.multi(ops).await {
                Ok(_) => return Ok(added),
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
            let Some((rec, v)) = self.read(ty, id).await? else {
                return Err(JobsError::NoJob {
                    ty: ty.into(),
                    id: id.into(),
                });
            };
            let mut ops = vec![Op::delete(&path, Some(v))];
            match (rec.state, &rec.lock) {
                (State::Pending, _) => {
                    ops.push(Op::delete(pending_path(ty, rec.scheduled_ms, id), None))
                }
                (State::Running, Some(lock)) => {
                    ops.push(Op::delete(active_path(ty, id, lock), None))
                }
                _ => {}
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
