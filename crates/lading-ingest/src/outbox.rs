//! Delivers the outbox (see `lading_engine::Effect`): report mails over SMTP and callbacks
//! over HTTP, after the moves that recorded them committed.
//!
//! Delivery is at least once, with a key: a process killed inside a send leaves the entry
//! for the next deliverer, which sends it again with the same key (a mail's `Message-ID`, a
//! callback's `Idempotency-Key` header and `idempotency_key` field). An entry recorded as
//! delivered is never sent again. Failed deliveries are retried with the `[stages.outbox]`
//! backoff; after its `max_attempts` (or at once, for an error no retry can fix) an entry is
//! kept as dead for an admin (`lading admin outbox`).

use crate::Ingest;
use lading_core::BoxFuture;
use lading_engine::{Effect, EffectKind, OutboxClaim};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// The effect kinds this deliverer knows.
pub const KINDS: &[EffectKind] = &[
    EffectKind::Mail,
    EffectKind::Callback,
    EffectKind::Replicate,
];

/// How long one replica copy may take before it is tried again.
const REPLICATE_TIMEOUT: Duration = Duration::from_secs(3600);

/// How a delivery failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Worth another try later.
    Retry(String),
    /// No retry will help (a malformed address): kept as dead at once.
    Never(String),
    /// The service it goes to is down (SPEC §11): tried again once it may be back, using no
    /// attempt.
    Unavailable {
        dependency: lading_engine::deps::Dependency,
        cause: String,
    },
}

