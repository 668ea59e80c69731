//! What a handler gets: the job and batch contexts, the stage traits, a job's log and its
//! working folder.

use super::*;
use lading_core::layout::{BatchSubmission, JobConfiguration};

/// One job in the hands of a handler.
pub struct JobCtx {
    pub engine: Arc<Engine>,
    /// The job as it was read when the handler started.
    pub info: JobInfo,
    /// This attempt's number in the current stage, from 1.
    pub attempt: u32,
    /// The job's working folder, made the job's on first use (see [`JobCtx::workdir`]).
    pub(crate) workdir: PathBuf,
    /// Who the working folder belongs to (the mark [`claim_workdir`] keeps in it).
    pub(crate) owner: String,
    /// The working folder claimed in this attempt, or why it could not be.
    pub(crate) claimed: std::sync::OnceLock<Result<(), String>>,
    pub(crate) info_id: JobId,
    pub(crate) lease: Mutex<JobLease>,
}

impl JobCtx {
    pub fn job(&self) -> &JobId {
        &self.info_id
    }

    pub fn state(&self) -> JobState {
        self.info.status.status
    }

    /// The job's working folder: interim state that lets a retried or recovered job do only
    /// the work left lives here, and its log. Made this job's on first use in the attempt
    /// (created, adopted, or another job's folder moved aside: [`claim_workdir`]), so a
    /// stage that keeps nothing there touches no file (when every stage claimed it, the
    /// claim was 7% of `lading-sim`'s CPU and the sweep of the folders it made 3%). A
    /// folder that cannot be made is a transient failure, named.
    pub fn workdir(&self) -> Result<&Path, Outcome> {
        let claimed = self.claimed.get_or_init(|| {
            claim_workdir(&self.workdir, &self.owner, self.engine.clock().now_ms()).map_err(|e| {
                format!(
                    "cannot create working directory {}: {e}",
                    self.workdir.display()
                )
            })
        });
        match claimed {
            Ok(()) => Ok(&self.workdir),
            Err(reason) => Err(Outcome::Transient(reason.clone())),
        }
    }

    /// The job's configuration; one of another shape fails the job, naming the node.
    pub fn config(&self) -> Result<&JobConfiguration, Outcome> {
        (self.info.configuration.typed()).map_err(|e| Outcome::Fatal(e.to_string()))
    }

    pub async fn set_space_needed(&self, bytes: u64) -> Result<(), EngineError> {
        let lease = self.lease.lock().await;
        self.engine.set_space_needed(&lease, bytes).await
    }

    /// Reserves working space for the job (see `Engine::reserve_space`): `None` when
    /// reserved, else the bytes other jobs hold on that root.
    pub async fn reserve_space(
        &self,
        root: &str,
        bytes: u64,
        free: u64,
        keep: u64,
    ) -> Result<Option<u64>, EngineError> {
        let mut lease = self.lease.lock().await;
        self.engine
            .reserve_space(&mut lease, root, bytes, free, keep)
            .await
    }

    /// The ops fencing a write of the handler's own beside the job (see
    /// `Engine::job_fence`): first in its `multi`, they make it fail once the lease is lost.
    pub async fn fence(&self) -> Result<lading_engine::Fence, EngineError> {
        let lease = self.lease.lock().await;
        self.engine.job_fence(&lease)
    }

    /// Whether the handler still holds its lease, asked of the store (one round trip of the
    /// fence alone): false once its lock is gone or its session ended, and when the store
    /// cannot say. A handler that has lost its lease may still be running (its session
    /// expired under it); what it would destroy may by then be its successor's.
    pub async fn holds_lease(&self) -> bool {
        let Ok(fence) = self.fence().await else {
            return false;
        };
        matches!(
            fence
                .multi(&**self.engine.tree(), self.info_id.as_str(), Vec::new())
                .await,
            Ok(Ok(_))
        )
    }

    pub async fn set_priority(&self, priority: u8) -> Result<(), EngineError> {
        let mut lease = self.lease.lock().await;
        self.engine.set_priority(&mut lease, priority).await
    }

    pub async fn priority(&self) -> u8 {
        self.lease.lock().await.priority
    }

    /// Writes one of the job's JSON data nodes.
    pub async fn set_data(&self, data: JobData<'_>) -> Result<(), EngineError> {
        let lease = self.lease.lock().await;
        self.engine.set_job_data(&lease, data).await
    }

    /// An outside effect of this job moving on (its handler returning `Done`): recorded in
    /// the outbox in the move's own `multi` and delivered after it commits; dropped when the
    /// handler ends any other way.
    pub async fn add_effect(&self, effect: Effect) {
        self.lease.lock().await.effects.push(effect);
    }

