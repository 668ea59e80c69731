//! `lading bench`: programs that print figures. Nothing here asserts a time. The CLI's
//! `lading bench` parses [`Bench`] and calls [`run`].

mod aids;
mod error;
pub use error::{BenchError, Result};
mod bag;
mod console;
mod fill;
pub(crate) use fill::{fill, fill_with};
mod http;
mod jobs;
mod pipeline;
mod storage;
pub use aids::{drive, hold_job};
pub use storage::storage;

use clap::{Subcommand, ValueEnum};
use lading_core::time::system_clock;
use lading_core::{BatchState, Event, JobState};
use lading_engine::Engine;
use lading_node::node;
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
        /// Merritt's daemons do); a worker locks its next job in the multi that releases the
        /// last one. separate: the same, each acquisition its own round trip. chain: a worker
        /// keeps the lock and runs the next stage itself.
        #[arg(long, value_enum, default_value_t = Mode::Handoff)]
        mode: Mode,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// M objects of F files served from loopback, through every stage on a fresh store (or
    /// the one given): objects/s, MB/s, one-stream download and store speed against this
    /// disk's copy speed, and per-stage latency.
    Pipeline {
        #[arg(long, default_value_t = 200)]
        objects: usize,
        #[arg(long, default_value_t = 3)]
        files: usize,
        /// Bytes per file.
        #[arg(long, default_value_t = 4096)]
        file_bytes: u64,
        /// Handlers per stage.
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        /// Store the objects on this storage node of the `--config` (`[[storage_nodes]]`)
        /// instead of the bench's storage folder.
        #[arg(long)]
        node: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// Generic jobs (CouchDB's couch_jobs API): add + accept + finish of N empty jobs by K processors;
    /// jobs/s and add→accept latency.
    Jobs {
        #[arg(long, default_value_t = 100_000)]
        jobs: usize,
        /// Processors. Fewer give lower latency and fewer jobs/s: on a 2-core machine 16 gave
        /// about 15,000 jobs/s at p50 0.6 ms, 64 about 27,000 at 1.6 ms.
        #[arg(long, default_value_t = 64)]
        workers: usize,
        /// Most jobs added and not yet finished. Default 2 × workers; with `--batch B`,
        /// workers × B / 4 when that is more (2 × workers would leave batches nearly empty:
        /// at 64 workers and B = 64, 128 in flight gave about 35,000 jobs/s, 1,024 about
        /// 50,000 at p50 4 ms, 2,048 no more jobs/s at p50 8 ms).
        #[arg(long)]
        inflight: Option<usize>,
        /// Tasks adding jobs (default workers / 2, at least 4): each add waits for its
        /// commit, so a few producers cap the rate below what the queue can take.
        #[arg(long)]
        producers: Option<usize>,
        /// `separate`: a processor calls `finish`, then `accept`; `chain`: it calls
        /// `finish_then_accept`, which claims its next job in the finish's multi when there
        /// is a backlog.
        #[arg(long, value_enum, default_value_t = JobsMode::Separate)]
        mode: JobsMode,
        /// Each processor accepts up to this many jobs in one `accept_many` and finishes
        /// them in one `finish_many` (and each producer adds that many per commit with
        /// `add_many`); 1 is one job at a time (`--mode` applies only then).
        #[arg(long, default_value_t = 1)]
        batch: usize,
        #[arg(long)]
        json: bool,
    },
    /// The HTTP API under load on loopback: GET /api/v1/jobs/{id}, then POST /api/v1/batches
    /// (by URL), from C keep-alive connections, server in this process on a fresh store.
    Http {
        #[arg(long, default_value_t = 100_000)]
        gets: usize,
        #[arg(long, default_value_t = 10_000)]
        posts: usize,
        #[arg(long, default_value_t = 64)]
        connections: usize,
        #[arg(long)]
        json: bool,
    },
    /// One multipart upload of --bytes to an in-process server: rate, and the process's peak
    /// memory growth while the upload streams to disk.
    Upload {
        #[arg(long, default_value_t = 1 << 30)]
        bytes: u64,
        #[arg(long)]
        json: bool,
    },
    /// A bag of --files files, --size bytes in all, with md5 and sha256 manifests, validated
    /// by Lading and by `bagit.py --validate --processes 2` (PyPI bagit) in turn: MB/s of
    /// each, their ratio, Lading's peak memory.
    Bag {
        /// Payload bytes, e.g. 1GiB.
        #[arg(long, default_value = "1GiB", value_parser = bag::parse_size)]
        size: u64,
        #[arg(long, default_value_t = 200)]
        files: usize,
        /// Rounds of each, alternating.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        #[arg(long)]
        json: bool,
    },
    /// N files of BYTES put on a configured storage node (`[[storage_nodes]]` of the
    /// `--config`) the way Storing puts them (each only where absent, read back or checked
    /// by the node's SHA-256, several at once); MB/s. The files are removed from the node
    /// afterwards.
    Storage {
        /// The node's id.
        #[arg(long)]
        node: u32,
        #[arg(long, default_value_t = 8)]
        files: usize,
        /// Bytes per file.
        #[arg(long, default_value_t = 64 << 20)]
        size: u64,
        #[arg(long)]
        json: bool,
    },
    /// The console's reads on a big store: N ingest jobs (2 % of them Failed) in a fresh
    /// embedded store, then the overview page's five calls, the processes page, and a
    /// filtered jobs page (Failed, one collection, message text; its first page) timed from a
    /// client on loopback, each --samples times: p50 and p95 per page, and the count of the
    /// filter.
    Console {
        #[arg(long, default_value_t = 1_000_000)]
        jobs: usize,
        #[arg(long, default_value_t = 20)]
        samples: usize,
        #[arg(long)]
        json: bool,
    },
    /// Time acquiring the head of the Pending queue when it holds each of the given numbers
    /// of jobs (a fresh store per size; with `--store zk://…`, a fresh chroot under it).
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
pub enum JobsMode {
    Separate,
    Chain,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
pub enum Mode {
    Handoff,
    Separate,
    Chain,
}

/// Stages in the order a worker looks for work: latest first, so jobs drain through.
const LOOK_ORDER: [JobState; 8] = JobState::LATEST_FIRST;

/// Runs a bench; `cfg` is the service config (its storage nodes, for `storage` and
/// `pipeline --node`).
pub async fn run(
    what: Bench,
    store: Option<&str>,
    cfg: &lading_ingest::Config,
) -> crate::Result<()> {
    match what {
        Bench::Storage {
            node,
            files,
            size,
            json,
        } => storage(cfg, node, files, size, json).await,
        Bench::Queue {
            jobs,
            workers,
            mode,
            json,
        } => queue(jobs, workers.max(1), mode, json, store).await,
        Bench::Jobs {
            jobs,
            workers,
            inflight,
            producers,
            mode,
            batch,
            json,
        } => {
            let k = workers.max(1);
            let batch = batch.clamp(1, lading_jobs::MAX_BATCH);
            crate::jobs::jobs(
                mode,
                batch,
                jobs.max(1),
                k,
                inflight.unwrap_or((2 * k).max(k * batch / 4)).max(1),
                producers.unwrap_or((k / 2).max(4)).max(1),
                json,
                store,
            )
            .await
        }
        Bench::Http {
            gets,
            posts,
            connections,
            json,
        } => crate::http::http(gets.max(1), posts.max(1), connections.max(1), json, store).await,
        Bench::Upload { bytes, json } => crate::http::upload(bytes, json, store).await,
        Bench::Console {
            jobs,
            samples,
            json,
        } => crate::console::console(jobs.max(1), samples.max(1), json, store).await,
        Bench::Bag {
            size,
            files,
            rounds,
            json,
        } => {
            tokio::task::spawn_blocking(move || crate::bag::bag(size, files, rounds, json)).await?
        }
        Bench::Acquire {
            queued,
            samples,
            json,
        } => acquire(&queued, samples, json, store).await,
        Bench::Pipeline {
            objects,
            files,
            file_bytes,
            concurrency,
            node,
            json,
        } => {
            let scratch = Scratch::new(store).await?;
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis();
            let dir = PathBuf::from("lading-bench").join(format!("pipeline-{stamp}"));
            let f = crate::pipeline::bench(
                &scratch.url,
                &dir,
                objects.max(1),
                files.max(1),
                file_bytes,
                concurrency.max(1),
                node.map(|n| (cfg.storage_nodes.clone(), n)),
            )
            .await;
            scratch.finish().await?;
            let f = f?;
            if json {
                println!("{}", serde_json::to_string(&f)?);
            } else {
                crate::pipeline::print_pipeline(&f);
            }
            Ok(())
        }
    }
}

fn fresh_store() -> crate::Result<PathBuf> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let dir = PathBuf::from("lading-bench").join(format!("queue-{stamp}"));
    std::fs::create_dir_all(&dir)?;
    Ok(dir.join("lading.db"))
}

/// Raw `fdatasync` of a 4 KiB overwrite, per second, in `dir`: the physical ceiling on
/// durable commits there.
pub fn fsync_rate(dir: &Path) -> crate::Result<f64> {
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
pub(crate) fn cpu_seconds() -> f64 {
    let (user, system) = cpu_user_system();
    user + system
}

/// This process's CPU time so far, (user, system) in seconds.
pub(crate) use lading_core::time::process_cpu as cpu_user_system;

pub(crate) fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx] as f64 / 1000.0
}

