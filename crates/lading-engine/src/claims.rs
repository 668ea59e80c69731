//! Lock claims and the contention heuristics: which locks this process is taking, which
//! references are busy (another worker holds them) or deferred (not due yet), and the score
//! that decides whether a move also takes the next job.

use super::*;

/// Whether `e` failed because op `lock_op` (a lock's create) found the lock there: a lock this
/// process had claimed for itself, so another session holds it.
pub(crate) fn held_by_another(e: &TreeError, lock_op: usize) -> bool {
    e.failed_op() == Some(lock_op) && matches!(e.root(), TreeError::NodeExists(_))
}

impl Engine {
    /// Creates the lock at `lock` if `guard` still holds. Ok(false) when someone else has it or
    /// the guard failed (the item moved on).
    pub(crate) async fn try_lock(&self, lock: &str, guard: Op) -> Result<bool> {
        match self
            .tree
            .multi(vec![
                guard,
                Op::create_mode(lock, self.lock_data(), CreateMode::Ephemeral),
            ])
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if lost_race(&e) => {
                if held_by_another(&e, 1) {
                    self.note_raced();
                }
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Claims `lock` for this process and creates it if `guard` still holds. Ok(false) when a
    /// local worker, another session, or a moved item got in the way; the claim is then dropped.
    pub(crate) async fn take_lock(&self, lock: &str, guard: Op) -> Result<bool> {
        if !self.claim(lock) {
            return Ok(false);
        }
        let got = self.try_lock(lock, guard).await;
        if !matches!(got, Ok(true)) {
            self.unclaim(lock);
        }
        got
    }

    /// Another session holds a lock this process tried for.
    pub(crate) fn note_raced(&self) {
        self.raced_at.store(self.clock.now_ms(), Ordering::Relaxed);
    }

    /// Whether this process lost a lock to another session lately: then several workers
    /// (processes, hosts) look at the same heads, and picks are spread.
    pub(crate) fn raced_lately(&self) -> bool {
        let at = self.raced_at.load(Ordering::Relaxed);
        at != 0 && self.clock.now_ms().saturating_sub(at) < BUSY_SKIP.as_millis() as u64
    }

    pub(crate) fn claim(&self, lock: &str) -> bool {
        let session = self.tree.session_id();
        let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        match claimed.get(lock) {
            Some(s) if *s == session => {
                self.local_conflicts.fetch_add(1, Ordering::Relaxed);
                false
            }
            _ => {
                claimed.insert(lock.to_string(), session);
                true
            }
        }
    }

    pub(crate) fn unclaim(&self, lock: &str) {
        let had = self
            .claimed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(lock)
            .is_some();
        if had {
            self.unclaimed.notify_waiters();
        }
    }

    pub(crate) fn is_deferred(&self, folder: &str, reference: &str) -> bool {
        let mut deferred = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        if deferred.is_empty() {
            return false;
        }
        let key = join(folder, reference);
        match deferred.get(&key) {
            Some(at) if *at > self.clock.now_ms() => true,
            Some(_) => {
                deferred.remove(&key);
                false
            }
            None => false,
        }
    }

    pub(crate) fn mark_deferred(&self, folder: &str, reference: &str, at_ms: u64) {
        let mut deferred = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        if deferred.len() > 10_000 {
            let now = self.clock.now_ms();
            deferred.retain(|_, at| *at > now);
        }
        deferred.insert(join(folder, reference), at_ms);
    }

    /// How long until the earliest job this process saw deferred becomes due.
    pub(crate) fn next_due(&self) -> Option<Duration> {
        let now = self.clock.now_ms();
        self.deferred
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|at| **at > now)
            .min()
            .map(|at| Duration::from_millis(at - now))
    }

    pub(crate) fn is_busy(&self, folder: &str, reference: &str) -> bool {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let Some(f) = busy.get_mut(folder) else {
            return false;
        };
        match f.names.get(reference) {
            Some(t) if t.elapsed() < BUSY_SKIP => true,
            Some(_) => {
                f.names.remove(reference);
                false
            }
            None => false,
        }
    }

    /// References of `folder` found locked lately, newest first, at most `n`; older ones are
    /// forgotten here (a job that moved on leaves its entry behind).
    pub(crate) fn busy_names(&self, folder: &str, n: usize) -> Vec<String> {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let Some(f) = busy.get_mut(folder) else {
            return Vec::new();
        };
        f.names.retain(|_, t| t.elapsed() < BUSY_SKIP);
        let mut v: Vec<(&String, &std::time::Instant)> = f.names.iter().collect();
        if v.len() > n {
            v.select_nth_unstable_by(n, |a, b| b.1.cmp(a.1));
            v.truncate(n);
        }
        v.sort_by(|a, b| b.1.cmp(a.1));
        v.into_iter().map(|(k, _)| k.clone()).collect()
    }

    pub(crate) fn busy_since(&self, folder: &str, reference: &str) -> Option<std::time::Instant> {
        let busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        busy.get(folder)?.names.get(reference).copied()
    }

    /// Whether this process met another worker at the head of `folder` lately.
    pub(crate) fn contended_lately(&self, folder: &str) -> bool {
        let busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        busy.get(folder)
            .and_then(|f| f.last)
            .is_some_and(|t| t.elapsed() < BUSY_SKIP)
    }

    pub(crate) fn mark_busy(&self, folder: &str, reference: &str) {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let f = busy.entry(folder.to_string()).or_default();
        if f.names.len() > 10_000 {
            f.names.retain(|_, t| t.elapsed() < BUSY_SKIP);
        }
        let now = std::time::Instant::now();
        f.names.insert(reference.to_string(), now);
        f.last = Some(now);
    }

    /// Moves [`Engine::next_score`] by `by`, within its bounds.
    pub(crate) fn score_next(&self, by: i32) {
        let _ = self
            .next_score
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some((v + by).clamp(-NEXT_SCORE_MAX, NEXT_SCORE_MAX))
            });
    }

    /// The one waiting skeleton of acquisition: each round registers its watches, then tries
    /// to acquire; when nothing is free it waits for a watch, for a claim this process lost
    /// to itself to be given up, for `due` (at most the slow sweep), for `cancel` (→ `None`)
    /// or for the deadline (→ `None`). Only the waiting is cancelled, never a round.
    pub(crate) async fn wait_until<T, F, Fut>(
        &self,
        timeout: Duration,
        cancel: impl std::future::Future<Output = ()>,
        mut round: F,
    ) -> Result<Option<T>>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Round<T>>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut cancel = std::pin::pin!(cancel);
        loop {
            let conflicts = self.local_conflicts.load(Ordering::Relaxed);
            let unclaimed = self.unclaimed.notified();
            let mut unclaimed = std::pin::pin!(unclaimed);
            unclaimed.as_mut().enable();
            let (watches, due) = match round().await? {
                Round::Got(t) => return Ok(Some(t)),
                Round::Again => continue,
                Round::Wait { watches, due } => (watches, due),
            };
            let lost_locally = self.local_conflicts.load(Ordering::Relaxed) != conflicts;
            // `due` on the engine's clock: a test's manual clock wakes the wait when it is
            // moved past it; the real one sleeps for it.
            let due_at = self.clock.now_ms() + due.as_millis() as u64;
            let until_due = match self.clock.clone().reaches(due_at) {
                Some(f) => f,
                None => Box::pin(tokio::time::sleep(due)),
            };
            self.parked.send_modify(|n| *n += 1);
            tokio::select! {
                _ = any_of(watches) => {}
                _ = &mut unclaimed, if lost_locally => {}
                _ = &mut cancel => return Ok(None),
                _ = until_due => {}
                // The safety net: a slow sweep, should a wake-up ever be missed.
                _ = tokio::time::sleep(SWEEP) => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(None),
            }
        }
    }
}

/// What one round of [`Engine::wait_until`] found.
pub(crate) enum Round<T> {
    /// Acquired.
    Got(T),
    /// Look again at once (the round saw something it had not watched yet).
    Again,
    /// Nothing free: wait for one of `watches`, or `due`.
    Wait { watches: Vec<Watch>, due: Duration },
}
