//! Transitions as the tree shows them, made by any writer: this process, other Lading hosts,
//! Merritt's own tools.
//!
//! A follower takes the tree's change feed under `/jobs` and `/batches`, reads each status
//! node that changed (several at once when changes come quickly) and compares its history
//! (see [`HISTORY_FIELD`]) with what it saw last: every entry after that one is a
//! transition. A status written without a history (by Merritt's tools) is a transition when
//! its state differs from the one seen last. When the feed had a gap (a ZooKeeper
//! reconnection), every status is read again and compared the same way, so the transitions
//! the gap hid are reported late rather than lost; only when that reading fails is
//! [`Observed::Lost`] reported. A status first seen reports its entries since the follower
//! started.
//!
//! Each transition gets an id that stays meaningful after a restart:
//! `MTIME-ID-VERSION-K` (the status node's modification time in ms, 13 digits; the job or
//! batch; the status's version; the entry's place from the newest, 0 being the newest).
//! [`Engine::transitions_since`] finds, from the tree alone, every transition of a status
//! changed after a time: what a client resuming after a restart is owed.

use crate::{ChangeEvent, ChangeKind, Engine, HISTORY_FIELD, HistoryEntry, Result};
use foldhash::{HashMap, HashMapExt};
use lading_core::layout::{BATCH_FOLDERS, BatchId, JobId, batch_node, batch_ref_folder, job_node};
use lading_core::time::Stamp;
use lading_core::tree::{Change, ChangeFeed};
use lading_core::{Names, Node, Tree, TreeError, TreeFuture};
use serde_json::Value;
use std::borrow::Cow;
use tokio::sync::{mpsc, oneshot};

/// What a follower reports.
#[derive(Debug, Clone)]
pub enum Observed {
    /// A transition, with its id.
    Transition(String, Box<ChangeEvent>),
    /// Transitions may have been missed (the feed reconnected): re-read the state.
    Lost,
}

/// A follower: its reports, the time from which it reports, and a way to ask it for the past.
pub struct Following {
    /// Transitions and losses, in the order the tree's change feed showed them.
    pub reports: mpsc::UnboundedReceiver<Observed>,
    /// The time (ms, a whole second) from which transitions are reported: those before it
    /// are the past.
    pub reported_from: u64,
    /// Reads the past between two reports.
    pub past: Past,
    /// The follower itself: nothing is reported until it runs. It ends when the reports are
    /// dropped or the store closes; a process runs it as one of its services.
    pub run: Task,
}

/// A piece of work a caller runs (as a supervised service, in a process).
pub type Task = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;

/// A transition with its id.
pub type Transition = (String, ChangeEvent);

struct PastRequest {
    since_ms: u64,
    batch: Option<BatchId>,
    reply: oneshot::Sender<Result<(u64, Vec<Transition>)>>,
}

/// Asks a follower for the transitions a resuming client is owed.
#[derive(Clone)]
pub struct Past {
    tx: mpsc::UnboundedSender<PastRequest>,
}

impl Past {
    /// What [`Engine::transitions_since`] returns, read by the follower between two of its
    /// reports through the feed's own reads, with the number of reports sent before the
    /// read. Every transition reported up to that number is in the result when it is owed
    /// (the feed's reads have seen what it reported); a later report may repeat one of the
    /// result (same id) but none is missing from both. So a client that took the reports
    /// before asking loses nothing by skipping the first ones up to that number.
    pub async fn since(
        &self,
        since_ms: u64,
        batch: Option<&BatchId>,
    ) -> Result<(u64, Vec<Transition>)> {
        let (reply, rx) = oneshot::channel();
        let stopped =
            || crate::EngineError::Tree(TreeError::Backend("the follower stopped".into()));
        self.tx
            .send(PastRequest {
                since_ms,
                batch: batch.cloned(),
                reply,
            })
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

/// The reads the past needs, from a tree handle or from a change feed.
trait Reads: Send + Sync {
    fn get_many<'a>(&'a self, paths: &'a [String]) -> TreeFuture<'a, Vec<Option<Node>>>;
    fn children<'a>(&'a self, path: &'a str) -> Names<'a>;
}

struct TreeReads<'t>(&'t dyn Tree);
struct FeedReads<'t>(&'t dyn ChangeFeed);

