//! Reporting in bad moments: a batch a crash left in Processing is reported once reporting
//! starts, and a job deleted while its batch reports does not fail the report.

#[macro_use]
mod common;

use common::*;
use lading_core::{BatchState, JobState};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_left_in_processing_by_a_crash_is_reported_when_reporting_starts() {
    let w = World::new().await;
    let (ingest, bid) = w
        .submit_object(&[("f.txt", b"done before the crash")])
        .await;
    // Everything but reporting: the batch reaches Reporting and waits there.
    let stages = all_but_reporting();
    let run = w.run_stages(&ingest, &stages);
    w.batch_reaches(&bid, &[BatchState::Reporting]).await;
    run.stop().await;
    // Put the batch back in Processing, as a worker that died between the job's last move and
    // the batch's would have left it.
    let path = lading_core::layout::batch_node(&bid, "status");
    let node = w.engine.tree().get(&path).await.unwrap().unwrap();
    let mut status: serde_json::Value = serde_json::from_slice(&node.data.unwrap()).unwrap();
    status["status"] = "Processing".into();
    w.engine
        .tree()
        .set(
            &path,
            Some(serde_json::to_vec(&status).unwrap()),
            Some(node.stat.version),
        )
        .await
        .unwrap();
    w.runs_to_completion(&ingest, &bid).await;
}

/// Every stage but the two that report: a batch reaches Reporting and waits there.
fn all_but_reporting() -> Vec<&'static str> {
    lading_ingest::STAGE_NAMES
        .iter()
        .copied()
        .filter(|s| !s.contains("reporting"))
        .collect()
}

/// A job deleted while its batch reports (found by the simulator): the report stage read the
/// batch's list, then each listed job, and the deleted one failed the whole batch with "no
/// such job" and no report. The moment between the two reads is held open here by a listed
/// job whose record is gone; the batch must still report, and its mail say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_deleted_while_its_batch_reports_does_not_fail_the_report() {
    let w = World::new().await;
    let (ingest, bid) = w.submit_object(&[("f.txt", b"kept")]).await;
    let stages = all_but_reporting();
    let run = w.run_stages(&ingest, &stages);
    w.batch_reaches(&bid, &[BatchState::Reporting]).await;
    run.stop().await;
    let kept = w.jobs_of(&bid).await[0].clone();
    // A job being deleted: its record is gone, its entry in the batch's list not yet.
    let ghost = lading_core::layout::JobId::parse("jid9999999999").unwrap();
    let entry = lading_core::layout::batch_ref(&bid, "batch-completed", &ghost);
    w.engine
        .tree()
        .create(&entry, None, lading_core::tree::CreateMode::Persistent)
        .await
        .unwrap();
    let run = w.run_all(&ingest);
    let end = w.batch_ends(&bid).await;
    run.stop().await;
    assert_eq!(
        end,
        BatchState::Completed,
        "{}",
        w.batch_message(&bid).await
    );
    let report = w.engine.batch(&bid).await.unwrap().status_report.unwrap();
    assert!(
        report.completed_jobs.contains(&kept.to_string()),
        "{report:?}"
    );
    let mail = w.smtp.next().await;
    assert!(mail.contains("2 completed, 0 failed"), "{mail}");
    assert!(
        mail.contains(&format!("{ghost}  (deleted since)")),
        "{mail}"
    );
    assert!(mail.contains(kept.as_str()), "{mail}");
    // Nothing else was touched: the kept job is still Completed.
    let st = w.engine.job(&kept).await.unwrap().status;
    assert_eq!(st.status, JobState::Completed);
}
