//! The outbox: outside effects (a report mail, a callback) recorded in the tree in the same
//! `multi` as the state change that causes them, and delivered after that commit.
//!
//! - A stage handler adds [`Effect`]s to its lease; the move that ends its work creates one
//!   `/outbox/eNNNNNNNNNN` node per effect in its own `multi`. A move that fails (a lost lease,
//!   a fenced worker) records nothing, so nothing is delivered for it.
//! - A deliverer claims an entry with an ephemeral `lock` child, delivers it, and deletes the
//!   entry with its lock in one `multi`. A deliverer that dies inside a send loses its lock and
//!   the next one sends again: delivery is at least once, and every attempt carries the
//!   effect's stable `key` so the receiver can drop a repeat. An entry recorded as delivered
//!   (deleted) is never sent again.
//! - A failed delivery is kept with its attempt count and next time; after the caller's last
//!   attempt it is kept as `dead`, for an admin to see and retry.

use crate::{Engine, EngineError, Result, WAIT_LOCKS, any_of, json_bytes};
use lading_core::layout::{BatchId, JobId, OUTBOX, OUTBOX_PREFIX, to_bytes};
use lading_core::{CreateMode, Op, TreeError, Watch, WatchKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;

/// How many entries a deliverer's look reads in one round trip (each with its lock).
const READ_GROUP: usize = 32;

/// What trying to lock an entry came to.
enum Locked {
    Claimed(Box<OutboxClaim>),
    /// Tried since it was read: due again at this time.
    Waits(u64),
    /// Held by another deliverer.
    Held,
    /// Gone, dead, or not this process's to try now.
    Passed,
}

/// What delivers an effect; stored as its name (`mail`, `callback`, `replicate`). A kind this
/// build does not know (written by a newer one) is kept by name: it reads, lists and can be
/// retried, and no deliverer here claims it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum EffectKind {
    /// A report mail, over SMTP.
    Mail,
    /// A job's outcome POSTed to the profile's callback URL.
    Callback,
    /// A stored version copied to a replica node.
    Replicate,
    Other(String),
}

impl EffectKind {
    pub fn as_str(&self) -> &str {
        match self {
            EffectKind::Mail => "mail",
            EffectKind::Callback => "callback",
            EffectKind::Replicate => "replicate",
            EffectKind::Other(s) => s,
        }
    }
}

impl From<String> for EffectKind {
    fn from(s: String) -> EffectKind {
        match s.as_str() {
            "mail" => EffectKind::Mail,
            "callback" => EffectKind::Callback,
            "replicate" => EffectKind::Replicate,
            _ => EffectKind::Other(s),
        }
    }
}

impl From<EffectKind> for String {
    fn from(k: EffectKind) -> String {
        k.as_str().to_string()
    }
}

impl std::fmt::Display for EffectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One outside effect to deliver.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub kind: EffectKind,
    /// The same for every attempt at this one effect (a mail's `Message-ID`, a callback's
    /// `Idempotency-Key`).
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobId>,
    /// What the deliverer needs (addresses, URL, body).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub payload: Value,
}

/// An effect waiting in the outbox, with its delivery record.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxEntry {
    #[serde(flatten)]
    pub effect: Effect,
    /// When it was recorded, ms since the epoch.
    pub created_ms: u64,
    #[serde(default)]
    pub attempts: u32,
    /// Not to be tried before this time, ms since the epoch.
    #[serde(default)]
    pub next_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Given up on: kept for an admin, never tried again by itself.
    #[serde(default)]
    pub dead: bool,
}

/// What a deliverer's look at the outbox reads of each entry; the rest, its payload (a whole
/// report, a mail) above all, is skipped over, not built. Every deliverer of every process
/// read every entry whole at each look: 3% of a simulator run. The entry it claims is read
/// whole under its lock.
#[derive(Deserialize)]
struct Head {
    kind: EffectKind,
    #[serde(default)]
    next_at_ms: u64,
    #[serde(default)]
    dead: bool,
}

