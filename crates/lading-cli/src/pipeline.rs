//! The pipeline commands: `worker`, `serve`, `submit`, `demo`. They wire a store, the
//! config and the stages of `lading-ingest` together, and handle signals.

use anyhow::Context;
use lading_core::BatchState;
use lading_core::layout::BatchId;
use lading_core::time::system_clock;
use lading_engine::Engine;
use lading_ingest::checkm::{self, ManifestKind};
use lading_ingest::payload_server::PayloadServer;
use lading_ingest::{Config, Ingest, Submission};
use lading_worker::Shutdown;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Loads the config (file and environment); warns when a config that holds tokens can be
/// read by other users.
pub fn config(path: Option<&Path>) -> anyhow::Result<Config> {
    let cfg = Config::load(path)?;
    cfg.storage_umask_bits().map_err(anyhow::Error::msg)?;
    if let Some(p) = path
        && !cfg.tokens.is_empty()
        && let Ok(m) = std::fs::metadata(p)
    {
        use std::os::unix::fs::PermissionsExt;
        if m.permissions().mode() & 0o077 != 0 {
            let msg = format!(
                "{} holds API tokens but other users may read it (mode {:o}); chmod 600 it",
                p.display(),
                m.permissions().mode() & 0o777
            );
            eprintln!("lading: warning: {msg}");
            tracing::warn!("{msg}");
        }
    }
    Ok(cfg)
}

pub async fn ingest(store: &str, cfg: Config) -> anyhow::Result<Arc<Ingest>> {
    let tree = crate::open_store(store).await?;
    let engine = Arc::new(Engine::new(
        tree,
        system_clock(),
        lading_store_sqlite::default_owner(),
    ));
    engine.init().await?;
    std::fs::create_dir_all(cfg.work_dir())
        .with_context(|| format!("creating {}", cfg.work_dir().display()))?;
    Ingest::try_new(engine, cfg).map_err(anyhow::Error::msg)
}

/// Waits for SIGINT or SIGTERM.
pub(crate) async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(mut i), Ok(mut t)) => {
                tokio::select! {
                    _ = i.recv() => {}
                    _ = t.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
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
        eprintln!(
            "lading: could not stop cleanly in time (is the store reachable?); exiting now, \
             held jobs are released when the store session ends"
        );
        std::process::exit(0);
    });
}

/// Runs `stages` until SIGINT/SIGTERM: the first signal stops acquisition and gives running
/// handlers `grace` to finish; a second signal (or the end of the grace) cuts them off and
/// releases their jobs. Either way the store is closed cleanly. `on_stop` runs at the first
/// signal (to stop whatever else the process serves).
pub async fn run_until_signal(
    ingest: &Arc<Ingest>,
    stages: &[&str],
    grace: Duration,
    on_stop: impl FnOnce(),
) -> anyhow::Result<()> {
    lading_ingest::stages(ingest, stages).map_err(anyhow::Error::msg)?;
    let (handle, shutdown) = Shutdown::new();
    let i = ingest.clone();
    let names: Vec<String> = stages.iter().map(|s| s.to_string()).collect();
    let mut task = tokio::spawn(async move {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        lading_ingest::run(&i, &names, shutdown).await
    });
    eprintln!(
        "lading: running {} (stop with Ctrl-C)",
        if stages.len() == lading_ingest::STAGE_NAMES.len() {
            "every stage".to_string()
        } else {
            stages.join(", ")
        }
    );
    tokio::select! {
        r = &mut task => { r?.map_err(anyhow::Error::msg)?; }
        _ = signal() => {
            eprintln!(
                "lading: stopping; running jobs get {} s to finish (signal again to stop now)",
                grace.as_secs()
            );
            // Whatever the store does, the process is gone by the end of the grace period
            // plus the margin.
            exit_after(grace + STOP_MARGIN);
            on_stop();
            handle.stop();
            tokio::select! {
                r = &mut task => { r?.map_err(anyhow::Error::msg)?; }
                _ = signal() => {
                    eprintln!("lading: stopping now; running jobs are released in their stage");
                    exit_after(Duration::from_millis(500));
                    handle.abort();
                    task.await?.map_err(anyhow::Error::msg)?;
                }
                _ = tokio::time::sleep(grace) => {
                    eprintln!("lading: grace period over; running jobs are released in their stage");
                    handle.abort();
                    task.await?.map_err(anyhow::Error::msg)?;
                }
            }
        }
    }
    ingest.engine.tree().close().await?;
    eprintln!("lading: stopped");
    Ok(())
}

