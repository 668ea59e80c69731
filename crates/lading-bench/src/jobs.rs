//! `lading bench jobs`: add + accept + finish of N empty generic jobs by K processors.
//!
//! Closed loop: producers keep at most `--inflight` jobs added and not yet finished (default
//! 2 × K, or K × B / 4 with batches of B when more), so the latency measured is the queue's own (add committed → accept committed), not
//! the age of a backlog the producers piled up faster than anyone could drain it.

use crate::{JobsMode, Scratch, StoreStats, cpu_seconds, percentile};
use lading_core::time::system_clock;
use lading_jobs::{AcceptOptions, Jobs, Outcome};
use lading_node::node;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

const TYPE: &str = "bench";

/// What the producers and processors of one run share.
struct Run {
    n: usize,
    batch: usize,
    mode: JobsMode,
    start: Instant,
    /// When each job's add committed, in µs since start.
    added: Vec<AtomicU64>,
    /// Room for jobs added and not yet finished.
    window: Semaphore,
    next: AtomicUsize,
    done: AtomicUsize,
    /// Cancelled by the last finish: processors idle in `accept` stop at once instead of
    /// waiting out their timeout (which would be counted as part of the work).
    all_done: tokio_util::sync::CancellationToken,
}

impl Run {
    /// A producer: one job, and up to a batch when the window has room for more, each add
    /// awaited, until every job is added.
    async fn produce(&self, j: &Jobs) -> crate::Result<()> {
        loop {
            let permit = self.window.acquire().await?;
            permit.forget();
            let mut take = 1;
            while take < self.batch {
                match self.window.try_acquire() {
                    Ok(p) => {
                        p.forget();
                        take += 1;
                    }
                    Err(_) => break,
                }
            }
            let first = self.next.fetch_add(take, Ordering::Relaxed);
            if first >= self.n {
                return Ok(());
            }
            let last = (first + take).min(self.n);
            if self.batch == 1 {
                j.add(TYPE, &format!("j{first:09}"), json!({}), None)
                    .await?;
            } else {
                let items = (first..last)
                    .map(|i| (format!("j{i:09}"), json!({})))
                    .collect();
                j.add_many(TYPE, items, Default::default()).await?;
            }
            let t = self.start.elapsed().as_micros() as u64;
            for slot in &self.added[first..last] {
                slot.store(t, Ordering::Release);
            }
        }
    }

    /// `m` more jobs finished: room for as many, and the end once all are.
    fn finished(&self, m: usize) {
        if self.done.fetch_add(m, Ordering::AcqRel) + m == self.n {
            self.all_done.cancel();
        }
        self.window.add_permits(m);
    }

    /// A processor, until every job is finished: batches of accept_many and finish_many,
    /// or one job at a time as the mode says.
    async fn process(&self, j: &Jobs) -> crate::Result<Lat> {
        let mut lat = Lat::default();
        let opts = AcceptOptions {
            timeout: Duration::from_millis(200),
            no_schedule: true,
            ..Default::default()
        };
        let now = AcceptOptions {
            timeout: Duration::ZERO,
            ..opts.clone()
        };
        // The next job, when the last finish claimed it.
        let mut next = None;
        while self.batch > 1 && self.done.load(Ordering::Acquire) < self.n {
            let mut got = tokio::select! {
                r = j.accept_many(TYPE, self.batch, &opts) => r?,
                _ = self.all_done.cancelled() => break,
            };
            if got.is_empty() {
                continue;
            }
            let at = self.start.elapsed().as_micros() as u64;
            let mut when = Vec::with_capacity(got.len());
            for job in &got {
                let a = added_at(&self.added, &job.id).await?;
                lat.start.push(at.saturating_sub(a));
                when.push(a);
            }
            lat.batches.push(got.len() as u64);
            let outcomes = got.iter().map(|_| Outcome::Success(None)).collect();
            for r in j.finish_many(&mut got, outcomes).await {
                r?;
            }
            let end = self.start.elapsed().as_micros() as u64;
            lat.finish
                .extend(when.iter().map(|a| end.saturating_sub(*a)));
            self.finished(got.len());
        }
        while self.batch == 1 && self.done.load(Ordering::Acquire) < self.n {
            let accepted = match next.take() {
                Some(job) => Some(job),
                None => tokio::select! {
                    r = j.accept(TYPE, &opts) => r?,
                    _ = self.all_done.cancelled() => break,
                },
            };
            let Some(mut job) = accepted else {
                continue;
            };
            let at = self.start.elapsed().as_micros() as u64;
            let a = added_at(&self.added, &job.id).await?;
            lat.start.push(at.saturating_sub(a));
            lat.batches.push(1);
            match self.mode {
                // No wait here: with nothing due, the loop's `accept` waits.
                JobsMode::Chain => next = j.finish_then_accept(&mut job, None, &now).await?,
                JobsMode::Separate => j.finish(&mut job, None).await?,
            }
            let end = self.start.elapsed().as_micros() as u64;
            lat.finish.push(end.saturating_sub(a));
            self.finished(1);
        }
        Ok(lat)
    }
}

