//! The backend conformance suite: one set of tests, generic over the backend, covering the
//! tree contract and every engine guarantee of SPEC §3. A behaviour not tested here is not
//! guaranteed. A backend runs it with
//! `lading_store_tests::conformance_tests!(my_harness_constructor);` in one of its test files.
//!
//! Tests wait on the engine and the tree, never on sleeps; the only timeouts are upper bounds
//! that turn a hang into a failure.

mod access;
mod batches;
mod generic;
mod generic_ext;
mod holds;
mod jobs;
mod merritt;
mod outbox;
mod tree;
mod waiters;
pub use access::*;
pub use batches::*;
pub use generic::*;
pub use generic_ext::*;
pub use holds::*;
pub use jobs::*;
pub use merritt::*;
pub use outbox::*;
pub use tree::*;
pub use waiters::*;

use lading_core::layout::*;
use lading_core::time::system_clock;
use lading_core::{
    BatchState, BoxFuture, CreateMode, Event, JobState, Op, OpResult, Tree, TreeError, WatchKind,
};
use lading_engine::{Engine, EngineError, JobSpec};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// One open session, plus a way to make it lapse.
pub struct Session {
    pub tree: Arc<dyn Tree>,
    /// Makes the session expire as if its process stalled past the timeout, and lets the
    /// store notice (its ephemeral nodes are gone when this returns).
    pub expire: Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>,
}

/// A fresh, empty store of one backend kind.
pub trait Harness: Send + Sync + 'static {
    /// Opens a new session on this store.
    fn open(&self) -> BoxFuture<'_, Session>;
}

/// Upper bound on any single wait in the suite; a hang fails instead of blocking CI.
pub const WAIT: Duration = Duration::from_secs(30);

pub async fn engine(h: &dyn Harness, owner: &str) -> (Arc<Engine>, Session) {
    engine_on_clock(h, owner, system_clock()).await
}

/// [`engine`] on `clock` (a [`lading_core::time::ManualClock`] where time is the subject).
pub async fn engine_on_clock(
    h: &dyn Harness,
    owner: &str,
    clock: lading_core::time::SharedClock,
) -> (Arc<Engine>, Session) {
    let s = h.open().await;
    let e = Arc::new(Engine::new(s.tree.clone(), clock, owner));
    e.init().await.expect("init");
    (e, s)
}

/// Asserts the session's tree is as `before` was dumped (`why` it should be).
pub async fn unchanged(s: &Session, before: &BTreeMap<String, Value>, why: &str) {
    assert_eq!(&normalised_dump(s.tree.as_ref()).await, before, "{why}");
}

/// The batch `e` acquires in `state` (one must be there).
pub async fn take_batch(e: &Engine, state: BatchState) -> lading_engine::BatchLease {
    let got = e.acquire_batch(state).await.expect("acquire a batch");
    got.unwrap_or_else(|| panic!("no {state:?} batch to acquire"))
}

/// Asserts that a waiter that had parked `since` times is still waiting half a second after
/// something that must not wake it (a woken waiter looks, and parks again or returns), with
/// at most `stray` wake-ups of its own start (a store tells watchers of a write after it
/// answers it, so an event of the test's setup may reach a watch set just after). What must
/// not wake it is done several times, so each wake-up it caused would count more than that.
/// Time is the subject here: an absence is seen only over a while.
pub async fn still_parked<T>(
    parked: &mut tokio::sync::watch::Receiver<u64>,
    since: u64,
    stray: u64,
    waiter: &tokio::task::JoinHandle<T>,
    who: &str,
) {
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let now = *parked.borrow_and_update();
    assert!(
        now <= since + stray,
        "{who} was not woken (it would have looked and parked again): parked {} more times",
        now - since
    );
    assert!(!waiter.is_finished(), "{who} is still waiting");
}

/// The job `e` acquires in `state` (one must be there).
pub async fn take_job(e: &Engine, state: JobState) -> lading_engine::JobLease {
    let got = e.acquire_job(state).await.expect("acquire a job");
    got.unwrap_or_else(|| panic!("no {state:?} job to acquire"))
}

