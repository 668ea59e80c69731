//! Outside effects under crashes, with real processes: `lading worker` processes sharing one
//! SQLite store are SIGKILLed while an SMTP receiver holds back its final `250` and while a
//! callback receiver holds back its answer; every repeat carries the key of the first try.
//! Also: a store that fills the storage disk (a real, small tmpfs) leaves no partial copy, and
//! a batch whose last job another tool moved is reported within seconds.

mod common;

use common::{Reap, Setup, engine, until};
use lading_core::BatchState;
use lading_core::layout::{BatchId, JobId};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);

/// A [`Setup`] whose outbox retries come quickly.
fn setup(profile: &str, extra: &str) -> Setup {
    common::setup(
        profile,
        &format!(
            "{extra}\n[stages.outbox]\nmax_attempts = 100\nbackoff_base_ms = 100\nbackoff_max_ms = 300\n"
        ),
    )
}

impl Setup {
    fn workers(&self, n: usize) -> Vec<Reap> {
        (0..n)
            .map(|_| {
                Reap(
                    self.cmd(&["worker", "--grace-s", "1"])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("start a worker"),
                )
            })
            .collect()
    }

    /// Submits files as a single-file batch manifest; returns the batch id.
    fn submit_files(&self, n: usize, bytes: usize) -> BatchId {
        let payload = self.dir.path().join("payload");
        std::fs::create_dir_all(&payload).unwrap();
        let mut rows = String::new();
        for i in 0..n {
            let f = payload.join(format!("f{i}-{bytes}.bin"));
            std::fs::write(&f, vec![b'a' + (i % 26) as u8; bytes]).unwrap();
            rows.push_str(&format!("file://{}\n", f.display()));
        }
        let manifest = payload.join(format!("batch-{n}-{bytes}.checkm"));
        std::fs::write(
            &manifest,
            format!(
                "#%checkm_0.7\n#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-single-file-batch-manifest\n#%fields | nfo:fileUrl\n{rows}#%eof\n"
            ),
        )
        .unwrap();
        let o = self
            .cmd(&[
                "submit",
                &format!("file://{}", manifest.display()),
                "--profile",
                "demo",
                "--type",
                "single-file-batch-manifest",
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        BatchId::parse(String::from_utf8_lossy(&o.stdout).trim()).unwrap()
    }
}

/// What a receiver got: each delivery, and a signal per delivery it holds back.
struct Received {
    items: Arc<Mutex<Vec<String>>>,
    held: mpsc::Receiver<()>,
}

/// A receiver's record, shared by its connections.
#[derive(Clone)]
struct Log {
    items: Arc<Mutex<Vec<String>>>,
    held: mpsc::Sender<()>,
    /// Deliveries still to hold back.
    left: Arc<AtomicUsize>,
}

impl Log {
    /// Records a delivery; true when it is to be held back (no answer; signalled).
    fn take(&self, item: String) -> bool {
        self.items.lock().unwrap().push(item);
        let hold = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if hold {
            let _ = self.held.send(());
        }
        hold
    }
}

/// A receiver on a free loopback port: `serve` runs each connection in a thread of its own.
fn receiver(hold: usize, serve: fn(TcpStream, &Log)) -> (std::net::SocketAddr, Received) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let items = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let log = Log {
        items: items.clone(),
        held: tx,
        left: Arc::new(AtomicUsize::new(hold)),
    };
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let log = log.clone();
            std::thread::spawn(move || serve(s, &log));
        }
    });
    (addr, Received { items, held: rx })
}

