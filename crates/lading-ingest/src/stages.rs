//! The job stages, Pending to Notify. Each is a handler for the worker framework; what a
//! retried or recovered job needs to skip done work lives in its working directory.

use crate::checkm::{self, FileEntry, ManifestKind};
use crate::fetch::{Fetched, file_sha256};
use crate::{Ingest, fatal_or_transient};
use lading_core::JobState;
use lading_core::tree::BoxFuture;
use lading_core::{Event, layout::ark_node_name};
use lading_engine::EngineError;
use lading_worker::{JobCtx, JobStage, Outcome};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The object's files inside the working directory.
pub const PRODUCER: &str = "producer";
/// Downloaded containers, before processing unpacks them.
pub const CONTAINER: &str = "container";
/// Files Lading writes about the object (its manifest).
pub const SYSTEM: &str = "system";
/// Interim state of the stages.
pub const INTERIM: &str = ".lading";
/// The object manifest as fetched.
const FETCHED_MANIFEST: &str = "mrt-ingest-manifest.checkm";

macro_rules! stage {
    ($ty:ident, $state:expr, $method:ident $(, success = $succ:expr)?) => {
        impl JobStage for $ty {
            fn state(&self) -> JobState {
                $state
            }
            $(fn success(&self) -> Event<JobState> {
                $succ
            })?
            fn max_attempts(&self, job: &lading_engine::JobInfo) -> Option<u32> {
                profile_attempts(&self.0, job, $state)
            }
            fn run(&self, job: Arc<JobCtx>) -> BoxFuture<'static, Outcome> {
                let ingest = self.0.clone();
                Box::pin(async move { $method(&ingest, &job).await.unwrap_or_else(|o| o) })
            }
        }
    };
}

/// Pending → Estimating: the queue's entry point (quotas will sit here).
pub struct Start(pub Arc<Ingest>);
stage!(
    Start,
    JobState::Pending,
    start,
    success = Event::To(JobState::Estimating)
);

/// Pending → Estimating, within the submitter's quota for the profile (see [`crate::quota`]).
async fn start(ingest: &Ingest, job: &JobCtx) -> Result<Outcome, Outcome> {
    let profile_name = job.config_str("profile_name").unwrap_or_default();
    let profile = ingest.profile(profile_name).map_err(Outcome::fatal)?;
    let Some(limit) = profile.max_in_flight_per_submitter else {
        return Ok(Outcome::Done);
    };
    let submitter = job.config_str("submitter").unwrap_or_default();
    match crate::quota::reserve(
        &job.engine,
        profile_name,
        submitter,
        job.job(),
        limit as usize,
    )
    .await
    .map_err(engine_err)?
    {
        crate::quota::Slot::Granted => {
            crate::quota::unpark(&job.engine, profile_name, submitter, job.job())
                .await
                .map_err(engine_err)?;
            Ok(Outcome::Done)
        }
        crate::quota::Slot::Full(n) => {
            // Parked until a slot frees (the waker wakes it), not polled.
            crate::quota::park(&job.engine, profile_name, submitter, job.job())
                .await
                .map_err(engine_err)?;
            Ok(Outcome::Wait {
                after: crate::quota::PARK,
                reason: format!(
                    "{submitter} has {n} jobs of profile {profile_name} in flight (limit {limit}); \
                     waiting for one to finish"
                ),
            })
        }
    }
}

/// Estimating: HEAD every file, `space_needed` = the sum; large jobs get a lower priority.
pub struct Estimate(pub Arc<Ingest>);
stage!(Estimate, JobState::Estimating, estimate);

/// Provisioning: wait for room on the working storage.
pub struct Provision(pub Arc<Ingest>);
stage!(Provision, JobState::Provisioning, provision);

/// Downloading: every file into the working directory, verified, resumable.
pub struct Download(pub Arc<Ingest>);
stage!(Download, JobState::Downloading, download);

/// Processing: unpack, manifest with digests, identifier, the profile's command.
pub struct Process(pub Arc<Ingest>);
stage!(Process, JobState::Processing, process);

/// Storing: a new version in the storage root, atomically.
pub struct Store(pub Arc<Ingest>);
stage!(Store, JobState::Storing, store);

/// Recording: the version into the inventory database.
pub struct Record(pub Arc<Ingest>);
stage!(Record, JobState::Recording, record);

/// Notify: the profile's callback.
pub struct Notify(pub Arc<Ingest>);
stage!(Notify, JobState::Notify, notify);

/// The profile's own attempt limit for `state`, if it sets one (`[max_attempts]` in the
/// profile, keyed by the stage's lower-case name).
fn profile_attempts(ingest: &Ingest, job: &lading_engine::JobInfo, state: JobState) -> Option<u32> {
    let name = job.configuration.get("profile_name")?.as_str()?;
    let profile = ingest.profile(name).ok()?;
    profile.max_attempts.get(state.node_name()).copied()
}

fn engine_err(e: EngineError) -> Outcome {
    e.into()
}

pub(crate) fn io_err(what: &str, path: &Path, e: std::io::Error) -> Outcome {
    // A full disk or a vanished mount may recover; a name that cannot exist here will not.
    // Messages name the file, not the server's folders.
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if is_permanent(&e) {
        Outcome::Fatal(format!("{what} {name:?}: {e}"))
    } else {
        Outcome::Transient(format!("{what} {name:?}: {e}"))
    }
}

/// File-system errors that trying again cannot clear: a name too long, a file where a folder
/// must be (or the other way round), a name that is not valid here.
pub fn is_permanent(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ENAMETOOLONG
                | libc::ENOTDIR
                | libc::EISDIR
                | libc::EEXIST
                | libc::EINVAL
                | libc::ELOOP
        )
    )
}

/// Whose URLs a job holds.
fn trust(job: &JobCtx) -> crate::policy::Trust {
    crate::policy::Trust::from_fields(|k| job.config_str(k))
}

