//! Deletion only when approved (APTrust's deletion manager; SPEC §10). An admin asks for an
//! object, or one of its versions, to be deleted, giving a reason; a **second** admin (another
//! token name) approves it, or any admin cancels it. Approval fixes what goes: every file the
//! deleted versions store themselves, but for bytes a version not deleted still lists as its
//! own (a reingest carried them over, [`crate::files::Origin`]), which stay where they are.
//! Those copies leave the fixity checker's list at once (`copies.status = 'deleted'`), then are
//! removed from every node; each deleted version on a node gets a mark
//! ([`crate::nodes::DELETION_MARK`]) so no later reingest carries anything over from it, and
//! keeps its number and record. The request becomes the tombstone: who asked, who approved,
//! when, why, and the digests of what was deleted. A node that cannot be reached makes the
//! removal wait ([`run`] tries again), never undoes the approval.

use crate::Ingest;
use crate::files::ObjectFile;
use crate::inventory::{CopyCheck, CopyRow, InventoryError};
use std::collections::{BTreeMap, BTreeSet};

pub use crate::inventory::{Deletion, DeletionFile as File, DeletionStatus as Status};

/// Why a deletion verb was refused.
#[derive(Debug, thiserror::Error)]
pub enum DeletionError {
    #[error("no deletion {0} is recorded")]
    NotFound(String),
    #[error("{0} is not a recorded object")]
    NoObject(String),
    #[error("no version {version} of {ark} is recorded")]
    NoVersion { ark: String, version: u32 },
    #[error("{target} is deleted already (deletion {id})")]
    Deleted { target: String, id: String },
    #[error("deletion {id} of {target} is requested already; approve or cancel it")]
    Open { target: String, id: String },
    #[error("a deletion needs a reason (at most {MAX_REASON} bytes)")]
    Reason,
    #[error(
        "deletion {id} was requested by {name}; a second admin (another token name) must approve it"
    )]
    SameAdmin { id: String, name: String },
    #[error("deletion {id} is {status}; only a requested deletion can be {verb}")]
    NotRequested {
        id: String,
        status: &'static str,
        verb: &'static str,
    },
    #[error("the inventory: {0}")]
    Inventory(#[from] InventoryError),
    #[error("deletion record {0} cannot be read: {1}")]
    Corrupt(String, String),
}

/// A reason's length, at most.
pub const MAX_REASON: usize = 4096;

fn parse(id: &str, doc: &str) -> Result<Deletion, DeletionError> {
    serde_json::from_str(doc).map_err(|e| DeletionError::Corrupt(id.to_string(), e.to_string()))
}

fn doc(d: &Deletion) -> String {
    serde_json::to_string(d).expect("a deletion serializes")
}

fn now(ingest: &Ingest) -> String {
    lading_core::time::format_ts(ingest.engine.clock().now_ms())
}

/// Deletion `id`.
pub async fn get(ingest: &Ingest, id: &str) -> Result<Deletion, DeletionError> {
    let i = id.to_string();
    let d = ingest
        .inventory
        .run(move |inv| inv.deletion_doc(&i))
        .await?;
    let d = d.ok_or_else(|| DeletionError::NotFound(id.to_string()))?;
    parse(id, &d)
}

/// Every deletion (of `ark`, when given), oldest first.
pub async fn list(ingest: &Ingest, ark: Option<&str>) -> Result<Vec<Deletion>, DeletionError> {
    let a = ark.unwrap_or("").to_string();
    let docs = ingest.inventory.run(move |i| i.deletion_docs(&a)).await?;
    docs.iter().map(|d| parse("(listed)", d)).collect()
}

/// The approved or done deletion that covers version `version` of `ark`, if any: such a
/// version is gone (a download of it is refused, naming the deletion).
pub async fn of_version(
    ingest: &Ingest,
    ark: &str,
    version: u32,
) -> Result<Option<Deletion>, DeletionError> {
    let a = ark.to_string();
    Ok(ingest
        .inventory
        .run(move |i| i.deletion_of(&a, version))
        .await?)
}