/// The engines of `k` workers on `st`: one shared on the embedded store (one process), one
/// session each on ZooKeeper (returned too, to read their figures and close them).
async fn worker_engines(
    st: &node::Store,
    url: &str,
    engine: &Arc<Engine>,
    k: usize,
) -> crate::Result<(Vec<Arc<Engine>>, Vec<Arc<lading_store_zk::ZkTree>>)> {
    let mut sessions: Vec<Arc<lading_store_zk::ZkTree>> = Vec::new();
    let mut engines = Vec::new();
    for _ in 0..k {
        match st {
            node::Store::Sqlite(_) => engines.push(engine.clone()),
            node::Store::Zk(_) => {
                let t = Arc::new(
                    lading_store_zk::ZkTree::open(url, lading_store_zk::ZkOptions::default())
                        .await?,
                );
                engines.push(Arc::new(Engine::new(
                    t.clone(),
                    system_clock(),
                    node::owner(),
                )));
                sessions.push(t);
            }
        }
    }
    Ok((engines, sessions))
}

async fn queue(
    n: usize,
    k: usize,
    mode: Mode,
    as_json: bool,
    store: Option<&str>,
) -> crate::Result<()> {
    let scratch = Scratch::new(store).await?;
    let (st, engine) = scratch.engine().await?;
    let (url, tree) = (scratch.url.clone(), st.tree());

    // Setup (not measured): one batch, N jobs, created concurrently so commits group.
    let setup = Instant::now();
    let mut sub = serde_json::Map::new();
    sub.insert("profile_name".into(), json!("bench"));
    sub.insert("submitter".into(), json!("lading bench"));
    let bid = fill(&engine, sub, n).await?;
    let setup_s = setup.elapsed().as_secs_f64();

    // The measured part: every job through every stage.
    let stats0 = StoreStats::of(&st);
    let cpu0 = cpu_seconds();
    // On ZooKeeper each worker is its own client session, as separate worker processes are
    // (ZooKeeper serves one session's requests strictly in order, so workers sharing one
    // session would wait behind each other's writes). The embedded store is one process.
    let (engines, sessions) = worker_engines(&st, &url, &engine, k).await?;
    let zk0: Vec<_> = sessions.iter().map(|t| t.stats()).collect();
    let completed = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut handles = Vec::new();
    for e in engines {
        let completed = completed.clone();
        handles.push(tokio::spawn(async move {
            worker(&e, mode, n, &completed).await
        }));
    }
    let mut latencies_us = Vec::new();
    let mut acquire_us = Vec::new();
    let mut joined = 0;
    for h in handles {
        let (t, a, j) = h.await??;
        latencies_us.extend(t);
        acquire_us.extend(a);
        joined += j;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut stats = StoreStats::of(&st).since(&stats0);
    if let StoreStats::Zk(z) = &mut stats {
        for (t, before) in sessions.iter().zip(&zk0) {
            let a = t.stats();
            z.multis += a.multis - before.multis;
            z.reads += a.reads - before.reads;
            z.cached_reads += a.cached_reads - before.cached_reads;
            z.sessions += a.sessions - before.sessions;
            z.read_backs += a.read_backs - before.read_backs;
        }
    }
    for t in &sessions {
        lading_core::Tree::close(t.as_ref()).await?;
    }
    let cores_busy = (cpu_seconds() - cpu0) / elapsed;
    latencies_us.sort_unstable();
    acquire_us.sort_unstable();
    let transitions = latencies_us.len();
    let batch = engine.batch(&bid).await?;
    let done = batch.jobs.get("batch-completed").map_or(0, Vec::len);
    if done != n || batch.status.status != BatchState::Reporting {
        crate::error::bail!(
            "bench ended with {done} of {n} jobs completed and the batch {}",
            batch.status.status
        );
    }
    let fsync = match &st {
        node::Store::Sqlite(_) => {
            let path = url.strip_prefix("sqlite:").unwrap_or(&url).to_string();
            let dir = Path::new(&path)
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf();
            Some((fsync_rate(&dir)?, dir))
        }
        node::Store::Zk(_) => None,
    };
    tree.close().await?;
    drop(st);
    let kept = scratch.kept;
    scratch.finish().await?;

    let jobs_per_s = n as f64 / elapsed;
    let transitions_per_s = transitions as f64 / elapsed;
    let (p50, p99) = (
        percentile(&latencies_us, 0.50),
        percentile(&latencies_us, 0.99),
    );
    let mut figures = json!({
        "jobs": n, "workers": k, "mode": format!("{mode:?}").to_lowercase(), "store": url,
        "seconds": elapsed, "jobs_per_s": jobs_per_s, "transitions_per_s": transitions_per_s,
        "p50_ms": p50, "p99_ms": p99, "setup_s": setup_s, "cores_busy": cores_busy,
        "acquisitions": acquire_us.len(), "acquire_p50_ms": percentile(&acquire_us, 0.50),
        "acquire_p99_ms": percentile(&acquire_us, 0.99), "acquired_with_move": joined,
    });
    stats.add_json(&mut figures, elapsed);
    if let Some((rate, _)) = &fsync {
        figures["fsync_per_s"] = json!(rate);
    }
    if as_json {
        println!("{figures}");
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
            "  acquiring    {} acquisitions on their own, p50 {:.2} ms, p99 {:.2} ms each (looking included); {joined} more in the multi of the move before",
            acquire_us.len(),
            percentile(&acquire_us, 0.50),
            percentile(&acquire_us, 0.99)
        );
        stats.print(elapsed, n);
        println!(
            "  cpu          {cores_busy:.2} cores busy in this process on average while measured"
        );
        if let Some((rate, dir)) = &fsync {
            println!(
                "  raw fsync/s  {rate:.0} (4 KiB fdatasync in {})",
                dir.display()
            );
        }
        if kept {
            println!("  inspect with lading --store {url} dump /batches/{bid}");
        }
    }
    Ok(())
}