/// The job `e` acquires in Pending, moved on to Estimating with its lease kept.
pub async fn estimating(e: &Engine) -> lading_engine::JobLease {
    let l = take_job(e, JobState::Pending).await;
    let to = Event::To(JobState::Estimating);
    e.job_advance(l, to, None)
        .await
        .expect("Pending to Estimating")
}

/// A job with this configuration and the defaults for the rest.
pub fn spec(configuration: Map<String, Value>) -> JobSpec {
    JobSpec {
        configuration: configuration
            .try_into()
            .expect("a configuration of Lading's shape"),
        ..Default::default()
    }
}

/// A Pending batch with `n` jobs, moved to Processing (what batch intake does).
pub async fn batch_with_jobs(e: &Engine, n: usize, priorities: &[u8]) -> (BatchId, Vec<JobId>) {
    let mut sub = Map::new();
    sub.insert("profile_name".into(), json!("demo_profile"));
    sub.insert("submitter".into(), json!("tester"));
    sub.insert(
        "payload_url".into(),
        json!("http://127.0.0.1/manifest.checkm"),
    );
    let bid = e
        .create_batch(sub.try_into().unwrap())
        .await
        .expect("create batch");
    let lease = e
        .acquire_batch(BatchState::Pending)
        .await
        .expect("acquire")
        .expect("a pending batch");
    assert_eq!(lease.batch, bid);
    let mut jobs = Vec::new();
    for i in 0..n {
        let mut cfg = JobConfiguration {
            profile_name: Some("demo_profile".into()),
            ..Default::default()
        };
        cfg.extra
            .insert("local_id".into(), json!([format!("loc{i:03}")]));
        let spec = JobSpec {
            configuration: cfg,
            priority: priorities.get(i).copied(),
            ..Default::default()
        };
        jobs.push(e.create_job(&lease, spec).await.expect("create job"));
    }
    e.batch_transition(lease, Event::To(BatchState::Processing), None)
        .await
        .expect("to processing");
    (bid, jobs)
}

/// Drives one job from Pending through every stage to Completed, one lease per stage, as
/// independent stage workers would.
pub async fn run_job_to_completion(e: &Engine, state: JobState) -> Option<JobId> {
    let lease = e.acquire_job(state).await.expect("acquire")?;
    let id = lease.job.clone();
    let mut state = if state == JobState::Pending {
        e.job_transition(lease, Event::To(JobState::Estimating), None)
            .await
            .expect("start")
            .status
    } else {
        e.job_transition(lease, Event::Success, None)
            .await
            .expect("advance")
            .status
    };
    while state != JobState::Completed {
        let lease = e
            .acquire_job(state)
            .await
            .expect("acquire")
            .expect("job waiting in its next state");
        assert_eq!(lease.job, id);
        state = e
            .job_transition(lease, Event::Success, None)
            .await
            .expect("advance")
            .status;
    }
    Some(id)
}

/// A dump with the volatile parts (times, uuids, lock owners) replaced by placeholders.
pub async fn normalised_dump(tree: &dyn Tree) -> BTreeMap<String, Value> {
    let mut d = lading_engine::dump(tree, "/").await.expect("dump");
    for (path, v) in d.iter_mut() {
        if let Value::Object(m) = v {
            for k in ["last_modified", "submissionDate", "acquired"] {
                if m.contains_key(k) {
                    m.insert(k.into(), json!("<time>"));
                }
            }
            if m.contains_key("batchID") {
                m.insert("batchID".into(), json!("<uuid>"));
            }
            if m.contains_key("session") {
                m.insert("session".into(), json!("<session>"));
            }
            // The transitions Lading keeps in a status are checked by their own test
            // (`history_records_every_transition_with_its_time_and_host`); the layout is
            // compared without them.
            if m.contains_key("status") {
                m.remove(lading_engine::HISTORY_FIELD);
            }
        }
        let _ = path;
    }
    let uuids: Vec<String> = d
        .keys()
        .filter(|k| k.starts_with("/batch-uuids/"))
        .cloned()
        .collect();
    for k in uuids {
        let v = d.remove(&k).unwrap_or(Value::Null);
        d.insert("/batch-uuids/<uuid>".into(), v);
    }
    renumber_ids(d)
}