/// The files of a job's object: the manifest's rows, or the one file/container.
/// `fetch_manifest` false means a missing manifest is an error rather than a fetch.
async fn object_files(ingest: &Ingest, job: &JobCtx) -> Result<Vec<FileEntry>, Outcome> {
    let ty = job.config_str("payload_type").unwrap_or("file");
    if ty == "manifest" {
        let url = job
            .config_str("payload_url")
            .ok_or_else(|| Outcome::fatal("the job has no payload_url"))?;
        let saved = job.workdir.join(SYSTEM).join(FETCHED_MANIFEST);
        // The copy is the job's own until an admin requeues it (which counts a retry): then
        // the depositor's manifest is fetched again, so a corrected one is read.
        let fetched_at = job.workdir.join(INTERIM).join("manifest-retry");
        let retry = job.info.status.retry_count.to_string();
        let current = std::fs::read_to_string(&fetched_at).is_ok_and(|r| r == retry);
        let text = match tokio::fs::read_to_string(&saved).await {
            Ok(t) if current => t,
            _ => {
                let t = ingest
                    .fetcher
                    .get_text(url, &trust(job))
                    .await
                    .map_err(fatal_or_transient)?;
                write_atomic(&saved, t.as_bytes()).map_err(|e| io_err("writing", &saved, e))?;
                write_atomic(&fetched_at, retry.as_bytes())
                    .map_err(|e| io_err("writing", &fetched_at, e))?;
                t
            }
        };
        let limits = checkm::Limits::from(ingest.fetcher.limits());
        let m = tokio::task::spawn_blocking(move || checkm::parse_within(&text, &limits))
            .await
            .map_err(|e| Outcome::Transient(e.to_string()))?
            .map_err(|e| Outcome::fatal(format!("{}: {e}", crate::intake::shown_url(url))))?;
        if m.kind != ManifestKind::Object {
            return Err(Outcome::fatal(format!(
                "{url} is a {}, not an object manifest",
                m.kind.profile_name()
            )));
        }
        let files: Vec<FileEntry> = m
            .rows
            .iter()
            .map(|r| r.file_entry())
            .collect::<Result<_, _>>()
            .map_err(|e| Outcome::fatal(format!("{url}: {e}")))?;
        if let crate::policy::Trust::Depositor { .. } = trust(job) {
            for (f, r) in files.iter().zip(&m.rows) {
                if let Err(why) = ingest.fetcher.policy().check(&f.url) {
                    return Err(Outcome::fatal(format!(
                        "{url}: manifest line {}: {:?} refused by the payload policy: {why}",
                        r.line, f.url
                    )));
                }
            }
        }
        let mut names = std::collections::HashSet::new();
        for f in &files {
            if let Err(why) = check_file_name(&f.name) {
                return Err(Outcome::fatal(format!("{url}: {why}")));
            }
            if !names.insert(f.name.as_str()) {
                return Err(Outcome::fatal(format!(
                    "{url}: file name {:?} appears twice",
                    f.name
                )));
            }
        }
        return Ok(files);
    }
    let f: FileEntry = match job.info.configuration.get("file") {
        Some(f) => serde_json::from_value(f.clone())
            .map_err(|e| Outcome::fatal(format!("bad file entry: {e}")))?,
        // A job configuration as Merritt's `Job.createJobConfiguration` writes it: the file
        // (or container) is the payload URL, named by its last segment.
        None => {
            let url = job
                .config_str("payload_url")
                .ok_or_else(|| Outcome::fatal("the job names no file and has no payload_url"))?;
            let name = checkm::url_file_name(url)
                .ok_or_else(|| Outcome::fatal(format!("no file name in payload URL {url:?}")))?;
            FileEntry {
                url: url.to_string(),
                name,
                size: None,
                digest: None,
            }
        }
    };
    check_file_name(&f.name).map_err(Outcome::fatal)?;
    Ok(vec![f])
}

/// Longest name of one path segment a file system here takes.
pub const MAX_SEGMENT_BYTES: usize = 250;

/// A file name (a relative path) that can be created in a working folder, or why not. Each
/// segment leaves room for the `.part` a download writes first.
pub fn check_file_name(name: &str) -> Result<(), String> {
    checkm::check_relative_path(name)?;
    if let Some(seg) = name.split('/').find(|s| s.len() > MAX_SEGMENT_BYTES) {
        return Err(format!(
            "file name {:?}… has a part of {} bytes, over the limit of {MAX_SEGMENT_BYTES}",
            seg.chars().take(32).collect::<String>(),
            seg.len()
        ));
    }
    Ok(())
}

/// Writes through a temporary file and a rename, so a reader sees all or nothing (not
/// synced: callers that need durability sync what they wrote).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    std::fs::rename(&tmp, path)
}

/// Marks `dir` as the top of a directory hierarchy (ext4's `T` attribute, what `chattr +T`
/// sets), so the file system spreads the folders made in it — one per job, one per object —
/// across its block groups instead of packing them all into the group of `dir`.
///
/// Why: new files go into the block group of their folder, and a file system without a
/// journal makes every new inode step over the free ones deleted in that group in the last
/// `dirty_expire` interval. Working folders are made and removed all day, so packed into one
/// group each new job pays for every recent cleanup (measured: `bench pipeline` spent 40% of
/// its time there on a busy folder). Returns whether the attribute is set now; a file system
/// without it (`ENOTTY`, `EOPNOTSUPP`, `EINVAL`) is not an error.
pub fn spread_subdirs(dir: &Path) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let d = std::fs::File::open(dir)?;
    let Some(flags) = inode_flags(&d)? else {
        return Ok(false);
    };
    if flags & TOPDIR != 0 {
        return Ok(true);
    }
    let flags = flags | TOPDIR;
    // SAFETY: FS_IOC_SETFLAGS reads one int from `flags`; `d` is open.
    if unsafe { libc::ioctl(d.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) } != 0 {
        return unsupported::<()>(std::io::Error::last_os_error()).map(|_| false);
    }
    Ok(true)
}

/// `FS_TOPDIR_FL` in `linux/fs.h`.
const TOPDIR: libc::c_int = 0x0002_0000;