/// Where a benchmark runs: a fresh embedded store, the store given, or a fresh chroot under
/// the ZooKeeper URL given (removed afterwards, so runs do not pile up in the server's memory).
pub(crate) struct Scratch {
    pub(crate) url: String,
    /// The ZooKeeper (parent URL, chroot) to delete when done.
    zk: Option<(String, String)>,
    kept: bool,
    /// The folder made here for a fresh SQLite store.
    fresh: Option<PathBuf>,
}

impl Scratch {
    /// The scratch store opened, with an initialised engine of this process on it.
    pub(crate) async fn engine(&self) -> crate::Result<(node::Store, Arc<Engine>)> {
        let st = node::open(&self.url).await?;
        let engine = Arc::new(Engine::new(st.tree(), system_clock(), node::owner()));
        engine.init().await?;
        Ok((st, engine))
    }

    pub(crate) async fn new(store: Option<&str>) -> crate::Result<Scratch> {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis();
        Ok(match store {
            None => {
                let db = fresh_store()?;
                Scratch {
                    url: format!("sqlite:{}", db.display()),
                    zk: None,
                    kept: true,
                    fresh: db.parent().map(Path::to_path_buf),
                }
            }
            Some(url) if url.starts_with("zk://") => {
                let (hosts, chroot) = lading_store_zk::split_url(url)?;
                let base = if chroot == "/" { String::new() } else { chroot };
                let scratch = format!("{base}/lading-bench-{stamp}");
                lading_store_zk::ZkTree::ensure_chroot(&hosts, &scratch).await?;
                Scratch {
                    url: format!("zk://{hosts}{scratch}"),
                    zk: Some((format!("zk://{hosts}"), scratch)),
                    kept: false,
                    fresh: None,
                }
            }
            Some(url) => Scratch {
                url: url.to_string(),
                zk: None,
                kept: true,
                fresh: None,
            },
        })
    }

