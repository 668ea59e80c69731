//! Copies of a stored version between storage nodes: replicas after Storing (delivered by
//! the outbox, kind `replicate`, key `replicate:ARK|V|NODE`) and fixity repairs. Each file
//! goes through a local temporary file (bounded memory), is written on the target only
//! where absent (or, for a repair, over the bad copy), and is checked there.

use crate::Ingest;
use crate::inventory::CopyRow;
use crate::nodes::{Node, NodeError, VERSION_RECORD};
use crate::stages::{NodeVersion, ObjectFile, StoredVersion, VERSION_FILE, read_node_version};
use std::path::PathBuf;
use std::sync::Arc;

/// Replica copies of versions made by this process, by target node: (stored, failed).
static COPIES: std::sync::Mutex<std::collections::BTreeMap<u32, (u64, u64)>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// `lading_replica_versions_total` by node and outcome, as counted in this process.
pub fn copies_by_node() -> std::collections::BTreeMap<u32, (u64, u64)> {
    COPIES.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Counts one attempt to copy a version to node `to` (stored, or failed).
fn count_copy(to: u32, stored: bool) {
    let mut c = COPIES.lock().unwrap_or_else(|e| e.into_inner());
    let e = c.entry(to).or_default();
    if stored {
        e.0 += 1;
    } else {
        e.1 += 1;
    }
}

fn node(ingest: &Ingest, id: u32) -> Result<&Arc<Node>, NodeError> {
    ingest.nodes.get(id).ok_or_else(|| NodeError {
        what: format!("storage node {id} is not in this process's [[storage_nodes]]"),
        fatal: true,
        down: None,
    })
}

/// The record of version `version` of `ark` on `n`, with its files.
pub async fn version_on(n: &Node, ark: &str, version: u32) -> Result<NodeVersion, NodeError> {
    let missing = || NodeError {
        what: format!("{}: {ark} v{version} has no record there", n.name()),
        fatal: false,
        down: None,
    };
    match &n.place {
        crate::nodes::Place::Bucket { .. } => read_node_version(n, ark, version)
            .await?
            .ok_or_else(missing),
        crate::nodes::Place::Folder(_) => {
            let dir = PathBuf::from(n.version_url(ark, version));
            let b = n
                .read_small(ark, version, VERSION_RECORD)
                .await?
                .ok_or_else(missing)?;
            let stored: StoredVersion =
                lading_core::json::from_bytes(&b).map_err(|e| NodeError {
                    what: format!(
                        "{}: the record of {ark} v{version} is corrupt: {e}",
                        n.name()
                    ),
                    fatal: true,
                    down: None,
                })?;
            let files = crate::blocking::run(move || crate::stages::list_files(&dir))
                .await
                .map_err(|e| NodeError {
                    what: e.to_string(),
                    fatal: false,
                    down: None,
                })?
                .map_err(|e| NodeError {
                    what: format!("{}: listing {ark} v{version}: {e}", n.name()),
                    fatal: false,
                    down: None,
                })?
                .into_iter()
                .filter(|f| f.path != VERSION_FILE)
                .collect();
            Ok(NodeVersion { stored, files })
        }
    }
}

/// A name no other temporary copy has (from the engine's random source, which the simulator
/// seeds).
fn unique_name(ingest: &Ingest) -> String {
    let r = ingest.engine.random();
    format!("{:016x}{:016x}", r.next_u64(), r.next_u64())
}

/// A temporary file for one copy, removed when dropped.
struct Tmp(PathBuf);

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn fetch_to_tmp(
    ingest: &Ingest,
    from: &Node,
    ark: &str,
    version: u32,
    rel: &str,
) -> Result<Tmp, NodeError> {
    let dir = ingest.cfg.work_dir().join(".copies");
    let local = |e: std::io::Error| NodeError {
        what: format!("a temporary copy in {}: {e}", dir.display()),
        fatal: false,
        down: None,
    };
    crate::blocking::create_dir_all(&dir).await.map_err(local)?;
    let tmp = Tmp(dir.join(unique_name(ingest)));
    let mut f = crate::blocking::Writer::create(&tmp.0)
        .await
        .map_err(local)?;
    if !from.read_into(ark, version, rel, &mut f).await? {
        return Err(NodeError {
            what: format!("{}: {ark}|{version}|{rel} is missing", from.name()),
            fatal: false,
            down: None,
        });
    }
    use tokio::io::AsyncWriteExt;
    f.flush().await.map_err(local)?;
    Ok(tmp)
}

/// Copies version `version` of `ark` from node `from` to node `to`: every file (skipping
/// those already there with the same bytes), then the version record; records the copies
/// in the inventory. Returns how many files were sent.
/// Every attempt is counted for `/metrics` (`lading_replica_versions_total`).
pub async fn copy_version(
    ingest: &Ingest,
    ark: &str,
    version: u32,
    from: u32,
    to: u32,
) -> Result<usize, NodeError> {
    let r = copy_version_once(ingest, ark, version, from, to).await;
    count_copy(to, r.is_ok());
    r
}

async fn copy_version_once(
    ingest: &Ingest,
    ark: &str,
    version: u32,
    from: u32,
    to: u32,
) -> Result<usize, NodeError> {
    let (src, dst) = (node(ingest, from)?, node(ingest, to)?);
    let record = version_on(src, ark, version).await?;
    let mut sent = 0;
    let mut none =
        |_: Option<String>| Box::pin(async { Ok(()) }) as crate::nodes::UploadNote<'static>;
    // A file carried over from an earlier version is copied where the record says it is
    // stored (on the target, too, the version lists it from there).
    for f in &record.files {
        let (at, rel) = f.stored_at(version);
        if let Some(m) = dst.head(ark, at, rel).await?
            && m.size == f.size
            && dst
                .digest(ark, at, rel, None)
                .await?
                .is_some_and(|c| c.sha256 == f.sha256)
        {
            continue;
        }
        let tmp = fetch_to_tmp(ingest, src, ark, at, rel).await?;
        let (copy, _) = dst.put_new(ark, at, rel, &tmp.0, &mut none).await?;
        if copy.sha256 != f.sha256 || copy.size != f.size {
            return Err(NodeError {
                what: format!(
                    "{}: {ark}|{at}|{rel} reads {} ({} bytes), the record says {} ({} bytes)",
                    src.name(),
                    copy.sha256,
                    copy.size,
                    f.sha256,
                    f.size
                ),
                fatal: false,
                down: None,
            });
        }
        sent += 1;
    }
    let dir = ingest.cfg.work_dir().join(".copies");
    let _ = std::fs::create_dir_all(&dir);
    let tmp = Tmp(dir.join(format!("{}.json", unique_name(ingest))));
    std::fs::write(
        &tmp.0,
        serde_json::to_vec_pretty(&record).unwrap_or_default(),
    )
    .map_err(|e| NodeError {
        what: format!("writing {}: {e}", tmp.0.display()),
        fatal: false,
        down: None,
    })?;
    // No upload left open under the version before its record (an earlier attempt's, whose
    // id no one kept), nor after it (the record's own, started twice when the answer to its
    // start was lost): each holds parts no object holds (found by `lading-sim`).
    dst.abort_open_uploads(ark, version).await?;
    // The record on the replica is the primary's (its files and its node); a record there
    // already, from an earlier attempt, is kept.
    match dst
        .put_new(ark, version, VERSION_RECORD, &tmp.0, &mut none)
        .await
    {
        Ok(_) => {}
        Err(e) if e.fatal && dst.head(ark, version, VERSION_RECORD).await?.is_some() => {}
        Err(e) => return Err(e),
    }
    dst.abort_open_uploads(ark, version).await?;
    let rows = record_rows(ark, version, to, &record.files);
    let inv = ingest.inventory.clone();
    inv.run(move |i| i.set_copies(&rows))
        .await
        .map_err(|e| NodeError {
            what: format!("inventory: {e}"),
            fatal: false,
            down: None,
        })?;
    tracing::info!(%ark, version, from, to, sent, "replica stored");
    Ok(sent)
}

fn record_rows(ark: &str, version: u32, node: u32, files: &[ObjectFile]) -> Vec<CopyRow> {
    files
        .iter()
        .map(|f| CopyRow {
            ark: ark.to_string(),
            version: f.stored_at(version).0,
            path: f.stored_at(version).1.to_string(),
            node,
            status: "ok".into(),
            found: Some(f.sha256.clone()),
        })
        .collect()
}

/// Fetches `rel` of the version from `from` into a temporary file and writes it over the
/// copy on `to` (a repair); the copy as read back after.
pub async fn repair_file(
    ingest: &Ingest,
    from: &Node,
    to: &Node,
    ark: &str,
    version: u32,
    rel: &str,
) -> Result<Option<crate::nodes::Copy>, NodeError> {
    let tmp = fetch_to_tmp(ingest, from, ark, version, rel).await?;
    to.replace(ark, version, rel, &tmp.0).await
}

/// The node a replica copy's failure is about, as a dependency: the one its message names
/// first (`storage node N …`), else the destination.
pub fn node_of_error(
    ingest: &crate::Ingest,
    what: &str,
    from: u32,
    to: u32,
) -> lading_engine::deps::Dependency {
    let id = if what.starts_with(&format!("storage node {from} ")) {
        from
    } else {
        to
    };
    match ingest.nodes.get(id) {
        Some(n) => n.dependency(),
        None => lading_engine::deps::Dependency::new("storage-node", id.to_string(), ""),
    }
}
