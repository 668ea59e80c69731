//! Processing: the object's manifest, ownership checks and the profile's command.

use super::*;

pub(crate) async fn process(ingest: &Ingest, job: &JobCtx) -> Result<Outcome, Outcome> {
    ensure_downloaded(ingest, job).await?;
    let wd = job.workdir()?.to_path_buf();
    let producer = wd.join(PRODUCER);
    // The metadata as this call left it (a bag's tags fill it in).
    let mut current_metadata = job.info.metadata.clone();
    if job.config()?.payload_type() == "bag" {
        if let Some(m) = super::bag::unpack_bag(ingest, job).await? {
            current_metadata = m;
        }
    } else if job.config()?.payload_type() == "container" {
        unpack_containers(ingest, job).await?;
    }
    std::fs::create_dir_all(&producer).map_err(|e| io_err("creating", &producer, e))?;
    let p = producer.clone();
    let files = crate::blocking::run(move || list_files(&p))
        .await
        .map_err(|e| Outcome::Transient(e.to_string()))?
        .map_err(|e| io_err("reading", &producer, e))?;
    if files.is_empty() {
        return Err(Outcome::fatal("the object has no files"));
    }
    if !crate::files::unpacks(job.config()?.payload_type()) {
        check_verified(&wd, PRODUCER, &files)?;
    }
    // An ERC file (`mrt-erc.txt`, what Merritt's clients send with an object) fills the
    // metadata the submission left empty; the file itself is stored with the object.
    if files.iter().any(|f| f.path == ERC_FILE) {
        fill_from_erc(job, &producer, current_metadata).await?;
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
    let profile = job_profile(ingest, job)?;
    let ark = primary_id(ingest, job, &profile).await?;
    crate::intake::check_primary_id(&ark)
        .map_err(|why| Outcome::fatal(format!("primary identifier: {why}")))?;
    check_owner(ingest, &ark, &profile.collection).await?;
    if let Some(cmd) = &profile.command {
        run_command(ingest, job, cmd, &ark).await?;
    }
    let size: u64 = files.iter().map(|f| f.size).sum();
    // This working folder's mark, in the folder and in the job: Storing stores from a folder
    // only when the two agree, so a job that reached another host is processed there again.
    let mark = unique_hex(job);
    let at = processed_path(&wd);
    write_atomic(&at, mark.as_bytes()).map_err(|e| io_err("writing", &at, e))?;
    let mut inventory =
        json!({ "primary_id": ark, "files": files, "size": size, "working_copy": mark });
    if let Some(mut bag) = super::bag::bag_record(&wd) {
        if let Some(changes) = changes_from_newest(ingest, &ark, &files).await? {
            job.log(&format!("compared with the stored version: {changes}"));
            bag["reingest"] = changes;
        }
        inventory["bag"] = bag;
    }
    job.set_data(JobData::Inventory(&inventory))
        .await
        .map_err(engine_err)?;
    Ok(Outcome::Done)
}

/// Unpacks the job's containers into the object (once: a mark says it was done), and counts
/// what the job takes now.
async fn unpack_containers(ingest: &Ingest, job: &JobCtx) -> Result<(), Outcome> {
    let wd = job.workdir()?.to_path_buf();
    let producer = wd.join(PRODUCER);
    let marker = wd.join(INTERIM).join("unpacked");
    if !marker.exists() {
        let found = super::bag::verified_containers(&wd).await?;
        let (c, p) = (wd.join(CONTAINER), producer.clone());
        let limits = crate::unpack::Limits::from(&ingest.cfg.payload);
        let unpacked = crate::blocking::run(move || crate::unpack::unpack_all(&c, &p, &limits))
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
    Ok(())
}

/// An ERC file (`mrt-erc.txt`, what Merritt's clients send with an object) fills the
/// metadata the submission left empty (`metadata`, as this call left it); the file itself is
/// stored with the object.
async fn fill_from_erc(
    job: &JobCtx,
    producer: &std::path::Path,
    mut metadata: JobMetadata,
) -> Result<(), Outcome> {
    let erc = read_erc(&producer.join(ERC_FILE))
        .map_err(|e| io_err("reading", &producer.join(ERC_FILE), e))?;
    let mut changed = false;
    for (key, value) in erc {
        changed |= metadata.fill(&key, &value);
    }
    if changed {
        job.set_data(JobData::Metadata(&metadata))
            .await
            .map_err(engine_err)?;
        job.log("metadata filled from mrt-erc.txt");
    }
    Ok(())
}

/// The object's primary identifier: given; or, for a bag whose name is already an object
/// of the collection, that object's; or minted once (kept in the job, so a retry reuses it).
async fn primary_id(
    ingest: &Ingest,
    job: &JobCtx,
    profile: &crate::config::Profile,
) -> Result<String, Outcome> {
    let wd = job.workdir()?;
    // The primary identifier: given, or minted once (kept in the job, so a retry reuses it).
    let mut ids = job.info.identifiers.clone();
    let mut ids_changed = false;
    // A bag's name is its object's local identifier when none was given.
    if ids.local_id.is_empty()
        && let Some(name) = super::bag::bag_record(wd)
            .and_then(|b| b.get("name").and_then(Value::as_str).map(str::to_string))
    {
        ids.local_id = vec![name];
        ids_changed = true;
    }
    // A bag whose name is already an object of the collection is that object's next version.
    let bag_name = super::bag::bag_record(wd)
        .and_then(|b| b.get("name").and_then(Value::as_str).map(str::to_string));
    if ids.primary_id.as_deref().is_none_or(str::is_empty)
        && let Some(name) = bag_name.clone()
    {
        let (c, n) = (profile.collection.clone(), name.clone());
        match ingest.inventory.run(move |i| i.object_named(&c, &n)).await {
            Ok(Some(ark)) => {
                job.log(&format!(
                    "bag {name} is already {ark}: this is its next version"
                ));
                ids.primary_id = Some(ark);
                ids_changed = true;
            }
            Ok(None) => {}
            Err(e) => return Err(Outcome::Transient(format!("inventory: {e}"))),
        }
    }
    if ids.primary_id.as_deref().is_none_or(str::is_empty) {
        let shoulder = profile.shoulder.as_deref().unwrap_or(&ingest.cfg.shoulder);
        let minted = format!("{shoulder}{}", unique_hex(job));
        job.log(&format!("minted {minted}"));
        ids.primary_id = Some(minted);
        ids_changed = true;
    }
    if ids_changed {
        job.set_data(JobData::Identifiers(&ids))
            .await
            .map_err(engine_err)?;
    }
    Ok(ids.primary_id.clone().unwrap_or_default())
}

/// How `files` differ from the newest stored version of `ark` (none stored: `None`): how
/// many are new, changed, unchanged, and how many of its files are gone.
async fn changes_from_newest(
    ingest: &Ingest,
    ark: &str,
    files: &[ObjectFile],
) -> Result<Option<Value>, Outcome> {
    let a = ark.to_string();
    let before = ingest
        .inventory
        .run(move |i| {
            let newest = i.versions(&a)?.iter().map(|(v, _, _)| *v).max();
            match newest {
                Some(v) => Ok(Some((v, i.version_files(&a, v)?))),
                None => Ok(None),
            }
        })
        .await
        .map_err(|e: crate::inventory::InventoryError| {
            Outcome::Transient(format!("inventory: {e}"))
        })?;
    let Some((version, before)) = before else {
        return Ok(None);
    };
    let prefix = format!("{PRODUCER}/");
    let before: BTreeMap<&str, &str> = before
        .iter()
        .filter_map(|(p, d)| Some((p.strip_prefix(&prefix)?, d.as_str())))
        .collect();
    let (mut new, mut changed, mut unchanged) = (0u64, 0u64, 0u64);
    for f in files {
        match before.get(f.path.as_str()) {
            None => new += 1,
            Some(d) if *d == f.sha256 => unchanged += 1,
            Some(_) => changed += 1,
        }
    }
    let now: std::collections::BTreeSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
    let deleted = before.keys().filter(|p| !now.contains(*p)).count() as u64;
    Ok(Some(json!({
        "from_version": version, "new": new, "changed": changed,
        "unchanged": unchanged, "deleted": deleted,
    })))
}

/// Where Processing leaves its mark in the working folder.
pub(crate) fn processed_path(workdir: &Path) -> PathBuf {
    workdir.join(INTERIM).join("processed")
}

/// Makes sure the working folder on this host is the one this job was processed in (its mark
/// matches the job's), processing it here again (after fetching its files) when it is not.
pub(crate) async fn ensure_processed(ingest: &Ingest, job: &JobCtx) -> Result<(), Outcome> {
    let recorded = job_json(job, "inventory").await?.and_then(|v| {
        v.get("working_copy")
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    let wd = job.workdir()?;
    let here = std::fs::read_to_string(processed_path(wd)).ok();
    if recorded.is_some() && recorded == here && wd.join(PRODUCER).is_dir() {
        return Ok(());
    }
    job.log(&format!(
        "the processed working copy is not in this host's working folder ({}); \
         processing the job here again",
        ingest.cfg.work_root_id()
    ));
    tracing::info!(job = %job.job(), "processed copy not on this host; processing again");
    match process(ingest, job).await? {
        Outcome::Done => Ok(()),
        other => Err(other),
    }
}

/// Fails unless `ark` is new or belongs to `collection` (the inventory records each object's
/// owning collection).
pub(crate) async fn check_owner(
    ingest: &Ingest,
    ark: &str,
    collection: &str,
) -> Result<(), Outcome> {
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
pub(crate) const TAIL_LINES: usize = 5;

pub(crate) async fn run_command(
    ingest: &Ingest,
    job: &JobCtx,
    cmd: &str,
    ark: &str,
) -> Result<(), Outcome> {
    job.log(&format!("running: {cmd}"));
    let run = crate::command::Run {
        command: cmd,
        workdir: job.workdir()?,
        env: vec![
            ("LADING_JOB_ID", job.job().to_string()),
            ("LADING_BATCH_ID", job.info.bid.to_string()),
            ("LADING_PRIMARY_ID", ark.to_string()),
            (
                "LADING_PROFILE",
                job.config()?.profile().unwrap_or_default().to_string(),
            ),
            ("LADING_WORKDIR", job.workdir()?.display().to_string()),
        ],
    };
    let ran = ingest
        .commands
        .run(run)
        .await
        .map_err(|e| Outcome::Transient(format!("cannot run {cmd:?}: {e}")))?;
    if ran.dropped > 0 {
        job.log(&format!("| … {} earlier lines not kept", ran.dropped));
    }
    for line in &ran.output {
        job.log(&format!("| {line}"));
    }
    if !ran.success {
        let tail = ran.output[ran.output.len().saturating_sub(TAIL_LINES)..].join("\n");
        return Err(Outcome::Fatal(format!(
            "processing command exited with {}: {tail}",
            ran.status
        )));
    }
    Ok(())
}

/// The `who`, `what`, `when` and `where` of an ERC file (ANVL: `erc:` then `label: value`
/// lines, a value going on over indented lines; `when/created` and the like count as
/// `when`), as the job's metadata keys (`erc_who`, …). At most 64 KiB of it is read.
fn read_erc(path: &std::path::Path) -> std::io::Result<Vec<(String, String)>> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(64 << 10)
        .read_to_string(&mut text)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let mut out: Vec<(String, String)> = Vec::new();
    let mut current: Option<usize> = None;
    for line in text.lines() {
        if line.starts_with([' ', '\t']) {
            if let Some(i) = current {
                out[i].1.push(' ');
                out[i].1.push_str(line.trim());
            }
            continue;
        }
        current = None;
        let Some((label, value)) = line.split_once(':') else {
            continue;
        };
        let label = label
            .split('/')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if !matches!(label.as_str(), "who" | "what" | "when" | "where") {
            continue;
        }
        let key = format!("erc_{label}");
        if out.iter().any(|(k, _)| *k == key) {
            continue;
        }
        out.push((key, value.trim().to_string()));
        current = Some(out.len() - 1);
    }
    out.retain(|(_, v)| !v.is_empty());
    Ok(out)
}

/// 128 bits from the engine's randomness, as 32 hex digits: a minted identifier's unique
/// part, a working folder's mark. Unique, not secret; from the engine's source (seeded from
/// the operating system, or from the simulator's seed) so that a simulated run repeats.
fn unique_hex(job: &JobCtx) -> String {
    let r = job.engine.random();
    format!("{:016x}{:016x}", r.next_u64(), r.next_u64())
}

#[cfg(test)]
mod erc_tests {
    #[test]
    fn an_erc_file_gives_who_what_when_where() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("mrt-erc.txt");
        std::fs::write(
            &p,
            "erc:\nwho: Doe, Jane\nwhat: Two letters,\n  and a note\nwhen/created: 2026\nhow: by hand\nwhere: ark:/99999/x\n",
        )
        .unwrap();
        let erc = super::read_erc(&p).unwrap();
        assert_eq!(
            erc,
            vec![
                ("erc_who".to_string(), "Doe, Jane".to_string()),
                ("erc_what".into(), "Two letters, and a note".into()),
                ("erc_when".into(), "2026".into()),
                ("erc_where".into(), "ark:/99999/x".into()),
            ]
        );
    }
}
