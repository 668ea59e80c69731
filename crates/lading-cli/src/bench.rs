//! `lading bench`: programs that print figures. Nothing here asserts a time.

use clap::{Subcommand, ValueEnum};
use lading_core::time::system_clock;
use lading_core::{BatchState, Event, JobState};
use lading_engine::{Engine, JobLease, JobSpec};
use serde_json::json;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum Bench {
    /// N no-op jobs in one batch, driven through every job stage by K concurrent workers.
    Queue {
        #[arg(long, default_value_t = 10_000)]
        jobs: usize,
        #[arg(long, default_value_t = 16)]
        workers: usize,
        /// handoff: every stage releases the job and the next stage acquires it again (as
        /// Merritt's daemons do). chain: a worker keeps the lock and runs the next stage itself.
        #[arg(long, value_enum, default_value_t = Mode::Handoff)]
        mode: Mode,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Time acquiring the head of the Pending queue when it holds each of the given numbers
    /// of jobs (a fresh store per size).
    Acquire {
        /// Queue lengths, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "100,100000")]
        queued: Vec<usize>,
        /// Acquisitions timed per queue length.
        #[arg(long, default_value_t = 2000)]
        samples: usize,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
pub enum Mode {
    Handoff,
    Chain,
}

/// Stages in the order a worker looks for work: latest first, so jobs drain through.
const LOOK_ORDER: [JobState; 8] = [
    JobState::Notify,
    JobState::Recording,
    JobState::Storing,
    JobState::Processing,
    JobState::Downloading,
    JobState::Provisioning,
    JobState::Estimating,
    JobState::Pending,
];

pub async fn run(what: Bench, store: Option<&str>) -> anyhow::Result<()> {
    match what {
        Bench::Queue {
            jobs,
            workers,
            mode,
            json,
        } => queue(jobs, workers.max(1), mode, json, store).await,
        Bench::Acquire {
            queued,
            samples,
            json,
        } => acquire(&queued, samples, json).await,
    }
}

fn fresh_store() -> anyhow::Result<PathBuf> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let dir = PathBuf::from("lading-bench").join(format!("queue-{stamp}"));
    std::fs::create_dir_all(&dir)?;
    Ok(dir.join("lading.db"))
}

/// Raw `fdatasync` of a 4 KiB overwrite, per second, in `dir`: the physical ceiling on
/// durable commits there.
pub fn fsync_rate(dir: &Path) -> anyhow::Result<f64> {
    let path = dir.join(".lading-fsync-probe");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)?;
    let block = [0x5au8; 4096];
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(1) && n < 50_000 {
        f.seek(SeekFrom::Start(0))?;
        f.write_all(&block)?;
        f.sync_data()?;
        n += 1;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    drop(f);
    let _ = std::fs::remove_file(&path);
    Ok(rate)
}

/// CPU seconds this process has used (user + system), from `/proc/self/stat`.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the command name; in
    // clock ticks, which are 100 per second on Linux.
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx] as f64 / 1000.0
}