/// The inode flags of `f` (what `lsattr` shows); `None` where the file system has none.
fn inode_flags(f: &std::fs::File) -> std::io::Result<Option<libc::c_int>> {
    use std::os::fd::AsRawFd;
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int into `flags`, which we own; `f` is open.
    if unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) } != 0 {
        return unsupported(std::io::Error::last_os_error());
    }
    Ok(Some(flags))
}

/// `Ok(None)` for the errors of a file system without inode flags, `Err` for the others.
fn unsupported<T>(e: std::io::Error) -> std::io::Result<Option<T>> {
    match e.raw_os_error() {
        Some(libc::ENOTTY | libc::EOPNOTSUPP | libc::EINVAL) => Ok(None),
        _ => Err(e),
    }
}

/// Fsyncs `dir` and every folder under it, so the names of files synced inside are durable
/// too.
pub fn sync_dirs(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            sync_dirs(&e.path())?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

async fn estimate(ingest: &Ingest, job: &JobCtx) -> Result<Outcome, Outcome> {
    // Never fails: what cannot be sized counts 0.
    let files = match object_files(ingest, job).await {
        Ok(f) => f,
        Err(o) => {
            job.log(&format!("cannot list the files yet ({o:?}); size unknown"));
            return Ok(Outcome::Done);
        }
    };
    let sem = Arc::new(tokio::sync::Semaphore::new(
        ingest.cfg.estimate_concurrency.max(1),
    ));
    let mut set = tokio::task::JoinSet::new();
    for f in files {
        let (fetcher, sem, trust) = (ingest.fetcher.clone(), sem.clone(), trust(job));
        set.spawn(async move {
            // A declared size is what the download will be held to: no need to ask.
            if let Some(n) = f.size {
                return n;
            }
            let _permit = sem.acquire_owned().await;
            fetcher.head_len(&f.url, &trust).await.unwrap_or(0)
        });
    }
    let mut total = 0u64;
    while let Some(r) = set.join_next().await {
        total = total.saturating_add(r.unwrap_or(0));
    }
    job.set_space_needed(total).await.map_err(engine_err)?;
    job.log(&format!("space needed: {total} bytes"));
    if total > ingest.cfg.large_job_bytes {
        let p = ingest.cfg.large_job_priority;
        if job.priority().await < p {
            job.set_priority(p).await.map_err(engine_err)?;
            job.log(&format!("large job: priority lowered to {p}"));
        }
    }
    Ok(Outcome::Done)
}

/// `statvfs` of the file system holding `path`.
fn statvfs(path: &Path) -> std::io::Result<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("path contains NUL"))?;
    // SAFETY: statvfs writes into the zeroed struct we own; `c` is a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(s)
}

/// Free bytes for unprivileged users on the file system holding `path`.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let s = statvfs(path)?;
    Ok((s.f_bavail as u64).saturating_mul(s.f_frsize as u64))
}

async fn provision(ingest: &Ingest, job: &JobCtx) -> Result<Outcome, Outcome> {
    let root = ingest.cfg.work_dir();
    let free = free_bytes(&root).map_err(|e| io_err("checking free space on", &root, e))?;
    let needed = job.info.space_needed;
    let round = Duration::from_millis(ingest.cfg.provisioning_round_ms);
    if needed == 0 {
        if free < ingest.cfg.unestimated_min_free_bytes {
            return Ok(Outcome::Wait {
                after: round,
                reason: format!(
                    "waiting for space: size unknown and only {free} bytes free (under {})",
                    ingest.cfg.unestimated_min_free_bytes
                ),
            });
        }
        return Ok(Outcome::Done);
    }
    let want = needed.saturating_add(ingest.cfg.reserve_bytes);
    let capacity = total_bytes(&root).map_err(|e| io_err("checking the size of", &root, e))?;
    if want > capacity {
        return Err(Outcome::fatal(format!(
            "the job needs {needed} bytes plus a reserve of {}, more than the working storage \
             holds ({capacity} bytes); it can never fit",
            ingest.cfg.reserve_bytes
        )));
    }
    let since = space_wait_since(&job.workdir);
    if free < want {
        let waited = since.elapsed().unwrap_or_default();
        let max = Duration::from_secs(ingest.cfg.payload.max_space_wait_s);
        if waited >= max {
            return Err(Outcome::fatal(format!(
                "gave up waiting for space after {} s (payload.max_space_wait_s): needs \
                 {needed} bytes plus a reserve of {}, {free} free",
                waited.as_secs(),
                ingest.cfg.reserve_bytes
            )));
        }
        return Ok(Outcome::Wait {
            after: round,
            reason: format!(
                "waiting for space: needs {needed} bytes plus a reserve of {}, {free} free",
                ingest.cfg.reserve_bytes
            ),
        });
    }
    // Reserved in the tree until the download ends: jobs admitted at the same moment, here
    // or on other hosts, do not count the same free space twice.
    let root_id = ingest.cfg.work_root_id();
    if let Some(held) = job
        .reserve_space(&root_id, needed, free, ingest.cfg.reserve_bytes)
        .await?
    {
        return Ok(Outcome::Wait {
            after: round,
            reason: format!(
                "waiting for space: needs {needed} bytes plus a reserve of {}, {free} free of \
                 which {held} are reserved by jobs admitted before",
                ingest.cfg.reserve_bytes
            ),
        });
    }
    let _ = std::fs::remove_file(job.workdir.join(INTERIM).join(SPACE_WAIT));
    Ok(Outcome::Done)
}

/// When the job started waiting for space (a marker in its working folder).
const SPACE_WAIT: &str = "space-wait";

fn space_wait_since(workdir: &Path) -> std::time::SystemTime {
    let p = workdir.join(INTERIM).join(SPACE_WAIT);
    if let Ok(t) = std::fs::metadata(&p).and_then(|m| m.modified()) {
        return t;
    }
    let _ = write_atomic(&p, b"");
    std::time::SystemTime::now()
}

/// Size of the file system holding `path`, as unprivileged users can use it.
pub fn total_bytes(path: &Path) -> std::io::Result<u64> {
    let s = statvfs(path)?;
    // Blocks reserved for root are not ours.
    let reserved = (s.f_bfree as u64).saturating_sub(s.f_bavail as u64);
    Ok((s.f_blocks as u64)
        .saturating_sub(reserved)
        .saturating_mul(s.f_frsize as u64))
}