/// The heads the deliverers' looks read, by entry name, each with what its node was then
/// (made at, version, size). An entry's kind never changes, and every write of its due time
/// or dead flag moves its version; names are sequential, never made twice. An entry not
/// changed since the last look is not decoded again: every deliverer of every process
/// looks at every entry whenever the outbox changes, and decoding the heads (the payload
/// skipped over, but scanned) was 1.3% of a simulator run. Pruned to the listed entries
/// at the end of each whole look.
#[derive(Default)]
pub(crate) struct Heads(std::sync::Mutex<foldhash::HashMap<String, (Seen, Head)>>);

/// An entry's node as a look found it: made at (ms), version, size of its data.
type Seen = (u64, i32, usize);

impl Heads {
    /// Entry `name`'s due time, or `None` when it is dead or of no kind in `kinds`.
    fn due(
        &self,
        name: &str,
        path: &str,
        node: &lading_core::Node,
        kinds: &[EffectKind],
    ) -> Result<Option<u64>> {
        let seen = (
            node.stat.ctime_ms,
            node.stat.version,
            node.data.as_ref().map_or(0, Vec::len),
        );
        let wanted = |h: &Head| (!h.dead && kinds.contains(&h.kind)).then_some(h.next_at_ms);
        let mut heads = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, head)) = heads.get(name)
            && *at == seen
        {
            return Ok(wanted(head));
        }
        let (head, _) = crate::read::decode_json::<Head>(path, node)?;
        let due = wanted(&head);
        heads.insert(name.to_string(), (seen, head));
        Ok(due)
    }

    /// Forgets the entries not in `listed` (sorted).
    fn keep(&self, listed: &[String]) {
        let mut heads = self.0.lock().unwrap_or_else(|p| p.into_inner());
        heads.retain(|name, _| listed.binary_search(name).is_ok());
    }
}

/// An entry this process claimed for delivery.
#[derive(Debug, Clone)]
pub struct OutboxClaim {
    /// The entry's node name (`eNNNNNNNNNN`).
    pub name: String,
    pub entry: OutboxEntry,
    version: i32,
    /// The session its lock was made on: what the claim commits goes on it alone.
    session: u64,
}

/// The outbox's watch, set before a deliverer looks (see [`Engine::arm_outbox`]).
pub struct OutboxWatch(Watch);

/// One entry as an admin listing shows it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutboxItem {
    pub name: String,
    #[serde(flatten)]
    pub entry: OutboxEntry,
    /// Being delivered right now by some process.
    pub delivering: bool,
}

fn entry_path(name: &str) -> String {
    lading_core::layout::slashed([OUTBOX, name])
}

fn lock_path(name: &str) -> String {
    lading_core::layout::slashed([OUTBOX, name, "lock"])
}

impl Engine {
    /// The `multi` ops that record `effects` in the outbox.
    pub(crate) fn effect_ops(&self, effects: &[Effect]) -> Vec<Op> {
        let now = self.clock.now_ms();
        effects
            .iter()
            .map(|e| {
                let entry = OutboxEntry {
                    effect: e.clone(),
                    created_ms: now,
                    attempts: 0,
                    next_at_ms: 0,
                    last_error: None,
                    dead: false,
                };
                Op::create_mode(
                    OUTBOX_PREFIX,
                    Some(to_bytes(&entry)),
                    CreateMode::PersistentSequential,
                )
            })
            .collect()
    }

    /// Every entry of the outbox, oldest first.
    pub async fn outbox(&self) -> Result<Vec<OutboxItem>> {
        let mut names = self.tree.children(OUTBOX).await?;
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for group in names.chunks(READ_GROUP) {
            for (name, (node, lock)) in group.iter().zip(self.read_group(group).await?) {
                let Some(node) = node else { continue };
                let (entry, _) = crate::read::decode_json::<OutboxEntry>(&entry_path(name), &node)?;
                out.push(OutboxItem {
                    name: name.clone(),
                    entry,
                    delivering: lock.is_some(),
                });
            }
        }
        Ok(out)
    }

