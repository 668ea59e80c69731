//! The job stages, Pending to Notify. Each is a handler for the worker framework; what a
//! retried or recovered job needs to skip done work lives in its working directory.

use crate::checkm::{self, FileEntry, ManifestKind};
use crate::fetch::{Fetched, file_sha256};
use crate::{Ingest, fatal_or_transient};
use lading_core::Event;
use lading_core::JobState;
use lading_core::layout::{JobMetadata, ark_node_name};
use lading_core::tree::BoxFuture;
use lading_engine::{EngineError, JobData};
use lading_worker::{JobCtx, JobStage, Outcome};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

mod bag;
mod download;
mod finish;
mod fsops;
mod process;
mod space;
mod store;
mod store_node;
pub use crate::files::{
    CONTAINER, ERC_FILE, INTERIM, ObjectFile, PRODUCER, SYSTEM, StoredVersion, VERSION_FILE,
    io_err, is_permanent, list_files, versions,
};
use download::*;
use finish::*;
pub use fsops::*;
use process::*;
use space::*;
pub use store::*;
use store_node::store_on_bucket;
pub use store_node::{NodeVersion, STORE_PARALLEL, read_node_version};

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
    let config = job.config()?;
    let profile_name = config.profile().unwrap_or_default();
    let profile = ingest.profile(profile_name).map_err(Outcome::fatal)?;
    let Some(limit) = profile.max_in_flight_per_submitter else {
        return Ok(Outcome::Done);
    };
    let submitter = config.submitter.as_deref().unwrap_or_default();
    crate::quota::start_within(job, profile_name, submitter, limit as usize)
        .await
        .map_err(engine_err)
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
/// profile, keyed by the stage's lower-case name). Asked by the runtime, which has the job
/// but not its typed configuration: none when it cannot tell (the handler then fails a
/// configuration of the wrong shape, naming it).
fn profile_attempts(ingest: &Ingest, job: &lading_engine::JobInfo, state: JobState) -> Option<u32> {
    let name = job.configuration.typed().ok()?.profile()?;
    let profile = ingest.profile(name).ok()?;
    profile.max_attempts.get(state.node_name()).copied()
}

fn engine_err(e: EngineError) -> Outcome {
    e.into()
}

/// The job's profile, by the name its configuration gives.
pub(crate) fn job_profile(
    ingest: &Ingest,
    job: &JobCtx,
) -> Result<crate::config::Profile, Outcome> {
    let name = job.config()?.profile().unwrap_or_default();
    ingest.profile(name).map_err(Outcome::fatal)
}

/// Whose URLs a job holds.
fn trust(job: &JobCtx) -> Result<crate::policy::Trust, Outcome> {
    let config = job.config()?;
    Ok(crate::policy::Trust::from_fields(|k| config.field(k)))
}

/// A job's payload URL: its `payload_url`, or the Merritt package its `filename` names (a
/// job Merritt's ingest service made).
fn job_payload_url(
    ingest: &Ingest,
    config: &lading_core::layout::JobConfiguration,
) -> Result<String, Outcome> {
    match (&config.payload_url, config.merritt_filename()) {
        (Some(u), _) => Ok(u.clone()),
        (None, Some(name)) => crate::intake::merritt_package(ingest, name),
        (None, None) => Err(Outcome::fatal(
            "the job names no file and has no payload_url (nor a Merritt filename)",
        )),
    }
}

/// The files of a job's object: the manifest's rows, or the one file/container.
/// `fetch_manifest` false means a missing manifest is an error rather than a fetch.
async fn object_files(ingest: &Ingest, job: &JobCtx) -> Result<Vec<FileEntry>, Outcome> {
    let config = job.config()?;
    if config.payload_type() == "manifest" {
        let url = &job_payload_url(ingest, config)?;
        let saved = job.workdir()?.join(SYSTEM).join(FETCHED_MANIFEST);
        // The copy is the job's own until an admin requeues it (which counts a retry): then
        // the depositor's manifest is fetched again, so a corrected one is read.
        let fetched_at = job.workdir()?.join(INTERIM).join("manifest-retry");
        let retry = job.info.status.retry_count.to_string();
        let current = std::fs::read_to_string(&fetched_at).is_ok_and(|r| r == retry);
        let text = match crate::blocking::read_to_string(&saved).await {
            Ok(t) if current => t,
            _ => {
                let t = ingest
                    .fetcher
                    .get_text(url, &trust(job)?)
                    .await
                    .map_err(fatal_or_transient)?;
                write_atomic(&saved, t.as_bytes()).map_err(|e| io_err("writing", &saved, e))?;
                write_atomic(&fetched_at, retry.as_bytes())
                    .map_err(|e| io_err("writing", &fetched_at, e))?;
                t
            }
        };
        let limits = checkm::Limits::from(ingest.fetcher.limits());
        let base = url.to_string();
        let m = crate::blocking::run(move || checkm::parse_at(&text, &limits, Some(&base)))
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
        let trust = trust(job)?;
        if let crate::policy::Trust::Depositor { .. } = trust {
            for (f, r) in files.iter().zip(&m.rows) {
                crate::intake::check_depositor_row(ingest, &trust, url, r.line, &f.url)?;
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
    let f: FileEntry = match &config.file {
        Some(f) => serde_json::from_value(f.clone())
            .map_err(|e| Outcome::fatal(format!("bad file entry: {e}")))?,
        // A job configuration as Merritt's `Job.createJobConfiguration` writes it: the file
        // (or container) is the payload URL, named by its last segment.
        None => {
            let url = &job_payload_url(ingest, config)?;
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

/// Files already downloaded and verified, by name: the downloading stage's interim state.
type Verified = BTreeMap<String, Fetched>;

/// One of the job's JSON data nodes (`store`, `inventory`, …), if present. A node that is
/// not JSON is corrupt: the job fails naming it, rather than going on as if it were absent.
async fn job_json(job: &JobCtx, name: &str) -> Result<Option<Value>, Outcome> {
    let path = lading_core::layout::job_node(job.job(), name);
    let data = job
        .engine
        .tree()
        .get(&path)
        .await
        .map_err(|e| engine_err(e.into()))?
        .and_then(|n| n.data);
    match data {
        None => Ok(None),
        Some(d) => lading_core::json::from_bytes::<Value>(&d)
            .map(Some)
            .map_err(|e| Outcome::fatal(format!("{path} is corrupt: not JSON ({e})"))),
    }
}

/// [`job_json`] read as a `T`: a node of another shape is named as corrupt.
async fn job_record<T: serde::de::DeserializeOwned>(
    job: &JobCtx,
    name: &str,
) -> Result<Option<T>, Outcome> {
    match job_json(job, name).await? {
        None => Ok(None),
        Some(v) if v.is_null() => Ok(None),
        Some(v) => serde_json::from_value(v).map(Some).map_err(|e| {
            let path = lading_core::layout::job_node(job.job(), name);
            Outcome::fatal(format!("{path} is corrupt: {e}"))
        }),
    }
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
