//! `POST /api/v1/batches/upload?profile=P&type=T…`: a batch from an uploaded file, container
//! or manifest (multipart/form-data, one part named `file`).
//!
//! The part is streamed to `DATA_DIR/uploads/UUID/NAME` a chunk at a time (constant memory
//! whatever its size), counted against `max_upload_bytes`, and made durable before the batch
//! that points at it (`file://…`) is created. Anything refused — a bad name (`../`, `/`, a
//! leading dot), an oversized or truncated body, a missing part, an unknown profile — gets a
//! 4xx naming it, and leaves neither a file nor a batch behind.

use crate::{ApiError, AppState, Principal, Query};
use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use lading_ingest::PayloadType;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::AsyncWriteExt;

/// A file name safe to create in the upload folder, or why not.
pub fn check_name(name: &str) -> Result<&str, ApiError> {
    let bad = |why: &str| ApiError::bad_request(format!("upload name {name:?} {why}"));
    let max = lading_ingest::stages::MAX_SEGMENT_BYTES;
    if name.is_empty() || name.len() > max {
        return Err(bad(&format!("must be 1 to {max} bytes")));
    }
    // The name ends a file:// URL: these would cut it short or be decoded.
    if name.contains(['?', '#', '%']) {
        return Err(bad("must not contain '?', '#' or '%'"));
    }
    if name.contains('/') || name.contains('\\') {
        return Err(bad("must not contain a path (/ or \\)"));
    }
    if name.starts_with('.') {
        return Err(bad("must not start with '.' (no ../, no hidden files)"));
    }
    if name.chars().any(char::is_control) {
        return Err(bad("must not contain control characters"));
    }
    Ok(name)
}

/// A multipart body; a request that is not one gets a JSON error naming the problem. Each
/// part's header block is held to `http.max_part_header_bytes` while it streams in
/// ([`PartHeaders`]), before the multipart parser would buffer it.
pub struct Form(
    pub multer::Multipart<'static>,
    /// Set when a part's headers went over the limit.
    pub Arc<AtomicBool>,
);

impl axum::extract::FromRequest<AppState> for Form {
    type Rejection = ApiError;
    async fn from_request(req: axum::extract::Request, s: &AppState) -> Result<Self, ApiError> {
        use futures_util::StreamExt;
        let ct = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let boundary = multer::parse_boundary(ct).map_err(|e| {
            ApiError::bad_request(format!("upload: not a multipart/form-data body ({e})"))
        })?;
        let mut guard = PartHeaders::new(&boundary, s.ingest.cfg.http.max_part_header_bytes);
        let over = Arc::new(AtomicBool::new(false));
        let seen = over.clone();
        // Past the limit the rest of the body is read and dropped (up to LINGER bytes), so
        // the client is sent the refusal rather than a reset connection.
        let mut dropped = 0u64;
        let stream = req.into_body().into_data_stream().map(move |c| match c {
            Ok(c) if seen.load(Ordering::Relaxed) => {
                dropped += c.len() as u64;
                if dropped > LINGER {
                    Err(std::io::Error::other("the upload went on past its refusal"))
                } else {
                    Ok(axum::body::Bytes::new())
                }
            }
            Ok(c) => match guard.scan(&c) {
                Ok(()) => Ok(c),
                Err(_) => {
                    seen.store(true, Ordering::Relaxed);
                    Ok(axum::body::Bytes::new())
                }
            },
            Err(e) => Err(std::io::Error::other(e)),
        });
        let paced = Paced {
            inner: Box::pin(stream),
            run: 0,
        };
        Ok(Form(multer::Multipart::new(paced, boundary), over))
    }
}

/// Bytes a body stream hands on in a row before it yields once: the multipart parser reads
/// everything a stream has ready into its buffer at each poll, so without this a client that
/// sends fast makes it hold as much as the socket has ready (megabytes) per request.
const PACE: usize = 64 << 10;