/// Records `by`'s request to delete `ark` (version `version`, or all of it) for `reason`.
pub async fn request(
    ingest: &Ingest,
    ark: &str,
    version: Option<u32>,
    reason: &str,
    by: &str,
) -> Result<Deletion, DeletionError> {
    let reason = reason.trim();
    if reason.is_empty() || reason.len() > MAX_REASON {
        return Err(DeletionError::Reason);
    }
    let a = ark.to_string();
    let versions = ingest.inventory.run(move |i| i.versions(&a)).await?;
    if versions.is_empty() {
        return Err(DeletionError::NoObject(ark.to_string()));
    }
    if let Some(v) = version
        && !versions.iter().any(|(n, _, _)| *n == v)
    {
        return Err(DeletionError::NoVersion {
            ark: ark.to_string(),
            version: v,
        });
    }
    // Versions deleted already (a whole object's deletion covers those it found), by deletion.
    let mut deleted: BTreeMap<u32, String> = BTreeMap::new();
    for d in list(ingest, Some(ark)).await? {
        let covers = d.version.is_none() || version.is_none() || d.version == version;
        match d.status {
            Status::Requested if covers => {
                return Err(DeletionError::Open {
                    target: d.target(),
                    id: d.id,
                });
            }
            Status::Approved | Status::Deleted => {
                deleted.extend(d.versions.iter().map(|v| (*v, d.id.clone())));
            }
            _ => {}
        }
    }
    let wanted: Vec<u32> = match version {
        Some(v) => vec![v],
        None => versions.iter().map(|(v, _, _)| *v).collect(),
    };
    if let Some(id) = wanted.iter().all(|v| deleted.contains_key(v)).then(|| {
        wanted
            .last()
            .and_then(|v| deleted.get(v))
            .cloned()
            .unwrap_or_default()
    }) {
        let target = match version {
            Some(v) => format!("{ark} v{v}"),
            None => ark.to_string(),
        };
        return Err(DeletionError::Deleted { target, id });
    }
    let d = Deletion {
        // Ordered by time, then random: listings are oldest first.
        id: format!(
            "del{:012x}{:08x}",
            ingest.engine.clock().now_ms(),
            ingest.engine.random().next_u64() as u32
        ),
        ark: ark.to_string(),
        version,
        reason: reason.to_string(),
        status: Status::Requested,
        requested_by: by.to_string(),
        requested_at: now(ingest),
        decided_by: None,
        decided_at: None,
        deleted_at: None,
        versions: Vec::new(),
        files: Vec::new(),
        kept: Vec::new(),
        waiting: None,
    };
    let (id, a, text) = (d.id.clone(), d.ark.clone(), doc(&d));
    ingest
        .inventory
        .run(move |i| i.insert_deletion(&id, &a, Status::Requested.name(), &text))
        .await?;
    tracing::info!(deletion = %d.id, target = %d.target(), by, "deletion requested");
    Ok(d)
}

/// A requested deletion, read to be decided by `by`.
async fn requested(
    ingest: &Ingest,
    id: &str,
    verb: &'static str,
) -> Result<Deletion, DeletionError> {
    let d = get(ingest, id).await?;
    if d.status != Status::Requested {
        return Err(DeletionError::NotRequested {
            id: id.to_string(),
            status: d.status.name(),
            verb,
        });
    }
    Ok(d)
}

/// Moves `d` from `from` to its status; refused when another decision came first.
async fn save(ingest: &Ingest, d: &Deletion, from: Status) -> Result<(), DeletionError> {
    let (id, to, text) = (d.id.clone(), d.status.name(), doc(d));
    let moved = ingest
        .inventory
        .run(move |i| i.update_deletion(&id, from.name(), to, &text))
        .await?;
    if moved {
        return Ok(());
    }
    let now = get(ingest, &d.id).await?;
    Err(DeletionError::NotRequested {
        id: d.id.clone(),
        status: now.status.name(),
        verb: "changed",
    })
}

/// Cancels a requested deletion (any admin may).
pub async fn cancel(ingest: &Ingest, id: &str, by: &str) -> Result<Deletion, DeletionError> {
    let mut d = requested(ingest, id, "cancelled").await?;
    d.status = Status::Cancelled;
    d.decided_by = Some(by.to_string());
    d.decided_at = Some(now(ingest));
    save(ingest, &d, Status::Requested).await?;
    tracing::info!(deletion = %d.id, by, "deletion cancelled");
    Ok(d)
}

