//! The outside world's callback receiver: an HTTP/1.1 server (hyper's) on a pipe in memory.
//! Lading's callback POST ([`lading_ingest::outbox::callback_of`]: its URL, headers and JSON
//! body) goes to it over hyper's client, and its answer is read as the real deliverer reads
//! one ([`lading_ingest::outbox::callback_answer`]). As the seed says, a connection is slow,
//! closed before the request is read, answered `503` (nothing taken), or takes the callback
//! and goes away before answering (the deliverer sends it again, with the same key). Every
//! callback it takes is handed to `deliver` with its `Idempotency-Key` and its body; one it
//! cannot read is handed over as `{"unreadable": why}`.

use bytes::Bytes;
use hyper_util::rt::TokioIo;
use lading_core::random::{Random, Seeded};
use lading_ingest::outbox::CallbackPost;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::DuplexStream;

/// The most of a callback's body the receiver reads.
const MAX_BODY: usize = 1 << 20;

/// How one connection goes, drawn when it opens.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Fate {
    Answers,
    /// Closed before the request is read.
    Closes,
    /// `503`: the receiver takes nothing now.
    Busy,
    /// Takes the callback, then goes away before answering.
    LosesAnswer,
}

/// A connection to the receiver: the client's end, and the receiver's task.
pub fn connect(
    rng: &Seeded,
    deliver: impl Fn(String, Value) + Send + Sync + 'static,
) -> (DuplexStream, tokio::task::JoinHandle<()>) {
    let (client, server) = tokio::io::duplex(16 * 1024);
    let fate = match rng.below(100) {
        0..4 => Fate::Closes,
        4..8 => Fate::Busy,
        8..14 => Fate::LosesAnswer,
        _ => Fate::Answers,
    };
    let slow = Duration::from_millis(rng.below(200) as u64);
    (
        client,
        tokio::spawn(receive(server, fate, slow, Arc::new(deliver))),
    )
}

type Deliver = Arc<dyn Fn(String, Value) + Send + Sync>;

async fn receive(io: DuplexStream, fate: Fate, slow: Duration, deliver: Deliver) {
    tokio::time::sleep(slow).await;
    if fate == Fate::Closes {
        return;
    }
    let service = hyper::service::service_fn(move |req| {
        let deliver = deliver.clone();
        async move {
            if fate == Fate::Busy {
                return Ok(answer(503));
            }
            match read(req).await {
                Ok((key, body)) => deliver(key, body),
                Err(why) => deliver(String::new(), json!({ "unreadable": why })),
            }
            if fate == Fate::LosesAnswer {
                // A service that fails: hyper closes the connection with no answer.
                return Err("the receiver went away");
            }
            Ok(answer(204))
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), service)
        .await;
}

fn answer(status: u16) -> hyper::Response<Once> {
    let mut r = hyper::Response::new(Once(None));
    *r.status_mut() = hyper::StatusCode::from_u16(status).expect("a valid status");
    r
}

/// A callback's `Idempotency-Key` and JSON body, checked as a receiver that drops repeats
/// would: a POST of JSON, its key in the header and the same in the body.
async fn read(req: hyper::Request<hyper::body::Incoming>) -> Result<(String, Value), String> {
    let header = |k: &str| {
        req.headers()
            .get(k)
            .map(|v| {
                v.to_str()
                    .map(str::to_string)
                    .map_err(|e| format!("{k}: {e}"))
            })
            .transpose()
    };
    if req.method() != hyper::Method::POST {
        return Err(format!("a {} instead of a POST", req.method()));
    }
    if req.uri().path() != "/lading" {
        return Err(format!("a POST to {} instead of /lading", req.uri().path()));
    }
    let kind = header("content-type")?.unwrap_or_default();
    if kind != "application/json" {
        return Err(format!("a body of type {kind:?}"));
    }
    let key = header("idempotency-key")?.ok_or("no Idempotency-Key header")?;
    let mut body = req.into_body();
    let mut bytes = Vec::new();
    while let Some(frame) =
        std::future::poll_fn(|cx| http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx))
            .await
    {
        let frame = frame.map_err(|e| format!("the body broke off: {e}"))?;
        if let Ok(data) = frame.into_data() {
            bytes.extend_from_slice(&data);
            if bytes.len() > MAX_BODY {
                return Err(format!("a body over {MAX_BODY} bytes"));
            }
        }
    }
    let body: Value = lading_core::json::from_bytes(&bytes)
        .map_err(|e| format!("a body that is not JSON: {e}"))?;
    let inner = body.get("idempotency_key").and_then(Value::as_str);
    if inner != Some(key.as_str()) {
        return Err(format!("the header's key {key:?} but the body's {inner:?}"));
    }
    Ok((key, body))
}

