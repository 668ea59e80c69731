//! The pipeline end to end on real parts: a SQLite store, an HTTP payload server and callback
//! receiver, an SMTP receiver, the file system for working and storage, a SQLite inventory.

#[macro_use]
mod common;

use common::*;
use lading_core::{BatchState, JobState};
use lading_ingest::checkm::{self, ManifestKind};
use lading_ingest::{Submission, SubmitError, inventory};

/// The stages up to a job's download: run alone, they leave jobs waiting in Processing.
const EARLY: &[&str] = &[
    "intake",
    "pending",
    "estimating",
    "provisioning",
    "downloading",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_of_manifests_goes_through_every_stage_to_a_report() {
    let w = World::new().await;
    let m1 = w.object_manifest(
        "obj1.checkm",
        &[("a.txt", b"alpha"), ("dir/b.txt", b"bravo!")],
    );
    let m2 = w.object_manifest("obj2.checkm", &[("c.txt", b"charlie")]);
    let batch = checkm::write(
        ManifestKind::Batch,
        &[
            checkm::FILE_URL,
            checkm::LOCAL_ID,
            checkm::TITLE,
            checkm::CREATOR,
        ],
        &[
            vec![m1, "local-1".into(), "First".into(), "Ann".into()],
            vec![m2, "local-2".into(), "Second".into(), "Bob".into()],
        ],
    );
    let (url, _) = w.file("batch.checkm", batch.as_bytes());
    let ingest = w.ingest();
    let bid = w.submit(&ingest, &url, "batch-manifest").await;
    let run = w.run_all(&ingest);
    w.completes(&bid).await;
    let jobs = w.jobs_of(&bid).await;
    assert_eq!(jobs.len(), 2);
    let mut files_seen = Vec::new();
    for j in &jobs {
        let info = w.engine.job(j).await.unwrap();
        assert_eq!(info.status.status, JobState::Completed, "{info:?}");
        let ark = info.identifiers["primary_id"].as_str().unwrap().to_string();
        assert!(ark.starts_with("ark:/99999/fk4"), "minted: {ark}");
        let local = info.identifiers["local_id"][0]
            .as_str()
            .unwrap()
            .to_string();
        assert!(local.starts_with("local-"));
        assert!(info.metadata["erc_what"].is_string());
        assert!(info.space_needed > 0, "estimated");
        let s = w.stored(j).await;
        assert_eq!((s.ark.as_str(), s.version), (ark.as_str(), 1));
        let files = stored_files(std::path::Path::new(&s.path));
        assert!(
            files.contains(&"system/manifest.checkm".to_string()),
            "{files:?}"
        );
        files_seen.extend(files.into_iter().filter(|f| f.starts_with("producer/")));
        // The fields Merritt reads, beside Lading's own.
        let node = |name: &'static str| {
            let e = w.engine.clone();
            let j = j.clone();
            async move {
                let n = e
                    .tree()
                    .get(&lading_core::layout::job_node(&j, name))
                    .await
                    .unwrap()
                    .unwrap();
                serde_json::from_slice::<serde_json::Value>(&n.data.unwrap()).unwrap()
            }
        };
        let store = node("store").await;
        assert_eq!(
            (store["mode"].as_str(), store["delete"].as_str()),
            (Some("add"), Some("false")),
            "Merritt reads mode and delete with getString"
        );
        assert!(
            store["manifest_url"]
                .as_str()
                .unwrap()
                .starts_with("file://"),
            "{store}"
        );
        let inv = node("inventory").await;
        assert_eq!(inv["mode"], "add");
        assert_eq!(
            inv["manifest_url"],
            format!("file://{}/system/manifest.checkm", s.path)
        );
        assert!(inv["files"].is_array(), "Lading's own fields stay: {inv}");
        let status = node("status").await;
        assert_eq!(status["message"], "", "Merritt always has a message");
        let versions = inventory::Inventory::new(w.cfg.inventory())
            .versions(&ark)
            .unwrap();
        assert_eq!(versions.len(), 1);
        assert_eq!(versions[0].0, 1);
    }
    files_seen.sort();
    assert_eq!(
        files_seen,
        ["producer/a.txt", "producer/c.txt", "producer/dir/b.txt"]
    );
    let report = w.engine.batch(&bid).await.unwrap().status_report.unwrap();
    assert_eq!(report.completed_jobs.len(), 2);
    assert!(report.failed_jobs.is_empty());
    let callbacks = w.server.callbacks();
    assert_eq!(callbacks.len(), 2);
    assert_eq!(callbacks[0]["body"]["status"], "Completed");
    let mail = w.smtp.next().await;
    assert!(mail.contains("2 completed, 0 failed"), "{mail}");
    assert!(mail.contains("depositor@example.org"), "{mail}");
    run.stop().await;
}

/// The Message-ID header of a mail as the SMTP receiver got it.
fn message_id(mail: &str) -> String {
    mail.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("message-id")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no Message-ID in {mail}"))
}

