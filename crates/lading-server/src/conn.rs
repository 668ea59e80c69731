//! The accept loop: HTTP/1.1 connections served by hyper under Lading's limits.
//!
//! - **Header timeout**: a client has `header_timeout` to send a request's headers, counted
//!   from when the connection opens or its previous response ended (so it is also the
//!   keep-alive idle timeout). Idle and half-sent-header connections are closed.
//! - **Connection cap**: at most `max_connections` open. At the cap, a new connection makes
//!   room by closing the connection that has been idle longest (no request in progress);
//!   failing that, the one whose request has waited longest in its handler (a slow body, a
//!   long-poll); failing that, the oldest streaming connection (a download, the event
//!   stream) of the client holding the most streams. So a flood of idle, half-sent,
//!   slow-body or streaming connections cannot lock anyone out.
//! - **Streams per client**: one client holds at most `max_streams_per_client` streaming
//!   requests (`/api/v1/events`, downloads) at once; more are answered 429 at once. A client
//!   is the authenticated identity — the token's name, however its header is spelt (bearer
//!   in any case or spacing, Basic with or without padding) — or, for a request whose
//!   credentials do not authenticate, its address. Eviction for room never closes a stream
//!   of a client under its own cap.
//! - **Request timeout**: an ordinary request (reading its body included) gets
//!   `request_timeout`, then 408; long-polls, the event stream and uploads (`/api/v1`'s and
//!   Merritt's submission routes) are exempt.
//! - On shutdown, no new connection is taken and open ones finish their requests, for at most
//!   [`DRAIN`]; then they are closed.

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
// Tokio's: the simulator's paused time orders connections as the real clock would.
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// How long stopping waits for busy connections (a long download) before closing them.
pub const DRAIN: Duration = Duration::from_secs(5);

/// The limits of [`serve`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    /// Time an ordinary request may take, reading its body included (408 after).
    pub request_timeout: Duration,
    /// Streaming requests one client may have open at once.
    pub max_streams_per_client: usize,
}

impl From<&lading_ingest::HttpSettings> for Limits {
    fn from(h: &lading_ingest::HttpSettings) -> Limits {
        Limits {
            max_connections: h.max_connections.max(1),
            header_timeout: Duration::from_secs(h.header_timeout_s.max(1)),
            request_timeout: Duration::from_secs(h.request_timeout_s.max(1)),
            max_streams_per_client: h.max_streams_per_client.max(1),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::from(&lading_ingest::HttpSettings::default())
    }
}

/// One open connection, as the cap sees it.
struct Conn {
    state: Arc<ConnState>,
    /// Finish what is in progress, then close.
    close: CancellationToken,
    /// Close now (a stream evicted for room never finishes by itself).
    kill: CancellationToken,
}

/// What a connection is doing, as the cap sees it.
#[derive(Default)]
struct ConnState {
    /// Requests in progress (a response counts until its body is done).
    active: AtomicUsize,
    /// Requests still in their handler (reading the body, waiting in a long-poll).
    in_handler: AtomicUsize,
    /// When its state last changed (ms since the loop started).
    since: AtomicU64,
    /// Streaming requests in progress, and the client they are counted to.
    streaming: AtomicUsize,
    client: Mutex<Option<Client>>,
}

/// Who holds a connection's streams: a digest of its token's name, or of its address.
type Client = [u8; 32];

/// The client a request counts to: the name of the token its credentials authenticate (by
/// `auth`, as the router will), else its address.
fn client_of(
    req: &Request<hyper::body::Incoming>,
    peer: std::net::SocketAddr,
    auth: Option<&crate::auth::Auth>,
) -> Client {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    let header = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match auth.and_then(|a| a.check(header).ok()) {
        Some(p) => {
            h.update(b"token\0");
            h.update(p.name.as_bytes());
        }
        None => {
            h.update(b"address\0");
            h.update(peer.ip().to_string().as_bytes());
        }
    }
    h.finalize().into()
}

/// Streaming requests in progress per client.
#[derive(Default)]
struct Streams(Mutex<HashMap<Client, usize>>);

/// One streaming request counted to its client (and its connection) until dropped.
struct Stream {
    streams: Arc<Streams>,
    state: Arc<ConnState>,
    client: Client,
}

impl Streams {
    /// Counts a stream of `client` on `state`'s connection, unless it holds `max` already.
    fn enter(
        self: &Arc<Self>,
        client: Client,
        state: &Arc<ConnState>,
        max: usize,
    ) -> Option<Stream> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(client).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        state.streaming.fetch_add(1, Ordering::AcqRel);
        *state.client.lock().unwrap_or_else(|p| p.into_inner()) = Some(client);
        Some(Stream {
            streams: self.clone(),
            state: state.clone(),
            client,
        })
    }

