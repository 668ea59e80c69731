//! What leaves the process goes through the outbox, once, with a key: a failing callback is
//! retried with one key until an admin retries a dead entry, a receiver answering 503 gets it
//! once it is back, a report mail waits for an SMTP server that is down. Real HTTP and SMTP
//! receivers on loopback.

#[macro_use]
mod common;

use common::*;
use lading_core::BatchState;

/// Waits until the outbox satisfies `cond`: woken by its changes (entries added, removed or
/// rewritten), not by polling.
async fn outbox_until(
    w: &World,
    what: &str,
    cond: impl Fn(&[lading_engine::OutboxItem]) -> bool,
) -> Vec<lading_engine::OutboxItem> {
    use lading_core::layout::OUTBOX;
    let tree = w.engine.tree().clone();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        // Watches first, then the read: no change falls between them.
        let mut changed = tokio::task::JoinSet::new();
        changed.spawn(
            tree.watch(OUTBOX, lading_core::WatchKind::Children)
                .await
                .unwrap(),
        );
        for name in tree.children(OUTBOX).await.unwrap() {
            let path = format!("{OUTBOX}/{name}");
            if let Ok(watch) = tree.watch(&path, lading_core::WatchKind::Data).await {
                changed.spawn(watch);
            }
        }
        let items = w.engine.outbox().await.unwrap();
        if cond(&items) {
            return items;
        }
        tokio::time::timeout_at(deadline, changed.join_next())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_callback_is_retried_from_the_outbox_with_one_key_until_an_admin_retries_it() {
    let w = World::new().await;
    // A 4xx is the callback's own error (a 5xx would be the receiver unavailable: waited
    // for, using no attempt; see the next test).
    w.server.set_callback_status(400);
    let (ingest, bid) = w.submit_object(&[("f.txt", b"payload")]).await;
    let run = w.run_all(&ingest);
    // The callback is an effect of the job's completion: the job and its batch complete,
    // the callback waits in the outbox.
    assert_eq!(w.batch_ends(&bid).await, BatchState::Completed);
    let job = w.jobs_of(&bid).await.remove(0);
    let first = w.smtp.next().await;
    assert!(first.contains("1 completed, 0 failed"), "{first}");
    // Three attempts (the test's `[stages.outbox]`), then kept as dead for an admin.
    let out = outbox_until(&w, "a dead entry", |o| o.iter().any(|e| e.entry.dead)).await;
    let dead = out.into_iter().find(|e| e.entry.dead).unwrap();
    assert_eq!(dead.entry.attempts, 3);
    assert_eq!(dead.entry.effect.kind, lading_engine::EffectKind::Callback);
    assert!(
        dead.entry
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("answered 400"),
        "{dead:?}"
    );
    assert_eq!(w.server.callbacks().len(), 3, "one per attempt");
    // The admin fixes the receiver and retries the entry: delivered once more, then gone.
    w.server.set_callback_status(200);
    w.engine.retry_effect(&dead.name).await.unwrap();
    outbox_until(&w, "the retried callback's delivery", |o| o.is_empty()).await;
    let calls = w.server.callbacks();
    assert_eq!(calls.len(), 4);
    // Every attempt at one outcome carries one Idempotency-Key, in the header and the body.
    let keys: std::collections::BTreeSet<String> = calls
        .iter()
        .map(|c| {
            assert_eq!(c["idempotency_key"], c["body"]["idempotency_key"], "{c}");
            c["idempotency_key"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let key = keys.into_iter().next().unwrap();
    assert!(key.ends_with(&format!(":{job}:completed:1")), "{key}");
    assert_eq!(calls[3]["body"]["status"], "Completed");
    assert_eq!(w.stored(&job).await.version, 1, "stored once");
    run.stop().await;
}

/// SPEC §11: a callback receiver answering 503 is unavailable: the callback waits in the
/// outbox using none of its attempts (three would make it dead), and is delivered once,
/// with its key, when the receiver answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_receiver_answering_503_for_a_while_gets_the_callback_once_it_is_back() {
    let mut w = World::new().await;
    w.cfg.dependencies.probe_max_s = 1;
    w.server.set_callback_status(503);
    let (ingest, bid) = w.submit_object(&[("f.txt", b"payload")]).await;
    let run = w.run_all(&ingest);
    assert_eq!(w.batch_ends(&bid).await, BatchState::Completed);
    // More tries than the three attempts allow, none of them counted.
    lading_testkit::poll::until_true("five tries of the callback", common::WAIT, async || {
        w.server.callbacks().len() >= 5
    })
    .await;
    let out = w.engine.outbox().await.unwrap();
    let entry = out
        .iter()
        .find(|e| e.entry.effect.kind == lading_engine::EffectKind::Callback)
        .expect("the callback waits in the outbox");
    assert!(!entry.entry.dead, "{entry:?}");
    assert_eq!(entry.entry.attempts, 0, "{entry:?}");
    assert!(
        entry
            .entry
            .last_error
            .as_deref()
            .unwrap_or("")
            .starts_with("waiting: callback host 127.0.0.1:"),
        "{entry:?}"
    );
    let tried = w.server.callbacks().len();
    w.server.set_callback_status(200);
    outbox_until(&w, "the callback's delivery", |o| o.is_empty()).await;
    let calls = w.server.callbacks();
    assert!(calls.len() <= tried + 2, "{} after {tried}", calls.len());
    let keys: std::collections::BTreeSet<&str> = calls
        .iter()
        .map(|c| c["idempotency_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 1, "one key for every try");
    run.stop().await;
}

/// SPEC §11: the SMTP server is down when the batch reports. The report mail waits in the
/// outbox, using no attempt however often it is tried, the SMTP server is shown down; once a
/// server listens on its port again, the prober finds it and the mail goes out, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_mail_waits_for_an_smtp_server_that_is_down_and_goes_out_when_it_is_back() {
    let mut w = World::new().await;
    w.cfg.dependencies.probe_max_s = 1;
    // A port nothing listens on, kept for the server that comes back.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    w.cfg.smtp_port = port;
    let (ingest, bid) = w.submit_object(&[("f.txt", b"payload")]).await;
    let run = w.run_all(&ingest);
    assert_eq!(w.batch_ends(&bid).await, BatchState::Completed);
    let probed = |n: u32| {
        let ingest = ingest.clone();
        async move || {
            ingest
                .engine
                .deps()
                .list()
                .iter()
                .any(|h| h.kind == "smtp" && !h.up && h.probes >= n)
        }
    };
    // Down through more probes than the outbox's three attempts.
    lading_testkit::poll::until_true("four failed probes of the SMTP server", WAIT, probed(4))
        .await;
    let out = w.engine.outbox().await.unwrap();
    let mail = out
        .iter()
        .find(|e| e.entry.effect.kind == lading_engine::EffectKind::Mail)
        .expect("the report mail waits in the outbox");
    assert!(!mail.entry.dead, "{mail:?}");
    assert_eq!(mail.entry.attempts, 0, "no attempt used: {mail:?}");
    let err = mail.entry.last_error.clone().unwrap_or_default();
    assert!(err.starts_with("waiting: "), "{err}");
    assert!(
        ingest
            .engine
            .deps()
            .list()
            .iter()
            .any(|h| h.kind == "smtp" && !h.up)
    );
    // Back: the prober finds it and the mail goes out, once.
    let smtp = lading_testkit::smtp::Smtp::start_on(port).await;
    let m = tokio::time::timeout(WAIT, smtp.next())
        .await
        .expect("the mail");
    assert!(m.contains(&bid.to_string()), "{m}");
    // Delivered: the entry is gone, so nothing sends it again.
    outbox_until(&w, "the mail's delivery", |o| o.is_empty()).await;
    run.stop().await;
}