/// Sequential ids are the server's to choose (ZooKeeper numbers a child by its parent's change
/// count, so `/jobs/states` existing makes the first job `jid0000000001`). Renames the k-th
/// smallest id of each prefix to number k, keeping everything else byte for byte.
fn renumber_ids(d: BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    fn ids(s: &str, out: &mut std::collections::BTreeSet<String>) {
        for prefix in ["bid", "jid", "qid"] {
            let mut from = 0;
            while let Some(i) = s[from..].find(prefix) {
                let start = from + i;
                let digits = &s[start + 3..];
                if digits.len() >= 10 && digits.as_bytes()[..10].iter().all(u8::is_ascii_digit) {
                    out.insert(s[start..start + 13].to_string());
                }
                from = start + 3;
            }
        }
    }
    let mut found = std::collections::BTreeSet::new();
    for (k, v) in &d {
        ids(k, &mut found);
        ids(&v.to_string(), &mut found);
    }
    let mut rename = BTreeMap::new();
    let mut counters: BTreeMap<String, usize> = BTreeMap::new();
    for id in found {
        let n = counters.entry(id[..3].to_string()).or_default();
        rename.insert(id.clone(), format!("{}{:010}", &id[..3], n));
        *n += 1;
    }
    let fix = |s: &str| {
        let mut out = s.to_string();
        // Renaming goes through placeholders so that one rename never feeds another.
        for (i, old) in rename.keys().enumerate() {
            out = out.replace(old.as_str(), &format!("<id{i}>"));
        }
        for (i, new) in rename.values().enumerate() {
            out = out.replace(&format!("<id{i}>"), new);
        }
        out
    };
    d.into_iter()
        .map(|(k, v)| {
            let v: Value = serde_json::from_str(&fix(&v.to_string())).unwrap_or(v);
            (fix(&k), v)
        })
        .collect()
}

fn bytes(s: &str) -> Option<Vec<u8>> {
    Some(s.as_bytes().to_vec())
}

// ===== the tree contract =====================================================================

// ===== the engine ===========================================================================

/// The tree after `job_walks_the_pipeline_and_the_tree_matches_the_layout`, with volatile
/// values normalised: Merritt's layout, node for node.
pub const GOLDEN: &str = r#"{
  "/": null,
  "/access": null, "/access/large": null, "/access/small": null,
  "/batch-uuids": null, "/batch-uuids/<uuid>": "bid0000000000",
  "/batch-submitters": null, "/batch-submitters/tester": null,
  "/batch-submitters/tester/bid0000000000": null,
  "/batches": null,
  "/batches/bid0000000000": null,
  "/batches/bid0000000000/states": null,
  "/batches/bid0000000000/states/batch-completed": null,
  "/batches/bid0000000000/states/batch-completed/jid0000000000": null,
  "/batches/bid0000000000/states/batch-deleted": null,
  "/batches/bid0000000000/states/batch-failed": null,
  "/batches/bid0000000000/states/batch-failed/jid0000000001": null,
  "/batches/bid0000000000/states/batch-processing": null,
  "/batches/bid0000000000/status": {"status": "Reporting", "last_modified": "<time>", "message": ""},
  "/batches/bid0000000000/submission": {"batchID": "<uuid>", "payload_url": "http://127.0.0.1/manifest.checkm", "profile_name": "demo_profile", "submissionDate": "<time>", "submitter": "tester"},
  "/jobs": null,
  "/jobs/jid0000000000": null,
  "/jobs/jid0000000000/bid": "bid0000000000",
  "/jobs/jid0000000000/configuration": {"local_id": ["loc000"], "profile_name": "demo_profile"},
  "/jobs/jid0000000000/identifiers": {"primary_id": "", "local_id": []},
  "/jobs/jid0000000000/metadata": {},
  "/jobs/jid0000000000/priority": 5,
  "/jobs/jid0000000000/space_needed": 0,
  "/jobs/jid0000000000/status": {"status": "Completed", "last_successful_status": "Notify", "last_modified": "<time>", "retry_count": 0, "message": ""},
  "/jobs/jid0000000001": null,
  "/jobs/jid0000000001/bid": "bid0000000000",
  "/jobs/jid0000000001/configuration": {"local_id": ["loc001"], "profile_name": "demo_profile"},
  "/jobs/jid0000000001/identifiers": {"primary_id": "", "local_id": []},
  "/jobs/jid0000000001/metadata": {},
  "/jobs/jid0000000001/priority": 5,
  "/jobs/jid0000000001/space_needed": 0,
  "/jobs/jid0000000001/status": {"status": "Failed", "last_successful_status": "Provisioning", "last_modified": "<time>", "retry_count": 0, "message": "digest mismatch", "failed_stage": "Downloading", "failure_kind": "fatal", "failed_attempts": 1},
  "/jobs/states": null,
  "/jobs/states/completed/05-jid0000000000": null,
  "/jobs/states/failed/05-jid0000000001": null,
  "/locks": null, "/locks/collections": null, "/locks/inventory": null, "/locks/queue": null, "/locks/storage": null,
  "/outbox": null, "/reservations": null
}"#;

