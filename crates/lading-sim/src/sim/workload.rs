//! The deployment one seed builds, and the workload played against it: batches submitted
//! and, between them, what the world does (crashes, expiries, pauses, holds, requeues,
//! deletes, a paused queue, storage outages, fixity checks, access requests, a depositor's
//! late fixes), until the faults stop.

use super::*;

/// One seed's deployment while it runs: the simulated world, its processes, the operator's
/// tools, and what the workload did to it (which the checks at the end read).
pub(super) struct Deployment {
    pub(super) seed: u64,
    pub(super) opts: Options,
    pub(super) world: Arc<World>,
    pub(super) clock: Arc<SimClock>,
    pub(super) start: tokio::time::Instant,
    pub(super) rng: Arc<Seeded>,
    pub(super) payloads: Payloads,
    pub(super) sim: Sim,
    pub(super) admin_engine: Arc<Engine>,
    pub(super) admin_jobs: lading_jobs::Jobs,
    /// The operator's own tools (the fixity checker) on the admin's session.
    pub(super) admin_ingest: Arc<lading_ingest::Ingest>,
    /// What the event stream's client was sent.
    pub(super) watched: Arc<Mutex<Watched>>,
    pub(super) events_stop: lading_worker::ShutdownHandle,
    pub(super) events: Option<tokio::task::JoinHandle<()>>,
    pub(super) procs: Vec<Option<Proc>>,
    down_until: Vec<Option<tokio::time::Instant>>,
    pub(super) bids: Vec<BatchId>,
    /// Jobs requeued or deleted per batch: each may reopen it (and so add a report).
    pub(super) reopened: BTreeMap<String, u32>,
    /// Batches a job was deleted from (or may have been: the answer can be lost).
    pub(super) deleted_from: std::collections::BTreeSet<String>,
    held: Vec<(JobId, tokio::time::Instant)>,
    /// Access requests asked for: (id, ark, version), and whether the faults were on.
    pub(super) asked: Vec<Asked>,
    queue_paused_until: Option<tokio::time::Instant>,
    payload_root: std::path::PathBuf,
    /// Fixes the depositor makes only later (a missing file, a corrected manifest), and when.
    late: Vec<(tokio::time::Instant, Place, Vec<u8>)>,
}

impl Deployment {
    /// The world of `seed`: the admin's session and generic jobs (a type whose running jobs
    /// time out after 5 s, with a rate limit and a retention of ended jobs; a schedule; and
    /// its jobs), the event stream's client, and the deployment's processes.
    pub(super) async fn new(seed: u64, opts: &Options) -> Deployment {
        let world = World::new(seed, opts.faults.then(Faults::default_on), opts.trace);
        let start = world.lock().start();
        let clock = Arc::new(SimClock { start });
        let payloads = Payloads::default();
        let sim = Sim {
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
            behind: Arc::new(std::sync::atomic::AtomicBool::new(true)),
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
        let admin_jobs =
            lading_jobs::Jobs::new(admin_engine.tree().clone(), clock.clone(), "admin")
                .with_random(Seeded::new(seed ^ 0x6a));
        generic_workload(&admin_jobs).await;
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
        let admin_ingest = Arc::new(sim.ingest(admin_engine.clone(), "admin"));
        let payload_root = sim.work.path().join("payloads");
        let mut d = Deployment {
            seed,
            opts: opts.clone(),
            world,
            clock,
            start,
            rng: Seeded::new(seed),
            payloads,
            sim,
            admin_engine,
            admin_jobs,
            admin_ingest,
            watched,
            events_stop,
            events: Some(events),
            procs: Vec::new(),
            down_until: vec![None; opts.nodes],
            bids: Vec::new(),
            reopened: BTreeMap::new(),
            deleted_from: Default::default(),
            held: Vec::new(),
            asked: Vec::new(),
            queue_paused_until: None,
            payload_root,
            late: Vec::new(),
        };
        for i in 0..opts.nodes {
            let p = d.sim.start(i).await;
            d.procs.push(Some(p));
        }
        d
    }

    /// The workload: each batch submitted, and between two submissions what the world does
    /// to the deployment.
    pub(super) async fn play(&mut self) {
        for i in 0..self.opts.batches {
            self.submit(i).await;
            for _ in 0..1 + self.rng.below(3) {
                tokio::time::sleep(Duration::from_millis(self.rng.below(1500) as u64)).await;
                let now = tokio::time::Instant::now();
                self.due(now).await;
                if self.opts.faults {
                    self.act(now).await;
                }
            }
        }
    }

    /// Submits batch `i`: a third carry a payload (on disk or served, through Lading's own
    /// intake and file stages), the others simulated jobs.
    async fn submit(&mut self, i: usize) {
        let (seed, rng) = (self.seed, self.rng.clone());
        let mut sub = Map::new();
        sub.insert("batchID".into(), json!(format!("sim-{seed}-{i}")));
        sub.insert("submitter".into(), json!(format!("user{}", rng.below(3))));
        sub.insert("profile".into(), json!(PROFILE));
        if rng.below(3) == 0 {
            let p = self.payloads.make(&self.payload_root, seed, i, &rng);
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
                self.late.push((at, path, bytes));
            }
        } else {
            sub.insert("sim_jobs".into(), json!(1 + rng.below(9)));
        }
        let uuid = format!("sim-{seed}-{i}");
        let e = &self.admin_engine;
        let made = admin(|| e.create_batch(submission(&sub))).await;
        let bid = match made {
            Some(b) => Some(b),
            // Made, and the answer lost: found by its uuid.
            None => admin(|| e.batch_by_uuid(&uuid)).await.flatten(),
        };
        if let Some(b) = bid {
            let ty = sub
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("simulated");
            self.world
                .lock()
                .trace(format!("submitted {b} ({uuid}, {ty})"));
            self.bids.push(b);
        }
    }

