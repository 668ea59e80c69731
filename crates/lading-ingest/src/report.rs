//! Reporting and UpdateReporting: the batch's `status-report`, and a summary mailed to the
//! depositor over SMTP when the profile lists addresses.

use crate::Ingest;
use lading_core::BatchState;
use lading_core::layout::{JobId, StatusReport};
use lading_core::tree::BoxFuture;
use lading_engine::Effect;
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
    let prev = b.info.status_report.as_ref();
    // A reopened batch waits until its requeues have settled: an operator requeueing jobs
    // one by one gives one update, not one per requeue. A requeue meanwhile reopens the batch
    // again (this lease is then lost, and the next report waits anew).
    if prev.is_some() {
        let requeued = (b.leased_status().await.extra)
            .get(lading_engine::REQUEUED_AT)
            .and_then(Value::as_u64);
        let until = requeued.map(|at| at + ingest.cfg.report_settle_s * 1000);
        let now = b.engine.clock().now_ms();
        if let Some(until) = until.filter(|u| *u > now) {
            return Ok(Outcome::Wait {
                after: std::time::Duration::from_millis(until - now),
                reason: format!(
                    "reopened by a requeue: reporting once no requeue has come for {} s (report_settle_s)",
                    ingest.cfg.report_settle_s
                ),
            });
        }
    }
    let mut report = b.engine.build_report(b.batch()).await?;
    if let Some(prev) = prev {
        // What was fixed since the last report: jobs failed then, completed now.
        let fixed: Vec<&String> = report
            .completed_jobs
            .iter()
            .filter(|j| prev.failed_jobs.contains(j))
            .collect();
        report.extra.insert("updated_jobs".into(), json!(fixed));
    }
    // The report's number: 1 for the first, one more for each later one. A report is written
    // only in the move that ends this stage (one `multi`), so a retry after a crash or a lost
    // lease computes the same number again, and its mail the same Message-ID.
    let number = match prev {
        None => 1,
        Some(p) => {
            p.extra
                .get("report_number")
                .and_then(Value::as_u64)
                .unwrap_or(1)
                + 1
        }
    };
    let update = update || number > 1;
    report.extra.insert("report_number".into(), json!(number));
    let deleted = b.info.jobs.get("batch-deleted").map_or(0, Vec::len);
    let outcome = verdict(&report, deleted);
    let mut effects = Vec::new();
    if let Some(to) = recipients(ingest, b)? {
        let (subject, body) = summary(b, &report, update).await?;
        effects.push(mail(ingest, b, number, to, subject, body)?);
    }
    // Written, and the mail recorded in the outbox, with the batch's move to Completed or
    // Failed: all or nothing.
    b.set_report(report, effects).await;
    Ok(outcome)
}

/// Who the batch's reports go to: the addresses its profile lists, when there is a relay to
/// send through; none otherwise (a warning names why, when it is not by choice).
fn recipients(ingest: &Ingest, b: &BatchCtx) -> Result<Option<Vec<String>>, Outcome> {
    let sub = b.submission()?;
    Ok(match ingest.profile(sub.profile().unwrap_or_default()) {
        // The profile was removed since submission: the report is written, nobody to mail.
        Err(e) => {
            tracing::warn!(batch = %b.batch(), error = %e, "no profile; report not mailed");
            None
        }
        Ok(p) if p.notification.is_empty() => None,
        Ok(_) if ingest.cfg.smtp_host.is_none() => {
            tracing::warn!(batch = %b.batch(),
                "the profile lists addresses but no smtp_host is configured; report not mailed");
            None
        }
        Ok(profile) => Some(profile.notification),
    })
}

/// Report `number` of the batch as a mail to `to`, for the outbox. Its Message-ID is stable
/// for every attempt at sending this report: a repeat after a crash can be recognised
/// (delivery is at least once).
fn mail(
    ingest: &Ingest,
    b: &BatchCtx,
    number: u64,
    to: Vec<String>,
    subject: String,
    body: String,
) -> Result<Effect, Outcome> {
    let sub = b.submission()?;
    let message_id = format!(
        "<lading.{}.report-{number}@{}>",
        sub.merritt_batch_id().unwrap_or(b.batch().as_str()),
        ingest
            .cfg
            .mail_from
            .rsplit('@')
            .next()
            .filter(|d| !d.is_empty())
            .unwrap_or("lading")
    );
    Ok(Effect {
        kind: lading_engine::EffectKind::Mail,
        key: message_id.clone(),
        batch: Some(b.batch().clone()),
        job: None,
        payload: json!({
            "to": to,
            "subject": subject,
            // The payload line and the failures quote URLs: without their passwords.
            "body": lading_core::text::without_passwords(&body),
            "message_id": message_id,
        }),
    })
}

/// The report of a batch that failed before it had jobs (its intake gave up: a payload that
/// cannot be read or parsed): report 1, no jobs, the reason; mailed as any report is, so the
/// depositor hears of it.
pub async fn intake_failure(
    ingest: &Ingest,
    b: &BatchCtx,
    reason: &str,
) -> Option<(StatusReport, Vec<Effect>)> {
    let mut report = StatusReport {
        last_modified: lading_core::time::format_ts(b.engine.clock().now_ms()),
        ..Default::default()
    };
    report.extra.insert("report_number".into(), json!(1));
    report.extra.insert("intake_error".into(), json!(reason));
    let mut effects = Vec::new();
    if let Ok(Some(to)) = recipients(ingest, b) {
        let named = b
            .submission()
            .ok()
            .and_then(|s| s.merritt_batch_id())
            .unwrap_or(b.batch().as_str())
            .to_string();
        let subject = format!("Lading batch {named}: failed, no objects ingested");
        let body = format!(
            "Batch {named} ({}) failed before any object was ingested:\n\n{reason}\n\n\
             Nothing was stored. Correct the payload and submit it again.\n",
            b.batch()
        );
        if let Ok(m) = mail(ingest, b, 1, to, subject, body) {
            effects.push(m);
        }
    }
    Some((report, effects))
}

