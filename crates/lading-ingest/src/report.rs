//! Reporting and UpdateReporting: the batch's `status-report`, and a summary mailed to the
//! depositor over SMTP when the profile lists addresses.

use crate::Ingest;
use lading_core::BatchState;
use lading_core::layout::{JobId, StatusReport};
use lading_core::tree::BoxFuture;
use lading_worker::{BatchCtx, BatchStage, Outcome};
use serde_json::{Value, json};
use std::sync::Arc;

/// The batch stage of `Reporting` or `UpdateReporting` (whichever state it is given).
pub struct Report(pub Arc<Ingest>, pub BatchState);

impl BatchStage for Report {
    fn state(&self) -> BatchState {
        self.1
    }
    fn run(&self, b: Arc<BatchCtx>) -> BoxFuture<'static, Outcome> {
        let ingest = self.0.clone();
        let update = self.1 == BatchState::UpdateReporting;
        Box::pin(async move { report(&ingest, &b, update).await.unwrap_or_else(|o| o) })
    }
}

async fn report(ingest: &Ingest, b: &BatchCtx, update: bool) -> Result<Outcome, Outcome> {
    let mut report = b.engine.build_report(b.batch()).await?;
    if update {
        // What an admin fixed since the last report: jobs failed then, completed now.
        let before: Vec<String> = b
            .info
            .status_report
            .as_ref()
            .map(|r| r.failed_jobs.clone())
            .unwrap_or_default();
        let fixed: Vec<&String> = report
            .completed_jobs
            .iter()
            .filter(|j| before.contains(j))
            .collect();
        report.extra.insert("updated_jobs".into(), json!(fixed));
    }
    // The report's number: 1 for the first, one more for each update report. A report written
    // in this same stay in the state (a retry after a crash) keeps its number, so a mail sent
    // again carries the same Message-ID.
    // A stay is told by the state and the time the batch entered it (to the second: two
    // update reports asked for within one second would share a number).
    let episode = format!("{}@{}", b.info.status.status, b.info.status.last_modified);
    let number = match b.info.status_report.as_ref() {
        _ if !update => 1,
        Some(prev) => {
            let n = prev
                .extra
                .get("report_number")
                .and_then(Value::as_u64)
                .unwrap_or(1);
            if prev.extra.get("report_episode").and_then(Value::as_str) == Some(&episode) {
                n
            } else {
                n + 1
            }
        }
        None => 2,
    };
    report.extra.insert("report_number".into(), json!(number));
    report.extra.insert("report_episode".into(), json!(episode));
    b.write_status_report(&report).await?;
    let profile = match ingest.profile(b.submission_str("profile_name").unwrap_or_default()) {
        Ok(p) => p,
        // The profile was removed since submission: the report is written, nobody to mail.
        Err(e) => {
            tracing::warn!(batch = %b.batch(), error = %e, "no profile; report not mailed");
            return Ok(verdict(&report));
        }
    };
    if profile.notification.is_empty() {
        return Ok(verdict(&report));
    }
    let Some(host) = ingest.cfg.smtp_host.clone() else {
        tracing::warn!(batch = %b.batch(), "the profile lists addresses but no smtp_host is configured; report not mailed");
        return Ok(verdict(&report));
    };
    let (subject, body) = summary(b, &report, update).await?;
    // Stable for every attempt at sending this report: a repeat after a crash can be
    // recognised (delivery is at least once).
    let message_id = format!(
        "<lading.{}.report-{number}@{}>",
        b.submission_str("batchID").unwrap_or(b.batch().as_str()),
        ingest
            .cfg
            .mail_from
            .rsplit('@')
            .next()
            .filter(|d| !d.is_empty())
            .unwrap_or("lading")
    );
    send_mail(
        &host,
        ingest.cfg.smtp_port,
        &ingest.cfg.mail_from,
        &profile.notification,
        &subject,
        body,
        Some(message_id),
    )
    .await?;
    Ok(verdict(&report))
}

/// A batch with failed jobs ends Failed (an admin may fix them and ask for an update
/// report); one without ends Completed.
fn verdict(report: &StatusReport) -> Outcome {
    if report.failed_jobs.is_empty() {
        Outcome::Done
    } else {
        Outcome::Fatal(format!(
            "{} of {} jobs failed",
            report.failed_jobs.len(),
            report.failed_jobs.len() + report.completed_jobs.len()
        ))
    }
}

async fn summary(
    b: &BatchCtx,
    report: &StatusReport,
    update: bool,
) -> Result<(String, String), Outcome> {
    let bid = b.batch();
    let subject = format!(
        "Lading batch {bid}{}: {} completed, {} failed",
        if update { " (update)" } else { "" },
        report.completed_jobs.len(),
        report.failed_jobs.len()
    );
    let mut body = format!(
        "Batch {bid} ({}) from {}\nPayload: {}\n\n",
        b.submission_str("profile_name").unwrap_or_default(),
        b.submission_str("submitter").unwrap_or_default(),
        b.submission_str("payload_url").unwrap_or_default(),
    );
    if let Some(Value::Array(fixed)) = report.extra.get("updated_jobs") {
        body.push_str(&format!("Fixed since the last report: {}\n\n", fixed.len()));
    }
    body.push_str(&format!("Completed ({}):\n", report.completed_jobs.len()));
    for j in &report.completed_jobs {
        let info = b
            .engine
            .job(&JobId::parse(j).map_err(Outcome::fatal)?)
            .await?;
        let ark = info
            .identifiers
            .get("primary_id")
            .and_then(Value::as_str)
            .unwrap_or("-");
        body.push_str(&format!("  {j}  {ark}\n"));
    }
    body.push_str(&format!("\nFailed ({}):\n", report.failed_jobs.len()));
    for j in &report.failed_jobs {
        let info = b
            .engine
            .job(&JobId::parse(j).map_err(Outcome::fatal)?)
            .await?;
        // The stage that failed (recorded at the failure; before that was kept, the stage
        // after the last one that succeeded).
        let stage = lading_engine::failed_stage(&info.status)
            .map(str::to_string)
            .unwrap_or_else(|| {
                info.status
                    .last_successful_status
                    .map_or("Pending".to_string(), |s| s.to_string())
            });
        let kind = lading_engine::failure_kind(&info.status).unwrap_or("fatal");
        body.push_str(&format!(
            "  {j}  {stage} ({kind}): {}\n",
            info.status.message.clone().unwrap_or_default()
        ));
    }
    Ok((subject, body))
}

/// Sends one plain-text message over SMTP (no TLS: a local relay is the usual peer).
pub async fn send_mail(
    host: &str,
    port: u16,
    from: &str,
    to: &[String],
    subject: &str,
    body: String,
    message_id: Option<String>,
) -> Result<(), Outcome> {
    use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
    let from = from
        .parse()
        .map_err(|e| Outcome::fatal(format!("mail_from {from:?}: {e}")))?;
    let mut m = Message::builder()
        .from(from)
        .subject(subject)
        .message_id(message_id);
    for addr in to {
        m = m.to(addr
            .parse()
            .map_err(|e| Outcome::fatal(format!("notification address {addr:?}: {e}")))?);
    }
    let msg = m
        .body(body)
        .map_err(|e| Outcome::fatal(format!("building the message: {e}")))?;
    let transport = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host)
        .port(port)
        .timeout(Some(std::time::Duration::from_secs(30)))
        .build();
    transport
        .send(msg)
        .await
        .map_err(|e| Outcome::Transient(format!("mail to {}: {e}", to.join(", "))))?;
    Ok(())
}
