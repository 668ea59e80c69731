//! Cleanup: completed (and deleted) batches older than the retention age go, with their jobs,
//! working directories and — for a batch made from an upload — the uploaded file; so do
//! finished access requests with their assembled zips; and, whatever their age, the quota
//! slots of finished jobs and quota folders left empty. Stored objects and the inventory stay:
//! they are the point of ingest.

use crate::Ingest;
use lading_core::BatchState;
use lading_core::TreeError;
use lading_core::layout::BatchId;
use lading_core::time::parse_ts;
use lading_engine::{Engine, EngineError, ReportTry};
use lading_worker::{Acquire, Shutdown};

/// What one cleanup pass removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Cleaned {
    pub batches: usize,
    pub jobs: usize,
    /// Finished access requests, with their assembled zips.
    pub access: usize,
    /// Quota slots of finished jobs, and quota folders left empty (any age).
    pub quotas: usize,
    /// Submitter-index entries of batches another tool deleted.
    pub index_entries: usize,
}

/// Removes Completed and Deleted batches whose last change is older than `retention_ms` before `now_ms`.
pub async fn cleanup(
    ingest: &Ingest,
    now_ms: u64,
    retention_ms: u64,
) -> Result<Cleaned, EngineError> {
    let e = &ingest.engine;
    let mut out = Cleaned::default();
    for bid in e.batch_ids().await? {
        let info = match e.batch(&bid).await {
            Ok(i) => i,
            Err(EngineError::NoBatch(_)) => continue,
            Err(err) => return Err(err),
        };
        if !matches!(
            info.status.status,
            BatchState::Completed | BatchState::Deleted
        ) {
            continue;
        }
        let Some(at) = parse_ts(&info.status.last_modified) else {
            continue;
        };
        if at.saturating_add(retention_ms) > now_ms {
            continue;
        }
        // A submission of another shape has no upload of Lading's to remove.
        let upload = (info.submission.typed().ok())
            .and_then(|s| s.payload_url.as_deref())
            .and_then(|u| upload_dir(ingest, u));
        match e.purge_batch(&bid).await {
            Ok(n) => out.jobs += n,
            // The store itself failing (a lost connection, an expired session) ends the
            // pass; the next one tries again.
            Err(EngineError::Tree(t))
                if matches!(
                    t.root(),
                    TreeError::SessionExpired
                        | TreeError::ConnectionLoss(_)
                        | TreeError::Backend(_)
                ) =>
            {
                return Err(EngineError::Tree(t));
            }
            // This batch moved on, is held, or changed under the purge (a job added, a node
            // gone): left for the next pass, which the other batches do not wait for.
            Err(err) => {
                tracing::info!(batch = %bid, error = %err, "cleanup: batch left for the next pass");
                continue;
            }
        }
        out.batches += 1;
        // Its jobs' working folders on this host (other hosts' sweeps remove theirs).
        for j in info.jobs.values().flatten() {
            let dir = ingest.cfg.work_dir().join(j);
            if dir.exists()
                && let Err(err) = std::fs::remove_dir_all(&dir)
            {
                tracing::warn!(dir = %dir.display(), error = %err, "cannot remove working directory");
            }
        }
        if let Some(dir) = upload
            && let Err(err) = std::fs::remove_dir_all(&dir)
        {
            tracing::warn!(dir = %dir.display(), error = %err, "cannot remove an upload");
        }
    }
    use lading_core::AccessState;
    use lading_core::layout::AccessQueue;
    for queue in [AccessQueue::Small, AccessQueue::Large] {
        for id in e.access_ids(queue).await? {
            let info = match e.access(queue, &id).await {
                Ok(i) => i,
                Err(EngineError::NoAccess(_)) => continue,
                Err(err) => return Err(err),
            };
            let finished = matches!(
                info.status.status,
                AccessState::Completed | AccessState::Failed | AccessState::Deleted
            );
            let old = parse_ts(&info.status.last_modified)
                .is_some_and(|at| at.saturating_add(retention_ms) <= now_ms);
            if !finished || !old || info.locked {
                continue;
            }
            let mut kept = false;
            for file in [
                crate::access::zip_path(&ingest.cfg, queue, &id),
                crate::access::bag_path(&ingest.cfg, queue, &id),
            ] {
                match std::fs::remove_file(&file) {
                    Ok(()) => {}
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                    Err(err) => {
                        tracing::warn!(file = %file.display(), error = %err, "cannot remove an access file");
                        kept = true;
                    }
                }
            }
            if kept {
                continue;
            }
            match e.purge_access(queue, &id).await {
                Ok(()) => out.access += 1,
                Err(EngineError::Locked(_) | EngineError::Conflict(_)) => {}
                Err(err) => return Err(err),
            }
        }
    }
    out.quotas = crate::quota::sweep(e).await?;
    out.index_entries = e.prune_submitter_index().await?;
    Ok(out)
}

