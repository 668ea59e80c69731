//! The access queue and per-object locks.

use super::*;

/// A request's node and its status are two commits: a waiting access worker that saw the
/// node first is woken by the status, not by a timer.
pub async fn access_waiter_is_woken_by_a_request_still_being_made(h: &dyn Harness) {
    let (e, s) = engine(h, "w").await;
    let path = s
        .tree
        .create(
            &format!("{}/qid", access_folder(AccessQueue::Small)),
            None,
            CreateMode::PersistentSequential,
        )
        .await
        .unwrap();
    let waiter = {
        let e = e.clone();
        tokio::spawn(async move {
            e.wait_access(AccessQueue::Small, Duration::from_secs(600))
                .await
        })
    };
    // The waiter has seen the half-made request (its watch on the status is set) once it
    // is parked; then the second commit lands.
    tokio::task::yield_now().await;
    let status = json!({"status": "Pending", "last_modified": "2026-11-24 10:00:00 +0000",
                        "message": ""});
    s.tree
        .multi(vec![
            Op::create(
                format!("{path}/token"),
                Some(
                    json!({"ark": "ark:/99999/fk4x", "version": 1})
                        .to_string()
                        .into(),
                ),
            ),
            Op::create(format!("{path}/status"), Some(status.to_string().into())),
        ])
        .await
        .unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("woken by the status, long before its own timeout")
        .unwrap()
        .unwrap()
        .expect("the request, taken");
    assert_eq!(lease.token.ark.as_deref(), Some("ark:/99999/fk4x"));
}

pub async fn access_requests_move_through_their_states(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let id = e
        .create_access(
            AccessQueue::Small,
            &json!({"ark": "ark:/99999/fk4x", "version": 1}),
        )
        .await
        .unwrap();
    e.pause_queue("accessSmall").await.unwrap();
    assert!(
        e.acquire_access(AccessQueue::Small)
            .await
            .unwrap()
            .is_none()
    );
    e.resume_queue("accessSmall").await.unwrap();
    assert!(
        e.acquire_access(AccessQueue::Large)
            .await
            .unwrap()
            .is_none()
    );
    let l = e.acquire_access(AccessQueue::Small).await.unwrap().unwrap();
    assert_eq!(l.token.ark.as_deref(), Some("ark:/99999/fk4x"));
    let l = e.access_advance(l, Event::Success).await.unwrap();
    assert_eq!(l.status.status, lading_core::AccessState::Processing);
    e.access_transition(l, Event::Success, None).await.unwrap();
    let info = e.access(AccessQueue::Small, &id).await.unwrap();
    assert_eq!(info.status.status, lading_core::AccessState::Completed);
    assert!(!info.locked);
}

/// An assembler that dies with the request in Processing (its session expires, its lock
/// with it) leaves it to the next: taken again, in Processing, and assembled to the end. One
/// whose assembler lives is passed by.
pub async fn a_request_left_in_processing_by_a_dead_assembler_is_taken_again(h: &dyn Harness) {
    let (e, s) = engine(h, "dies").await;
    let (other, _s2) = engine(h, "next").await;
    let id = e
        .create_access(
            AccessQueue::Small,
            &json!({"ark": "ark:/99999/fk4x", "version": 1}),
        )
        .await
        .unwrap();
    let l = e.acquire_access(AccessQueue::Small).await.unwrap().unwrap();
    let l = e.access_advance(l, Event::Success).await.unwrap();
    // Alive, holding it: passed by.
    assert!(
        other
            .acquire_access(AccessQueue::Small)
            .await
            .unwrap()
            .is_none()
    );
    drop(l);
    (s.expire)().await;
    let l = other
        .acquire_access(AccessQueue::Small)
        .await
        .unwrap()
        .expect("the request its assembler left");
    assert_eq!(
        (l.id.clone(), l.status.status),
        (id.clone(), lading_core::AccessState::Processing)
    );
    other
        .access_transition(l, Event::Success, None)
        .await
        .unwrap();
    let info = other.access(AccessQueue::Small, &id).await.unwrap();
    assert_eq!(info.status.status, lading_core::AccessState::Completed);
    assert!(!info.locked);
}

/// A request whose token has a field of the wrong type is named as corrupt when read, and
/// taken by acquisition in its turn with the reason it cannot be read (the stage fails it,
/// naming the node), not skipped for ever; taking it changes nothing in the tree.
pub async fn a_corrupt_access_token_is_named_and_taken_to_be_failed(h: &dyn Harness) {
    let (e, _s) = engine(h, "w").await;
    let bad = e
        .create_access(
            AccessQueue::Small,
            &json!({"ark": "ark:/1/x", "version": "one"}),
        )
        .await
        .unwrap();
    let good = e
        .create_access(
            AccessQueue::Small,
            &json!({"ark": "ark:/1/y", "version": 1}),
        )
        .await
        .unwrap();
    match e.access(AccessQueue::Small, &bad).await {
        Err(EngineError::Corrupt { path, .. }) => {
            assert!(path.ends_with(&format!("{bad}/token")), "{path}")
        }
        other => panic!("a corrupt token must be named: {other:?}"),
    }
    let before = lading_engine::dump(&**e.tree(), "/access").await.unwrap();
    let l = e.acquire_access(AccessQueue::Small).await.unwrap().unwrap();
    assert_eq!(l.id, bad, "the corrupt request, in its turn");
    let why = l.unreadable.clone().expect("the reason it cannot be read");
    assert!(why.contains(&format!("{bad}/token")), "{why}");
    e.release_access_lease(l).await.unwrap();
    assert_eq!(
        lading_engine::dump(&**e.tree(), "/access").await.unwrap(),
        before,
        "nothing changed"
    );
    // Failed (as the stage fails it), the good one is next.
    let l = e.acquire_access(AccessQueue::Small).await.unwrap().unwrap();
    let l = e
        .access_advance(l, lading_core::Event::Success)
        .await
        .unwrap();
    e.access_transition(l, lading_core::Event::Fail, Some(why))
        .await
        .unwrap();
    let l = e.acquire_access(AccessQueue::Small).await.unwrap().unwrap();
    assert_eq!(l.id, good);
    assert_eq!(l.token.version, Some(1));
    e.release_access_lease(l).await.unwrap();
}

pub async fn ark_locks_are_exclusive_and_end_with_the_session(h: &dyn Harness) {
    let (e1, s1) = engine(h, "a").await;
    let (e2, _s2) = engine(h, "b").await;
    let lock = e1.lock_storage("ark:/13030/m5abc").await.unwrap();
    assert!(
        matches!(e2.lock_storage("ark:/13030/m5abc").await, Err(EngineError::Locked(p)) if p == "/locks/storage/ark_13030_m5abc")
    );
    let inv = e2.lock_inventory("ark:/13030/m5abc").await.unwrap();
    e1.unlock_ark(lock).await.unwrap();
    let again = e2.lock_storage("ark:/13030/m5abc").await.unwrap();
    e2.unlock_ark(again).await.unwrap();
    e2.unlock_ark(inv).await.unwrap();
    let _held = e1.lock_storage("ark:/1/x").await.unwrap();
    (s1.expire)().await;
    assert!(
        e2.lock_storage("ark:/1/x").await.is_ok(),
        "a dead session's ark lock is gone"
    );
}
