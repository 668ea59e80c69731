//! The activity monitor: running jobs not updated within their type's timeout go back to pending.

use super::*;

impl Jobs {
    /// One pass of the activity monitor: every running job whose last update is older than
    /// its type's timeout is made pending again. Returns how many this call re-enqueued (with
    /// several monitors, each stalled job is counted by exactly one).
    pub async fn monitor_once(&self) -> Result<usize> {
        let mut n = 0;
        for (ty, timeout_s) in self.types().await? {
            let dir = active_dir(&ty);
            for name in self.tree.children(&dir).await? {
                let Some((id, lock)) = name.rsplit_once('~') else {
                    continue;
                };
                let Some((mut rec, v)) = self.read(&ty, id).await? else {
                    continue;
                };
                let now = self.now_ms();
                if rec.lock.as_deref() != Some(lock)
                    || now.saturating_sub(rec.updated_ms) <= timeout_s.saturating_mul(1000)
                {
                    continue;
                }
                rec.lock = None;
                rec.owner = None;
                rec.updated_ms = now;
                rec.stalls += 1;
                // A stalled run never completed: it runs again now (with the data an `add`
                // gave meanwhile, if any).
                rec.resubmit = true;
                rec.resubmit_ms = None;
                let enqueue = requeue(&mut rec, &ty, id, now);
                let mut ops = vec![
                    Op::delete(format!("{dir}/{name}"), None),
                    Op::set(
                        job_path(&ty, id),
                        Some(serde_json::to_vec(&rec).unwrap()),
                        Some(v),
                    ),
                ];
                ops.extend(enqueue);
                match self.tree.multi(ops).await {
                    Ok(_) => {
                        tracing::warn!(ty, id, "activity timeout: job re-enqueued");
                        n += 1;
                    }
                    Err(e) if is_race(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(n)
    }

    /// Runs the activity monitor until `stop` is notified: a pass every quarter of the
    /// shortest type timeout (between 100 ms and 5 s). Errors are logged and retried.
    pub async fn run_monitor(&self, stop: &Notify) {
        loop {
            if let Err(e) = self.monitor_once().await {
                tracing::warn!("activity monitor: {e}");
            }
            let shortest = match self.types().await {
                Ok(t) => t.iter().map(|(_, s)| *s).min().unwrap_or(20),
                Err(_) => 20,
            };
            let every = Duration::from_millis((shortest * 250).clamp(100, 5_000));
            tokio::select! {
                _ = stop.notified() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }
}