    pub(crate) async fn finish(self) -> crate::Result<()> {
        if let Some((root, chroot)) = self.zk {
            let t = lading_store_zk::ZkTree::open(&root, Default::default()).await?;
            t.delete_tree(&chroot).await?;
            lading_core::Tree::close(&t).await?;
        }
        Ok(())
    }

    /// [`finish`](Self::finish), and a fresh SQLite store made here is deleted too (a bench
    /// that leaves nothing worth inspecting; a store named with `--store` is kept).
    pub(crate) async fn discard(self) -> crate::Result<()> {
        let fresh = self.fresh.clone();
        self.finish().await?;
        if let Some(dir) = fresh {
            std::fs::remove_dir_all(&dir).map_err(|e| {
                crate::BenchError::Other(format!("could not delete {}: {e}", dir.display()))
            })?;
        }
        Ok(())
    }
}

/// The store's own counters, where it keeps any.
pub(crate) enum StoreStats {
    Sqlite(lading_store_sqlite::WriterStats),
    Zk(lading_store_zk::ZkStats),
}

impl StoreStats {
    pub(crate) fn of(st: &node::Store) -> StoreStats {
        match st {
            node::Store::Sqlite(t) => StoreStats::Sqlite(t.stats()),
            node::Store::Zk(t) => StoreStats::Zk(t.stats()),
        }
    }

