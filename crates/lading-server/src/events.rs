//! `GET /api/v1/events`: batch and job transitions as server-sent events, resumable.
//!
//! The transitions come from the tree's change stream (see `lading_engine::Engine::
//! follow_transitions`), so they are every writer's: this process's stages, `lading worker`
//! processes on other hosts, Merritt's own tools. Each has an id that names the status change
//! it comes from (`MTIME-ID-VERSION-K`), and the last [`KEPT`] are kept in memory. A client
//! that reconnects with `Last-Event-ID` (or `?last_event_id=`) gets every event after that
//! one, then the live ones: from memory when the id is still kept (nothing lost or repeated,
//! as replay and subscription are taken under one lock); else, after a server restart or a
//! long absence, from the tree itself: every transition of a job or batch whose status
//! changed since a minute before the id's time (a writer stamps a transition before its
//! commit, and what a gap in the follower's feed hid is reported late), so transitions of
//! that last minute may come again (`lading_engine::Engine::transitions_since`). That reading
//! is made by the follower between two of its reports, through the feed's own reads, and
//! the live events start after the last report it had made: nothing falls between the
//! two, whichever session saw a commit first (see `lading_engine::Past`). A `reset` event
//! says that some may have been missed (the tree could not be read after a gap in its change
//! feed, or the client fell too far behind): re-read the state.

use crate::overview::lock;
use crate::{ApiError, AppState, Principal, Query, Role};
use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream, StreamExt};
use lading_engine::{ChangeEvent, ChangeKind, Engine, EngineError, Observed, Past, Task};
use serde::Deserialize;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;

/// Events kept for clients that reconnect.
pub const KEPT: usize = 10_000;

/// (place in the ring, event id, event); `None` for a reset.
type Item = (u64, Option<(Arc<str>, Arc<ChangeEvent>)>);

struct Ring {
    events: VecDeque<(u64, Arc<str>, Arc<ChangeEvent>)>,
    next: u64,
    /// Events kept at most ([`KEPT`] in a server).
    kept: usize,
}

/// What a client of the hub is sent, in order.
#[derive(Debug, Clone)]
pub enum Sent {
    /// A transition and its id.
    Change(Arc<str>, Arc<ChangeEvent>),
    /// Some may have been missed: re-read the state.
    Reset,
}

/// Keeps the recent transitions and hands them to subscribers.
pub struct EventHub {
    engine: Arc<Engine>,
    ring: Mutex<Ring>,
    tx: broadcast::Sender<Item>,
    /// Jobs ended per minute, for the console's overview.
    tally: Arc<crate::overview::Tally>,
    /// The follower's reading of the past (none without a change feed).
    past: std::sync::OnceLock<Past>,
    /// From when the follower reports transitions (ms since the epoch); those before are the
    /// past.
    live_from: std::sync::atomic::AtomicU64,
}

/// Where a resuming client starts.
enum Resume {
    /// New client: live events only.
    Live,
    /// The kept events after its last.
    Kept(Vec<Item>),
    /// Its last is not kept: read the tree from that time.
    FromTree(u64),
    /// Its last is unreadable: a reset.
    Unknown,
}

