//! One run of the simulator: the world built from a seed, the faults and crashes played
//! against it, and the checks run once it is quiet.

use super::*;

/// Retries a call through the errors `retryable` names, as an operator would (ten tries,
/// 100 ms apart); `None` when it did not go through.
pub(super) async fn retrying<T, E, F, Fut>(f: F, retryable: impl Fn(&E) -> bool) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    for _ in 0..10 {
        match f().await {
            Ok(v) => return Some(v),
            Err(e) if retryable(&e) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(_) => return None,
        }
    }
    None
}

/// An admin call, retried through connection losses and expiries.
pub(super) async fn admin<T, F, Fut>(f: F) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = lading_engine::Result<T>>,
{
    retrying(f, |e: &lading_engine::EngineError| {
        e.is_retryable()
            || matches!(
                e,
                lading_engine::EngineError::Tree(lading_core::TreeError::SessionExpired)
            )
    })
    .await
}

/// A generic-jobs admin call, retried through any error (a lost reply, an expiry, a race).
pub(super) async fn admin_generic<T, F, Fut>(f: F) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = lading_jobs::Result<T>>,
{
    retrying(f, |_: &lading_jobs::JobsError| true).await
}

/// A job of one of `bids`, picked by `rng` (for a hold or a delete).
pub(super) async fn any_job(
    rng: &Seeded,
    admin_engine: &Engine,
    bids: &[BatchId],
) -> Option<(BatchId, JobId)> {
    let b = pick(rng, bids)?;
    let info = admin(|| admin_engine.batch(&b)).await?;
    let j = pick(
        rng,
        &info.jobs.values().flatten().cloned().collect::<Vec<_>>(),
    )?;
    Some((b, j))
}

/// What `look` still finds open once it finds nothing or `within` has passed, looked at every
/// `every` of simulated time: the harness observes from outside, so it looks (the processes
/// under test are woken by the tree). Empty when everything ended in time.
pub(super) async fn still_open<F, Fut>(within: Duration, every: Duration, look: F) -> Vec<String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Vec<String>>,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut open = Vec::new();
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(every).await;
        open = look().await;
        if open.is_empty() {
            break;
        }
    }
    open
}

/// What is still open of `bids` (with the outbox's undelivered entries, when `outbox`) once
/// they have all ended or `within` has passed (see [`still_open`]).
pub(super) async fn not_ended(
    admin_engine: &Engine,
    bids: &[BatchId],
    within: Duration,
    every: Duration,
    outbox: bool,
) -> Vec<String> {
    still_open(within, every, || async {
        let mut open = Vec::new();
        for b in bids {
            match admin_engine.batch(b).await {
                Ok(i) if matches!(i.status.status, BatchState::Completed | BatchState::Failed) => {}
                // Purged by cleanup: only an ended batch is (checked at its commit).
                Err(lading_engine::EngineError::NoBatch(_)) => {}
                Ok(i) => open.push(format!("{b} {}", i.status.status)),
                Err(e) => open.push(format!("{b} unreadable: {e}")),
            }
        }
        if outbox {
            match admin_engine.outbox().await {
                Ok(o) if o.is_empty() => {}
                Ok(o) => open.push(format!(
                    "{} outbox entries undelivered, such as {:?}",
                    o.len(),
                    o.first()
                )),
                Err(e) => open.push(format!("the outbox cannot be read: {e}")),
            }
        }
        open
    })
    .await
}