    pub(crate) fn since(self, before: &StoreStats) -> StoreStats {
        /// `a` with each of the counters named less its value in `b`.
        macro_rules! minus {
            ($a:ident, $b:ident, $($f:ident),*) => {{
                let mut d = $a;
                $(d.$f -= $b.$f;)*
                d
            }};
        }
        match (self, before) {
            (StoreStats::Sqlite(a), StoreStats::Sqlite(b)) => StoreStats::Sqlite(minus!(
                a,
                b,
                commits,
                multis,
                fsyncs,
                fsync_us,
                writer_busy_us,
                materializations,
                materialized_rows,
                materialize_us,
                materialize_slices,
                checkpoints,
                checkpoint_us,
                wal_restarts,
                wal_restart_us
            )),
            (StoreStats::Zk(a), StoreStats::Zk(b)) => StoreStats::Zk(minus!(
                a,
                b,
                multis,
                reads,
                cached_reads,
                sessions,
                read_backs
            )),
            (a, _) => a,
        }
    }

    /// Adds another session's figures (ZooKeeper; the embedded store has one writer).
    pub(crate) fn add(&mut self, other: StoreStats) {
        if let (StoreStats::Zk(a), StoreStats::Zk(b)) = (self, other) {
            a.multis += b.multis;
            a.reads += b.reads;
            a.cached_reads += b.cached_reads;
            a.sessions += b.sessions;
            a.read_backs += b.read_backs;
        }
    }