    /// The entries named `group` and their locks, in one read.
    async fn read_group(
        &self,
        group: &[String],
    ) -> Result<Vec<(Option<lading_core::Node>, Option<lading_core::Node>)>> {
        let paths: Vec<String> = group
            .iter()
            .flat_map(|n| [entry_path(n), lock_path(n)])
            .collect();
        let mut read = self.tree.get_many(&paths).await?.into_iter();
        Ok(group
            .iter()
            .map(|_| (read.next().flatten(), read.next().flatten()))
            .collect())
    }

    /// Claims the oldest entry that is due and not being delivered. Returns it, or the time
    /// (ms since the epoch) the next one falls due, if any.
    pub async fn claim_effect(
        &self,
        kinds: &[EffectKind],
    ) -> Result<std::result::Result<OutboxClaim, Option<u64>>> {
        // Entry locks left by failed calls, tried again first (the deliverer does not wait
        // through the acquisition skeleton that does this for the queues).
        self.drop_strays().await;
        let mut busy = Vec::new();
        let mut names = self.tree.children(OUTBOX).await?;
        names.sort();
        let now = self.clock.now_ms();
        let mut next_due: Option<u64> = None;
        // Entries and their locks read `READ_GROUP` at a time, each group in one read: a
        // backlog (a receiver down for hours) is looked over in a few round trips, not one per
        // entry.
        for group in names.chunks(READ_GROUP) {
            for (name, read) in group.iter().zip(self.read_group(group).await?) {
                // An entry and its lock come together: an entry another deliverer holds is passed
                // over without a write (each deliverer of each process tried to lock every entry
                // being delivered, and was refused: 2 of 3 outbox writes in `lading-sim`).
                let (path, lock) = (entry_path(name), lock_path(name));
                let (Some(node), held) = read else {
                    continue;
                };
                let Some(next_at_ms) = self.outbox_heads.due(name, &path, &node, kinds)? else {
                    continue;
                };
                if next_at_ms > now {
                    next_due = Some(next_due.map_or(next_at_ms, |n| n.min(next_at_ms)));
                    continue;
                }
                if held.is_some() {
                    if busy.len() < WAIT_LOCKS {
                        busy.push(lock);
                    }
                    continue;
                }
                match self.lock_entry(name, &lock).await? {
                    Locked::Claimed(claim) => return Ok(Ok(*claim)),
                    Locked::Waits(at) => next_due = Some(next_due.map_or(at, |n| n.min(at))),
                    Locked::Held if busy.len() < WAIT_LOCKS => busy.push(lock),
                    Locked::Held | Locked::Passed => {}
                }
            }
        }
        self.outbox_heads.keep(&names);
        *self.outbox_busy.lock().unwrap_or_else(|p| p.into_inner()) = busy;
        Ok(Err(next_due))
    }

    /// Locks entry `name` (its lock `lock`) for this process and reads it again under the
    /// lock.
    async fn lock_entry(&self, name: &str, lock: &str) -> Result<Locked> {
        if !self.claim(lock) {
            return Ok(Locked::Passed);
        }
        // Made on the session it was claimed under, or not at all: made on a session that
        // replaced it, the lock was given up by the old one's claim (as not its own) and
        // stayed for as long as the process lived, the entry never delivered (found by
        // `lading-sim`).
        let session = self.claim_session(lock);
        let made = self
            .tree
            .multi_on(
                session,
                vec![Op::create_mode(lock, None, CreateMode::Ephemeral)],
            )
            .await
            .map_err(|e| e.root().clone());
        match made {
            // Read again under the lock: another deliverer may have tried it and recorded the
            // attempt between the first reading and this lock. The claim carries what is true
            // now, or nothing.
            Ok(_) => match self.read_json::<OutboxEntry>(&entry_path(name)).await {
                Ok(Some((entry, version)))
                    if !entry.dead && entry.next_at_ms <= self.clock.now_ms() =>
                {
                    Ok(Locked::Claimed(Box::new(OutboxClaim {
                        name: name.to_string(),
                        entry,
                        version,
                        session,
                    })))
                }
                Ok(found) => {
                    self.abandon_on(lock, session).await;
                    Ok(match found.filter(|(e, _)| !e.dead) {
                        Some((e, _)) => Locked::Waits(e.next_at_ms),
                        None => Locked::Passed,
                    })
                }
                Err(e) => {
                    self.abandon_on(lock, session).await;
                    Err(e)
                }
            },
            Err(TreeError::NodeExists(_)) => {
                self.unclaim_on(lock, session);
                Ok(Locked::Held)
            }
            Err(TreeError::NoNode(_)) | Err(TreeError::SessionExpired) => {
                self.unclaim_on(lock, session);
                Ok(Locked::Passed)
            }
            Err(e) => {
                // The create may have been made with its answer lost.
                self.abandon_on(lock, session).await;
                Err(e.into())
            }
        }
    }

