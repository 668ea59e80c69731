//! The contention heuristics: what this process learnt lately about other workers, used to
//! skip work that is busy or not due and to decide how greedy a move may be. Bookkeeping
//! only, no I/O: it makes acquisition cheaper, never decides correctness (every lock is
//! still taken in the tree).

use crate::watched::fired;
use foldhash::HashMap;
use lading_core::tree::Watch;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;
// Tokio's clock: the real one in a process, the simulated one under `lading-sim`.
use tokio::time::Instant;

/// How long a job found locked by another worker is skipped by this process's acquisitions.
pub(crate) const BUSY_SKIP: Duration = Duration::from_millis(500);
/// Bounds of [`Contention::next_score`].
const NEXT_SCORE_MAX: i32 = 8;
/// One move in this many tries to take the next job along even when the score says not to.
const NEXT_PROBE: u32 = 16;
/// Entries kept per map before old ones are swept.
const KEEP: usize = 10_000;
/// How many next jobs a move tries to lock along with it before it is made alone.
pub(crate) const NEXT_TRIES: usize = 2;
/// How many free jobs at the head of a contended queue a worker picks among at random.
pub(crate) const SPREAD: usize = 16;
/// The head window a contended acquisition over several states picks from, per state.
pub(crate) const WINDOW: usize = 64;
/// Lost races an acquisition over several states takes before it looks state by state.
pub(crate) const ANY_TRIES: usize = 4;
/// Most references one acquisition looks at before giving up (all locked by others).
pub(crate) const MAX_SCAN: usize = 4096;

#[derive(Default)]
pub(crate) struct Contention {
    /// Job locks another worker was found holding, per state folder: skipped by acquisition
    /// for a moment, and watched by a waiting worker of that state.
    busy: Mutex<HashMap<String, BusyFolder>>,
    /// References of jobs found deferred (a retry time in the future) → that time in ms:
    /// acquisition skips them without a round trip until then.
    deferred: Mutex<HashMap<String, u64>>,
    /// How moves that also lock the next job fared lately: up on success, down harder on a
    /// race lost to another session. Below zero such moves are mostly made alone (one in
    /// [`NEXT_PROBE`] still tries): where many sessions share the queue heads, a lost race
    /// costs a round trip that a plain move and acquisition would not.
    next_score: AtomicI32,
    next_calls: AtomicU32,
    /// When (ms, the engine's clock) this process last lost a lock to another session: an
    /// acquisition over several states spreads its picks.
    raced_at: AtomicU64,
}

/// References of one state folder found locked by other workers, and when.
#[derive(Default)]
struct BusyFolder {
    names: HashMap<String, Busy>,
    /// When a lock was last found taken here.
    last: Option<Instant>,
}

/// A reference found locked by another worker: when, and what proves it still is.
struct Busy {
    at: Instant,
    /// A watch on the job's lock, set before the attempt that found it held and not fired
    /// since: the lock is still there (its delete would have fired it), so the job is not
    /// tried again until the watch fires, however long that is. (With the time alone, a job
    /// held through a long stage was tried again by every other process at every wake-up
    /// once its mark was [`BUSY_SKIP`] old: in `lading-sim`, 70% of the refused lock
    /// attempts.) Trusted until the time given with it at most, the waiters' sweep: should
    /// a watch event ever be missed, the job is still tried again then. Trusted on the
    /// session it was set on only: once that session is replaced, its event may come after
    /// the lock went, and a waiter watches the lock again on the new session, too late to
    /// see it go (as a value kept under a watch, see [`crate::watched`]).
    held: Option<(Watch, Instant, u64)>,
}

impl Busy {
    /// Whether it is still to be passed over: found locked a moment ago, or proved held.
    /// A proof whose watch has fired, or was set on another session than `session`, is let
    /// go (a fired watch is never polled again).
    fn current(&mut self, session: u64) -> bool {
        if let Some((w, until, set_on)) = self.held.as_mut() {
            if *set_on == session && Instant::now() < *until && !fired(w) {
                return true;
            }
            self.held = None;
        }
        self.at.elapsed() < BUSY_SKIP
    }

    fn proved(&self) -> bool {
        self.held.is_some()
    }
}

/// How acquisition is to treat a reference of a state folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Not known to be locked: tried.
    Free,
    /// Found locked by another worker at that moment: tried only when nothing is free.
    Busy(Instant),
    /// Proved still locked by another worker (see [`Busy::held`]): not tried.
    Held,
}

