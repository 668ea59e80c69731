//! `GET /api/v1/events`: committed batch and job changes as server-sent events, resumable.
//!
//! Every change this process commits gets an id `EPOCH-SEQ` (EPOCH: when the server started)
//! and is kept in a ring of the last [`KEPT`]. A client that reconnects with `Last-Event-ID`
//! (or `?last_event_id=`) gets every event after that one, then the live ones, with nothing
//! lost or repeated in between: replay and subscription are taken under one lock. When the
//! events it missed are no longer kept (or the server restarted), it gets a `reset` event
//! first and should re-read what it shows.
//!
//! Scope: the changes made through this process's engine — with `lading serve`, every stage.
//! Workers in other processes publish to their own.

use crate::{ApiError, AppState, Principal, Query, Role};
use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream, StreamExt};
use lading_engine::{ChangeEvent, Engine};
use serde::Deserialize;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;

/// Events kept for clients that reconnect.
pub const KEPT: usize = 10_000;

type Item = (u64, Arc<ChangeEvent>);

struct Ring {
    events: VecDeque<Item>,
    next: u64,
    /// Events before this sequence number may be missing (the hub fell behind the engine).
    lost_before: u64,
}

/// Numbers the engine's changes and keeps the recent ones.
pub struct EventHub {
    epoch: u64,
    ring: Mutex<Ring>,
    tx: broadcast::Sender<Item>,
}

impl EventHub {
    /// Starts following `engine`'s changes.
    pub fn start(engine: &Engine) -> Arc<EventHub> {
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let hub = Arc::new(EventHub {
            epoch,
            ring: Mutex::new(Ring {
                events: VecDeque::new(),
                next: 1,
                lost_before: 0,
            }),
            tx: broadcast::channel(4096).0,
        });
        let mut rx = engine.subscribe();
        let h = Arc::downgrade(&hub);
        tokio::spawn(async move {
            loop {
                let ev = rx.recv().await;
                let Some(hub) = h.upgrade() else { return };
                match ev {
                    Ok(ev) => hub.push(ev),
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let mut r = hub.ring.lock().unwrap_or_else(|p| p.into_inner());
                        r.lost_before = r.next;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        hub
    }

    fn push(&self, ev: ChangeEvent) {
        let mut r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let item = (r.next, Arc::new(ev));
        r.next += 1;
        if r.events.len() == KEPT {
            r.events.pop_front();
        }
        r.events.push_back(item.clone());
        // Sent under the lock, so a subscriber taken under it sees each event once.
        let _ = self.tx.send(item);
    }

    fn id(&self, seq: u64) -> String {
        format!("{}-{seq}", self.epoch)
    }

    /// What follows `last` (an id this hub gave out): the kept events after it, whether some
    /// are missing (a reset), and a receiver for the live ones.
    fn resume(&self, last: Option<&str>) -> (Vec<Item>, bool, broadcast::Receiver<Item>) {
        let r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let rx = self.tx.subscribe();
        let Some(last) = last else {
            return (Vec::new(), false, rx);
        };
        let seq = last
            .split_once('-')
            .filter(|(e, _)| e.parse() == Ok(self.epoch))
            .and_then(|(_, s)| s.parse::<u64>().ok());
        let Some(seq) = seq.filter(|s| *s < r.next) else {
            return (Vec::new(), true, rx);
        };
        let oldest = r.events.front().map_or(r.next, |(s, _)| *s);
        let missing = seq + 1 < oldest || seq + 1 < r.lost_before;
        let after = r.events.iter().filter(|(s, _)| *s > seq).cloned().collect();
        (after, missing, rx)
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
        Some(b) => ev.batch.as_deref() == Some(b) || (ev.kind == "batch" && ev.id == b),
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
            Some(info.id)
        }
        (None, Role::Admin) => None,
        (None, Role::Submitter | Role::Processor) => {
            return Err(ApiError::forbidden(
                "a submitter token must name one of its batches (?batch=BID)",
            ));
        }
    };
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or(q.last_event_id);
    let hub = s.events.clone();
    let (replay, reset, rx) = hub.resume(last.as_deref());
    let to_event = {
        let hub = hub.clone();
        move |(seq, ev): &Item| {
            Event::default()
                .id(hub.id(*seq))
                .event("change")
                .json_data(ev.as_ref())
                .unwrap_or_else(|_| Event::default().comment("unencodable event"))
        }
    };
    let reset_event = || {
        Event::default()
            .event("reset")
            .data("some events were missed; re-read the state")
    };
    let mut head = Vec::new();
    if reset {
        head.push(reset_event());
    }
    let f = filter.clone();
    head.extend(
        replay
            .iter()
            .filter(|(_, ev)| matches(f.as_deref(), ev))
            .map(&to_event),
    );
    let stopping = s.stopping.clone();
    let live = stream::unfold(
        (rx, stopping, filter, to_event),
        move |(mut rx, mut stopping, filter, to_event)| async move {
            loop {
                let got = tokio::select! {
                    r = rx.recv() => r,
                    _ = stopping.wait_for(|s| *s) => return None,
                };
                let ev = match got {
                    Ok(item) if matches(filter.as_deref(), &item.1) => to_event(&item),
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(_)) => reset_event(),
                    Err(broadcast::error::RecvError::Closed) => return None,
                };
                return Some((ev, (rx, stopping, filter, to_event)));
            }
        },
    );
    let all = stream::iter(head).chain(live).map(Ok);
    Ok(Sse::new(all).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}