    /// Watches the outbox for new entries, before a deliverer looks at it
    /// ([`Engine::claim_effect`]): an entry made while it looks still wakes it. (Set after the
    /// look, as it was, the watch missed such an entry until the deliverer's safety net,
    /// found by `lading-sim` once that net was longer than its liveness bound.)
    pub async fn arm_outbox(&self) -> Result<OutboxWatch> {
        Ok(OutboxWatch(
            self.shared_watch(OUTBOX, WatchKind::Children).await?,
        ))
    }

    /// Waits, after a look that claimed nothing, until the outbox changes (`armed`, see
    /// [`Engine::arm_outbox`]), a lock the look found held by another process goes, or
    /// `timeout` passes. An entry whose deliverer crashed is free when its session ends,
    /// which changes no entry: without the lock's watch it waited for the safety net (found
    /// by `lading-sim`).
    pub async fn wait_outbox(&self, armed: OutboxWatch, timeout: Duration) -> Result<()> {
        let busy = std::mem::take(&mut *self.outbox_busy.lock().unwrap_or_else(|p| p.into_inner()));
        let mut watches = vec![armed.0];
        for lock in busy {
            watches.push(self.shared_watch(&lock, WatchKind::Data).await?);
            // Gone before its watch was set: the watch would wait for a new one.
            if self.tree.exists(&lock).await?.is_none() {
                return Ok(());
            }
        }
        let _ = tokio::time::timeout(timeout, any_of(watches.iter_mut())).await;
        Ok(())
    }

    /// Records a claimed entry as delivered: it and its lock go in one `multi`.
    pub async fn effect_done(&self, claim: OutboxClaim) -> Result<()> {
        let lock = lock_path(&claim.name);
        let r = self
            .tree
            .multi_on(
                claim.session,
                vec![
                    Op::check(&lock, None),
                    Op::delete(&lock, None),
                    Op::delete(entry_path(&claim.name), None),
                ],
            )
            .await;
        match &r {
            Ok(_) => self.unclaim_on(&lock, claim.session),
            Err(_) => self.abandon_on(&lock, claim.session).await,
        }
        r.map(|_| ()).map_err(|e| match e.root() {
            TreeError::NoNode(_) | TreeError::SessionExpired => {
                EngineError::LeaseLost(claim.name.clone())
            }
            _ => e.into(),
        })
    }

    /// Records a failed delivery: tried again at `retry_at_ms`, or, with `None`, kept as dead.
    pub async fn effect_failed(
        &self,
        claim: OutboxClaim,
        error: &str,
        retry_at_ms: Option<u64>,
    ) -> Result<()> {
        self.effect_record(claim, error, retry_at_ms, true).await
    }

    /// Records a delivery that found the service it goes to down (SPEC §11): tried again at
    /// `retry_at_ms`, using no attempt.
    pub async fn effect_waits(
        &self,
        claim: OutboxClaim,
        error: &str,
        retry_at_ms: u64,
    ) -> Result<()> {
        self.effect_record(claim, error, Some(retry_at_ms), false)
            .await
    }