/// Waits until `batch` is Completed or Failed, printing each batch and job change (from
/// this process's events, with a slow re-read for other processes' changes).
pub async fn wait_batch(engine: &Engine, batch: &BatchId, verbose: bool) -> anyhow::Result<()> {
    let mut events = engine.subscribe();
    loop {
        let info = engine.batch(batch).await?;
        if matches!(
            info.status.status,
            BatchState::Completed | BatchState::Failed | BatchState::Deleted
        ) {
            return Ok(());
        }
        if let Ok(Ok(ev)) = tokio::time::timeout(Duration::from_secs(1), events.recv()).await
            && verbose
            && (ev.kind == "batch" && ev.id == batch.as_str()
                || ev.batch.as_deref() == Some(batch.as_str()))
        {
            eprintln!(
                "  {} {:<14} {} → {}",
                ev.kind,
                ev.id,
                ev.from.as_deref().unwrap_or("-"),
                ev.to
            );
        }
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
    let ingest = ingest(&store, cfg.clone()).await?;
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
    let order = [
        "Intake",
        "Pending",
        "Estimating",
        "Provisioning",
        "Downloading",
        "Processing",
        "Storing",
        "Recording",
        "Notify",
        "Reporting",
    ];
    for (stage, f) in order.iter().filter_map(|s| figures.get(*s).map(|f| (s, f))) {
        println!(
            "  {stage:<14} done {:>3}  p50 {:>7.2} ms  max {:>7.2} ms",
            f.done, f.p50_ms, f.max_ms
        );
    }
    println!(
        "\nstored objects: {}\ninventory: {}\ncallbacks received: {}\nstore: {store} (try `lading --store {store} dump /batches`)",
        cfg.storage_root().display(),
        cfg.inventory().display(),
        server.callbacks().len()
    );
    ingest.engine.tree().close().await?;
    Ok(())
}

/// Figures of one `lading bench pipeline` run.
#[derive(Debug, serde::Serialize)]
pub struct PipelineFigures {
    pub objects: usize,
    pub files_per_object: usize,
    pub file_bytes: u64,
    pub completed: usize,
    pub failed: usize,
    pub seconds: f64,
    pub objects_per_s: f64,
    pub mb_per_s: f64,
    /// One job's bytes over its median handler time in the stage: the speed of one stream.
    pub download_stream_mb_s: f64,
    pub store_stream_mb_s: f64,
    /// `std::fs::copy` of one object's worth of bytes plus fsync, in the same directory.
    pub disk_copy_mb_s: f64,
    /// CPU time of this process while measured: user and system (kernel) seconds.
    pub cpu_user_s: f64,
    pub cpu_system_s: f64,
    pub stages: std::collections::BTreeMap<String, lading_worker::StageFigures>,
}

/// Deterministic filler: cheap to make, not all zeros (so nothing compresses it away).
fn filler(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

fn disk_copy_mb_s(dir: &Path, bytes: u64) -> anyhow::Result<f64> {
    use std::io::Write;
    let src = dir.join(".copy-probe-src");
    let dst = dir.join(".copy-probe-dst");
    {
        let mut f = std::fs::File::create(&src)?;
        let block = filler(1 << 20, 42);
        let mut left = bytes;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            f.write_all(&block[..n])?;
            left -= n as u64;
        }
        f.sync_all()?;
    }
    let start = std::time::Instant::now();
    std::fs::copy(&src, &dst)?;
    std::fs::File::open(&dst)?.sync_all()?;
    let secs = start.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&dst);
    Ok(bytes as f64 / 1e6 / secs.max(1e-9))
}