/// A body stream that yields (wakes itself and returns `Pending`) after each [`PACE`] bytes,
/// so the parser consumes what it holds before it reads more.
struct Paced<S> {
    inner: std::pin::Pin<Box<S>>,
    run: usize,
}

impl<S: futures_util::Stream<Item = std::io::Result<axum::body::Bytes>>> futures_util::Stream
    for Paced<S>
{
    type Item = std::io::Result<axum::body::Bytes>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if self.run >= PACE {
            self.run = 0;
            cx.waker().wake_by_ref();
            return std::task::Poll::Pending;
        }
        let next = self.inner.as_mut().poll_next(cx);
        if let std::task::Poll::Ready(Some(Ok(c))) = &next {
            self.run += c.len();
        }
        next
    }
}

/// Bytes of a refused upload still read (and dropped) so the refusal reaches the client.
const LINGER: u64 = 64 << 20;

/// Watches a multipart stream for part headers longer than a limit: after each delimiter
/// (`--BOUNDARY`) the bytes up to the blank line are counted across chunks.
pub struct PartHeaders {
    delim: Vec<u8>,
    max: usize,
    /// The end of the previous chunk, where a delimiter or blank line may have begun.
    tail: Vec<u8>,
    /// Stream offset of `tail`'s first byte.
    offset: u64,
    /// Where the current part's headers began, while they are being read.
    headers_at: Option<u64>,
}

impl PartHeaders {
    pub fn new(boundary: &str, max: usize) -> PartHeaders {
        PartHeaders {
            delim: format!("--{boundary}").into_bytes(),
            max,
            tail: Vec::new(),
            offset: 0,
            headers_at: None,
        }
    }

    pub fn scan(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        let mut buf = std::mem::take(&mut self.tail);
        buf.extend_from_slice(chunk);
        let mut pos = 0;
        loop {
            match self.headers_at {
                None => match memchr::memmem::find(&buf[pos..], &self.delim) {
                    Some(i) => {
                        pos += i + self.delim.len();
                        self.headers_at = Some(self.offset + pos as u64);
                    }
                    None => break,
                },
                Some(at) => {
                    let found = memchr::memmem::find(&buf[pos..], b"\r\n\r\n");
                    let end = found.map_or(buf.len(), |i| pos + i);
                    if self.offset + end as u64 - at > self.max as u64 {
                        return Err(std::io::Error::other(format!(
                            "a part's headers are longer than {} bytes (http.max_part_header_bytes)",
                            self.max
                        )));
                    }
                    match found {
                        Some(i) => {
                            pos += i + 4;
                            self.headers_at = None;
                        }
                        None => break,
                    }
                }
            }
        }
        let keep = self.delim.len().max(4) - 1;
        let from = pos.max(buf.len().saturating_sub(keep));
        self.offset += from as u64;
        self.tail = buf[from..].to_vec();
        Ok(())
    }
}

/// A multipart error as the API reports it.
fn bad_body(e: multer::Error) -> ApiError {
    ApiError::bad_request(format!("upload body: {e}"))
}

/// `fut`, or 408 when the client sends nothing for `stall`.
async fn unless_stalled<T>(
    stall: std::time::Duration,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, ApiError> {
    tokio::time::timeout(stall, fut).await.map_err(|_| {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout",
            format!(
                "the upload sent nothing for {} s (http.upload_stall_s)",
                stall.as_secs()
            ),
        )
    })
}