/// Both read through their own `get_many` and `children`, which have the same shape.
macro_rules! reads_through {
    ($t:ident) => {
        impl Reads for $t<'_> {
            fn get_many<'a>(&'a self, paths: &'a [String]) -> TreeFuture<'a, Vec<Option<Node>>> {
                self.0.get_many(paths)
            }
            fn children<'a>(&'a self, path: &'a str) -> Names<'a> {
                self.0.children(path)
            }
        }
    };
}
reads_through!(TreeReads);
reads_through!(FeedReads);

/// Statuses remembered per job or batch before the memory starts afresh.
const KNOWN_MAX: usize = 200_000;
/// Changes read together, at most.
const GROUP: usize = 512;

/// The job or batch whose status `path` is.
fn status_of(path: &str) -> Option<(&'static str, &str)> {
    let rest = path.strip_suffix("/status")?;
    if let Some(id) = rest.strip_prefix("/jobs/") {
        return (!id.contains('/') && JobId::parse(id).is_ok()).then_some(("job", id));
    }
    let id = rest.strip_prefix("/batches/")?;
    (!id.contains('/') && BatchId::parse(id).is_ok()).then_some(("batch", id))
}

/// What a follower remembers of one status.
struct Known {
    /// The newest history entry seen (decoded), if any.
    last: Option<HistoryEntry>,
    state: String,
    batch: Option<String>,
}

/// The event id of a status's entry `k` (0 the newest).
pub fn transition_id(mtime_ms: u64, id: &str, version: i32, k: usize) -> String {
    // Built in place, digit by digit: one is made for every transition read or reported
    // (formatted, ids were 3% of a simulator run's instructions).
    let mut out = String::with_capacity(id.len() + 32);
    push_decimal(&mut out, mtime_ms, 13);
    out.push('-');
    out.push_str(id);
    out.push('-');
    if version < 0 {
        out.push('-');
    }
    push_decimal(&mut out, u64::from(version.unsigned_abs()), 1);
    out.push('-');
    push_decimal(&mut out, k as u64, 1);
    out
}

/// `v` in decimal, zeros first to at least `width` digits (as `{v:0width$}` writes it).
fn push_decimal(out: &mut String, v: u64, width: usize) {
    let mut buf = [b'0'; 20];
    let mut at = buf.len();
    let mut v = v;
    loop {
        at -= 1;
        buf[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let from = at.min(buf.len().saturating_sub(width));
    // Digits only: always text (pushed as one slice, not char by char).
    if let Ok(digits) = std::str::from_utf8(&buf[from..]) {
        out.push_str(digits);
    }
}

/// `event_id` naming a time no later than `ms` (the same transition, found again from an
/// earlier time when a client resumes after it); an id of another shape as it is.
pub fn transition_id_at_most(event_id: &str, ms: u64) -> String {
    match transition_id_time(event_id) {
        Some(t) if t > ms => {
            let mut out = String::with_capacity(event_id.len());
            push_decimal(&mut out, ms, 13);
            out.push_str(&event_id[13..]);
            out
        }
        _ => event_id.to_string(),
    }
}

/// The modification time an id names (see [`transition_id`]).
pub fn transition_id_time(event_id: &str) -> Option<u64> {
    // Thirteen bytes before the first dash and three parts after it, counted by bytes (the
    // dash is ASCII): read for every transition of a resuming client's reading.
    let (t, rest) = event_id.split_at_checked(13)?;
    let rest = rest.strip_prefix('-')?;
    if t.contains('-') || rest.bytes().filter(|&b| b == b'-').count() != 2 {
        return None;
    }
    t.parse().ok()
}

/// A decoded history entry as a change event.
fn event(kind: &'static str, id: &str, batch: Option<&str>, e: HistoryEntry) -> ChangeEvent {
    ChangeEvent {
        kind: if kind == "job" {
            ChangeKind::Job
        } else {
            ChangeKind::Batch
        },
        id: id.to_string(),
        batch: batch.map(str::to_string),
        from: e.from,
        to: e.to,
        time: e.at,
        host: Some(e.host).filter(|h| !h.is_empty()),
        message: e.message,
    }
}

/// The entry a status written without a history stands for: a move to `to` at `mtime_ms`.
fn bare_entry(from: Option<String>, to: String, mtime_ms: u64) -> HistoryEntry {
    HistoryEntry {
        at: Stamp::at_ms(mtime_ms),
        from,
        to,
        host: String::new(),
        retry_count: None,
        message: None,
    }
}

/// A status node's state and the strings of its history.
struct Fields<'a> {
    state: String,
    /// The history's strings; `None` when it has none that is a list.
    history: Option<Vec<Cow<'a, str>>>,
    /// Whether the status has a history field at all (a list or not).
    has_history: bool,
}

impl Fields<'_> {
    fn raw(&self) -> Option<crate::RawHistory<'_>> {
        let h = self.history.as_ref()?;
        Some(crate::RawHistory::from_entries(
            h.iter().map(|c| c.as_ref()).collect(),
        ))
    }
}

