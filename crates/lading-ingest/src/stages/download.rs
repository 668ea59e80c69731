//! Downloading: every file the manifest names, verified, recorded in the job's verified list (so a resumed job refetches only what is missing or changed).

use super::*;

/// The downloading stage's record: one JSON line per verified file, appended (so recording a
/// file neither creates nor deletes a file: on a busy file system new inodes are what costs).
pub(crate) fn verified_path(workdir: &Path) -> PathBuf {
    workdir.join(INTERIM).join("downloaded.jsonl")
}

/// One line of the record.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct VerifiedLine {
    name: String,
    #[serde(flatten)]
    fetched: Fetched,
    /// The manifest row it was fetched for (URL, declared size, digest): a requeued job
    /// whose corrected manifest changed the row fetches the file again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<String>,
}

/// What identifies a manifest row's file for [`VerifiedLine::source`].
pub(crate) fn row_source(f: &FileEntry) -> String {
    format!(
        "{} {} {}",
        f.url,
        f.size.map_or("-".into(), |n| n.to_string()),
        f.digest.as_ref().map_or("-".into(), |d| format!("{:?}", d))
    )
}

/// The manifest row each verified file was fetched for, by name (the latest line wins).
pub(crate) fn verified_sources(workdir: &Path) -> BTreeMap<String, Option<String>> {
    let text = std::fs::read_to_string(verified_path(workdir)).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<VerifiedLine>(l).ok())
        .map(|l| (l.name, l.source))
        .collect()
}

/// The record so far; a line cut short by a crash (the last one) is ignored, so that file is
/// fetched again.
pub(crate) fn read_verified(workdir: &Path) -> Verified {
    let text = std::fs::read_to_string(verified_path(workdir)).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<VerifiedLine>(l).ok())
        .map(|l| (l.name, l.fetched))
        .collect()
}

pub(crate) fn append_verified(
    workdir: &Path,
    name: &str,
    fetched: &Fetched,
    source: Option<String>,
) -> std::io::Result<()> {
    use std::io::Write;
    let p = verified_path(workdir);
    let mut line = serde_json::to_vec(&VerifiedLine {
        name: name.to_owned(),
        fetched: fetched.clone(),
        source,
    })
    .map_err(std::io::Error::other)?;
    // A line torn by a crash before this one is ended here, so it spoils only itself.
    line.insert(0, b'\n');
    line.push(b'\n');
    let mut opts = std::fs::OpenOptions::new();
    opts.create(true).append(true);
    super::fsops::open_making_folder(&p, &opts)?.write_all(&line)
}

pub(crate) async fn download(ingest: &Ingest, job: &JobCtx) -> Result<Outcome, Outcome> {
    let files = object_files(ingest, job).await?;
    // A fair share of the slots for the submitter, given back when it is over it.
    let who = job.config()?.submitter.clone().unwrap_or_default();
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
        // In order, not at random: a run is the same every time (`lading-sim`).
        biased;
        r = download_files(ingest, job, files) => r,
        reason = crate::fair::over_share(ingest, &who) => {
            job.log(&reason);
            Ok(Outcome::Wait { after: crate::fair::CHECK, reason })
        }
    }
}

/// Fetches and verifies `files` into the job's working folder (those verified before and
/// unchanged are kept).
pub(crate) async fn download_files(
    ingest: &Ingest,
    job: &JobCtx,
    files: Vec<FileEntry>,
) -> Result<Outcome, Outcome> {
    let into = if crate::files::unpacks(job.config()?.payload_type()) {
        CONTAINER
    } else {
        PRODUCER
    };
    let wd = job.workdir()?;
    let mut verified = read_verified(wd);
    let sources = verified_sources(wd);
    let attempts = ingest.cfg.file_attempts.max(1);
    for f in &files {
        let dest = wd.join(into).join(&f.name);
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
            let same = crate::blocking::run(move || file_sha256(&d))
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
                .download(&f.url, &dest, f.size, f.digest.as_ref(), &trust(job)?)
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
        append_verified(wd, &f.name, &got, Some(source))
            .map_err(|e| io_err("writing", &verified_path(wd), e))?;
        verified.insert(f.name.clone(), got);
    }
    // Not synced: the working directory is scratch. Processing hashes every file anyway and
    // checks it against what was verified here, so a copy lost to a power cut is caught
    // there, before anything is stored.
    let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
    let done = done_path(wd);
    let record = serde_json::json!({ "dir": into, "files": names });
    write_atomic(&done, record.to_string().as_bytes()).map_err(|e| io_err("writing", &done, e))?;
    Ok(Outcome::Done)
}

/// Written when every file of the manifest is verified in this working folder: what
/// Processing looks for before it trusts the folder (a job that changed hosts finds none).
pub(crate) fn done_path(workdir: &Path) -> PathBuf {
    workdir.join(INTERIM).join("downloaded.done")
}

/// Whether this host's working folder holds every file Downloading verified for the job: its
/// record is here and names only files that are present.
pub(crate) fn downloads_here(workdir: &Path) -> bool {
    #[derive(serde::Deserialize)]
    struct Done {
        dir: String,
        files: Vec<String>,
    }
    let Ok(text) = std::fs::read_to_string(done_path(workdir)) else {
        return false;
    };
    let Ok(done) = serde_json::from_str::<Done>(&text) else {
        return false;
    };
    // After unpacking, the containers' contents are what Processing reads.
    if done.dir == CONTAINER && workdir.join(INTERIM).join("unpacked").exists() {
        return workdir.join(PRODUCER).is_dir();
    }
    done.files
        .iter()
        .all(|f| workdir.join(&done.dir).join(f).is_file())
}

/// Makes sure the job's files are in this host's working folder, fetching (and verifying)
/// again whatever is not: a job taken up by another host than the one that downloaded it
/// (or whose working folder was lost) never goes on with fewer files than its manifest names.
pub(crate) async fn ensure_downloaded(ingest: &Ingest, job: &JobCtx) -> Result<(), Outcome> {
    if downloads_here(job.workdir()?) {
        return Ok(());
    }
    job.log(&format!(
        "the job's downloaded files are not in this host's working folder ({}); fetching them here",
        ingest.cfg.work_root_id()
    ));
    tracing::info!(job = %job.job(), "downloads not on this host; fetching again");
    let files = object_files(ingest, job).await?;
    match download_files(ingest, job, files).await? {
        Outcome::Done => Ok(()),
        other => Err(other),
    }
}

/// Checks the files under `dir` that downloading verified against their recorded digests.
pub(crate) fn check_verified(
    workdir: &Path,
    dir: &str,
    found: &[ObjectFile],
) -> Result<(), Outcome> {
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
