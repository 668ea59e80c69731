//! The end-of-run checks that read the stored result: fixity finds rot, access serves what was
//! stored, storage holds every version once and as given, no upload left open, no attempt
//! spent on an outage, one job per object.

use super::*;

/// Once all is quiet: a few stored copies go bad on the nodes' disks. The fixity checker
/// must find exactly those, repair each from the other node, and find nothing after.
pub(super) async fn fixity_finds_rot(
    ingest: &lading_ingest::Ingest,
    buckets: &Buckets,
    rng: &Seeded,
    world: &World,
) -> Vec<String> {
    use lading_ingest::bucket::Bucket;
    use std::collections::BTreeSet;
    let mut found = Vec::new();
    // Nothing has gone bad yet: neither the checker's calls under the faults nor the
    // scheduled audit may have recorded a copy bad or missing.
    match ingest.inventory.run(|i| i.copies(None, None)).await {
        Ok(all) => {
            let checked = all.iter().filter(|c| c.checked.is_some()).count();
            world.lock().trace(format!(
                "fixity: before any copy goes bad, {} copies recorded, {checked} checked",
                all.len()
            ));
            for c in all
                .iter()
                .filter(|c| c.status != "ok" && c.checked.is_some())
            {
                found.push(format!(
                    "fixity: a good copy recorded {}: node {} {} v{} {}",
                    c.status, c.node, c.ark, c.version, c.path
                ));
            }
        }
        Err(e) => found.push(format!("fixity: the inventory's copies unreadable: {e}")),
    }
    let mut rotted = BTreeSet::new();
    for _ in 0..2 {
        let k = rng.below(2);
        let keys: Vec<String> = buckets.nodes[k]
            .keys(None)
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|m| m.location.to_string())
            .filter(|key| key.contains("|producer/"))
            .collect();
        let Some(key) = keys.get(rng.below(keys.len().max(1))) else {
            continue;
        };
        // lading/ARK|V|producer/PATH
        let mut parts = key.trim_start_matches("lading/").splitn(3, '|');
        let (Some(ark), Some(v), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Ok(v) = v.parse::<u32>() else { continue };
        // Only copies the inventory records (a version a failed job left is not audited).
        let a = ark.to_string();
        let recorded = ingest
            .inventory
            .run(move |i| i.copies(Some(k as u32 + 1), Some(&a)))
            .await
            .unwrap_or_default()
            .iter()
            .any(|c| c.version == v && c.path == path);
        // One copy of a file at most: with both gone bad, nothing could repair it.
        if !recorded
            || rotted
                .iter()
                .any(|(_, a, w, p)| a == ark && *w == v && p == path)
        {
            continue;
        }
        if buckets.nodes[k].rot(key, b"rot".to_vec()).await.is_ok() {
            rotted.insert((k as u32 + 1, ark.to_string(), v, path.to_string()));
        }
    }
    let named = |a: &lading_ingest::fixity::Audit| -> BTreeSet<(u32, String, u32, String)> {
        a.findings
            .iter()
            .map(|f| (f.node, f.ark.clone(), f.version, f.path.clone()))
            .collect()
    };
    match lading_ingest::fixity::repair(ingest, None, None).await {
        Ok(a) => {
            world.lock().trace(format!(
                "fixity: {} copies checked; gone bad {rotted:?}; found {}, repaired {}",
                a.checked,
                a.findings.len(),
                a.findings
                    .iter()
                    .filter(|f| f.status.starts_with("repaired"))
                    .count()
            ));
            if named(&a) != rotted {
                found.push(format!(
                    "fixity: found {:?}, the copies gone bad are {rotted:?}",
                    named(&a)
                ));
            }
            for f in a
                .findings
                .iter()
                .filter(|f| !f.status.starts_with("repaired"))
            {
                found.push(format!("fixity: not repaired: {f}"));
            }
        }
        Err(e) => found.push(format!("fixity: the check failed with no faults on: {e}")),
    }
    match lading_ingest::fixity::check(ingest, None, None, None).await {
        Ok(a) if a.findings.is_empty() => {}
        Ok(a) => found.push(format!("fixity: after the repair, still {:?}", named(&a))),
        Err(e) => found.push(format!("fixity: the check after the repair failed: {e}")),
    }
    found
}

