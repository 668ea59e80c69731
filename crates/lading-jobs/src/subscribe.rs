//! Subscriptions: watching one job's state changes.

use super::*;

impl Jobs {
    /// Subscribes to a job's state changes; returns the subscription and the current state.
    /// Subscriptions not waited on for [`SUBSCRIPTION_IDLE_MS`] are ended (swept at most once
    /// a minute, on a new subscription); at most [`MAX_SUBSCRIPTIONS`] are held.
    pub async fn subscribe(&self, ty: &str, id: &str) -> Result<(SubId, State)> {
        let state = self.get_job_state(ty, id).await?;
        let now = self.clock.now_ms();
        let mut m = self.subs.lock().unwrap();
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
                used_ms: now,
                waiting: 0,
            },
        );
        Ok((sid, state))
    }

    /// How many subscriptions this process holds.
    pub fn subscription_count(&self) -> usize {
        self.subs.lock().unwrap().len()
    }

    /// Ends a subscription; false when there was none.
    pub fn unsubscribe(&self, sub: SubId) -> bool {
        self.subs.lock().unwrap().remove(&sub).is_some()
    }

    /// The next state change of any of `subs` since it was last reported (or subscribed),
    /// only changes to `state` when given (a removal is always reported, and ends the
    /// subscription); `None` after `timeout`.
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
            let mut m = self.subs.lock().unwrap();
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
                    let m = self.subs.lock().unwrap();
                    let s = m.get(&sid).ok_or(JobsError::NoSubscription(sid))?;
                    (s.ty.clone(), s.id.clone(), s.last)
                };
                let path = job_path(&ty, &id);
                watches.push(self.tree.watch(&path, WatchKind::Data).await?);
                let now = self.read(&ty, &id).await?.map(|(r, _)| r.state);
                if now == last {
                    continue;
                }
                let mut m = self.subs.lock().unwrap();
                if now.is_none() {
                    m.remove(&sid);
                } else if let Some(s) = m.get_mut(&sid) {
                    s.last = now;
                }
                if now.is_none() || state.is_none() || now == state {
                    return Ok(Some(Change {
                        subscription: sid,
                        ty,
                        id,
                        state: now,
                    }));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            tokio::select! {
                _ = any_fired(&mut watches) => {}
                _ = tokio::time::sleep(left) => return Ok(None),
            }
        }
    }
}
