//! Subscriptions: watching one job's state changes.

use super::*;

impl Jobs {
    /// Subscribes to a job's state changes; returns the subscription and the current state.
    /// Subscriptions not waited on for [`SUBSCRIPTION_IDLE_MS`] are ended (swept at most once
    /// a minute, on a new subscription); at most [`MAX_SUBSCRIPTIONS`] are held.
    pub async fn subscribe(&self, ty: &str, id: &str) -> Result<(SubId, State)> {
        let rec = self.get_job(ty, id).await?.record;
        let state = rec.state;
        let now = self.clock.now_ms();
        let mut m = self
            .subs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let swept = self.swept_ms.load(Ordering::Relaxed);
        if now.saturating_sub(swept) >= 60_000 || m.len() >= MAX_SUBSCRIPTIONS {
            self.swept_ms.store(now, Ordering::Relaxed);
            m.retain(|_, s| s.waiting > 0 || now.saturating_sub(s.used_ms) < SUBSCRIPTION_IDLE_MS);
        }
        if m.len() >= MAX_SUBSCRIPTIONS {
            return Err(JobsError::TooManySubscriptions(m.len()));
        }
        let sid = self.next_sub.fetch_add(1, Ordering::Relaxed);
        m.insert(
            sid,
            Sub {
                ty: ty.into(),
                id: id.into(),
                last: Some(state),
                last_seq: rec.seq,
                used_ms: now,
                waiting: 0,
            },
        );
        Ok((sid, state))
    }

    /// How many subscriptions this process holds.
    pub fn subscription_count(&self) -> usize {
        self.subs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Ends a subscription; false when there was none.
    pub fn unsubscribe(&self, sub: SubId) -> bool {
        self.subs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&sub)
            .is_some()
    }

    /// The next state change of any of `subs` since it was last reported (or subscribed),
    /// only changes to `state` when given (a removal is always reported, and ends the
    /// subscription); `None` after `timeout`. Every transition is reported, in order, even
    /// one the job left before this wait looked (the record remembers its last [`HISTORY`]
    /// states; older ones not reported are counted in `missed`).
    pub async fn wait(
        &self,
        subs: &[SubId],
        state: Option<State>,
        timeout: Duration,
    ) -> Result<Option<Change>> {
        if subs.is_empty() {
            return Err(JobsError::Invalid(
                "wait needs at least one subscription".into(),
            ));
        }
        let _waiting = {
            let now_ms = self.clock.now_ms();
            let mut m = self
                .subs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(&missing) = subs.iter().find(|id| !m.contains_key(id)) {
                return Err(JobsError::NoSubscription(missing));
            }
            for id in subs {
                if let Some(s) = m.get_mut(id) {
                    s.waiting += 1;
                    s.used_ms = now_ms;
                }
            }
            Waiting {
                subs: &self.subs,
                ids: subs.to_vec(),
                clock: &self.clock,
            }
        };
        let deadline = Instant::now() + timeout;
        loop {
            let mut watches = Vec::with_capacity(subs.len());
            for &sid in subs {
                let (ty, id, last) = {
                    let m = self
                        .subs
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let s = m.get(&sid).ok_or(JobsError::NoSubscription(sid))?;
                    (s.ty.clone(), s.id.clone(), s.last)
                };
                let path = job_path(&ty, &id);
                watches.push(self.tree.watch(&path, WatchKind::Data).await?);
                let rec = self.read(&ty, &id).await?.map(|(r, _)| r);
                let change = |state, seq, missed| Change {
                    subscription: sid,
                    ty: ty.clone(),
                    id: id.clone(),
                    state,
                    seq,
                    missed,
                };
                let Some(rec) = rec else {
                    self.subs
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .remove(&sid);
                    return Ok(Some(change(None, 0, 0)));
                };
                if rec.history.is_empty() {
                    // Written before transitions were kept: the state as read.
                    if Some(rec.state) == last {
                        continue;
                    }
                    if let Some(s) = self
                        .subs
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .get_mut(&sid)
                    {
                        s.last = Some(rec.state);
                    }
                    if state.is_none_or(|want| want == rec.state) {
                        return Ok(Some(change(Some(rec.state), 0, 0)));
                    }
                    continue;
                }
                let first = rec.seq + 1 - rec.history.len() as u64;
                let mut m = self
                    .subs
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let Some(s) = m.get_mut(&sid) else {
                    return Err(JobsError::NoSubscription(sid));
                };
                let mut missed = 0;
                while s.last_seq < rec.seq {
                    let next = (s.last_seq + 1).max(first);
                    missed += next - (s.last_seq + 1);
                    let st = rec.history[(next - first) as usize];
                    s.last_seq = next;
                    s.last = Some(st);
                    if state.is_none_or(|want| want == st) {
                        return Ok(Some(change(Some(st), next, missed)));
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.parked_waits.send_modify(|n| *n += 1);
            tokio::select! {
                biased;
                _ = any_fired(&mut watches) => {}
                _ = tokio::time::sleep(left) => return Ok(None),
            }
        }
    }
}
