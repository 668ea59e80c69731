//! Processing a bag: its serialization unpacked, the bag validated against RFC 8493 and its
//! BagIt profile (every problem named, fatally), its payload made the object's files
//! (`producer/PATH`, the path inside `data/`) and its tag files kept under `system/bag/` so
//! the bag can be rebuilt byte for byte; its tags become the job's metadata.

use super::*;

/// Where a bag's tag files go in the working folder (and in the stored version).
pub(crate) const BAG_TAGS: &str = "bag";

/// What Processing learnt of a bag, kept in the working folder (`.lading/bag.json`) and in
/// the job's inventory record (`bag`).
pub(crate) fn bag_record_path(workdir: &Path) -> PathBuf {
    workdir.join(INTERIM).join("bag.json")
}

/// The tags that fill Merritt's ERC fields.
const ERC_TAGS: &[(&str, &str)] = &[
    ("Title", "erc_what"),
    ("Source-Organization", "erc_who"),
    ("Bagging-Date", "erc_when"),
];

/// A bag refused: fatally, naming every problem, one per line.
fn invalid_bag(name: &str, problems: &[String]) -> Outcome {
    let n = problems.len();
    Outcome::Fatal(format!(
        "bag {name} is not valid ({n} problem{}):\n{}",
        if n == 1 { "" } else { "s" },
        problems.join("\n")
    ))
}

/// Fetches the files the bag in `dir` lists in its `fetch.txt` (its profile allows it) into
/// the bag, under the depositor's URL policy as every payload URL, at most `room` bytes in
/// all; files the bag holds already are kept. Validation then checks them against the
/// bag's manifests as any payload file.
async fn fetch_into_bag(
    ingest: &Ingest,
    job: &JobCtx,
    dir: &Path,
    lines: &[crate::bagit::FetchLine],
    room: u64,
) -> Result<(), Outcome> {
    let trust = trust(job)?;
    let over = || {
        Outcome::fatal(format!(
            "the files fetch.txt lists are larger than the {room} bytes left of \
             payload.max_unpacked_bytes"
        ))
    };
    // What fetch.txt declares, of the files not here yet: more than the room left is
    // refused; more than the working storage has free (with its reserve) waits for space,
    // as provisioning does (and gives up as it does), without spending an attempt.
    let declared = lines
        .iter()
        .filter(|l| !dir.join(&l.path).is_file())
        .filter_map(|l| l.length)
        .fold(0u64, u64::saturating_add);
    if declared > room {
        return Err(over());
    }
    let free = free_bytes(dir).map_err(|e| io_err("checking free space on", dir, e))?;
    if declared.saturating_add(ingest.cfg.reserve_bytes) > free {
        let needs = format!(
            "fetch.txt lists {declared} bytes, plus a reserve of {}, {free} free",
            ingest.cfg.reserve_bytes
        );
        return Err(space::space_wait(ingest, job, &needs).unwrap_or_else(|o| o));
    }
    let mut fetched = 0u64;
    for l in lines {
        let dest = dir.join(&l.path);
        if dest.is_file() {
            continue;
        }
        if l.length.is_some_and(|n| fetched.saturating_add(n) > room) {
            return Err(over());
        }
        let got = ingest
            .fetcher
            .download(&l.url, &dest, l.length, None, &trust)
            .await
            .map_err(|e| match e {
                crate::fetch::FetchError::Fatal(m) => Outcome::Fatal(format!("fetch.txt: {m}")),
                e => fatal_or_transient(e),
            })?;
        fetched = fetched.saturating_add(got.size);
        if fetched > room {
            return Err(over());
        }
        job.log(&format!(
            "fetched {} for fetch.txt ({} bytes)",
            l.path, got.size
        ));
    }
    Ok(())
}

/// The files Downloading fetched into the job's container folder, each checked against what
/// it verified.
pub(super) async fn verified_containers(wd: &Path) -> Result<Vec<ObjectFile>, Outcome> {
    let c = wd.join(CONTAINER);
    let found = crate::blocking::run(move || list_files(&c))
        .await
        .map_err(|e| Outcome::Transient(e.to_string()))?
        .map_err(|e| io_err("reading", &wd.join(CONTAINER), e))?;
    check_verified(wd, CONTAINER, &found)?;
    Ok(found)
}

