//! Where a stored version is read from: the storage root's folder, or the first storage
//! node with a good copy. Shared by the access queue's zips and the restorer's bags.

use crate::Ingest;
use std::path::PathBuf;
use std::sync::Arc;

pub use crate::files::files;

/// Where a stored version is read from: a folder (the storage root of a profile without
/// nodes), or the first storage node whose copy answers and has not failed fixity.
pub enum Source {
    Dir(PathBuf),
    Node {
        node: Arc<crate::nodes::Node>,
        ark: String,
        version: u32,
        files: Vec<crate::stages::ObjectFile>,
    },
}

/// Finds a good copy of version `version` of `ark`: the primary first, then replicas; a
/// node that does not answer, or holds a copy the fixity checker found bad or missing, is
/// passed over. `stored` is the job's store record, for a version not recorded yet.
pub async fn source(
    ingest: &Ingest,
    ark: &str,
    version: u32,
    stored: Option<&crate::stages::StoredVersion>,
) -> Result<Source, String> {
    let a = ark.to_string();
    let (deleted, path, copies) = ingest
        .inventory
        .run(move |i| {
            Ok((
                i.deletion_of(&a, version)?,
                i.version_path(&a, version)?,
                i.version_copies(&a, version)?,
            ))
        })
        .await
        .map_err(|e| e.to_string())?;
    if let Some(d) = deleted {
        return Err(d.gone(version));
    }
    let path = path.or_else(|| stored.map(|s| s.path.clone()));
    let mut order: Vec<u32> = stored.and_then(|s| s.node).into_iter().collect();
    let mut bad = std::collections::BTreeSet::new();
    for (id, status) in copies.iter().filter(|(id, _)| *id != 0) {
        if status != "ok" {
            bad.insert(*id);
        }
        if !order.contains(id) {
            // The node the version was stored on (its recorded path) goes first.
            if ingest
                .nodes
                .get(*id)
                .is_some_and(|n| Some(n.version_url(ark, version)) == path)
            {
                order.insert(0, *id);
            } else {
                order.push(*id);
            }
        }
    }
    if order.is_empty() {
        let path = path.ok_or_else(|| format!("version {version} of {ark} is not recorded"))?;
        return Ok(Source::Dir(PathBuf::from(path)));
    }
    let mut why = Vec::new();
    for id in order {
        if bad.contains(&id) {
            why.push(format!("storage node {id}: its copy failed fixity"));
            continue;
        }
        let Some(node) = ingest.nodes.get(id) else {
            why.push(format!("storage node {id} is not configured here"));
            continue;
        };
        match crate::replicate::version_on(node, ark, version).await {
            Ok(r) => {
                return Ok(Source::Node {
                    node: node.clone(),
                    ark: ark.to_string(),
                    version,
                    files: r.files,
                });
            }
            Err(e) => why.push(e.what),
        }
    }
    Err(format!(
        "no storage node has a good copy of {ark} v{version} now: {}",
        why.join("; ")
    ))
}
