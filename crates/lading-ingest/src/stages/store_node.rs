//! Storing on a bucket node: every file of the version under Merritt's keys, resumable.
//!
//! The job's interim record `store-progress` names the node, the version being written and
//! each file already confirmed there (size and SHA-256 checked); a successor (after a crash,
//! a lost lease or a failed attempt) sends only the rest, and aborts a multipart upload its
//! predecessor left open. The version record, written last and only if absent, is the commit.
//! A fatal failure removes what this job wrote of a version that has no record.

use super::*;
use crate::files::Origin;
use crate::nodes::{Node, NodeError, VERSION_RECORD};
use futures_util::StreamExt;
use std::collections::BTreeSet;

/// The job's interim record of a store in progress.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Progress {
    pub node: u32,
    pub version: u32,
    /// Paths (`producer/…`, `system/…`) confirmed on the node.
    #[serde(default)]
    pub confirmed: BTreeSet<String>,
    /// Of those, the ones this job put there itself: a key found there already with the
    /// same bytes may be another job's, which gave the version number up, and is never
    /// removed by this job's [`scrap`].
    #[serde(default)]
    pub written: BTreeSet<String>,
    /// Multipart uploads open now: path → upload id.
    #[serde(default)]
    pub uploads: BTreeMap<String, String>,
}

const PROGRESS: &str = "store-progress";

/// A confirmed file this large is recorded in the job's progress at once; smaller ones
/// every [`RECORD_EVERY`] files.
const RECORD_EACH_FROM: u64 = 1 << 20;
const RECORD_EVERY: usize = 8;

/// Files put on a node at once.
pub const STORE_PARALLEL: usize = 4;

/// A node's failure as a stage outcome: an unavailable node is waited for (SPEC §11).
pub(crate) fn node_outcome(node: &Node, e: NodeError) -> Outcome {
    if let Some(cause) = e.down {
        Outcome::Unavailable {
            dependency: node.dependency(),
            cause,
        }
    } else if e.fatal {
        Outcome::Fatal(e.what)
    } else {
        Outcome::Transient(e.what)
    }
}

/// The version record on a node: Lading's `StoredVersion` and the version's files.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct NodeVersion {
    #[serde(flatten)]
    pub stored: StoredVersion,
    pub files: Vec<ObjectFile>,
}

/// Reads version `version` of `ark`'s record from `node`.
pub async fn read_node_version(
    node: &Node,
    ark: &str,
    version: u32,
) -> Result<Option<NodeVersion>, NodeError> {
    let Some(b) = node.read_small(ark, version, VERSION_RECORD).await? else {
        return Ok(None);
    };
    lading_core::json::from_bytes(&b)
        .map(Some)
        .map_err(|e| NodeError {
            what: format!(
                "{}: the record of {ark} v{version} is corrupt: {e}",
                node.name()
            ),
            fatal: true,
            down: None,
        })
}

