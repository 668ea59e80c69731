//! The pipeline end to end on real parts: a SQLite store, an HTTP payload server and callback
//! receiver, an SMTP receiver, the file system for working and storage, a SQLite inventory.

#[macro_use]
mod common;

use common::*;
use lading_core::{BatchState, JobState};
use lading_ingest::checkm::{self, ManifestKind};
use lading_ingest::{Submission, SubmitError, inventory};

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
        let ark = info.identifiers.primary_id.clone().unwrap();
        assert!(ark.starts_with("ark:/99999/fk4"), "minted: {ark}");
        let local = info.identifiers.local_id[0].clone();
        assert!(local.starts_with("local-"));
        assert!(info.metadata.get("erc_what").is_some());
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
    assert_eq!(
        sub.typed().unwrap().payload_url.as_deref(),
        Some(url.as_str())
    );
    assert_eq!(sub.raw()["payload_url"], url.as_str(), "stored as given");
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
    assert_eq!(info.metadata.get("erc_who"), Some("Doe, Jane"), "{info:?}");
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