async fn queue(
    n: usize,
    k: usize,
    mode: Mode,
    as_json: bool,
    store: Option<&str>,
) -> anyhow::Result<()> {
    let url = match store {
        Some(s) => s.to_string(),
        None => format!("sqlite:{}", fresh_store()?.display()),
    };
    let sqlite = crate::open_sqlite(&url)?;
    let tree: Arc<dyn lading_core::Tree> = sqlite.clone();
    let engine = Arc::new(Engine::new(
        tree.clone(),
        system_clock(),
        lading_store_sqlite::default_owner(),
    ));
    engine.init().await?;

    // Setup (not measured): one batch, N jobs, created concurrently so commits group.
    let setup = Instant::now();
    let mut sub = serde_json::Map::new();
    sub.insert("profile_name".into(), json!("bench"));
    sub.insert("submitter".into(), json!("lading bench"));
    let bid = fill(&engine, sub, n).await?;
    let setup_s = setup.elapsed().as_secs_f64();

    // The measured part: every job through every stage.
    let stats0 = sqlite.stats();
    let cpu0 = cpu_seconds();
    let completed = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..k {
        let (e, completed) = (engine.clone(), completed.clone());
        handles.push(tokio::spawn(async move {
            worker(&e, mode, n, &completed).await
        }));
    }
    let mut latencies_us = Vec::new();
    for h in handles {
        latencies_us.extend(h.await??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let stats = sqlite.stats();
    let cores_busy = (cpu_seconds() - cpu0) / elapsed;
    let (commits, multis) = (stats.commits - stats0.commits, stats.multis - stats0.multis);
    let fsyncs = stats.fsyncs - stats0.fsyncs;
    let writer_busy = (stats.writer_busy_us - stats0.writer_busy_us) as f64 / 1e6 / elapsed;
    let fsync_mean_us = (stats.fsync_us - stats0.fsync_us) as f64 / fsyncs.max(1) as f64;
    let per_commit = multis as f64 / commits.max(1) as f64;
    latencies_us.sort_unstable();
    let transitions = latencies_us.len();
    let batch = engine.batch(&bid).await?;
    let done = batch.jobs.get("batch-completed").map_or(0, Vec::len);
    if done != n || batch.status.status != BatchState::Reporting {
        anyhow::bail!(
            "bench ended with {done} of {n} jobs completed and the batch {}",
            batch.status.status
        );
    }
    let path = url.strip_prefix("sqlite:").unwrap_or(&url).to_string();
    let dir = Path::new(&path)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let fsync = fsync_rate(dir)?;
    tree.close().await?;

    let jobs_per_s = n as f64 / elapsed;
    let transitions_per_s = transitions as f64 / elapsed;
    let (p50, p99) = (
        percentile(&latencies_us, 0.50),
        percentile(&latencies_us, 0.99),
    );
    if as_json {
        println!(
            "{}",
            json!({
                "jobs": n, "workers": k, "mode": format!("{mode:?}").to_lowercase(), "store": url,
                "seconds": elapsed, "jobs_per_s": jobs_per_s, "transitions_per_s": transitions_per_s,
                "p50_ms": p50, "p99_ms": p99, "fsync_per_s": fsync, "setup_s": setup_s,
                "commits": commits, "multis": multis, "multis_per_commit": per_commit,
                "fsyncs": fsyncs, "fsync_mean_us": fsync_mean_us, "cores_busy": cores_busy,
                "writer_busy": writer_busy,
            })
        );
    } else {
        println!("lading bench queue: {n} jobs, {k} workers, {mode:?} mode, store {url}");
        println!("  setup        {n} jobs created in {setup_s:.2} s (not counted below)");
        println!(
            "  pipeline     {transitions} transitions in {elapsed:.2} s; batch {bid} is {}",
            batch.status.status
        );
        println!("  jobs/s       {jobs_per_s:.0}");
        println!("  transitions/s {transitions_per_s:.0}");
        println!("  latency      p50 {p50:.2} ms, p99 {p99:.2} ms per transition");
        println!(
            "  commits      {commits} durable commits carried {multis} multis ({per_commit:.1} per commit, {:.0} commits/s)",
            commits as f64 / elapsed
        );
        println!("  fsyncs       {fsyncs} of the WAL, {fsync_mean_us:.0} µs each on average");
        println!(
            "  cpu          {cores_busy:.2} cores busy on average while measured; the store's writer thread busy {:.0}% of the time",
            writer_busy * 100.0
        );
        println!(
            "  raw fsync/s  {fsync:.0} (4 KiB fdatasync in {})",
            dir.display()
        );
        println!("  inspect with lading --store {url} dump /batches/{bid}");
    }
    Ok(())
}

/// One worker: take the latest-stage job it can find, move it on, repeat until all are done.
/// Returns the latency of each transition it committed, in microseconds.
async fn worker(
    e: &Engine,
    mode: Mode,
    n: usize,
    completed: &AtomicUsize,
) -> anyhow::Result<Vec<u64>> {
    let mut lat = Vec::new();
    let mut idle = 0u32;
    while completed.load(Ordering::SeqCst) < n {
        let mut got: Option<JobLease> = None;
        for st in LOOK_ORDER {
            if let Some(l) = e.acquire_job(st).await? {
                got = Some(l);
                break;
            }
        }
        let Some(mut lease) = got else {
            // Everything left is held by other workers; wait for any of them to move.
            idle += 1;
            tokio::time::sleep(Duration::from_micros(200 * idle.min(10) as u64)).await;
            continue;
        };
        idle = 0;
        loop {
            let ev = if lease.state() == JobState::Pending {
                Event::To(JobState::Estimating)
            } else {
                Event::Success
            };
            let last = lease.state() == JobState::Notify;
            let t = Instant::now();
            if mode == Mode::Chain && !last {
                lease = e.job_advance(lease, ev, None).await?;
                lat.push(t.elapsed().as_micros() as u64);
                continue;
            }
            let st = e.job_transition(lease, ev, None).await?;
            lat.push(t.elapsed().as_micros() as u64);
            if st.status == JobState::Completed {
                completed.fetch_add(1, Ordering::SeqCst);
            }
            break;
        }
    }
    Ok(lat)
}

/// Test aid behind `lading drive`: moves any job it can acquire one stage on (no work done),
/// until nothing was found for `idle`. Returns (transitions, jobs completed).
pub async fn drive(e: &Engine, idle: Duration) -> anyhow::Result<(u64, u64)> {
    let (mut transitions, mut completed) = (0u64, 0u64);
    let mut last_work = Instant::now();
    while last_work.elapsed() < idle {
        let mut got = None;
        for st in LOOK_ORDER {
            if let Some(l) = e.acquire_job(st).await? {
                got = Some(l);
                break;
            }
        }
        let Some(lease) = got else {
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        };
        last_work = Instant::now();
        let ev = if lease.state() == JobState::Pending {
            Event::To(JobState::Estimating)
        } else {
            Event::Success
        };
        let st = e.job_transition(lease, ev, None).await?;
        transitions += 1;
        if st.status == JobState::Completed {
            completed += 1;
        }
    }
    Ok((transitions, completed))
}

/// Creates a batch with `n` Pending jobs, concurrently so commits group; returns its id.
async fn fill(
    engine: &Arc<Engine>,
    submission: serde_json::Map<String, serde_json::Value>,
    n: usize,
) -> anyhow::Result<lading_core::layout::BatchId> {
    let bid = engine.create_batch(submission).await?;
    let lease = loop {
        match engine.acquire_batch(BatchState::Pending).await? {
            Some(l) if l.batch == bid => break l,
            Some(other) => engine.release_batch_lease(other).await?,
            None => {
                anyhow::bail!("batch {bid} could not be acquired (is the ingest queue paused?)")
            }
        }
    };
    let next = Arc::new(AtomicUsize::new(0));
    let mut creators = Vec::new();
    for _ in 0..64.min(n.max(1)) {
        let (e, l, next) = (engine.clone(), lease.clone(), next.clone());
        creators.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::SeqCst) < n {
                e.create_job(&l, JobSpec::default()).await?;
            }
            anyhow::Ok(())
        }));
    }
    for c in creators {
        c.await??;
    }
    engine
        .batch_transition(lease, Event::To(BatchState::Processing), None)
        .await?;
    Ok(bid)
}