/// An access request: its id, the object and version, and the version's files as the
/// inventory records them (path → SHA-256).
pub(super) type Asked = (
    AccessQueue,
    lading_core::layout::AccessId,
    String,
    u32,
    BTreeMap<String, String>,
);

/// An access request for a version some completed payload job stored.
pub(super) async fn ask_access(
    rng: &Seeded,
    admin_engine: &Engine,
    ingest: &lading_ingest::Ingest,
    bids: &[BatchId],
) -> Option<Asked> {
    let b = pick(rng, bids)?;
    let info = admin(|| admin_engine.batch(&b)).await?;
    let j = pick(rng, info.jobs.get("batch-completed")?)?;
    let jid = j.to_string();
    let v = ingest
        .inventory
        .run(move |i| i.job_versions(&jid))
        .await
        .ok()?
        .into_iter()
        .next()?;
    let token = json!({ "ark": v.ark, "version": v.version, "requester": "sim" });
    let queue = [AccessQueue::Small, AccessQueue::Large][rng.below(2)];
    let id = admin(|| admin_engine.create_access(queue, &token)).await?;
    let files = v.files.into_iter().map(|(p, _, sha)| (p, sha)).collect();
    Some((queue, id, v.ark, v.version, files))
}

/// Every access request ended, and each that completed holds the version's files as the
/// inventory records them, byte for byte; with the faults over, more are asked for, and
/// each must complete.
pub(super) async fn access_served(
    sim: &Sim,
    rng: &Seeded,
    admin_engine: &Engine,
    ingest: &lading_ingest::Ingest,
    bids: &[BatchId],
    mut asked: Vec<Asked>,
) -> Vec<String> {
    let during = asked.len();
    for _ in 0..3 {
        asked.extend(ask_access(rng, admin_engine, ingest, bids).await);
    }
    let mut found = Vec::new();
    let ended = |s: &lading_core::AccessState| {
        matches!(
            s,
            lading_core::AccessState::Completed | lading_core::AccessState::Failed
        )
    };
    // Cleanup removes a finished request (and its zip) once the retention has passed: a
    // request gone since is not looked at further (only a finished one is removed).
    let purged = |queue: AccessQueue, id: lading_core::layout::AccessId| async move {
        matches!(
            admin_engine.access(queue, &id).await,
            Err(lading_engine::EngineError::NoAccess(_))
        )
    };
    for (k, (queue, id, ark, version, want)) in asked.iter().enumerate() {
        let mut info = None;
        for _ in 0..120 {
            info = admin(|| admin_engine.access(*queue, id)).await;
            if info.as_ref().is_some_and(|i| ended(&i.status.status)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let Some(info) = info else {
            if !purged(*queue, id.clone()).await {
                found.push(format!("access {id}: unreadable"));
            }
            continue;
        };
        match info.status.status {
            lading_core::AccessState::Completed => {}
            lading_core::AccessState::Failed if k < during => continue,
            s => {
                found.push(format!(
                    "access {id} for {ark} v{version}: {s:?} ({}) with no faults on",
                    info.status.message.unwrap_or_default()
                ));
                continue;
            }
        }
        let zip = (0..8)
            .map(|p| {
                sim.work
                    .path()
                    .join(format!("p{p}-data"))
                    .join("access")
                    .join(format!("{}-{id}.zip", queue.name()))
            })
            .find(|p| p.exists());
        let got = zip.as_deref().map(zip_entries);
        // Exactly the files the inventory lists, but the version's own record at its top
        // (`lading-version.json`, Lading's: served from no copy, wherever it is stored).
        let served: Vec<_> = want
            .iter()
            .filter(|(p, _)| p.as_str() != lading_ingest::files::VERSION_FILE)
            .collect();
        match got {
            Some(Ok(got))
                if !served.is_empty()
                    && got.len() == served.len()
                    && served.iter().all(|(p, sha)| got.get(p.as_str()) == Some(sha)) => {}
            None | Some(Err(_)) if purged(*queue, id.clone()).await => {}
            other => found.push(format!(
                "access {id} for {ark} v{version} completed with {other:?}, the inventory records {want:?}"
            )),
        }
    }
    found
}

/// The processes' working folders of jobs no longer in the tree, each a violation once a
/// working-folder sweep has run with the retention at 0 (with the default of 30 days, a
/// folder of a job purged by an admin stays that long: another tree may own it).
pub(super) async fn folders_of_removed_jobs(
    sim: &Sim,
    admin_engine: &Engine,
    nodes: usize,
) -> Vec<String> {
    let mut found = Vec::new();
    for p in 0..nodes {
        let root = sim.work.path().join(format!("p{p}"));
        let mut names: Vec<JobId> = std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| JobId::parse(e.file_name().to_str()?).ok())
            .collect();
        names.sort();
        for j in names {
            if let Err(lading_engine::EngineError::NoJob(_)) = admin_engine.job(&j).await {
                found.push(format!(
                    "working folders: p{p} keeps {j}, a job removed from the tree"
                ));
            }
        }
    }
    found
}

/// A zip's entries: name → SHA-256 of its bytes.
pub(super) fn zip_entries(p: &std::path::Path) -> Result<BTreeMap<String, String>, String> {
    use sha2::Digest;
    use std::io::Read;
    let mut z = zip::ZipArchive::new(std::fs::File::open(p).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let mut out = BTreeMap::new();
    for i in 0..z.len() {
        let mut e = z.by_index(i).map_err(|e| e.to_string())?;
        let name = e.name().map_err(|e| e.to_string())?.to_string();
        let mut b = Vec::new();
        e.read_to_end(&mut b).map_err(|e| e.to_string())?;
        let h = sha2::Sha256::digest(&b);
        out.insert(name, h.iter().map(|x| format!("{x:02x}")).collect());
    }
    Ok(out)
}

/// What is wrong with job `j`'s version on each of `nodes`: each must hold exactly `files`
/// (its payload's, path → SHA-256).
pub(super) async fn held_on(
    nodes: &[lading_ingest::nodes::Node],
    j: &JobId,
    ark: &str,
    version: u32,
    files: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut found = Vec::new();
    for n in nodes {
        let held = on_node(n, ark, version).await;
        if held.as_ref() != Ok(files) {
            found.push(format!(
                "storage: job {j}'s {ark} v{version} on {} holds {held:?}, its payload is {files:?}",
                n.name()
            ));
        }
    }
    found
}

/// A version's producer files on node `n`, as its record lists them, each read back whole
/// (its SHA-256 the record's): path → SHA-256, or what is wrong.
pub(super) async fn on_node(
    n: &lading_ingest::nodes::Node,
    ark: &str,
    version: u32,
) -> Result<BTreeMap<String, String>, String> {
    // As replication and the fixity checker read it: on a folder node, the version's own
    // record and the files in its folder.
    let record = lading_ingest::replicate::version_on(n, ark, version)
        .await
        .map_err(|e| e.what)?;
    let producer = format!("{}/", lading_ingest::stages::PRODUCER);
    let mut out = BTreeMap::new();
    for f in &record.files {
        let (at, rel) = f.stored_at(version);
        let read = n.digest(ark, at, rel, None).await.map_err(|e| e.what)?;
        match read {
            Some(c) if c.sha256 == f.sha256 && c.size == f.size => {}
            other => {
                return Err(format!(
                    "{} reads {other:?}, its record says {}",
                    f.path, f.sha256
                ));
            }
        }
        if let Some(p) = f.path.strip_prefix(&producer) {
            out.insert(p.to_string(), f.sha256.clone());
        }
    }
    Ok(out)
}

/// The versions with a record on a bucket, by object, ascending.
pub(super) async fn versions_on(b: &lading_ingest::bucket::Memory) -> BTreeMap<String, Vec<u32>> {
    use lading_ingest::bucket::Bucket;
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let record = format!("|{}", lading_ingest::nodes::VERSION_RECORD);
    for m in b.keys(None).await.unwrap_or_default() {
        let key = m.location.to_string();
        let Some(head) = key
            .strip_prefix("lading/")
            .and_then(|k| k.strip_suffix(&record))
        else {
            continue;
        };
        if let Some((ark, v)) = head.rsplit_once('|')
            && let Ok(v) = v.parse()
        {
            out.entry(ark.to_string()).or_default().push(v);
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// Multipart uploads still open: how many, how many of them under a stored version (one
/// with its record), and, unless `counting`, a violation for each (parts stored and paid for
/// that no object holds). Once every batch has ended and the scheduled audit has had time
/// to abort the abandoned ones, none may be open.
pub(super) async fn uploads_left_open(
    buckets: &Buckets,
    counting: bool,
) -> (usize, usize, Vec<String>) {
    use lading_ingest::bucket::Bucket;
    let (mut open_n, mut stored_n) = (0, 0);
    let mut found = Vec::new();
    for (n, b) in buckets.nodes.iter().enumerate() {
        let mut marker = None;
        loop {
            match b.list_uploads("lading/", marker.take()).await {
                Ok((open, next)) => {
                    for u in open {
                        // `lading/ARK|V|PATH`: the version's record is `lading/ARK|V|` + it.
                        let version = u.key.rsplit_once('|').map_or("", |(v, _)| v);
                        let record = format!("{version}|{}", lading_ingest::nodes::VERSION_RECORD);
                        let stored = match object_store::path::Path::parse(&record) {
                            Ok(k) => b.head(&k).await.is_ok(),
                            Err(_) => false,
                        };
                        open_n += 1;
                        stored_n += usize::from(stored);
                        if !counting {
                            found.push(format!(
                                "storage: multipart upload {} of {} (begun at {:?}) left open on \
                                 node {}{}",
                                u.id,
                                u.key,
                                u.initiated_ms,
                                n + 1,
                                if stored {
                                    " under a stored version"
                                } else {
                                    ""
                                }
                            ));
                        }
                    }
                    match next {
                        Some(m) => marker = Some(m),
                        None => break,
                    }
                }
                Err(e) => {
                    found.push(format!(
                        "storage: node {}'s open uploads cannot be listed: {}",
                        n + 1,
                        e.what
                    ));
                    break;
                }
            }
        }
    }
    (open_n, stored_n, found)
}

/// Each payload batch's jobs, one per object its manifest lists, once intake made any (but
/// in the batches of `deleted_from`: an admin's delete of an ended job removes it, and
/// cleanup purges a batch's jobs one by one before the batch); after an
/// intake that gave up partway, a job for some of them, none twice.
/// A job that failed after using up its attempts on a storage node that was down (refused,
/// unavailable): an outage must cost time, never attempts (SPEC §11).
pub(super) async fn no_attempt_spent_on_an_outage(
    admin_engine: &Engine,
    bids: &[BatchId],
) -> Vec<String> {
    let mut found = Vec::new();
    for b in bids {
        let Some(info) = admin(|| admin_engine.batch(b)).await else {
            continue;
        };
        for j in info.jobs.get("batch-failed").into_iter().flatten() {
            let Some(job) = admin(|| admin_engine.job(j)).await else {
                continue;
            };
            let msg = job.status.message.unwrap_or_default();
            // A node's outage refuses every request at the door ("is down"), which a stage
            // must classify as unavailable; the nodes' random faults (a 503, a lost answer)
            // are a request's bad luck and stay ordinary retries.
            let outage =
                msg.contains("the simulated node is down") || msg.contains("unavailable: ");
            if msg.contains("gave up after") && outage {
                found.push(format!("job {j}: an outage used up its attempts: {msg}"));
            }
        }
    }
    found
}

pub(super) async fn one_job_per_object(
    payloads: &Payloads,
    admin_engine: &Engine,
    bids: &[BatchId],
    deleted_from: &std::collections::BTreeSet<String>,
) -> Vec<String> {
    let mut found = Vec::new();
    for b in bids.iter().filter(|b| !deleted_from.contains(b.as_str())) {
        let Some(info) = admin(|| admin_engine.batch(b)).await else {
            continue;
        };
        if let Some(listed) = (info.submission.typed().ok())
            .and_then(|s| s.payload_url.as_deref())
            .and_then(|u| payloads.listed.get(u))
        {
            let mut made = Vec::new();
            for j in info.jobs.values().flatten() {
                let Some(job) = admin(|| admin_engine.job(j)).await else {
                    continue;
                };
                if let Some(url) = payload_url(&job) {
                    made.push(url.to_string());
                }
            }
            made.sort();
            let mut want = listed.clone();
            want.sort();
            // An intake that gave up after making some jobs lets the batch go on with them,
            // and says so in the batch's history: then fewer, never others or twice.
            let stopped = serde_json::to_string(&info.status)
                .is_ok_and(|t| t.contains("intake stopped after making"));
            let twice = made.windows(2).any(|w| w[0] == w[1]);
            let fewer = made.iter().all(|u| want.binary_search(u).is_ok());
            if !made.is_empty() && (twice || !(made == want || stopped && fewer)) {
                found.push(format!(
                    "intake: batch {b} made jobs for {made:?}, its manifest lists {want:?}"
                ));
            }
        }
    }
    found
}

/// The objects of payload batches, as stored and recorded. Each job that completed stored one
/// version, recorded in the inventory, holding exactly its object's files (those of its own
/// payload, every byte) under the primary identifier its manifest gave. Over the whole
/// storage root, each object's versions run from 1 with no gap, each written by one job, and
/// no job wrote two.
pub(super) async fn stored_as_given(
    work: &std::path::Path,
    payloads: &Payloads,
    admin_engine: &Engine,
    bids: &[BatchId],
    buckets: &Buckets,
    unpacked: &mut [usize; 3],
) -> (Vec<String>, usize) {
    use lading_ingest::inventory::Inventory;
    let inventory = Inventory::new(lading_ingest::inventory::Location::Sqlite(
        work.join("inventory.db"),
    ));
    let jobs = Stored {
        work,
        payloads,
        admin_engine,
        buckets,
        inventory: &inventory,
    };
    let (mut found, checked) = jobs.each_completed_job(bids, unpacked).await;
    // The whole root: versions 1..n, one job each, no job twice.
    let mut writers: BTreeMap<String, String> = BTreeMap::new();
    found.extend(jobs.versions_on_nodes(&mut writers).await);
    found.extend(versions_in_folders(work, &mut writers));
    (found, checked)
}

/// What [`stored_as_given`] reads.
struct Stored<'a> {
    work: &'a std::path::Path,
    payloads: &'a Payloads,
    admin_engine: &'a Engine,
    buckets: &'a Buckets,
    inventory: &'a lading_ingest::inventory::Inventory,
}

impl Stored<'_> {
    /// Each job that completed stored one version, recorded, holding exactly its payload's
    /// files, on the nodes or in the folders its profile names. Returns what was found and
    /// how many jobs were checked.
    async fn each_completed_job(
        &self,
        bids: &[BatchId],
        unpacked: &mut [usize; 3],
    ) -> (Vec<String>, usize) {
        let Stored {
            work,
            payloads,
            admin_engine,
            buckets,
            inventory,
        } = *self;
        let nodes = buckets.open();
        let folders = folder_nodes(work);
        let mut found = Vec::new();
        let mut checked = 0;
        let listed = |dir: &std::path::Path| -> BTreeMap<String, String> {
            lading_ingest::files::list_files(dir)
                .unwrap_or_default()
                .into_iter()
                .map(|f| (f.path, f.sha256))
                .collect()
        };
        for b in bids {
            let Some(info) = admin(|| admin_engine.batch(b)).await else {
                continue;
            };
            for j in info.jobs.get("batch-completed").into_iter().flatten() {
                let Some(job) = admin(|| admin_engine.job(j)).await else {
                    continue;
                };
                let Some(url) = payload_url(&job) else {
                    continue;
                };
                let Some(want) = payloads.expected.get(url) else {
                    found.push(format!(
                        "storage: job {j} fetched {url}, which no payload names"
                    ));
                    continue;
                };
                let versions = match inventory.job_versions(j.as_str()) {
                    Ok(v) => v,
                    Err(e) => {
                        found.push(format!("storage: the inventory cannot list job {j}: {e}"));
                        continue;
                    }
                };
                checked += 1;
                let [v] = &versions[..] else {
                    found.push(format!(
                        "storage: job {j} completed with {} versions recorded",
                        versions.len()
                    ));
                    continue;
                };
                if let Some(ark) = &want.ark
                    && *ark != v.ark
                {
                    found.push(format!(
                        "storage: job {j} stored {} though its manifest gave {ark}",
                        v.ark
                    ));
                }
                // The depositor's files (beside them: the version's manifest and record).
                let producer = format!("{}/", lading_ingest::stages::PRODUCER);
                let recorded: BTreeMap<String, String> = v
                    .files
                    .iter()
                    .filter_map(|(p, _, sha)| {
                        Some((p.strip_prefix(&producer)?.into(), sha.clone()))
                    })
                    .collect();
                if recorded != want.files {
                    found.push(format!(
                        "storage: job {j} recorded {recorded:?} for {} v{}, its payload is {:?}",
                        v.ark, v.version, want.files
                    ));
                } else if let Some(k) = [".zip", ".tar", ".tar.gz"]
                    .iter()
                    .position(|ext| url.ends_with(ext))
                {
                    unpacked[k] += 1;
                }
                let path = inventory.version_path(&v.ark, v.version).ok().flatten();
                if path.as_deref().is_some_and(|p| p.starts_with("s3://")) {
                    // On both nodes: the version's record and every file's bytes.
                    found.extend(held_on(&nodes, j, &v.ark, v.version, &want.files).await);
                    continue;
                }
                if path
                    .as_deref()
                    .is_some_and(|p| std::path::Path::new(p).starts_with(work.join("node3")))
                {
                    // On folder node 3, read through the node as for a bucket; and its replica
                    // on node 4.
                    found.extend(held_on(&folders, j, &v.ark, v.version, &want.files).await);
                }
                let on_disk = path.as_deref().map(|p| {
                    listed(&std::path::Path::new(p).join(lading_ingest::stages::PRODUCER))
                });
                if on_disk.as_ref() != Some(&want.files) {
                    found.push(format!(
                    "storage: job {j}'s {} v{} holds {on_disk:?} at {path:?}, its payload is {:?}",
                    v.ark, v.version, want.files
                ));
                }
            }
        }
        (found, checked)
    }

    /// The versions on the primary bucket node run from 1 with no gap, each written by one
    /// job (`writers`: job → version), and the replica holds what the inventory records of
    /// them and nothing the primary lacks.
    async fn versions_on_nodes(&self, writers: &mut BTreeMap<String, String>) -> Vec<String> {
        let (inventory, buckets) = (self.inventory, self.buckets);
        let nodes = buckets.open();
        let mut found = Vec::new();
        // The same on the primary node, whose every recorded version the replica holds too, and
        // the replica nothing the primary lacks. Between the two: a version whose job stopped
        // short of the inventory (it gave up on its last attempt at Storing, its record written
        // and the answer lost, or at Recording, its copy made) until an admin's requeue
        // finishes the job.
        let within = |a: &BTreeMap<String, Vec<u32>>, b: &BTreeMap<String, Vec<u32>>| {
            a.iter()
                .all(|(ark, vs)| vs.iter().all(|v| b.get(ark).is_some_and(|w| w.contains(v))))
        };
        let recorded = |on: &BTreeMap<String, Vec<u32>>| -> BTreeMap<String, Vec<u32>> {
            on.iter()
                .map(|(ark, vs)| {
                    let known: Vec<u32> = inventory
                        .versions(ark)
                        .unwrap_or_default()
                        .iter()
                        .map(|(v, _, _)| *v)
                        .collect();
                    (
                        ark.clone(),
                        vs.iter()
                            .copied()
                            .filter(|v| known.contains(v))
                            .collect::<Vec<_>>(),
                    )
                })
                .filter(|(_, vs)| !vs.is_empty())
                .collect()
        };
        let mut primary: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for (k, n) in nodes.iter().enumerate() {
            let held = versions_on(&buckets.nodes[k]).await;
            if k == 0 {
                primary = held.clone();
                for (ark, versions) in &held {
                    if *versions != (1..=versions.len() as u32).collect::<Vec<_>>() {
                        found.push(format!(
                            "storage: {ark} has versions {versions:?} on {}",
                            n.name()
                        ));
                    }
                    for v in versions {
                        let stored = lading_ingest::stages::read_node_version(n, ark, *v).await;
                        let Ok(Some(stored)) = stored else {
                            found.push(format!("storage: {ark} v{v} on {}: {stored:?}", n.name()));
                            continue;
                        };
                        let here = format!("{ark} v{v}");
                        if let Some(before) =
                            writers.insert(stored.stored.job.clone(), here.clone())
                        {
                            found.push(format!(
                                "storage: job {} stored both {before} and {here}",
                                stored.stored.job
                            ));
                        }
                    }
                }
            } else if !within(&recorded(&primary), &held) || !within(&held, &primary) {
                found.push(format!(
                "storage: {} holds versions {held:?}, the primary {primary:?}, of which the inventory records {:?}",
                n.name(),
                recorded(&primary)
            ));
            }
        }
        found
    }
}

/// The storage root, and folder node 3 (a primary) laid out as it is: each object's versions
/// run from 1 with no gap, each with its record, and no job wrote two (`writers`).
fn versions_in_folders(
    work: &std::path::Path,
    writers: &mut BTreeMap<String, String>,
) -> Vec<String> {
    let root = work.join("storage");
    let mut found = Vec::new();
    let objects: Vec<std::path::PathBuf> = [root, work.join("node3")]
        .iter()
        .flat_map(|root| {
            let mut objects: Vec<std::path::PathBuf> = std::fs::read_dir(root)
                .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
                .unwrap_or_default();
            objects.sort();
            objects
        })
        .collect();
    for o in objects {
        let versions = lading_ingest::files::versions(&o).unwrap_or_default();
        if versions != (1..=versions.len() as u32).collect::<Vec<_>>() {
            found.push(format!(
                "storage: {} has versions {versions:?}",
                o.display()
            ));
        }
        for v in versions {
            let at = o.join(format!("v{v}"));
            let stored = std::fs::read(at.join(lading_ingest::files::VERSION_FILE))
                .ok()
                .and_then(|b| {
                    lading_core::json::from_bytes::<lading_ingest::files::StoredVersion>(&b).ok()
                });
            let Some(stored) = stored else {
                found.push(format!("storage: {} has no version record", at.display()));
                continue;
            };
            let here = format!("{} v{v}", stored.ark);
            if let Some(before) = writers.insert(stored.job.clone(), here.clone()) {
                found.push(format!(
                    "storage: job {} stored both {before} and {here}",
                    stored.job
                ));
            }
        }
    }
    found
}

/// The payload URL a job's configuration names.
fn payload_url(job: &lading_engine::JobInfo) -> Option<&str> {
    job.configuration.typed().ok()?.payload_url.as_deref()
}