/// Files already downloaded and verified, by name: the downloading stage's interim state.
type Verified = BTreeMap<String, Fetched>;

/// The downloading stage's record: one JSON line per verified file, appended (so recording a
/// file neither creates nor deletes a file: on a busy file system new inodes are what costs).
fn verified_path(workdir: &Path) -> PathBuf {
    workdir.join(INTERIM).join("downloaded.jsonl")
}

/// One line of the record.
#[derive(serde::Serialize, serde::Deserialize)]
struct VerifiedLine {
    name: String,
    #[serde(flatten)]
    fetched: Fetched,
    /// The manifest row it was fetched for (URL, declared size, digest): a requeued job
    /// whose corrected manifest changed the row fetches the file again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<String>,
}

/// What identifies a manifest row's file for [`VerifiedLine::source`].
fn row_source(f: &FileEntry) -> String {
    format!(
        "{} {} {}",
        f.url,
        f.size.map_or("-".into(), |n| n.to_string()),
        f.digest.as_ref().map_or("-".into(), |d| format!("{:?}", d))
    )
}

/// The manifest row each verified file was fetched for, by name (the latest line wins).
fn verified_sources(workdir: &Path) -> BTreeMap<String, Option<String>> {
    let text = std::fs::read_to_string(verified_path(workdir)).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<VerifiedLine>(l).ok())
        .map(|l| (l.name, l.source))
        .collect()
}

/// The record so far; a line cut short by a crash (the last one) is ignored, so that file is
/// fetched again.
fn read_verified(workdir: &Path) -> Verified {
    let text = std::fs::read_to_string(verified_path(workdir)).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<VerifiedLine>(l).ok())
        .map(|l| (l.name, l.fetched))
        .collect()
}

fn append_verified(
    workdir: &Path,
    name: &str,
    fetched: &Fetched,
    source: Option<String>,
) -> std::io::Result<()> {
    use std::io::Write;
    let p = verified_path(workdir);
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d)?;
    }
    let mut line = serde_json::to_vec(&VerifiedLine {
        name: name.to_owned(),
        fetched: fetched.clone(),
        source,
    })
    .map_err(std::io::Error::other)?;
    // A line torn by a crash before this one is ended here, so it spoils only itself.
    line.insert(0, b'\n');
    line.push(b'\n');
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&p)?
        .write_all(&line)
}

async fn download(ingest: &Ingest, job: &JobCtx) -> Result<Outcome, Outcome> {
    let files = object_files(ingest, job).await?;
    // A fair share of the slots for the submitter, given back when it is over it.
    let who = job.config_str("submitter").unwrap_or_default().to_string();
    let _slot = match crate::fair::admit(ingest, &who).await {
        Ok(slot) => slot,
        Err(reason) => {
            return Ok(Outcome::Wait {
                after: crate::fair::CHECK,
                reason,
            });
        }
    };
    tokio::select! {
        r = download_files(ingest, job, files) => r,
        reason = crate::fair::over_share(ingest, &who) => {
            job.log(&reason);
            Ok(Outcome::Wait { after: crate::fair::CHECK, reason })
        }
    }
}