/// Removes, every `cleanup_every_s`, this host's working folders whose job no longer
/// exists and that nothing touched for the retention (see [`sweep_work_dirs`]): a service of
/// each host that runs Downloading, Processing or Storing.
pub async fn sweep_work_dirs_every(ingest: std::sync::Arc<Ingest>, shutdown: Shutdown) {
    let every = std::time::Duration::from_secs(ingest.cfg.cleanup_every_s.max(1));
    lading_worker::every("working folders", every, shutdown, move || {
        let i = ingest.clone();
        async move {
            match sweep_work_dirs(&i, i.cfg.retention()).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(removed = n, "working folders of removed jobs"),
                Err(e) => tracing::warn!(error = %e, "cannot sweep working folders"),
            }
        }
    })
    .await
}

/// Removes this host's working folders whose job no longer exists in the tree and that
/// nothing has touched for `min_age` (by the engine's clock): with several hosts, a job's
/// folder stays on each host it passed through, and only the host that cleans its batch up
/// removes its own. Folders of live jobs (in any state) are kept; so is anything not named
/// like a job, and a folder touched recently (another tree sharing this data folder may own
/// it: its job is not in this tree). A folder removed by mistake costs its job a fresh
/// download, never a file: a job refetches what its folder lacks.
pub async fn sweep_work_dirs(
    ingest: &Ingest,
    min_age: std::time::Duration,
) -> Result<usize, EngineError> {
    let root = ingest.cfg.work_dir();
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(0);
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(jid) = name
            .to_str()
            .and_then(|n| lading_core::layout::JobId::parse(n).ok())
        else {
            continue;
        };
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let dir = entry.path();
        let touched_ms = [dir.clone(), dir.join("job.log"), dir.join(".lading")]
            .iter()
            .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .filter_map(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64)
            .max();
        let now_ms = ingest.engine.clock().now_ms();
        if touched_ms.is_none_or(|t| u128::from(now_ms.saturating_sub(t)) < min_age.as_millis()) {
            continue;
        }
        // One read (the status), not the whole job: a job's nodes come and go together.
        match ingest.engine.job_state(&jid).await {
            Err(EngineError::NoJob(_)) => {}
            Ok(_) => continue,
            Err(err) => return Err(err),
        }
        match std::fs::remove_dir_all(entry.path()) {
            Ok(()) => removed += 1,
            Err(err) => {
                tracing::warn!(dir = %entry.path().display(), error = %err, "cannot remove a working folder")
            }
        }
    }
    Ok(removed)
}

/// The folder an uploaded payload was saved in (`DATA_DIR/uploads/UUID/NAME`), if
/// `payload_url` is one.
pub fn upload_dir(ingest: &Ingest, payload_url: &str) -> Option<std::path::PathBuf> {
    let file = std::path::Path::new(payload_url.strip_prefix("file://")?);
    let root = std::path::absolute(ingest.cfg.data_dir.join("uploads")).ok()?;
    let dir = file.parent()?;
    (dir.parent()? == root).then(|| dir.to_path_buf())
}

/// How often the process that runs reporting looks for batches a crash left in Processing.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

