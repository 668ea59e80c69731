//! The pipeline commands: `worker`, `serve`, `submit`, `demo`. They wire a store, the
//! config and the stages of `lading-ingest` together, and handle signals.

use anyhow::Context;
use lading_core::layout::BatchId;
use lading_engine::Engine;
use lading_ingest::checkm::{self, ManifestKind};
use lading_ingest::{Config, Submission};
use lading_server::node;
use lading_server::payload_server::PayloadServer;
use lading_worker::Shutdown;
use std::path::Path;
use std::time::Duration;

/// `submit --wait` saw its batch end Failed (exit code 5).
#[derive(Debug, thiserror::Error)]
#[error("batch {0} ended Failed")]
pub struct BatchFailed(pub String);

/// SIGINT and SIGTERM, listened to from creation: a signal that arrives between two waits
/// is kept for the next one (a listener made afresh for the second wait could miss a second
/// signal sent right after the first was answered).
pub(crate) struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    /// Waits for the next SIGINT or SIGTERM.
    pub(crate) async fn next(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

/// Waits for SIGINT or SIGTERM (once).
pub(crate) async fn signal() {
    match Signals::new() {
        Ok(mut s) => s.next().await,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// How long a stopping process may spend after its grace period (releasing leases, closing
/// the store) before it exits anyway.
pub(crate) const STOP_MARGIN: Duration = Duration::from_millis(1500);

/// Ends the process after `after`, whatever it is waiting for (a store that cannot be
/// reached, a busy database): a stop always completes. Leases still held then end with the
/// store session, as after a crash; nothing committed is lost.
pub(crate) fn exit_after(after: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        say!(
            "lading: could not stop cleanly in time (is the store reachable?); exiting now, \
             held jobs are released when the store session ends"
        );
        std::process::exit(0);
    });
}

/// Runs `node` until SIGINT/SIGTERM: the first signal stops it (no new work, every loop
/// ends) and gives running handlers `grace` to finish; a second signal (or the end of the
/// grace) cuts them off and releases their jobs. Either way the store is closed cleanly.
pub async fn run_until_signal(
    mut node: lading_server::node::Node,
    grace: Duration,
    what: &str,
) -> anyhow::Result<()> {
    let mut signals = Signals::new()?;
    say!("lading: running {what} (stop with Ctrl-C)");
    tokio::select! {
        r = node.stages_ended() => {
            let j = node.join().await;
            r?;
            j?;
        }
        _ = signals.next() => {
            say!(
                "lading: stopping; running jobs get {} s to finish (signal again to stop now)",
                grace.as_secs()
            );
            // Whatever the store does, the process is gone by the end of the grace period
            // plus the margin.
            exit_after(grace + STOP_MARGIN);
            let aborter = node.aborter();
            let join = node.join();
            tokio::pin!(join);
            tokio::select! {
                r = &mut join => r?,
                _ = signals.next() => {
                    say!("lading: stopping now; running jobs are released in their stage");
                    exit_after(Duration::from_millis(500));
                    aborter.abort();
                    join.await?;
                }
                _ = tokio::time::sleep(grace) => {
                    say!("lading: grace period over; running jobs are released in their stage");
                    aborter.abort();
                    join.await?;
                }
            }
        }
    }
    say!("lading: stopped");
    Ok(())
}

/// Waits until `batch` ends, printing each batch and job change when `verbose`.
pub async fn wait_batch(engine: &Engine, batch: &BatchId, verbose: bool) -> anyhow::Result<()> {
    node::wait_batch_end(engine, batch, |ev| {
        if verbose {
            say!(
                "  {} {:<14} {} → {}",
                ev.kind,
                ev.id,
                ev.from.as_deref().unwrap_or("-"),
                ev.to
            );
        }
    })
    .await
}

/// Waits until `batch` ends, drawing its progress as `submit --wait --server` does: the
/// batch and its jobs are read again at each change this process sees and at least every
/// second (the workers may be other processes).
pub async fn wait_with_progress(engine: &Engine, batch: &BatchId) -> anyhow::Result<()> {
    let mut p = crate::progress::StageProgress::new();
    let mut events = engine.subscribe();
    loop {
        let info = engine.batch(batch).await?;
        p.batch_state = info.status.status.name().to_string();
        for (folder, ids) in &info.jobs {
            for j in ids {
                let st = match folder.as_str() {
                    "batch-completed" => "Completed".to_string(),
                    "batch-failed" => "Failed".to_string(),
                    "batch-deleted" => "Deleted".to_string(),
                    _ => match lading_core::layout::JobId::parse(j) {
                        Ok(jid) => match engine.job(&jid).await {
                            Ok(job) => job.status.status.name().to_string(),
                            Err(_) => continue,
                        },
                        Err(_) => continue,
                    },
                };
                p.jobs.insert(j.clone(), st);
            }
        }
        p.draw();
        if matches!(
            info.status.status,
            lading_core::BatchState::Completed
                | lading_core::BatchState::Failed
                | lading_core::BatchState::Deleted
        ) {
            p.finish();
            return Ok(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), events.recv()).await;
    }
}

/// Prints a batch's outcome: state, message, and each job with its identifier and message.
pub async fn print_report(engine: &Engine, batch: &BatchId) -> anyhow::Result<()> {
    let info = serde_json::to_value(engine.batch(batch).await?)?;
    let mut jobs = Vec::new();
    for j in report_job_ids(&info) {
        jobs.push(serde_json::to_value(
            engine.job(&lading_core::layout::JobId::parse(&j)?).await?,
        )?);
    }
    print!("{}", report_text(&info, &jobs));
    Ok(())
}

/// The ids of a batch's jobs (the batch as the API shows it), sorted.
pub fn report_job_ids(batch: &serde_json::Value) -> Vec<String> {
    let mut ids: Vec<String> = batch["jobs"]
        .as_object()
        .into_iter()
        .flatten()
        .flat_map(|(_, l)| l.as_array().cloned().unwrap_or_default())
        .filter_map(|j| j.as_str().map(str::to_string))
        .collect();
    ids.sort();
    ids
}

/// The report `submit --wait` ends with, from the batch and its jobs as the API shows them
/// (the same for a local store and a server).
pub fn report_text(batch: &serde_json::Value, jobs: &[serde_json::Value]) -> String {
    let mut out = format!(
        "batch {}: {}{}\n",
        batch["id"].as_str().unwrap_or("?"),
        batch["status"]["status"].as_str().unwrap_or("?"),
        batch["status"]["message"]
            .as_str()
            .filter(|m| !m.is_empty())
            .map(|m| format!(" ({m})"))
            .unwrap_or_default()
    );
    for job in jobs {
        out.push_str(&format!(
            "  {}  {:<10} {}  {}\n",
            job["id"].as_str().unwrap_or("?"),
            job["status"]["status"].as_str().unwrap_or("?"),
            job["identifiers"]["primary_id"]
                .as_str()
                .filter(|s| !s.is_empty())
                .unwrap_or("-"),
            job["status"]["message"].as_str().unwrap_or_default()
        ));
    }
    out
}

pub fn submission(
    payload: String,
    profile: String,
    payload_type: String,
    submitter: Option<String>,
    title: Option<String>,
) -> Submission {
    Submission {
        profile,
        submitter: submitter.unwrap_or_else(|| std::env::var("USER").unwrap_or("lading".into())),
        payload_url: payload,
        payload_type,
        title,
        ..Default::default()
    }
}

/// `lading demo`: a manifest of manifests served from loopback, through every stage, on a
/// fresh embedded store in `dir`.
pub async fn demo(dir: &Path, objects: usize, files: usize) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let payload = dir.join("payload");
    std::fs::create_dir_all(&payload)?;
    let server = PayloadServer::start(&payload).await?;
    let cfg = Config {
        data_dir: dir.join("data"),
        provisioning_round_ms: 500,
        unestimated_min_free_bytes: 0,
        reserve_bytes: 0,
        ..Config::default()
    };
    std::fs::create_dir_all(cfg.profiles_dir())?;
    std::fs::write(
        cfg.profiles_dir().join("demo.toml"),
        format!(
            "collection = \"demo\"\ncallback_url = \"{}\"\ncommand = \"ls -R producer | wc -l\"\n",
            server.callback_url()
        ),
    )?;
    // The depositor's content: `objects` objects of `files` files each.
    let mut batch_rows = Vec::new();
    for o in 0..objects {
        let mut rows = Vec::new();
        for f in 0..files {
            let name = format!("obj{o}/file{f}.txt");
            let body = format!("object {o}, file {f}\n").repeat(100 * (f + 1));
            std::fs::create_dir_all(payload.join(format!("obj{o}")))?;
            std::fs::write(payload.join(&name), &body)?;
            let mut h = lading_ingest::fetch::Hasher::new(checkm::HashAlg::Sha256);
            h.update(body.as_bytes());
            rows.push(vec![
                server.url(&name),
                "sha256".into(),
                h.hex(),
                body.len().to_string(),
                format!("file{f}.txt"),
            ]);
        }
        let m = checkm::write(ManifestKind::Object, checkm::OBJECT_FIELDS, &rows);
        std::fs::write(payload.join(format!("obj{o}.checkm")), m)?;
        batch_rows.push(vec![
            server.url(&format!("obj{o}.checkm")),
            format!("demo-{o}"),
            format!("Demo object {o}"),
        ]);
    }
    let batch = checkm::write(
        ManifestKind::Batch,
        &[checkm::FILE_URL, checkm::LOCAL_ID, checkm::TITLE],
        &batch_rows,
    );
    std::fs::write(payload.join("batch.checkm"), batch)?;
    let store = format!("sqlite:{}", dir.join("lading.db").display());
    let ingest = node::ingest(&store, cfg.clone()).await?;
    let url = server.url("batch.checkm");
    println!("payload served at {url}");
    let bid = lading_ingest::submit(
        &ingest,
        &Submission {
            profile: "demo".into(),
            submitter: "demo".into(),
            payload_url: url,
            payload_type: "batch-manifest".into(),
            title: Some("Lading demo".into()),
            ..Default::default()
        },
    )
    .await?;
    println!("submitted batch {bid} ({objects} objects of {files} files)");
    let (handle, shutdown) = Shutdown::new();
    let i = ingest.clone();
    let task =
        tokio::spawn(
            async move { lading_ingest::run(&i, lading_ingest::STAGE_NAMES, shutdown).await },
        );
    wait_batch(&ingest.engine, &bid, true).await?;
    handle.stop();
    let stats = task.await?.map_err(anyhow::Error::msg)?;
    print_report(&ingest.engine, &bid).await?;
    println!("\nper stage (handler time):");
    let figures = stats.figures();
    let order = std::iter::once("Intake")
        .chain(crate::progress::STAGES)
        .chain(["Reporting"]);
    for (stage, f) in order.filter_map(|s| figures.get(s).map(|f| (s, f))) {
        println!(
            "  {stage:<14} done {:>3}  p50 {:>7.2} ms  max {:>7.2} ms",
            f.done, f.p50_ms, f.max_ms
        );
    }
    println!(
        "\nstored objects: {}\ninventory: {}\ncallbacks received: {}\nstore: {store} (try `lading --store {store} dump /batches`)",
        cfg.storage_root().display(),
        cfg.inventory(),
        server.callbacks().len()
    );
    ingest.engine.tree().close().await?;
    Ok(())
}