/// An upload refused (often before its body was read whole) closes its connection and says
/// so (`Connection: close`): a client must not send its next request on a connection whose
/// last body the server did not read.
pub(crate) async fn close_after_refusal(mut r: Response) -> Response {
    if r.status().is_client_error() || r.status().is_server_error() {
        r.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    r
}

/// Removes a refused upload's folder.
pub(crate) struct Scrap(pub(crate) Option<PathBuf>);

impl Drop for Scrap {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Receives a multipart upload into a folder of its own under `DATA_DIR/uploads` (removed
/// when the returned [`Scrap`] is dropped unless kept): the folder, and what [`save`] made
/// of the body. `Err` only when the folder cannot be made.
///
/// `gate`, when given, is asked with the fields received so far when the file part begins:
/// a refusal there (a profile the caller may not submit to) ends the upload before a byte of
/// the file is written. A submitter's file counts, as it arrives, against
/// `max_upload_bytes_per_submitter` with what that submitter's uploads already hold here
/// ([`Held`]); an admin's does not.
pub(crate) async fn receive(
    s: &AppState,
    p: &Principal,
    multipart: &mut multer::Multipart<'static>,
    fields: Option<&mut std::collections::BTreeMap<String, String>>,
    gate: Option<&Gate<'_>>,
) -> Result<(Scrap, Result<(PathBuf, u64), ApiError>), ApiError> {
    let root = std::path::absolute(s.ingest.cfg.data_dir.join("uploads"))
        .map_err(|e| ApiError::internal(format!("the uploads folder: {e}")))?;
    let dir = root.join(uuid::Uuid::new_v4().simple().to_string());
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| ApiError::internal(format!("making {}: {e}", dir.display())))?;
    let scrap = Scrap(Some(dir.clone()));
    let held = match p.role {
        crate::auth::Role::Admin => None,
        _ => Some(Held::start(&root, &p.name, s.ingest.cfg.max_upload_bytes_per_submitter).await),
    };
    let stall = std::time::Duration::from_secs(s.ingest.cfg.http.upload_stall_s.max(1));
    let limits = Limits {
        max: s.ingest.cfg.max_upload_bytes,
        stall,
        held,
    };
    let saved = save(&dir, multipart, limits, fields, gate).await;
    Ok((scrap, saved))
}

/// What one upload is held to.
struct Limits {
    /// `max_upload_bytes`.
    max: u64,
    /// `http.upload_stall_s`.
    stall: std::time::Duration,
    /// The submitter's share of the uploads folder, for a submitter.
    held: Option<Held>,
}

/// The file that names an upload folder's submitter, written once the file is complete
/// (an upload's own file name never starts with a dot).
const OWNER_FILE: &str = ".owner";

/// Bytes of uploads arriving now on this process, per uploads folder and submitter.
static ARRIVING: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<String, u64>>> =
    std::sync::LazyLock::new(Default::default);

/// One submitter's bytes in an uploads folder, for one upload as it arrives: the finished
/// uploads the folder keeps for it (counted once at the start, from their `.owner` files) and
/// every upload of its arriving on this process (counted chunk by chunk, given back when
/// this upload ends).
pub(crate) struct Held {
    key: String,
    name: String,
    cap: u64,
    kept: u64,
    mine: u64,
}

impl Held {
    async fn start(root: &Path, name: &str, cap: u64) -> Held {
        let (r, n) = (root.to_path_buf(), name.to_string());
        let kept = tokio::task::spawn_blocking(move || kept_bytes(&r, &n))
            .await
            .unwrap_or(0);
        Held {
            key: format!("{}\0{name}", root.display()),
            name: name.to_string(),
            cap,
            kept,
            mine: 0,
        }
    }

    /// Counts `n` more bytes of this upload; refused (429) when the submitter's uploads
    /// would then hold more than the cap.
    fn add(&mut self, n: u64) -> Result<(), ApiError> {
        let mut arriving = ARRIVING.lock().unwrap_or_else(|e| e.into_inner());
        let all = arriving.entry(self.key.clone()).or_default();
        *all += n;
        self.mine += n;
        if self.kept.saturating_add(*all) > self.cap {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "upload_bytes",
                format!(
                    "{}'s uploads on this server would hold more than {} bytes \
                     (max_upload_bytes_per_submitter); an upload is removed when its batch is \
                     deleted or cleaned up after it completes",
                    self.name, self.cap
                ),
            ));
        }
        Ok(())
    }

    /// Marks `dir`'s finished upload as this submitter's, so later uploads count it.
    async fn keep(&self, dir: &Path) -> Result<(), ApiError> {
        tokio::fs::write(dir.join(OWNER_FILE), &self.name)
            .await
            .map_err(|e| ApiError::internal(format!("{}: {e}", dir.display())))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut arriving = ARRIVING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(all) = arriving.get_mut(&self.key) {
            *all = all.saturating_sub(self.mine);
            if *all == 0 {
                arriving.remove(&self.key);
            }
        }
    }
}

