//! `lading bench storage`: files put on a configured storage node as Storing puts them.

use lading_ingest::nodes::{Nodes, UploadNote};
use std::io::Write;
use std::time::Instant;

/// Puts `files` files of `size` bytes on node `node` of `cfg`, `STORE_PARALLEL` at once;
/// prints MB/s (one JSON line with `--json`).
pub async fn storage(
    cfg: &lading_ingest::Config,
    node: u32,
    files: usize,
    size: u64,
    json: bool,
) -> crate::Result<()> {
    use futures_util::StreamExt;
    let nodes = Nodes::open(&cfg.storage_nodes, |k| std::env::var(k).ok())
        .map_err(crate::BenchError::Other)?;
    let n = nodes
        .get(node)
        .ok_or_else(|| {
            crate::BenchError::Other(format!(
                "storage node {node} is not in the config's [[storage_nodes]]"
            ))
        })?
        .clone();
    n.check()
        .await
        .map_err(|e| crate::BenchError::Other(e.what))?;
    // The files, written before the clock starts (distinct bytes per file).
    let dir = tempfile::tempdir()?;
    let mut paths = Vec::new();
    let mut block = vec![0u8; 1 << 20];
    for i in 0..files {
        let p = dir.path().join(format!("f{i:04}.bin"));
        let mut f = std::io::BufWriter::new(std::fs::File::create(&p)?);
        let mut left = size;
        let mut x = i as u64 * 0x9e37_79b9_7f4a_7c15 + 1;
        while left > 0 {
            for b in block.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let k = left.min(block.len() as u64) as usize;
            f.write_all(&block[..k])?;
            left -= k as u64;
        }
        f.flush()?;
        paths.push(p);
    }
    let ark = format!("ark:/99999/bench-{}", uuid::Uuid::new_v4().simple());
    let start = Instant::now();
    let results = futures_util::stream::iter(paths.iter().enumerate().map(|(i, p)| {
        let (n, ark) = (n.clone(), ark.clone());
        async move {
            let mut none = |_: Option<String>| Box::pin(async { Ok(()) }) as UploadNote<'static>;
            n.put_new(&ark, 1, &format!("producer/f{i:04}.bin"), p, &mut none)
                .await
        }
    }))
    .buffer_unordered(lading_ingest::stages::STORE_PARALLEL)
    .collect::<Vec<_>>()
    .await;
    let secs = start.elapsed().as_secs_f64();
    for r in results {
        r.map_err(|e| crate::BenchError::Other(e.what))?;
    }
    let bytes = size * files as u64;
    let mb_per_s = bytes as f64 / 1e6 / secs;
    // The bench's keys go again.
    if let lading_ingest::nodes::Place::Bucket { store, .. } = &n.place {
        for i in 0..files {
            if let Ok(k) = n.key(&ark, 1, &format!("producer/f{i:04}.bin")) {
                let _ = store.delete(&k).await;
            }
        }
    } else if let lading_ingest::nodes::Place::Folder(root) = &n.place {
        let _ = std::fs::remove_dir_all(root.join(lading_core::layout::ark_node_name(&ark)));
    }
    if json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "storage", "node": node, "files": files, "size": size,
                "parallel": lading_ingest::stages::STORE_PARALLEL,
                "part_size": n.part_size, "seconds": secs, "mb_per_s": mb_per_s,
            })
        );
    } else {
        println!(
            "{files} files of {size} bytes to {} in {secs:.2} s: {mb_per_s:.1} MB/s ({} at once)",
            n.name(),
            lading_ingest::stages::STORE_PARALLEL
        );
    }
    Ok(())
}