/// A status as it usually is: `status` a string, `history` a list of strings; its other
/// fields skipped unread. Decoded into a map of values, statuses were 3% of a simulator
/// run's instructions.
#[derive(serde::Deserialize)]
struct UsualStatus<'a> {
    #[serde(borrow)]
    status: Cow<'a, str>,
    #[serde(borrow, default, deserialize_with = "a_list")]
    history: Option<Vec<HistoryString<'a>>>,
}

#[derive(serde::Deserialize)]
struct HistoryString<'a>(#[serde(borrow)] Cow<'a, str>);

/// A history that is there is a list (a `null` is not one: decoded the general way).
fn a_list<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Vec<HistoryString<'de>>>, D::Error> {
    serde::Deserialize::deserialize(d).map(Some)
}

/// A status node's fields: its state and history. Read as [`UsualStatus`] when it has that
/// shape, else as any object (`None` when it is not one or has no string `status`).
fn fields(data: Option<&[u8]>) -> Option<Fields<'_>> {
    let data = data?;
    // An object (a derived struct would take a list too, its fields in order).
    let object = data.trim_ascii_start().first() == Some(&b'{');
    if object && let Ok(u) = lading_core::json::from_bytes::<UsualStatus>(data) {
        return Some(Fields {
            state: u.status.into_owned(),
            has_history: u.history.is_some(),
            history: u.history.map(|h| h.into_iter().map(|s| s.0).collect()),
        });
    }
    let Value::Object(mut m) = lading_core::json::from_bytes(data).ok()? else {
        return None;
    };
    let state = m.remove("status")?.as_str()?.to_string();
    let history = m.get(HISTORY_FIELD).and_then(Value::as_array).map(|l| {
        l.iter()
            .filter_map(Value::as_str)
            .map(|s| Cow::Owned(s.to_string()))
            .collect()
    });
    Some(Fields {
        state,
        history,
        has_history: m.contains_key(HISTORY_FIELD),
    })
}

/// The seconds of a decoded entry's time, 0 when unreadable.
fn entry_ms(e: &HistoryEntry) -> u64 {
    e.at.ms()
}