fn tar_gz_bytes(files: &[(&str, &[u8])]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut t = tar::Builder::new(gz);
    for (name, bytes) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        t.append_data(&mut h, name, *bytes).unwrap();
    }
    t.into_inner().unwrap().finish().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_and_single_files_are_objects_too() {
    let w = World::new().await;
    let (zip_url, zip_md5) = w.file(
        "c1.zip",
        &lading_testkit::zip_bytes(&[("x/one.txt", b"1"), ("two.txt", b"22")]),
    );
    let (tgz_url, _) = w.file("c2.tar.gz", &tar_gz_bytes(&[("three.txt", b"333")]));
    let containers = checkm::write(
        ManifestKind::ContainerBatch,
        &[checkm::FILE_URL, checkm::HASH_ALG, checkm::HASH_VALUE],
        &[
            vec![zip_url, "md5".into(), zip_md5],
            vec![tgz_url, "".into(), "".into()],
        ],
    );
    let (c_url, _) = w.file("containers.checkm", containers.as_bytes());
    let (f1, _) = w.file("single/one.bin", b"single one");
    let (f2, _) = w.file("single/two.bin", b"single two");
    let singles = checkm::write(
        ManifestKind::SingleFileBatch,
        &[checkm::FILE_URL, checkm::PRIMARY_ID],
        &[vec![f1, "ark:/13030/given1".into()], vec![f2, "".into()]],
    );
    let (s_url, _) = w.file("singles.checkm", singles.as_bytes());
    let ingest = w.ingest();
    let b1 = w.submit(&ingest, &c_url, "container-batch-manifest").await;
    let b2 = w
        .submit(&ingest, &s_url, "single-file-batch-manifest")
        .await;
    let run = w.run_all(&ingest);
    for b in [&b1, &b2] {
        w.completes(b).await;
    }
    let mut contents = Vec::new();
    for j in w.jobs_of(&b1).await {
        let s = w.stored(&j).await;
        contents.extend(stored_files(std::path::Path::new(&s.path)));
    }
    contents.sort();
    assert!(
        contents.contains(&"producer/x/one.txt".to_string()),
        "{contents:?}"
    );
    assert!(
        contents.contains(&"producer/two.txt".to_string()),
        "{contents:?}"
    );
    assert!(
        contents.contains(&"producer/three.txt".to_string()),
        "{contents:?}"
    );
    let mut given = None;
    for j in w.jobs_of(&b2).await {
        let s = w.stored(&j).await;
        if s.ark == "ark:/13030/given1" {
            given = Some(s);
        }
    }
    let given = given.expect("a given identifier is kept");
    assert!(
        std::path::Path::new(&given.path)
            .join("producer/one.bin")
            .exists()
    );
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_url_waits_for_its_host_then_fails_naming_it_and_the_batch_reports_it() {
    let mut w = World::new().await;
    // A payload host that refuses connections is an outage (SPEC §11): the job waits on it,
    // using no attempt, until the wait's limit (a second here).
    w.cfg.dependencies.max_wait_s = Some(1);
    let singles = checkm::write(
        ManifestKind::SingleFileBatch,
        &[checkm::FILE_URL],
        &[vec!["http://127.0.0.1:1/gone.bin".into()]],
    );
    let (url, _) = w.file("singles.checkm", singles.as_bytes());
    let ingest = w.ingest();
    let bid = w.submit(&ingest, &url, "single-file-batch-manifest").await;
    let run = w.run_all(&ingest);
    assert_eq!(w.batch_ends(&bid).await, BatchState::Failed);
    let (_, msg) = w.failed_after(&bid, JobState::Provisioning).await;
    assert!(msg.contains("127.0.0.1:1/gone.bin"), "{msg}");
    assert!(
        msg.starts_with("payload host 127.0.0.1:1 unavailable since ")
            && msg.contains("longer than a job may wait")
            && msg.contains("connection refused"),
        "{msg}"
    );
    let st = w.engine.job(&w.first_job(&bid).await).await.unwrap().status;
    assert_eq!(
        st.extra.get("failed_attempts").and_then(|v| v.as_u64()),
        Some(1),
        "the waits used no attempt: {st:?}"
    );
    assert!(
        st.extra.get("waits").and_then(|v| v.as_u64()).unwrap_or(0) >= 1,
        "{st:?}"
    );
    let batch = w.engine.batch(&bid).await.unwrap();
    assert_eq!(batch.status.message.as_deref(), Some("1 of 1 jobs failed"));
    let mail = w.smtp.next().await;
    assert!(mail.contains("0 completed, 1 failed"), "{mail}");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_mismatch_fails_the_job_at_once() {
    let w = World::new().await;
    let (f, _) = w.file("obj.d/a.txt", b"the real content");
    let text = checkm::write(
        ManifestKind::Object,
        &[
            checkm::FILE_URL,
            checkm::HASH_ALG,
            checkm::HASH_VALUE,
            checkm::FILE_NAME,
        ],
        &[vec![f, "sha256".into(), "0".repeat(64), "a.txt".into()]],
    );
    let (ingest, bid) = w.submit_manifest(&text).await;
    let run = w.run_all(&ingest);
    w.batch_reaches(&bid, &[BatchState::Failed]).await;
    let job = w.jobs_of(&bid).await.remove(0);
    let info = w.engine.job(&job).await.unwrap();
    // A fatal failure, in the stage that failed, after one attempt.
    assert_eq!(lading_engine::failure_kind(&info.status), Some("fatal"));
    assert_eq!(
        lading_engine::failed_stage(&info.status),
        Some("Downloading")
    );
    assert_eq!(info.status.extra["failed_attempts"], 1);
    let msg = info.status.message.unwrap();
    assert!(msg.starts_with("sha256 digest mismatch for"), "{msg}");
    assert_eq!(w.server.gets("obj.d/a.txt"), 1, "not retried");
    assert!(
        !w.cfg
            .work_dir()
            .join(job.as_str())
            .join("producer/a.txt")
            .exists()
    );
    // The depositor corrects the digest; a requeue reads the corrected manifest.
    let mut h256 = lading_ingest::fetch::Hasher::new(checkm::HashAlg::Sha256);
    h256.update(b"the real content");
    let fixed = checkm::write(
        ManifestKind::Object,
        &[
            checkm::FILE_URL,
            checkm::HASH_ALG,
            checkm::HASH_VALUE,
            checkm::FILE_NAME,
        ],
        &[vec![
            w.server.url("obj.d/a.txt"),
            "sha256".into(),
            h256.hex(),
            "a.txt".into(),
        ]],
    );
    w.file("obj.checkm", fixed.as_bytes());
    let first = w.smtp.next().await;
    assert!(first.contains("0 completed, 1 failed"), "{first}");
    assert!(
        first.contains("Downloading (fatal): sha256 digest mismatch"),
        "{first}"
    );
    let first_id = message_id(&first);
    assert!(first_id.contains(".report-1@"), "{first}");
    let st = w.engine.requeue_job(&job, None).await.unwrap();
    assert_eq!(st.status, JobState::Downloading);
    // The requeue reopened the batch: it reports again by itself once the job is done.
    w.job_reaches(&job, JobState::Completed).await;
    assert_eq!(
        w.batch_reaches(&bid, &[BatchState::Completed]).await,
        BatchState::Completed
    );
    let report = w.engine.batch(&bid).await.unwrap().status_report.unwrap();
    assert_eq!(report.extra["report_number"], 2);
    assert_eq!(
        report.extra["updated_jobs"],
        serde_json::json!([job.as_str()])
    );
    let update = w.smtp.next().await;
    assert!(
        update.contains("(update): 1 completed, 0 failed"),
        "{update}"
    );
    assert!(
        update.contains("Fixed since the last report: 1"),
        "{update}"
    );
    let update_id = message_id(&update);
    assert_eq!(
        update_id.replace(".report-2@", ".report-1@"),
        first_id,
        "one batch, one stem, the next number"
    );
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_fetches_again_only_the_files_whose_manifest_rows_changed() {
    let w = World::new().await;
    let sha = |b: &[u8]| {
        let mut h = lading_ingest::fetch::Hasher::new(checkm::HashAlg::Sha256);
        h.update(b);
        h.hex()
    };
    let (a_old, _) = w.file("d/a-old.txt", b"first a");
    let (a_new, _) = w.file("d/a-new.txt", b"corrected a");
    let (b, _) = w.file("d/b.txt", b"the b");
    let (c, _) = w.file("d/c.txt", b"the c");
    let manifest = |rows: Vec<Vec<String>>| {
        checkm::write(
            ManifestKind::Object,
            &[
                checkm::FILE_URL,
                checkm::HASH_ALG,
                checkm::HASH_VALUE,
                checkm::FILE_NAME,
            ],
            &rows,
        )
    };
    let row = |url: &str, digest: String, name: &str| {
        vec![url.to_string(), "sha256".into(), digest, name.to_string()]
    };
    // a and c verify; b's digest is wrong: the job fails in Downloading.
    let first = manifest(vec![
        row(&a_old, sha(b"first a"), "a.txt"),
        row(&c, sha(b"the c"), "c.txt"),
        row(&b, "0".repeat(64), "b.txt"),
    ]);
    let (ingest, bid) = w.submit_manifest(&first).await;
    let run = w.run_all(&ingest);
    w.batch_reaches(&bid, &[BatchState::Failed]).await;
    let job = w.jobs_of(&bid).await.remove(0);
    // The depositor fixes b's digest and points a at a corrected file; c is unchanged.
    let fixed = manifest(vec![
        row(&a_new, sha(b"corrected a"), "a.txt"),
        row(&c, sha(b"the c"), "c.txt"),
        row(&b, sha(b"the b"), "b.txt"),
    ]);
    w.file("obj.checkm", fixed.as_bytes());
    w.engine.requeue_job(&job, None).await.unwrap();
    w.batch_reaches(&bid, &[BatchState::Completed]).await;
    assert_eq!(
        w.server.gets("d/c.txt"),
        1,
        "an unchanged row is not fetched again"
    );
    assert_eq!(w.server.gets("d/a-old.txt"), 1);
    assert_eq!(
        w.server.gets("d/a-new.txt"),
        1,
        "a changed row is fetched again"
    );
    assert_eq!(w.server.gets("d/b.txt"), 2);
    let v = w.stored(&job).await;
    let a = std::fs::read(std::path::Path::new(&v.path).join("producer/a.txt")).unwrap();
    assert_eq!(a, b"corrected a");
    run.stop().await;
}

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
    assert_eq!(dead.entry.effect.kind, "callback");
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
        .find(|e| e.entry.effect.kind == "callback")
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
        .find(|e| e.entry.effect.kind == "mail")
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_wait_in_provisioning_while_storage_is_full_then_proceed() {
    let mut w = World::new().await;
    let m = w.object_manifest("o.checkm", &[("f.txt", b"needs room")]);
    // A reserve that leaves no room now, yet could fit on this file system (a job that
    // never could fails at once instead).
    let work = w.cfg.work_dir();
    std::fs::create_dir_all(&work).unwrap();
    let free = lading_ingest::stages::free_bytes(&work).unwrap();
    let total = lading_ingest::stages::total_bytes(&work).unwrap();
    w.cfg.reserve_bytes = free + (total - free) / 2;
    let full = w.ingest();
    let bid = w.submit(&full, &m, "manifest").await;
    let run = w.run_all(&full);
    // Wait for the job to be seen waiting for room: its status message says so.
    let job = w.first_job(&bid).await;
    let status = lading_core::layout::job_node(&job, "status");
    tokio::time::timeout(WAIT, async {
        loop {
            let watch = w
                .engine
                .tree()
                .watch(&status, lading_core::WatchKind::Data)
                .await
                .unwrap();
            let info = w.engine.job(&job).await.unwrap();
            if info
                .status
                .message
                .as_deref()
                .is_some_and(|m| m.starts_with("waiting for space"))
            {
                assert_eq!(info.status.status, JobState::Provisioning);
                assert_eq!(
                    lading_engine::attempts(&info.status),
                    0,
                    "waiting is not failing"
                );
                return;
            }
            watch.await;
        }
    })
    .await
    .expect("the job waits for space");
    run.abort().await;
    // Room appears (here: the reserve is lowered) and the job goes on.
    w.cfg.reserve_bytes = 0;
    let roomy = w.ingest();
    w.runs_to_completion(&roomy, &bid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_manifest_fails_the_batch_naming_the_line() {
    let w = World::new().await;
    let text = "#%checkm_0.7\n#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-batch-manifest\n#%fields | nfo:fileUrl | nfo:fileSize\nhttp://h/m1.checkm | 12\nhttp://h/m2.checkm | twelve\n#%eof\n";
    let (url, _) = w.file("bad.checkm", text.as_bytes());
    let ingest = w.ingest();
    let bid = w.submit(&ingest, &url, "batch-manifest").await;
    let run = w.run_all(&ingest);
    w.batch_reaches(&bid, &[BatchState::Failed]).await;
    let info = w.engine.batch(&bid).await.unwrap();
    let msg = info.status.message.unwrap();
    assert!(
        msg.contains("manifest line 5: file size \"twelve\""),
        "{msg}"
    );
    assert!(w.jobs_of(&bid).await.is_empty(), "no job was made");
    // The depositor hears of it: the failure is the batch's report, mailed.
    let report = info.status_report.expect("a failed intake's report");
    assert_eq!(report.extra["report_number"], 1);
    assert!(
        report.extra["intake_error"]
            .as_str()
            .is_some_and(|e| e.contains("manifest line 5"))
    );
    let mail = w.smtp.next().await;
    // Unfolded: headers fold long lines, and quoted-printable breaks them softly.
    let flat = mail
        .replace("=\r\n", "")
        .replace("=\n", "")
        .replace("\r\n ", " ")
        .replace("\n ", " ");
    assert!(flat.contains("failed, no objects ingested"), "{mail}");
    assert!(flat.contains("manifest line 5: file size"), "{mail}");
    assert!(mail.contains("depositor@example.org"), "{mail}");
    assert!(
        message_id(&mail).contains(".report-1@"),
        "report 1's Message-ID: {mail}"
    );
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_a_payload_url_is_not_recorded_reported_or_mailed() {
    let w = World::new().await;
    let url = w
        .server
        .url("gone.bin")
        .replacen("http://", "http://ann:s3cret@", 1);
    let ingest = w.ingest();
    let bid = w.submit(&ingest, &url, "file").await;
    let run = w.run_all(&ingest);
    assert_eq!(w.batch_ends(&bid).await, BatchState::Failed);
    let job = w.jobs_of(&bid).await.remove(0);
    let info = w.engine.job(&job).await.unwrap();
    let msg = info.status.message.clone().unwrap_or_default();
    assert!(msg.contains("http://ann:***@127.0.0.1:"), "{msg}");
    assert!(msg.contains("404"), "the reason is kept: {msg}");
    let status = serde_json::to_string(&info.status).unwrap();
    assert!(!status.contains("s3cret"), "status and history: {status}");
    let batch = serde_json::to_string(&w.engine.batch(&bid).await.unwrap().status_report).unwrap();
    assert!(!batch.contains("s3cret"), "report: {batch}");
    let mail = w.smtp.next().await;
    assert!(!mail.contains("s3cret"), "{mail}");
    assert!(
        mail.contains("Payload: http://ann:***@127.0.0.1:"),
        "{mail}"
    );
    let log = std::fs::read_to_string(w.cfg.work_dir().join(job.as_str()).join("job.log"))
        .unwrap_or_default();
    assert!(!log.contains("s3cret"), "{log}");
    // What the depositor submitted is kept as given: intake needs it again after a crash.
    let sub = w.engine.batch(&bid).await.unwrap().submission;
    assert_eq!(sub["payload_url"], url.as_str());
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_submissions_are_refused_and_store_nothing() {
    let w = World::new().await;
    let ingest = w.ingest();
    let sub = |profile: &str, url: &str, ty: &str| Submission {
        profile: profile.into(),
        submitter: "me".into(),
        payload_url: url.into(),
        payload_type: ty.into(),
        ..Default::default()
    };
    let e = lading_ingest::submit(&ingest, &sub("nope", "http://h/x", "file"))
        .await
        .unwrap_err();
    assert!(e.to_string().starts_with("unknown profile \"nope\""), "{e}");
    let e = lading_ingest::submit(&ingest, &sub("demo", "http://h/x", "tarball"))
        .await
        .unwrap_err();
    assert!(matches!(e, SubmitError::PayloadType(_)), "{e}");
    let e = lading_ingest::submit(&ingest, &sub("demo", "gopher://h/x", "file"))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("not an http, https or file URL"),
        "{e}"
    );
    assert!(w.engine.batch_ids().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_download_fetches_only_the_files_not_yet_verified() {
    let w = World::new().await;
    let m = w.object_manifest(
        "o.checkm",
        &[("1.txt", b"first file"), ("2.txt", b"second file")],
    );
    // Both tries of the second file in the first attempt get 503; the job is retried.
    w.server.fail_next("o.checkm.d/2.txt", 2);
    let ingest = w.ingest();
    let bid = w.submit(&ingest, &m, "manifest").await;
    let run = w.run_all(&ingest);
    w.completes(&bid).await;
    assert_eq!(
        w.server.gets("o.checkm.d/1.txt"),
        1,
        "verified once, not fetched again"
    );
    assert_eq!(w.server.gets("o.checkm.d/2.txt"), 3);
    let job = w.jobs_of(&bid).await.remove(0);
    let log = std::fs::read_to_string(w.cfg.work_dir().join(job.as_str()).join("job.log")).unwrap();
    assert!(
        log.contains("1.txt already verified; not fetched again"),
        "{log}"
    );
    run.stop().await;
}

/// Merritt's Ruby client serves an object's files until its own ERC file was requested once
/// (a HEAD counts), then stops its server. The estimate asks the size of a file the manifest
/// does not size, but never of the ERC file, so the download still finds the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merritts_erc_file_is_fetched_once_after_the_others_and_never_asked_ahead() {
    let w = World::new().await;
    let files: [(&str, &[u8], bool); 3] = [
        ("letter.txt", b"Dear Merritt,\n", true),
        ("unsized.bin", &[7u8; 3000], false),
        (
            "mrt-erc.txt",
            b"erc:\nwho: Doe, Jane\nwhat: A letter\n",
            false,
        ),
    ];
    let rows: Vec<Vec<String>> = files
        .iter()
        .map(|(name, bytes, sized)| {
            let (url, md5) = w.file(&format!("o.checkm.d/{name}"), bytes);
            let size = if *sized {
                bytes.len().to_string()
            } else {
                String::new()
            };
            vec![url, "md5".into(), md5, size, name.to_string()]
        })
        .collect();
    let text = checkm::write(ManifestKind::Object, checkm::OBJECT_FIELDS, &rows);
    w.server.stop_after("o.checkm.d/mrt-erc.txt");
    let (ingest, bid) = w.submit_manifest(&text).await;
    let run = w.run_all(&ingest);
    w.completes(&bid).await;
    let job = w.jobs_of(&bid).await.remove(0);
    let info = w.engine.job(&job).await.unwrap();
    assert_eq!(info.metadata["erc_who"], "Doe, Jane", "{info:?}");
    assert_eq!(
        info.space_needed,
        (files[0].1.len() + files[1].1.len()) as u64,
        "the declared size and the asked one; the ERC file counts 0"
    );
    assert_eq!(w.server.heads("o.checkm.d/unsized.bin"), 1, "asked");
    assert_eq!(w.server.heads("o.checkm.d/letter.txt"), 0, "sized");
    assert_eq!(w.server.heads("o.checkm.d/mrt-erc.txt"), 0, "never asked");
    for (name, _, _) in files {
        assert_eq!(w.server.gets(&format!("o.checkm.d/{name}")), 1, "{name}");
    }
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_working_copy_that_changed_after_download_is_caught_before_storing() {
    let w = World::new().await;
    let (ingest, bid) = w.submit_object(&[("f.txt", b"verified content")]).await;
    // Only the stages up to downloading run at first.
    let run = w.run_stages(&ingest, EARLY);
    let job = w.first_job(&bid).await;
    w.job_reaches(&job, JobState::Processing).await;
    run.stop().await;
    // A crash (or anything else) damages the working copy.
    let copy = w.cfg.work_dir().join(job.as_str()).join("producer/f.txt");
    std::fs::write(&copy, b"damaged content!").unwrap();
    let run = w.run_all(&ingest);
    w.job_reaches(&job, JobState::Failed).await;
    let info = w.engine.job(&job).await.unwrap();
    let msg = info.status.message.unwrap();
    assert!(msg.contains("producer/f.txt no longer matches"), "{msg}");
    assert!(
        !w.cfg.storage_root().exists()
            || std::fs::read_dir(w.cfg.storage_root())
                .unwrap()
                .next()
                .is_none(),
        "nothing was stored"
    );
    // Requeued to Downloading, the damaged file is fetched again and the job completes.
    w.engine
        .requeue_job(&job, Some(JobState::Downloading))
        .await
        .unwrap();
    w.job_reaches(&job, JobState::Completed).await;
    assert_eq!(w.server.gets("o.checkm.d/f.txt"), 2);
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_processing_command_fails_the_job_with_its_last_lines() {
    let w = World::new().await;
    w.profile(
        "scan",
        "collection = \"demo\"\ncommand = \"echo scanning $LADING_JOB_ID; ls producer; echo 'virus found in f.txt' >&2; exit 3\"\n",
    );
    let m = w.object_manifest("o.checkm", &[("f.txt", b"eicar")]);
    let ingest = w.ingest();
    let bid = w.submit_as(&ingest, "scan", "me", &m, "manifest").await;
    let run = w.run_all(&ingest);
    w.batch_reaches(&bid, &[BatchState::Failed]).await;
    let (job, msg) = w.failed_after(&bid, JobState::Downloading).await;
    assert!(msg.contains("exit status: 3"), "{msg}");
    assert!(msg.contains("virus found in f.txt"), "{msg}");
    let log = std::fs::read_to_string(w.cfg.work_dir().join(job.as_str()).join("job.log")).unwrap();
    assert!(log.contains(&format!("| scanning {job}")), "{log}");
    assert!(log.contains("| f.txt"), "{log}");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_collection_holds_its_batches_until_released() {
    let w = World::new().await;
    w.engine.hold_collection("demo").await.unwrap();
    let (ingest, bid) = w.submit_object(&[("f.txt", b"held")]).await;
    let run = w.run_all(&ingest);
    w.batch_reaches(&bid, &[BatchState::Held]).await;
    assert!(w.jobs_of(&bid).await.is_empty());
    w.engine.release_collection("demo").await.unwrap();
    w.completes(&bid).await;
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_removes_old_batches_and_working_folders_but_not_stored_objects() {
    let w = World::new().await;
    let (ingest, bid) = w.submit_object(&[("f.txt", b"keep me")]).await;
    let run = w.run_all(&ingest);
    w.batch_reaches(&bid, &[BatchState::Completed]).await;
    run.stop().await;
    let job = w.jobs_of(&bid).await.remove(0);
    let stored_at = w.stored(&job).await.path;
    assert!(w.cfg.work_dir().join(job.as_str()).exists());
    let now = w.engine.clock().now_ms();
    // Younger than the retention: kept.
    let kept = lading_ingest::cleanup::cleanup(&ingest, now, 3_600_000)
        .await
        .unwrap();
    assert_eq!(kept.batches, 0);
    let gone = lading_ingest::cleanup::cleanup(&ingest, now + 3_600_001, 3_600_000)
        .await
        .unwrap();
    assert_eq!((gone.batches, gone.jobs), (1, 1));
    assert!(w.engine.batch(&bid).await.is_err());
    assert!(!w.cfg.work_dir().join(job.as_str()).exists());
    assert!(
        std::path::Path::new(&stored_at)
            .join("producer/f.txt")
            .exists()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_goes_past_a_batch_it_cannot_remove_and_keeps_that_batchs_folders() {
    let w = World::new().await;
    let (ingest, first) = w.submit_object(&[("a.txt", b"first")]).await;
    let (_, second) = w.submit_object(&[("b.txt", b"second")]).await;
    let run = w.run_all(&ingest);
    w.batch_reaches(&first, &[BatchState::Completed]).await;
    w.batch_reaches(&second, &[BatchState::Completed]).await;
    run.stop().await;
    let (j1, j2) = (
        w.jobs_of(&first).await.remove(0),
        w.jobs_of(&second).await.remove(0),
    );
    // Another process holds the first batch (as a reporter would): cleanup leaves it, with
    // its working folder, and removes the second all the same.
    let lock = lading_core::layout::batch_node(&first, "lock");
    w.engine
        .tree()
        .create(&lock, None, lading_core::tree::CreateMode::Persistent)
        .await
        .unwrap();
    let later = w.engine.clock().now_ms() + 3_600_001;
    let c = lading_ingest::cleanup::cleanup(&ingest, later, 3_600_000)
        .await
        .unwrap();
    assert_eq!((c.batches, c.jobs), (1, 1));
    assert_eq!(
        w.engine.batch(&first).await.unwrap().status.status,
        BatchState::Completed
    );
    assert!(w.engine.job(&j1).await.is_ok());
    assert!(w.cfg.work_dir().join(j1.as_str()).exists());
    assert!(w.engine.batch(&second).await.is_err());
    assert!(!w.cfg.work_dir().join(j2.as_str()).exists());
    // Let go: the next pass removes it.
    w.engine.tree().delete(&lock, None).await.unwrap();
    let c = lading_ingest::cleanup::cleanup(&ingest, later, 3_600_000)
        .await
        .unwrap();
    assert_eq!((c.batches, c.jobs), (1, 1));
    assert!(w.engine.batch(&first).await.is_err());
    assert!(!w.cfg.work_dir().join(j1.as_str()).exists());
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sha1_and_sha512_digests_are_checked_too() {
    let w = World::new().await;
    let mut rows = Vec::new();
    for (name, alg) in [
        ("one.txt", checkm::HashAlg::Sha1),
        ("two.txt", checkm::HashAlg::Sha512),
    ] {
        let body = format!("content of {name}");
        let (url, _) = w.file(&format!("o.d/{name}"), body.as_bytes());
        let mut h = lading_ingest::fetch::Hasher::new(alg);
        h.update(body.as_bytes());
        rows.push(vec![
            url,
            alg.name().to_string(),
            h.hex(),
            body.len().to_string(),
            name.to_string(),
        ]);
    }
    // A wrong sha512 in a second object fails that one only.
    let mut bad = rows[1].clone();
    bad[2] = "ab".repeat(64);
    let good = checkm::write(ManifestKind::Object, checkm::OBJECT_FIELDS, &rows);
    let broken = checkm::write(ManifestKind::Object, checkm::OBJECT_FIELDS, &[bad]);
    let (good, _) = w.file("good.checkm", good.as_bytes());
    let (broken, _) = w.file("broken.checkm", broken.as_bytes());
    let ingest = w.ingest();
    let ok = w.submit(&ingest, &good, "manifest").await;
    let ko = w.submit(&ingest, &broken, "manifest").await;
    let run = w.run_all(&ingest);
    w.completes(&ok).await;
    w.batch_reaches(&ko, &[BatchState::Failed]).await;
    let job = w.first_job(&ko).await;
    let msg = w.engine.job(&job).await.unwrap().status.message.unwrap();
    assert!(msg.starts_with("sha512 digest mismatch"), "{msg}");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_sets_its_own_attempts_and_large_jobs_get_a_lower_priority() {
    let mut w = World::new().await;
    w.cfg.large_job_bytes = 10;
    w.profile(
        "once",
        "collection = \"demo\"\n[max_attempts]\ndownloading = 1\n",
    );
    let (big, _) = w.file("big.bin", &[1u8; 100]);
    // A file its server answers 500 for: an error about this request, which uses attempts.
    let (gone, _) = w.file("gone.bin", b"never served");
    w.server.fail_next("gone.bin", 1000);
    let singles = checkm::write(
        ManifestKind::SingleFileBatch,
        &[checkm::FILE_URL],
        &[vec![big], vec![gone]],
    );
    let (url, _) = w.file("singles.checkm", singles.as_bytes());
    let ingest = w.ingest();
    let bid = w
        .submit_as(&ingest, "once", "me", &url, "single-file-batch-manifest")
        .await;
    let run = w.run_all(&ingest);
    w.batch_reaches(&bid, &[BatchState::Failed]).await;
    let mut seen = Vec::new();
    for j in w.jobs_of(&bid).await {
        let info = w.engine.job(&j).await.unwrap();
        seen.push((info.status.status, info.priority, info.status.message));
    }
    seen.sort_by_key(|s| s.1);
    // The 100-byte job is over large_job_bytes: priority 8 (large_job_priority).
    assert!(
        seen.iter()
            .any(|(st, p, _)| *st == JobState::Completed && *p == 8),
        "{seen:?}"
    );
    // The unreachable one had one attempt only, as its profile says (the service allows 3).
    assert!(
        seen.iter().any(|(st, _, m)| *st == JobState::Failed
            && m.as_deref()
                .is_some_and(|m| m.contains("gave up after 1 attempts"))),
        "{seen:?}"
    );
    run.stop().await;
}

/// On both backends (see `on_both_backends!`).
async fn a_submitters_quota_keeps_its_jobs_waiting_while_others_go_ahead(w: World) {
    // One job of this profile in flight per submitter; processing takes a while.
    w.profile(
        "quota",
        "collection = \"demo\"\ncommand = \"sleep 0.3\"\nmax_in_flight_per_submitter = 1\n",
    );
    const ALICE_JOBS: usize = 8;
    let rows: Vec<Vec<String>> = (0..ALICE_JOBS)
        .map(|i| vec![w.file(&format!("a{i}.bin"), b"alice's").0])
        .collect();
    let alice_list = checkm::write(ManifestKind::SingleFileBatch, &[checkm::FILE_URL], &rows);
    let (alice_url, _) = w.file("alice.checkm", alice_list.as_bytes());
    let (bob_url, _) = w.file("bob.bin", b"bob's");
    let ingest = w.ingest();
    let submit = |who: &str, url: String, ty: &str| {
        let s = Submission {
            profile: "quota".into(),
            submitter: who.into(),
            payload_url: url,
            payload_type: ty.into(),
            ..Default::default()
        };
        let ingest = ingest.clone();
        async move { lading_ingest::submit(&ingest, &s).await.unwrap() }
    };
    // Every transition this process commits, from before the first job moves: how many of
    // alice's jobs are in flight is counted at each change, not sampled.
    let mut events = w.engine.subscribe();
    let alice = submit("alice", alice_url, "single-file-batch-manifest").await;
    let run = w.run_all(&ingest);
    w.batch_reaches(&alice, &[BatchState::Processing]).await;
    let bob = submit("bob", bob_url, "file").await;
    let jobs = w.jobs_of(&alice).await;
    assert_eq!(jobs.len(), ALICE_JOBS);
    let mut states: std::collections::HashMap<String, String> = jobs
        .iter()
        .map(|j| (j.to_string(), "Pending".to_string()))
        .collect();
    let (mut most, mut bob_done_first) = (0, false);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let ev = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| panic!("alice's jobs stuck: {states:#?}"))
            .expect("no change event was missed");
        if ev.kind == "job" && states.contains_key(&ev.id) {
            assert_ne!(ev.to, "Failed", "{} failed: {:?}", ev.id, ev.message);
            states.insert(ev.id.clone(), ev.to.clone());
        }
        let done = states.values().filter(|s| *s == "Completed").count();
        let flying = states.len() - done - states.values().filter(|s| *s == "Pending").count();
        most = most.max(flying);
        if ev.kind == "batch" && ev.id == bob.as_str() && ev.to == "Completed" {
            bob_done_first = done < ALICE_JOBS;
        }
        if done == ALICE_JOBS {
            break;
        }
    }
    assert_eq!(most, 1, "alice never had more than one job in flight");
    assert!(bob_done_first, "bob's job was not held behind alice's");
    // Waiting costs nothing: a job over the quota is parked until a slot frees and woken
    // then, not looked at again every round (polling every 500 ms made about 30 waits here).
    let figures = ingest.stats.figures();
    let pending = figures.get("Pending").expect("the Pending stage ran");
    assert!(
        pending.waits >= 1,
        "a job over the quota waited in Pending: {figures:?}"
    );
    assert!(
        pending.waits <= 2 * ALICE_JOBS as u64,
        "parked jobs were polled: {figures:?}"
    );
    assert!(
        w.engine
            .tree()
            .children("/quota-waiters/quota/alice")
            .await
            .unwrap_or_default()
            .is_empty(),
        "no job is left parked"
    );
    w.completes(&alice).await;
    w.completes(&bob).await;
    run.stop().await;
    // Slots are given back lazily; cleanup gives back the rest and drops the empty folders,
    // whatever the batches' age (both batches are young and stay).
    let t = w.engine.tree();
    assert!(t.exists("/quotas/quota/alice").await.unwrap().is_some());
    let before = lading_engine::dump(t.as_ref(), "/batches").await.unwrap();
    let now = w.engine.clock().now_ms();
    let c = lading_ingest::cleanup::cleanup(&ingest, now, 3_600_000)
        .await
        .unwrap();
    assert_eq!(c.batches, 0);
    assert!(c.quotas >= 3, "{c:?}");
    assert!(t.exists("/quotas/quota").await.unwrap().is_none());
    assert_eq!(
        lading_engine::dump(t.as_ref(), "/batches").await.unwrap(),
        before,
        "the batches are as they were"
    );
    // A new reservation makes its folders again.
    let bob2 = submit("bob", w.file("bob2.bin", b"again").0, "file").await;
    let run = w.run_all(&ingest);
    w.completes(&bob2).await;
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_removes_an_uploaded_payload_with_its_batch_but_no_other_file() {
    let w = World::new().await;
    // As the server saves uploads: DATA_DIR/uploads/UUID/NAME.
    let up = std::path::absolute(w.cfg.data_dir.join("uploads/abc123")).unwrap();
    std::fs::create_dir_all(&up).unwrap();
    std::fs::write(up.join("u.bin"), b"uploaded").unwrap();
    let elsewhere = w.payload().join("local.bin");
    std::fs::write(&elsewhere, b"a local payload").unwrap();
    let ingest = w.ingest();
    let a = w
        .submit(
            &ingest,
            &format!("file://{}", up.join("u.bin").display()),
            "file",
        )
        .await;
    let b = w
        .submit(&ingest, &format!("file://{}", elsewhere.display()), "file")
        .await;
    let run = w.run_all(&ingest);
    w.completes(&a).await;
    w.completes(&b).await;
    run.stop().await;
    let now = w.engine.clock().now_ms();
    let gone = lading_ingest::cleanup::cleanup(&ingest, now + 3_600_001, 3_600_000)
        .await
        .unwrap();
    assert_eq!(gone.batches, 2);
    assert!(!up.exists(), "the upload went with its batch");
    assert!(elsewhere.exists(), "a payload that was not uploaded stays");
    assert!(w.cfg.data_dir.join("uploads").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_starting_removes_what_failed_stores_left_in_the_storage_root() {
    let w = World::new().await;
    let root = w.cfg.storage_root();
    // A stored object with a partial copy of a job that is gone, and an empty object folder.
    let kept = root.join("ark_99999_fk4kept");
    std::fs::create_dir_all(kept.join("v1/producer")).unwrap();
    std::fs::write(kept.join("v1/producer/a.txt"), b"stored").unwrap();
    std::fs::create_dir_all(kept.join(".tmp-jid0000000042/producer")).unwrap();
    std::fs::write(kept.join(".tmp-jid0000000042/producer/a.txt"), b"half").unwrap();
    std::fs::create_dir_all(root.join("ark_99999_fk4empty")).unwrap();
    let ingest = w.ingest();
    let run = w.run_all(&ingest);
    // The sweep runs before the stages start: a batch completing proves it has run.
    let (url, _) = w.file("x.bin", b"x");
    let bid = w.submit(&ingest, &url, "file").await;
    w.completes(&bid).await;
    run.stop().await;
    assert!(
        !kept.join(".tmp-jid0000000042").exists(),
        "the partial copy went"
    );
    assert!(
        !root.join("ark_99999_fk4empty").exists(),
        "the empty folder went"
    );
    assert_eq!(
        std::fs::read(kept.join("v1/producer/a.txt")).unwrap(),
        b"stored",
        "stored versions stay"
    );
}

/// Runs a test body on both backends: `NAME_on_sqlite` and `NAME_on_zookeeper`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod both_backends {
            use super::*;
            $(
                pub mod $name {
                    use super::*;
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn on_sqlite() {
                        super::super::$name(World::on(Backend::Sqlite).await).await;
                    }
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn on_zookeeper() {
                        super::super::$name(World::on(Backend::ZooKeeper).await).await;
                    }
                }
            )*
        }
    };
}

on_both_backends!(
    a_submitters_quota_keeps_its_jobs_waiting_while_others_go_ahead,
    a_job_that_changes_hosts_is_fetched_and_processed_again_where_it_goes,
);

/// Hosts with their own working folders share one storage root: a job downloaded on host A,
/// processed on host B and stored on A is fetched again on B (A's files are not there) and
/// processed again on A (B's processed copy is not there), and stores every file, verified.
async fn a_job_that_changes_hosts_is_fetched_and_processed_again_where_it_goes(w: World) {
    let files: [(&str, &[u8]); 2] = [("a.txt", b"first file"), ("dir/b.txt", b"second file")];
    let m = w.object_manifest("o.checkm", &files);
    let a = w.ingest();
    let b = w.other_host("host-b").await;
    assert_ne!(a.cfg.work_dir(), b.cfg.work_dir());
    let bid = w.submit(&a, &m, "manifest").await;
    let run = w.run_stages(&a, EARLY);
    let job = w.first_job(&bid).await;
    w.job_reaches(&job, JobState::Processing).await;
    run.stop().await;
    assert_eq!(w.server.gets("o.checkm.d/a.txt"), 1);
    // Host B processes: the downloads are on A, so B fetches the files itself.
    let run = w.run_stages(&b, &["processing"]);
    w.job_reaches(&job, JobState::Storing).await;
    run.stop().await;
    assert_eq!(w.server.gets("o.checkm.d/a.txt"), 2, "fetched again on B");
    assert_eq!(
        w.server.gets("o.checkm.d/dir/b.txt"),
        2,
        "fetched again on B"
    );
    assert!(
        b.cfg
            .work_dir()
            .join(job.as_str())
            .join("producer/dir/b.txt")
            .is_file()
    );
    // Host A stores: its folder holds the downloads but not B's processing, so A processes
    // again (from its own verified downloads, nothing fetched) before it stores.
    w.runs_to_completion(&a, &bid).await;
    assert_eq!(
        w.server.gets("o.checkm.d/a.txt"),
        2,
        "A's downloads were reused"
    );
    let v = w.stored(&job).await;
    let dir = std::path::Path::new(&v.path);
    assert_eq!(
        stored_files(dir),
        vec![
            "lading-version.json",
            "producer/a.txt",
            "producer/dir/b.txt",
            "system/manifest.checkm",
            "system/mrt-ingest-manifest.checkm",
        ]
    );
    for (name, bytes) in files {
        assert_eq!(
            std::fs::read(dir.join("producer").join(name)).unwrap(),
            bytes
        );
    }
    let versions = inventory::Inventory::new(w.cfg.inventory())
        .versions(&v.ark)
        .unwrap();
    assert_eq!(versions.len(), 1, "recorded once");
    // B's folder stays while the job exists; once cleanup (on A) removes the batch, B's sweep
    // removes it, but only once nothing touched it for the age asked (by default the
    // retention; zero here), and leaves alone what is not a job's.
    use lading_ingest::cleanup::sweep_work_dirs;
    use std::time::Duration;
    let (zero, hour) = (Duration::ZERO, Duration::from_secs(3600));
    let b_dir = b.cfg.work_dir().join(job.as_str());
    std::fs::create_dir_all(b.cfg.work_dir().join("not-a-job")).unwrap();
    assert_eq!(sweep_work_dirs(&b, zero).await.unwrap(), 0);
    assert!(b_dir.is_dir());
    let now = w.engine.clock().now_ms();
    let c = lading_ingest::cleanup::cleanup(&a, now + 1, 0)
        .await
        .unwrap();
    assert_eq!(c.batches, 1);
    assert!(!a.cfg.work_dir().join(job.as_str()).exists());
    assert_eq!(
        sweep_work_dirs(&b, hour).await.unwrap(),
        0,
        "touched within the hour"
    );
    assert!(b_dir.is_dir());
    assert_eq!(sweep_work_dirs(&b, zero).await.unwrap(), 1);
    assert!(!b_dir.exists());
    assert!(b.cfg.work_dir().join("not-a-job").is_dir());
}