/// `lading bench pipeline`: `objects` objects of `files` files of `file_bytes` each, served
/// from loopback, through every stage on `store`, in one process.
pub async fn bench(
    store: &str,
    dir: &Path,
    objects: usize,
    files: usize,
    file_bytes: u64,
    concurrency: usize,
) -> anyhow::Result<PipelineFigures> {
    let payload = dir.join("payload");
    std::fs::create_dir_all(&payload)?;
    // One folder per object here too: spread them, as the work root is (setup only).
    let _ = lading_ingest::stages::spread_subdirs(&payload);
    let server = PayloadServer::start(&payload).await?;
    let mut cfg = Config {
        data_dir: dir.join("data"),
        provisioning_round_ms: 200,
        unestimated_min_free_bytes: 0,
        reserve_bytes: 0,
        ..Config::default()
    };
    for s in lading_ingest::STAGE_NAMES {
        cfg.stages.insert(
            s.to_string(),
            lading_ingest::config::StageSettings {
                concurrency: Some(concurrency),
                ..Default::default()
            },
        );
    }
    std::fs::create_dir_all(cfg.profiles_dir())?;
    std::fs::write(
        cfg.profiles_dir().join("bench.toml"),
        "collection = \"bench\"\n",
    )?;
    std::fs::create_dir_all(cfg.work_dir())?;
    let copy = disk_copy_mb_s(&cfg.work_dir(), file_bytes * files as u64)?;
    let mut batch_rows = Vec::new();
    for o in 0..objects {
        std::fs::create_dir_all(payload.join(format!("o{o}")))?;
        let mut rows = Vec::new();
        for f in 0..files {
            let name = format!("o{o}/f{f}.bin");
            let body = filler(file_bytes as usize, (o * 1000 + f) as u64 + 1);
            let mut h = lading_ingest::fetch::Hasher::new(checkm::HashAlg::Sha256);
            h.update(&body);
            {
                // Synced, so the depositor's files are not dirty pages the pipeline's own
                // syncs would have to flush.
                use std::io::Write;
                let mut file = std::fs::File::create(payload.join(&name))?;
                file.write_all(&body)?;
                file.sync_all()?;
            }
            rows.push(vec![
                server.url(&name),
                "sha256".into(),
                h.hex(),
                file_bytes.to_string(),
                format!("f{f}.bin"),
            ]);
        }
        let m = checkm::write(ManifestKind::Object, checkm::OBJECT_FIELDS, &rows);
        std::fs::write(payload.join(format!("o{o}.checkm")), m)?;
        batch_rows.push(vec![server.url(&format!("o{o}.checkm"))]);
    }
    let batch = checkm::write(ManifestKind::Batch, &[checkm::FILE_URL], &batch_rows);
    std::fs::write(payload.join("batch.checkm"), batch)?;
    let ingest = ingest(store, cfg).await?;
    let start = std::time::Instant::now();
    let cpu0 = crate::bench::cpu_user_system();
    let bid = lading_ingest::submit(
        &ingest,
        &Submission {
            profile: "bench".into(),
            submitter: "bench".into(),
            payload_url: server.url("batch.checkm"),
            payload_type: "batch-manifest".into(),
            ..Default::default()
        },
    )
    .await?;
    let (handle, shutdown) = Shutdown::new();
    let i = ingest.clone();
    let task =
        tokio::spawn(
            async move { lading_ingest::run(&i, lading_ingest::STAGE_NAMES, shutdown).await },
        );
    wait_batch(&ingest.engine, &bid, false).await?;
    let seconds = start.elapsed().as_secs_f64();
    let cpu1 = crate::bench::cpu_user_system();
    handle.stop();
    let stats = task.await?.map_err(anyhow::Error::msg)?;
    let info = ingest.engine.batch(&bid).await?;
    let count = |f: &str| info.jobs.get(f).map_or(0, Vec::len);
    let stages = stats.figures();
    let job_mb = (file_bytes * files as u64) as f64 / 1e6;
    let stream = |s: &str| {
        stages
            .get(s)
            .map_or(0.0, |f| job_mb / (f.p50_ms / 1000.0).max(1e-9))
    };
    let figures = PipelineFigures {
        objects,
        files_per_object: files,
        file_bytes,
        completed: count("batch-completed"),
        failed: count("batch-failed"),
        seconds,
        objects_per_s: objects as f64 / seconds,
        mb_per_s: job_mb * objects as f64 / seconds,
        download_stream_mb_s: stream("Downloading"),
        store_stream_mb_s: stream("Storing"),
        disk_copy_mb_s: copy,
        cpu_user_s: cpu1.0 - cpu0.0,
        cpu_system_s: cpu1.1 - cpu0.1,
        stages,
    };
    ingest.engine.tree().close().await?;
    // The payload, working copies and stored objects can be large: they go; the store stays
    // for `lading dump`.
    for d in [payload, dir.join("data")] {
        let _ = std::fs::remove_dir_all(d);
    }
    let _ = std::fs::remove_dir(dir);
    Ok(figures)
}

pub fn print_pipeline(f: &PipelineFigures) {
    println!(
        "{} objects × {} files × {} bytes: {} completed, {} failed in {:.2} s",
        f.objects, f.files_per_object, f.file_bytes, f.completed, f.failed, f.seconds
    );
    println!(
        "  end to end: {:.1} objects/s, {:.1} MB/s",
        f.objects_per_s, f.mb_per_s
    );
    println!(
        "  one stream: downloading {:.1} MB/s, storing {:.1} MB/s; disk copy here {:.1} MB/s",
        f.download_stream_mb_s, f.store_stream_mb_s, f.disk_copy_mb_s
    );
    println!(
        "  cpu: {:.2} s user, {:.2} s system (kernel) in this process while measured",
        f.cpu_user_s, f.cpu_system_s
    );
    println!("  per stage (handler time): done, p50, p99 ms");
    for (s, x) in &f.stages {
        println!(
            "    {s:<14} {:>6} {:>9.2} {:>9.2}",
            x.done, x.p50_ms, x.p99_ms
        );
    }
}