    /// Appends a line to the job's log (`job.log` in its working directory).
    pub fn log(&self, line: &str) {
        match self.workdir() {
            Ok(dir) => append_log(dir, self.state().name(), line, self.engine.clock().now_ms()),
            Err(e) => {
                tracing::warn!(job = %self.info_id, error = ?e, line, "cannot write the job log")
            }
        }
    }
}

/// Appends `line` to `dir/job.log`, stamped with `now_ms` (the engine's clock) and the
/// stage, without the passwords of the URLs it quotes. A log that cannot be written is
/// reported through tracing and otherwise ignored: it must not fail the job. The line goes
/// out in one write, so lines appended at once by two handlers of the job never interleave
/// (`writeln!` on the file wrote each line in six pieces).
pub fn append_log(dir: &Path, stage: &str, line: &str, now_ms: u64) {
    use std::io::Write;
    let mut text = lading_core::time::format_ts(now_ms);
    text.push_str(" [");
    text.push_str(stage);
    text.push_str("] ");
    text.push_str(&lading_core::text::without_passwords(line));
    text.push('\n');
    let r = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("job.log"))
        .and_then(|mut f| f.write_all(text.as_bytes()));
    if let Err(e) = r {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot write the job log");
    }
}

/// One batch in the hands of a handler.
pub struct BatchCtx {
    pub engine: Arc<Engine>,
    pub info: BatchInfo,
    pub attempt: u32,
    pub(crate) batch_id: BatchId,
    /// Shared by a handler's concurrent calls (intake creates jobs many at a time); taken
    /// whole once the handler is done, so no call of it is still using the lease.
    pub(crate) lease: RwLock<BatchLease>,
}

impl BatchCtx {
    pub fn batch(&self) -> &BatchId {
        &self.batch_id
    }

    /// The batch's status as this handler's lease took it.
    pub async fn leased_status(&self) -> lading_core::layout::BatchStatus {
        self.lease.read().await.status.clone()
    }

    /// The batch's submission; one of another shape fails the batch, naming the node.
    pub fn submission(&self) -> Result<&BatchSubmission, Outcome> {
        (self.info.submission.typed()).map_err(|e| Outcome::Fatal(e.to_string()))
    }

    /// Sets the `status-report` and the outside effects written with the move that ends this
    /// handler's work (Done, or Fatal from the handler itself; not a retry that ran out).
    pub async fn set_report(
        &self,
        report: lading_core::layout::StatusReport,
        effects: Vec<Effect>,
    ) {
        let mut lease = self.lease.write().await;
        lease.report = Some(report);
        lease.effects = effects;
    }

    /// Writes the batch's `status-report` now, on its own.
    pub async fn write_status_report(
        &self,
        report: &lading_core::layout::StatusReport,
    ) -> Result<(), EngineError> {
        let lease = self.lease.read().await;
        self.engine.write_status_report(&lease, report).await
    }

    /// Creates a job of this batch (intake).
    pub async fn create_job(&self, spec: JobSpec) -> Result<JobId, EngineError> {
        let lease = self.lease.read().await;
        self.engine.create_job(&lease, spec).await
    }
}

/// A job stage: the handler of one job state.
pub trait JobStage: Send + Sync + 'static {
    /// The state whose jobs this stage takes.
    fn state(&self) -> JobState;
    /// Where `Done` moves the job; the state's success successor unless said otherwise.
    fn success(&self) -> Event<JobState> {
        Event::Success
    }
    /// Attempts this job gets in this stage, when it differs from the stage's configured
    /// `max_attempts` (e.g. a profile's own limit).
    fn max_attempts(&self, _job: &JobInfo) -> Option<u32> {
        None
    }
    fn run(&self, job: Arc<JobCtx>) -> BoxFuture<'static, Outcome>;
}

/// A batch stage (intake, reporting, update-reporting).
pub trait BatchStage: Send + Sync + 'static {
    fn state(&self) -> BatchState;
    fn success(&self) -> Event<BatchState> {
        Event::Success
    }
    fn run(&self, batch: Arc<BatchCtx>) -> BoxFuture<'static, Outcome>;
    /// What the batch's failure in this stage reports, when the stage gives up on it (a
    /// fatal outcome, or its retries ran out) and the handler set no report itself: the
    /// `status-report` and the outside effects (a mail) written with its move to Failed.
    /// Nothing, unless the stage says.
    fn on_failure(
        &self,
        _batch: Arc<BatchCtx>,
        _reason: String,
    ) -> BoxFuture<'static, Option<(lading_core::layout::StatusReport, Vec<Effect>)>> {
        Box::pin(async { None })
    }
}

/// `configuration.working_dir` when set, else `work_root/JID`.
pub fn workdir(work_root: &Path, info: &JobInfo) -> PathBuf {
    match info.configuration.text("working_dir") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => work_root.join(info.id.as_str()),
    }
}