/// Sends `post` over `io` with hyper's client: the receiver's status, or why none came.
pub async fn post_over(io: DuplexStream, post: &CallbackPost) -> Result<u16, String> {
    let url = url::Url::parse(&post.url).map_err(|e| format!("{}: {e}", post.url))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let driving = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = hyper::Request::post(url.path())
        .header("host", url.host_str().unwrap_or_default())
        .header("content-length", post.body.len());
    for (name, value) in &post.headers {
        req = req.header(*name, value);
    }
    let req = req
        .body(Once(Some(Bytes::from(post.body.clone()))))
        .map_err(|e| e.to_string())?;
    let sent = send.send_request(req).await.map_err(|e| e.to_string());
    driving.abort();
    Ok(sent?.status().as_u16())
}

/// A body of one piece (or none).
struct Once(Option<Bytes>);

impl http_body::Body for Once {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.take().map(|b| Ok(http_body::Frame::data(b))))
    }
    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lading_engine::Effect;
    use std::sync::Mutex;

    fn effect(key: &str, body: Value) -> Effect {
        Effect {
            kind: lading_engine::EffectKind::Callback,
            key: key.into(),
            batch: None,
            job: None,
            payload: json!({"url": "http://callbacks.sim.invalid/lading", "body": body}),
        }
    }

    async fn deliver_once(fate: Fate, e: &Effect) -> (Result<(), String>, Vec<(String, Value)>) {
        let got = Arc::new(Mutex::new(Vec::new()));
        let (client, server) = tokio::io::duplex(1024);
        let g = got.clone();
        let receiver = tokio::spawn(receive(
            server,
            fate,
            Duration::ZERO,
            Arc::new(move |k, v| g.lock().unwrap().push((k, v))),
        ));
        let post = lading_ingest::outbox::callback_of(e).unwrap();
        let sent = match post_over(client, &post).await {
            Ok(status) => lading_ingest::outbox::callback_answer(&post.url, status)
                .map_err(|f| format!("{f:?}")),
            Err(why) => Err(why),
        };
        receiver.await.unwrap();
        let got = got.lock().unwrap().clone();
        (sent, got)
    }

    /// Lading's POST, as formed for the wire, reaches the receiver whole: its key from the
    /// header, its body as sent; each fate answers as it says.
    #[tokio::test]
    async fn the_receiver_reads_back_ladings_callback_and_each_fate_answers_as_named() {
        let body = json!({"idempotency_key": "k1", "job": "jid1", "note": "é".repeat(3000)});
        let e = effect("k1", body.clone());
        let (sent, got) = deliver_once(Fate::Answers, &e).await;
        assert_eq!(sent, Ok(()));
        assert_eq!(got, vec![("k1".to_string(), body.clone())]);

        let (sent, got) = deliver_once(Fate::Busy, &e).await;
        assert!(sent.unwrap_err().contains("answered 503"));
        assert!(got.is_empty());

        let (sent, got) = deliver_once(Fate::LosesAnswer, &e).await;
        assert!(sent.is_err());
        assert_eq!(got, vec![("k1".to_string(), body.clone())]);

        let (sent, got) = deliver_once(Fate::Closes, &e).await;
        assert!(sent.is_err());
        assert!(got.is_empty());
    }

    /// A callback whose body names another key than its header is taken as unreadable, and
    /// the reason says so.
    #[tokio::test]
    async fn a_callback_the_receiver_cannot_read_is_named() {
        let e = effect("k1", json!({"idempotency_key": "k2"}));
        let (sent, got) = deliver_once(Fate::Answers, &e).await;
        assert_eq!(sent, Ok(()));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "");
        let why = got[0].1["unreadable"].as_str().unwrap();
        assert!(why.contains("\"k1\"") && why.contains("k2"), "{why}");
    }
}