/// Bytes of the finished uploads under `root` whose `.owner` file names `name`.
fn kept_bytes(root: &Path, name: &str) -> u64 {
    let Ok(dirs) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut total = 0;
    for d in dirs.flatten() {
        let dir = d.path();
        let owner = std::fs::read(dir.join(OWNER_FILE)).unwrap_or_default();
        if owner != name.as_bytes() {
            continue;
        }
        for f in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if f.file_name() != OWNER_FILE {
                total += f.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    total
}

/// Asked with the form's fields so far when its file part begins.
pub(crate) type Gate<'a> =
    dyn Fn(&std::collections::BTreeMap<String, String>) -> Result<(), ApiError> + Send + Sync + 'a;

/// Form fields other than the file, at most.
pub const MAX_FIELDS: usize = 200;
/// One form field's value other than the file, at most.
pub const MAX_FIELD_BYTES: usize = 64 << 10;
/// Every form field other than the file together, at most: what one request may make the
/// server hold in memory, refused as it arrives (see `docs/SECURITY.md`).
pub const MAX_FORM_BYTES: usize = 64 << 10;

async fn save(
    dir: &Path,
    multipart: &mut multer::Multipart<'static>,
    mut limits: Limits,
    mut fields: Option<&mut std::collections::BTreeMap<String, String>>,
    gate: Option<&Gate<'_>>,
) -> Result<(PathBuf, u64), ApiError> {
    let (max, stall) = (limits.max, limits.stall);
    let mut saved = None;
    let mut held = 0usize;
    while let Some(mut field) = unless_stalled(stall, multipart.next_field())
        .await?
        .map_err(bad_body)?
    {
        if field.name() != Some("file") {
            let name = field.name().unwrap_or("").to_string();
            let Some(fields) = fields.as_deref_mut() else {
                return Err(ApiError::bad_request(format!(
                    "unexpected form field {name:?}; send one part named \"file\""
                )));
            };
            if fields.len() >= MAX_FIELDS {
                return Err(ApiError::bad_request(format!(
                    "more than {MAX_FIELDS} form fields"
                )));
            }
            let mut value = Vec::new();
            while let Some(chunk) = unless_stalled(stall, field.chunk())
                .await?
                .map_err(bad_body)?
            {
                value.extend_from_slice(&chunk);
                if value.len() > MAX_FIELD_BYTES {
                    return Err(ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "too_large",
                        format!("form field {name:?} is longer than {MAX_FIELD_BYTES} bytes"),
                    ));
                }
                if held + name.len() + value.len() > MAX_FORM_BYTES {
                    return Err(ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "too_large",
                        format!(
                            "the form's fields (but the file) are longer than {MAX_FORM_BYTES} bytes together"
                        ),
                    ));
                }
            }
            let value = String::from_utf8(value).map_err(|_| {
                ApiError::bad_request(format!("form field {name:?} is not UTF-8 text"))
            })?;
            held += name.len() + value.len();
            fields.insert(name, value);
            continue;
        }
        if saved.is_some() {
            return Err(ApiError::bad_request("more than one \"file\" part"));
        }
        if let (Some(gate), Some(fields)) = (gate, fields.as_deref()) {
            gate(fields)?;
        }
        let name = check_name(field.file_name().unwrap_or(""))?.to_string();
        let path = dir.join(&name);
        let mut f = tokio::fs::File::create(&path).await.map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })?;
        let mut n: u64 = 0;
        while let Some(chunk) = unless_stalled(stall, field.chunk())
            .await?
            .map_err(bad_body)?
        {
            n += chunk.len() as u64;
            let over = if n > max {
                Some(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    format!("upload is larger than the limit of {max} bytes"),
                ))
            } else {
                limits
                    .held
                    .as_mut()
                    .and_then(|h| h.add(chunk.len() as u64).err())
            };
            if let Some(refusal) = over {
                // The rest is read and dropped (up to LINGER) so the client gets the answer.
                let mut more = 0u64;
                while more < LINGER
                    && let Ok(Ok(Some(c))) = tokio::time::timeout(stall, field.chunk()).await
                {
                    more += c.len() as u64;
                }
                return Err(refusal);
            }
            f.write_all(&chunk).await.map_err(|e| {
                ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "storage", e.to_string())
            })?;
        }
        f.sync_all().await.map_err(|e| {
            ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "storage", e.to_string())
        })?;
        if let Some(h) = &limits.held {
            h.keep(dir).await?;
        }
        saved = Some((path, n));
    }
    saved.ok_or_else(|| ApiError::bad_request("no \"file\" part in the upload"))
}

