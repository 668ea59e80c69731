//! Dependencies (SPEC §11): the outside services work depends on — each storage node, the
//! SMTP server, each callback host, each payload host, the inventory database — each with a
//! health of its own, learnt from the calls themselves and shared by every loop of the
//! process ([`Engine::deps`]).
//!
//! A call that finds a dependency *unavailable* marks it down ([`Dependencies::down`]); the
//! job that made the call waits in its stage without using an attempt, recorded here
//! ([`Dependencies::wait`]) and deferred in the tree. One prober per dependency per process
//! (run by `lading-worker`) decides when it is back; then the jobs waiting on it are woken in
//! priority order, a few at first ([`Dependencies::up`]). While a dependency is down, the
//! process publishes an ephemeral node `/dependencies/KEY@OWNER` (gone with its session), so
//! that every process, `lading status` and the console see the same health
//! ([`published`]).

use crate::Engine;
use lading_core::layout::JobId;
use lading_core::tree::{CreateMode, TreeError};
use lading_core::{BoxFuture, JobState};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Lading's folder of published dependency health. Not part of Merritt's layout.
pub const DEPENDENCIES: &str = "/dependencies";

/// Status field: the dependency a job waits on now (its key).
pub const WAITING_ON_FIELD: &str = "waiting_on";
/// Status field: since when (ms since the epoch) the job has waited in its current stage.
pub const WAIT_SINCE_FIELD: &str = "waiting_since_ms";
/// Status field: how many times the job has waited on a dependency, over its whole life.
pub const WAITS_FIELD: &str = "waits";
/// Status field: the total time (ms) the job has waited on dependencies, ended waits only.
pub const WAITED_MS_FIELD: &str = "waited_ms";

/// The kinds of dependency.
pub const KINDS: [&str; 5] = [
    "storage-node",
    "smtp",
    "callback",
    "payload-host",
    "inventory",
];

/// An outside service, named as a person reads it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Dependency {
    /// `storage-node`, `smtp`, `callback`, `payload-host`, `inventory`.
    pub kind: String,
    /// Within its kind: a node's number, a host name.
    pub name: String,
    /// Where it is (a URL or host:port): shown to admins only.
    pub address: String,
}

impl Dependency {
    pub fn new(kind: &str, name: impl Into<String>, address: impl Into<String>) -> Dependency {
        Dependency {
            kind: kind.to_string(),
            name: name.into(),
            address: address.into(),
        }
    }

    /// The dependency a key names, as far as the key tells (no address): for a job found
    /// waiting on it.
    pub fn from_key(key: &str) -> Dependency {
        KINDS
            .iter()
            .find_map(|k| {
                key.strip_prefix(k)
                    .and_then(|r| r.strip_prefix('-'))
                    .map(|name| Dependency::new(k, name, ""))
            })
            .unwrap_or_else(|| Dependency::new("", key, ""))
    }

    /// Its key: `KIND-NAME`, with only characters a tree node name takes.
    pub fn key(&self) -> String {
        let raw = format!("{}-{}", self.kind, self.name);
        raw.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_') {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    }

    /// How a person names it: `storage node 9501`, `SMTP server`, `callback host h`.
    pub fn label(&self) -> String {
        match self.kind.as_str() {
            "storage-node" => format!("storage node {}", self.name),
            "smtp" => "SMTP server".to_string(),
            "callback" => format!("callback host {}", self.name),
            "payload-host" => format!("payload host {}", self.name),
            "inventory" => "inventory database".to_string(),
            k => format!("{k} {}", self.name),
        }
    }
}

/// How waits are bounded (`[dependencies]` in the config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepSettings {
    /// The prober's longest pause between two probes (it starts at 1 s and doubles).
    pub probe_max: Duration,
    /// How long a job may wait on one dependency before it fails, naming it.
    pub max_wait: Duration,
    /// The same for one kind of dependency (`smtp`, `storage-node`, …), where it differs.
    pub max_wait_by_kind: BTreeMap<String, Duration>,
    /// How long a waiting job is deferred in the tree: when no prober of this process wakes
    /// it first (its process ended), it is looked at again after this long.
    pub recheck: Duration,
}

impl Default for DepSettings {
    fn default() -> Self {
        DepSettings {
            probe_max: Duration::from_secs(5),
            max_wait: Duration::from_secs(72 * 3600),
            max_wait_by_kind: BTreeMap::new(),
            recheck: Duration::from_secs(60),
        }
    }
}

impl DepSettings {
    /// How long work may wait on `dep`.
    pub fn max_wait_for(&self, dep: &Dependency) -> Duration {
        self.max_wait_by_kind
            .get(&dep.kind)
            .copied()
            .unwrap_or(self.max_wait)
    }