/// Instantiates every conformance test for a backend. `$make` is an expression that yields a
/// fresh `impl Harness` (a new, empty store) each time it is evaluated.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            tree_nodes_have_versions_and_sorted_children,
            tree_sequential_names_have_ten_digits_and_increase,
            tree_children_page_reads_the_head_in_order,
            multi_is_all_or_nothing,
            ephemeral_nodes_end_with_their_session,
            watches_fire_on_changes,
            change_feeds_see_every_writer,
            job_walks_the_pipeline_and_the_tree_matches_the_layout,
            merritt_transitions_change_exactly_the_documented_nodes,
            illegal_transition_is_refused_and_changes_nothing,
            unknown_ids_get_typed_errors,
            corrupt_node_is_named_and_nothing_changes,
            acquisition_follows_priority_then_age,
            set_priority_moves_the_reference,
            concurrent_workers_each_job_handed_to_exactly_one,
            acquiring_over_several_states_hands_each_job_out_once,
            lost_lease_cannot_commit_transition,
            moving_a_job_can_lock_the_next_in_the_same_multi,
            stale_lease_after_a_takeover_is_lost,
            a_worker_whose_session_expired_can_acquire_again,
            batch_reports_exactly_once_when_jobs_finish_concurrently,
            requeue_returns_a_failed_job_to_the_stage_that_failed,
            report_and_update_reporting,
            requeue_at_every_batch_state_reports_again,
            a_reporter_that_loses_its_batch_to_a_requeue_records_nothing,
            outbox_entries_are_claimed_once_retried_and_deleted_when_delivered,
            a_deliverer_looks_over_a_backlog_in_a_few_reads,
            an_idle_deliverer_is_woken_when_a_crashed_claim_goes_or_an_entry_comes,
            an_outbox_claim_is_read_under_its_lock_and_a_failed_record_still_releases_it,
            deleting_the_last_failed_job_says_an_update_report_is_due,
            a_job_of_a_batch_still_in_intake_is_not_purged,
            a_requeue_waits_while_intake_holds_the_batch_and_leaves_it_its_lease,
            a_job_moved_back_while_its_batchs_jobs_are_listed_is_still_listed,
            a_request_left_in_processing_by_a_dead_assembler_is_taken_again,
            a_transition_stamped_before_its_commits_second_is_owed_to_a_resuming_client,
            requeue_failed_retries_a_batchs_failed_jobs_by_stage,
            history_records_every_transition_with_its_time_and_host,
            concurrent_admissions_never_reserve_more_than_is_free,
            merritt_lazily_made_batch_folders_are_created_by_the_move,
            merritt_pending_scan_skips_a_held_batch,
            merritt_pending_scan_skips_a_batch_held_by_its_collection,
            merritt_failed_consumers_lock_on_a_held_batch_is_listed_and_cleared,
            merritt_deleting_completed_batches_leaves_no_dangling_index,
            merritt_last_successful_failed_still_requeues_to_the_stage_that_failed,
            deferred_job_is_not_taken_before_its_retry_time,
            held_collection_holds_batches_and_jobs_until_released,
            paused_queue_hands_out_nothing,
            batch_worker_is_woken_when_a_batch_needs_reporting,
            a_batch_waiter_is_woken_by_the_locks_of_its_own_state_only,
            waiting_worker_is_woken_by_new_work,
            admin_actions_respect_locks_and_the_table,
            duplicate_batch_uuid_is_refused,
            access_requests_move_through_their_states,
            a_corrupt_access_token_is_named_and_taken_to_be_failed,
            access_waiter_is_woken_by_a_request_still_being_made,
            merritt_access_requests_are_taken_in_order_not_skipped,
            ark_locks_are_exclusive_and_end_with_the_session,
            acquisition_cost_does_not_grow_with_the_queue,
            a_woken_waiter_sets_again_only_the_watch_that_fired,
            the_waiters_of_one_process_share_its_watches,
            a_waiter_refused_a_local_claim_is_woken_by_its_release_alone,
            a_claim_let_go_wakes_only_the_waiter_it_was_refused_to,
            a_look_at_a_short_folder_lists_it_once,
            a_waiting_batch_worker_reads_a_status_again_only_once_it_changed,
            generic_jobs_walk_their_states_in_their_own_subtree,
            generic_jobs_racing_acceptors_hold_each_job_alone,
            generic_jobs_finish_then_accept_claims_the_next_job,
            generic_jobs_stale_processor_is_fenced,
            generic_jobs_scheduled_later_are_not_accepted_early,
            generic_jobs_resubmit_while_running_runs_again,
            generic_jobs_removed_while_running_halt_the_processor,
            generic_jobs_activity_monitor_requeues_a_stalled_job_once,
            generic_jobs_subscribers_see_each_state_change,
            generic_jobs_unused_subscriptions_expire,
            generic_jobs_waiting_acceptor_is_woken_by_an_add,
            generic_jobs_waiting_acceptors_share_out_a_burst,
            generic_jobs_errors_are_retried_then_failed_and_retried_by_an_admin,
            generic_jobs_run_by_priority_then_due_time,
            generic_jobs_schedule_adds_one_job_per_tick_however_many_monitors_race,
            generic_jobs_rate_limit_holds_across_processors,
            generic_jobs_rate_limit_holds_for_a_processor_whose_clock_is_behind,
            generic_jobs_retention_removes_old_finished_and_failed_jobs,
            generic_jobs_monitor_reads_a_type_once_a_pass_and_ended_jobs_now_and_then,
            generic_jobs_batched_accept_never_hands_one_job_to_two,
            generic_jobs_subscribers_see_every_transition_in_order,
        );
    };
    (@each $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness = $make;
                $crate::$name(&harness).await;
            }
        )*
    };
}

#[cfg(test)]
mod registration {
    /// Every suite test (a `pub async fn NAME(h: &dyn Harness)` in this crate) is named in
    /// `conformance_tests!`, so a backend running the macro runs all of them: a test added
    /// and not registered fails here, not silently.
    #[test]
    fn every_suite_test_is_registered() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let lib = std::fs::read_to_string(dir.join("lib.rs")).unwrap();
        let listed = &lib[lib.find("macro_rules! conformance_tests").unwrap()..];
        let mut found = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            let mut rest = text.as_str();
            while let Some(i) = rest.find("\npub async fn ") {
                rest = &rest[i + "\npub async fn ".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                let sig = &rest[..rest.find('{').unwrap_or(rest.len())];
                if sig.contains("&dyn Harness") && !sig.contains("->") {
                    found += 1;
                    assert!(
                        listed.contains(&format!("{name},")),
                        "suite test {name} is not in conformance_tests!"
                    );
                }
            }
        }
        assert!(found > 40, "only {found} suite tests found");
    }
}