/// Approves a requested deletion as `by` (not its requester), fixes what it removes, and
/// removes it from every node (or leaves it waiting for a node, for [`run`]).
pub async fn approve(ingest: &Ingest, id: &str, by: &str) -> Result<Deletion, DeletionError> {
    let mut d = requested(ingest, id, "approved").await?;
    if d.requested_by == by {
        return Err(DeletionError::SameAdmin {
            id: id.to_string(),
            name: by.to_string(),
        });
    }
    let a = d.ark.clone();
    let (versions, files, copies, earlier) = ingest
        .inventory
        .run(move |i| {
            Ok((
                i.versions(&a)?,
                i.object_files(&a)?,
                i.copies(None, Some(&a))?,
                i.deletion_docs(&a)?,
            ))
        })
        .await?;
    let mut gone: BTreeSet<u32> = BTreeSet::new();
    for e in &earlier {
        let e = parse("(listed)", e)?;
        if matches!(e.status, Status::Approved | Status::Deleted) {
            gone.extend(e.versions);
        }
    }
    d.versions = match d.version {
        Some(v) => vec![v],
        None => versions
            .iter()
            .map(|(v, _, _)| *v)
            .filter(|v| !gone.contains(v))
            .collect(),
    };
    gone.extend(d.versions.iter().copied());
    (d.files, d.kept) = plan(&d.versions, &gone, &files, &copies);
    d.status = Status::Approved;
    d.decided_by = Some(by.to_string());
    d.decided_at = Some(now(ingest));
    save(ingest, &d, Status::Requested).await?;
    tracing::info!(deletion = %d.id, target = %d.target(), by, files = d.files.len(), "deletion approved");
    carry_out(ingest, d).await
}

/// What deleting `target` removes and keeps, given the versions deleted with it (`gone`,
/// which includes `target`), every file of the object and its undeleted copies. Bytes are needed while a version not gone stores or
/// lists them; the files of any gone version no longer needed are removed (so bytes an
/// earlier deletion kept go with the last version that used them).
pub fn plan(
    target: &[u32],
    gone: &BTreeSet<u32>,
    files: &[(u32, ObjectFile)],
    copies: &[CopyCheck],
) -> (Vec<File>, Vec<File>) {
    let needed: BTreeSet<(u32, &str)> = files
        .iter()
        .filter(|(v, _)| !gone.contains(v))
        .map(|(v, f)| {
            let (ov, op) = f.stored_at(*v);
            (ov, op)
        })
        .collect();
    // Per stored file: the nodes holding it, and the storage root's folder when it does.
    type Places = (Vec<u32>, Option<String>);
    let mut at: BTreeMap<(u32, &str), Places> = BTreeMap::new();
    for c in copies {
        let e = at.entry((c.version, c.path.as_str())).or_default();
        e.0.push(c.node);
        if c.node == 0 {
            e.1 = Some(c.version_path.clone());
        }
    }
    let (mut removed, mut kept) = (Vec::new(), Vec::new());
    for (v, f) in files
        .iter()
        .filter(|(v, f)| gone.contains(v) && f.from.is_none())
    {
        let (nodes, folder) = at.get(&(*v, f.path.as_str())).cloned().unwrap_or_default();
        let file = File {
            version: *v,
            path: f.path.clone(),
            size: f.size,
            sha256: f.sha256.clone(),
            nodes,
            folder,
        };
        if needed.contains(&(*v, f.path.as_str())) {
            if target.contains(v) {
                kept.push(file);
            }
        } else if !file.nodes.is_empty() {
            removed.push(file);
        }
    }
    (removed, kept)
}

/// Removes an approved deletion's files from every node, marks its versions there, and
/// records it done; a node that fails leaves it approved with the reason (tried again by
/// [`run`]).
pub async fn carry_out(ingest: &Ingest, mut d: Deletion) -> Result<Deletion, DeletionError> {
    // Under the object's storage lock, so no version is being stored meanwhile: the deleted
    // versions are marked on the nodes first (a later store carries nothing over from them),
    // then any version stored since approval keeps the bytes its record lists as its own.
    let engine = ingest.engine.clone();
    let lock = match crate::stages::HeldArk::take(&engine, engine.lock_storage(&d.ark)).await {
        Ok(l) => l,
        Err(o) => return wait(ingest, d, format!("the object's storage lock: {o:?}")).await,
    };
    let r = mark_and_keep(ingest, &mut d).await;
    let r = match r {
        Ok(()) => remove(ingest, &d).await,
        Err(why) => Err(why),
    };
    lock.release().await;
    match r {
        Ok(()) => finish(ingest, d).await,
        Err(why) => wait(ingest, d, why).await,
    }
}