/// Unpacks and validates the job's bag, once (a marker says it was done); returns the
/// job's metadata when this call wrote it.
pub(crate) async fn unpack_bag(
    ingest: &Ingest,
    job: &JobCtx,
) -> Result<Option<JobMetadata>, Outcome> {
    let wd = job.workdir()?.to_path_buf();
    let marker = wd.join(INTERIM).join("unpacked");
    if marker.exists() && bag_record_path(&wd).exists() {
        return Ok(None);
    }
    let found = verified_containers(&wd).await?;
    let [file] = found.as_slice() else {
        return Err(Outcome::fatal(format!(
            "a bag is one file; {} were downloaded",
            found.len()
        )));
    };
    let file_name = file.path.clone();
    let Some((mime, _)) = crate::bagit::serialization(&file_name) else {
        return Err(Outcome::fatal(format!(
            "bag {file_name:?}: a bag is a .tar, .tar.gz, .tgz or .zip file"
        )));
    };
    let profile = job_profile(ingest, job)?;
    let unpacked = wd.join(INTERIM).join("bag");
    let limits = crate::unpack::Limits::from(&ingest.cfg.payload);
    let max_entries = ingest.cfg.payload.max_unpacked_entries;
    let (c, into) = (wd.join(CONTAINER), unpacked.clone());
    let bags = profile.bags.clone();
    let (b2, fname) = (bags.clone(), file_name.clone());
    let room = limits.max_bytes;
    let (unpacked_bytes, dir, name, fetch) = crate::blocking::run(move || -> Result<_, Outcome> {
        let bytes = crate::unpack::unpack_all(&c, &into, &limits)?;
        let (dir, name) = crate::bagit::bag_folder(&into, &fname).map_err(Outcome::fatal)?;
        let fetch = crate::bagit::to_fetch(&dir, &b2, max_entries);
        Ok((bytes, dir, name, fetch))
    })
    .await
    .map_err(|e| Outcome::Transient(e.to_string()))??;
    let fetched = match fetch {
        Ok(Some(lines)) => {
            let r = fetch_into_bag(
                ingest,
                job,
                &dir,
                &lines,
                room.saturating_sub(unpacked_bytes),
            );
            r.await
        }
        Ok(None) => Ok(()),
        Err(problems) => Err(invalid_bag(&name, &problems)),
    };
    if let Err(o) = fetched {
        let u = unpacked.clone();
        let _ = crate::blocking::run(move || std::fs::remove_dir_all(u)).await;
        return Err(o);
    }
    let (into, w) = (unpacked.clone(), wd.clone());
    let validated = crate::blocking::run(move || -> Result<_, Outcome> {
        let bag = crate::bagit::validate(&dir, &name, mime, &bags, max_entries);
        let bag = match bag {
            Ok(b) => b,
            Err(problems) => {
                let _ = std::fs::remove_dir_all(&into);
                return Err(invalid_bag(&name, &problems));
            }
        };
        place_bag(&w, &dir)?;
        let _ = std::fs::remove_dir_all(&into);
        Ok(bag)
    })
    .await
    .map_err(|e| Outcome::Transient(e.to_string()))??;
    let bag = validated;
    let tag_name = profile
        .storage_option_tag
        .clone()
        .unwrap_or_else(|| "Storage-Option".into());
    let option = bag.tag(&tag_name).unwrap_or("Standard").to_string();
    if !profile.storage_options.is_empty() {
        profile.nodes_for_option(&option).map_err(Outcome::fatal)?;
    }
    // Tags fill the metadata the submission left empty.
    let metadata = metadata_from_tags(job.info.metadata.clone(), &bag);
    job.set_data(JobData::Metadata(&metadata))
        .await
        .map_err(engine_err)?;
    let record = json!({
        "name": bag.name,
        "bagit_version": bag.version,
        "profile": bag.profile.identifier,
        "profile_file": bag.profile.file,
        "payload_algorithms": bag.payload_algorithms,
        "tag_algorithms": bag.tag_algorithms,
        "storage_option": option,
        "payload_files": bag.payload_files,
        "payload_bytes": bag.payload_bytes,
    });
    // Kept with the stored version too: a restore rebuilds the bag from it.
    for rp in [wd.join(SYSTEM).join("bag.json"), bag_record_path(&wd)] {
        write_atomic(&rp, record.to_string().as_bytes()).map_err(|e| io_err("writing", &rp, e))?;
    }
    let packed: u64 = found.iter().map(|f| f.size).sum();
    job.set_space_needed(packed.saturating_add(unpacked_bytes))
        .await
        .map_err(engine_err)?;
    write_atomic(&marker, b"").map_err(|e| io_err("writing", &marker, e))?;
    job.log(&format!(
        "bag {} valid under BagIt profile {} ({} files, {} bytes; manifests {}); storage option {option}",
        bag.name,
        bag.profile.identifier,
        bag.payload_files,
        bag.payload_bytes,
        bag.payload_algorithms.join(", ")
    ));
    Ok(Some(metadata))
}

/// The bag in `dir` put in the working folder `w`: its payload becomes the object's files,
/// the rest the bag's tag files (what an earlier attempt left there replaced).
fn place_bag(w: &Path, dir: &Path) -> Result<(), Outcome> {
    // The payload becomes the object's files, the rest the bag's tag files.
    let producer = w.join(PRODUCER);
    let tags = w.join(SYSTEM).join(BAG_TAGS);
    for old in [&producer, &tags] {
        if old.exists() {
            std::fs::remove_dir_all(old).map_err(|e| io_err("removing", old, e))?;
        }
    }
    std::fs::create_dir_all(w.join(SYSTEM)).map_err(|e| io_err("creating", w, e))?;
    let data = dir.join("data");
    if data.is_dir() {
        std::fs::rename(&data, &producer).map_err(|e| io_err("renaming", &data, e))?;
    } else {
        std::fs::create_dir_all(&producer).map_err(|e| io_err("creating", &producer, e))?;
    }
    std::fs::rename(dir, &tags).map_err(|e| io_err("renaming", dir, e))?;
    Ok(())
}

/// `metadata` with what the submission left empty filled from the bag's tags: ERC's names
/// for three, the rest by their own names.
fn metadata_from_tags(mut metadata: JobMetadata, bag: &crate::bagit::Bag) -> JobMetadata {
    for t in bag.tags.iter().filter(|t| t.file != "bagit.txt") {
        let key = ERC_TAGS
            .iter()
            .find(|(tag, _)| tag.eq_ignore_ascii_case(&t.name))
            .map_or(t.name.as_str(), |(_, erc)| erc);
        if !t.value.is_empty() {
            metadata.fill(key, &t.value);
        }
    }
    metadata
}

/// The bag record Processing left in the working folder, if the job is a bag.
pub(crate) fn bag_record(workdir: &Path) -> Option<Value> {
    let text = std::fs::read(bag_record_path(workdir)).ok()?;
    lading_core::json::from_bytes(&text).ok()
}