#[utoipa::path(post, path = "/api/v1/batches/upload", tag = "batches", summary = "Submit a batch by multipart upload (one part named `file`)", params(("profile" = String, Query, description = "the profile"), ("type" = Option<String>, Query, description = "payload type (default file)"), ("title" = Option<String>, Query, description = "ERC what"), ("creator" = Option<String>, Query, description = "ERC who"), ("date" = Option<String>, Query, description = "ERC when"), ("local_id" = Option<String>, Query, description = "local id"), ("primary_id" = Option<String>, Query, description = "primary id"), ("submitter" = Option<String>, Query, description = "admin only: on someone's behalf")), responses((status = 201, description = "the batch, Pending, and the upload's size", body = crate::api::Submitted), (status = 400, description = "bad input (the error names it)"), (status = 401, description = "no or unknown token"), (status = 403, description = "the token's role may not do this"), (status = 413, description = "over max_upload_bytes"), (status = 429, description = "the submitter's uploads or open batches are at their caps (max_upload_bytes_per_submitter, max_open_batches_per_submitter)")))]
pub async fn upload(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    Query(mut q): Query<crate::api::SubmitRequest>,
    Form(mut multipart, over): Form,
) -> Result<Response, ApiError> {
    // Refuse what can be refused before reading a byte of the body.
    if q.payload_url.is_some() {
        return Err(ApiError::bad_request(
            "payload_url is not taken with an upload: the uploaded file is the payload",
        ));
    }
    p.may_submit_to(&s.ingest, &q.profile)?;
    if PayloadType::parse(q.payload_type()).is_none() {
        return Err(lading_ingest::SubmitError::PayloadType(q.payload_type().to_string()).into());
    }
    let submitter = p.submitter(q.submitter.take())?;
    p.may_open_batch(&s).await?;
    let (mut scrap, saved) = receive(&s, &p, &mut multipart, None, None).await?;
    if over.load(Ordering::Relaxed) {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "upload body: a part's headers are longer than {} bytes (http.max_part_header_bytes)",
                s.ingest.cfg.http.max_part_header_bytes
            ),
        ));
    }
    let (path, size) = saved?;
    let payload_url = format!("file://{}", path.display());
    // The upload itself is the server's own file; URLs inside it are the depositor's.
    let trust = lading_ingest::Trust::Depositor {
        upload: Some(payload_url.clone()),
    };
    let sub = q.into_submission(submitter, payload_url, trust);
    let bid = lading_ingest::submit(&s.ingest, &sub).await?;
    scrap.0 = None;
    Ok(crate::api::Submitted::pending(&bid, Some(size)).created())
}