/// Fetches and verifies `files` into the job's working folder (those verified before and
/// unchanged are kept).
async fn download_files(
    ingest: &Ingest,
    job: &JobCtx,
    files: Vec<FileEntry>,
) -> Result<Outcome, Outcome> {
    let into = if job.config_str("payload_type") == Some("container") {
        CONTAINER
    } else {
        PRODUCER
    };
    let mut verified = read_verified(&job.workdir);
    let sources = verified_sources(&job.workdir);
    let attempts = ingest.cfg.file_attempts.max(1);
    for f in &files {
        let dest = job.workdir.join(into).join(&f.name);
        let source = row_source(f);
        let same_row = sources
            .get(&f.name)
            .is_none_or(|s| s.as_deref().is_none_or(|s| s == source));
        if !same_row {
            job.log(&format!(
                "{}: its manifest row changed since it was verified; fetching again",
                f.name
            ));
        }
        if let Some(v) = verified.get(&f.name).filter(|_| same_row) {
            // Verified by an earlier attempt, maybe in a process that crashed before the file
            // reached the disk: trusted only if it still hashes the same.
            let d = dest.clone();
            let same = tokio::task::spawn_blocking(move || file_sha256(&d))
                .await
                .ok()
                .and_then(Result::ok)
                .is_some_and(|(size, sha)| size == v.size && sha == v.sha256);
            if same {
                job.log(&format!("{} already verified; not fetched again", f.name));
                continue;
            }
            job.log(&format!(
                "{} changed since it was verified; fetching again",
                f.name
            ));
        }
        let mut k = 0;
        let got = loop {
            k += 1;
            match ingest
                .fetcher
                .download(&f.url, &dest, f.size, f.digest.as_ref(), &trust(job))
                .await
            {
                Ok(got) => break got,
                Err(crate::fetch::FetchError::Transient(e)) if k < attempts => {
                    let wait = Duration::from_millis(200 << k.min(8));
                    job.log(&format!("{e}; retrying in {} ms", wait.as_millis()));
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(fatal_or_transient(e)),
            }
        };
        job.log(&format!("fetched {} ({} bytes)", f.name, got.size));
        append_verified(&job.workdir, &f.name, &got, Some(source))
            .map_err(|e| io_err("writing", &verified_path(&job.workdir), e))?;
        verified.insert(f.name.clone(), got);
    }
    // Not synced: the working directory is scratch. Processing hashes every file anyway and
    // checks it against what was verified here, so a copy lost to a power cut is caught
    // there, before anything is stored.
    Ok(Outcome::Done)
}

/// Checks the files under `dir` that downloading verified against their recorded digests.
fn check_verified(workdir: &Path, dir: &str, found: &[ObjectFile]) -> Result<(), Outcome> {
    let verified = read_verified(workdir);
    for f in found {
        if let Some(v) = verified.get(&f.path)
            && (v.sha256 != f.sha256 || v.size != f.size)
        {
            return Err(Outcome::fatal(format!(
                "the working copy of {dir}/{} no longer matches what was downloaded and \
                 verified (a crash lost it?); requeue the job to Downloading",
                f.path
            )));
        }
    }
    Ok(())
}

/// One file of a built object.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ObjectFile {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

/// Every regular file under `dir`, relative paths sorted, with size and sha256.
pub fn list_files(dir: &Path) -> std::io::Result<Vec<ObjectFile>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let (size, sha256) = file_sha256(&e.path())?;
                let rel = e
                    .path()
                    .strip_prefix(dir)
                    .map_err(std::io::Error::other)?
                    .to_string_lossy()
                    .into_owned();
                out.push(ObjectFile {
                    path: rel,
                    size,
                    sha256,
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

async fn process(ingest: &Ingest, job: &JobCtx) -> Result<Outcome, Outcome> {
    let wd = job.workdir.clone();
    let producer = wd.join(PRODUCER);
    if job.config_str("payload_type") == Some("container") {
        let marker = wd.join(INTERIM).join("unpacked");
        if !marker.exists() {
            let c = wd.join(CONTAINER);
            let found = tokio::task::spawn_blocking(move || list_files(&c))
                .await
                .map_err(|e| Outcome::Transient(e.to_string()))?
                .map_err(|e| io_err("reading", &wd.join(CONTAINER), e))?;
            check_verified(&wd, CONTAINER, &found)?;
            let (c, p) = (wd.join(CONTAINER), producer.clone());
            let limits = crate::unpack::Limits::from(&ingest.cfg.payload);
            let unpacked =
                tokio::task::spawn_blocking(move || crate::unpack::unpack_all(&c, &p, &limits))
                    .await
                    .map_err(|e| Outcome::Transient(e.to_string()))??;
            // What the job takes now: the containers and what they held.
            let packed: u64 = found.iter().map(|f| f.size).sum();
            job.set_space_needed(packed.saturating_add(unpacked))
                .await
                .map_err(engine_err)?;
            write_atomic(&marker, b"").map_err(|e| io_err("writing", &marker, e))?;
            job.log(&format!("containers unpacked ({unpacked} bytes)"));
        }
    }
    std::fs::create_dir_all(&producer).map_err(|e| io_err("creating", &producer, e))?;
    let p = producer.clone();
    let files = tokio::task::spawn_blocking(move || list_files(&p))
        .await
        .map_err(|e| Outcome::Transient(e.to_string()))?
        .map_err(|e| io_err("reading", &producer, e))?;
    if files.is_empty() {
        return Err(Outcome::fatal("the object has no files"));
    }
    if job.config_str("payload_type") != Some("container") {
        check_verified(&wd, PRODUCER, &files)?;
    }
    // The object's manifest, with digests.
    let rows: Vec<Vec<String>> = files
        .iter()
        .map(|f| {
            vec![
                format!("{PRODUCER}/{}", f.path),
                "sha256".into(),
                f.sha256.clone(),
                f.size.to_string(),
                f.path.clone(),
            ]
        })
        .collect();
    let manifest = checkm::write(ManifestKind::Object, checkm::OBJECT_FIELDS, &rows);
    let mpath = wd.join(SYSTEM).join("manifest.checkm");
    write_atomic(&mpath, manifest.as_bytes()).map_err(|e| io_err("writing", &mpath, e))?;
    // The primary identifier: given, or minted once (kept in the job, so a retry reuses it).
    let mut ids: lading_core::layout::Identifiers =
        serde_json::from_value(job.info.identifiers.clone()).unwrap_or_default();
    let profile = ingest
        .profile(job.config_str("profile_name").unwrap_or_default())
        .map_err(Outcome::fatal)?;
    if ids.primary_id.as_deref().is_none_or(str::is_empty) {
        let shoulder = profile.shoulder.as_deref().unwrap_or(&ingest.cfg.shoulder);
        let minted = format!("{shoulder}{}", uuid::Uuid::new_v4().simple());
        job.log(&format!("minted {minted}"));
        ids.primary_id = Some(minted);
        job.set_data("identifiers", &json!(ids))
            .await
            .map_err(engine_err)?;
    }
    let ark = ids.primary_id.clone().unwrap_or_default();
    crate::intake::check_primary_id(&ark)
        .map_err(|why| Outcome::fatal(format!("primary identifier: {why}")))?;
    check_owner(ingest, &ark, &profile.collection).await?;
    if let Some(cmd) = &profile.command {
        run_command(job, cmd, &ark).await?;
    }
    let size: u64 = files.iter().map(|f| f.size).sum();
    job.set_data(
        "inventory",
        &json!({ "primary_id": ark, "files": files, "size": size }),
    )
    .await
    .map_err(engine_err)?;
    Ok(Outcome::Done)
}

/// Fails unless `ark` is new or belongs to `collection` (the inventory records each object's
/// owning collection).
async fn check_owner(ingest: &Ingest, ark: &str, collection: &str) -> Result<(), Outcome> {
    match crate::inventory::owner_of(&ingest.inventory, ark).await {
        Ok(Some(owner)) if !owner.is_empty() && owner != collection => {
            Err(Outcome::fatal(format!(
                "{ark} belongs to another collection; collection {collection} may not add a version to it"
            )))
        }
        Ok(_) => Ok(()),
        Err(e) => Err(Outcome::Transient(format!("inventory: {e}"))),
    }
}

/// Lines of a failed command's output quoted in the job's message.
const TAIL_LINES: usize = 5;

async fn run_command(job: &JobCtx, cmd: &str, ark: &str) -> Result<(), Outcome> {
    job.log(&format!("running: {cmd}"));
    let out = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(&job.workdir)
        .env("LADING_JOB_ID", job.job().as_str())
        .env("LADING_BATCH_ID", &job.info.bid)
        .env("LADING_PRIMARY_ID", ark)
        .env(
            "LADING_PROFILE",
            job.config_str("profile_name").unwrap_or_default(),
        )
        .env("LADING_WORKDIR", &job.workdir)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| Outcome::Transient(format!("cannot run {cmd:?}: {e}")))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for line in text.lines() {
        job.log(&format!("| {line}"));
    }
    if !out.status.success() {
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n");
        return Err(Outcome::Fatal(format!(
            "processing command exited with {}: {tail}",
            out.status
        )));
    }
    Ok(())
}

/// What the storing stage wrote, kept in `/jobs/JID/store` and in the version's
/// `lading-version.json`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredVersion {
    pub ark: String,
    pub version: u32,
    pub path: String,
    pub job: String,
    pub batch: String,
    /// The collection of the profile that stored it: the object's owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collection: Option<String>,
}

const VERSION_FILE: &str = "lading-version.json";

fn object_ark(job: &JobCtx) -> Result<String, Outcome> {
    job.info
        .identifiers
        .get("primary_id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .ok_or_else(|| Outcome::fatal("the job has no primary identifier (processing sets it)"))
}

/// Versions present under an object directory: `v1`, `v2`, …
fn versions(object_dir: &Path) -> std::io::Result<Vec<u32>> {
    let mut v = Vec::new();
    match std::fs::read_dir(object_dir) {
        Ok(rd) => {
            for e in rd {
                let name = e?.file_name();
                if let Some(n) = name.to_str().and_then(|s| s.strip_prefix('v'))
                    && let Ok(n) = n.parse()
                {
                    v.push(n);
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    v.sort_unstable();
    Ok(v)
}

/// Places the files of `from` under `to`: a hard link where both are on one file system (no
/// second copy of the bytes, no new inode), a copy otherwise (or when `link` is false). Safe
/// because nothing rewrites a working file in place: downloads, unpacking and manifests all
/// write a temporary file and rename it. Returns how many files were linked and copied.
fn place_tree(from: &Path, to: &Path, link: bool) -> std::io::Result<(u64, u64)> {
    std::fs::create_dir_all(to)?;
    let (mut linked, mut copied) = (0, 0);
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let t = e.file_type()?;
        let dest = to.join(e.file_name());
        if t.is_dir() {
            let (l, c) = place_tree(&e.path(), &dest, link)?;
            linked += l;
            copied += c;
        } else if t.is_file() {
            if link && std::fs::hard_link(e.path(), &dest).is_ok() {
                linked += 1;
            } else {
                std::fs::copy(e.path(), &dest)?;
                copied += 1;
            }
            // Only this version's own data is flushed (a file-system-wide sync would also
            // wait for every other job's writes).
            std::fs::File::open(&dest)?.sync_data()?;
        }
    }
    Ok((linked, copied))
}

/// The process's file-creation mask (set by the `lading` binary): files 0600, folders 0700.
pub const DEFAULT_UMASK: u32 = 0o077;

/// Sets the modes of everything under `dir` (and `dir`) as `umask` would have made them.
fn set_modes(dir: &Path, umask: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777 & !umask))?;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            set_modes(&e.path(), umask)?;
        } else if t.is_file() {
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o666 & !umask))?;
        }
    }
    Ok(())
}