impl EventHub {
    /// Starts following the tree's transitions (or, on a backend without a change feed,
    /// this engine's own). The hub is fed by the tasks returned with it, each named: the
    /// caller runs them (a process, as services of its supervisor, so that one that fails is
    /// heard of); until they run, nothing reaches the hub.
    pub async fn start(
        engine: &Arc<Engine>,
    ) -> Result<(Arc<EventHub>, Vec<(&'static str, Task)>), EngineError> {
        Self::start_keeping(engine, KEPT).await
    }

    /// [`EventHub::start`], keeping the last `kept` events (the simulator keeps few, so its
    /// clients come back both to kept events and to the tree).
    pub async fn start_keeping(
        engine: &Arc<Engine>,
        kept: usize,
    ) -> Result<(Arc<EventHub>, Vec<(&'static str, Task)>), EngineError> {
        let hub = Arc::new(EventHub {
            engine: engine.clone(),
            ring: Mutex::new(Ring {
                events: VecDeque::new(),
                next: 1,
                kept: kept.max(1),
            }),
            tx: broadcast::channel(4096).0,
            tally: Arc::new(crate::overview::Tally::new(
                engine.clock().now_ms() / 1000 * 1000,
            )),
            past: std::sync::OnceLock::new(),
            live_from: std::sync::atomic::AtomicU64::new(engine.clock().now_ms()),
        });
        let h = Arc::downgrade(&hub);
        let mut tasks: Vec<(&'static str, Task)> = Vec::new();
        match engine.follow_transitions().await? {
            Some(f) => {
                hub.tally.set_live_from(f.reported_from);
                hub.live_from
                    .store(f.reported_from, std::sync::atomic::Ordering::Relaxed);
                let _ = hub.past.set(f.past);
                let mut rx = f.reports;
                tasks.push(("event follower", f.run));
                // One push per report, in order: the ring's places count the reports.
                tasks.push((
                    "event hub",
                    Box::pin(async move {
                        while let Some(o) = rx.recv().await {
                            let Some(hub) = h.upgrade() else { return };
                            match o {
                                Observed::Transition(id, ev) => {
                                    hub.push(Some((id.into(), Arc::from(ev))))
                                }
                                Observed::Lost => hub.push(None),
                            }
                        }
                    }),
                ));
            }
            None => {
                let mut rx = engine.subscribe();
                tasks.push((
                    "event hub",
                    Box::pin(async move {
                        let mut n = 0u64;
                        loop {
                            let ev = rx.recv().await;
                            let Some(hub) = h.upgrade() else { return };
                            match ev {
                                Ok(ev) => {
                                    n += 1;
                                    let ms = ev.time.ms();
                                    let id =
                                        lading_engine::transition_id(ms, &ev.id, 0, n as usize);
                                    hub.push(Some((id.into(), ev.into())));
                                }
                                Err(broadcast::error::RecvError::Lagged(_)) => hub.push(None),
                                Err(broadcast::error::RecvError::Closed) => return,
                            }
                        }
                    }),
                ));
            }
        }
        // The last hour read back while the server starts serving (counted once each).
        let (tally, engine) = (hub.tally.clone(), engine.clone());
        tasks.push((
            "event tally",
            Box::pin(async move { tally.read_back(&engine).await }),
        ));
        Ok((hub, tasks))
    }

    /// From when this hub reports transitions as they happen (ms since the epoch).
    pub fn live_from(&self) -> u64 {
        self.live_from.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the event `id` is still kept (a client coming back after it is sent what
    /// follows from memory; else, from the tree).
    pub fn keeps(&self, id: &str) -> bool {
        let r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        r.events.iter().any(|(_, i, _)| &**i == id)
    }

    /// Jobs ended per minute, and the overview's other figures.
    pub fn tally(&self) -> &crate::overview::Tally {
        &self.tally
    }

    fn push(&self, ev: Option<(Arc<str>, Arc<ChangeEvent>)>) {
        if let Some((_, e)) = &ev {
            self.tally.note(e, self.engine.clock().now_ms());
        }
        let mut r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let seq = r.next;
        r.next += 1;
        if let Some((id, e)) = &ev {
            if r.events.len() >= r.kept {
                r.events.pop_front();
            }
            r.events.push_back((seq, id.clone(), e.clone()));
        }
        // Sent under the lock, so a subscriber taken under it sees each event once.
        let _ = self.tx.send((seq, ev));
    }

    /// What follows `last` (an event id), and a receiver for the live ones.
    fn resume(&self, last: Option<&str>) -> (Resume, broadcast::Receiver<Item>) {
        let r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let rx = self.tx.subscribe();
        let Some(last) = last else {
            return (Resume::Live, rx);
        };
        if let Some(i) = r.events.iter().position(|(_, id, _)| &**id == last) {
            let after = r
                .events
                .iter()
                .skip(i + 1)
                .map(|(s, id, e)| (*s, Some((id.clone(), e.clone()))))
                .collect();
            return (Resume::Kept(after), rx);
        }
        match lading_engine::transition_id_time(last) {
            Some(ms) => (Resume::FromTree(ms), rx),
            None => (Resume::Unknown, rx),
        }
    }

    /// What a client that last saw `last` (an event id; `None` for a new client) is sent:
    /// every event after it, then the live ones, of `batch` and its jobs only when given. This
    /// is the stream `GET /api/v1/events` serves.
    pub async fn follow(
        self: &Arc<Self>,
        last: Option<&str>,
        batch: Option<lading_core::layout::BatchId>,
    ) -> lading_engine::Result<impl Stream<Item = Sent> + Send + 'static + use<>> {
        let filter = batch.map(|b| b.to_string());
        let (resume, rx) = self.resume(last);
        let mut head = Vec::new();
        // Ids read from the tree, so the same transition arriving live is not sent twice.
        let mut sent: foldhash::HashSet<Arc<str>> = Default::default();
        // Live events at or before this place were in what was read from the tree.
        let mut read_up_to = 0u64;
        match resume {
            Resume::Live => {}
            Resume::Unknown => head.push(Sent::Reset),
            Resume::Kept(items) => {
                for (_, ev) in items {
                    match ev {
                        Some((id, ev)) if matches(filter.as_deref(), &ev) => {
                            head.push(Sent::Change(id, ev))
                        }
                        Some(_) => {}
                        None => head.push(Sent::Reset),
                    }
                }
            }
            Resume::FromTree(ms) => {
                let b = filter
                    .as_deref()
                    .map(lading_core::layout::BatchId::parse)
                    .transpose()
                    .map_err(|e| lading_engine::EngineError::Invalid(e.to_string()))?;
                let past = match self.past.get() {
                    Some(p) => {
                        let (n, past) = p.since(ms, b.as_ref()).await?;
                        read_up_to = n;
                        past
                    }
                    None => self.engine.transitions_since(ms, b.as_ref()).await?,
                };
                // In the ring's order where the ring keeps them, after those it does not keep
                // (oldest first): a client that goes away after one of them and comes back with
                // its id is sent from the ring what follows it there, so nothing it was not
                // sent may come before it there. In time order, a client that went away
                // halfway through missed the rest of this reading for good (found by
                // `lading-sim`, seeds 775674619 and 775676781).
                let mut past: Vec<(Option<u64>, String, ChangeEvent)> = {
                    let r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
                    let places: foldhash::HashMap<&str, u64> =
                        r.events.iter().map(|(s, id, _)| (&**id, *s)).collect();
                    past.into_iter()
                        .map(|(id, ev)| (places.get(id.as_str()).copied(), id, ev))
                        .collect()
                };
                past.sort_by_key(|(place, _, _)| *place);
                // A client that goes away after an item read from the tree comes back with its
                // id and is sent from the tree what changed since the id's time, less the
                // reading's minute: each such id names a time no later than any item after it
                // here (the ring's too). Named for its status's last change, an old entry of a
                // status changed since went out with a late time, and items after it more than
                // a minute older than that time were missed for good (found by `lading-sim`,
                // seeds 537657220, 537663386, 537663421 and 537664513 on d65410c).
                let mut floor = u64::MAX;
                for (place, id, ev) in past.iter_mut().rev() {
                    floor = floor.min(ev.time.ms());
                    if place.is_none() {
                        *id = lading_engine::transition_id_at_most(id, floor);
                    }
                }
                sent.reserve(past.len());
                for (_, id, ev) in past {
                    if id != last.unwrap_or_default() && matches(filter.as_deref(), &ev) {
                        let id: Arc<str> = id.into();
                        sent.insert(id.clone());
                        head.push(Sent::Change(id, Arc::new(ev)));
                    }
                }
            }
        }
        let live = stream::unfold(
            (rx, filter, sent),
            move |(mut rx, filter, sent)| async move {
                loop {
                    let out = match rx.recv().await {
                        Ok((seq, _)) if seq <= read_up_to => continue,
                        Ok((_, Some((id, ev))))
                            if matches(filter.as_deref(), &ev) && !sent.contains(&id) =>
                        {
                            Sent::Change(id, ev)
                        }
                        Ok((_, Some(_))) => continue,
                        Ok((_, None)) | Err(broadcast::error::RecvError::Lagged(_)) => Sent::Reset,
                        Err(broadcast::error::RecvError::Closed) => return None,
                    };
                    return Some((out, (rx, filter, sent)));
                }
            },
        );
        Ok(stream::iter(head).chain(live))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only this batch and its jobs.
    batch: Option<String>,
    last_event_id: Option<String>,
}

fn matches(filter: Option<&str>, ev: &ChangeEvent) -> bool {
    match filter {
        None => true,
        Some(b) => ev.batch.as_deref() == Some(b) || (ev.kind == ChangeKind::Batch && ev.id == b),
    }
}

/// Which batches a submitter owns, learnt as their events pass (at most 10,000 remembered).
#[derive(Clone)]
struct Owned {
    engine: Arc<Engine>,
    name: String,
    known: Arc<Mutex<std::collections::HashMap<String, bool>>>,
}

impl Owned {
    fn new(engine: Arc<Engine>, name: String) -> Owned {
        Owned {
            engine,
            name,
            known: Default::default(),
        }
    }

    /// Whether `ev` is of a batch (or a job of a batch) this submitter submitted.
    async fn owns(&self, ev: &ChangeEvent) -> bool {
        let Some(bid) = ev
            .batch
            .clone()
            .or_else(|| (ev.kind == ChangeKind::Batch).then(|| ev.id.clone()))
        else {
            return false;
        };
        if let Some(k) = lock(&self.known).get(&bid) {
            return *k;
        }
        let mine = match lading_core::layout::BatchId::parse(&bid) {
            Ok(b) => self
                .engine
                .batch(&b)
                .await
                .is_ok_and(|info| info.submission.submitter() == Some(&self.name)),
            Err(_) => false,
        };
        let mut known = lock(&self.known);
        if known.len() >= 10_000 {
            known.clear();
        }
        known.insert(bid, mine);
        mine
    }
}

#[utoipa::path(get, path = "/api/v1/events", tag = "events", summary = "Committed batch and job changes as server-sent events", params(("batch" = Option<String>, Query, description = "only this batch and its jobs"), ("last_event_id" = Option<String>, Query, description = "resume after this event (or the Last-Event-ID header)")), responses((status = 200, description = "text/event-stream of `change` and `reset` events", content_type = "text/event-stream"), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this"), (status = 404, description = "no such batch (or not yours)")))]
pub async fn events(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    headers: HeaderMap,
    Query(q): Query<EventsQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let filter = match (&q.batch, p.role) {
        (Some(b), _) => {
            // A submitter may follow its own batches only; the id is checked either way.
            let info = crate::batches::visible_batch(&s, &p, b).await?;
            Some(info.id.to_string())
        }
        (None, Role::Admin | Role::Submitter) => None,
        (None, Role::Processor) => {
            return Err(ApiError::forbidden(
                "a processor token has no batches to follow",
            ));
        }
    };
    // A submitter without a batch named follows every batch of its own, and nothing else.
    let own = (filter.is_none() && p.role == Role::Submitter)
        .then(|| Owned::new(s.ingest.engine.clone(), p.name.clone()));
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or(q.last_event_id);
    let batch = match &filter {
        Some(b) => Some(
            lading_core::layout::BatchId::parse(b)
                .map_err(|e| ApiError::bad_request(e.to_string()))?,
        ),
        None => None,
    };
    let sent = s
        .events
        .follow(last.as_deref(), batch)
        .await
        .map_err(ApiError::from)?;
    let admin = p.role == Role::Admin;
    // Hosts and messages are the operator's: a submitter sees states and times.
    let to_event = move |sent: Sent| match sent {
        Sent::Change(id, ev) => {
            let shown;
            let ev = if admin {
                &*ev
            } else {
                shown = ChangeEvent {
                    host: None,
                    message: None,
                    ..(*ev).clone()
                };
                &shown
            };
            // Encoded whole, then written once: `json_data` hands the SSE writer each piece
            // the encoder makes, and it scans every one for line breaks (a tenth of the
            // stream's time in `lading-sim`).
            match serde_json::to_string(ev) {
                Ok(data) => Event::default().id(&*id).event("change").data(data),
                Err(_) => Event::default().comment("unencodable event"),
            }
        }
        Sent::Reset => Event::default()
            .event("reset")
            .data("some events were missed; re-read the state"),
    };
    let mut stopping = s.stopping.clone();
    let all = sent
        .take_until(async move { stopping.stopped().await })
        .filter_map(move |x| {
            let own = own.clone();
            async move {
                match (&own, &x) {
                    (Some(own), Sent::Change(_, ev)) if !own.owns(ev).await => None,
                    _ => Some(x),
                }
            }
        })
        .map(move |x| Ok(to_event(x)));
    Ok(Sse::new(all).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}
