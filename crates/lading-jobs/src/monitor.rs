//! The activity monitor: running jobs not updated within their type's timeout go back to
//! pending; finished and failed jobs past their type's retention are removed; schedules due
//! add their jobs.

use super::*;

/// Ended jobs one retention pass removes per type and state (the rest wait for the next).
const RETENTION_BATCH: usize = 256;
/// The longest a monitor leaves between two retention passes of a type (a quarter of its
/// shortest retention age, if shorter): ended jobs are removed that much late at most, and
/// a pass every second listed both folders of every type for nothing.
const RETENTION_EVERY_MS: u64 = 10_000;

/// What one pass of the monitor did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MonitorPass {
    /// Stalled jobs re-enqueued.
    pub requeued: usize,
    /// Finished and failed jobs removed by retention.
    pub removed: usize,
    /// Jobs added by schedules.
    pub scheduled: usize,
    /// The earliest schedule tick not yet due (ms).
    #[serde(skip)]
    pub next_tick_ms: Option<u64>,
    /// The shortest activity timeout of the types it looked at (s).
    #[serde(skip)]
    pub shortest_timeout_s: Option<u64>,
}

impl Jobs {
    /// One pass of the activity monitor: every running job whose last update is older than
    /// its type's timeout is made pending again. Returns how many this call re-enqueued (with
    /// several monitors, each stalled job is counted by exactly one).
    pub async fn monitor_once(&self) -> Result<usize> {
        let mut n = 0;
        for (ty, settings) in self.types().await? {
            n += self.requeue_stalled(&ty, settings.timeout_s).await?;
        }
        Ok(n)
    }

    /// Everything the monitor does, once: stalled jobs, retention, schedules.
    pub async fn monitor_pass(&self) -> Result<MonitorPass> {
        let mut pass = MonitorPass::default();
        for (ty, settings) in self.types().await? {
            self.remember_type(&ty, settings.clone()).await?;
            pass.shortest_timeout_s = Some(
                pass.shortest_timeout_s
                    .map_or(settings.timeout_s, |t| t.min(settings.timeout_s)),
            );
            pass.requeued += self.requeue_stalled(&ty, settings.timeout_s).await?;
            if self.retention_due(&ty, &settings) {
                pass.removed += self.retention_once(&ty, &settings).await?;
            }
            let (added, next) = self.tick_schedules(&ty).await?;
            pass.scheduled += added;
            if let Some(t) = next {
                pass.next_tick_ms = Some(pass.next_tick_ms.map_or(t, |n| n.min(t)));
            }
        }
        Ok(pass)
    }

    /// Whether `ty`'s ended jobs are to be looked at now (see [`RETENTION_EVERY_MS`]); if so,
    /// the time is noted.
    fn retention_due(&self, ty: &str, settings: &TypeSettings) -> bool {
        let shortest_keep_ms = [settings.keep_finished_s, settings.keep_failed_s]
            .into_iter()
            .filter(|s| *s > 0)
            .min()
            .map_or(RETENTION_EVERY_MS, |s| s.saturating_mul(250));
        let every = RETENTION_EVERY_MS.min(shortest_keep_ms);
        let now = self.now_ms();
        let mut last = self
            .retained_ms
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match last.get(ty) {
            Some(at) if now.saturating_sub(*at) < every => false,
            _ => {
                last.insert(ty.to_string(), now);
                true
            }
        }
    }

    async fn requeue_stalled(&self, ty: &str, timeout_s: u64) -> Result<usize> {
        let mut n = 0;
        let dir = active_dir(ty);
        let names = match self.tree.children(&dir).await {
            Err(TreeError::NoNode(_)) => return Ok(0),
            r => r?,
        };
        for name in names {
            let Some((id, lock)) = name.rsplit_once('~') else {
                continue;
            };
            let Some((mut rec, v)) = self.read(ty, id).await? else {
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
            let enqueue = requeue(&mut rec, ty, id, now);
            let mut ops = vec![
                Op::delete(format!("{dir}/{name}"), None),
                Op::set(job_path(ty, id), Some(rec.to_bytes()), Some(v)),
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
        Ok(n)
    }

    /// Removes finished and failed jobs of `ty` older than its retention ages (oldest
    /// first, at most `RETENTION_BATCH` of each per call). Returns how many.
    pub async fn retention_once(&self, ty: &str, settings: &TypeSettings) -> Result<usize> {
        let mut n = 0;
        for (dir, keep_s, state) in [
            ("finished", settings.keep_finished_s, State::Finished),
            ("failed", settings.keep_failed_s, State::Failed),
        ] {
            if keep_s == 0 {
                continue;
            }
            let dir = concat(&[ROOT, "/", ty, "/", dir]);
            let now = self.now_ms();
            let cutoff = now.saturating_sub(keep_s.saturating_mul(1000));
            let page = match self.tree.children_page(&dir, None, RETENTION_BATCH).await {
                Err(TreeError::NoNode(_)) => continue,
                r => r?,
            };
            for name in page {
                let Some((ms, id)) = parse_ended(&name) else {
                    continue;
                };
                if ms > cutoff {
                    break;
                }
                let entry = concat(&[&dir, "/", &name]);
                let mut ops = vec![Op::delete(entry, None)];
                match self.read(ty, id).await? {
                    // Still the run that made this entry: the job goes with it.
                    Some((rec, v)) if rec.state == state && rec.ended_ms == Some(ms) => {
                        ops.push(Op::delete(job_path(ty, id), Some(v)));
                    }
                    // A stray entry (its job was re-added or removed): only the entry goes.
                    _ => {}
                }
                let whole = ops.len() == 2;
                match self.tree.multi(ops).await {
                    Ok(_) => n += usize::from(whole),
                    Err(e) if is_race(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(n)
    }

    /// Runs the activity monitor until `shutdown` says stop: a pass every quarter of the
    /// shortest type timeout (between 100 ms and 1 s), and at each schedule's next tick.
    /// Errors are logged and retried.
    pub async fn run_monitor(&self, shutdown: lading_worker::Shutdown) {
        let mut stop = std::pin::pin!(shutdown.into_stopped());
        loop {
            let (mut next_tick, mut shortest) = (None, 20);
            match self.monitor_pass().await {
                Ok(p) => {
                    next_tick = p.next_tick_ms;
                    shortest = p.shortest_timeout_s.unwrap_or(20);
                }
                Err(e) => tracing::warn!("activity monitor: {e}"),
            }
            let mut every = Duration::from_millis((shortest * 250).clamp(100, 1_000));
            if let Some(t) = next_tick {
                let ms = t.saturating_sub(self.now_ms()).max(1);
                every = every.min(Duration::from_millis(ms));
            }
            tokio::select! {
                biased;
                _ = &mut stop => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }
}