/// The first `expected + 1` bytes of an owner mark at most: enough to tell it from `expected`
/// bytes, and a mark of any size is never read whole (no statx for its size either: this is
/// read at every stage of every job).
fn read_mark(mark: &Path, expected: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut found = Vec::with_capacity(expected + 1);
    std::fs::File::open(mark)?
        .take(expected as u64 + 1)
        .read_to_end(&mut found)?;
    Ok(found)
}

/// Makes `dir` the working folder of `owner`: created with an owner mark
/// (`.lading/owner`), or adopted when its mark is `owner`'s. A folder marked for another job
/// (the same job id in another tree sharing this data folder) is moved aside, never used, so
/// no file of another job reaches this one. A folder without a mark (made before marks were
/// kept) is adopted. A folder moved aside is named for the time `now_ms` (the engine's
/// clock).
pub fn claim_workdir(dir: &Path, owner: &str, now_ms: u64) -> std::io::Result<()> {
    let mark = dir.join(".lading").join("owner");
    match read_mark(&mark, owner.len()) {
        Ok(found) if found == owner.as_bytes() => return Ok(()),
        Ok(found) => {
            let found = String::from_utf8_lossy(&found);
            let base = format!(
                "{}.other-{}",
                dir.file_name().and_then(|n| n.to_str()).unwrap_or("job"),
                now_ms
            );
            // Two moves within one millisecond must not meet (the second failed with
            // "Directory not empty").
            let aside = (0..)
                .map(|n| match n {
                    0 => dir.with_file_name(&base),
                    n => dir.with_file_name(format!("{base}-{n}")),
                })
                .find(|p| !p.exists())
                .expect("a free name");
            tracing::warn!(dir = %dir.display(), %found, %owner, aside = %aside.display(),
                "the working folder belongs to another job; moved aside");
            std::fs::rename(dir, &aside)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::create_dir_all(dir.join(".lading"))?;
    let tmp = dir.join(".lading").join("owner.tmp");
    std::fs::write(&tmp, owner)?;
    std::fs::rename(&tmp, &mark)
}

#[cfg(test)]
mod tests {
    use super::{append_log, claim_workdir};

    /// Lines appended at once by several handlers each reach the log whole, one to a line,
    /// and a URL's password never does.
    #[test]
    fn log_lines_appended_at_once_stay_whole() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().to_path_buf();
        std::thread::scope(|s| {
            for t in 0..4 {
                let dir = &dir;
                s.spawn(move || {
                    for i in 0..200 {
                        let line = format!("writer {t} line {i} https://u:secret@host/p");
                        append_log(dir, "downloading", &line, 1_000);
                    }
                });
            }
        });
        let log = std::fs::read_to_string(dir.join("job.log")).unwrap();
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 800);
        let stamp = lading_core::time::format_ts(1_000);
        for l in &lines {
            let rest = l
                .strip_prefix(&format!("{stamp} [downloading] writer "))
                .unwrap_or_else(|| panic!("a broken line: {l:?}"));
            assert!(rest.contains(" line "), "a broken line: {l:?}");
            assert!(!rest.contains("secret"), "a password in the log: {l:?}");
        }
        for t in 0..4 {
            let n = lines
                .iter()
                .filter(|l| l.contains(&format!("writer {t} line ")))
                .count();
            assert_eq!(n, 200);
        }
    }

    /// A mark that only begins or ends like the owner's, or is not text, is another owner's:
    /// the folder is moved aside whole and a fresh one is marked.
    #[test]
    fn a_mark_not_exactly_the_owners_moves_the_folder_aside() {
        for (i, found) in [&b"jid-1x"[..], b"jid-", b"\xff\xfe"]
            .into_iter()
            .enumerate()
        {
            let root = tempfile::tempdir().unwrap();
            let dir = root.path().join("jid");
            std::fs::create_dir_all(dir.join(".lading")).unwrap();
            std::fs::write(dir.join(".lading/owner"), found).unwrap();
            std::fs::write(dir.join("kept"), b"theirs").unwrap();
            claim_workdir(&dir, "jid-1", 1_000 + i as u64).unwrap();
            let aside = root.path().join(format!("jid.other-{}", 1_000 + i));
            assert_eq!(std::fs::read(aside.join(".lading/owner")).unwrap(), found);
            assert_eq!(std::fs::read(aside.join("kept")).unwrap(), b"theirs");
            assert_eq!(std::fs::read(dir.join(".lading/owner")).unwrap(), b"jid-1");
            assert!(!dir.join("kept").exists());
        }
        // The owner's own mark: adopted, nothing moved.
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("jid");
        claim_workdir(&dir, "jid-1", 5).unwrap();
        std::fs::write(dir.join("mine"), b"x").unwrap();
        claim_workdir(&dir, "jid-1", 6).unwrap();
        assert!(dir.join("mine").exists());
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 1);
    }
}