/// Lock errors: someone else is on this object; look again shortly.
fn lock_wait(e: EngineError) -> Outcome {
    match e {
        EngineError::Locked(what) => Outcome::Wait {
            after: Duration::from_secs(1),
            reason: format!("{what} is locked by another worker"),
        },
        e => e.into(),
    }
}

async fn store(ingest: &Ingest, job: &JobCtx) -> Result<Outcome, Outcome> {
    let ark = object_ark(job)?;
    let profile = ingest
        .profile(job.config_str("profile_name").unwrap_or_default())
        .map_err(Outcome::fatal)?;
    let root = profile
        .storage_root
        .clone()
        .unwrap_or_else(|| ingest.cfg.storage_root());
    let lock = job.engine.lock_storage(&ark).await.map_err(lock_wait)?;
    let umask = ingest.cfg.storage_umask_bits().map_err(Outcome::fatal)?;
    let r = store_locked(job, &root, &ark, &profile.collection, umask).await;
    let _ = job.engine.unlock_ark(lock).await;
    let stored = r?;
    job.log(&format!("stored {} as version {}", ark, stored.version));
    // Merritt's fields beside Lading's: the store record names the manifest it was given and
    // how (`add` for a new object, `update` for a new version); the inventory record names
    // the stored version's manifest, which the recording stage reads.
    let mode = if stored.version == 1 { "add" } else { "update" };
    let file_url = |p: PathBuf| format!("file://{}", p.display());
    let mut store = json!(stored);
    store["manifest_url"] = json!(file_url(job.workdir.join(SYSTEM).join("manifest.checkm")));
    store["mode"] = json!(mode);
    // Merritt's `Job.setStore` takes `delete` as a string and its reader calls `getString`.
    store["delete"] = json!("false");
    job.set_data("store", &store).await.map_err(engine_err)?;
    let mut inventory = job_json(job, "inventory")
        .await?
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    inventory["manifest_url"] = json!(file_url(
        Path::new(&stored.path).join(SYSTEM).join("manifest.checkm")
    ));
    inventory["mode"] = json!(mode);
    job.set_data("inventory", &inventory)
        .await
        .map_err(engine_err)?;
    Ok(Outcome::Done)
}