    fn held(&self, client: &Client) -> usize {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(client).copied().unwrap_or(0)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.state.streaming.fetch_sub(1, Ordering::AcqRel);
        let mut m = self.streams.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.client);
            }
        }
    }
}

/// Open connections by number.
#[derive(Default)]
struct Table {
    next: u64,
    open: HashMap<u64, Conn>,
}

impl Table {
    /// Makes room for one more under `max`: true if there is (perhaps after closing the
    /// connection idle longest, or failing any idle or waiting one, the oldest stream of the
    /// client holding most).
    fn room(&mut self, max: usize, streams: &Streams, per_client: usize) -> bool {
        if self.open.len() < max {
            return true;
        }
        if !self.evict_idle() {
            return self.evict_stream(streams, per_client);
        }
        true
    }

    /// Closes the oldest stream of the client holding most, if that client is at its cap
    /// (`per_client`): a client under its own cap never loses a stream to make room.
    fn evict_stream(&mut self, streams: &Streams, per_client: usize) -> bool {
        let victim = self
            .open
            .iter()
            .filter(|(_, c)| {
                !c.kill.is_cancelled() && c.state.streaming.load(Ordering::Acquire) > 0
            })
            .filter_map(|(id, c)| {
                let client = (*c.state.client.lock().unwrap_or_else(|p| p.into_inner()))?;
                let since = c.state.since.load(Ordering::Relaxed);
                let held = streams.held(&client);
                (held >= per_client).then_some(((std::cmp::Reverse(held), since), *id))
            })
            .min()
            .map(|(_, id)| id);
        match victim.and_then(|id| self.open.remove(&id)) {
            Some(c) => {
                c.kill.cancel();
                true
            }
            None => false,
        }
    }

    fn evict_idle(&mut self) -> bool {
        // Idle first (rank 0), then waiting in a handler (rank 1); oldest first.
        let victim = self
            .open
            .iter()
            .filter(|(_, c)| !c.close.is_cancelled())
            .filter_map(|(id, c)| {
                let active = c.state.active.load(Ordering::Acquire);
                let in_handler = c.state.in_handler.load(Ordering::Acquire);
                let rank = match (active, in_handler) {
                    (0, _) => 0,
                    (a, h) if a == h => 1,
                    _ => return None,
                };
                Some(((rank, c.state.since.load(Ordering::Relaxed)), *id))
            })
            .min()
            .map(|(_, id)| id);
        match victim {
            Some(id) => {
                if let Some(c) = self.open.remove(&id) {
                    c.close.cancel();
                }
                true
            }
            None => false,
        }
    }
}

