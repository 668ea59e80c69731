//! Lock claims (which locks this process is taking, so local workers do not race each
//! other) and the one waiting skeleton of acquisition. What the claims teach about other
//! workers is kept by [`crate::contention::Contention`].

use super::*;
use std::pin::Pin;

/// A signal that one contested claim was let go, made when the claim was refused (so a let-go
/// after the refusal is never missed).
type Unclaimed = Pin<Box<tokio::sync::futures::OwnedNotified>>;

tokio::task_local! {
    /// The claims refused to a local worker during the round of the waiter that runs in this
    /// task ([`Engine::wait_until`]): that waiter, and only it, also waits for one of those
    /// claims to be let go. (Counted for the whole process, every waiter whose round
    /// overlapped any refusal waited, and was woken at every contested claim let go
    /// anywhere in the process: in `lading-sim`, more wake-ups than all the tree's watches
    /// together, each a listing of the waiter's folder.)
    static LOST_LOCALLY: Mutex<Vec<Unclaimed>>;
}

/// How an attempt at a lock ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Locked {
    /// Created, on this session.
    Taken(u64),
    /// Another session holds it.
    Held,
    /// The guard failed (the item moved on), or a local worker has it.
    Refused,
}

/// Whether `e` failed because op `lock_op` (a lock's create) found the lock there: a lock this
/// process had claimed for itself, so another session holds it.
pub(crate) fn held_by_another(e: &TreeError, lock_op: usize) -> bool {
    e.failed_op() == Some(lock_op) && matches!(e.root(), TreeError::NodeExists(_))
}

