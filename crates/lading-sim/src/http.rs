//! Lading's HTTP server on simulated connections: [`Listener`] hands connections made in
//! memory (`tokio::io::duplex`) to the real accept loop (`lading_server::serve`, with its
//! limits), and [`follow`] is an event-stream client over one, speaking HTTP/1.1 through
//! hyper and reading the server-sent events off the wire as a browser would. Nothing leaves
//! the process, and on the simulator's one thread every byte moves in the same order each run.

use futures_util::Stream;
use hyper_util::rt::TokioIo;
use lading_engine::{ChangeEvent, ChangeKind};
use lading_server::events::Sent;
use std::borrow::Cow;
use std::sync::Arc;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;

/// The address every simulated client connects from.
const PEER: ([u8; 4], u16) = ([10, 0, 0, 9], 40_000);

/// The bytes a connection buffers each way. What the server wrote ahead of the event
/// client is thrown away when the client goes away: with 64 KiB, three events in four
/// the server sent (each made and written) were never read.
const PIPE: usize = 8 << 10;

/// The longest line, and the most data lines of one event, read (a transition's JSON is a
/// few hundred bytes on one line).
const MAX_LINE: usize = 64 << 10;
const MAX_DATA_LINES: usize = 16;

/// The server's end of the simulated connections.
pub struct Listener(mpsc::UnboundedReceiver<DuplexStream>);

impl lading_server::conn::Accept for Listener {
    type Io = DuplexStream;
    async fn accept(&mut self) -> std::io::Result<(DuplexStream, std::net::SocketAddr)> {
        match self.0.recv().await {
            Some(io) => Ok((io, PEER.into())),
            // No client may connect any more: nothing comes until the server stops.
            None => std::future::pending().await,
        }
    }
}

/// Where clients connect: each connection is a pipe whose far end the listener takes.
#[derive(Clone)]
pub struct Connector(mpsc::UnboundedSender<DuplexStream>);

/// A listener and the connector that reaches it.
pub fn pair() -> (Listener, Connector) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Listener(rx), Connector(tx))
}

impl Connector {
    fn connect(&self) -> Result<DuplexStream, String> {
        let (client, server) = tokio::io::duplex(PIPE);
        self.0
            .send(server)
            .map_err(|_| "the server is gone".to_string())?;
        Ok(client)
    }
}

/// `GET /api/v1/events` with `token`, resuming after `last` (the `Last-Event-ID` header):
/// what the stream sends, decoded from its `id:`, `event:` and `data:` lines. The stream ends
/// when the server ends the response or the connection breaks; dropping it closes the
/// connection, as a client that goes away does.
pub async fn follow(
    to: &Connector,
    token: &str,
    last: Option<&str>,
) -> Result<impl Stream<Item = Sent> + Unpin + use<>, String> {
    let io = to.connect()?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    // The connection's task ends when the response is dropped with the stream.
    let driving = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = hyper::Request::get("/api/v1/events")
        .header("host", "lading.sim")
        .header("authorization", format!("Bearer {token}"))
        .header("accept", "text/event-stream");
    if let Some(l) = last {
        req = req.header("last-event-id", l);
    }
    let req = req.body(Empty).map_err(|e| e.to_string())?;
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| format!("GET /api/v1/events: {e}"))?;
    let kind = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    if resp.status() != 200 || !kind.starts_with("text/event-stream") {
        return Err(format!(
            "GET /api/v1/events answered {} ({kind})",
            resp.status()
        ));
    }
    let reader = Reader {
        body: resp.into_body(),
        buf: Vec::new(),
        at: 0,
        event: Fields::default(),
        _send: send,
        _driving: Abort(driving),
    };
    Ok(Box::pin(futures_util::stream::unfold(
        reader,
        |mut r| async move { r.next().await.map(|s| (s, r)) },
    )))
}

/// A body with nothing in it.
struct Empty;

impl http_body::Body for Empty {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Ready(None)
    }
    fn is_end_stream(&self) -> bool {
        true
    }
}

/// Stops the connection's task when the stream is dropped.
struct Abort(tokio::task::JoinHandle<()>);

impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The fields of the event being read.
#[derive(Default)]
struct Fields {
    id: Option<String>,
    event: Option<String>,
    data: Vec<String>,
}

struct Reader {
    body: hyper::body::Incoming,
    /// Bytes read; those before `at` are lines already taken.
    buf: Vec<u8>,
    at: usize,
    event: Fields,
    _send: hyper::client::conn::http1::SendRequest<Empty>,
    _driving: Abort,
}

impl Reader {
    /// The next event sent; `None` once the response ends (or breaks, or sends what is not
    /// an event stream: that is in the trace as an event missing).
    async fn next(&mut self) -> Option<Sent> {
        loop {
            while let Some(end) = self.buf[self.at..].iter().position(|b| *b == b'\n') {
                let line = &self.buf[self.at..self.at + end];
                self.at += end + 1;
                let line = std::str::from_utf8(line).ok()?;
                let line = line.trim_end_matches('\r');
                if line.is_empty() {
                    let ev = std::mem::take(&mut self.event);
                    if let Some(s) = decode(ev) {
                        return Some(s);
                    }
                    continue;
                }
                // A comment (the keep-alive) says nothing.
                if line.starts_with(':') {
                    continue;
                }
                let (field, value) = line.split_once(':').unwrap_or((line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value).to_string();
                match field {
                    "id" => self.event.id = Some(value),
                    "event" => self.event.event = Some(value),
                    "data" if self.event.data.len() < MAX_DATA_LINES => self.event.data.push(value),
                    // More data than any event of the hub's: not an event stream.
                    "data" => return None,
                    _ => {}
                }
            }
            // Lines read are dropped once per frame, not once per line (each drain moved
            // what followed).
            self.buf.drain(..self.at);
            self.at = 0;
            if self.buf.len() > MAX_LINE {
                return None;
            }
            let frame = std::future::poll_fn(|cx| {
                http_body::Body::poll_frame(std::pin::Pin::new(&mut self.body), cx)
            })
            .await?
            .ok()?;
            if let Ok(data) = frame.into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }
}

/// A `change` event's data as the hub writes it (the fields a client reads; others are
/// skipped). Read straight into this, text borrowed where it can be: through a `Value`, the
/// events a seed's client reads were 2% of a run.
#[derive(serde::Deserialize)]
struct Wire<'a> {
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow)]
    batch: Option<Cow<'a, str>>,
    #[serde(borrow)]
    from: Option<Cow<'a, str>>,
    #[serde(borrow)]
    to: Cow<'a, str>,
    #[serde(borrow)]
    time: Cow<'a, str>,
    #[serde(borrow)]
    host: Option<Cow<'a, str>>,
    #[serde(borrow)]
    message: Option<Cow<'a, str>>,
}

/// One event as the hub sent it: a `change` (its id and transition) or a `reset`. `None`
/// for one with no data (nothing to dispatch), of another kind, or whose data is not a
/// change.
fn decode(ev: Fields) -> Option<Sent> {
    if ev.data.is_empty() {
        return None;
    }
    match ev.event.as_deref() {
        Some("reset") => Some(Sent::Reset),
        Some("change") => {
            let joined;
            let data = match &ev.data[..] {
                [one] => one.as_str(),
                lines => {
                    joined = lines.join("\n");
                    joined.as_str()
                }
            };
            let w: Wire = serde_json::from_str(data).ok()?;
            let kind = match &*w.kind {
                "batch" => ChangeKind::Batch,
                "job" => ChangeKind::Job,
                "access" => ChangeKind::Access,
                _ => return None,
            };
            let change = ChangeEvent {
                kind,
                id: w.id.into_owned(),
                batch: w.batch.map(Cow::into_owned),
                from: w.from.map(Cow::into_owned),
                to: w.to.into_owned(),
                time: lading_core::time::Stamp::Text(w.time.into_owned()),
                host: w.host.map(Cow::into_owned),
                message: w.message.map(Cow::into_owned),
            };
            Some(Sent::Change(ev.id?.into(), Arc::new(change)))
        }
        _ => None,
    }
}
