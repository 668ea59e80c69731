//! Storing: a new version of the object under the storage root, under the ark's storage lock, and the sweep of half-written versions.

use super::*;

pub(crate) fn object_ark(job: &JobCtx) -> Result<String, Outcome> {
    job.info
        .identifiers
        .primary_id
        .clone()
        .ok_or_else(|| Outcome::fatal("the job has no primary identifier (processing sets it)"))
}

/// An object's storage or inventory lock while a handler holds it. The lock is ephemeral,
/// but its session is the process's and outlives the handler: a handler that returns early
/// (a `?`) or is cut off (its stage's timeout aborts it) must still let go, or the object
/// stays locked for as long as the process lives. Dropped without [`HeldArk::release`], it
/// lets go in a task of its own.
pub struct HeldArk {
    engine: Arc<lading_engine::Engine>,
    lock: Option<lading_engine::ArkLock>,
}

impl HeldArk {
    /// Takes the lock `taking` returns, or waits (see `lock_wait`) while another holds it.
    pub async fn take(
        engine: &Arc<lading_engine::Engine>,
        taking: impl std::future::Future<Output = Result<lading_engine::ArkLock, EngineError>>,
    ) -> Result<HeldArk, Outcome> {
        let lock = taking.await.map_err(lock_wait)?;
        Ok(HeldArk {
            engine: engine.clone(),
            lock: Some(lock),
        })
    }

    /// Lets go now.
    pub async fn release(mut self) {
        if let Some(l) = self.lock.take() {
            let_go(&self.engine, l).await;
        }
    }
}

impl Drop for HeldArk {
    fn drop(&mut self) {
        if let Some(l) = self.lock.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let engine = self.engine.clone();
            rt.spawn(async move { let_go(&engine, l).await });
        }
    }
}