async fn acquire(sizes: &[usize], samples: usize, as_json: bool) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for &q in sizes {
        let url = format!("sqlite:{}", fresh_store()?.display());
        let tree = crate::open_store(&url)?;
        let engine = Arc::new(Engine::new(
            tree.clone(),
            system_clock(),
            lading_store_sqlite::default_owner(),
        ));
        engine.init().await?;
        // The queue, plus the jobs the samples will take off its head.
        let fill_start = Instant::now();
        fill(&engine, serde_json::Map::new(), q + samples).await?;
        let fill_s = fill_start.elapsed().as_secs_f64();
        let mut lat = Vec::with_capacity(samples);
        for _ in 0..samples {
            let t = Instant::now();
            let lease = engine
                .acquire_job(JobState::Pending)
                .await?
                .ok_or_else(|| anyhow::anyhow!("queue ran dry"))?;
            lat.push(t.elapsed().as_micros() as u64);
            engine
                .job_transition(lease, Event::To(JobState::Estimating), None)
                .await?;
        }
        lat.sort_unstable();
        let left = engine.job_counts().await?[&JobState::Pending];
        tree.close().await?;
        let mean_us = lat.iter().sum::<u64>() as f64 / lat.len().max(1) as f64;
        rows.push(json!({
            "queued": left, "samples": samples, "mean_us": mean_us,
            "p50_us": percentile(&lat, 0.5) * 1000.0, "p99_us": percentile(&lat, 0.99) * 1000.0,
            "fill_s": fill_s, "store": url,
        }));
    }
    if as_json {
        println!("{}", serde_json::Value::Array(rows));
    } else {
        println!("lading bench acquire: {samples} acquisitions from the head of the Pending queue");
        for r in &rows {
            println!(
                "  {:>8} queued   mean {:>6.0} µs   p50 {:>6.0} µs   p99 {:>6.0} µs   (queue filled in {:.1} s)",
                r["queued"].as_u64().unwrap_or(0),
                r["mean_us"].as_f64().unwrap_or(0.0),
                r["p50_us"].as_f64().unwrap_or(0.0),
                r["p99_us"].as_f64().unwrap_or(0.0),
                r["fill_s"].as_f64().unwrap_or(0.0),
            );
        }
    }
    Ok(())
}