    /// Whether work that began waiting on `dep` at `since_ms` has waited too long at `now_ms`.
    pub fn waited_too_long(&self, dep: &Dependency, since_ms: u64, now_ms: u64) -> bool {
        now_ms.saturating_sub(since_ms) > self.max_wait_for(dep).as_millis() as u64
    }
}

/// One cheap request that says whether a dependency answers (`Err`: the cause, plain).
pub type Probe = Arc<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// A job waiting on a dependency: what waking it needs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Waiter {
    pub priority: u8,
    pub job: JobId,
    pub state: JobState,
}

/// The health of one dependency, as this process (or the tree) knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Health {
    pub kind: String,
    pub name: String,
    pub label: String,
    pub address: String,
    pub up: bool,
    /// Since when it is down (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_since_ms: Option<u64>,
    /// The cause of the last failure, in plain words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cause: String,
    /// Jobs waiting on it.
    pub waiting: u64,
    /// Probes this process made since it went down (all failed: it is still down).
    #[serde(default)]
    pub probes: u32,
    /// The processes that see it down (from the tree).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seen_by: Vec<String>,
}

#[derive(Default)]
struct Entry {
    dep: Option<Dependency>,
    down_since_ms: Option<u64>,
    cause: String,
    waiting: BTreeMap<JobId, Waiter>,
    /// Probes made since it went down: the prober's backoff step.
    step: u32,
    /// Whether a prober runs for it in this process.
    probing: bool,
}