/// Housekeeping, on the runtime until shut down: batches whose last job another process or
/// tool moved are noticed within seconds (a watch on their `batch-processing` folders, read
/// again every 30 s), every ten minutes a reporting sweep, and every `cleanup_every_s`
/// (from the start) the cleanup of batches past retention.
pub async fn housekeeping(ingest: std::sync::Arc<Ingest>, shutdown: Shutdown) {
    let finishing = lading_worker::run_loops(
        std::sync::Arc::new(Finishing {
            ingest: ingest.clone(),
            kept: std::sync::Mutex::new(None),
            held: std::sync::Mutex::new(Vec::new()),
            locks: std::sync::Mutex::new(Vec::new()),
            landing: std::sync::Mutex::new(Vec::new()),
        }),
        1,
        shutdown.clone(),
    );
    let i = ingest.clone();
    let sweeps = lading_worker::every("housekeeping", SWEEP_EVERY, shutdown.clone(), move || {
        let i = i.clone();
        async move {
            match i.engine.sweep_reporting().await {
                Ok(n) if n > 0 => tracing::info!(batches = n, "batches moved on to Reporting"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "reporting sweep failed"),
            }
        }
    });
    let every = std::time::Duration::from_secs(ingest.cfg.cleanup_every_s.max(1));
    let cleanups = lading_worker::every("cleanup", every, shutdown, move || {
        let i = ingest.clone();
        async move {
            let now = i.engine.clock().now_ms();
            let retention_ms = i.cfg.retention().as_millis() as u64;
            match cleanup(&i, now, retention_ms).await {
                Ok(c) if c.batches > 0 || c.access > 0 => {
                    tracing::info!(
                        batches = c.batches,
                        jobs = c.jobs,
                        access = c.access,
                        "cleanup"
                    )
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cleanup failed"),
            }
        }
    });
    tokio::join!(finishing, sweeps, cleanups);
}

/// Watches the Processing batches; an item is a list of batches to check. The watches are
/// kept from one round to the next: a fired one is set again on its batch alone, and that
/// batch alone is checked (every job a batch finishes fires its watch, and reading every
/// batch for each was most of a busy process's tree calls). The list is read again when a
/// batch is made or starts, and every 30 s.
struct Finishing {
    ingest: std::sync::Arc<Ingest>,
    /// The watches of the last round and when their list was read; `None`: read it again.
    kept: std::sync::Mutex<Option<(lading_engine::Finishing, tokio::time::Instant)>>,
    /// Finished batches another session held the lock of ([`ReportTry::Held`]), not watched
    /// yet.
    held: std::sync::Mutex<Vec<BatchId>>,
    /// Watches on the locks of such batches: each is checked again when its lock goes. A
    /// holder that crashed lets go only when its session ends, and checks nothing then; the
    /// batch waited for the list's re-read (found by `lading-sim`).
    locks: std::sync::Mutex<Vec<(BatchId, lading_core::Watch)>>,
    /// Finished batches whose last job has not landed in another folder yet
    /// ([`ReportTry::Landing`]), each with when it was first found so: checked again every
    /// [`landing_recheck`], and reported without the job after [`finishing_reread`].
    landing: std::sync::Mutex<Vec<(BatchId, tokio::time::Instant)>>,
}

/// What the finishing watch has done so far, for whoever must wait for it to have done
/// something (a test that needs an interleaving): counters that only grow.
#[derive(Default)]
pub struct FinishingProgress {
    /// Rounds that set their watches and began to wait.
    armed: tokio::sync::watch::Sender<u64>,
    /// Finished batches found locked by another session.
    held: tokio::sync::watch::Sender<u64>,
    /// Times a finished batch was found with its last job between a two-request move's
    /// requests (a batch found so at every recheck counts each time).
    landing: tokio::sync::watch::Sender<u64>,
}

impl FinishingProgress {
    /// Rounds so far that set their watches and began to wait.
    pub fn armed(&self) -> u64 {
        *self.armed.borrow()
    }

    /// Finished batches found locked by another session so far.
    pub fn held(&self) -> u64 {
        *self.held.borrow()
    }

    /// Waits until more than `past` rounds have set their watches and begun to wait.
    pub async fn armed_past(&self, past: u64) {
        let mut rx = self.armed.subscribe();
        let _ = rx.wait_for(|n| *n > past).await;
    }

    /// Waits until more than `past` finished batches have been found locked by another
    /// session.
    pub async fn held_past(&self, past: u64) {
        let mut rx = self.held.subscribe();
        let _ = rx.wait_for(|n| *n > past).await;
    }

    /// Times so far a finished batch was found with its last job in no folder
    /// ([`ReportTry::Landing`]; a batch found so at every recheck counts each time).
    pub fn landing(&self) -> u64 {
        *self.landing.borrow()
    }

    /// Waits until a finished batch has been found with its last job in no folder more than
    /// `past` times.
    pub async fn landing_past(&self, past: u64) {
        let mut rx = self.landing.subscribe();
        let _ = rx.wait_for(|n| *n > past).await;
    }
}

/// How long the finishing watch waits before reading every Processing batch again: three
/// of the engine's sweeps (30 s in a real process; see [`Engine::sweep`]).
fn finishing_reread(e: &Engine) -> std::time::Duration {
    e.sweep() * 3
}

/// How often a batch whose last job is between a two-request move's requests
/// ([`ReportTry::Landing`]) is checked again: the second request follows the first at once,
/// and nothing in the tree's folders a watch could wait on says which folder it will make.
fn landing_recheck(e: &Engine) -> std::time::Duration {
    e.sweep() / 20
}

/// What woke the finishing watch.
enum Fired {
    Batch(usize),
    Lock(usize),
    Landing,
    Stale,
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Acquire for Finishing {
    type Lease = Vec<lading_core::layout::BatchId>;
    const WHAT: &'static str = "finishing batches watch";
    fn state_name(&self) -> &str {
        "Processing"
    }
    async fn wait(&self, stop: Shutdown) -> Result<Option<Self::Lease>, String> {
        let e = &self.ingest.engine;
        let kept = lock(&self.kept).take();
        let (mut f, read_at) = match kept {
            Some(k) => k,
            None => {
                let f = e.watch_finishing().await.map_err(|e| e.to_string())?;
                // Finished before the watches were set: caught now.
                let all = f.batches.iter().map(|(b, _)| b.clone()).collect();
                self.handle(all, &mut stop.clone()).await;
                (f, tokio::time::Instant::now())
            }
        };
        // The batches found held, by the last round or just now: their locks are watched
        // before this round waits. (Found held by the check just above and watched only in
        // the next round, a batch waited for the 30 s re-read when its holder's lock went.)
        let mut locks = std::mem::take(&mut *lock(&self.locks));
        let mut free = Vec::new();
        let held = std::mem::take(&mut *lock(&self.held));
        for (i, b) in held.iter().enumerate() {
            if locks.iter().any(|(x, _)| x == b) {
                continue;
            }
            match e.watch_batch_lock(b).await {
                Ok(Some(w)) => locks.push((b.clone(), w)),
                // Let go already: checked at once.
                Ok(None) => free.push(b.clone()),
                Err(err) => {
                    lock(&self.held).extend_from_slice(&held[i..]);
                    *lock(&self.locks) = locks;
                    *lock(&self.kept) = Some((f, read_at));
                    return Err(err.to_string());
                }
            }
        }
        if !free.is_empty() {
            *lock(&self.locks) = locks;
            *lock(&self.kept) = Some((f, read_at));
            return Ok(Some(free));
        }
        let fired = {
            let batches = f.batches.iter_mut().enumerate().map(|(i, (_, w))| {
                Box::pin(async move {
                    w.await;
                    Fired::Batch(i)
                }) as futures_util::future::BoxFuture<'_, Fired>
            });
            let stale = f.stale.iter_mut().map(|w| {
                Box::pin(async move {
                    w.await;
                    Fired::Stale
                }) as futures_util::future::BoxFuture<'_, Fired>
            });
            let held = locks.iter_mut().enumerate().map(|(i, (_, w))| {
                Box::pin(async move {
                    w.await;
                    Fired::Lock(i)
                }) as futures_util::future::BoxFuture<'_, Fired>
            });
            // None set (the session lost): the re-read below wakes it.
            let any = lading_core::tree::first_ready(batches.chain(held).chain(stale));
            let reread = tokio::time::sleep_until(read_at + finishing_reread(e));
            let landing = !lock(&self.landing).is_empty();
            let recheck = async {
                match landing {
                    true => tokio::time::sleep(landing_recheck(e)).await,
                    false => std::future::pending().await,
                }
            };
            self.ingest.finishing.armed.send_modify(|n| *n += 1);
            tokio::select! {
                // In order, not at random: a run is the same every time (`lading-sim`).
                biased;
                _ = stop.into_stopped() => None,
                _ = reread => Some(Fired::Stale),
                (_, w) = any => Some(w),
                _ = recheck => Some(Fired::Landing),
            }
        };
        let lock_fired = match fired {
            Some(Fired::Lock(i)) => Some(locks.swap_remove(i).0),
            _ => None,
        };
        *lock(&self.locks) = locks;
        match fired {
            // Stopping: nothing is kept.
            None => Ok(None),
            // Read the list again (and check every batch) next round.
            Some(Fired::Stale) => Ok(None),
            Some(Fired::Lock(_)) => {
                *lock(&self.kept) = Some((f, read_at));
                Ok(lock_fired.map(|b| vec![b]))
            }
            Some(Fired::Landing) => {
                *lock(&self.kept) = Some((f, read_at));
                Ok(Some(
                    lock(&self.landing).iter().map(|(b, _)| b.clone()).collect(),
                ))
            }
            Some(Fired::Batch(i)) => {
                // Fired, so never polled again: set anew before its batch is checked.
                let (b, _) = f.batches.swap_remove(i);
                match e.watch_finishing_one(&b).await {
                    Ok(Some(w)) => f.batches.push((b.clone(), w)),
                    Ok(None) => {}
                    Err(err) => return Err(err.to_string()),
                }
                *lock(&self.kept) = Some((f, read_at));
                Ok(Some(vec![b]))
            }
        }
    }
    async fn handle(&self, batches: Self::Lease, _: &mut Shutdown) -> Option<Self::Lease> {
        let mut moved = 0;
        let e = &self.ingest.engine;
        for b in batches {
            // Found landing for longer than a re-read's period: the job that left is taken to
            // be gone for good (its mover crashed between its requests, or it was deleted).
            let since = lock(&self.landing)
                .iter()
                .find(|(x, _)| *x == b)
                .map(|l| l.1);
            let given_up = since.is_some_and(|t| t.elapsed() >= finishing_reread(e));
            let tried = match given_up {
                true => e.report_landed(&b).await,
                false => e.try_report(&b).await,
            };
            if !matches!(tried, Ok(ReportTry::Landing) | Err(_)) {
                lock(&self.landing).retain(|(x, _)| *x != b);
            }
            match tried {
                Ok(ReportTry::Landing) => {
                    if since.is_none() {
                        lock(&self.landing).push((b, tokio::time::Instant::now()));
                    }
                    self.ingest.finishing.landing.send_modify(|n| *n += 1);
                }
                Ok(ReportTry::Moved) => moved += 1,
                Ok(ReportTry::Held) => {
                    lock(&self.held).push(b);
                    self.ingest.finishing.held.send_modify(|n| *n += 1);
                }
                Ok(ReportTry::NotFinished) => {}
                Err(e) => {
                    tracing::warn!(batch = %b, error = %e, "checking a finished batch failed")
                }
            }
        }
        if moved > 0 {
            tracing::info!(batches = moved, "finished batches moved on to Reporting");
        }
        None
    }
    async fn release(&self, _: Self::Lease) {}
}