/// Deletes an object's lock, trying again while the store cannot say whether it did (a lost
/// connection, a backend that gave up): a delete not made leaves the object locked for the
/// session's life. Ends once the lock is gone or no longer this session's (a new session
/// took the ephemeral lock with the old one), or after [`LET_GO_TRIES`].
async fn let_go(engine: &lading_engine::Engine, lock: lading_engine::ArkLock) {
    let mut wait = Duration::from_millis(100);
    for n in 0..LET_GO_TRIES {
        // After a try whose answer was lost, a lock by that name may be another's by now.
        if n > 0 && !engine.holds(&lock).await.unwrap_or(true) {
            return;
        }
        match engine.unlock_ark(lock.clone()).await {
            Ok(()) | Err(EngineError::LeaseLost(_)) => return,
            Err(e) => {
                tracing::debug!(?lock, error = %e, "cannot let go of an object's lock yet");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
    tracing::warn!(
        ?lock,
        "gave up letting go of an object's lock; its session's end will"
    );
}

/// How often [`let_go`] tries (about eight minutes, 5 s apart at most).
const LET_GO_TRIES: u32 = 100;

/// Lock errors: someone else is on this object; look again shortly.
pub(crate) fn lock_wait(e: EngineError) -> Outcome {
    match e {
        EngineError::Locked(what) => Outcome::Wait {
            after: Duration::from_secs(1),
            reason: format!("{what} is locked by another worker"),
        },
        e => e.into(),
    }
}

/// Refuses to give an object a second numbering. Versions are numbered where they are stored
/// (the storage root, or the profile's primary node), so an object whose newest recorded
/// version has no copy where this job's profile stores (`primary`: a node's id, 0 for the
/// storage root) would start again at version 1 there, and its recording would be refused
/// only once that copy was written (two profiles of one collection naming different
/// storage). Fatal, before anything is written: the operator decides where the object lives.
async fn one_numbering(ingest: &Ingest, ark: &str, primary: u32) -> Result<(), Outcome> {
    let a = ark.to_string();
    let newest = ingest
        .inventory
        .run(move |i| i.newest_copies(&a))
        .await
        .map_err(|e| Outcome::Transient(format!("inventory: {e}")))?;
    let Some((newest, held)) = newest else {
        return Ok(());
    };
    if held.contains(&primary) {
        return Ok(());
    }
    let place = |n: u32| match n {
        0 => "the storage root".to_string(),
        n => format!("storage node {n}"),
    };
    let on: Vec<String> = held.iter().map(|&n| place(n)).collect();
    Err(Outcome::Fatal(format!(
        "{ark} v{newest} is stored on {}, but this job's profile stores on {}: its versions \
         would be numbered again there; submit it with a profile that stores where it lives",
        on.join(" and "),
        place(primary)
    )))
}

/// The nodes a job's object goes to: those its bag's storage option names, else its
/// profile's.
async fn job_nodes(
    ingest: &Ingest,
    job: &JobCtx,
    profile: &crate::Profile,
) -> Result<Vec<Arc<crate::nodes::Node>>, Outcome> {
    let option = job_json(job, "inventory").await?.and_then(|v| {
        v.pointer("/bag/storage_option")
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    match option {
        Some(o) if !profile.storage_options.is_empty() => {
            let ids = profile.nodes_for_option(&o).map_err(Outcome::fatal)?;
            ingest.nodes.of_ids(ids, &profile.name)
        }
        _ => ingest.nodes.of_profile(profile),
    }
    .map_err(Outcome::fatal)
}

pub(crate) async fn store(ingest: &Ingest, job: &JobCtx) -> Result<Outcome, Outcome> {
    ensure_processed(ingest, job).await?;
    let ark = object_ark(job)?;
    let profile = job_profile(ingest, job)?;
    let root = profile
        .storage_root
        .clone()
        .unwrap_or_else(|| ingest.cfg.storage_root());
    let nodes = job_nodes(ingest, job, &profile).await?;
    let lock = HeldArk::take(&job.engine, job.engine.lock_storage(&ark)).await?;
    if let Err(e) = one_numbering(ingest, &ark, nodes.first().map_or(0, |n| n.id)).await {
        lock.release().await;
        return Err(e);
    }
    let umask = ingest.cfg.storage_umask_bits().map_err(Outcome::fatal)?;
    let r = match nodes.first().map(|n| (n, &n.place)) {
        None => store_locked(job, &root, &ark, &profile.collection, umask).await,
        Some((n, crate::nodes::Place::Folder(root))) => {
            store_locked(job, root, &ark, &profile.collection, umask)
                .await
                .map(|s| StoredVersion {
                    node: Some(n.id),
                    ..s
                })
        }
        Some((n, crate::nodes::Place::Bucket { .. })) => {
            store_on_bucket(job, n, &ark, &profile.collection).await
        }
    };
    lock.release().await;
    let stored = r?;
    job.log(&format!("stored {} as version {}", ark, stored.version));
    // Copies to the replicas follow through the outbox, each its own retried delivery
    // with a key naming the version and the node.
    for replica in nodes.iter().skip(1) {
        let key = format!("replicate:{ark}|{}|{}", stored.version, replica.id);
        job.add_effect(lading_engine::Effect {
            kind: lading_engine::EffectKind::Replicate,
            key,
            batch: Some(job.info.bid.clone()),
            job: Some(job.job().clone()),
            payload: json!({
                "ark": ark, "version": stored.version,
                "from": nodes[0].id, "to": replica.id,
            }),
        })
        .await;
    }
    // Merritt's fields beside Lading's: the store record names the manifest it was given and
    // how (`add` for a new object, `update` for a new version); the inventory record names
    // the stored version's manifest, which the recording stage reads.
    let mode = if stored.version == 1 { "add" } else { "update" };
    let file_url = |p: PathBuf| format!("file://{}", p.display());
    let mut store = json!(stored);
    store["manifest_url"] = json!(file_url(
        job.workdir()?.join(SYSTEM).join("manifest.checkm")
    ));
    store["mode"] = json!(mode);
    // Merritt's `Job.setStore` takes `delete` as a string and its reader calls `getString`.
    store["delete"] = json!("false");
    job.set_data(JobData::Store(&store))
        .await
        .map_err(engine_err)?;
    let mut inventory = job_json(job, "inventory")
        .await?
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    inventory["manifest_url"] = json!(if stored.path.starts_with("s3://") {
        format!("{}{SYSTEM}/manifest.checkm", stored.path)
    } else {
        file_url(Path::new(&stored.path).join(SYSTEM).join("manifest.checkm"))
    });
    inventory["mode"] = json!(mode);
    job.set_data(JobData::Inventory(&inventory))
        .await
        .map_err(engine_err)?;
    Ok(Outcome::Done)
}

pub(crate) async fn store_locked(
    job: &JobCtx,
    root: &Path,
    ark: &str,
    collection: &str,
    umask: u32,
) -> Result<StoredVersion, Outcome> {
    let collection = collection.to_string();
    let object_dir = root.join(ark_node_name(ark));
    let root = root.to_path_buf();
    let (wd, jid, bid, ark) = (
        job.workdir()?.to_path_buf(),
        job.job().to_string(),
        job.info.bid.to_string(),
        ark.to_string(),
    );
    crate::blocking::run(move || -> Result<StoredVersion, Outcome> {
        let io = |what: &str, p: &Path| {
            let p = p.to_path_buf();
            let what = what.to_string();
            move |e| io_err(&what, &p, e)
        };
        let existing = versions(&object_dir).map_err(io("reading", &object_dir))?;
        // A version this job already stored (it crashed before recording that) is reused.
        let sabotaged = lading_core::sabotage::on(lading_core::sabotage::STORE_TWICE);
        for v in existing.iter().rev().filter(|_| !sabotaged) {
            let f = object_dir.join(format!("v{v}")).join(VERSION_FILE);
            if let Ok(b) = std::fs::read(&f)
                && let Ok(s) = lading_core::json::from_bytes::<StoredVersion>(&b)
                && s.job == jid
            {
                return Ok(s);
            }
        }
        // Under the object's storage lock: the newest version says who owns it, so two
        // collections racing for one new identifier cannot both write to it.
        if let Some(v) = existing.last() {
            let f = object_dir.join(format!("v{v}")).join(VERSION_FILE);
            if let Ok(b) = std::fs::read(&f)
                && let Ok(s) = lading_core::json::from_bytes::<StoredVersion>(&b)
                && let Some(owner) = s.collection
                && owner != collection
            {
                return Err(Outcome::fatal(format!(
                    "{ark} belongs to another collection; collection {collection} may not add a version to it"
                )));
            }
        }
        let version = existing.last().copied().unwrap_or(0) + 1;
        let new_object = !object_dir.exists();
        if new_object {
            std::fs::create_dir_all(&root).map_err(io("creating", &root))?;
            if let Err(e) = spread_subdirs(&root) {
                tracing::debug!(dir = %root.display(), error = %e, "cannot spread folders");
            }
        }
        let tmp = object_dir.join(format!(".tmp-{jid}"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(io("removing", &tmp))?;
        }
        // Whatever fails from here on leaves no partial copy (and no empty object folder)
        // to take up the storage root's space.
        let scrap = |o: Outcome| {
            let _ = std::fs::remove_dir_all(&tmp);
            if new_object {
                let _ = std::fs::remove_dir(&object_dir);
            }
            o
        };
        for part in [PRODUCER, SYSTEM] {
            let from = wd.join(part);
            if from.exists() {
                place_tree(&from, &tmp.join(part), true)
                    .map_err(io("copying into", &tmp))
                    .map_err(scrap)?;
            }
        }
        // Unchanged files are the earlier version's, linked (a failure only costs space).
        if let Some(v) = existing.last() {
            let earlier = object_dir.join(format!("v{v}"));
            match link_unchanged(&tmp, &earlier) {
                Ok(n) => tracing::debug!(linked = n, "files carried over from v{v}"),
                Err(e) => tracing::warn!(error = %e, "cannot link files of v{v}; stored again"),
            }
        }
        let final_dir = object_dir.join(format!("v{version}"));
        let stored = StoredVersion {
            ark,
            version,
            path: final_dir.to_string_lossy().into_owned(),
            job: jid,
            batch: bid,
            collection: Some(collection),
            node: None,
        };
        let vf = tmp.join(VERSION_FILE);
        write_atomic(&vf, &serde_json::to_vec_pretty(&stored).unwrap_or_default())
            .map_err(io("writing", &vf))
            .map_err(scrap)?;
        std::fs::File::open(&vf)
            .and_then(|f| f.sync_data())
            .map_err(io("syncing", &vf))
            .map_err(scrap)?;
        if umask != DEFAULT_UMASK {
            set_modes(&tmp, umask)
                .map_err(io("setting modes in", &tmp))
                .map_err(scrap)?;
        }
        // The copy is durable before it is published.
        sync_dirs(&tmp).map_err(io("syncing", &tmp)).map_err(scrap)?;
        // The rename is the commit: a reader sees no version or a whole one.
        std::fs::rename(&tmp, &final_dir)
            .map_err(io("renaming into", &final_dir))
            .map_err(scrap)?;
        std::fs::File::open(&object_dir)
            .and_then(|d| d.sync_all())
            .map_err(io("syncing", &object_dir))?;
        if new_object {
            // The object's own folder is a new name in the root: durable too.
            std::fs::File::open(&root)
                .and_then(|d| d.sync_all())
                .map_err(io("syncing", &root))?;
        }
        Ok(stored)
    })
    .await
    .map_err(|e| Outcome::Transient(e.to_string()))?
}

/// Removes what failed stores left in the service's storage root: `.tmp-JID` copies of jobs
/// that are not being stored right now (not locked in Storing), and object folders left
/// empty. Run when a process with the storing stage starts. Returns what went.
pub async fn sweep_storage(ingest: &Ingest) -> std::io::Result<usize> {
    let root = ingest.cfg.storage_root();
    let mut debris = Vec::new();
    let mut objects = Vec::new();
    let rd = match std::fs::read_dir(&root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    for e in rd {
        let e = e?;
        if !e.file_type()?.is_dir() {
            continue;
        }
        objects.push(e.path());
        for c in std::fs::read_dir(e.path())? {
            let c = c?;
            let name = c.file_name().to_string_lossy().into_owned();
            if let Some(jid) = name.strip_prefix(".tmp-") {
                debris.push((c.path(), jid.to_string()));
            }
        }
    }
    let mut gone = 0;
    for (path, jid) in debris {
        let busy = match lading_core::layout::JobId::parse(&jid) {
            Ok(j) => ingest
                .engine
                .job(&j)
                .await
                .is_ok_and(|i| i.status.status == JobState::Storing && i.locked),
            Err(_) => false,
        };
        if !busy && std::fs::remove_dir_all(&path).is_ok() {
            gone += 1;
        }
    }
    for o in objects {
        // Only an empty folder goes (remove_dir refuses any other).
        if std::fs::remove_dir(&o).is_ok() {
            gone += 1;
        }
    }
    Ok(gone)
}

#[cfg(test)]
mod held_tests {
    use super::HeldArk;
    use lading_core::WatchKind;
    use lading_engine::{Engine, EngineError};
    use std::sync::Arc;

    #[tokio::test]
    async fn an_object_lock_is_let_go_when_its_holder_returns_early_or_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let tree =
            lading_store_sqlite::SqliteTree::open(dir.path().join("lading.db"), Default::default())
                .unwrap();
        let e = Arc::new(Engine::new(
            Arc::new(tree),
            lading_core::time::system_clock(),
            "tester",
        ));
        e.init().await.unwrap();
        let ark = "ark:/99999/held";
        // Released: free at once.
        let held = HeldArk::take(&e, e.lock_storage(ark)).await.unwrap();
        assert!(matches!(
            e.lock_storage(ark).await,
            Err(EngineError::Locked(_))
        ));
        held.release().await;
        let again = HeldArk::take(&e, e.lock_storage(ark)).await.unwrap();
        // Dropped, as by a `?` or by the stage's timeout aborting the handler: let go soon,
        // though the session that holds it goes on. Its node's deletion is watched for.
        let path = lading_core::layout::storage_lock(ark);
        drop(again);
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                // Set before the read, so a deletion after it is never missed.
                let gone = e.tree().watch(&path, WatchKind::Data).await.unwrap();
                if e.tree().get(&path).await.unwrap().is_none() {
                    break;
                }
                gone.await;
            }
        })
        .await
        .expect("a dropped lock was let go");
        let l = e.lock_storage(ark).await.unwrap();
        e.unlock_ark(l).await.unwrap();
    }
}