    /// What falls due at `now`: crashed processes restarted, held jobs released, the
    /// depositor's late fixes put in place, a paused queue resumed.
    async fn due(&mut self, now: tokio::time::Instant) {
        for k in 0..self.procs.len() {
            if self.down_until[k].is_some_and(|t| t <= now) {
                self.restart(k).await;
            }
        }
        let admin_engine = &self.admin_engine;
        self.held.retain(|(j, until)| {
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
        let (payloads, root, world) = (&self.payloads, &self.payload_root, &self.world);
        self.late.retain(|(at, place, bytes)| {
            if *at > now {
                return true;
            }
            payloads.put(place, bytes);
            let shown = match place {
                Place::Disk(p) => p.strip_prefix(root).unwrap_or(p).display().to_string(),
                Place::Served(u) => u.clone(),
            };
            world
                .lock()
                .trace(format!("the depositor put {shown} right"));
            false
        });
        if self.queue_paused_until.is_some_and(|t| t <= now) {
            self.queue_paused_until = None;
            admin(|| admin_engine.resume_queue("ingest")).await;
        }
    }

    /// One thing the world does to the deployment at `now`, as the dice say.
    async fn act(&mut self, now: tokio::time::Instant) {
        let rng = self.rng.clone();
        let k = rng.below(self.opts.nodes);
        match rng.below(11) {
            0 => self.crash(k, now),
            1 => {
                if let Some(p) = &self.procs[k] {
                    let s = p.tree.session_id();
                    self.world.lock().expire(s);
                }
            }
            2 => self.pause(k, now),
            3 | 4 => self.requeue().await,
            5 => {
                let e = &self.admin_engine;
                if let Some((_, j)) = any_job(&rng, e, &self.bids).await
                    && admin(|| e.hold_job(&j)).await.is_some()
                {
                    self.held
                        .push((j, now + Duration::from_millis(rng.below(4000) as u64)));
                }
            }
            6 => {
                let e = &self.admin_engine;
                if let Some((b, j)) = any_job(&rng, e, &self.bids).await {
                    self.deleted_from.insert(b.to_string());
                    if admin(|| e.delete_job(&j)).await.flatten().is_some() {
                        *self.reopened.entry(b.to_string()).or_default() += 1;
                    }
                }
            }
            8 => {
                // The fixity checker reads every recorded copy back, under the faults: it
                // may fail, but never call a good copy bad or missing.
                if let Ok(a) =
                    lading_ingest::fixity::check(&self.admin_ingest, None, None, None).await
                {
                    for f in a.findings {
                        self.world
                            .lock()
                            .violation(format!("fixity: a good copy reported: {f}"));
                    }
                }
            }
            10 => {
                // A storage node goes down for a while (up to 20 s), and comes back by
                // itself: work on it waits, using no attempt, and resumes.
                let n = rng.below(2);
                let until = self.clock.now_ms() + 1_000 + rng.below(19_000) as u64;
                self.sim.buckets.outage[n].store(until, std::sync::atomic::Ordering::Relaxed);
                self.world
                    .lock()
                    .trace(format!("node {} down until {until}", n + 1));
            }
            9 => {
                let (e, i) = (&self.admin_engine, &self.admin_ingest);
                if let Some(r) = ask_access(&rng, e, i, &self.bids).await {
                    self.world
                        .lock()
                        .trace(format!("access {} asked for {} v{}", r.1, r.2, r.3));
                    self.asked.push(r);
                }
            }
            7 if self.queue_paused_until.is_none() => {
                admin(|| self.admin_engine.pause_queue("ingest")).await;
                self.queue_paused_until = Some(now + Duration::from_millis(rng.below(3000) as u64));
            }
            _ => {}
        }
    }

    /// Process `k` is started again, if it is down.
    pub(super) async fn restart(&mut self, k: usize) {
        if self.procs[k].is_none() {
            self.procs[k] = Some(self.sim.start(k).await);
            self.down_until[k] = None;
            self.world.lock().trace(format!("p{k} restarted"));
        }
    }

    /// Process `k` crashes: its session is cut off (and expires later), its services end
    /// at once, and it is started again after a while.
    pub(super) fn crash(&mut self, k: usize, now: tokio::time::Instant) {
        if let Some(p) = self.procs[k].take() {
            p.tree.kill();
            p.task.abort();
            let s = p.tree.session_id();
            let w = self.world.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(SESSION_TIMEOUT_MS)).await;
                w.lock().expire(s);
            });
            self.down_until[k] =
                Some(now + Duration::from_millis(500 + self.rng.below(5000) as u64));
            self.world.lock().trace(format!("p{k} crashed"));
        }
    }

    /// Process `k` stops answering for a while; past the session timeout, its session
    /// expires.
    fn pause(&mut self, k: usize, now: tokio::time::Instant) {
        if let Some(p) = &self.procs[k] {
            let d = 500 + self.rng.below(6000) as u64;
            p.tree.pause_until(now + Duration::from_millis(d));
            self.world.lock().trace(format!("p{k} paused {d} ms"));
            if d > SESSION_TIMEOUT_MS {
                let (w, s) = (self.world.clone(), p.tree.session_id());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(SESSION_TIMEOUT_MS)).await;
                    w.lock().expire(s);
                });
            }
        }
    }

    /// The failed jobs of a batch are requeued: all at once, or one.
    async fn requeue(&mut self) {
        let (rng, e) = (self.rng.clone(), self.admin_engine.clone());
        let Some(b) = pick(&rng, &self.bids) else {
            return;
        };
        if rng.below(2) == 0 {
            // Each job is requeued in its own commit, and each may reopen the batch: a report
            // may come between two of them (Lading's Reporting waits `report_settle_s` for
            // them; this one does not).
            if let Some(r) = admin(|| e.requeue_failed(&b, None, None)).await {
                *self.reopened.entry(b.to_string()).or_default() +=
                    r.iter().filter(|(_, r)| r.is_ok()).count() as u32;
            }
        } else if let Some(info) = admin(|| e.batch(&b)).await
            && let Some(j) = info.jobs.get("batch-failed").and_then(|f| pick(&rng, f))
            && admin(|| e.requeue_job(&j, None)).await.is_some()
        {
            *self.reopened.entry(b.to_string()).or_default() += 1;
        }
    }

    /// The faults stop (the tree's, the buckets' and the payload server's); everything held
    /// is let go and every process is up.
    pub(super) async fn faults_stop(&mut self) {
        for (_, place, bytes) in std::mem::take(&mut self.late) {
            self.payloads.put(&place, &bytes);
        }
        self.world.lock().faults = None;
        self.sim
            .buckets
            .faults
            .store(false, std::sync::atomic::Ordering::Relaxed);
        for n in self.sim.buckets.outage.iter() {
            n.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        self.world.lock().trace("faults stop".into());
        let e = &self.admin_engine;
        for (j, _) in std::mem::take(&mut self.held) {
            admin(|| e.release_job(&j)).await;
        }
        admin(|| e.resume_queue("ingest")).await;
        for (k, p) in self.procs.iter_mut().enumerate() {
            if p.is_none() {
                *p = Some(self.sim.start(k).await);
            }
        }
    }
}

/// Generic jobs: a type whose running jobs time out after 5 s, with a rate limit and a
/// retention of ended jobs; a schedule; and its jobs.
async fn generic_workload(admin_jobs: &lading_jobs::Jobs) {
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
}
