//! What is checked once the faults have stopped: every batch, mail, callback and generic
//! job ends in bounded time; an idle deployment wakes for new work; the event stream was
//! sent every transition; no space stays reserved; reports, callbacks, stored objects,
//! fixity, access and storage uploads are as they must be. Each finding is a violation in
//! the seed's run.

use super::*;

/// What the end of a run counts.
#[derive(Default)]
pub(super) struct Counted {
    pub(super) jobs: usize,
    pub(super) stored: usize,
    pub(super) unpacked: [usize; 3],
}

impl Deployment {
    /// Every batch ends, and every mail and callback is delivered, within the liveness
    /// bound; what is still open otherwise (and a violation naming it).
    pub(super) async fn batches_end(&self) -> Vec<String> {
        let open = not_ended(
            &self.admin_engine,
            &self.bids,
            Duration::from_millis(LIVENESS_MS),
            Duration::from_millis(500),
            true,
        )
        .await;
        if !open.is_empty() {
            self.world.lock().violation(format!(
                "liveness: {} s after the faults stopped, not ended: {}",
                LIVENESS_MS / 1000,
                open.join(", ")
            ));
        }
        open
    }

    /// The schedule ticks on once the faults stop (within two of its intervals and the
    /// monitors' longest wait), and is removed; then every generic job ends (finished, or
    /// failed after its attempts), and none was finished by two acceptances.
    pub(super) async fn generic_jobs_end(&self) {
        let (world, jobs) = (&self.world, &self.admin_jobs);
        let faults_stopped = self.clock.now_ms();
        let ticked = still_open(
            Duration::from_secs(2 * SCHEDULE_EVERY_S + 1),
            Duration::from_millis(500),
            || async {
                match admin_generic(|| jobs.schedules(GENERIC_TYPE)).await {
                    Some(list) if list.iter().any(|(_, s)| s.last_tick_ms > faults_stopped) => {
                        vec![]
                    }
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
        admin_generic(|| jobs.remove_schedule(GENERIC_TYPE, SCHEDULE)).await;
        let generic_open = generic_not_ended(jobs, Duration::from_millis(LIVENESS_MS)).await;
        if !generic_open.is_empty() {
            world.lock().violation(format!(
                "liveness: generic jobs not ended {} s after the faults stopped: {}",
                LIVENESS_MS / 1000,
                generic_open.join(", ")
            ));
        }
        let twice: Vec<String> = self
            .sim
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
    }

    /// A one-job batch of the probe `kind` (its jobs' `sim_probe`), named `name`.
    async fn probe_batch(&self, name: &str, kind: Value) -> Option<BatchId> {
        let mut sub = Map::new();
        sub.insert("batchID".into(), json!(format!("sim-{}-{name}", self.seed)));
        sub.insert("submitter".into(), json!("probe"));
        sub.insert("profile".into(), json!(PROFILE));
        sub.insert("sim_jobs".into(), json!(1));
        sub.insert("sim_probe".into(), kind);
        let e = &self.admin_engine;
        let bid = admin(|| e.create_batch(submission(&sub))).await?;
        self.world
            .lock()
            .trace(format!("submitted the {name} {bid}"));
        Some(bid)
    }

    /// Wake-ups: the deployment, idle now, takes a new one-job batch through at once.
    pub(super) async fn wakes_for_new_work(&self) {
        let Some(bid) = self.probe_batch("probe", json!(true)).await else {
            return;
        };
        self.probe_ends(
            &bid,
            PROBE_MS,
            "an idle deployment did not take the one-job batch through",
        )
        .await;
    }

    /// A probe's batch must end within `within_ms`; if not, a violation says `what`.
    async fn probe_ends(&self, bid: &BatchId, within_ms: u64, what: &str) {
        let late = not_ended(
            &self.admin_engine,
            std::slice::from_ref(bid),
            Duration::from_millis(within_ms),
            Duration::from_millis(50),
            false,
        )
        .await;
        if !late.is_empty() {
            self.world.lock().violation(format!(
                "wake-ups: {what} within {} s: {}",
                within_ms / 1000,
                late.join(", ")
            ));
        }
    }

    /// Wake-ups when a lock goes: the process whose handler holds a job crashes under it,
    /// and once its session (and with it the job's lock) is gone, another process's waiter,
    /// which found the job busy, takes it at once. A waiter that does not watch the locks
    /// of the busy jobs it found would wait for its periodic look, past the whole run.
    pub(super) async fn wakes_when_a_lock_goes(&mut self) {
        if self.opts.nodes < 2 {
            return;
        }
        let Some(bid) = self.probe_batch("lock-probe", json!(LOCK_PROBE)).await else {
            return;
        };
        let outside = self.sim.outside.clone();
        let holder = || {
            let o = outside.lock().unwrap_or_else(|p| p.into_inner());
            o.lock_probe_holder
        };
        let taken = still_open(
            Duration::from_millis(PROBE_MS),
            Duration::from_millis(10),
            || async {
                if holder().is_some() {
                    vec![]
                } else {
                    vec![bid.to_string()]
                }
            },
        )
        .await;
        let holder = holder().and_then(|s| {
            let on = |p: &Option<Proc>| p.as_ref().is_some_and(|p| p.tree.session_id() == s);
            self.procs.iter().position(on)
        });
        let Some(k) = holder.filter(|_| taken.is_empty()) else {
            self.world.lock().violation(format!(
                "wake-ups: the lock probe's job {bid} was not taken by a running process within {} s",
                PROBE_MS / 1000
            ));
            return;
        };
        // The other processes' waiters look while the job is held, and find it busy.
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.crash(k, tokio::time::Instant::now());
        self.probe_ends(
            &bid,
            SESSION_TIMEOUT_MS + PROBE_MS,
            "a job whose holder crashed was not taken on by another process",
        )
        .await;
        self.restart(k).await;
    }

    /// The event stream's client stops; when every batch ended, it must have been sent every
    /// transition the tree's statuses show since the stream began, however often it went
    /// away and came back, and a client back at an id the hub still kept exactly what
    /// followed it.
    pub(super) async fn events_were_sent(&mut self, all_ended: bool) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.events_stop.stop();
        if let Some(events) = self.events.take() {
            let _ = events.await;
        }
        if !all_ended {
            return;
        }
        // The client has ended: what it received is all there is.
        let w = std::mem::take(&mut *self.watched.lock().unwrap_or_else(|p| p.into_inner()));
        let mut missed = Vec::new();
        if w.following {
            missed.extend(self.transitions_not_seen(&w).await);
        }
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
            self.world.lock().violation(format!(
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

    /// The transitions the statuses' histories show since the stream began that the client
    /// was never sent.
    async fn transitions_not_seen(&self, w: &Watched) -> Vec<String> {
        let e = &self.admin_engine;
        let mut missed = Vec::new();
        for b in &self.bids {
            let Some(info) = admin(|| e.batch(b)).await else {
                continue;
            };
            let mut statuses = vec![(b.to_string(), info.status.extra.clone())];
            for j in info.jobs.values().flatten() {
                if let Some(job) = admin(|| e.job(j)).await {
                    statuses.push((j.to_string(), job.status.extra.clone()));
                }
            }
            for (id, extra) in statuses {
                for h in lading_engine::history(&extra) {
                    let key = (id.clone(), h.to.clone(), h.at.to_string());
                    if h.at.ms() >= w.from_ms && !w.seen.contains(&key) {
                        missed.push(format!("{id} to {} at {}", h.to, h.at));
                    }
                }
            }
        }
        missed
    }

    /// No space stays reserved once every batch has ended: a reservation lasts until its
    /// job's download ends, whichever way the job left (a delete and a purge included).
    pub(super) async fn no_space_reserved(&self) {
        if let Some(left) = admin(|| self.admin_engine.reservations()).await
            && !left.is_empty()
        {
            let jobs: Vec<&String> = left.iter().map(|(j, _)| j).collect();
            self.world.lock().violation(format!(
                "space: reservations left after every batch ended, of {jobs:?}"
            ));
        }
    }

    /// The deliveries and what was stored: every finding a violation. Returns what the run
    /// counts.
    pub(super) async fn outcomes(&mut self, all_ended: bool) -> Counted {
        let mut counted = Counted::default();
        let mut found = self.deliveries(all_ended, &mut counted).await;
        if all_ended {
            found.extend(self.stores(&mut counted).await);
        }
        let mut st = self.world.lock();
        for f in found {
            st.violation(f);
        }
        counted
    }

    /// The reports: one content per key, each batch's last report listing every job it
    /// kept, and no more reports than its first plus one per reopening. The callbacks: one
    /// content per key, and one for every job that completed.
    async fn deliveries(&self, all_ended: bool, counted: &mut Counted) -> Vec<String> {
        let (mails, callbacks, wrong) = {
            let o = self.sim.outside.lock().unwrap_or_else(|p| p.into_inner());
            (o.mails.clone(), o.callbacks.clone(), o.wrong.clone())
        };
        let mut found = wrong;
        for (key, (content, _)) in mails.iter().chain(&callbacks) {
            if content.get("conflict").is_some() {
                found.push(format!("{key} delivered with two contents: {content}"));
            }
        }
        for b in &self.bids {
            let Ok(info) = self.admin_engine.batch(b).await else {
                continue;
            };
            counted.jobs += info.jobs.values().map(Vec::len).sum::<usize>();
            if all_ended {
                for j in info.jobs.get("batch-completed").into_iter().flatten() {
                    let called = format!(":{j}:completed:");
                    if !callbacks.keys().any(|k| k.contains(&called)) {
                        found.push(format!(
                            "job {j} of {b} completed with no callback delivered"
                        ));
                    }
                }
            }
            found.extend(self.reports_of(b, &info, &mails, all_ended));
        }
        found
    }

    /// Batch `b`'s reports, among the mails delivered.
    fn reports_of(
        &self,
        b: &BatchId,
        info: &lading_engine::BatchInfo,
        mails: &BTreeMap<String, (Value, u32)>,
        all_ended: bool,
    ) -> Vec<String> {
        let mut found = Vec::new();
        let mut kept: Vec<String> = ["batch-completed", "batch-failed"]
            .iter()
            .flat_map(|f| info.jobs.get(*f).cloned().unwrap_or_default())
            .map(|j| j.to_string())
            .collect();
        kept.sort();
        // The report mail's Message-ID names the batch by its Merritt batch id.
        let named = (info.submission.typed().ok())
            .and_then(|s| s.merritt_batch_id())
            .unwrap_or(b.as_str());
        let prefix = format!("<lading.{named}.report-");
        let mine: Vec<(u64, &Value)> = mails
            .iter()
            .filter_map(|(k, (c, _))| {
                let n = k.strip_prefix(&prefix)?.split('@').next()?;
                Some((n.parse().ok()?, c))
            })
            .collect();
        let allowed = 1 + self.reopened.get(b.as_str()).copied().unwrap_or(0) as usize;
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
            // Every job the batch kept is in its last report; a job the report lists and the
            // batch no longer keeps was deleted since (which reopens nothing).
            let processing = info
                .jobs
                .get("batch-processing")
                .map(|f| f.iter().map(JobId::to_string).collect::<Vec<_>>())
                .unwrap_or_default();
            let missing: Vec<&String> = kept.iter().filter(|j| !listed.contains(j)).collect();
            let extra: Vec<&String> = listed.iter().filter(|j| processing.contains(j)).collect();
            if (!missing.is_empty() || !extra.is_empty()) && all_ended {
                found.push(format!(
                    "batch {b}: report {n} lacks {missing:?} and lists {extra:?} still in processing"
                ));
            }
        } else if all_ended {
            found.push(format!(
                "batch {b} ended ({}: {}) with no report delivered",
                info.status.status,
                info.status.message.as_deref().unwrap_or_default()
            ));
        }
        found
    }

    /// What was stored: one job per object, no attempt spent on an outage, every completed
    /// payload job's files stored and recorded exactly once, copies made to go bad found and
    /// repaired, access requests served, no storage upload left open, no working folder of a
    /// removed job left.
    async fn stores(&mut self, counted: &mut Counted) -> Vec<String> {
        let (e, bids) = (&self.admin_engine, &self.bids);
        // A batch cleanup has begun to purge may be seen with some of its jobs only.
        let mut skip = self.deleted_from.clone();
        skip.extend(self.world.lock().purged_from.iter().cloned());
        let mut found = one_job_per_object(&self.payloads, e, bids, &skip).await;
        found.extend(no_attempt_spent_on_an_outage(e, bids).await);
        let (bad, checked) = stored_as_given(
            self.sim.work.path(),
            &self.payloads,
            e,
            bids,
            &self.sim.buckets,
            &mut counted.unpacked,
        )
        .await;
        found.extend(bad);
        counted.stored = checked;
        found.extend(
            fixity_finds_rot(
                &self.admin_ingest,
                &self.sim.buckets,
                &self.rng,
                &self.world,
            )
            .await,
        );
        let asked = std::mem::take(&mut self.asked);
        found.extend(access_served(&self.sim, &self.rng, e, &self.admin_ingest, bids, asked).await);
        // An upload a replaced attempt began after the winner's last sweep, and could not
        // abort, stays open until the scheduled audit finds it abandoned: given that long and
        // a few of the audit's shares, none may be left.
        let before = uploads_left_open(&self.sim.buckets, true).await;
        self.world.lock().trace(format!(
            "storage: {} uploads open at the end, {} of them under a stored version",
            before.0, before.1
        ));
        // The faults are over: the audit's ticks need not read every copy again (see
        // `Sim::behind`).
        self.sim
            .behind
            .store(false, std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(
            ABORT_UPLOADS_AFTER_S + 3 * AUDIT_EVERY_S,
        ))
        .await;
        found.extend(uploads_left_open(&self.sim.buckets, false).await.2);
        // Working folders: a process keeps none of a job cleanup removed (the process that
        // cleaned up removed its own; each other's sweep, its).
        if self.sim.retention_hours == 0 {
            found.extend(folders_of_removed_jobs(&self.sim, e, self.opts.nodes).await);
        }
        found
    }

    /// The run's end: the payload server's tally traced, every process aborted, and what the
    /// seed's run found.
    pub(super) async fn end(self, counted: Counted) -> Run {
        let a = *self.sim.answers.lock().unwrap_or_else(|p| p.into_inner());
        self.world.lock().trace(format!(
            "payload server: {} whole answers, {} unavailable, {} not found, {} reset, {} dripping",
            a.whole, a.unavailable, a.not_found, a.reset, a.dripping
        ));
        for p in self.procs.iter().flatten() {
            p.stop.abort();
        }
        for p in self.procs.into_iter().flatten() {
            let _ = tokio::time::timeout(Duration::from_secs(30), p.task).await;
        }
        let st = self.world.lock();
        Run {
            seed: self.seed,
            sim_ms: self.start.elapsed().as_millis() as u64,
            steps: st.commits,
            jobs: counted.jobs,
            stored: counted.stored,
            unpacked: counted.unpacked,
            violations: st.violations.clone(),
            tail: st.tail.iter().cloned().collect(),
            trace_hash: st.trace_hash,
            full: st.full.clone(),
        }
    }
}