/// A batch with failed jobs ends Failed (an admin may fix them and ask for an update
/// report); one without ends Completed.
fn verdict(report: &StatusReport, deleted: usize) -> Outcome {
    if report.failed_jobs.is_empty() {
        Outcome::Done
    } else {
        Outcome::Fatal(lading_engine::batch_summary(
            report.completed_jobs.len(),
            report.failed_jobs.len(),
            deleted,
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
    let sub = b.submission()?;
    let mut body = format!(
        "Batch {bid} ({}) from {}\nPayload: {}\n\n",
        sub.profile().unwrap_or_default(),
        sub.submitter.as_deref().unwrap_or_default(),
        sub.payload_url.as_deref().unwrap_or_default(),
    );
    if let Some(Value::Array(fixed)) = report.extra.get("updated_jobs") {
        body.push_str(&format!("Fixed since the last report: {}\n\n", fixed.len()));
    }
    body.push_str(&format!("Completed ({}):\n", report.completed_jobs.len()));
    for j in &report.completed_jobs {
        let Some(info) = listed_job(b, j).await? else {
            body.push_str(&format!("  {j}  (deleted since)\n"));
            continue;
        };
        let ark = info.identifiers.primary_id.as_deref().unwrap_or("-");
        body.push_str(&format!("  {j}  {ark}\n"));
    }
    body.push_str(&format!("\nFailed ({}):\n", report.failed_jobs.len()));
    for j in &report.failed_jobs {
        let Some(info) = listed_job(b, j).await? else {
            body.push_str(&format!("  {j}  (deleted since)\n"));
            continue;
        };
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

/// A job the report lists; `None` when it was deleted since the batch's list was read (an
/// admin's delete while the batch reports), which the mail says rather than the batch ending
/// Failed with no report.
async fn listed_job(b: &BatchCtx, j: &str) -> Result<Option<lading_engine::JobInfo>, Outcome> {
    match b
        .engine
        .job(&JobId::parse(j).map_err(Outcome::fatal)?)
        .await
    {
        Ok(info) => Ok(Some(info)),
        Err(lading_engine::EngineError::NoJob(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// How long one mail's SMTP conversation may take, from the connection to the last answer.
const SMTP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Sends one plain-text message over SMTP to `host:port` (no TLS: a local relay is the usual
/// peer).
/// A server that cannot be reached is `Unavailable` (SPEC §11): the mail waits for it.
pub async fn send_mail(host: &str, port: u16, mail: &FormattedMail) -> Result<(), Outcome> {
    let down = |cause: String| {
        tracing::warn!(smtp = %format!("{host}:{port}"), %cause, "SMTP server unavailable");
        Outcome::Unavailable {
            dependency: lading_engine::deps::Dependency::new(
                "smtp",
                host,
                format!("{host}:{port}"),
            ),
            cause,
        }
    };
    let stream = tokio::time::timeout(SMTP_TIMEOUT, tokio::net::TcpStream::connect((host, port)))
        .await
        .map_err(|_| down(format!("no connection within {SMTP_TIMEOUT:?}")))?
        .map_err(|e| {
            down(
                crate::weather::io_cause(&e)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("cannot connect: {e}")),
            )
        })?;
    send_formatted(Box::new(stream), mail).await
}

/// A mail ready to send: its envelope and its text (headers and body).
pub struct FormattedMail {
    pub envelope: lettre::address::Envelope,
    pub text: Vec<u8>,
}

impl FormattedMail {
    /// A transient failure to send this mail, naming its recipients.
    fn failed(&self, why: String) -> Outcome {
        let to: Vec<String> = self.envelope.to().iter().map(|a| a.to_string()).collect();
        Outcome::Transient(format!("mail to {}: {why}", to.join(", ")))
    }
}

/// One plain-text message from `from` to `to`, with `message_id` (a stable one lets a
/// receiver drop a repeat).
pub fn format_mail(
    from: &str,
    to: &[String],
    subject: &str,
    body: String,
    message_id: Option<String>,
) -> Result<FormattedMail, Outcome> {
    use lettre::Message;
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
    Ok(FormattedMail {
        envelope: msg.envelope().clone(),
        text: msg.formatted(),
    })
}

/// Sends `mail` over `stream`, a connection to an SMTP server (TCP, or the simulator's
/// pipe): greeting, EHLO, MAIL, RCPT, DATA and QUIT, within `SMTP_TIMEOUT`.
pub async fn send_formatted(
    stream: Box<dyn lettre::transport::smtp::client::AsyncTokioStream>,
    mail: &FormattedMail,
) -> Result<(), Outcome> {
    use lettre::transport::smtp::client::AsyncSmtpConnection;
    use lettre::transport::smtp::extension::ClientId;
    let talk = async {
        let mut conn = AsyncSmtpConnection::connect_with_transport(stream, &ClientId::default())
            .await
            .map_err(|e| mail.failed(e.to_string()))?;
        conn.send(&mail.envelope, &mail.text)
            .await
            .map_err(|e| mail.failed(e.to_string()))?;
        // Sent once the server said so: a lost goodbye changes nothing.
        let _ = conn.quit().await;
        Ok(())
    };
    tokio::time::timeout(SMTP_TIMEOUT, talk)
        .await
        .map_err(|_| mail.failed(format!("no answer within {SMTP_TIMEOUT:?}")))?
}