/// The process's dependencies (see the module's page).
#[derive(Default)]
pub struct Dependencies {
    entries: Mutex<BTreeMap<String, Entry>>,
    probes: Mutex<BTreeMap<String, Probe>>,
    settings: Mutex<DepSettings>,
    /// Signalled on every change of health (the prober and tests wait on it).
    changed: tokio::sync::Notify,
    /// Where probers are started while the process's prober service runs.
    probers: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Dependency>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Dependencies {
    /// Hands probers to `to` (the process's prober service) from now on; `None` when it
    /// ends.
    pub fn set_probers(&self, to: Option<tokio::sync::mpsc::UnboundedSender<Dependency>>) {
        *lock(&self.probers) = to;
    }

    /// The prober service ended and its probers with it: the next failure of a dependency
    /// still down starts a prober again.
    pub fn probers_ended(&self) {
        for e in lock(&self.entries).values_mut() {
            e.probing = false;
        }
    }

    /// Gives `dep`'s prober to the prober service; false when none runs (or it ended).
    pub fn hand_prober(&self, dep: &Dependency) -> bool {
        lock(&self.probers)
            .as_ref()
            .is_some_and(|tx| tx.send(dep.clone()).is_ok())
    }

    pub fn settings(&self) -> DepSettings {
        lock(&self.settings).clone()
    }

    pub fn configure(&self, s: DepSettings) {
        *lock(&self.settings) = s;
    }

    /// Makes `dep` known (listed while up) with the probe that says whether it answers.
    pub fn register(&self, dep: Dependency, probe: Option<Probe>) {
        let key = dep.key();
        if let Some(p) = probe {
            lock(&self.probes).insert(key.clone(), p);
        }
        lock(&self.entries).entry(key).or_default().dep = Some(dep);
    }

    pub fn probe_of(&self, key: &str) -> Option<Probe> {
        lock(&self.probes).get(key).cloned()
    }

    /// Marks `dep` down at `now_ms` with `cause` (plain words). Returns since when it is
    /// down, and whether a prober must be started (none runs for it here).
    pub fn down(&self, dep: &Dependency, cause: &str, now_ms: u64) -> (u64, bool) {
        let mut entries = lock(&self.entries);
        let e = entries.entry(dep.key()).or_default();
        if e.dep.is_none() {
            e.dep = Some(dep.clone());
        }
        e.cause = cause.to_string();
        let newly = e.down_since_ms.is_none();
        let since = *e.down_since_ms.get_or_insert(now_ms);
        let start = !e.probing;
        e.probing = true;
        drop(entries);
        if newly {
            tracing::warn!(dependency = %dep.label(), address = %dep.address, %cause,
                "dependency down; work on it waits");
            self.changed.notify_waiters();
        }
        (since, start)
    }

    /// Takes on `w`, found waiting on `key` since `since_ms` and deferred by a process that
    /// no longer watches over it (it ended, or another process found it first): it waits
    /// here, and `key` counts as down here until this process's prober says it answers
    /// (a second at most when it does), so the job resumes when the dependency is back
    /// rather than when its deferral runs out. Returns the dependency when its prober must
    /// be handed to the prober service; nothing is taken on when no service runs (the
    /// deferral then decides).
    /// Only a dependency with a probe of its own here is taken on: for one without (a payload
    /// host), the waiting jobs are the probe, and taking them on would only retry them sooner.
    pub fn adopt(&self, key: &str, w: Waiter, since_ms: u64) -> Option<Dependency> {
        if lock(&self.probers).is_none() || !lock(&self.probes).contains_key(key) {
            return None;
        }
        let mut entries = lock(&self.entries);
        let e = entries.entry(key.to_string()).or_default();
        if e.waiting.contains_key(&w.job) {
            return None;
        }
        e.waiting.insert(w.job.clone(), w);
        let dep = e
            .dep
            .get_or_insert_with(|| Dependency::from_key(key))
            .clone();
        if e.down_since_ms.is_none() {
            e.down_since_ms = Some(since_ms);
            e.cause = "another process found it unavailable; checking".into();
        }
        if e.probing {
            return None;
        }
        e.probing = true;
        drop(entries);
        self.changed.notify_waiters();
        Some(dep)
    }

    /// Records `w` as waiting on `key` (removed from any other).
    pub fn wait(&self, key: &str, w: Waiter) {
        let mut entries = lock(&self.entries);
        for (k, e) in entries.iter_mut() {
            if k != key {
                e.waiting.remove(&w.job);
            }
        }
        entries
            .entry(key.to_string())
            .or_default()
            .waiting
            .insert(w.job.clone(), w);
    }

    /// Forgets `job` as a waiter (it ran, or was woken).
    pub fn forget(&self, job: &JobId) {
        for e in lock(&self.entries).values_mut() {
            e.waiting.remove(job);
        }
    }

    /// The dependency `job` waits on here when it is still down: its key, label, since when
    /// it is down and the cause.
    pub fn still_down_for(&self, job: &JobId) -> Option<(Dependency, u64, String)> {
        let entries = lock(&self.entries);
        entries.values().find_map(|e| {
            let since = e.down_since_ms?;
            e.waiting.contains_key(job).then(|| {
                (
                    e.dep.clone().unwrap_or_else(|| Dependency::new("", "", "")),
                    since,
                    e.cause.clone(),
                )
            })
        })
    }

    /// Whether `key` is down here.
    pub fn is_down(&self, key: &str) -> bool {
        lock(&self.entries)
            .get(key)
            .is_some_and(|e| e.down_since_ms.is_some())
    }

    /// The pause before the next probe of `key` (1 s doubling up to `probe_max`), counting
    /// the probe.
    pub fn next_pause(&self, key: &str) -> Duration {
        let max = self.settings().probe_max.max(Duration::from_millis(1));
        let mut entries = lock(&self.entries);
        let e = entries.entry(key.to_string()).or_default();
        let pause = Duration::from_secs(1u64 << e.step.min(20)).min(max);
        e.step = e.step.saturating_add(1);
        pause
    }

    /// Marks `key` up. Returns the jobs that waited on it, in priority order (then age).
    pub fn up(&self, key: &str) -> Vec<Waiter> {
        let mut entries = lock(&self.entries);
        let Some(e) = entries.get_mut(key) else {
            return Vec::new();
        };
        let was_down = e.down_since_ms.take();
        e.cause.clear();
        e.step = 0;
        // In the same lock: a `down` from now on starts a prober again.
        e.probing = false;
        let mut waiters: Vec<Waiter> = e.waiting.values().cloned().collect();
        let label = e.dep.as_ref().map(Dependency::label).unwrap_or_default();
        drop(entries);
        if let Some(since) = was_down {
            tracing::info!(dependency = %label, down_since_ms = since, waiting = waiters.len(),
                "dependency back; waiting work resumes");
            self.changed.notify_waiters();
        }
        waiters.sort();
        waiters
    }

    /// Every dependency this process knows, with its health.
    pub fn list(&self) -> Vec<Health> {
        lock(&self.entries)
            .values()
            .filter_map(|e| {
                let d = e.dep.as_ref()?;
                Some(Health {
                    kind: d.kind.clone(),
                    name: d.name.clone(),
                    label: d.label(),
                    address: d.address.clone(),
                    up: e.down_since_ms.is_none(),
                    down_since_ms: e.down_since_ms,
                    cause: e.cause.clone(),
                    waiting: e.waiting.len() as u64,
                    probes: if e.down_since_ms.is_some() { e.step } else { 0 },
                    seen_by: Vec::new(),
                })
            })
            .collect()
    }

    /// Waits for the next change of health.
    pub async fn changed(&self) {
        self.changed.notified().await
    }
}

/// The published record of a dependency down, as one process sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Published {
    #[serde(flatten)]
    health: Health,
    owner: String,
}