    pub(crate) fn add_json(&self, v: &mut serde_json::Value, elapsed: f64) {
        match self {
            StoreStats::Sqlite(s) => {
                v["commits"] = json!(s.commits);
                v["multis"] = json!(s.multis);
                v["multis_per_commit"] = json!(s.multis as f64 / s.commits.max(1) as f64);
                v["fsyncs"] = json!(s.fsyncs);
                v["fsync_mean_us"] = json!(s.fsync_us as f64 / s.fsyncs.max(1) as f64);
                v["writer_busy"] = json!(s.writer_busy_us as f64 / 1e6 / elapsed);
                v["materializations"] = json!(s.materializations);
                v["materialized_rows"] = json!(s.materialized_rows);
                v["materialize_mean_us"] =
                    json!(s.materialize_us as f64 / s.materializations.max(1) as f64);
                v["materialize_slices"] = json!(s.materialize_slices);
                v["materialize_slice_max_us"] = json!(s.materialize_slice_max_us);
                v["checkpoints"] = json!(s.checkpoints);
                v["checkpoint_mean_us"] =
                    json!(s.checkpoint_us as f64 / s.checkpoints.max(1) as f64);
                v["wal_restarts"] = json!(s.wal_restarts);
                v["wal_restart_mean_us"] =
                    json!(s.wal_restart_us as f64 / s.wal_restarts.max(1) as f64);
            }
            StoreStats::Zk(s) => {
                v["multis"] = json!(s.multis);
                v["reads"] = json!(s.reads);
                v["cached_reads"] = json!(s.cached_reads);
                v["read_backs"] = json!(s.read_backs);
                v["new_sessions"] = json!(s.sessions);
            }
        }
    }

    pub(crate) fn print(&self, elapsed: f64, n: usize) {
        match self {
            StoreStats::Sqlite(s) => {
                println!(
                    "  commits      {} commits carried {} multis ({:.1} per commit, {:.0} commits/s)",
                    s.commits,
                    s.multis,
                    s.multis as f64 / s.commits.max(1) as f64,
                    s.commits as f64 / elapsed
                );
                println!(
                    "  fsyncs       {} of the WAL, {:.0} µs each on average",
                    s.fsyncs,
                    s.fsync_us as f64 / s.fsyncs.max(1) as f64
                );
                println!(
                    "  writer       the store's writer thread busy {:.0}% of the time",
                    s.writer_busy_us as f64 / 1e6 / elapsed * 100.0
                );
                println!(
                    "  table        brought up to date {} times, {} rows written ({:.1} per commit), {:.1} ms each on average",
                    s.materializations,
                    s.materialized_rows,
                    s.materialized_rows as f64 / s.commits.max(1) as f64,
                    s.materialize_us as f64 / 1e3 / s.materializations.max(1) as f64
                );
                println!(
                    "               in {} slices between commits, the longest {:.1} ms (since the store opened)",
                    s.materialize_slices,
                    s.materialize_slice_max_us as f64 / 1e3
                );
                println!(
                    "  checkpoints  {} in the background, {:.1} ms each on average; the writer finished {} (the WAL started over), {:.1} ms each",
                    s.checkpoints,
                    s.checkpoint_us as f64 / 1e3 / s.checkpoints.max(1) as f64,
                    s.wal_restarts,
                    s.wal_restart_us as f64 / 1e3 / s.wal_restarts.max(1) as f64
                );
            }
            StoreStats::Zk(s) => {
                let per_job = |x: u64| x as f64 / n.max(1) as f64;
                println!(
                    "  zookeeper    {} multis ({:.0}/s, {:.1} per job), {} reads ({:.1} per job), {} child listings from the watched cache",
                    s.multis,
                    s.multis as f64 / elapsed,
                    per_job(s.multis),
                    s.reads,
                    per_job(s.reads),
                    s.cached_reads
                );
                println!(
                    "  sessions     {} renewed, {} multis read back after a lost reply",
                    s.sessions, s.read_backs
                );
            }
        }
    }
}