    async fn effect_record(
        &self,
        claim: OutboxClaim,
        error: &str,
        retry_at_ms: Option<u64>,
        counted: bool,
    ) -> Result<()> {
        let lock = lock_path(&claim.name);
        let mut entry = claim.entry.clone();
        if counted {
            entry.attempts += 1;
        }
        entry.last_error = Some(error.chars().take(2000).collect());
        match retry_at_ms {
            Some(t) => entry.next_at_ms = t,
            None => entry.dead = true,
        }
        let r = self
            .tree
            .multi_on(
                claim.session,
                vec![
                    Op::check(&lock, None),
                    Op::set(
                        entry_path(&claim.name),
                        json_bytes(&entry),
                        Some(claim.version),
                    ),
                    Op::delete(&lock, None),
                ],
            )
            .await;
        match r {
            Ok(_) => {
                self.unclaim_on(&lock, claim.session);
                Ok(())
            }
            Err(e) => {
                // The record could not be made (the entry moved on meanwhile, an admin
                // retried it): the lock goes all the same, if it is still this session's, so
                // the entry is never left "delivering" by a deliverer alive and done with it.
                self.abandon_on(&lock, claim.session).await;
                match e.root() {
                    TreeError::BadVersion { .. }
                    | TreeError::NoNode(_)
                    | TreeError::SessionExpired => Err(EngineError::LeaseLost(claim.name.clone())),
                    _ => Err(e.into()),
                }
            }
        }
    }

    /// Gives a claimed entry back untouched (the deliverer is shutting down). Its lock, if
    /// still this session's, is deleted, or kept as a stray until it can be.
    pub async fn effect_release(&self, claim: OutboxClaim) -> Result<()> {
        self.abandon_on(&lock_path(&claim.name), claim.session)
            .await;
        Ok(())
    }

    /// The store at a glance, as `lading status` and `GET /api/v1/status` show it: jobs and
    /// batches per state, paused queues, the outbox (waiting and given-up entries) and
    /// persistent storage/inventory locks left by other tools.
    pub async fn summary(&self) -> Result<Summary> {
        let jobs = self.job_counts().await?;
        let batches = self.batch_counts().await?;
        let mut paused_queues = Vec::new();
        for q in lading_core::layout::QUEUE_NAMES {
            if self.queue_paused(q).await? {
                paused_queues.push(q.to_string());
            }
        }
        let outbox = self.outbox().await?;
        let dead = outbox.iter().filter(|o| o.entry.dead).count();
        Ok(Summary {
            jobs: jobs.iter().map(|(st, n)| (st.name().into(), *n)).collect(),
            batches: batches
                .iter()
                .map(|(st, n)| (st.name().into(), *n))
                .collect(),
            paused_queues,
            outbox: OutboxCounts {
                waiting: outbox.len() - dead,
                dead,
            },
            fixity: None,
            foreign_locks: self.foreign_locks().await?,
            dependencies_down: crate::deps::published(self)
                .await
                .into_iter()
                .filter(|h| !h.up)
                .collect(),
        })
    }

    /// Admin: tries an entry again now, with a fresh attempt count, whatever its state: dead,
    /// waiting, or held by a deliverer (its lock is taken away; a deliverer still sending
    /// then cannot record the delivery, and the entry is sent again, with its key).
    pub async fn retry_effect(&self, name: &str) -> Result<OutboxEntry> {
        let path = entry_path(name);
        let Some((mut entry, version)) = self.read_json::<OutboxEntry>(&path).await? else {
            return Err(EngineError::Invalid(format!(
                "no outbox entry {name:?} (delivered, or never recorded)"
            )));
        };
        entry.dead = false;
        entry.attempts = 0;
        entry.next_at_ms = 0;
        let lock = lock_path(name);
        let mut ops = vec![Op::set(&path, json_bytes(&entry), Some(version))];
        if self.tree.exists(&lock).await?.is_some() {
            ops.push(Op::delete(&lock, None));
        }
        self.tree.multi(ops).await.map_err(|e| match e.root() {
            TreeError::BadVersion { .. } | TreeError::NoNode(_) => {
                EngineError::Conflict(name.to_string())
            }
            _ => e.into(),
        })?;
        Ok(entry)
    }
}