impl Engine {
    /// The process's dependencies and their health.
    pub fn deps(&self) -> &Dependencies {
        &self.deps
    }

    /// Takes on the leased job when it waits on a dependency (see [`Dependencies::adopt`]),
    /// starting the dependency's prober here.
    pub(crate) fn adopt_waiter(&self, lease: &crate::JobLease) {
        let extra = &lease.status.extra;
        let Some(key) = extra
            .get(WAITING_ON_FIELD)
            .and_then(serde_json::Value::as_str)
        else {
            return;
        };
        let since = extra
            .get(WAIT_SINCE_FIELD)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or_else(|| self.clock.now_ms());
        let w = Waiter {
            priority: lease.priority,
            job: lease.job.clone(),
            state: lease.state(),
        };
        if let Some(dep) = self.deps.adopt(key, w, since)
            && !self.deps.hand_prober(&dep)
        {
            // The service ended meanwhile: the next failure starts a prober again.
            self.deps.probers_ended();
        }
    }

    fn published_path(&self, key: &str) -> String {
        let owner: String = self
            .owner()
            .chars()
            .map(|c| if c == '/' { '_' } else { c })
            .collect();
        format!("{DEPENDENCIES}/{key}@{owner}")
    }

    /// Publishes this process's view of `key` in the tree: an ephemeral node while it is
    /// down, none once it is up. Best effort: the health here does not depend on it.
    pub async fn publish_dependency(&self, key: &str) {
        let health = self
            .deps
            .list()
            .into_iter()
            .find(|h| Dependency::new(&h.kind, &h.name, "").key() == key);
        let path = self.published_path(key);
        let r = match health {
            Some(h) if !h.up => {
                let data = serde_json::to_vec(&Published {
                    health: h,
                    owner: self.owner().to_string(),
                })
                .ok();
                self.publish_down(&path, data).await
            }
            _ => match self.tree.delete(&path, None).await {
                Ok(()) => Ok(()),
                Err(e) if matches!(e.root(), TreeError::NoNode(_)) => Ok(()),
                Err(e) => Err(e),
            },
        };
        if let Err(e) = r {
            tracing::debug!(dependency = key, error = %e, "cannot publish a dependency's health");
        }
    }

    async fn publish_down(
        &self,
        path: &str,
        data: Option<Vec<u8>>,
    ) -> std::result::Result<(), TreeError> {
        if self.tree.exists(DEPENDENCIES).await?.is_none() {
            match self
                .tree
                .create(DEPENDENCIES, None, CreateMode::Persistent)
                .await
            {
                Ok(_) => {}
                Err(e) if matches!(e.root(), TreeError::NodeExists(_)) => {}
                Err(e) => return Err(e),
            }
        }
        match self.tree.set(path, data.clone(), None).await {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.root(), TreeError::NoNode(_)) => self
                .tree
                .create(path, data, CreateMode::Ephemeral)
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        }
    }
}

