//! The outbox: entries claimed once, retried, delivered; deliverers woken, and a backlog read in groups.

use super::*;

/// A callback effect keyed `key`, for the job `l` holds.
pub(crate) fn callback(key: &str, l: &lading_engine::JobLease) -> lading_engine::Effect {
    lading_engine::Effect {
        kind: lading_engine::EffectKind::Callback,
        key: key.into(),
        batch: None,
        job: Some(l.job.clone()),
        payload: json!({"url": "http://127.0.0.1/"}),
    }
}

/// A deliverer that found the only entry claimed by another session is woken when that
/// session ends (a crashed deliverer's claim goes with it, and no entry changes), not at its
/// safety net; and its watch, armed before it looks, wakes it for an entry made after the
/// look (found by `lading-sim`, once the deliverers' safety net was longer than its liveness
/// bound: both waited for it).
pub async fn an_idle_deliverer_is_woken_when_a_crashed_claim_goes_or_an_entry_comes(
    h: &dyn Harness,
) {
    let (e, _s) = engine(h, "a").await;
    let (crashed, s2) = engine(h, "b").await;
    batch_with_jobs(&e, 1, &[]).await;
    let mut l = take_job(&e, JobState::Pending).await;
    l.effects.push(callback("k1", &l));
    e.job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    let held = crashed
        .claim_effect(&[lading_engine::EffectKind::Callback])
        .await
        .unwrap()
        .unwrap();
    let armed = e.arm_outbox().await.unwrap();
    assert!(matches!(
        e.claim_effect(&[lading_engine::EffectKind::Callback])
            .await
            .unwrap(),
        Err(None)
    ));
    let waiter = tokio::spawn({
        let e = e.clone();
        async move { e.wait_outbox(armed, Duration::from_secs(3600)).await }
    });
    // Time is the subject: no wake-up while the claim stays.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished(), "woken while the claim stays");
    (s2.expire)().await;
    tokio::time::timeout(WAIT, waiter)
        .await
        .expect("woken when the crashed deliverer's claim went")
        .unwrap()
        .unwrap();
    drop(held);
    let c = e
        .claim_effect(&[lading_engine::EffectKind::Callback])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.entry.effect.key, "k1", "the entry is intact and free");
    e.effect_done(c).await.unwrap();
    // Armed, then a look that finds nothing, then an entry: the wait ends for it.
    let armed = e.arm_outbox().await.unwrap();
    assert!(matches!(
        e.claim_effect(&[lading_engine::EffectKind::Callback])
            .await
            .unwrap(),
        Err(None)
    ));
    let mut l = take_job(&e, JobState::Estimating).await;
    l.effects.push(callback("k2", &l));
    e.job_transition(l, Event::To(JobState::Provisioning), None)
        .await
        .unwrap();
    tokio::time::timeout(WAIT, e.wait_outbox(armed, Duration::from_secs(3600)))
        .await
        .expect("woken by the entry made after its look")
        .unwrap();
    let c = e
        .claim_effect(&[lading_engine::EffectKind::Callback])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.entry.effect.key, "k2");
}

/// A backlog (a receiver down for hours) is looked over in a few round trips, not one per
/// entry: 70 entries, each held or waiting, cost a deliverer one listing and three reads of 32
/// entries with their locks; what it finds is what is there (the held ones, the earliest
/// retry time), the operator's listing reads them the same way, and every entry is intact.
pub async fn a_deliverer_looks_over_a_backlog_in_a_few_reads(h: &dyn Harness) {
    let (e, _s) = engine(h, "a").await;
    let (other, counting, _s2) = crate::jobs::counted_engine(h, "b").await;
    batch_with_jobs(&e, 1, &[]).await;
    let mut l = take_job(&e, JobState::Pending).await;
    for i in 0..70 {
        let c = callback(&format!("k{i:02}"), &l);
        l.effects.push(c);
    }
    e.job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    // The first 40 tried once and waiting (the earliest due at `first`), the rest held by `e`.
    let first = e.clock().now_ms() + 60_000;
    let mut held = Vec::new();
    for i in 0..70u64 {
        let c = e
            .claim_effect(&[lading_engine::EffectKind::Callback])
            .await
            .unwrap()
            .unwrap();
        if i < 40 {
            e.effect_failed(c, "answered 503", Some(first + 1_000 * (39 - i)))
                .await
                .unwrap();
        } else {
            held.push(c);
        }
    }
    let (calls, writes) = (counting.calls(), counting.writes());
    let found = other
        .claim_effect(&[lading_engine::EffectKind::Callback])
        .await
        .unwrap();
    assert!(
        matches!(found, Err(Some(t)) if t == first),
        "the earliest retry time: {found:?}"
    );
    assert_eq!(
        (counting.calls() - calls, counting.writes() - writes),
        (4, 0),
        "one listing and three group reads, no write"
    );
    let calls = counting.calls();
    let listed = other.outbox().await.unwrap();
    assert_eq!(
        counting.calls() - calls,
        4,
        "the listing reads in groups too"
    );
    assert_eq!(listed.len(), 70);
    assert_eq!(listed.iter().filter(|i| i.delivering).count(), 30);
    assert_eq!(
        listed.iter().filter(|i| i.entry.attempts == 1).count(),
        40,
        "every entry intact"
    );
}

