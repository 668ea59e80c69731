//! Estimating and provisioning: how much room a job needs, and admitting it when there is room.

use super::*;

pub(crate) async fn estimate(ingest: &Ingest, job: &JobCtx) -> Result<Outcome, Outcome> {
    // Never fails: what cannot be sized counts 0.
    let files = match object_files(ingest, job).await {
        Ok(f) => f,
        Err(o) => {
            job.log(&format!("cannot list the files yet ({o:?}); size unknown"));
            return Ok(Outcome::Done);
        }
    };
    let sem = Arc::new(tokio::sync::Semaphore::new(
        ingest.cfg.estimate_concurrency.max(1),
    ));
    let mut set = tokio::task::JoinSet::new();
    for f in files {
        let (fetcher, sem, trust) = (ingest.fetcher.clone(), sem.clone(), trust(job)?);
        set.spawn(async move {
            // A declared size is what the download will be held to: no need to ask.
            if let Some(n) = f.size {
                return n;
            }
            // Nor is Merritt's ERC file asked for: a few lines of metadata, held to
            // `payload.max_file_bytes` by the download. Merritt's Ruby client writes it and
            // stops serving the whole object once it was requested (a HEAD counts), so asking
            // ahead would leave the download with nothing to fetch.
            if f.name == ERC_FILE {
                return 0;
            }
            let _permit = sem.acquire_owned().await;
            fetcher.head_len(&f.url, &trust).await.unwrap_or(0)
        });
    }
    let mut total = 0u64;
    while let Some(r) = set.join_next().await {
        total = total.saturating_add(r.unwrap_or(0));
    }
    job.set_space_needed(total).await.map_err(engine_err)?;
    job.log(&format!("space needed: {total} bytes"));
    if total > ingest.cfg.large_job_bytes {
        let p = ingest.cfg.large_job_priority;
        if job.priority().await < p {
            job.set_priority(p).await.map_err(engine_err)?;
            job.log(&format!("large job: priority lowered to {p}"));
        }
    }
    Ok(Outcome::Done)
}

pub(crate) async fn provision(ingest: &Ingest, job: &JobCtx) -> Result<Outcome, Outcome> {
    let root = ingest.cfg.work_dir();
    let free = free_bytes(&root).map_err(|e| io_err("checking free space on", &root, e))?;
    let needed = job.info.space_needed;
    let round = Duration::from_millis(ingest.cfg.provisioning_round_ms);
    if needed == 0 {
        if free < ingest.cfg.unestimated_min_free_bytes {
            return Ok(Outcome::Wait {
                after: round,
                reason: format!(
                    "waiting for space: size unknown and only {free} bytes free (under {})",
                    ingest.cfg.unestimated_min_free_bytes
                ),
            });
        }
        return Ok(Outcome::Done);
    }
    let want = needed.saturating_add(ingest.cfg.reserve_bytes);
    let capacity = total_bytes(&root).map_err(|e| io_err("checking the size of", &root, e))?;
    if want > capacity {
        return Err(Outcome::fatal(format!(
            "the job needs {needed} bytes plus a reserve of {}, more than the working storage \
             holds ({capacity} bytes); it can never fit",
            ingest.cfg.reserve_bytes
        )));
    }
    if free < want {
        let needs = format!(
            "needs {needed} bytes plus a reserve of {}, {free} free",
            ingest.cfg.reserve_bytes
        );
        return space_wait(ingest, job, &needs);
    }
    // Reserved in the tree until the download ends: jobs admitted at the same moment, here
    // or on other hosts, do not count the same free space twice.
    let root_id = ingest.cfg.work_root_id();
    if let Some(held) = job
        .reserve_space(&root_id, needed, free, ingest.cfg.reserve_bytes)
        .await?
    {
        return Ok(Outcome::Wait {
            after: round,
            reason: format!(
                "waiting for space: needs {needed} bytes plus a reserve of {}, {free} free of \
                 which {held} are reserved by jobs admitted before",
                ingest.cfg.reserve_bytes
            ),
        });
    }
    let _ = std::fs::remove_file(job.workdir()?.join(INTERIM).join(SPACE_WAIT));
    Ok(Outcome::Done)
}

/// When the job started waiting for space (a marker in its working folder).
pub(crate) const SPACE_WAIT: &str = "space-wait";

/// When the job started waiting for space, in ms since the epoch on the engine's clock: read
/// from the marker, or `now_ms` (and the marker written) at the first wait.
/// A job that waits for free space (it `needs` this, in words): a `Wait` each round, or a
/// fatal failure once it has waited `payload.max_space_wait_s` since its first round.
pub(crate) fn space_wait(ingest: &Ingest, job: &JobCtx, needs: &str) -> Result<Outcome, Outcome> {
    let now_ms = job.engine.clock().now_ms();
    let since = space_wait_since(job.workdir()?, now_ms);
    let waited = Duration::from_millis(now_ms.saturating_sub(since));
    if waited >= Duration::from_secs(ingest.cfg.payload.max_space_wait_s) {
        return Err(Outcome::fatal(format!(
            "gave up waiting for space after {} s (payload.max_space_wait_s): {needs}",
            waited.as_secs()
        )));
    }
    Ok(Outcome::Wait {
        after: Duration::from_millis(ingest.cfg.provisioning_round_ms),
        reason: format!("waiting for space: {needs}"),
    })
}

pub(crate) fn space_wait_since(workdir: &Path, now_ms: u64) -> u64 {
    let p = workdir.join(INTERIM).join(SPACE_WAIT);
    let kept = std::fs::read_to_string(&p).ok();
    if let Some(ms) = kept.and_then(|t| t.trim().parse().ok()) {
        return ms;
    }
    let _ = write_atomic(&p, now_ms.to_string().as_bytes());
    now_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_for_space_is_timed_from_its_first_round_on_the_engines_clock() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(INTERIM)).unwrap();
        assert_eq!(
            space_wait_since(dir.path(), 1_000),
            1_000,
            "the first round"
        );
        assert_eq!(
            space_wait_since(dir.path(), 61_000),
            1_000,
            "later rounds (and a restarted worker) keep the start"
        );
        std::fs::write(dir.path().join(INTERIM).join(SPACE_WAIT), "garbled").unwrap();
        assert_eq!(
            space_wait_since(dir.path(), 5_000),
            5_000,
            "an unreadable marker starts again"
        );
    }
}