impl Engine {
    /// Follows every job and batch transition in the tree, by any writer, until the reports
    /// are dropped. `None` when the backend has no change feed.
    pub async fn follow_transitions(&self) -> Result<Option<Following>> {
        let prefixes = vec!["/jobs".to_string(), "/batches".to_string()];
        let Some(mut feed) = self.tree.changes(&prefixes).await? else {
            return Ok(None);
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let (past_tx, mut past_rx) = mpsc::unbounded_channel::<PastRequest>();
        // Transitions from before now are the past: a status first seen is followed from its
        // newest entry, and only that one is reported if it is this recent.
        let start_ms = self.clock().now_ms().saturating_sub(1000);
        let reported_from = start_ms / 1000 * 1000;
        let run = Box::pin(async move {
            let mut known: HashMap<String, Known> = HashMap::new();
            // Reports sent so far.
            let mut sent = 0u64;
            let send = |o: Observed, sent: &mut u64| {
                *sent += 1;
                tx.send(o).is_ok()
            };
            loop {
                let mut changed: Vec<(&'static str, String)> = Vec::new();
                let mut lost = false;
                let first = tokio::select! {
                    // In order, not at random: a run is the same every time (`lading-sim`).
                    biased;
                    c = feed.next() => c,
                    Some(r) = past_rx.recv() => {
                        // Between two reports: the feed's reads have seen every one sent.
                        let read = past(&FeedReads(&*feed), r.since_ms, r.batch.as_ref()).await;
                        let _ = r.reply.send(read.map(|p| (sent, p)).map_err(Into::into));
                        continue;
                    }
                };
                let Some(first) = first else {
                    return;
                };
                let mut note = |c: Change, changed: &mut Vec<(&'static str, String)>| match c {
                    Change::Lost => lost = true,
                    Change::Node(p) => {
                        if let Some((kind, id)) = status_of(&p)
                            && !changed.iter().any(|(_, i)| i == id)
                        {
                            changed.push((kind, id.to_string()));
                        }
                    }
                };
                note(first, &mut changed);
                // Whatever else is already there, read together.
                while changed.len() < GROUP {
                    match tokio::time::timeout(std::time::Duration::ZERO, feed.next()).await {
                        Ok(Some(c)) => note(c, &mut changed),
                        Ok(None) => return,
                        Err(_) => break,
                    }
                }
                if lost {
                    // Changes of the gap were not reported: every status is read again and
                    // compared with what was seen, so what the gap hid is reported now.
                    // Read through the feed's own session, which has seen what it reported.
                    let listing = async {
                        let b = none_if_missing(feed.children("/batches").await)?;
                        let j = none_if_missing(feed.children("/jobs").await)?;
                        Ok::<_, TreeError>(statuses_of(b, j))
                    };
                    match listing.await {
                        Ok(all) => {
                            for (kind, id) in all {
                                if !changed.iter().any(|(_, i)| *i == id) {
                                    changed.push((kind, id));
                                }
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "could not list statuses after a gap");
                            if !send(Observed::Lost, &mut sent) {
                                return;
                            }
                        }
                    }
                }
                if changed.is_empty() {
                    continue;
                }
                if known.len() > KNOWN_MAX {
                    known.clear();
                }
                for group in changed.chunks(GROUP) {
                    match observe(&*feed, group, &mut known, start_ms).await {
                        Ok(events) => {
                            for e in events {
                                if !send(Observed::Transition(e.0, Box::new(e.1)), &mut sent) {
                                    return;
                                }
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "could not read changed statuses");
                            if !send(Observed::Lost, &mut sent) {
                                return;
                            }
                        }
                    }
                }
            }
        });
        Ok(Some(Following {
            reports: rx,
            reported_from,
            past: Past { tx: past_tx },
            run,
        }))
    }
}

/// A listing, empty when the folder does not exist.
fn none_if_missing(
    r: std::result::Result<Vec<String>, TreeError>,
) -> std::result::Result<Vec<String>, TreeError> {
    match r {
        Err(TreeError::NoNode(_)) => Ok(Vec::new()),
        r => r,
    }
}

/// Every batch and job among the children of `/batches` and `/jobs`, as (kind, id).
fn statuses_of(batches: Vec<String>, jobs: Vec<String>) -> Vec<(&'static str, String)> {
    let b = batches
        .into_iter()
        .filter(|n| BatchId::parse(n).is_ok())
        .map(|n| ("batch", n));
    let j = jobs
        .into_iter()
        .filter(|n| JobId::parse(n).is_ok())
        .map(|n| ("job", n));
    b.chain(j).collect()
}

/// Reads the changed statuses (through the feed) and returns their new transitions.
async fn observe(
    feed: &dyn ChangeFeed,
    changed: &[(&'static str, String)],
    known: &mut HashMap<String, Known>,
    start_ms: u64,
) -> std::result::Result<Vec<(String, ChangeEvent)>, TreeError> {
    let mut paths: Vec<String> = Vec::with_capacity(changed.len() * 2);
    for (kind, id) in changed {
        if *kind == "job" {
            let j = JobId::parse(id).expect("checked by status_of");
            paths.push(job_node(&j, "status"));
            paths.push(job_node(&j, "bid"));
        } else {
            let b = BatchId::parse(id).expect("checked by status_of");
            paths.push(batch_node(&b, "status"));
        }
    }
    let nodes: Vec<Option<Node>> = feed.get_many(&paths).await?;
    let mut nodes = nodes.into_iter();
    let mut out = Vec::new();
    for (kind, id) in changed {
        let status = nodes.next().flatten();
        let bid = if *kind == "job" {
            nodes.next().flatten().and_then(|n| n.data)
        } else {
            None
        };
        let Some(node) = status else {
            // Gone (deleted with its job or batch).
            known.remove(id.as_str());
            continue;
        };
        let Some(f) = fields(node.data.as_deref()) else {
            continue;
        };
        let batch = bid.map(|b| String::from_utf8_lossy(&b).into_owned());
        let raw = f.raw();
        let state = f.state.clone();
        let prior = known.get(id.as_str());
        let new: Vec<HistoryEntry> = if let Some(raw) = raw.as_ref().filter(|r| r.len() > 0) {
            let all = 0..raw.len();
            let after = match prior.and_then(|k| k.last.as_ref()) {
                // Decoded from the end: the last one seen is usually one or two back.
                Some(last) => match all.clone().rev().find(|&i| raw.entry(i) == *last) {
                    Some(i) => i + 1,
                    // More moves than the history keeps, or a history started again.
                    None => {
                        let t = entry_ms(last);
                        all.clone().find(|&i| raw.ms(i) >= t).unwrap_or(raw.len())
                    }
                },
                None if prior.is_some() => 0,
                None => {
                    // First seen: its entries since the follower started.
                    let from = start_ms / 1000 * 1000;
                    all.clone()
                        .find(|&i| raw.ms(i) >= from)
                        .unwrap_or(raw.len())
                }
            };
            (after..raw.len()).map(|i| raw.entry(i)).collect()
        } else {
            // No history (written by another tool): a change of state is a transition.
            let from = prior.map(|k| k.state.clone());
            if from.as_deref() == Some(state.as_str())
                || (from.is_none() && node.stat.mtime_ms < start_ms)
            {
                Vec::new()
            } else {
                vec![bare_entry(from, state.clone(), node.stat.mtime_ms)]
            }
        };
        let n = new.len();
        for (i, e) in new.into_iter().enumerate() {
            out.push((
                transition_id(node.stat.mtime_ms, id, node.stat.version, n - 1 - i),
                event(kind, id, batch.as_deref(), e),
            ));
        }
        let batch = batch.or_else(|| prior.and_then(|k| k.batch.clone()));
        known.insert(
            id.clone(),
            Known {
                last: raw
                    .as_ref()
                    .and_then(|r| r.len().checked_sub(1).map(|i| r.entry(i))),
                state,
                batch,
            },
        );
    }
    Ok(out)
}

impl Engine {
    /// Every transition of a job or batch whose status changed at or after `since_ms`, from
    /// the tree alone, oldest first: what a client resuming after a restart is owed. Entries
    /// of the same second as `since_ms` are included (history keeps seconds), and those
    /// stamped up to a minute before it of statuses changed up to a minute before it (a
    /// writer stamps an entry before its commit; a follower reports what a gap in its feed
    /// hid late), so a client sees some again. With `batch`, only that batch and its jobs.
    pub async fn transitions_since(
        &self,
        since_ms: u64,
        batch: Option<&BatchId>,
    ) -> Result<Vec<Transition>> {
        Ok(past(&TreeReads(&*self.tree), since_ms, batch).await?)
    }
}

/// How far before a resuming client's last id the past is read: a writer stamps a transition,
/// then commits, through slow round trips, retries and a pause short of its session's end
/// (after which its commit is refused); and a follower reports what a gap in its feed hid
/// late, after later transitions. Transitions reported later than this after the client's
/// last id may be missed (the follower then says transitions were lost when it cannot
/// re-read).
const STAMPED_EARLY_MS: u64 = 60_000;

/// See [`Engine::transitions_since`].
async fn past(
    reads: &dyn Reads,
    since_ms: u64,
    batch: Option<&BatchId>,
) -> std::result::Result<Vec<Transition>, TreeError> {
    let items = match batch {
        Some(b) => {
            let mut items = vec![("batch", b.to_string())];
            for folder in BATCH_FOLDERS {
                let jobs = none_if_missing(reads.children(&batch_ref_folder(b, folder)).await)?;
                items.extend(jobs.into_iter().map(|j| ("job", j)));
            }
            items
        }
        None => statuses_of(
            none_if_missing(reads.children("/batches").await)?,
            none_if_missing(reads.children("/jobs").await)?,
        ),
    };
    let from_ms = since_ms / 1000 * 1000;
    let mut out = Vec::new();
    for chunk in items.chunks(GROUP) {
        // Each status, and for a job its batch when not known already.
        let mut paths: Vec<String> = Vec::with_capacity(chunk.len() * 2);
        for (kind, id) in chunk {
            let folder = if *kind == "job" { "jobs" } else { "batches" };
            paths.push(format!("/{folder}/{id}/status"));
            if *kind == "job" && batch.is_none() {
                paths.push(format!("/jobs/{id}/bid"));
            }
        }
        let mut nodes = reads.get_many(&paths).await?.into_iter();
        for (kind, id) in chunk {
            let node = nodes.next().flatten();
            let batch = match (*kind, batch) {
                ("job", Some(b)) => Some(b.to_string()),
                ("job", None) => nodes
                    .next()
                    .flatten()
                    .and_then(|n| n.data)
                    .map(|b| String::from_utf8_lossy(&b).into_owned()),
                _ => None,
            };
            // Statuses changed a little before `from_ms` too: a follower that re-read every
            // status after a gap in its feed reports what the gap hid late, after reports of
            // later changes, so a client's last id can name a time after a transition it was
            // sent later (found by `lading-sim`).
            let Some(node) = node.filter(|n| n.stat.mtime_ms + STAMPED_EARLY_MS >= from_ms) else {
                continue;
            };
            let Some(f) = fields(node.data.as_deref()) else {
                continue;
            };
            // An entry's time is its writer's, taken before its commit: a status changed
            // since `from_ms` may hold an entry stamped a little before it and committed
            // after (found by `lading-sim`: a client resuming from an id of that second
            // never got it).
            let mut entries: Vec<HistoryEntry> = f
                .raw()
                .map(|r| {
                    (0..r.len())
                        .filter(|&i| r.ms(i) + STAMPED_EARLY_MS >= from_ms)
                        .map(|i| r.entry(i))
                        .collect()
                })
                .unwrap_or_default();
            if entries.is_empty() && !f.has_history {
                entries.push(bare_entry(None, f.state.clone(), node.stat.mtime_ms));
            }
            let n = entries.len();
            for (i, e) in entries.into_iter().enumerate() {
                out.push((
                    entry_ms(&e),
                    transition_id(node.stat.mtime_ms, id, node.stat.version, n - 1 - i),
                    event(kind, id, batch.as_deref(), e),
                ));
            }
        }
    }
    // By time, each status's entries of one second in their order (ties go by place). The
    // places are sorted, not the transitions (moved about whole, the sort was 1% of a
    // simulator run).
    let mut order: Vec<(u64, usize)> = out.iter().map(|t| t.0).zip(0..).collect();
    order.sort_unstable();
    let mut out: Vec<Option<Transition>> =
        out.into_iter().map(|(_, id, e)| Some((id, e))).collect();
    Ok(order
        .into_iter()
        .filter_map(|(_, i)| out[i].take())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_reads_the_same_whatever_its_shape() {
        let read = |json: &str| {
            fields(Some(json.as_bytes())).map(|f| {
                let h = f
                    .history
                    .as_ref()
                    .map(|h| h.iter().map(|c| c.to_string()).collect::<Vec<_>>());
                (f.state, h, f.has_history)
            })
        };
        let list = |l: &[&str]| Some(l.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        // The usual shape, an escaped entry among them, other fields skipped.
        assert_eq!(
            read(
                r#"{"status":"Pending","x":{"y":[1]},"history":["1|a|b||0|","2|b|c||0|say \"hi\""]}"#
            ),
            Some((
                "Pending".into(),
                list(&["1|a|b||0|", "2|b|c||0|say \"hi\""]),
                true
            ))
        );
        assert_eq!(
            read(r#"{"status":"Held"}"#),
            Some(("Held".into(), None, false))
        );
        // Shapes read the general way: a history that is null, not a list, or holds more
        // than strings (only its strings count); a status named twice (the last counts).
        assert_eq!(
            read(r#"{"status":"A","history":null}"#),
            Some(("A".into(), None, true))
        );
        assert_eq!(
            read(r#"{"status":"A","history":"x"}"#),
            Some(("A".into(), None, true))
        );
        assert_eq!(
            read(r#"{"status":"A","history":["1|a|b||0|",7,null]}"#),
            Some(("A".into(), list(&["1|a|b||0|"]), true))
        );
        assert_eq!(
            read(r#"{"status":"A","status":"B"}"#),
            Some(("B".into(), None, false))
        );
        // Not a status.
        assert_eq!(read(r#"{"status":7}"#), None);
        assert_eq!(read(r#"["status"]"#), None);
        assert_eq!(read("not json"), None);
        assert!(fields(None).is_none());
    }

    #[test]
    fn ids_name_their_time_and_statuses_are_recognised() {
        let id = transition_id(1_764_000_000_123, "jid0000000001", 7, 0);
        assert_eq!(id, "1764000000123-jid0000000001-7-0");
        assert_eq!(transition_id_time(&id), Some(1_764_000_000_123));
        assert_eq!(transition_id_time("1764000000123-3"), None);
        assert_eq!(transition_id_time("nonsense"), None);
        // Exactly thirteen digits, then exactly three parts.
        for other in [
            "1764000000123-a-b",
            "1764000000123-a-b-c-d",
            "17640000001234-a-b-c",
            "176400000012-a-b-c",
            "-764000000123-a-b-c",
            "1764000000123a-b-c",
        ] {
            assert_eq!(transition_id_time(other), None, "{other}");
        }
        assert_eq!(
            transition_id_time("1764000000123---"),
            Some(1_764_000_000_123)
        );
        for (t, v, k) in [(0, 0, 0), (7, -3, 12), (u64::MAX, i32::MIN, usize::MAX)] {
            assert_eq!(
                transition_id(t, "x", v, k),
                format!("{t:013}-x-{v}-{k}"),
                "as formatted"
            );
        }
        assert_eq!(
            transition_id_at_most(&id, 1_764_000_000_000),
            "1764000000000-jid0000000001-7-0"
        );
        assert_eq!(transition_id_at_most(&id, 1_764_000_000_500), id);
        assert_eq!(transition_id_at_most("nonsense", 5), "nonsense");
        assert_eq!(
            status_of("/jobs/jid0000000001/status"),
            Some(("job", "jid0000000001"))
        );
        assert_eq!(
            status_of("/batches/bid0000000001/status"),
            Some(("batch", "bid0000000001"))
        );
        assert_eq!(status_of("/jobs/states/Pending/05-jid0000000001"), None);
        assert_eq!(status_of("/jobs/jid0000000001/lock"), None);
        assert_eq!(status_of("/batches/bid0000000001/states/status"), None);
    }
}