async fn store_locked(
    job: &JobCtx,
    root: &Path,
    ark: &str,
    collection: &str,
    umask: u32,
) -> Result<StoredVersion, Outcome> {
    let collection = collection.to_string();
    let object_dir = root.join(ark_node_name(ark));
    let root = root.to_path_buf();
    let (wd, jid, bid, ark) = (
        job.workdir.clone(),
        job.job().to_string(),
        job.info.bid.clone(),
        ark.to_string(),
    );
    tokio::task::spawn_blocking(move || -> Result<StoredVersion, Outcome> {
        let io = |what: &str, p: &Path| {
            let p = p.to_path_buf();
            let what = what.to_string();
            move |e| io_err(&what, &p, e)
        };
        let existing = versions(&object_dir).map_err(io("reading", &object_dir))?;
        // A version this job already stored (it crashed before recording that) is reused.
        for v in existing.iter().rev() {
            let f = object_dir.join(format!("v{v}")).join(VERSION_FILE);
            if let Ok(b) = std::fs::read(&f)
                && let Ok(s) = serde_json::from_slice::<StoredVersion>(&b)
                && s.job == jid
            {
                return Ok(s);
            }
        }
        // Under the object's storage lock: the newest version says who owns it, so two
        // collections racing for one new identifier cannot both write to it.
        if let Some(v) = existing.last() {
            let f = object_dir.join(format!("v{v}")).join(VERSION_FILE);
            if let Ok(b) = std::fs::read(&f)
                && let Ok(s) = serde_json::from_slice::<StoredVersion>(&b)
                && let Some(owner) = s.collection
                && owner != collection
            {
                return Err(Outcome::fatal(format!(
                    "{ark} belongs to another collection; collection {collection} may not add a version to it"
                )));
            }
        }
        let version = existing.last().copied().unwrap_or(0) + 1;
        let new_object = !object_dir.exists();
        if new_object {
            std::fs::create_dir_all(&root).map_err(io("creating", &root))?;
            if let Err(e) = spread_subdirs(&root) {
                tracing::debug!(dir = %root.display(), error = %e, "cannot spread folders");
            }
        }
        let tmp = object_dir.join(format!(".tmp-{jid}"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(io("removing", &tmp))?;
        }
        // Whatever fails from here on leaves no partial copy (and no empty object folder)
        // to take up the storage root's space.
        let scrap = |o: Outcome| {
            let _ = std::fs::remove_dir_all(&tmp);
            if new_object {
                let _ = std::fs::remove_dir(&object_dir);
            }
            o
        };
        for part in [PRODUCER, SYSTEM] {
            let from = wd.join(part);
            if from.exists() {
                place_tree(&from, &tmp.join(part), true)
                    .map_err(io("copying into", &tmp))
                    .map_err(scrap)?;
            }
        }
        let final_dir = object_dir.join(format!("v{version}"));
        let stored = StoredVersion {
            ark,
            version,
            path: final_dir.to_string_lossy().into_owned(),
            job: jid,
            batch: bid,
            collection: Some(collection),
        };
        let vf = tmp.join(VERSION_FILE);
        write_atomic(&vf, &serde_json::to_vec_pretty(&stored).unwrap_or_default())
            .map_err(io("writing", &vf))
            .map_err(scrap)?;
        std::fs::File::open(&vf)
            .and_then(|f| f.sync_data())
            .map_err(io("syncing", &vf))
            .map_err(scrap)?;
        if umask != DEFAULT_UMASK {
            set_modes(&tmp, umask)
                .map_err(io("setting modes in", &tmp))
                .map_err(scrap)?;
        }
        // The copy is durable before it is published.
        sync_dirs(&tmp).map_err(io("syncing", &tmp)).map_err(scrap)?;
        // The rename is the commit: a reader sees no version or a whole one.
        std::fs::rename(&tmp, &final_dir)
            .map_err(io("renaming into", &final_dir))
            .map_err(scrap)?;
        std::fs::File::open(&object_dir)
            .and_then(|d| d.sync_all())
            .map_err(io("syncing", &object_dir))?;
        if new_object {
            // The object's own folder is a new name in the root: durable too.
            std::fs::File::open(&root)
                .and_then(|d| d.sync_all())
                .map_err(io("syncing", &root))?;
        }
        Ok(stored)
    })
    .await
    .map_err(|e| Outcome::Transient(e.to_string()))?
}

/// Removes what failed stores left in the service's storage root: `.tmp-JID` copies of jobs
/// that are not being stored right now (not locked in Storing), and object folders left
/// empty. Run when a process with the storing stage starts. Returns what went.
pub async fn sweep_storage(ingest: &Ingest) -> std::io::Result<usize> {
    let root = ingest.cfg.storage_root();
    let mut debris = Vec::new();
    let mut objects = Vec::new();
    let rd = match std::fs::read_dir(&root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    for e in rd {
        let e = e?;
        if !e.file_type()?.is_dir() {
            continue;
        }
        objects.push(e.path());
        for c in std::fs::read_dir(e.path())? {
            let c = c?;
            let name = c.file_name().to_string_lossy().into_owned();
            if let Some(jid) = name.strip_prefix(".tmp-") {
                debris.push((c.path(), jid.to_string()));
            }
        }
    }
    let mut gone = 0;
    for (path, jid) in debris {
        let busy = match lading_core::layout::JobId::parse(&jid) {
            Ok(j) => ingest
                .engine
                .job(&j)
                .await
                .is_ok_and(|i| i.status.status == JobState::Storing && i.locked),
            Err(_) => false,
        };
        if !busy && std::fs::remove_dir_all(&path).is_ok() {
            gone += 1;
        }
    }
    for o in objects {
        // Only an empty folder goes (remove_dir refuses any other).
        if std::fs::remove_dir(&o).is_ok() {
            gone += 1;
        }
    }
    Ok(gone)
}

/// One of the job's JSON data nodes (`store`, `inventory`, …), if present and JSON.
async fn job_json(job: &JobCtx, name: &str) -> Result<Option<Value>, Outcome> {
    Ok(job
        .engine
        .tree()
        .get(&lading_core::layout::job_node(job.job(), name))
        .await
        .map_err(|e| engine_err(e.into()))?
        .and_then(|n| n.data)
        .and_then(|d| serde_json::from_slice::<Value>(&d).ok()))
}

async fn record(ingest: &Ingest, job: &JobCtx) -> Result<Outcome, Outcome> {
    let stored: StoredVersion = job_json(job, "store")
        .await?
        .and_then(|v| serde_json::from_value(v).ok())
        .ok_or_else(|| Outcome::fatal("the job has no store record (storing writes it)"))?;
    let lock = job
        .engine
        .lock_inventory(&stored.ark)
        .await
        .map_err(lock_wait)?;
    // The object's files as processing hashed them.
    let producer: Option<Vec<ObjectFile>> = job_json(job, "inventory")
        .await?
        .and_then(|v| serde_json::from_value(v.get("files")?.clone()).ok());
    let (inv, s) = (ingest.inventory.clone(), stored.clone());
    let r = tokio::task::spawn_blocking(move || inv.record(&s, producer.as_deref()))
        .await
        .map_err(|e| Outcome::Transient(e.to_string()));
    let _ = job.engine.unlock_ark(lock).await;
    let added = r?.map_err(|e| Outcome::Transient(format!("inventory: {e}")))?;
    job.log(&format!(
        "recorded {} v{} ({} files{})",
        stored.ark,
        stored.version,
        added.files,
        if added.new { "" } else { ", already recorded" }
    ));
    Ok(Outcome::Done)
}

async fn notify(ingest: &Ingest, job: &JobCtx) -> Result<Outcome, Outcome> {
    let profile = ingest
        .profile(job.config_str("profile_name").unwrap_or_default())
        .map_err(Outcome::fatal)?;
    let Some(url) = profile.callback_url else {
        return Ok(Outcome::Done);
    };
    let store = job_json(job, "store").await?.unwrap_or(Value::Null);
    // The same for every attempt at delivering this outcome (the job and the version it
    // stored), so the receiver can drop a repeat: delivery is at least once.
    let key = format!(
        "lading:{}:{}:completed:{}",
        job.config_str("batch_uuid").unwrap_or(&job.info.bid),
        job.job(),
        store.get("version").and_then(Value::as_u64).unwrap_or(0)
    );
    let body = json!({
        "idempotency_key": key,
        "job": job.job().as_str(),
        "batch": job.info.bid,
        "status": "Completed",
        "profile": profile.name,
        "identifiers": job.info.identifiers,
        "metadata": job.info.metadata,
        "store": store,
    });
    // Recorded in the outbox with the job's move to Completed, and posted after it commits:
    // a worker fenced or killed before its commit sends nothing.
    job.add_effect(lading_engine::Effect {
        kind: "callback".into(),
        key: key.clone(),
        batch: Some(job.info.bid.clone()),
        job: Some(job.job().to_string()),
        payload: json!({"url": url, "body": body}),
    })
    .await;
    job.log(&format!("callback to {url} recorded ({key})"));
    Ok(Outcome::Done)
}

#[cfg(test)]
mod place_tests {
    use super::place_tree;
    use std::os::unix::fs::MetadataExt;

    fn tree(root: &std::path::Path) {
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a.txt"), b"alpha").unwrap();
        std::fs::write(root.join("sub/b.bin"), b"beta").unwrap();
    }

    #[test]
    fn on_one_file_system_files_are_linked_not_copied() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("work"), dir.path().join("store"));
        tree(&from);
        assert_eq!(place_tree(&from, &to, true).unwrap(), (2, 0));
        for f in ["a.txt", "sub/b.bin"] {
            let (w, s) = (
                std::fs::metadata(from.join(f)).unwrap(),
                std::fs::metadata(to.join(f)).unwrap(),
            );
            assert_eq!(w.ino(), s.ino(), "{f} is the same inode");
            assert_eq!(s.nlink(), 2);
        }
        // Removing the working copy leaves the stored one whole.
        std::fs::remove_dir_all(&from).unwrap();
        assert_eq!(std::fs::read(to.join("sub/b.bin")).unwrap(), b"beta");
        assert_eq!(std::fs::metadata(to.join("a.txt")).unwrap().nlink(), 1);
    }

    #[test]
    fn without_links_files_are_copied() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("work"), dir.path().join("store"));
        tree(&from);
        assert_eq!(place_tree(&from, &to, false).unwrap(), (0, 2));
        let (w, s) = (
            std::fs::metadata(from.join("a.txt")).unwrap(),
            std::fs::metadata(to.join("a.txt")).unwrap(),
        );
        assert_ne!(w.ino(), s.ino());
        assert_eq!(std::fs::read(to.join("a.txt")).unwrap(), b"alpha");
        assert_eq!(std::fs::read(to.join("sub/b.bin")).unwrap(), b"beta");
    }
}