impl ConnState {
    fn touch(&self, epoch: Instant) {
        self.since
            .store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// Counts a request in progress on its connection until dropped.
struct Active {
    state: Arc<ConnState>,
    epoch: Instant,
}

impl Active {
    fn new(state: &Arc<ConnState>, epoch: Instant) -> Active {
        state.touch(epoch);
        state.active.fetch_add(1, Ordering::AcqRel);
        Active {
            state: state.clone(),
            epoch,
        }
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.state.touch(self.epoch);
        self.state.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts a request as in its handler until dropped.
struct InHandler(Arc<ConnState>);

impl InHandler {
    fn new(state: &Arc<ConnState>) -> InHandler {
        state.in_handler.fetch_add(1, Ordering::AcqRel);
        InHandler(state.clone())
    }
}

impl Drop for InHandler {
    fn drop(&mut self) {
        self.0.in_handler.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted as in progress (and as its client's
/// stream, if it is one) until it ends.
struct Counted {
    inner: Body,
    _active: Active,
    _stream: Option<Stream>,
}

impl http_body::Body for Counted {
    type Data = axum::body::Bytes;
    type Error = axum::Error;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Bytes a connection's read buffer holds at most, the request's head included.
pub const READ_BUFFER: usize = 64 << 10;

/// Requests that may take long by design: long-polls, the event stream and uploads.
fn is_long(path: &str) -> bool {
    path == "/api/v1/batches/upload"
        || crate::merritt::is_upload_route(path)
        || path == "/api/v1/subscriptions/wait"
        || path == "/api/v1/events"
        || path.ends_with("/accept")
        || path.ends_with("/finish-and-accept")
}

/// Requests that answer with a stream that lasts: the event stream and downloads.
fn is_stream(path: &str) -> bool {
    path == "/api/v1/events"
        || (path.starts_with("/api/v1/")
            && (path.ends_with("/download") || path.ends_with("/file")))
}

/// The answer to a client over its streams.
fn too_many_streams(max: usize) -> axum::response::Response {
    use axum::response::IntoResponse;
    crate::ApiError::new(
        axum::http::StatusCode::TOO_MANY_REQUESTS,
        "too_many_streams",
        format!(
            "this client already holds {max} streams (event streams and downloads) open; close one first (http.max_streams_per_client)"
        ),
    )
    .into_response()
}

/// The answer to a request that ran out of time. A streamed response is never cut: its
/// handler has returned by then.
fn timed_out(after: Duration) -> axum::response::Response {
    use axum::response::IntoResponse;
    crate::ApiError::new(
        axum::http::StatusCode::REQUEST_TIMEOUT,
        "timeout",
        format!(
            "the request took longer than {} s (http.request_timeout_s)",
            after.as_secs()
        ),
    )
    .into_response()
}

/// Where connections come from: a TCP listener, or the simulator's connections in memory.
pub trait Accept: Send + 'static {
    type Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    /// The next connection and its peer's address.
    fn accept(
        &mut self,
    ) -> impl std::future::Future<Output = std::io::Result<(Self::Io, std::net::SocketAddr)>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&mut self) -> std::io::Result<(Self::Io, std::net::SocketAddr)> {
        let (stream, peer) = tokio::net::TcpListener::accept(self).await?;
        let _ = stream.set_nodelay(true);
        Ok((stream, peer))
    }
}

/// Serves `app` on `listener` under `limits` until `shutdown` completes; then waits for the
/// open connections to finish their requests.
pub async fn serve<L: Accept>(
    mut listener: L,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    limits: Limits,
    auth: Option<Arc<crate::auth::Auth>>,
) -> std::io::Result<()> {
    let epoch = Instant::now();
    let table = Arc::new(Mutex::new(Table::default()));
    let streams = Arc::new(Streams::default());
    let stop = CancellationToken::new();
    // Cuts off connections still busy when the drain time is up.
    let force = CancellationToken::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let tracker = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            // In order, not at random: a run is the same every time (`lading-sim`).
            biased;
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors and the like: wait a little, never spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let (id, conn) = {
            let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
            if !t.room(
                limits.max_connections,
                &streams,
                limits.max_streams_per_client,
            ) {
                drop(stream);
                continue;
            }
            let conn = Conn {
                state: Arc::new(ConnState::default()),
                close: stop.child_token(),
                kill: CancellationToken::new(),
            };
            conn.state.touch(epoch);
            let id = t.next;
            t.next += 1;
            let handles = (conn.state.clone(), conn.close.clone(), conn.kill.clone());
            t.open.insert(id, conn);
            (id, handles)
        };
        let (state, close, kill) = conn;
        let app = app.clone();
        let table = table.clone();
        let force = force.clone();
        let streams = streams.clone();
        let auth = auth.clone();
        tracker.spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let counted = Active::new(&state, epoch);
                let in_handler = InHandler::new(&state);
                let app = app.clone();
                let path = req.uri().path();
                let long = is_long(path);
                let stream = is_stream(path).then(|| {
                    let client = client_of(&req, peer, auth.as_deref());
                    streams.enter(client, &state, limits.max_streams_per_client)
                });
                async move {
                    let stream = match stream {
                        Some(None) => {
                            return Ok(too_many_streams(limits.max_streams_per_client));
                        }
                        Some(s) => s,
                        None => None,
                    };
                    let call = app.oneshot(req.map(Body::new));
                    let resp = if long {
                        call.await?
                    } else {
                        match tokio::time::timeout(limits.request_timeout, call).await {
                            Ok(r) => r?,
                            Err(_) => timed_out(limits.request_timeout),
                        }
                    };
                    drop(in_handler);
                    Ok::<_, std::convert::Infallible>(resp.map(|b| {
                        Body::new(Counted {
                            inner: b,
                            _active: counted,
                            _stream: stream,
                        })
                    }))
                }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                // The connection's read buffer: a request's head must fit, and a body is
                // read through it, so this bounds what each connection holds (hyper's own
                // default is about 400 KiB).
                .max_buf_size(READ_BUFFER)
                .keep_alive(true);
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                // In order, not at random: a run is the same every time (`lading-sim`).
                biased;
                _ = conn.as_mut() => {}
                _ = kill.cancelled() => {}
                _ = close.cancelled() => {
                    // Evicted or stopping: finish what is in progress, take nothing new
                    // (cut off when the server's drain time is up).
                    conn.as_mut().graceful_shutdown();
                    tokio::select! {
                        // In order, not at random: a run is the same every time (`lading-sim`).
                        biased;
                        _ = conn.as_mut() => {}
                        _ = force.cancelled() => {}
                        _ = kill.cancelled() => {}
                    }
                }
            }
            table
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .open
                .remove(&id);
        });
    }
    drop(listener);
    stop.cancel();
    tracker.close();
    if tokio::time::timeout(DRAIN, tracker.wait()).await.is_err() {
        tracing::warn!(
            "connections still busy after {} s; closing them",
            DRAIN.as_secs()
        );
        force.cancel();
        tracker.wait().await;
    }
    Ok(())
}

/// Raises this process's soft limit of open files to its hard limit; returns the limit.
pub fn raise_open_files() -> usize {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
    }
    r.rlim_cur.min(1 << 20) as usize
}