fn key(folder: &str, reference: &str) -> String {
    lading_core::layout::slashed([folder, reference])
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Contention {
    /// Whether `reference` of `folder` was seen deferred to after `now_ms`.
    pub(crate) fn is_deferred(&self, folder: &str, reference: &str, now_ms: u64) -> bool {
        let mut deferred = lock(&self.deferred);
        if deferred.is_empty() {
            return false;
        }
        let key = key(folder, reference);
        match deferred.get(&key) {
            Some(at) if *at > now_ms => true,
            Some(_) => {
                deferred.remove(&key);
                false
            }
            None => false,
        }
    }

    pub(crate) fn mark_deferred(&self, folder: &str, reference: &str, at_ms: u64, now_ms: u64) {
        let mut deferred = lock(&self.deferred);
        if deferred.len() > KEEP {
            deferred.retain(|_, at| *at > now_ms);
        }
        deferred.insert(key(folder, reference), at_ms);
    }

    /// Forgets a deferral (the job was woken early).
    pub(crate) fn forget_deferred(&self, folder: &str, reference: &str) {
        lock(&self.deferred).remove(&key(folder, reference));
    }

    /// How long after `now_ms` the earliest job seen deferred in `folder` becomes due. Per
    /// folder: a job deferred in one stage wakes that stage's waiters, not every waiter of
    /// the process (each of which would list its folder for nothing).
    pub(crate) fn next_due(&self, folder: &str, now_ms: u64) -> Option<Duration> {
        lock(&self.deferred)
            .iter()
            .filter(|(k, at)| {
                **at > now_ms
                    && k.strip_prefix(folder)
                        .is_some_and(|rest| rest.starts_with('/'))
            })
            .map(|(_, at)| *at)
            .min()
            .map(|at| Duration::from_millis(at - now_ms))
    }

    /// How acquisition on `session` treats `reference` of `folder` (see [`Seen`]); a mark
    /// that has lapsed is forgotten here.
    pub(crate) fn seen(&self, folder: &str, reference: &str, session: u64) -> Seen {
        let mut busy = lock(&self.busy);
        let Some(f) = busy.get_mut(folder) else {
            return Seen::Free;
        };
        let Some(b) = f.names.get_mut(reference) else {
            return Seen::Free;
        };
        if !b.current(session) {
            f.names.remove(reference);
            return Seen::Free;
        }
        match b.proved() {
            true => Seen::Held,
            false => Seen::Busy(b.at),
        }
    }

    pub(crate) fn is_busy(&self, folder: &str, reference: &str, session: u64) -> bool {
        self.seen(folder, reference, session) != Seen::Free
    }

    /// References of `folder` to watch the locks of, at most `n`: those proved held first
    /// (each is passed over until its watch fires, so a waiter must be woken by it), then
    /// those found locked lately, newest first. Lapsed ones are forgotten here (a job that
    /// moved on leaves its entry behind).
    pub(crate) fn busy_names(&self, folder: &str, n: usize, session: u64) -> Vec<String> {
        let mut busy = lock(&self.busy);
        let Some(f) = busy.get_mut(folder) else {
            return Vec::new();
        };
        f.names.retain(|_, b| b.current(session));
        let mut v: Vec<(&String, bool, &Instant)> = f
            .names
            .iter()
            .map(|(k, b)| (k, b.proved(), &b.at))
            .collect();
        // Proved first, then newest first; ties by name, so the order never depends on the
        // map's.
        let order = |a: &(&String, bool, &Instant), b: &(&String, bool, &Instant)| {
            b.1.cmp(&a.1)
                .then_with(|| b.2.cmp(a.2))
                .then_with(|| a.0.cmp(b.0))
        };
        if v.len() > n {
            v.select_nth_unstable_by(n, order);
            v.truncate(n);
        }
        v.sort_by(order);
        v.into_iter().map(|(k, _, _)| k.clone()).collect()
    }

    /// Forgets that `reference` of `folder` was found locked (its lock is gone).
    pub(crate) fn forget_busy(&self, folder: &str, reference: &str) {
        if let Some(f) = lock(&self.busy).get_mut(folder) {
            f.names.remove(reference);
        }
    }

    /// Forgets the busy references of `folder` that are not in `listed`, the folder's whole
    /// listing: a job that has moved on is no longer waited for there (its lock, watched by
    /// a waiter of this folder, would wake it at every later stage the job goes through).
    pub(crate) fn keep_busy_listed(&self, folder: &str, listed: &[String]) {
        let mut busy = lock(&self.busy);
        if let Some(f) = busy.get_mut(folder)
            && !f.names.is_empty()
        {
            f.names.retain(|n, _| listed.binary_search(n).is_ok());
        }
    }

    /// Whether this process met another worker at the head of `folder` lately.
    pub(crate) fn contended_lately(&self, folder: &str) -> bool {
        lock(&self.busy)
            .get(folder)
            .and_then(|f| f.last)
            .is_some_and(|t| t.elapsed() < BUSY_SKIP)
    }

    pub(crate) fn mark_busy(&self, folder: &str, reference: &str, session: u64) {
        self.mark(folder, reference, session, None, 0);
    }

    /// `reference` of `folder` was found locked by another session, and `proof` (a watch on
    /// its lock set before that attempt, not fired when it was refused, and the session it
    /// was set on) says it still is until it fires: passed over until then, or for `lasts` at
    /// most, on that session only (see [`Busy::held`]).
    /// At most `max` proved per folder, the number a waiter watches
    /// ([`Contention::busy_names`]); past that, the reference is marked as found locked now
    /// only.
    pub(crate) fn mark_held(
        &self,
        folder: &str,
        reference: &str,
        proof: (Watch, u64),
        max: usize,
        lasts: Duration,
    ) {
        let (watch, session) = proof;
        self.mark(
            folder,
            reference,
            session,
            Some((watch, Instant::now() + lasts, session)),
            max,
        );
    }

    fn mark(
        &self,
        folder: &str,
        reference: &str,
        session: u64,
        proof: Option<(Watch, Instant, u64)>,
        max: usize,
    ) {
        let mut busy = lock(&self.busy);
        let f = busy.entry(folder.to_string()).or_default();
        if f.names.len() > KEEP {
            f.names.retain(|_, b| b.current(session));
        }
        let proved = f
            .names
            .iter()
            .filter(|(n, b)| b.proved() && n.as_str() != reference)
            .count();
        let held = proof.filter(|_| proved < max);
        let now = Instant::now();
        f.names
            .insert(reference.to_string(), Busy { at: now, held });
        f.last = Some(now);
    }

    /// Moves the next-job score by `by`, within its bounds.
    pub(crate) fn score_next(&self, by: i32) {
        let _ = self
            .next_score
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some((v + by).clamp(-NEXT_SCORE_MAX, NEXT_SCORE_MAX))
            });
    }

    /// Whether this move should try to take the next job along: while the score is not
    /// below zero, and as a probe one time in [`NEXT_PROBE`] when it is.
    pub(crate) fn take_next_along(&self) -> bool {
        let probe = self
            .next_calls
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(NEXT_PROBE);
        probe || self.next_score.load(Ordering::Relaxed) >= 0
    }

    /// Another session holds a lock this process tried for (at `now_ms`).
    pub(crate) fn note_raced(&self, now_ms: u64) {
        self.raced_at.store(now_ms, Ordering::Relaxed);
    }

    /// Whether this process lost a lock to another session lately: then several workers
    /// (processes, hosts) look at the same heads, and picks are spread.
    pub(crate) fn raced_lately(&self, now_ms: u64) -> bool {
        let at = self.raced_at.load(Ordering::Relaxed);
        at != 0 && now_ms.saturating_sub(at) < BUSY_SKIP.as_millis() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deferred_reference_is_skipped_until_due_then_forgotten() {
        let c = Contention::default();
        assert!(!c.is_deferred("/f", "a", 0));
        c.mark_deferred("/f", "a", 1_500, 1_000);
        assert!(c.is_deferred("/f", "a", 1_499));
        assert!(!c.is_deferred("/g", "a", 1_499), "per folder");
        assert_eq!(c.next_due("/f", 1_000), Some(Duration::from_millis(500)));
        assert_eq!(c.next_due("/g", 1_000), None, "due per folder");
        c.mark_deferred("/ff", "c", 1_200, 1_000);
        assert_eq!(
            c.next_due("/f", 1_000),
            Some(Duration::from_millis(500)),
            "not /ff's"
        );
        assert!(!c.is_deferred("/f", "a", 1_500), "due");
        assert_eq!(c.next_due("/f", 1_500), None, "forgotten once due");
        c.mark_deferred("/f", "b", 9_000, 1_000);
        c.forget_deferred("/f", "b");
        assert!(!c.is_deferred("/f", "b", 1_000), "woken early");
    }

    #[test]
    fn busy_references_are_skipped_and_listed_newest_first() {
        let c = Contention::default();
        assert!(!c.contended_lately("/f"));
        c.mark_busy("/f", "a", S);
        c.mark_busy("/f", "b", S);
        assert!(c.is_busy("/f", "a", S) && c.is_busy("/f", "b", S));
        assert!(!c.is_busy("/f", "c", S) && !c.is_busy("/g", "a", S));
        assert!(c.contended_lately("/f"));
        assert_eq!(c.busy_names("/f", 1, S), vec!["b".to_string()]);
        assert_eq!(
            c.busy_names("/f", 5, S),
            vec!["b".to_string(), "a".to_string()]
        );
        assert!(
            matches!((c.seen("/f", "a", S), c.seen("/f", "b", S)), (Seen::Busy(a), Seen::Busy(b)) if a <= b)
        );
        c.keep_busy_listed("/f", &["b".to_string(), "c".to_string()]);
        assert!(!c.is_busy("/f", "a", S), "gone from the folder: forgotten");
        assert!(c.is_busy("/f", "b", S), "still listed: kept");
    }

    /// The session the tests' marks are made on.
    const S: u64 = 1;

    /// A watch that fires when `tx` is sent on or dropped.
    fn watch() -> (tokio::sync::oneshot::Sender<()>, Watch) {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        (
            tx,
            Watch::new(async move {
                let _ = rx.await;
            }),
        )
    }

    /// A reference proved held is passed over, and not tried as the busy one, past the
    /// time mark for as long as its watch has not fired (within `lasts`); it is listed
    /// first for a waiter to watch; once the watch fires, it is free. Proofs are capped at
    /// what a waiter watches.
    #[tokio::test(start_paused = true)]
    async fn a_reference_proved_held_is_passed_over_until_its_watch_fires() {
        let c = Contention::default();
        let (fire_a, a) = watch();
        c.mark_held("/f", "a", (a, S), 2, Duration::from_secs(60));
        c.mark_busy("/f", "b", S);
        assert_eq!(c.seen("/f", "a", S), Seen::Held);
        assert!(matches!(c.seen("/f", "b", S), Seen::Busy(_)));
        tokio::time::advance(BUSY_SKIP * 4).await;
        assert_eq!(
            c.seen("/f", "a", S),
            Seen::Held,
            "past the time mark: still held"
        );
        assert_eq!(c.seen("/f", "b", S), Seen::Free, "lapsed");
        c.mark_busy("/f", "c", S);
        assert_eq!(
            c.busy_names("/f", 1, S),
            vec!["a".to_string()],
            "a proved one is watched first"
        );
        drop(fire_a);
        assert_eq!(
            c.seen("/f", "a", S),
            Seen::Free,
            "its lock changed: tried again"
        );
        // Proofs past what a waiter watches are marked by time only.
        let (_keep_d, d) = watch();
        let (_keep_e, e) = watch();
        let (_keep_g, g) = watch();
        c.mark_held("/f", "d", (d, S), 2, Duration::from_secs(60));
        c.mark_held("/f", "e", (e, S), 2, Duration::from_secs(60));
        c.mark_held("/f", "g", (g, S), 2, Duration::from_secs(60));
        assert_eq!(c.seen("/f", "e", S), Seen::Held);
        assert!(
            matches!(c.seen("/f", "g", S), Seen::Busy(_)),
            "over the cap"
        );
        // A proof is trusted for `lasts` at most (the waiters' sweep).
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(
            c.seen("/f", "d", S),
            Seen::Free,
            "past the sweep: tried again"
        );
    }

    /// A proof is trusted on the session its watch was set on only: on the next, the
    /// reference is tried again (its old watch may fire after the lock went, and nobody
    /// waits on it any more), and the proof is let go for good.
    #[tokio::test(start_paused = true)]
    async fn a_proof_set_on_a_replaced_session_proves_nothing() {
        let c = Contention::default();
        let (_keep, a) = watch();
        c.mark_held("/f", "a", (a, S), 2, Duration::from_secs(60));
        assert_eq!(c.seen("/f", "a", S), Seen::Held);
        tokio::time::advance(BUSY_SKIP * 2).await;
        assert_eq!(c.seen("/f", "a", S + 1), Seen::Free, "another session");
        assert_eq!(c.seen("/f", "a", S), Seen::Free, "let go");
        assert!(c.busy_names("/f", 5, S).is_empty());
    }

    #[test]
    fn lost_races_make_moves_go_alone_but_still_probe() {
        let c = Contention::default();
        assert!(c.take_next_along(), "the first call probes");
        assert!(c.take_next_along(), "a score of zero takes the next along");
        for _ in 0..100 {
            c.score_next(-2);
        }
        let along = (0..NEXT_PROBE * 4).filter(|_| c.take_next_along()).count();
        assert_eq!(along, 4, "one probe in {NEXT_PROBE}");
        for _ in 0..100 {
            c.score_next(1);
        }
        assert!(
            (0..10).all(|_| c.take_next_along()),
            "bounded: recovers quickly"
        );
        assert!(!c.raced_lately(10_000));
        c.note_raced(10_000);
        assert!(c.raced_lately(10_000 + BUSY_SKIP.as_millis() as u64 - 1));
        assert!(!c.raced_lately(10_000 + BUSY_SKIP.as_millis() as u64));
    }
}