/// The files of the working directory's object, relative (`producer/…`, `system/…`).
fn local_files(wd: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for part in [PRODUCER, SYSTEM] {
        let root = wd.join(part);
        if !root.exists() {
            continue;
        }
        let mut stack = vec![root.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d)? {
                let e = e?;
                let t = e.file_type()?;
                if t.is_dir() {
                    stack.push(e.path());
                } else if t.is_file() {
                    let rel = e
                        .path()
                        .strip_prefix(wd)
                        .map_err(std::io::Error::other)?
                        .to_string_lossy()
                        .replace('\\', "/");
                    out.push((rel, e.path()));
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

pub(crate) async fn store_on_bucket(
    job: &JobCtx,
    node: &Arc<Node>,
    ark: &str,
    collection: &str,
) -> Result<StoredVersion, Outcome> {
    let jid = job.job().to_string();
    // A node known down here is not asked again by every job: its prober asks.
    let dep = node.dependency();
    if job.engine.deps().is_down(&dep.key()) {
        let cause = job
            .engine
            .deps()
            .list()
            .into_iter()
            .find(|h| h.kind == dep.kind && h.name == dep.name)
            .map(|h| h.cause)
            .unwrap_or_default();
        return Err(Outcome::Unavailable {
            dependency: dep,
            cause,
        });
    }
    let progress = match begin(job, node, ark, collection, &jid).await? {
        Ok(p) => p,
        Err(stored) => return committed(node, stored).await,
    };
    let version = progress.version;
    let wd = job.workdir()?.to_path_buf();
    let listed = wd.clone();
    let files = crate::blocking::run(move || local_files(&listed))
        .await
        .map_err(|e| Outcome::Transient(e.to_string()))?
        .map_err(|e| io_err("listing", &wd, e))?;
    let carried = carried_over(job, node, ark, version, &files, &progress.confirmed).await?;
    let shared = Arc::new(tokio::sync::Mutex::new(progress));
    let done = Arc::new(std::sync::Mutex::new(Vec::<ObjectFile>::new()));
    let todo: Vec<(String, PathBuf)> = {
        let p = shared.lock().await;
        files
            .iter()
            .filter(|(rel, _)| !p.confirmed.contains(rel) && !carried.contains_key(rel))
            .cloned()
            .collect()
    };
    let skipped = files.len() - todo.len() - carried.len();
    let results = send_files(job, node, ark, version, &shared, &done, todo).await;
    if let Some(e) = results.iter().find_map(|r| r.as_ref().err()).cloned() {
        // Only under the lease: a handler whose session ended under it (a pause, an expiry)
        // runs on until it next asks the store, and the files it wrote are by then its
        // successor's, the same bytes of the same job (`lading-sim --nodes 4`, seed 512: a
        // stale handler's scrap removed a manifest its successor had found in place and
        // counted, and the version was recorded without it).
        if e.fatal && job.holds_lease().await {
            scrap(
                job,
                node,
                (ark, version),
                &shared.lock().await.written,
                &files,
            )
            .await;
        }
        return Err(node_outcome(node, e));
    }
    // Files confirmed by a predecessor are listed from the node's copy.
    let mut listed = std::mem::take(&mut *done.lock().unwrap_or_else(|e| e.into_inner()));
    let have: BTreeSet<String> = listed.iter().map(|f| f.path.clone()).collect();
    let sent = listed.len();
    listed.extend(carried.values().cloned());
    for (rel, _) in files
        .iter()
        .filter(|(r, _)| !have.contains(r) && !carried.contains_key(r))
    {
        let c = node
            .digest(ark, version, rel, None)
            .await
            .map_err(|e| node_outcome(node, e))?
            .ok_or_else(|| {
                Outcome::Transient(format!(
                    "{}: {ark}|{version}|{rel} was confirmed but is missing",
                    node.name()
                ))
            })?;
        listed.push(ObjectFile {
            path: rel.clone(),
            size: c.size,
            sha256: c.sha256,
            from: None,
        });
    }
    listed.sort_by(|a, b| a.path.cmp(&b.path));
    let stored = StoredVersion {
        ark: ark.to_string(),
        version,
        path: node.version_url(ark, version),
        job: jid.clone(),
        batch: job.info.bid.to_string(),
        collection: Some(collection.to_string()),
        node: Some(node.id),
    };
    let record = NodeVersion {
        stored: stored.clone(),
        files: listed,
    };
    if let Some(theirs) = commit(job, node, &record, &jid).await? {
        return committed(node, theirs).await;
    }
    job.log(&format!(
        "stored {ark} v{version} on {} ({sent} files sent, {skipped} already there, {} carried over from earlier versions)",
        node.name(),
        carried.len()
    ));
    committed(node, stored).await
}

/// Where this job's store on `node` resumes, or begins: its progress (the version it
/// writes, the uploads an earlier attempt left open aborted), or the version it already
/// stored there (`Err`: it crashed before saying so). Another collection's object, or a
/// version another job stored meanwhile, is refused.
async fn begin(
    job: &JobCtx,
    node: &Arc<Node>,
    ark: &str,
    collection: &str,
    jid: &String,
) -> Result<Result<Progress, StoredVersion>, Outcome> {
    let mut progress: Progress = job_record(job, PROGRESS)
        .await?
        .filter(|p: &Progress| p.node == node.id)
        .unwrap_or_default();
    if progress.version == 0 {
        let versions = node
            .versions(ark)
            .await
            .map_err(|e| node_outcome(node, e))?;
        // A version this job already stored (it crashed before saying so) is reused.
        for v in versions.iter().rev().take(3) {
            if let Some(r) = read_node_version(node, ark, *v)
                .await
                .map_err(|e| node_outcome(node, e))?
                && r.stored.job == *jid
            {
                return Ok(Err(r.stored));
            }
        }
        if let Some(v) = versions.last()
            && let Some(r) = read_node_version(node, ark, *v)
                .await
                .map_err(|e| node_outcome(node, e))?
            && let Some(owner) = r.stored.collection
            && owner != collection
        {
            return Err(Outcome::fatal(format!(
                "{ark} belongs to another collection; collection {collection} may not add a version to it"
            )));
        }
        progress = Progress {
            node: node.id,
            version: versions.last().copied().unwrap_or(0) + 1,
            ..Default::default()
        };
        job.set_data(JobData::StoreProgress(&json!(progress)))
            .await
            .map_err(engine_err)?;
    }
    let version = progress.version;
    if let Some(r) = read_node_version(node, ark, version)
        .await
        .map_err(|e| node_outcome(node, e))?
    {
        if r.stored.job == *jid {
            return Ok(Err(r.stored));
        }
        return Err(Outcome::fatal(format!(
            "{}: {ark} v{version} was stored by job {} meanwhile",
            node.name(),
            r.stored.job
        )));
    }
    // Uploads a predecessor left open go first.
    for (rel, id) in std::mem::take(&mut progress.uploads) {
        let gone = node.abort_upload(ark, version, &rel, &id).await;
        if !gone.map_err(|e| node_outcome(node, e))? {
            progress.uploads.insert(rel, id);
        }
    }
    if !progress.uploads.is_empty() {
        return Err(Outcome::Transient(format!(
            "{}: cannot abort the {} multipart uploads an earlier attempt left open",
            node.name(),
            progress.uploads.len()
        )));
    }
    Ok(Ok(progress))
}

/// Sends `todo` to `node` as files of `ark` v`version`, a few at once, each noted in the
/// job's progress (its multipart upload while it lasts, then confirmed); what was sent is
/// added to `done`. One result per file.
async fn send_files(
    job: &JobCtx,
    node: &Arc<Node>,
    ark: &str,
    version: u32,
    shared: &Arc<tokio::sync::Mutex<Progress>>,
    done: &Arc<std::sync::Mutex<Vec<ObjectFile>>>,
    todo: Vec<(String, PathBuf)>,
) -> Vec<Result<(), NodeError>> {
    futures_util::stream::iter(todo.into_iter().map(|(rel, path)| {
        let (node, shared, done, job) = (node.clone(), shared.clone(), done.clone(), job);
        let ark = ark.to_string();
        async move {
            let (s2, r2) = (shared.clone(), rel.clone());
            let mut note = move |id: Option<String>| {
                let (s2, r2, jc) = (s2.clone(), r2.clone(), job);
                Box::pin(async move {
                    let mut p = s2.lock().await;
                    match id {
                        Some(id) => p.uploads.insert(r2, id),
                        None => p.uploads.remove(&r2),
                    };
                    jc.set_data(JobData::StoreProgress(&json!(*p)))
                        .await
                        .map_err(|e| e.to_string())
                }) as crate::nodes::UploadNote<'_>
            };
            let (copy, already) = node.put_new(&ark, version, &rel, &path, &mut note).await?;
            // Recorded for a large file at once, for small ones every few: a small file
            // confirmed and not yet recorded costs a successor one conditional PUT (under
            // RECORD_EACH_FROM bytes, refused by the node as already there) and a read-back.
            let mut p = shared.lock().await;
            p.confirmed.insert(rel.clone());
            if !already {
                p.written.insert(rel.clone());
            }
            if copy.size >= RECORD_EACH_FROM || p.confirmed.len() % RECORD_EVERY == 0 {
                job.set_data(JobData::StoreProgress(&json!(*p)))
                    .await
                    .map_err(|e| NodeError {
                        what: e.to_string(),
                        fatal: false,
                        down: None,
                    })?;
            }
            drop(p);
            done.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(ObjectFile {
                    path: rel,
                    size: copy.size,
                    sha256: copy.sha256,
                    from: None,
                });
            Ok::<(), NodeError>(())
        }
    }))
    .buffer_unordered(STORE_PARALLEL)
    .collect::<Vec<_>>()
    .await
}

/// The version's commit on `node`: no upload left open under it, the job still in Storing,
/// and its record written only if absent. `Some`: a record there already is this job's (an
/// earlier attempt's, or this one's whose answer was lost), the version stored.
async fn commit(
    job: &JobCtx,
    node: &Arc<Node>,
    record: &NodeVersion,
    jid: &String,
) -> Result<Option<StoredVersion>, Outcome> {
    let (ark, version) = (record.stored.ark.as_str(), record.stored.version);
    // No upload left open under the version, even one whose id was never learned.
    let swept = node
        .abort_open_uploads(ark, version)
        .await
        .map_err(|e| node_outcome(node, e))?;
    if swept > 0 {
        job.log(&format!(
            "aborted {swept} multipart uploads left open under {ark} v{version} on {}",
            node.name()
        ));
    }
    // The commit: only if absent, from a worker that still holds the job.
    job.engine
        .job(job.job())
        .await
        .map_err(engine_err)
        .and_then(|i| {
            if i.status.status == JobState::Storing {
                Ok(())
            } else {
                Err(Outcome::Transient("the job left Storing meanwhile".into()))
            }
        })?;
    let tmp = job.workdir()?.join(INTERIM).join("lading-version.json");
    let body = serde_json::to_vec_pretty(record).unwrap_or_default();
    write_atomic(&tmp, &body).map_err(|e| io_err("writing", &tmp, e))?;
    let mut none =
        |_: Option<String>| Box::pin(async { Ok(()) }) as crate::nodes::UploadNote<'static>;
    match node
        .put_new(ark, version, VERSION_RECORD, &tmp, &mut none)
        .await
    {
        Ok(_) => {}
        Err(e) => {
            // A record there already: this job's (an earlier attempt's, or this one's whose
            // answer was lost after it took effect) is the commit; another writer's owns
            // the version. Read back at once, a lost answer on the last attempt does not
            // fail a job whose version is stored.
            if let Ok(Some(r)) = read_node_version(node, ark, version).await
                && r.stored.job == *jid
            {
                return Ok(Some(r.stored));
            }
            return Err(node_outcome(node, e));
        }
    }
    Ok(None)
}

/// The files of the version being stored whose bytes the object's newest earlier version on
/// this node holds already (same SHA-256 and size, under any path): they are not uploaded
/// again, and the version's record lists them where they are stored (Merritt stores a
/// version's unchanged files once, the same way). By path; a file this job confirmed on the
/// node already (an earlier attempt sent it) stays as sent. The local files' digests are
/// Processing's (the working folder's mark guarantees they are of these bytes); a file it did
/// not hash (Lading's own `system/` files) is hashed here.
async fn carried_over(
    job: &JobCtx,
    node: &Node,
    ark: &str,
    version: u32,
    files: &[(String, PathBuf)],
    confirmed: &BTreeSet<String>,
) -> Result<BTreeMap<String, ObjectFile>, Outcome> {
    let mut out = BTreeMap::new();
    let earlier = node
        .versions(ark)
        .await
        .map_err(|e| node_outcome(node, e))?;
    let mut prior = None;
    for v in earlier.iter().rev().filter(|v| **v < version).take(3) {
        // A deleted version's bytes are gone (or kept only for a version that uses them).
        if node
            .head(ark, *v, crate::nodes::DELETION_MARK)
            .await
            .map_err(|e| node_outcome(node, e))?
            .is_some()
        {
            continue;
        }
        if let Some(r) = read_node_version(node, ark, *v)
            .await
            .map_err(|e| node_outcome(node, e))?
        {
            prior = Some(r);
            break;
        }
    }
    let Some(prior) = prior else {
        return Ok(out);
    };
    let held: BTreeMap<(&str, u64), Origin> = prior
        .files
        .iter()
        .map(|f| {
            let (v, p) = f.stored_at(prior.stored.version);
            let origin = Origin {
                version: v,
                path: p.to_string(),
            };
            ((f.sha256.as_str(), f.size), origin)
        })
        .collect();
    #[derive(serde::Deserialize)]
    struct Produced {
        files: Option<Vec<ObjectFile>>,
    }
    let hashed: BTreeMap<String, ObjectFile> = job_record::<Produced>(job, "inventory")
        .await?
        .and_then(|p| p.files)
        .unwrap_or_default()
        .into_iter()
        .map(|f| (format!("{PRODUCER}/{}", f.path), f))
        .collect();
    for (rel, path) in files.iter().filter(|(r, _)| !confirmed.contains(r)) {
        let (size, sha256) = match hashed.get(rel) {
            Some(f) => (f.size, f.sha256.clone()),
            None => {
                let p = path.clone();
                crate::blocking::run(move || crate::files::file_sha256(&p))
                    .await
                    .map_err(|e| Outcome::Transient(e.to_string()))?
                    .map_err(|e| io_err("reading", path, e))?
            }
        };
        if let Some(origin) = held.get(&(sha256.as_str(), size)).cloned() {
            out.insert(
                rel.clone(),
                ObjectFile {
                    path: rel.clone(),
                    size,
                    sha256,
                    from: Some(origin),
                },
            );
        }
    }
    Ok(out)
}

/// A version this job committed (its record is there): no multipart upload stays open under
/// it. The record's own upload may have been started twice (a start whose answer was lost
/// is tried again, and the first is nobody's), and a fenced predecessor may have started one
/// after the sweep before the commit; left, each holds parts stored and paid for that no
/// object holds (found by `lading-sim`). Failing, the job tries again, and finds its record.
async fn committed(node: &Node, stored: StoredVersion) -> Result<StoredVersion, Outcome> {
    node.abort_open_uploads(&stored.ark, stored.version)
        .await
        .map_err(|e| node_outcome(node, e))?;
    Ok(stored)
}

/// Removes what this job wrote of a version that has no record (after a fatal failure), and
/// its progress, so nothing half-stored remains. Only when the node says the record is
/// absent: one that cannot be read may be another job's commit of the same number, whose
/// files (some of the same bytes) must stay (found by `lading-sim`, seed 771227260). And only
/// a key that still holds this job's bytes, with the record looked for again just before:
/// another job storing the same version (the ark's storage lock lost with its holder's
/// session) may have put its own bytes there since and be about to commit them; a slow
/// delete of such a key landed after that commit (found by `lading-sim`, seed 5017358).
/// And only while the job's lease holds, asked before each delete: once it is lost, the
/// same job's successor may have counted these very bytes as stored.
async fn scrap(
    job: &JobCtx,
    node: &Node,
    (ark, version): (&str, u32),
    written: &BTreeSet<String>,
    files: &[(String, PathBuf)],
) {
    let no_record = || async { matches!(node.head(ark, version, VERSION_RECORD).await, Ok(None)) };
    if !no_record().await {
        return;
    }
    let _ = node.abort_open_uploads(ark, version).await;
    if let crate::nodes::Place::Bucket { store, .. } = &node.place {
        for (rel, path) in files.iter().filter(|(rel, _)| written.contains(rel)) {
            let p = path.clone();
            let mine = crate::blocking::run(move || crate::files::file_sha256(&p)).await;
            let Ok(Ok((size, sha256))) = mine else {
                continue;
            };
            let theirs = node.digest(ark, version, rel, None).await;
            if !matches!(theirs, Ok(Some(c)) if c.size == size && c.sha256 == sha256) {
                continue;
            }
            if !no_record().await || !job.holds_lease().await {
                return;
            }
            if let Ok(k) = node.key(ark, version, rel) {
                let _ = store.delete(&k).await;
            }
        }
    }
    let _ = job.set_data(JobData::StoreProgress(&Value::Null)).await;
}