/// One worker: take the latest-stage job it can find, move it on, repeat until all are done.
/// Returns the latency of each transition it committed and of each acquisition, in
/// microseconds.
async fn worker(
    e: &Engine,
    mode: Mode,
    n: usize,
    completed: &AtomicUsize,
) -> crate::Result<(Vec<u64>, Vec<u64>, usize)> {
    let mut lat = Vec::new();
    let mut acq = Vec::new();
    let mut joined = 0;
    let mut idle = 0u32;
    while completed.load(Ordering::SeqCst) < n {
        let looking = Instant::now();
        let Some(mut lease) = e.acquire_any(&LOOK_ORDER).await? else {
            // Everything left is held by other workers; wait for any of them to move.
            idle += 1;
            tokio::time::sleep(Duration::from_micros(200 * idle.min(10) as u64)).await;
            continue;
        };
        idle = 0;
        acq.push(looking.elapsed().as_micros() as u64);
        loop {
            let ev = aids::one_stage_on(lease.state());
            let last = lease.state() == JobState::Notify;
            let t = Instant::now();
            if mode == Mode::Chain && !last {
                lease = e.job_advance(lease, ev, None).await?;
                lat.push(t.elapsed().as_micros() as u64);
                continue;
            }
            let (st, next) = if mode == Mode::Handoff {
                e.job_transition_then_acquire(lease, ev, None, &LOOK_ORDER)
                    .await?
            } else {
                (e.job_transition(lease, ev, None).await?, None)
            };
            lat.push(t.elapsed().as_micros() as u64);
            if st.status == JobState::Completed {
                completed.fetch_add(1, Ordering::SeqCst);
            }
            match next {
                Some(l) => {
                    joined += 1;
                    lease = l;
                }
                None => break,
            }
        }
    }
    Ok((lat, acq, joined))
}

async fn acquire(
    sizes: &[usize],
    samples: usize,
    as_json: bool,
    store: Option<&str>,
) -> crate::Result<()> {
    let mut rows = Vec::new();
    if !as_json {
        println!("lading bench acquire: {samples} acquisitions from the head of the Pending queue");
    }
    for &q in sizes {
        let scratch = Scratch::new(store).await?;
        let (st, engine) = scratch.engine().await?;
        let (url, tree) = (scratch.url.clone(), st.tree());
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
                .ok_or_else(|| crate::BenchError::Other("queue ran dry".into()))?;
            lat.push(t.elapsed().as_micros() as u64);
            engine
                .job_transition(lease, Event::To(JobState::Estimating), None)
                .await?;
        }
        lat.sort_unstable();
        let left = engine.job_counts().await?[&JobState::Pending];
        drop(engine);
        tree.close().await?;
        drop(tree);
        scratch.finish().await?;
        let mean_us = lat.iter().sum::<u64>() as f64 / lat.len().max(1) as f64;
        if !as_json {
            println!(
                "  {:>8} queued   mean {:>6.0} µs   p50 {:>6.0} µs   p99 {:>6.0} µs   (queue filled in {:.1} s)",
                left,
                mean_us,
                percentile(&lat, 0.5) * 1000.0,
                percentile(&lat, 0.99) * 1000.0,
                fill_s,
            );
        }
        rows.push(json!({
            "queued": left, "samples": samples, "mean_us": mean_us,
            "p50_us": percentile(&lat, 0.5) * 1000.0, "p99_us": percentile(&lat, 0.99) * 1000.0,
            "fill_s": fill_s, "store": url,
        }));
    }
    if as_json {
        println!("{}", serde_json::Value::Array(rows));
    }
    Ok(())
}