/// The generic jobs not Finished or Failed once they all are or `within` has passed (see
/// [`still_open`]).
pub(super) async fn generic_not_ended(jobs: &lading_jobs::Jobs, within: Duration) -> Vec<String> {
    still_open(within, Duration::from_millis(500), || async {
        let Some(all) = admin_generic(|| jobs.list(GENERIC_TYPE, None, None, 10_000)).await else {
            return vec!["the jobs are unreadable".into()];
        };
        let mut open: Vec<String> = all
            .iter()
            .filter(|j| {
                !matches!(
                    j.record.state,
                    lading_jobs::State::Finished | lading_jobs::State::Failed
                )
            })
            .map(|j| format!("{} {}", j.id, j.record.state.name()))
            .collect();
        // The jobs added at the start are all there, or ended and removed by retention.
        for i in 0..GENERIC_JOBS {
            let id = format!("g{i}");
            if all.iter().any(|j| j.id == id) {
                continue;
            }
            let gone = retrying(
                || jobs.get_job_state(GENERIC_TYPE, &id),
                |e| !matches!(e, lading_jobs::JobsError::NoJob { .. }),
            )
            .await
            .is_none();
            if !gone {
                open.push(format!("{id} missing from the list"));
            }
        }
        open
    })
    .await
}

/// The processes' working folders: in memory where the machine has a tmpfs (`/dev/shm`), as
/// the workers make and remove a folder per job and a disk spends most of a run on that.
pub(super) fn work_folder() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::tempdir_in(shm)
    {
        return d;
    }
    tempfile::tempdir().expect("a temporary folder")
}

pub fn run(seed: u64, opts: &Options) -> Run {
    // Lading's blocking work (files, hashing, the inventory) in place, so that it lands where
    // the seed's run puts it.
    lading_ingest::blocking::in_place_on_this_thread();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(simulate(seed, opts))
}