/// The queue at a glance (`GET /api/v1/status`, `lading status`): jobs and batches per state,
/// the paused queues, the outbox, and locks other tools left.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub jobs: std::collections::BTreeMap<String, u64>,
    pub batches: std::collections::BTreeMap<String, u64>,
    pub paused_queues: Vec<String>,
    pub outbox: OutboxCounts,
    pub foreign_locks: Vec<crate::ForeignLock>,
    /// What the stored copies' last checks found: filled by the application from its
    /// inventory, absent here (and where no copy is recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixity: Option<FixitySummary>,
    /// The outside services down now, for any process, and the work waiting on each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies_down: Vec<crate::deps::Health>,
}

/// The fixity of every recorded copy, summed up.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixitySummary {
    pub copies: u64,
    pub bad: u64,
    pub missing: u64,
    /// The longest a copy has gone unchecked: its last check.
    pub oldest_check: Option<String>,
}

/// Outbox entries still being delivered, and those given up.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxCounts {
    pub waiting: usize,
    pub dead: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry is stored as before the kinds were typed (the kind by name, the ids as
    /// text); a kind this build does not know reads, and is written back, by its name.
    #[test]
    fn an_effect_is_stored_by_its_kinds_name_and_an_unknown_kind_is_kept() {
        let e = Effect {
            kind: EffectKind::Replicate,
            key: "k".into(),
            batch: Some(BatchId::parse("bid0000000001").unwrap()),
            job: None,
            payload: Value::Null,
        };
        let stored = serde_json::to_value(&e).unwrap();
        assert_eq!(
            stored,
            serde_json::json!({"kind": "replicate", "key": "k", "batch": "bid0000000001", "payload": null})
        );
        let newer: Effect =
            serde_json::from_value(serde_json::json!({"kind": "sms", "key": "k", "payload": {}}))
                .unwrap();
        assert_eq!(newer.kind, EffectKind::Other("sms".into()));
        assert_eq!(serde_json::to_value(&newer).unwrap()["kind"], "sms");
    }

    /// A look decodes an entry again once its node changed (a retry's due time, a dead
    /// flag, an entry made again under its name), and is told what it is now; an entry the
    /// outbox no longer lists is forgotten.
    #[test]
    fn a_looks_head_of_an_entry_follows_every_change_of_its_node() {
        let node = |ctime_ms, version, entry: Value| lading_core::Node {
            data: Some(serde_json::to_vec(&entry).unwrap()),
            stat: lading_core::tree::Stat {
                version,
                ephemeral_owner: 0,
                ctime_ms,
                mtime_ms: ctime_ms,
                pzxid: None,
            },
        };
        let entry = |next_at_ms: u64, dead: bool| {
            serde_json::json!({"kind": "mail", "key": "k", "payload": {"report": "x"},
                "next_at_ms": next_at_ms, "dead": dead})
        };
        let heads = Heads::default();
        let due = |n: &lading_core::Node, kinds: &[EffectKind]| {
            heads
                .due("e0000000001", "/outbox/e0000000001", n, kinds)
                .unwrap()
        };
        let mail = [EffectKind::Mail];
        assert_eq!(due(&node(1, 0, entry(5, false)), &mail), Some(5));
        // Kept: another deliverer's kinds are asked of the kept head.
        assert_eq!(
            due(&node(1, 0, entry(5, false)), &[EffectKind::Callback]),
            None
        );
        // A retry moved its due time; then it died.
        assert_eq!(due(&node(1, 1, entry(9, false)), &mail), Some(9));
        assert_eq!(due(&node(1, 2, entry(9, true)), &mail), None);
        // Made again at another time, its version from 0 again.
        assert_eq!(due(&node(2, 0, entry(3, false)), &mail), Some(3));
        // Data that is not a head is named, as a whole read names it.
        let bad = lading_core::Node {
            data: Some(b"{".to_vec()),
            ..node(3, 0, Value::Null)
        };
        assert!(matches!(
            heads.due("e0000000001", "/outbox/e0000000001", &bad, &mail),
            Err(EngineError::Corrupt { .. })
        ));
        heads.keep(&[]);
        assert!(heads.0.lock().unwrap().is_empty());
    }
}