/// Every dependency's health: this process's view, with what every process published in the
/// tree (a dependency down for any process is shown down, with the processes that see it
/// so and the work waiting on it in each).
pub async fn published(engine: &Engine) -> Vec<Health> {
    let (tree, local, me) = (engine.tree().as_ref(), engine.deps(), engine.owner());
    let mut all: BTreeMap<String, Health> = local
        .list()
        .into_iter()
        .map(|h| (Dependency::new(&h.kind, &h.name, "").key(), h))
        .collect();
    let names = tree.children(DEPENDENCIES).await.unwrap_or_default();
    let paths: Vec<String> = names
        .iter()
        .map(|n| format!("{DEPENDENCIES}/{n}"))
        .collect();
    let nodes = tree.get_many(&paths).await.unwrap_or_default();
    for node in nodes.into_iter().flatten() {
        let Some(p) = node
            .data
            .as_deref()
            .and_then(|b| lading_core::json::from_bytes::<Published>(b).ok())
        else {
            continue;
        };
        let key = Dependency::new(&p.health.kind, &p.health.name, "").key();
        let h = all.entry(key).or_insert_with(|| Health {
            up: true,
            waiting: 0,
            down_since_ms: None,
            cause: String::new(),
            seen_by: Vec::new(),
            ..p.health.clone()
        });
        if !p.health.up {
            if h.up {
                // Another process sees it down; this one's count of waiters is its own.
                h.up = false;
                h.cause = p.health.cause.clone();
                h.down_since_ms = p.health.down_since_ms;
            } else {
                h.down_since_ms = match (h.down_since_ms, p.health.down_since_ms) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        if p.owner != me {
            // This process's own count is in already; others' add.
            h.waiting += p.health.waiting;
        }
        if !h.seen_by.contains(&p.owner) {
            h.seen_by.push(p.owner);
        }
    }
    all.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jid(s: &str) -> JobId {
        JobId::parse(s).unwrap()
    }

    #[test]
    fn a_dependency_goes_down_keeps_its_waiters_and_gives_them_back_in_priority_order() {
        let d = Dependencies::default();
        let node = Dependency::new("storage-node", "9501", "http://127.0.0.1:8333");
        assert_eq!(node.key(), "storage-node-9501");
        assert_eq!(node.label(), "storage node 9501");
        let (since, start) = d.down(&node, "connection refused", 1_000);
        assert_eq!((since, start), (1_000, true));
        let (since, start) = d.down(&node, "connection reset", 2_000);
        assert_eq!((since, start), (1_000, false), "one prober, the first time");
        for (p, j) in [
            (5, "jid0000000002"),
            (1, "jid0000000003"),
            (5, "jid0000000001"),
        ] {
            d.wait(
                &node.key(),
                Waiter {
                    priority: p,
                    job: jid(j),
                    state: JobState::Storing,
                },
            );
        }
        let (n, _, cause) = d.still_down_for(&jid("jid0000000001")).unwrap();
        assert_eq!(
            (n.label(), cause.as_str()),
            ("storage node 9501".into(), "connection reset")
        );
        assert_eq!(d.list()[0].waiting, 3);
        assert!(!d.list()[0].up);
        let back = d.up(&node.key());
        let order: Vec<&str> = back.iter().map(|w| w.job.as_str()).collect();
        assert_eq!(order, ["jid0000000003", "jid0000000001", "jid0000000002"]);
        assert!(d.still_down_for(&jid("jid0000000001")).is_none(), "up now");
        assert!(d.list()[0].up);
    }

    #[test]
    fn the_probe_pause_doubles_from_one_second_to_the_limit_and_starts_over_when_up() {
        let d = Dependencies::default();
        let node = Dependency::new("smtp", "mail", "127.0.0.1:25");
        d.down(&node, "connection refused", 0);
        let pauses: Vec<u64> = (0..5)
            .map(|_| d.next_pause(&node.key()).as_secs())
            .collect();
        assert_eq!(pauses, [1, 2, 4, 5, 5]);
        d.up(&node.key());
        assert_eq!(d.next_pause(&node.key()).as_secs(), 1);
    }

    #[test]
    fn a_job_found_waiting_by_a_process_that_did_not_defer_it_is_taken_on_with_one_prober() {
        let d = Dependencies::default();
        let w = |j: &str| Waiter {
            priority: 5,
            job: jid(j),
            state: JobState::Storing,
        };
        // No prober service: the deferral decides, nothing is taken on.
        assert_eq!(d.adopt("storage-node-1", w("jid0000000001"), 500), None);
        assert!(!d.is_down("storage-node-1"));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        d.set_probers(Some(tx));
        // Nor without a probe of its own here (the waiting jobs are its probe).
        assert_eq!(d.adopt("storage-node-1", w("jid0000000001"), 500), None);
        let answers: Probe = Arc::new(|| Box::pin(async { Ok(()) }));
        d.register(
            Dependency::new("storage-node", "1", "http://n1"),
            Some(answers),
        );
        let dep = d.adopt("storage-node-1", w("jid0000000001"), 500).unwrap();
        assert_eq!(
            (dep.kind.as_str(), dep.name.as_str()),
            ("storage-node", "1")
        );
        assert_eq!(dep.key(), "storage-node-1");
        assert!(
            d.is_down("storage-node-1"),
            "until this process's prober says otherwise"
        );
        assert!(d.still_down_for(&jid("jid0000000001")).is_some());
        // The same job again, or a second one: the prober is already started.
        assert_eq!(d.adopt("storage-node-1", w("jid0000000001"), 500), None);
        assert_eq!(d.adopt("storage-node-1", w("jid0000000002"), 700), None);
        let back = d.up("storage-node-1");
        assert_eq!(back.len(), 2, "both resume when it answers");
        assert!(rx.try_recv().is_err(), "adopt hands nothing itself");
        // A dependency never registered is named from its key; a host name keeps its dashes.
        let dep = Dependency::from_key("payload-host-files.example.org_8080");
        assert_eq!(dep.kind, "payload-host");
        assert_eq!(dep.name, "files.example.org_8080");
    }
}
