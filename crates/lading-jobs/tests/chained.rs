//! `finish_then_accept` on a real store: a busy processor's finish carries the claim of its
//! next job, so each job costs one write after the first accept.

use lading_core::time::system_clock;
use lading_jobs::{AcceptOptions, Jobs, State};
use lading_store_sqlite::{SqliteOptions, SqliteTree};
use std::sync::Arc;

#[tokio::test]
async fn a_busy_processor_finishes_each_job_and_claims_the_next_in_one_multi() {
    let dir = tempfile::tempdir().unwrap();
    let tree =
        Arc::new(SqliteTree::open(dir.path().join("lading.db"), SqliteOptions::default()).unwrap());
    let j = Jobs::new(tree.clone(), system_clock(), "tester");
    j.set_type_timeout("busy", 60).await.unwrap();
    for i in 0..5 {
        j.add("busy", &format!("j{i}"), serde_json::json!({}), None)
            .await
            .unwrap();
    }
    let now = AcceptOptions::default();
    let before = tree.stats().multis;
    let mut next = j.accept("busy", &now).await.unwrap();
    let mut done = Vec::new();
    while let Some(mut job) = next {
        done.push(job.id.clone());
        next = j.finish_then_accept(&mut job, None, &now).await.unwrap();
    }
    // One accept, then one multi per job: four finishes that claimed the next job, and the
    // last finish, made alone once nothing was due.
    assert_eq!(tree.stats().multis - before, 6);
    assert_eq!(done, ["j0", "j1", "j2", "j3", "j4"]);
    let c = j.counts("busy").await.unwrap();
    assert_eq!(c.get(&State::Finished), Some(&5));
    lading_core::Tree::close(tree.as_ref()).await.unwrap();
}