impl Engine {
    /// Creates the lock at `lock` if `guard` still holds: `Taken` (with the session), `Held`
    /// when another session has it, `Refused` when the guard failed (the item moved on) or
    /// a local worker has it.
    pub(crate) async fn try_lock(&self, lock: &str, guard: Op, session: u64) -> Result<Locked> {
        // On the session it was claimed under, the one its lease will carry.
        match self
            .tree
            .multi_on(
                session,
                vec![
                    guard,
                    Op::create_mode(lock, self.lock_data(), CreateMode::Ephemeral),
                ],
            )
            .await
        {
            Ok(_) => Ok(Locked::Taken(session)),
            Err(e) if lost_race(&e) => {
                if held_by_another(&e, 1) {
                    self.contention.note_raced(self.clock.now_ms());
                    return Ok(Locked::Held);
                }
                Ok(Locked::Refused)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Claims `lock` for this process and creates it if `guard` still holds. Returns the
    /// session it was taken on (the lease's), `None` when a local worker, another session,
    /// or a moved item got in the way; the claim is then dropped.
    pub(crate) async fn take_lock(&self, lock: &str, guard: Op) -> Result<Option<u64>> {
        Ok(match self.take_lock_as(lock, guard).await? {
            Locked::Taken(session) => Some(session),
            Locked::Held | Locked::Refused => None,
        })
    }

    /// [`Engine::take_lock`], saying whether another session holds the lock.
    pub(crate) async fn take_lock_as(&self, lock: &str, guard: Op) -> Result<Locked> {
        if !self.claim(lock) {
            return Ok(Locked::Refused);
        }
        // Ours: a local worker that claims it under a new session takes the claim over,
        // and what this attempt gives up must stay its own (found by `lading-sim`).
        let session = self.claim_session(lock);
        let got = self.try_lock(lock, guard, session).await;
        match got {
            Ok(Locked::Taken(_)) => {}
            // Another session holds it, or the item moved on: a local worker that lost its
            // claim to this attempt would fail the same way, so it is not woken (it waits on
            // the lock's and the folder's watches like everyone else). Waking it here made
            // two local loops wake each other at once for as long as another process held
            // the lock (found by `lading-sim`).
            Ok(_) => {
                if !self.claimed_by_other(lock, session) {
                    self.unclaim_quietly(lock);
                }
            }
            // The create may have been made with its answer lost.
            Err(_) => self.abandon_on(lock, session).await,
        }
        got
    }

    /// Lets go of `lock` (of a lease or claim of `session`) after a failed call that may have
    /// left it in the tree as that session's (its reply lost, or the move that deletes it
    /// refused): deletes it if that session holds it, else leaves it. When even that cannot
    /// be told (the store does not answer), the lock stays claimed here and is a stray,
    /// deleted by the next acquisition round ([`Engine::drop_strays`]); a live process never
    /// keeps it for ever. Only what is still `session`'s is touched. A
    /// lease lost to a session change, whose lock this process has since claimed and taken
    /// again under the new session, leaves that alone; deciding "is it mine" by the current
    /// session deleted the new lease's lock (found by `lading-sim`).
    pub(crate) async fn abandon_on(&self, lock: &str, session: u64) {
        if self.claimed_by_other(lock, session) {
            return;
        }
        if self.drop_if_own(lock, session).await.is_ok() {
            self.unclaim_on(lock, session);
        } else {
            // Claimed again under its session, so no local worker takes it meanwhile.
            self.claimed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(lock.to_string(), session);
            self.strays
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(lock.to_string(), session);
        }
    }

    /// Lets go of a lease's `lock` (a lease of `session`) after a call that consumed the
    /// lease: its claim only when the call succeeded or was refused up front, else
    /// [`Engine::abandon_on`].
    pub(crate) async fn settle<T>(&self, lock: &str, session: u64, r: &Result<T>) {
        match r {
            Err(e) if !e.refused_up_front() => self.abandon_on(lock, session).await,
            _ => self.unclaim_on(lock, session),
        }
    }

    /// Deletes a lease's `lock` (of `what`, taken on `session`) and lets go of its claim:
    /// lease lost when it was gone or the session is no longer this tree's (a lock of
    /// another session's is never deleted); abandoned ([`Engine::abandon_on`]) when the delete
    /// did not go through.
    pub(crate) async fn release_lock(&self, lock: &str, what: &str, session: u64) -> Result<()> {
        match self
            .tree
            .multi_on(session, vec![Op::delete(lock, None)])
            .await
            .map_err(|e| e.root().clone())
        {
            Ok(_) => {
                self.unclaim_on(lock, session);
                Ok(())
            }
            Err(TreeError::NoNode(_) | TreeError::SessionExpired) => {
                self.unclaim_on(lock, session);
                Err(lost(what))
            }
            Err(e) => {
                self.abandon_on(lock, session).await;
                Err(e.into())
            }
        }
    }

    /// Deletes `lock` if `session` holds it; Ok when it is gone or not its. The delete
    /// goes on the session seen holding it: should that session be replaced in between, the
    /// lock went with it, and one another session has made since (of the same version, 0) is
    /// not deleted (found by `lading-sim`).
    async fn drop_if_own(&self, lock: &str, session: u64) -> std::result::Result<(), TreeError> {
        match self.tree.exists(lock).await? {
            Some(stat) if stat.ephemeral_owner == session => {
                let delete = vec![Op::delete(lock, Some(stat.version))];
                match self
                    .tree
                    .multi_on(session, delete)
                    .await
                    .map_err(|e| e.root().clone())
                {
                    Ok(_)
                    | Err(TreeError::NoNode(_))
                    | Err(TreeError::BadVersion { .. })
                    | Err(TreeError::SessionExpired) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            _ => Ok(()),
        }
    }

    /// Tries again to delete every stray lock ([`Engine::abandon_on`]); whether any is left.
    pub(crate) async fn drop_strays(&self) -> bool {
        let strays: Vec<String> = self
            .strays
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        for lock in strays {
            // Taken out while it is tried, so that one caller at a time does: two that both
            // read it as this session's, one deleting it and the other only later, deleted
            // the lock another session had made in between (found by `lading-sim`).
            let mine = self
                .strays
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&lock);
            let Some(session) = mine else {
                continue;
            };
            if self.drop_if_own(&lock, session).await.is_ok() {
                self.unclaim_on(&lock, session);
            } else {
                self.strays
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(lock, session);
            }
        }
        !self
            .strays
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Drops a claim without waking local waiters.
    fn unclaim_quietly(&self, lock: &str) {
        let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        claimed.remove(lock);
        self.contested
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(lock);
    }

    /// The session `lock` was claimed under (the current one when it is not claimed): its
    /// lock is created on it, and its lease carries it. Read at the lease's making instead,
    /// the session could have been replaced since the lock was made, and the lease would
    /// pass as the new session's (found by `lading-sim`).
    pub(crate) fn claim_session(&self, lock: &str) -> u64 {
        self.claimed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(lock)
            .copied()
            .unwrap_or_else(|| self.tree.session_id())
    }

    /// Claims `lock` for a local lease under this session: false while one holds it. A claim
    /// made under an earlier session is taken over (its lease is lost, though its handler may
    /// still run: what that handler then gives up is only its own, see [`Engine::abandon_on`]).
    pub(crate) fn claim(&self, lock: &str) -> bool {
        let session = self.tree.session_id();
        let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        match claimed.get(lock) {
            Some(s) if *s == session => {
                let signal = self
                    .contested
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(lock.to_string())
                    .or_default()
                    .clone();
                // The waiter whose round this is (if any) waits for this claim to go: made
                // here, under `claimed`'s lock, before the claim can be let go.
                let _ = LOST_LOCALLY.try_with(|lost| {
                    lost.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(Box::pin(signal.notified_owned()))
                });
                false
            }
            _ => {
                claimed.insert(lock.to_string(), session);
                true
            }
        }
    }

    /// Whether `lock` is claimed here under another session than `session`: a lease of
    /// `session` that gives it up then has nothing left to give.
    fn claimed_by_other(&self, lock: &str, session: u64) -> bool {
        self.claimed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(lock)
            .is_some_and(|s| *s != session)
    }

    /// Whether a worker of this process holds the claim on `lock` under the current session
    /// (what makes [`Engine::claim`] refuse it).
    pub(crate) fn claimed_here(&self, lock: &str) -> bool {
        let session = self.tree.session_id();
        self.claimed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(lock)
            .is_some_and(|s| *s == session)
    }

    /// Drops the claim on `lock` if it is `session`'s.
    pub(crate) fn unclaim_on(&self, lock: &str, session: u64) {
        if !self.claimed_by_other(lock, session) {
            self.unclaim(lock);
        }
    }

    pub(crate) fn unclaim(&self, lock: &str) {
        let contested = {
            let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
            claimed.remove(lock).and_then(|_| {
                self.contested
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(lock)
            })
        };
        if let Some(signal) = contested {
            signal.notify_waiters();
        }
    }

    /// The one waiting skeleton of acquisition: each round registers its watches, then tries
    /// to acquire; when nothing is free it waits for a watch, for a claim this process lost
    /// to itself to be given up, for `due` (at most the slow sweep), for `cancel` (→ `None`)
    /// or for the deadline (→ `None`). Only the waiting is cancelled, never a round.
    pub(crate) async fn wait_until<T, F, Fut>(
        &self,
        timeout: Duration,
        cancel: impl std::future::Future<Output = ()>,
        armed: &Armed,
        woken: Option<&tokio::sync::Notify>,
        mut round: F,
    ) -> Result<Option<T>>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Round<T>>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut cancel = std::pin::pin!(cancel);
        loop {
            let woken = std::pin::pin!(woken.map(|w| w.notified()));
            let mut woken = woken.as_pin_mut();
            if let Some(w) = woken.as_mut() {
                w.as_mut().enable();
            }
            let strays = self.drop_strays().await;
            armed.begin_round();
            let (due, mut lost) = match LOST_LOCALLY
                .scope(Mutex::default(), async {
                    let r = round().await;
                    let lost = LOST_LOCALLY.with(|l| {
                        std::mem::take(&mut *l.lock().unwrap_or_else(|p| p.into_inner()))
                    });
                    r.map(|r| (r, lost))
                })
                .await?
            {
                (Round::Got(t), _) => return Ok(Some(t)),
                (Round::Again, _) => continue,
                (Round::Wait { .. }, _) if sabotage::on(sabotage::BUSY_SPIN) => continue,
                (Round::Wait { .. }, _) if sabotage::on(sabotage::BUSY_WAIT) => {
                    let _ = self.tree.exists(lading_core::layout::JOBS).await;
                    continue;
                }
                (Round::Wait { due }, lost) => (due, lost),
            };
            let mut watches = armed.take_wanted();
            let due = if strays { due.min(STRAY_RETRY) } else { due };
            let unclaimed = std::future::poll_fn(|cx| {
                match lost.iter_mut().any(|s| s.as_mut().poll(cx).is_ready()) {
                    true => std::task::Poll::Ready(()),
                    false => std::task::Poll::Pending,
                }
            });
            // `due` on the engine's clock: a test's manual clock wakes the wait when it is
            // moved past it; the real one sleeps for it.
            let due_at = self.clock.now_ms() + due.as_millis() as u64;
            let until_due = match self.clock.clone().reaches(due_at) {
                Some(f) => f,
                None => Box::pin(tokio::time::sleep(due)),
            };
            self.parked.send_modify(|n| *n += 1);
            let mut fired = None;
            tokio::select! {
                // In order, not at random: a run is the same every time (`lading-sim`).
                biased;
                i = any_of(watches.iter_mut().map(|k| &mut k.3)) => fired = Some(i),
                _ = unclaimed => {}
                _ = async {
                    match woken {
                        Some(w) => w.await,
                        None => std::future::pending().await,
                    }
                } => {}
                _ = &mut cancel => return Ok(None),
                _ = until_due => {}
                // The safety net: a slow sweep, should a wake-up ever be missed.
                _ = tokio::time::sleep(self.sweep) => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(None),
            }
            // What is kept of the node that woke it may be behind (its own watch's event may
            // come later): the next round reads it again (see [`crate::watched`]).
            if let Some((path, kind, _, _)) = fired.and_then(|i| watches.get(i)) {
                self.watched.forget(path, *kind);
            }
            armed.keep_unfired(watches, fired);
        }
    }
}

/// The watches of one wait, kept from round to round. A watch that has not fired still
/// guards whatever a later round reads after it (a change since it was set would have fired
/// it), so a round sets again only the watches that fired, that are new, or that were set on
/// another session. On ZooKeeper each watch set is a round trip; a woken worker used to set
/// all of them again (two to a few dozen) before looking.
#[derive(Default)]
pub(crate) struct Armed {
    inner: Mutex<ArmedInner>,
}

#[derive(Default)]
struct ArmedInner {
    /// Unfired watches of the last wait.
    kept: Vec<Kept>,
    /// This round's, in the order it asked for them (the order they are polled in).
    wanted: Vec<Kept>,
}

/// A watch, what it watches, and the session it was set on.
type Kept = (String, WatchKind, u64, Watch);

impl Armed {
    fn lock(&self) -> std::sync::MutexGuard<'_, ArmedInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches `path`: the unfired watch a former round set on this session, or a share of
    /// the process's ([`Engine::shared_watch`]). A kept watch that fired since (a round that
    /// looked again at once never waited on it) is let go, not used again: it would never
    /// fire again, and the process's registry has let it go too, so the waiter would find the
    /// node unwatched at every look and look again at once, never waiting (`lading-sim`,
    /// seed 2005835).
    pub(crate) async fn watch(&self, e: &Engine, path: &str, kind: WatchKind) -> Result<()> {
        let session = e.tree.session_id();
        let found = take_unfired(&mut self.lock().kept, path, kind, session);
        let entry = match found {
            Some(e) => e,
            None => {
                let w = e.shared_watch(path, kind).await?;
                (path.to_string(), kind, session, w)
            }
        };
        self.lock().wanted.push(entry);
        Ok(())
    }

    /// A round begins: what the last one asked for may be asked for again.
    fn begin_round(&self) {
        let mut g = self.lock();
        let wanted = std::mem::take(&mut g.wanted);
        g.kept.extend(wanted);
    }

    /// The round waits on what it asked for; watches it no longer asked for are dropped.
    fn take_wanted(&self) -> Vec<Kept> {
        let mut g = self.lock();
        g.kept.clear();
        std::mem::take(&mut g.wanted)
    }

    /// After a wait (`fired`: the watch that ended it, already polled to its end): the
    /// watches that have not fired are kept for the next round.
    fn keep_unfired(&self, watches: Vec<Kept>, fired: Option<usize>) {
        let unfired = watches
            .into_iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != fired)
            .filter_map(|(_, mut k)| (!crate::watched::fired(&mut k.3)).then_some(k))
            .collect();
        self.lock().kept = unfired;
    }
}

/// The watch `kept` holds on `path` set on `session`, taken out; `None` if there is none or
/// it has fired (it is then let go: it would never fire again).
fn take_unfired(kept: &mut Vec<Kept>, path: &str, kind: WatchKind, session: u64) -> Option<Kept> {
    let i = kept
        .iter()
        .position(|(p, k, s, _)| p == path && *k == kind && *s == session)?;
    let mut k = kept.swap_remove(i);
    (!crate::watched::fired(&mut k.3)).then_some(k)
}

/// What one round of [`Engine::wait_until`] found.
pub(crate) enum Round<T> {
    /// Acquired.
    Got(T),
    /// Look again at once (the round saw something it had not watched yet).
    Again,
    /// Nothing free: wait for one of the watches the round set (see [`Armed`]), or `due`.
    Wait { due: Duration },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch() -> (tokio::sync::oneshot::Sender<()>, Watch) {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let w = Watch::new(async move {
            let _ = rx.await;
        });
        (tx, w)
    }

    /// A round takes a kept watch again only while it has not fired: one that fired during a
    /// round that looked again at once is let go, so the node is watched anew.
    #[test]
    fn a_kept_watch_is_used_again_only_unfired_and_on_its_session() {
        let (_pending, a) = watch();
        let (fire, b) = watch();
        let (_other, c) = watch();
        let lock = "/jobs/jid0000000008/lock";
        let mut kept: Vec<Kept> = vec![
            ("/locks/queue/ingest".into(), WatchKind::Data, 7, a),
            (lock.into(), WatchKind::Data, 7, b),
            (lock.into(), WatchKind::Children, 7, c),
        ];
        fire.send(()).unwrap();
        assert!(take_unfired(&mut kept, lock, WatchKind::Data, 7).is_none());
        assert_eq!(kept.len(), 2, "the fired watch is let go");
        assert!(take_unfired(&mut kept, "/locks/queue/ingest", WatchKind::Data, 8).is_none());
        assert!(take_unfired(&mut kept, "/locks/queue/ingest", WatchKind::Data, 7).is_some());
        assert!(take_unfired(&mut kept, lock, WatchKind::Children, 7).is_some());
        assert!(kept.is_empty());
    }
}