pub async fn outbox_entries_are_claimed_once_retried_and_deleted_when_delivered(h: &dyn Harness) {
    let (e, _s) = engine(h, "a").await;
    let (other, counting, _s2) = crate::jobs::counted_engine(h, "b").await;
    let (_bid, _jobs) = batch_with_jobs(&e, 1, &[]).await;
    // A job's move records its callback; a failed move records nothing.
    let mut l = take_job(&e, JobState::Pending).await;
    l.effects.push(callback("k1", &l));
    let stale = l.clone();
    e.job_transition(l, Event::To(JobState::Estimating), None)
        .await
        .unwrap();
    assert!(
        e.job_transition(stale, Event::To(JobState::Estimating), None)
            .await
            .is_err()
    );
    let out = e.outbox().await.unwrap();
    assert_eq!(out.len(), 1, "one entry: the stale move recorded nothing");
    // One claim at a time, across sessions.
    let c = e
        .claim_effect(&[lading_engine::EffectKind::Callback])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.entry.effect.key, "k1");
    // Passed over by the other deliverer without a write: it reads the entry and its lock
    // together, and does not try to lock what another holds.
    let writes = counting.writes();
    assert!(matches!(
        other
            .claim_effect(&[lading_engine::EffectKind::Callback])
            .await
            .unwrap(),
        Err(None)
    ));
    assert_eq!(counting.writes(), writes, "a write to lock a held entry");
    assert!(
        e.outbox().await.unwrap()[0].delivering,
        "still the first claim's"
    );
    assert!(matches!(
        e.claim_effect(&[lading_engine::EffectKind::Mail])
            .await
            .unwrap(),
        Err(None)
    ));
    // A failure keeps it with a retry time; not due before it.
    let at = e.clock().now_ms() + 60_000;
    e.effect_failed(c, "answered 500", Some(at)).await.unwrap();
    assert!(
        matches!(other.claim_effect(&[lading_engine::EffectKind::Callback]).await.unwrap(), Err(Some(t)) if t == at)
    );
    let item = &e.outbox().await.unwrap()[0];
    assert_eq!(
        (item.entry.attempts, item.entry.last_error.as_deref()),
        (1, Some("answered 500"))
    );
    // Given up: dead, never claimed, until an admin retries it.
    let name = item.name.clone();
    e.retry_effect(&name).await.unwrap();
    let c = other
        .claim_effect(&[lading_engine::EffectKind::Callback])
        .await
        .unwrap()
        .unwrap();
    other.effect_failed(c, "gone", None).await.unwrap();
    assert!(matches!(
        e.claim_effect(&[lading_engine::EffectKind::Callback])
            .await
            .unwrap(),
        Err(None)
    ));
    assert!(e.outbox().await.unwrap()[0].entry.dead);
    e.retry_effect(&name).await.unwrap();
    // Delivered: gone for good.
    let c = e
        .claim_effect(&[lading_engine::EffectKind::Callback])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.entry.effect.key, "k1");
    e.effect_done(c).await.unwrap();
    assert!(e.outbox().await.unwrap().is_empty());
    assert!(matches!(
        other
            .claim_effect(&[lading_engine::EffectKind::Callback])
            .await
            .unwrap(),
        Err(None)
    ));
}