#[cfg(test)]
mod record_tests {
    use super::{
        TOPDIR, append_verified, inode_flags, read_verified, spread_subdirs, verified_path,
    };
    use crate::fetch::Fetched;

    fn fetched(size: u64, sha: &str) -> Fetched {
        Fetched {
            size,
            sha256: sha.into(),
        }
    }

    #[test]
    fn the_download_record_is_appended_and_a_torn_line_spoils_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let wd = dir.path();
        assert!(read_verified(wd).is_empty());
        append_verified(wd, "a.bin", &fetched(1, "aa"), None).unwrap();
        let ino = |p| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let first = ino(verified_path(wd));
        // A crash in the middle of the next line.
        let mut torn = std::fs::read(verified_path(wd)).unwrap();
        torn.extend_from_slice(b"\n{\"name\":\"b.bin\",\"si");
        std::fs::write(verified_path(wd), &torn).unwrap();
        assert_eq!(read_verified(wd).len(), 1, "the torn line is ignored");
        append_verified(wd, "c.bin", &fetched(3, "cc"), None).unwrap();
        // A file verified again (it had changed) counts with its latest digest.
        append_verified(wd, "a.bin", &fetched(1, "a2"), None).unwrap();
        let v = read_verified(wd);
        assert_eq!(v.len(), 2);
        assert_eq!(v["a.bin"], fetched(1, "a2"));
        assert_eq!(v["c.bin"], fetched(3, "cc"));
        assert!(!v.contains_key("b.bin"), "b.bin is fetched again");
        assert_eq!(ino(verified_path(wd)), first, "one file, never replaced");
    }

    #[test]
    fn spreading_folders_is_set_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("work");
        std::fs::create_dir(&root).unwrap();
        let set = spread_subdirs(&root).unwrap();
        // Where the file system has the attribute, it is there now and setting it again is a
        // no-op; elsewhere both calls say so without an error.
        assert_eq!(spread_subdirs(&root).unwrap(), set);
        if set {
            let flags = inode_flags(&std::fs::File::open(&root).unwrap()).unwrap();
            assert_ne!(flags.unwrap() & TOPDIR, 0, "FS_TOPDIR_FL is set");
        }
        assert!(spread_subdirs(&dir.path().join("missing")).is_err());
    }
}
