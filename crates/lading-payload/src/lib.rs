//! A small HTTP server on loopback that serves a directory (GET and HEAD, streamed) and
//! receives callbacks: what `lading demo` and `lading bench pipeline` deposit from, and what
//! the tests use as the depositor's server. Faults can be switched on per path, and every
//! request is counted, so a test can check that a resumed download did not fetch a verified
//! file again.

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Shared {
    root: PathBuf,
    /// GET requests per path.
    gets: Mutex<HashMap<String, u32>>,
    /// HEAD requests per path.
    heads: Mutex<HashMap<String, u32>>,
    /// As Merritt's client's server: once this path was requested (GET or HEAD), every later
    /// request answers 503, as if the server had stopped.
    stop_after: Mutex<Option<String>>,
    /// Whether `stop_after`'s path was requested.
    stopped: std::sync::atomic::AtomicBool,
    /// Path → this many more GETs answer 503.
    fail: Mutex<HashMap<String, u32>>,
    /// Callbacks received, with the status each got.
    callbacks: Mutex<Vec<Value>>,
    /// Status the callback endpoint answers.
    callback_status: Mutex<u16>,
}

/// A running payload server; stops when dropped.
pub struct PayloadServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PayloadServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PayloadServer {
    /// Serves `root` on a free loopback port.
    pub async fn start(root: impl Into<PathBuf>) -> std::io::Result<PayloadServer> {
        let shared = Arc::new(Shared {
            root: root.into(),
            callback_status: Mutex::new(200),
            ..Default::default()
        });
        let app = Router::new()
            .route("/callback", axum::routing::post(callback))
            .route("/files/{*path}", axum::routing::get(file))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        // Without TCP_NODELAY small responses wait on delayed ACKs (about 40 ms each).
        use axum::serve::ListenerExt;
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(PayloadServer { addr, shared, task })
    }

    /// The URL of a file under the root.
    pub fn url(&self, rel: &str) -> String {
        format!("http://{}/files/{rel}", self.addr)
    }

    pub fn callback_url(&self) -> String {
        format!("http://{}/callback", self.addr)
    }

    /// GETs of `rel` so far.
    pub fn gets(&self, rel: &str) -> u32 {
        lock(&self.shared.gets).get(rel).copied().unwrap_or(0)
    }

    /// HEADs of `rel` so far.
    pub fn heads(&self, rel: &str) -> u32 {
        lock(&self.shared.heads).get(rel).copied().unwrap_or(0)
    }

    /// Serve as Merritt's Ruby client does: it stops its server once each file it wrote
    /// itself (its `mrt-erc.txt`) was requested once, by GET or HEAD. After the first request
    /// of `rel`, every request answers 503.
    pub fn stop_after(&self, rel: &str) {
        *lock(&self.shared.stop_after) = Some(rel.to_string());
    }

    /// The next `n` GETs of `rel` answer 503.
    pub fn fail_next(&self, rel: &str, n: u32) {
        lock(&self.shared.fail).insert(rel.to_string(), n);
    }

    pub fn set_callback_status(&self, status: u16) {
        *lock(&self.shared.callback_status) = status;
    }

    pub fn callbacks(&self) -> Vec<Value> {
        lock(&self.shared.callbacks).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn callback(
    State(s): State<Arc<Shared>>,
    headers: axum::http::HeaderMap,
    body: axum::Json<Value>,
) -> StatusCode {
    let status = *lock(&s.callback_status);
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    lock(&s.callbacks)
        .push(serde_json::json!({ "status": status, "body": body.0, "idempotency_key": key }));
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

async fn file(
    State(s): State<Arc<Shared>>,
    method: Method,
    UrlPath(rel): UrlPath<String>,
) -> Response {
    if rel.split('/').any(|p| p == ".." || p.is_empty()) {
        return StatusCode::BAD_REQUEST.into_response();
    }
    use std::sync::atomic::Ordering;
    if s.stopped.load(Ordering::SeqCst) {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    if lock(&s.stop_after).as_deref() == Some(rel.as_str()) {
        s.stopped.store(true, Ordering::SeqCst);
    }
    if method == Method::HEAD {
        *lock(&s.heads).entry(rel.clone()).or_default() += 1;
    }
    if method == Method::GET {
        *lock(&s.gets).entry(rel.clone()).or_default() += 1;
        let mut fail = lock(&s.fail);
        if let Some(n) = fail.get_mut(&rel)
            && *n > 0
        {
            *n -= 1;
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
    }
    let path = s.root.join(&rel);
    let Ok(f) = tokio::fs::File::open(&path).await else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let len = match f.metadata().await {
        Ok(m) if m.is_file() => m.len(),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_LENGTH, len.into());
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    if method == Method::HEAD {
        return (headers, Body::empty()).into_response();
    }
    (
        headers,
        Body::from_stream(tokio_util::io::ReaderStream::with_capacity(f, 256 << 10)),
    )
        .into_response()
}