pub(super) async fn simulate(seed: u64, opts: &Options) -> Run {
    let world = World::new(seed, opts.faults.then(Faults::default_on), opts.trace);
    let start = world.lock().start();
    let clock = Arc::new(SimClock { start });
    let rng = Seeded::new(seed);
    let mut payloads = Payloads::default();
    let mut sim = Sim {
        world: world.clone(),
        clock: clock.clone(),
        dice: Arc::new(Dice(Seeded::new(seed ^ 0x6469_6365))),
        outside: Arc::default(),
        work: work_folder(),
        served: payloads.served.clone(),
        answers: Arc::default(),
        buckets: Buckets::new(seed, opts.faults, &world, clock.clone()),
        retention_hours: if Seeded::new(seed ^ 0x7265_7465).below(4) == 0 {
            0
        } else {
            lading_ingest::Config::default().retention_hours
        },
        seed,
        starts: 0,
    };
    {
        let mut w = world.lock();
        w.retention_ms = sim.retention_hours.saturating_mul(3_600_000);
        w.trace(format!("ended batches are kept {} h", sim.retention_hours));
    }
    let admin_engine = Arc::new(
        Engine::new(world.connect("admin"), clock.clone(), "admin")
            .with_random(Seeded::new(seed ^ 0xad)),
    );
    // The admin's session is the operator's: faults do not end it (it retries).
    admin(|| admin_engine.init()).await;
    // Generic jobs: a type whose running jobs time out after 5 s, with a rate limit and a
    // retention of ended jobs; a schedule; and its jobs.
    let admin_jobs = lading_jobs::Jobs::new(admin_engine.tree().clone(), clock.clone(), "admin")
        .with_random(Seeded::new(seed ^ 0x6a));
    let settings = lading_jobs::TypeUpdate {
        timeout_s: Some(5),
        rate_per_s: Some(GENERIC_RATE),
        keep_finished_s: Some(GENERIC_KEEP_S),
        keep_failed_s: Some(GENERIC_KEEP_S),
        ..Default::default()
    };
    admin_generic(|| admin_jobs.update_type(GENERIC_TYPE, &settings)).await;
    admin_generic(|| {
        admin_jobs.set_schedule(
            GENERIC_TYPE,
            SCHEDULE,
            lading_jobs::Every::Seconds(SCHEDULE_EVERY_S),
            json!({ "tick": true }),
            0,
        )
    })
    .await;
    for i in 0..GENERIC_JOBS {
        let id = format!("g{i}");
        admin_generic(|| admin_jobs.add(GENERIC_TYPE, &id, json!({ "i": i }), None)).await;
    }
    // An event stream's client, on a host of its own (its session is not spared faults).
    let watched = Arc::new(Mutex::new(Watched::default()));
    let (events_stop, events_shutdown) = Shutdown::new();
    let events = {
        let tree = world.connect("events");
        let engine = Arc::new(
            Engine::new(tree.clone(), clock.clone(), "events")
                .with_random(Seeded::new(seed ^ 0x6576)),
        );
        // The host serves Lading's HTTP API (the event stream among it) on connections in
        // memory; the client reads the stream off the wire.
        let server = EventsServer {
            ingest: Arc::new(sim.ingest(engine.clone(), "events")),
            jobs: Arc::new(lading_jobs::Jobs::new(tree, clock.clone(), "events")),
        };
        tokio::spawn(watch_events(
            world.clone(),
            engine,
            server,
            Seeded::new(seed ^ 0x636c),
            watched.clone(),
            events_shutdown,
        ))
    };
    // The operator's own tools (the fixity checker) on the admin's session.
    let admin_ingest = Arc::new(sim.ingest(admin_engine.clone(), "admin"));
    let mut procs: Vec<Option<Proc>> = Vec::new();
    for i in 0..opts.nodes {
        procs.push(Some(sim.start(i).await));
    }
    let mut down_until: Vec<Option<tokio::time::Instant>> = vec![None; opts.nodes];
    let mut bids: Vec<BatchId> = Vec::new();
    let mut reopened: BTreeMap<String, u32> = BTreeMap::new();
    // Batches a job was deleted from (or may have been: the answer can be lost).
    let mut deleted_from: std::collections::BTreeSet<String> = Default::default();
    let mut held: Vec<(JobId, tokio::time::Instant)> = Vec::new();
    // Access requests asked for: (id, ark, version), and whether the faults were on.
    let mut asked: Vec<Asked> = Vec::new();
    let mut queue_paused_until: Option<tokio::time::Instant> = None;
    let payload_root = sim.work.path().join("payloads");
    // Fixes the depositor makes only later (a missing file, a corrected manifest), and when.
    let mut late: Vec<(tokio::time::Instant, Place, Vec<u8>)> = Vec::new();
    for i in 0..opts.batches {
        let mut sub = Map::new();
        sub.insert("batchID".into(), json!(format!("sim-{seed}-{i}")));
        sub.insert("submitter".into(), json!(format!("user{}", rng.below(3))));
        sub.insert("profile".into(), json!(PROFILE));
        if rng.below(3) == 0 {
            // A payload on disk, through Lading's own intake and file stages.
            let p = payloads.make(&payload_root, seed, i, &rng);
            match crate::payload::Storage::of(i) {
                // On the bucket nodes, and copied from one to the other.
                crate::payload::Storage::Buckets => {
                    sub.insert("profile".into(), json!(NODES_PROFILE));
                }
                // On the folder nodes, the same way.
                crate::payload::Storage::Folders => {
                    sub.insert("profile".into(), json!(FOLDERS_PROFILE));
                }
                crate::payload::Storage::Root => {}
            }
            sub.insert("payload_url".into(), json!(p.url));
            sub.insert("type".into(), json!(p.payload_type));
            if let Some((path, bytes)) = p.late {
                let at =
                    tokio::time::Instant::now() + Duration::from_millis(rng.below(8000) as u64);
                late.push((at, path, bytes));
            }
        } else {
            sub.insert("sim_jobs".into(), json!(1 + rng.below(9)));
        }
        let uuid = format!("sim-{seed}-{i}");
        let made = admin(|| admin_engine.create_batch(submission(&sub))).await;
        let bid = match made {
            Some(b) => Some(b),
            // Made, and the answer lost: found by its uuid.
            None => admin(|| admin_engine.batch_by_uuid(&uuid)).await.flatten(),
        };
        if let Some(b) = bid {
            let ty = sub
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("simulated");
            world.lock().trace(format!("submitted {b} ({uuid}, {ty})"));
            bids.push(b);
        }
        // Between two submissions: what the world does to the deployment.
        for _ in 0..1 + rng.below(3) {
            tokio::time::sleep(Duration::from_millis(rng.below(1500) as u64)).await;
            let now = tokio::time::Instant::now();
            for (k, p) in procs.iter_mut().enumerate() {
                if p.is_none() && down_until[k].is_some_and(|t| t <= now) {
                    *p = Some(sim.start(k).await);
                    down_until[k] = None;
                    world.lock().trace(format!("p{k} restarted"));
                }
            }
            held.retain(|(j, until)| {
                if *until <= now {
                    let (e, j) = (admin_engine.clone(), j.clone());
                    tokio::spawn(async move {
                        admin(|| e.release_job(&j)).await;
                    });
                    false
                } else {
                    true
                }
            });
            late.retain(|(at, place, bytes)| {
                if *at > now {
                    return true;
                }
                payloads.put(place, bytes);
                let shown = match place {
                    Place::Disk(p) => p
                        .strip_prefix(&payload_root)
                        .unwrap_or(p)
                        .display()
                        .to_string(),
                    Place::Served(u) => u.clone(),
                };
                world
                    .lock()
                    .trace(format!("the depositor put {shown} right"));
                false
            });
            if queue_paused_until.is_some_and(|t| t <= now) {
                queue_paused_until = None;
                admin(|| admin_engine.resume_queue("ingest")).await;
            }
            if !opts.faults {
                continue;
            }
            let k = rng.below(opts.nodes);
            match rng.below(11) {
                0 => {
                    if let Some(p) = procs[k].take() {
                        p.tree.kill();
                        p.task.abort();
                        let s = p.tree.session_id();
                        let w = world.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(SESSION_TIMEOUT_MS)).await;
                            w.lock().expire(s);
                        });
                        down_until[k] =
                            Some(now + Duration::from_millis(500 + rng.below(5000) as u64));
                        world.lock().trace(format!("p{k} crashed"));
                    }
                }
                1 => {
                    if let Some(p) = &procs[k] {
                        let s = p.tree.session_id();
                        world.lock().expire(s);
                    }
                }
                2 => {
                    if let Some(p) = &procs[k] {
                        let d = 500 + rng.below(6000) as u64;
                        p.tree.pause_until(now + Duration::from_millis(d));
                        world.lock().trace(format!("p{k} paused {d} ms"));
                        if d > SESSION_TIMEOUT_MS {
                            let (w, s) = (world.clone(), p.tree.session_id());
                            tokio::spawn(async move {
                                tokio::time::sleep(Duration::from_millis(SESSION_TIMEOUT_MS)).await;
                                w.lock().expire(s);
                            });
                        }
                    }
                }
                3 | 4 => {
                    // Requeue the failed jobs of a batch: all at once, or one.
                    if let Some(b) = pick(&rng, &bids) {
                        if rng.below(2) == 0 {
                            // Each job is requeued in its own commit, and each may reopen
                            // the batch: a report may come between two of them (Lading's
                            // Reporting waits `report_settle_s` for them; this one does not).
                            if let Some(r) =
                                admin(|| admin_engine.requeue_failed(&b, None, None)).await
                            {
                                *reopened.entry(b.to_string()).or_default() +=
                                    r.iter().filter(|(_, r)| r.is_ok()).count() as u32;
                            }
                        } else if let Some(info) = admin(|| admin_engine.batch(&b)).await
                            && let Some(j) =
                                info.jobs.get("batch-failed").and_then(|f| pick(&rng, f))
                            && admin(|| admin_engine.requeue_job(&j, None)).await.is_some()
                        {
                            *reopened.entry(b.to_string()).or_default() += 1;
                        }
                    }
                }
                5 => {
                    if let Some((_, j)) = any_job(&rng, &admin_engine, &bids).await
                        && admin(|| admin_engine.hold_job(&j)).await.is_some()
                    {
                        held.push((j, now + Duration::from_millis(rng.below(4000) as u64)));
                    }
                }
                6 => {
                    if let Some((b, j)) = any_job(&rng, &admin_engine, &bids).await {
                        deleted_from.insert(b.to_string());
                        if admin(|| admin_engine.delete_job(&j))
                            .await
                            .flatten()
                            .is_some()
                        {
                            *reopened.entry(b.to_string()).or_default() += 1;
                        }
                    }
                }
                8 => {
                    // The fixity checker reads every recorded copy back, under the faults:
                    // it may fail, but never call a good copy bad or missing.
                    if let Ok(a) =
                        lading_ingest::fixity::check(&admin_ingest, None, None, None).await
                    {
                        for f in a.findings {
                            world
                                .lock()
                                .violation(format!("fixity: a good copy reported: {f}"));
                        }
                    }
                }
                10 => {
                    // A storage node goes down for a while (up to 20 s), and comes back by
                    // itself: work on it waits, using no attempt, and resumes.
                    let n = rng.below(2);
                    let until = clock.now_ms() + 1_000 + rng.below(19_000) as u64;
                    sim.buckets.outage[n].store(until, std::sync::atomic::Ordering::Relaxed);
                    world
                        .lock()
                        .trace(format!("node {} down until {until}", n + 1));
                }
                9 => {
                    if let Some(r) = ask_access(&rng, &admin_engine, &admin_ingest, &bids).await {
                        world
                            .lock()
                            .trace(format!("access {} asked for {} v{}", r.1, r.2, r.3));
                        asked.push(r);
                    }
                }
                7 if queue_paused_until.is_none() => {
                    admin(|| admin_engine.pause_queue("ingest")).await;
                    queue_paused_until = Some(now + Duration::from_millis(rng.below(3000) as u64));
                }
                _ => {}
            }
        }
    }
    // The faults stop (the tree's, the buckets' and the payload server's); everything held
    // is let go and every process is up.
    for (_, place, bytes) in std::mem::take(&mut late) {
        payloads.put(&place, &bytes);
    }
    world.lock().faults = None;
    sim.buckets
        .faults
        .store(false, std::sync::atomic::Ordering::Relaxed);
    for n in sim.buckets.outage.iter() {
        n.store(0, std::sync::atomic::Ordering::Relaxed);
    }
    world.lock().trace("faults stop".into());
    for (j, _) in std::mem::take(&mut held) {
        admin(|| admin_engine.release_job(&j)).await;
    }
    admin(|| admin_engine.resume_queue("ingest")).await;
    for (k, p) in procs.iter_mut().enumerate() {
        if p.is_none() {
            *p = Some(sim.start(k).await);
        }
    }
    let open = not_ended(
        &admin_engine,
        &bids,
        Duration::from_millis(LIVENESS_MS),
        Duration::from_millis(500),
        true,
    )
    .await;
    if !open.is_empty() {
        world.lock().violation(format!(
            "liveness: {} s after the faults stopped, not ended: {}",
            LIVENESS_MS / 1000,
            open.join(", ")
        ));
    }
    // The schedule ticks on once the faults stop (within two of its intervals and the
    // monitors' longest wait), and is removed; then every generic job ends (finished, or
    // failed after its attempts), and none was finished by two acceptances.
    let faults_stopped = clock.now_ms();
    let ticked = still_open(
        Duration::from_secs(2 * SCHEDULE_EVERY_S + 1),
        Duration::from_millis(500),
        || async {
            match admin_generic(|| admin_jobs.schedules(GENERIC_TYPE)).await {
                Some(list) if list.iter().any(|(_, s)| s.last_tick_ms > faults_stopped) => vec![],
                Some(list) => vec![format!("{list:?}")],
                None => vec!["unreadable".into()],
            }
        },
    )
    .await;
    if !ticked.is_empty() {
        world.lock().violation(format!(
            "liveness: schedule {SCHEDULE} did not tick within {} s after the faults stopped: {}",
            2 * SCHEDULE_EVERY_S + 1,
            ticked.join(", ")
        ));
    }
    admin_generic(|| admin_jobs.remove_schedule(GENERIC_TYPE, SCHEDULE)).await;
    let generic_open = generic_not_ended(&admin_jobs, Duration::from_millis(LIVENESS_MS)).await;
    if !generic_open.is_empty() {
        world.lock().violation(format!(
            "liveness: generic jobs not ended {} s after the faults stopped: {}",
            LIVENESS_MS / 1000,
            generic_open.join(", ")
        ));
    }
    let twice: Vec<String> = sim
        .outside
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .generic_done
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, n)| format!("{id} ({n} times)"))
        .collect();
    if !twice.is_empty() {
        world.lock().violation(format!(
            "generic jobs finished successfully by more than one acceptance: {}",
            twice.join(", ")
        ));
    }
    // Wake-ups: the deployment, idle now, takes a new one-job batch through at once.
    if open.is_empty() {
        let mut sub = Map::new();
        sub.insert("batchID".into(), json!(format!("sim-{seed}-probe")));
        sub.insert("submitter".into(), json!("probe"));
        sub.insert("profile".into(), json!(PROFILE));
        sub.insert("sim_jobs".into(), json!(1));
        sub.insert("sim_probe".into(), json!(true));
        if let Some(bid) = admin(|| admin_engine.create_batch(submission(&sub))).await {
            world
                .lock()
                .trace(format!("submitted the wake-up probe {bid}"));
            let late = not_ended(
                &admin_engine,
                std::slice::from_ref(&bid),
                Duration::from_millis(PROBE_MS),
                Duration::from_millis(50),
                false,
            )
            .await;
            if !late.is_empty() {
                world.lock().violation(format!(
                    "wake-ups: an idle deployment did not take the one-job batch through within {} s: {}",
                    PROBE_MS / 1000,
                    late.join(", ")
                ));
            }
        }
    }
    // The event stream: every transition the tree's statuses show since the stream began was
    // sent to its client, however often it went away and came back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    events_stop.stop();
    let _ = events.await;
    if open.is_empty() {
        // The client has ended: what it received is all there is.
        let w = std::mem::take(&mut *watched.lock().unwrap_or_else(|p| p.into_inner()));
        let mut missed = Vec::new();
        if w.following {
            for b in &bids {
                let Some(info) = admin(|| admin_engine.batch(b)).await else {
                    continue;
                };
                let mut statuses = vec![(b.to_string(), info.status.extra.clone())];
                for j in info.jobs.values().flatten() {
                    if let Some(job) = admin(|| admin_engine.job(j)).await {
                        statuses.push((j.to_string(), job.status.extra.clone()));
                    }
                }
                for (id, extra) in statuses {
                    for e in lading_engine::history(&extra) {
                        let f = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default();
                        let at = lading_core::time::parse_ts(f("at")).unwrap_or(0);
                        let key = (id.clone(), f("to").to_string(), f("at").to_string());
                        if at >= w.from_ms && !w.seen.contains(&key) {
                            missed.push(format!("{id} to {} at {}", f("to"), f("at")));
                        }
                    }
                }
            }
        }
        // A client back at an id the hub still kept is sent exactly what followed it.
        for (back_at, first) in &w.kept_next {
            let Some(first) = first else { continue };
            let followed = w
                .reference
                .iter()
                .position(|id| id == back_at)
                .and_then(|i| w.reference.get(i + 1));
            if followed.is_some_and(|f| f != first) {
                missed.push(format!(
                    "back at {back_at}, sent {first} first, where {followed:?} followed it"
                ));
            }
        }
        if !missed.is_empty() {
            world.lock().violation(format!(
                "events: {} transitions never sent to the client, or sent out of order \
                 ({} comebacks, {} of them sent from the hub's ring; {} resets), such as {:?}",
                missed.len(),
                w.resumes,
                w.kept_resumes,
                w.resets,
                &missed[..missed.len().min(5)]
            ));
        }
    }
    // No space stays reserved once every batch has ended: a reservation lasts until its
    // job's download ends, whichever way the job left (a delete and a purge included).
    if open.is_empty()
        && let Some(left) = admin(|| admin_engine.reservations()).await
        && !left.is_empty()
    {
        let jobs: Vec<&String> = left.iter().map(|(j, _)| j).collect();
        world.lock().violation(format!(
            "space: reservations left after every batch ended, of {jobs:?}"
        ));
    }
    // The reports: one content per key, each batch's last report listing every job it kept,
    // and no more reports than its first plus one per reopening. The callbacks: one content
    // per key, and one for every job that completed.
    let mut jobs = 0;
    let mut stored = 0;
    let mut unpacked = [0; 3];
    {
        let (mails, callbacks, wrong) = {
            let o = sim.outside.lock().unwrap_or_else(|p| p.into_inner());
            (o.mails.clone(), o.callbacks.clone(), o.wrong.clone())
        };
        let mut found = wrong;
        for (key, (content, _)) in mails.iter().chain(&callbacks) {
            if content.get("conflict").is_some() {
                found.push(format!("{key} delivered with two contents: {content}"));
            }
        }

        for b in &bids {
            let Ok(info) = admin_engine.batch(b).await else {
                continue;
            };
            let mut kept: Vec<String> = ["batch-completed", "batch-failed"]
                .iter()
                .flat_map(|f| info.jobs.get(*f).cloned().unwrap_or_default())
                .map(|j| j.to_string())
                .collect();
            kept.sort();
            jobs += info.jobs.values().map(Vec::len).sum::<usize>();
            if open.is_empty() {
                for j in info.jobs.get("batch-completed").into_iter().flatten() {
                    let called = format!(":{j}:completed:");
                    if !callbacks.keys().any(|k| k.contains(&called)) {
                        found.push(format!(
                            "job {j} of {b} completed with no callback delivered"
                        ));
                    }
                }
            }
            // The report mail's Message-ID names the batch by its Merritt batch id.
            let named = info
                .submission
                .get("batchID")
                .and_then(Value::as_str)
                .unwrap_or(b.as_str());
            let prefix = format!("<lading.{named}.report-");
            let mine: Vec<(u64, &Value)> = mails
                .iter()
                .filter_map(|(k, (c, _))| {
                    let n = k.strip_prefix(&prefix)?.split('@').next()?;
                    Some((n.parse().ok()?, c))
                })
                .collect();
            let allowed = 1 + reopened.get(b.as_str()).copied().unwrap_or(0) as usize;
            if mine.len() > allowed {
                found.push(format!(
                    "batch {b} reported {} times, reopened {} times",
                    mine.len(),
                    allowed - 1
                ));
            }
            if let Some((n, last)) = mine.iter().max_by_key(|(n, _)| *n) {
                let mut listed = listed_in_mail(last);
                listed.sort();
                // Every job the batch kept is in its last report; a job the report lists
                // and the batch no longer keeps was deleted since (which reopens nothing).
                let processing = info
                    .jobs
                    .get("batch-processing")
                    .map(|f| f.iter().map(JobId::to_string).collect::<Vec<_>>())
                    .unwrap_or_default();
                let missing: Vec<&String> = kept.iter().filter(|j| !listed.contains(j)).collect();
                let extra: Vec<&String> =
                    listed.iter().filter(|j| processing.contains(j)).collect();
                if (!missing.is_empty() || !extra.is_empty()) && open.is_empty() {
                    found.push(format!(
                        "batch {b}: report {n} lacks {missing:?} and lists {extra:?} still in processing"
                    ));
                }
            } else if open.is_empty() {
                found.push(format!(
                    "batch {b} ended ({}: {}) with no report delivered",
                    info.status.status,
                    info.status.message.as_deref().unwrap_or_default()
                ));
            }
        }
        if open.is_empty() {
            // A batch cleanup has begun to purge may be seen with some of its jobs only.
            let mut skip = deleted_from.clone();
            skip.extend(world.lock().purged_from.iter().cloned());
            found.extend(one_job_per_object(&payloads, &admin_engine, &bids, &skip).await);
            found.extend(no_attempt_spent_on_an_outage(&admin_engine, &bids).await);
            let (bad, checked) = stored_as_given(
                sim.work.path(),
                &payloads,
                &admin_engine,
                &bids,
                &sim.buckets,
                &mut unpacked,
            )
            .await;
            found.extend(bad);
            stored = checked;
            found.extend(fixity_finds_rot(&admin_ingest, &sim.buckets, &rng, &world).await);
            found.extend(
                access_served(&sim, &rng, &admin_engine, &admin_ingest, &bids, asked).await,
            );
            // An upload a replaced attempt began after the winner's last sweep, and could
            // not abort, stays open until the scheduled audit finds it abandoned: given that
            // long and a few of the audit's shares, none may be left.
            let before = uploads_left_open(&sim.buckets, true).await;
            world.lock().trace(format!(
                "storage: {} uploads open at the end, {} of them under a stored version",
                before.0, before.1
            ));
            tokio::time::sleep(Duration::from_secs(
                ABORT_UPLOADS_AFTER_S + 3 * AUDIT_EVERY_S,
            ))
            .await;
            found.extend(uploads_left_open(&sim.buckets, false).await.2);
            // Working folders: a process keeps none of a job cleanup removed (the process
            // that cleaned up removed its own; each other's sweep, its).
            if sim.retention_hours == 0 {
                found.extend(folders_of_removed_jobs(&sim, &admin_engine, opts.nodes).await);
            }
        }
        let mut st = world.lock();
        for f in found {
            st.violation(f);
        }
    }
    let a = *sim.answers.lock().unwrap_or_else(|p| p.into_inner());
    world.lock().trace(format!(
        "payload server: {} whole answers, {} unavailable, {} not found, {} reset, {} dripping",
        a.whole, a.unavailable, a.not_found, a.reset, a.dripping
    ));
    for p in procs.iter().flatten() {
        p.stop.abort();
    }
    for p in procs.into_iter().flatten() {
        let _ = tokio::time::timeout(Duration::from_secs(30), p.task).await;
    }
    let st = world.lock();
    Run {
        seed,
        sim_ms: start.elapsed().as_millis() as u64,
        steps: st.commits,
        jobs,
        stored,
        unpacked,
        violations: st.violations.clone(),
        tail: st.tail.iter().cloned().collect(),
        trace_hash: st.trace_hash,
        full: st.full.clone(),
    }
}

/// The jobs a report mail lists: its body's indented lines, each starting with a job's id
/// (under "Completed (n):" and "Failed (n):").
pub(super) fn listed_in_mail(mail: &Value) -> Vec<String> {
    let body = mail.get("body").and_then(Value::as_str).unwrap_or_default();
    body.lines()
        .filter_map(|l| l.strip_prefix("  "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

pub(super) fn pick<T: Clone>(rng: &Seeded, from: &[T]) -> Option<T> {
    (!from.is_empty()).then(|| from[rng.below(from.len())].clone())
}

/// A submission from the simulator's fields (all of them strings, numbers or booleans).
pub(super) fn submission(fields: &Map<String, Value>) -> lading_core::layout::BatchSubmission {
    fields
        .clone()
        .try_into()
        .expect("the simulator's fields make a submission")
}
