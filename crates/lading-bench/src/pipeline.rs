//! `lading bench pipeline`: objects served from loopback, through every stage in one
//! process, on a fresh store or the one given.

use lading_ingest::checkm::{self, ManifestKind};
use lading_ingest::{Config, Submission};
use lading_node::node;
use lading_payload::PayloadServer;
use std::path::Path;

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
    /// Access requests for stored versions made after the batch, one at a time: from the
    /// request's commit to its zip ready (Completed), in ms.
    pub access_requests: usize,
    pub access_p50_ms: f64,
    pub access_max_ms: f64,
}

/// Requests version 1 of each of `arks` through the small access queue, one after the other,
/// and times each from its commit to Completed (on the engine's change events): the latency
/// an access worker that waits on the queue adds to assembling the zip.
async fn access_latency(
    ingest: &lading_ingest::Ingest,
    arks: &[String],
) -> crate::Result<Vec<f64>> {
    use lading_core::layout::{AccessQueue, AccessToken};
    let mut out = Vec::new();
    for ark in arks {
        let mut events = ingest.engine.subscribe();
        let start = std::time::Instant::now();
        let id = ingest
            .engine
            .create_access_with(AccessQueue::Small, |_| {
                serde_json::to_value(AccessToken {
                    ark: Some(ark.clone()),
                    version: Some(1),
                    requester: Some("bench".into()),
                    ..Default::default()
                })
                .unwrap_or_default()
            })
            .await?;
        loop {
            let ev = tokio::time::timeout(std::time::Duration::from_secs(60), events.recv())
                .await
                .map_err(|_| {
                    crate::BenchError::Other(format!("access request {id} not done in 60 s"))
                })?
                .map_err(|e| crate::BenchError::Other(format!("the engine's events: {e}")))?;
            if ev.kind == lading_engine::ChangeKind::Access
                && ev.id == id.as_str()
                && matches!(ev.to.as_str(), "Completed" | "Failed")
            {
                crate::error::ensure!(ev.to == "Completed", "access request {id} ended {}", ev.to);
                break;
            }
        }
        out.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(out)
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

fn disk_copy_mb_s(dir: &Path, bytes: u64) -> crate::Result<f64> {
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

/// The depositor's payload under `payload`, served by `server`: `objects` object manifests
/// of `files` files of `file_bytes` each, and the batch manifest listing them.
fn write_payload(
    payload: &Path,
    server: &PayloadServer,
    objects: usize,
    files: usize,
    file_bytes: u64,
) -> crate::Result<()> {
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
    Ok(())
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
    nodes: Option<(Vec<lading_ingest::nodes::NodeSettings>, u32)>,
) -> crate::Result<PipelineFigures> {
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
    let mut profile = "collection = \"bench\"\n".to_string();
    if let Some((settings, id)) = nodes {
        cfg.storage_nodes = settings;
        profile.push_str(&format!("storage_nodes = [{id}]\n"));
    }
    std::fs::write(cfg.profiles_dir().join("bench.toml"), profile)?;
    std::fs::create_dir_all(cfg.work_dir())?;
    let copy = disk_copy_mb_s(&cfg.work_dir(), file_bytes * files as u64)?;
    write_payload(&payload, &server, objects, files, file_bytes)?;
    let ingest = node::ingest(store, cfg).await?;
    let start = std::time::Instant::now();
    let cpu0 = crate::cpu_user_system();
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
    let running = node::Node::start(
        ingest.clone(),
        node::NodeSpec {
            access: vec![lading_core::layout::AccessQueue::Small],
            ..node::Node::every_stage()
        },
    )
    .await?;
    node::wait_batch_end(&ingest.engine, &bid, |_| {}).await?;
    let seconds = start.elapsed().as_secs_f64();
    let cpu1 = crate::cpu_user_system();
    // Access requests for the first stored objects (not part of the figures above).
    let mut arks = Vec::new();
    for j in ingest
        .engine
        .batch(&bid)
        .await?
        .jobs
        .get("batch-completed")
        .into_iter()
        .flatten()
        .take(20)
    {
        let job = ingest.engine.job(j).await?;
        if let Some(a) = job.identifiers.primary_id {
            arks.push(a);
        }
    }
    let mut access_ms = access_latency(&ingest, &arks).await?;
    access_ms.sort_by(f64::total_cmp);
    running.stop_services().await?;
    let stats = &ingest.stats;
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
        access_requests: access_ms.len(),
        access_p50_ms: access_ms.get(access_ms.len() / 2).copied().unwrap_or(0.0),
        access_max_ms: access_ms.last().copied().unwrap_or(0.0),
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
    println!(
        "  access: {} requests one at a time, request to zip ready p50 {:.1} ms, max {:.1} ms",
        f.access_requests, f.access_p50_ms, f.access_max_ms
    );
    println!("  per stage (handler time): done, p50, p99 ms");
    for (s, x) in &f.stages {
        println!(
            "    {s:<14} {:>6} {:>9.2} {:>9.2}",
            x.done, x.p50_ms, x.p99_ms
        );
    }
}