/// Marks every deleted version on every node holding the object, then moves to `kept` each
/// file a version not deleted lists (in its record on a node) as stored there, which may have
/// been stored after approval fixed the list.
async fn mark_and_keep(ingest: &Ingest, d: &mut Deletion) -> Result<(), String> {
    let nodes: BTreeSet<u32> = d
        .files
        .iter()
        .chain(&d.kept)
        .flat_map(|f| f.nodes.iter().copied())
        .filter(|n| *n != 0)
        .collect();
    let mark = serde_json::to_vec_pretty(&serde_json::json!({
        "deletion": d.id, "ark": d.ark, "reason": d.reason,
        "requested_by": d.requested_by, "approved_by": d.decided_by,
    }))
    .expect("a mark serializes");
    let mut used: BTreeSet<(u32, String)> = BTreeSet::new();
    for n in nodes {
        let node = ingest
            .nodes
            .get(n)
            .ok_or_else(|| format!("storage node {n} is not configured here"))?;
        for &v in &d.versions {
            node.mark(&d.ark, v, crate::nodes::DELETION_MARK, mark.clone())
                .await
                .map_err(|e| e.what)?;
        }
        let on_node = node.versions(&d.ark).await.map_err(|e| e.what)?;
        for v in on_node {
            if node
                .head(&d.ark, v, crate::nodes::DELETION_MARK)
                .await
                .map_err(|e| e.what)?
                .is_some()
            {
                continue;
            }
            if let Some(r) = crate::stages::read_node_version(node, &d.ark, v)
                .await
                .map_err(|e| e.what)?
            {
                for f in &r.files {
                    let (ov, op) = f.stored_at(v);
                    used.insert((ov, op.to_string()));
                }
            }
        }
    }
    let (keep, go): (Vec<File>, Vec<File>) = std::mem::take(&mut d.files)
        .into_iter()
        .partition(|f| used.contains(&(f.version, f.path.clone())));
    d.files = go;
    if !keep.is_empty() {
        tracing::info!(deletion = %d.id, kept = keep.len(), "files a version stored since approval uses are kept");
        d.kept.extend(keep);
    }
    Ok(())
}

/// Leaves `d` approved, saying why its removal waits ([`run`] tries again).
async fn wait(ingest: &Ingest, mut d: Deletion, why: String) -> Result<Deletion, DeletionError> {
    tracing::warn!(deletion = %d.id, error = %why, "deletion waits");
    d.waiting = Some(why);
    let (id, text) = (d.id.clone(), doc(&d));
    let s = Status::Approved.name();
    ingest
        .inventory
        .run(move |i| i.update_deletion(&id, s, s, &text))
        .await?;
    Ok(d)
}

/// Records `d` done.
async fn finish(ingest: &Ingest, mut d: Deletion) -> Result<Deletion, DeletionError> {
    d.status = Status::Deleted;
    d.deleted_at = Some(now(ingest));
    d.waiting = None;
    let (id, text) = (d.id.clone(), doc(&d));
    let (from, to) = (Status::Approved.name(), Status::Deleted.name());
    let moved = ingest
        .inventory
        .run(move |i| i.update_deletion(&id, from, to, &text))
        .await?;
    if !moved {
        // Another process (the retry service, another host) finished it first.
        return get(ingest, &d.id).await;
    }
    tracing::info!(deletion = %d.id, target = %d.target(), "deleted");
    Ok(d)
}

/// Takes `d`'s files off the checker's list and removes them from every node.
async fn remove(ingest: &Ingest, d: &Deletion) -> Result<(), String> {
    // Out of the checker's list first (again, when a crash came between).
    let rows: Vec<CopyRow> = d
        .files
        .iter()
        .flat_map(|f| {
            f.nodes.iter().map(|n| CopyRow {
                ark: d.ark.clone(),
                version: f.version,
                path: f.path.clone(),
                node: *n,
                status: "deleted".into(),
                found: None,
            })
        })
        .collect();
    let inv = ingest.inventory.clone();
    inv.run(move |i| i.set_copies(&rows))
        .await
        .map_err(|e| format!("the inventory: {e}"))?;
    for f in &d.files {
        for &n in &f.nodes {
            if n == 0 {
                let Some(dir) = &f.folder else { continue };
                let p = std::path::Path::new(dir).join(&f.path);
                crate::blocking::io(move || match std::fs::remove_file(&p) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                })
                .await
                .map_err(|e| format!("the storage root: removing {}: {e}", f.path))?;
                continue;
            }
            let node = ingest
                .nodes
                .get(n)
                .ok_or_else(|| format!("storage node {n} is not configured here"))?;
            node.remove(&d.ark, f.version, &f.path)
                .await
                .map_err(|e| e.what)?;
        }
    }
    Ok(())
}

/// Carries out every approved deletion that waits, every `every` until `stop`.
pub async fn run(
    ingest: std::sync::Arc<Ingest>,
    every: std::time::Duration,
    stop: lading_worker::Shutdown,
) {
    loop {
        match list(&ingest, None).await {
            Ok(all) => {
                for d in all.into_iter().filter(|d| d.status == Status::Approved) {
                    if let Err(e) = carry_out(&ingest, d).await {
                        tracing::warn!(error = %e, "deletion");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "deletions cannot be read now"),
        }
        let mut stopping = stop.clone();
        tokio::select! {
            biased;
            _ = stopping.stopped() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
