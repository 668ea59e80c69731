//! `lading demo`: a real batch through every stage — a manifest of manifests served from
//! a loopback HTTP server, on a fresh embedded store in a folder of its own.

use crate::error::Context;
use crate::node;
use lading_core::JobState;
use lading_ingest::checkm::{self, ManifestKind};
use lading_ingest::{Config, Submission};
use lading_payload::PayloadServer;
use std::path::Path;

/// Runs the demo in `dir` (made, or a previous demo's replaced; any other folder with
/// something in it is refused): `objects` objects of `files` files. The batch's changes go
/// to `say` as they happen; the rest is printed.
pub async fn demo(dir: &Path, objects: usize, files: usize, say: fn(&str)) -> crate::Result<()> {
    if dir.join("lading.db").exists() && dir.join("payload").is_dir() {
        std::fs::remove_dir_all(dir)
            .with_context(|| format!("removing the previous demo in {}", dir.display()))?;
    } else if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
        return Err(crate::NodeError::Other(format!(
            "{} exists and is not a previous demo; choose another --dir",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let payload = dir.join("payload");
    std::fs::create_dir_all(&payload)?;
    let server = PayloadServer::start(&payload).await?;
    let cfg = Config {
        data_dir: dir.join("data"),
        provisioning_round_ms: 500,
        unestimated_min_free_bytes: 0,
        reserve_bytes: 0,
        ..Config::default()
    };
    std::fs::create_dir_all(cfg.profiles_dir())?;
    std::fs::write(
        cfg.profiles_dir().join("demo.toml"),
        format!(
            "collection = \"demo\"\ncallback_url = \"{}\"\ncommand = \"ls -R producer | wc -l\"\n",
            server.callback_url()
        ),
    )?;
    // The depositor's content: `objects` objects of `files` files each.
    let mut batch_rows = Vec::new();
    for o in 0..objects {
        let mut rows = Vec::new();
        for f in 0..files {
            let name = format!("obj{o}/file{f}.txt");
            let body = format!("object {o}, file {f}\n").repeat(100 * (f + 1));
            std::fs::create_dir_all(payload.join(format!("obj{o}")))?;
            std::fs::write(payload.join(&name), &body)?;
            let mut h = lading_ingest::fetch::Hasher::new(checkm::HashAlg::Sha256);
            h.update(body.as_bytes());
            rows.push(vec![
                server.url(&name),
                "sha256".into(),
                h.hex(),
                body.len().to_string(),
                format!("file{f}.txt"),
            ]);
        }
        let m = checkm::write(ManifestKind::Object, checkm::OBJECT_FIELDS, &rows);
        std::fs::write(payload.join(format!("obj{o}.checkm")), m)?;
        batch_rows.push(vec![
            server.url(&format!("obj{o}.checkm")),
            format!("demo-{o}"),
            format!("Demo object {o}"),
        ]);
    }
    let batch = checkm::write(
        ManifestKind::Batch,
        &[checkm::FILE_URL, checkm::LOCAL_ID, checkm::TITLE],
        &batch_rows,
    );
    std::fs::write(payload.join("batch.checkm"), batch)?;
    let store = format!("sqlite:{}", dir.join("lading.db").display());
    let ingest = node::ingest(&store, cfg.clone()).await?;
    let url = server.url("batch.checkm");
    println!("payload served at {url}");
    let bid = lading_ingest::submit(
        &ingest,
        &Submission {
            profile: "demo".into(),
            submitter: "demo".into(),
            payload_url: url,
            payload_type: "batch-manifest".into(),
            title: Some("Lading demo".into()),
            ..Default::default()
        },
    )
    .await?;
    println!("submitted batch {bid} ({objects} objects of {files} files)");
    let running = node::Node::start(ingest.clone(), node::Node::every_stage()).await?;
    node::wait_batch_end(&ingest.engine, &bid, |ev| {
        say(&format!(
            "  {} {:<14} {} → {}",
            ev.kind,
            ev.id,
            ev.from.as_deref().unwrap_or("-"),
            ev.to
        ))
    })
    .await?;
    running.stop_services().await?;
    let stats = &ingest.stats;
    let (_, report) =
        lading_server::ops::report(&lading_server::ops::Local(ingest.clone()), bid.as_str())
            .await?;
    print!("{report}");
    println!("\nper stage (handler time):");
    let figures = stats.figures();
    let order = std::iter::once("Intake")
        .chain(JobState::PIPELINE.iter().map(|s| s.name()))
        .chain(["Reporting"]);
    for (stage, f) in order.filter_map(|s| figures.get(s).map(|f| (s, f))) {
        println!(
            "  {stage:<14} done {:>3}  p50 {:>7.2} ms  max {:>7.2} ms",
            f.done, f.p50_ms, f.max_ms
        );
    }
    println!(
        "\nstored objects: {}\ninventory: {}\ncallbacks received: {}\nstore: {store} (try `lading --store {store} dump /batches`)",
        cfg.storage_root().display(),
        cfg.inventory(),
        server.callbacks().len()
    );
    ingest.engine.tree().close().await?;
    Ok(())
}