/// Delivers due entries until `stop` resolves; deliveries in flight then finish (each is
/// bounded by the outbox timeout).
pub async fn run(ingest: Arc<Ingest>, shutdown: lading_worker::Shutdown) {
    let stop = shutdown.into_stopped();
    let cfg = ingest.cfg.outbox();
    let slots = Arc::new(tokio::sync::Semaphore::new(cfg.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        while tasks.try_join_next().is_some() {}
        let permit = tokio::select! {
            // In order, not at random: a run is the same every time (`lading-sim`).
            biased;
            p = slots.clone().acquire_owned() => p.expect("never closed"),
            _ = &mut stop => break,
        };
        // Armed before the look, so an entry made during it wakes the wait below.
        let armed = ingest.engine.arm_outbox().await;
        let wait = match ingest.engine.claim_effect(KINDS).await {
            Ok(Ok(claim)) => {
                let i = ingest.clone();
                tasks.spawn(async move {
                    deliver(&i, claim).await;
                    drop(permit);
                });
                continue;
            }
            Ok(Err(next_due)) => {
                let now = ingest.engine.clock().now_ms();
                // The watch wakes us on any new entry; a retry time needs the clock. A look
                // every three sweeps at most (30 s in a real process) is the safety net.
                let most = ingest.engine.sweep() * 3;
                next_due.map_or(most, |t| {
                    Duration::from_millis(t.saturating_sub(now)).min(most)
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the outbox");
                Duration::from_secs(1)
            }
        };
        drop(permit);
        tokio::select! {
            // In order, not at random: a run is the same every time (`lading-sim`).
            biased;
            _ = async {
                match armed {
                    Ok(armed) => {
                        if let Err(e) = ingest.engine.wait_outbox(armed, wait).await {
                            tracing::warn!(error = %e, "cannot watch the outbox");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot watch the outbox");
                        tokio::time::sleep(wait.min(Duration::from_secs(1))).await;
                    }
                }
            } => {}
            // Entries this process gave back (or a delivery that ended) may be due now.
            _ = tasks.join_next(), if !tasks.is_empty() => {}
            _ = &mut stop => break,
        }
    }
    while tasks.join_next().await.is_some() {}
}

async fn deliver(ingest: &Ingest, claim: OutboxClaim) {
    let cfg = ingest.cfg.outbox();
    let e = &claim.entry.effect;
    let limit = if e.kind == EffectKind::Replicate {
        REPLICATE_TIMEOUT
    } else {
        cfg.timeout
    };
    let r = match tokio::time::timeout(limit, send(ingest, e)).await {
        Ok(r) => r,
        Err(_) => Err(Failure::Retry(format!(
            "timed out after {} s",
            limit.as_secs()
        ))),
    };
    let (kind, key, attempts) = (e.kind.clone(), e.key.clone(), claim.entry.attempts + 1);
    // A callback's error quotes its URL, which may carry a password: not logged or recorded.
    let r = r.map_err(|f| match f {
        Failure::Retry(m) => Failure::Retry(lading_core::text::without_passwords(&m).into()),
        Failure::Never(m) => Failure::Never(lading_core::text::without_passwords(&m).into()),
        Failure::Unavailable { dependency, cause } => Failure::Unavailable {
            dependency,
            cause: lading_core::text::without_passwords(&cause).into(),
        },
    });
    let recorded = match r {
        Ok(()) => {
            tracing::info!(%kind, %key, attempts, "delivered");
            ingest.engine.effect_done(claim).await
        }
        Err(Failure::Unavailable { dependency, cause }) => {
            // No attempt used: tried again when the dependency may be back.
            let now = ingest.engine.clock().now_ms();
            let (since, start) = ingest.engine.deps().down(&dependency, &cause, now);
            if start {
                lading_worker::deps::spawn_prober(ingest.engine.clone(), dependency.clone());
            }
            let settings = ingest.engine.deps().settings();
            let why = format!("waiting: {} unavailable: {cause}", dependency.label());
            if settings.waited_too_long(&dependency, since, now) {
                let why = lading_worker::deps::gave_up(&dependency, &cause, since, &settings);
                tracing::error!(%kind, %key, error = %why, "delivery given up");
                ingest.engine.effect_failed(claim, &why, None).await
            } else {
                tracing::info!(%kind, %key, dependency = %dependency.label(), %cause,
                    "delivery waits for a dependency");
                let at = now + settings.probe_max.as_millis() as u64;
                ingest.engine.effect_waits(claim, &why, at).await
            }
        }
        Err(Failure::Retry(why)) if attempts < cfg.max_attempts => {
            let delay = cfg.backoff(attempts, ingest.engine.random().unit());
            tracing::warn!(%kind, %key, attempts, error = %why,
                "delivery failed; again in {:.1} s", delay.as_secs_f64());
            let at = ingest.engine.clock().now_ms() + delay.as_millis() as u64;
            ingest.engine.effect_failed(claim, &why, Some(at)).await
        }
        Err(Failure::Retry(why)) | Err(Failure::Never(why)) => {
            tracing::error!(%kind, %key, attempts, error = %why,
                "delivery given up; kept in the outbox for an admin");
            ingest.engine.effect_failed(claim, &why, None).await
        }
    };
    if let Err(err) = recorded {
        // The entry stays (its lock goes with this session): it is sent again, same key.
        tracing::warn!(%kind, %key, error = %err, "cannot record the delivery");
    }
}

/// Carries mails and callbacks out of the process. [`Wire`] is SMTP and HTTP; the
/// simulator brings a world of its own, which loses, repeats and delays deliveries.
pub trait Courier: Send + Sync {
    /// Delivers `e` (a `mail` or a `callback`), with its key, once.
    fn carry<'a>(&'a self, ingest: &'a Ingest, e: &'a Effect)
    -> BoxFuture<'a, Result<(), Failure>>;
}

/// Mails over SMTP (`smtp_host`), callbacks as HTTP POSTs with an `Idempotency-Key`.
pub struct Wire;

impl Courier for Wire {
    fn carry<'a>(
        &'a self,
        ingest: &'a Ingest,
        e: &'a Effect,
    ) -> BoxFuture<'a, Result<(), Failure>> {
        Box::pin(wire(ingest, e))
    }
}

/// What a mail's failure to go out means for its entry.
fn mail_failure(o: lading_worker::Outcome) -> Failure {
    match o {
        lading_worker::Outcome::Fatal(m) => Failure::Never(m),
        lading_worker::Outcome::Transient(m) | lading_worker::Outcome::Wait { reason: m, .. } => {
            Failure::Retry(m)
        }
        lading_worker::Outcome::Unavailable { dependency, cause } => {
            Failure::Unavailable { dependency, cause }
        }
        lading_worker::Outcome::Done => Failure::Retry("no answer".into()),
    }
}

/// The mail an effect of kind `mail` asks for, formatted from Lading's `mail_from`, with the
/// effect's key as its Message-ID.
pub fn mail_of(ingest: &Ingest, e: &Effect) -> Result<crate::report::FormattedMail, Failure> {
    let p = &e.payload;
    let s = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or_default();
    let to: Vec<String> = p
        .get("to")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    crate::report::format_mail(
        &ingest.cfg.mail_from,
        &to,
        s("subject"),
        s("body").to_string(),
        Some(e.key.clone()),
    )
    .map_err(mail_failure)
}

/// Sends a mail effect over `stream`, a connection to an SMTP server.
pub async fn mail_over(
    ingest: &Ingest,
    e: &Effect,
    stream: Box<dyn lettre::transport::smtp::client::AsyncTokioStream>,
) -> Result<(), Failure> {
    crate::report::send_formatted(stream, &mail_of(ingest, e)?)
        .await
        .map_err(mail_failure)
}

/// The POST a callback effect asks for: to its `url`, its `body` as JSON, with the effect's
/// key as the `Idempotency-Key` header (the body's `idempotency_key` says it too). The wire
/// sends it with the operator's client; the simulator over a pipe to its receiver.
#[derive(Debug, Clone)]
pub struct CallbackPost {
    pub url: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

/// The POST of a callback effect.
pub fn callback_of(e: &Effect) -> Result<CallbackPost, Failure> {
    let url = e
        .payload
        .get("url")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
        .ok_or_else(|| Failure::Never("the callback names no url".into()))?;
    let body = serde_json::to_vec(e.payload.get("body").unwrap_or(&Value::Null))
        .map_err(|err| Failure::Never(format!("the callback's body: {err}")))?;
    Ok(CallbackPost {
        url: url.to_string(),
        headers: vec![
            ("content-type", "application/json".to_string()),
            ("idempotency-key", e.key.clone()),
        ],
        body,
    })
}

/// A callback that got no answer from `url`.
pub fn callback_unsent(url: &str, err: impl std::fmt::Display) -> Failure {
    Failure::Retry(format!("callback {url}: {err}"))
}

/// A callback receiver's host as a dependency.
pub fn callback_dependency(url: &str) -> lading_engine::deps::Dependency {
    lading_engine::deps::Dependency::new(
        "callback",
        crate::weather::host_of(url),
        lading_core::text::without_passwords(url).into_owned(),
    )
}

/// What the receiver's answer (its HTTP status) means: delivered on a 2xx; the receiver
/// unavailable on a 5xx, 408 or 429 (waited for, using no attempt); tried again later on
/// anything else.
pub fn callback_answer(url: &str, status: u16) -> Result<(), Failure> {
    if (200..300).contains(&status) {
        Ok(())
    } else if status >= 500 || status == 408 || status == 429 {
        Err(Failure::Unavailable {
            dependency: callback_dependency(url),
            cause: format!("answered {status}"),
        })
    } else {
        Err(Failure::Retry(format!("callback {url} answered {status}")))
    }
}

async fn wire(ingest: &Ingest, e: &Effect) -> Result<(), Failure> {
    match &e.kind {
        EffectKind::Mail => {
            let Some(host) = ingest.cfg.smtp_host.as_deref() else {
                return Err(Failure::Retry("no smtp_host is configured".into()));
            };
            crate::report::send_mail(host, ingest.cfg.smtp_port, &mail_of(ingest, e)?)
                .await
                .map_err(mail_failure)
        }
        EffectKind::Callback => {
            let post = callback_of(e)?;
            let mut req = ingest.fetcher.client().post(&post.url);
            for (name, value) in &post.headers {
                req = req.header(*name, value);
            }
            let r =
                req.body(post.body).send().await.map_err(
                    |err| match crate::weather::reqwest_cause(&err) {
                        Some(cause) => Failure::Unavailable {
                            dependency: callback_dependency(&post.url),
                            cause,
                        },
                        None => callback_unsent(&post.url, err),
                    },
                )?;
            callback_answer(&post.url, r.status().as_u16())
        }
        other => Err(Failure::Never(format!(
            "{:?} is not carried by the wire",
            other.as_str()
        ))),
    }
}

async fn send(ingest: &Ingest, e: &Effect) -> Result<(), Failure> {
    let p = &e.payload;
    let s = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or_default();
    match &e.kind {
        EffectKind::Mail | EffectKind::Callback => ingest.courier.carry(ingest, e).await,
        EffectKind::Replicate => {
            let n = |k: &str| p.get(k).and_then(Value::as_u64).unwrap_or(0) as u32;
            crate::replicate::copy_version(ingest, s("ark"), n("version"), n("from"), n("to"))
                .await
                .map(|_| ())
                .map_err(|e| match e.down {
                    Some(cause) => Failure::Unavailable {
                        dependency: crate::replicate::node_of_error(
                            ingest,
                            &e.what,
                            n("from"),
                            n("to"),
                        ),
                        cause,
                    },
                    None if e.fatal => Failure::Never(e.what),
                    None => Failure::Retry(e.what),
                })
        }
        other => Err(Failure::Never(format!(
            "unknown effect kind {:?}",
            other.as_str()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn callback(payload: Value) -> Effect {
        Effect {
            kind: EffectKind::Callback,
            key: "lading:b:j:completed:1".into(),
            batch: None,
            job: None,
            payload,
        }
    }

    /// The POST carries the key in its header and the body as JSON; a callback with no URL
    /// is never sent, and says why; only a 2xx answer counts as delivered.
    #[test]
    fn a_callback_post_carries_its_key_and_its_answer_decides() {
        let body = json!({"idempotency_key": "lading:b:j:completed:1", "job": "j"});
        let post = callback_of(&callback(
            json!({"url": "http://r.invalid/cb", "body": body}),
        ))
        .unwrap();
        assert_eq!(post.url, "http://r.invalid/cb");
        assert!(
            post.headers
                .contains(&("idempotency-key", "lading:b:j:completed:1".to_string()))
        );
        assert!(
            post.headers
                .contains(&("content-type", "application/json".to_string()))
        );
        assert_eq!(
            lading_core::json::from_bytes::<Value>(&post.body).unwrap(),
            body
        );
        for payload in [json!({"body": body}), json!({"url": "", "body": body})] {
            assert_eq!(
                callback_of(&callback(payload)).unwrap_err(),
                Failure::Never("the callback names no url".into())
            );
        }
        assert_eq!(callback_answer("u", 204), Ok(()));
        for status in [301, 404] {
            assert_eq!(
                callback_answer("u", status),
                Err(Failure::Retry(format!("callback u answered {status}")))
            );
        }
        // The receiver unavailable: waited for, using no attempt (SPEC §11).
        for status in [503, 500, 429, 408] {
            assert!(
                matches!(
                    callback_answer("http://h:1/u", status),
                    Err(Failure::Unavailable { ref dependency, ref cause })
                        if dependency.label() == "callback host h:1"
                            && *cause == format!("answered {status}")
                ),
                "{status}"
            );
        }
    }
}