/// An HTTP callback receiver. For the first `hold` calls it reads the whole request,
/// records it, signals, and never answers; later ones get 200. Each record is
/// `HEADER-KEY\tBODY`.
fn callback_receiver(hold: usize) -> (String, Received) {
    let (addr, got) = receiver(hold, |s, log| {
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        loop {
            let (mut key, mut len) = (String::new(), 0usize);
            let mut line = String::new();
            loop {
                line.clear();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                if line == "\r\n" {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                if lower.starts_with("idempotency-key:") {
                    key = line["idempotency-key:".len()..].trim().to_string();
                }
            }
            let mut body = vec![0; len.min(1 << 20)];
            if r.read_exact(&mut body).is_err() {
                return;
            }
            if log.take(format!("{key}\t{}", String::from_utf8_lossy(&body))) {
                let _ = r.read_line(&mut line);
                return;
            }
            if w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .is_err()
            {
                return;
            }
        }
    });
    (format!("http://{addr}/callback"), got)
}

fn message_id(mail: &str) -> String {
    mail.lines()
        .find_map(|l| {
            l.strip_prefix("Message-ID: ")
                .or_else(|| l.strip_prefix("Message-Id: "))
        })
        .unwrap_or_else(|| panic!("no Message-ID in {mail}"))
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_mail_resent_after_workers_die_before_the_250_keeps_its_message_id() {
    let smtp = lading_testkit::smtp::Smtp::start_holding(2).await;
    let port = smtp.port;
    let s = setup(
        "notification = [\"depositor@example.org\"]\n",
        &format!(
            "smtp_host = \"127.0.0.1\"\nsmtp_port = {port}\nmail_from = \"lading@example.org\""
        ),
    );
    let mut workers = s.workers(2);
    let bid = s.submit_files(2, 100);
    // Twice: the receiver has the whole mail and holds back its 250; every worker is
    // killed, and new ones start.
    let mut mails = Vec::new();
    for _ in 0..2 {
        mails.push(smtp.next().await);
        workers.clear();
        workers = s.workers(2);
    }
    // The third try is accepted.
    mails.push(smtp.next().await);
    let e = engine(&s.db).await;
    until("the outbox to empty", async || {
        e.outbox().await.unwrap().is_empty()
    })
    .await;
    let info = e.batch(&bid).await.unwrap();
    assert_eq!(info.status.status, BatchState::Completed);
    let report = info.status_report.unwrap();
    assert_eq!(report.extra["report_number"], 1, "one report");
    assert!(
        smtp.messages.lock().await.try_recv().is_err(),
        "two tries cut off, one delivered, nothing after: {mails:?}"
    );
    let ids: std::collections::BTreeSet<String> = mails.iter().map(|m| message_id(m)).collect();
    assert_eq!(ids.len(), 1, "one report, one Message-ID: {ids:?}");
    let id = ids.into_iter().next().unwrap();
    let uuid = info.submission.typed().unwrap().merritt_batch_id().unwrap();
    assert_eq!(id, format!("<lading.{uuid}.report-1@example.org>"));
    assert!(mails.iter().all(|m| m.contains("2 completed, 0 failed")));
    eprintln!("{} deliveries of one report, all {id}", mails.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_resent_after_workers_die_mid_call_keep_their_idempotency_key() {
    let (url, got) = callback_receiver(2);
    let s = setup(&format!("callback_url = \"{url}\"\n"), "");
    let mut workers = s.workers(2);
    let bid = s.submit_files(5, 100);
    for _ in 0..2 {
        got.held
            .recv_timeout(WAIT)
            .expect("a callback held at the receiver");
        workers.clear();
        workers = s.workers(2);
    }
    let e = engine(&s.db).await;
    until(
        "every job and the batch to complete, and the outbox to empty",
        async || {
            e.batch(&bid).await.unwrap().status.status == BatchState::Completed
                && e.outbox().await.unwrap().is_empty()
        },
    )
    .await;
    let info = e.batch(&bid).await.unwrap();
    let uuid = info
        .submission
        .typed()
        .unwrap()
        .merritt_batch_id()
        .unwrap()
        .to_string();
    let jobs: Vec<JobId> = info.jobs["batch-completed"].clone();
    assert_eq!(jobs.len(), 5);
    let calls = got.items.lock().unwrap().clone();
    assert!(
        calls.len() >= 7,
        "five outcomes, two of them cut off: {calls:?}"
    );
    let mut per_key: std::collections::BTreeMap<String, usize> = Default::default();
    for c in &calls {
        let (key, body) = c.split_once('\t').unwrap();
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["idempotency_key"], key, "header and body agree");
        assert_eq!(body["status"], "Completed");
        *per_key.entry(key.to_string()).or_default() += 1;
    }
    let want: std::collections::BTreeSet<String> = jobs
        .iter()
        .map(|j| format!("lading:{uuid}:{j}:completed:1"))
        .collect();
    assert_eq!(
        per_key
            .keys()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
        want,
        "one key per job outcome, each stored once (version 1)"
    );
    assert!(
        per_key.values().filter(|n| **n >= 2).count() >= 1,
        "a held call was sent again with its key: {per_key:?}"
    );
    eprintln!("callback deliveries per key: {per_key:?}");
    drop(workers);
}

/// Runs `lading worker` in a mount namespace of its own in which the storage root is a
/// tmpfs of `size`. `None` when this machine allows no such namespace.
fn worker_with_small_storage(s: &Setup, storage: &Path, size: &str) -> Option<Reap> {
    let probe = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "true"])
        .status();
    let as_root = unsafe { libc::geteuid() } == 0;
    let mut c = if as_root {
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private"]);
        c
    } else if matches!(probe, Ok(st) if st.success()) {
        let mut c = Command::new("unshare");
        c.args(["--user", "--map-root-user", "--mount"]);
        c
    } else {
        return None;
    };
    let lading = s.cmd(&["worker", "--grace-s", "1"]);
    let args: Vec<String> = std::iter::once(lading.get_program())
        .chain(lading.get_args())
        .map(|a| format!("'{}'", a.to_string_lossy()))
        .collect();
    c.args([
        "sh",
        "-c",
        &format!(
            "mount -t tmpfs -o size={size} tmpfs '{}' && exec {}",
            storage.display(),
            args.join(" ")
        ),
    ])
    .env_remove("LADING_STORE")
    .env_remove("LADING_CONFIG")
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    Some(Reap(c.spawn().ok()?))
}

/// Every entry under `dir` (through the worker's own view of its mounts).
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_fills_the_disk_leaves_nothing_behind() {
    let storage = tempfile::tempdir().unwrap();
    let s = setup(
        "",
        &format!(
            "storage_root = \"{}\"\n[stages.storing]\nmax_attempts = 2\nbackoff_base_ms = 100\nbackoff_max_ms = 100",
            storage.path().display()
        ),
    );
    let Some(w) = worker_with_small_storage(&s, storage.path(), "1m") else {
        eprintln!("SKIPPED: this machine allows no mount namespace for a small storage disk");
        return;
    };
    // The worker's view of the storage root: its tmpfs.
    let root = PathBuf::from(format!(
        "/proc/{}/root{}",
        w.0.id(),
        storage.path().display()
    ));
    let e = engine(&s.db).await;
    let done = async |bid: &BatchId| {
        let st = e.batch(bid).await.unwrap().status.status;
        matches!(st, BatchState::Completed | BatchState::Failed)
    };
    // 600 KiB fit in 1 MiB; a second 600 KiB do not.
    let first = s.submit_files(1, 600 << 10);
    until("the first batch", async || done(&first).await).await;
    assert_eq!(
        e.batch(&first).await.unwrap().status.status,
        BatchState::Completed
    );
    let before = listing(&root);
    assert!(!before.is_empty(), "the worker stores on its tmpfs");
    let second = s.submit_files(1, 601 << 10);
    until("the second batch", async || done(&second).await).await;
    let info = e.batch(&second).await.unwrap();
    assert_eq!(info.status.status, BatchState::Failed);
    let job = info.jobs["batch-failed"][0].clone();
    let st = e.job(&job).await.unwrap().status;
    assert_eq!(lading_engine::failed_stage(&st), Some("Storing"));
    // No partial copy, no empty object folder: the storage root is as the first left it.
    assert_eq!(listing(&root), before, "debris in the storage root");
    eprintln!(
        "after the failed store, the storage root holds {before:?}; failure: {:?}",
        st.message
    );
    // Its space is free again: 300 KiB more fit.
    let third = s.submit_files(1, 300 << 10);
    until("the third batch", async || done(&third).await).await;
    assert_eq!(
        e.batch(&third).await.unwrap().status.status,
        BatchState::Completed
    );
    drop(w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_trees_sharing_a_data_folder_never_mix_working_files() {
    let a = setup("", "");
    // Another tree (its own store), the same config and data folder: its first job has the
    // same id as the first tree's.
    let b = Setup {
        dir: a.dir.clone(),
        db: a.dir.path().join("other.db"),
        config: a.config.clone(),
        env: a.env.clone(),
    };
    let stored_files = async |s: &Setup, bid: &BatchId| {
        let e = engine(&s.db).await;
        until("the batch", async || {
            e.batch(bid).await.unwrap().status.status == BatchState::Completed
        })
        .await;
        let job = e.batch(bid).await.unwrap().jobs["batch-completed"][0].clone();
        let node = e
            .tree()
            .get(&lading_core::layout::job_node(&job, "store"))
            .await
            .unwrap()
            .expect("a store record");
        let store: serde_json::Value = serde_json::from_slice(&node.data.unwrap()).unwrap();
        let path = store["path"].as_str().unwrap().to_string();
        (job, listing(&Path::new(&path).join("producer")))
    };
    let first = a.submit_files(1, 100);
    let w = a.workers(1);
    let (ja, fa) = stored_files(&a, &first).await;
    drop(w);
    let second = b.submit_files(1, 200);
    let w = b.workers(1);
    let (jb, fb) = stored_files(&b, &second).await;
    drop(w);
    assert_eq!(ja, jb, "the same job id in both trees");
    assert_eq!(fa, vec!["f0-100.bin".to_string()]);
    assert_eq!(
        fb,
        vec!["f0-200.bin".to_string()],
        "no file of the other tree's job"
    );
    // The other job's folder was moved aside, not used and not deleted.
    let work = a.dir.path().join("data/work");
    let names: Vec<String> = std::fs::read_dir(&work)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with(&format!("{ja}.other-"))),
        "{names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_one_at_a_time_give_the_depositor_one_update() {
    let smtp = lading_testkit::smtp::Smtp::start().await;
    let port = smtp.port;
    let s = setup(
        "notification = [\"depositor@example.org\"]\n",
        &format!(
            "smtp_host = \"127.0.0.1\"\nsmtp_port = {port}\nmail_from = \"lading@example.org\"\nreport_settle_s = 3"
        ),
    );
    let _workers = s.workers(1);
    // Ten files, eight of them missing: the batch ends Failed, 8 of 10 failed.
    let payload = s.dir.path().join("payload");
    std::fs::create_dir_all(&payload).unwrap();
    let files: Vec<PathBuf> = (0..10).map(|i| payload.join(format!("f{i}.txt"))).collect();
    for f in &files[..2] {
        std::fs::write(f, b"here\n").unwrap();
    }
    let rows: String = files
        .iter()
        .map(|f| format!("file://{}\n", f.display()))
        .collect();
    let manifest = payload.join("batch.checkm");
    std::fs::write(
        &manifest,
        format!(
            "#%checkm_0.7\n#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-single-file-batch-manifest\n#%fields | nfo:fileUrl\n{rows}#%eof\n"
        ),
    )
    .unwrap();
    let o = s
        .cmd(&[
            "submit",
            &format!("file://{}", manifest.display()),
            "--profile",
            "demo",
            "--type",
            "single-file-batch-manifest",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bid = BatchId::parse(String::from_utf8_lossy(&o.stdout).trim()).unwrap();
    let first = smtp.next().await;
    assert!(first.contains("2 completed, 8 failed"), "{first}");
    let e = engine(&s.db).await;
    let info = e.batch(&bid).await.unwrap();
    assert_eq!(info.status.status, BatchState::Failed);
    let failed: Vec<JobId> = info.jobs["batch-failed"].clone();
    assert_eq!(failed.len(), 8);
    // The space is back: the files are there now. An operator's loop requeues the jobs one
    // at a time, each well after the one before has completed.
    for f in &files[2..] {
        std::fs::write(f, b"here now\n").unwrap();
    }
    for jid in &failed {
        let o = s
            .cmd(&["admin", "job", "requeue", jid.as_str()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let j = jid.clone();
        until("the requeued job to complete", async || {
            e.job(&j).await.unwrap().status.status == lading_core::JobState::Completed
        })
        .await;
    }
    until("the batch to be reported again", async || {
        let info = e.batch(&bid).await.unwrap();
        info.status.status == BatchState::Completed && e.outbox().await.unwrap().is_empty()
    })
    .await;
    let update = smtp.next().await;
    assert!(update.contains("10 completed, 0 failed"), "{update}");
    let report = e.batch(&bid).await.unwrap().status_report.unwrap();
    assert_eq!(report.extra["report_number"], 2, "one update");
    // The batch is Completed and its outbox empty: no mail can still be on its way.
    assert!(
        smtp.messages.lock().await.try_recv().is_err(),
        "no report in the middle"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_and_a_failing_receiver_send_each_attempt_once_and_deliver_after_the_fix() {
    // A receiver answering 500 until it is fixed, then 200; it records each call's key
    // and time.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/callback", l.local_addr().unwrap());
    let fixed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let calls: Arc<Mutex<Vec<(String, std::time::Instant, u16)>>> = Arc::default();
    {
        let (fixed, calls) = (fixed.clone(), calls.clone());
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let (fixed, calls) = (fixed.clone(), calls.clone());
                std::thread::spawn(move || {
                    let mut w = s.try_clone().unwrap();
                    let mut r = BufReader::new(s);
                    loop {
                        let (mut key, mut len, mut line) = (String::new(), 0usize, String::new());
                        loop {
                            line.clear();
                            if r.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if line == "\r\n" {
                                break;
                            }
                            let lower = line.to_ascii_lowercase();
                            if let Some(v) = lower.strip_prefix("content-length:") {
                                len = v.trim().parse().unwrap_or(0);
                            }
                            if lower.starts_with("idempotency-key:") {
                                key = line["idempotency-key:".len()..].trim().to_string();
                            }
                        }
                        let mut body = vec![0; len.min(1 << 20)];
                        if r.read_exact(&mut body).is_err() {
                            return;
                        }
                        let status = if fixed.load(Ordering::SeqCst) {
                            200
                        } else {
                            500
                        };
                        calls
                            .lock()
                            .unwrap()
                            .push((key, std::time::Instant::now(), status));
                        let answer = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                        if w.write_all(answer.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }
    let s = setup(&format!("callback_url = \"{url}\"\n"), "");
    let _workers = s.workers(2);
    let bid = s.submit_files(4, 100);
    let e = engine(&s.db).await;
    until("several failed attempts", async || {
        calls.lock().unwrap().len() >= 12
    })
    .await;
    fixed.store(true, Ordering::SeqCst);
    until("the outbox to empty after the fix", async || {
        e.batch(&bid).await.unwrap().status.status == BatchState::Completed
            && e.outbox().await.unwrap().is_empty()
    })
    .await;
    let calls = calls.lock().unwrap().clone();
    let mut per_key: std::collections::BTreeMap<&str, Vec<(std::time::Instant, u16)>> =
        Default::default();
    for (k, t, st) in &calls {
        per_key.entry(k.as_str()).or_default().push((*t, *st));
    }
    assert_eq!(per_key.len(), 4, "one key per job outcome: {per_key:?}");
    for (k, tries) in &per_key {
        assert!(
            tries.iter().any(|(_, st)| *st == 200),
            "{k} was delivered after the fix: {tries:?}"
        );
        // Each attempt is sent once: two sends of one attempt (a double claim) would come
        // within milliseconds; the backoff between attempts is at least 50 ms.
        for w in tries.windows(2) {
            let gap = w[1].0 - w[0].0;
            assert!(
                gap >= Duration::from_millis(40),
                "{k}: two sends {gap:?} apart: {tries:?}"
            );
        }
    }
    eprintln!(
        "callback sends per key: {:?}",
        per_key.values().map(Vec::len).collect::<Vec<_>>()
    );
}
