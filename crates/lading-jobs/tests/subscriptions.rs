//! The subscription cap, on a real store: the error names the limit, nothing is written, and
//! ending one subscription makes room for another.

use lading_core::time::system_clock;
use lading_jobs::{Jobs, JobsError, MAX_SUBSCRIPTIONS};
use lading_store_sqlite::{SqliteOptions, SqliteTree};
use std::sync::Arc;

#[tokio::test]
async fn a_process_holds_at_most_the_cap_of_subscriptions() {
    let dir = tempfile::tempdir().unwrap();
    let tree =
        Arc::new(SqliteTree::open(dir.path().join("lading.db"), SqliteOptions::default()).unwrap());
    let j = Jobs::new(tree.clone(), system_clock(), "tester");
    j.set_type_timeout("cap", 60).await.unwrap();
    j.add("cap", "a", serde_json::json!({"n": 1}), None)
        .await
        .unwrap();
    let before = j.get_job("cap", "a").await.unwrap();
    let mut first = None;
    for _ in 0..MAX_SUBSCRIPTIONS {
        let (sid, _) = j.subscribe("cap", "a").await.unwrap();
        first.get_or_insert(sid);
    }
    let err = j.subscribe("cap", "a").await.unwrap_err();
    assert!(matches!(err, JobsError::TooManySubscriptions(n) if n == MAX_SUBSCRIPTIONS));
    assert!(err.to_string().contains("100000 subscriptions"), "{err}");
    assert_eq!(j.subscription_count(), MAX_SUBSCRIPTIONS);
    assert!(j.unsubscribe(first.unwrap()));
    j.subscribe("cap", "a").await.unwrap();
    assert_eq!(
        j.get_job("cap", "a").await.unwrap(),
        before,
        "the job is as it was"
    );
    lading_core::Tree::close(tree.as_ref()).await.unwrap();
}