#[allow(clippy::too_many_arguments)]
pub async fn jobs(
    mode: JobsMode,
    batch: usize,
    n: usize,
    k: usize,
    inflight: usize,
    producers: usize,
    as_json: bool,
    store: Option<&str>,
) -> crate::Result<()> {
    let scratch = Scratch::new(store).await?;
    let url = scratch.url.clone();
    let st = node::open(&url).await?;
    let owner = node::owner();
    let main = Arc::new(Jobs::new(st.tree(), system_clock(), owner.clone()));
    main.set_type_timeout(TYPE, 60).await?;
    // On ZooKeeper each processor is its own session, as separate processes would be.
    let mut sessions = Vec::new();
    let mut procs = Vec::new();
    for _ in 0..k {
        match &st {
            node::Store::Sqlite(_) => procs.push(main.clone()),
            node::Store::Zk(_) => {
                let s = node::open(&url).await?;
                procs.push(Arc::new(Jobs::new(s.tree(), system_clock(), owner.clone())));
                sessions.push(s);
            }
        }
    }

    let stats0 = StoreStats::of(&st);
    let sessions0: Vec<StoreStats> = sessions.iter().map(StoreStats::of).collect();
    let cpu0 = cpu_seconds();
    let run = Arc::new(Run {
        n,
        batch,
        mode,
        start: Instant::now(),
        added: (0..n).map(|_| AtomicU64::new(0)).collect(),
        window: Semaphore::new(inflight),
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        all_done: tokio_util::sync::CancellationToken::new(),
    });
    let mut adders = Vec::new();
    for _ in 0..producers {
        let (run, j) = (run.clone(), main.clone());
        adders.push(tokio::spawn(async move { run.produce(&j).await }));
    }
    let mut workers = Vec::new();
    for j in procs {
        let run = run.clone();
        workers.push(tokio::spawn(async move { run.process(&j).await }));
    }
    for a in adders {
        a.await??;
    }
    let mut lat = Lat::default();
    for w in workers {
        let l = w.await??;
        lat.start.extend(l.start);
        lat.finish.extend(l.finish);
        lat.batches.extend(l.batches);
    }
    let elapsed = run.start.elapsed().as_secs_f64();
    let cores_busy = (cpu_seconds() - cpu0) / elapsed;
    let mut stats = StoreStats::of(&st).since(&stats0);
    // On ZooKeeper each processor's session counts its own requests.
    for (s, before) in sessions.iter().zip(&sessions0) {
        stats.add(StoreStats::of(s).since(before));
    }
    let counts = main.counts(TYPE).await?;
    let finished = counts
        .get(&lading_jobs::State::Finished)
        .copied()
        .unwrap_or(0);
    if finished != n as u64 || lat.start.len() != n {
        crate::error::bail!(
            "bench ended with {finished} of {n} jobs finished ({} accepted)",
            lat.start.len()
        );
    }
    for s in &sessions {
        s.tree().close().await?;
    }
    st.tree().close().await?;
    drop(st);
    scratch.discard().await?;

    lat.start.sort_unstable();
    lat.finish.sort_unstable();
    let start_ms = quantiles(&lat.start);
    let finish_ms = quantiles(&lat.finish);
    let (p50, p99) = (percentile(&lat.start, 0.50), percentile(&lat.start, 0.99));
    let batches = lat.batches.len().max(1) as f64;
    let batch_mean = lat.batches.iter().sum::<u64>() as f64 / batches;
    let batch_max = lat.batches.iter().copied().max().unwrap_or(0);
    let jobs_per_s = n as f64 / elapsed;
    let mut figures = json!({
        "mode": format!("{mode:?}").to_lowercase(), "batch": batch, "jobs": n, "workers": k, "inflight": inflight, "producers": producers, "store": url,
        "seconds": elapsed, "jobs_per_s": jobs_per_s, "p50_ms": p50, "p99_ms": p99,
        "add_to_start_ms": start_ms, "add_to_finish_ms": finish_ms,
        "batch_mean": batch_mean, "batch_max": batch_max,
        "cores_busy": cores_busy,
    });
    stats.add_json(&mut figures, elapsed);
    if as_json {
        println!("{figures}");
        return Ok(());
    }
    println!(
        "lading bench jobs: {n} jobs, {k} processors, {producers} producers, at most {inflight} in flight, store {url}"
    );
    println!(
        "  mode         {}",
        match mode {
            _ if batch > 1 => "batch: accept_many, finish_many, add_many",
            JobsMode::Chain =>
                "chain: finish_then_accept (the finish claims the next job when there is a backlog)",
            JobsMode::Separate => "separate: finish, then accept",
        }
    );
    println!("  jobs/s       {jobs_per_s:.0} (add + accept + finish, {elapsed:.2} s)");
    let line = |q: &serde_json::Map<String, serde_json::Value>| {
        QUANTILES
            .iter()
            .map(|(name, _)| format!("{name} {:.2}", q[*name].as_f64().unwrap_or(0.0)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("  add→start    {} ms", line(&start_ms));
    println!("  add→finish   {} ms", line(&finish_ms));
    println!("  batches      mean {batch_mean:.1} jobs, max {batch_max}");
    stats.print(elapsed, n);
    println!("  cpu          {cores_busy:.2} cores busy in this process on average while measured");
    Ok(())
}

/// One processor's figures: add→start and add→finish of each job (µs), and the size of
/// each accept.
#[derive(Default)]
struct Lat {
    start: Vec<u64>,
    finish: Vec<u64>,
    batches: Vec<u64>,
}

const QUANTILES: [(&str, f64); 4] = [("p50", 0.50), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999)];

/// p50, p95, p99 and p999 of `sorted` (µs), in ms.
fn quantiles(sorted: &[u64]) -> serde_json::Map<String, serde_json::Value> {
    QUANTILES
        .iter()
        .map(|(name, p)| (name.to_string(), json!(percentile(sorted, *p))))
        .collect()
}

/// When job `id` (`jN`) was added, in µs from the start. The add's commit and the producer's
/// timestamp race by microseconds (the timestamp is stored right after the commit returns):
/// a consumer that sees the job first waits for it.
async fn added_at(added: &[AtomicU64], id: &str) -> crate::Result<u64> {
    let slot = &added[id[1..]
        .parse::<usize>()
        .map_err(|e| crate::BenchError::Other(format!("job id {id:?} is not the bench's: {e}")))?];
    loop {
        match slot.load(Ordering::Acquire) {
            0 => tokio::task::yield_now().await,
            t => return Ok(t),
        }
    }
}
