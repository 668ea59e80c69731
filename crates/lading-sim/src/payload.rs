//! The depositors' side of the simulation: payloads for the batches that go through Lading's
//! own intake and file stages, the payload server they are fetched from, and what each object
//! must be once stored.
//!
//! A payload is a batch manifest (one object manifest per object, each naming one to three
//! files), a single-file batch manifest (one object per file) or a container batch manifest
//! (one object per zip, tar or tar.gz, unpacked by Processing). Most are served over HTTP/1.1
//! by [`PayloadServer`], hyper's server on a pipe in memory (slow, failing, breaking
//! connections mid-body, as the seed says); some are files fetched through `file://` URLs. Some batches are put right only
//! later: a file missing at first, or an object manifest whose first version declares a
//! wrong digest (its job fails until an admin requeues it after the depositor's fix). Some
//! objects share a primary identifier, so their jobs add versions to one object, from several
//! processes at once.

use lading_core::random::{Random, Seeded};
use lading_ingest::checkm::{self, ManifestKind};
use lading_ingest::fetch::Source;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What one object of a payload must be once stored.
#[derive(Debug, Clone, Default)]
pub struct Expected {
    /// File name → sha256 of its bytes.
    pub files: BTreeMap<String, String>,
    /// The primary identifier the manifest gives it, if any.
    pub ark: Option<String>,
}

/// Where a payload's piece lives: a file, or a URL of the payload server.
#[derive(Debug, Clone)]
pub enum Place {
    Disk(PathBuf),
    Served(String),
}

/// One batch's payload: what to submit, and a fix the depositor makes only later.
pub struct Payload {
    pub url: String,
    pub payload_type: &'static str,
    pub late: Option<(Place, Vec<u8>)>,
}

/// What the payload server serves, by URL.
pub type Served = Arc<Mutex<BTreeMap<String, Vec<u8>>>>;

/// Every payload of a run, and what each object (by the URL a job fetches it from) must be.
#[derive(Default)]
pub struct Payloads {
    pub expected: BTreeMap<String, Expected>,
    /// A batch manifest's URL → the URLs of the objects it lists, one job each.
    pub listed: BTreeMap<String, Vec<String>>,
    pub served: Served,
}

/// Primary identifiers the objects of a run share (several jobs, one object, many versions).
const SHARED_ARKS: usize = 3;
/// The payload server's address (never resolved: its bodies come from [`PayloadServer`]).
const SERVER: &str = "http://payloads.sim.invalid";

fn sha256_hex(b: &[u8]) -> String {
    let mut h = lading_ingest::fetch::Hasher::new(checkm::HashAlg::Sha256);
    h.update(b);
    h.hex()
}

/// How a batch's late fix goes wrong until it is made.
#[derive(Clone, Copy, PartialEq)]
enum Late {
    None,
    /// One file is missing.
    File,
    /// One object manifest declares a wrong digest.
    Manifest,
}

impl Payloads {
    /// Puts `bytes` at `place` (the depositor's side: a file, or the server's copy).
    pub fn put(&self, place: &Place, bytes: &[u8]) {
        match place {
            Place::Disk(p) => {
                if let Some(d) = p.parent() {
                    std::fs::create_dir_all(d).expect("the payload folder");
                }
                std::fs::write(p, bytes).expect("a payload file");
            }
            Place::Served(u) => {
                self.served
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(u.clone(), bytes.to_vec());
            }
        }
    }

    /// The batch manifest of `kind` with `rows`, put at `at`, listing `objects` (each with
    /// what it must become); its URL.
    fn batch_manifest(
        &mut self,
        (at, url): (Place, String),
        kind: ManifestKind,
        fields: &[&str],
        rows: &[Vec<String>],
        objects: Vec<(String, Expected)>,
    ) -> String {
        let listed: Vec<String> = objects.iter().map(|(u, _)| u.clone()).collect();
        self.expected.extend(objects);
        self.listed.insert(url.clone(), listed);
        self.put(&at, checkm::write(kind, fields, rows).as_bytes());
        url
    }

    /// An object's manifest of `rows`, put at `at`; when `first_wrong`, the first version put
    /// declares a wrong digest for its first file, and the right one is returned, to be put
    /// in place later.
    fn object_manifest(
        &self,
        at: Place,
        rows: &[Vec<String>],
        first_wrong: bool,
    ) -> Option<(Place, Vec<u8>)> {
        let right = checkm::write(ManifestKind::Object, checkm::OBJECT_FIELDS, rows);
        if !first_wrong {
            self.put(&at, right.as_bytes());
            return None;
        }
        let mut wrong_rows = rows.to_vec();
        wrong_rows[0][1] = "sha256".into();
        wrong_rows[0][2] = "0".repeat(64);
        let wrong = checkm::write(ManifestKind::Object, checkm::OBJECT_FIELDS, &wrong_rows);
        self.put(&at, wrong.as_bytes());
        Some((at, right.into_bytes()))
    }

    /// Makes batch `i`'s payload (under `root` when on disk) and records what its objects
    /// must become.
    pub fn make(&mut self, root: &Path, seed: u64, i: usize, rng: &Seeded) -> Payload {
        let on_disk = rng.below(4) == 0;
        let place = |name: &str| -> (Place, String) {
            if on_disk {
                let p = root.join(format!("b{i}")).join(name);
                let url = format!("file://{}", p.display());
                (Place::Disk(p), url)
            } else {
                let url = format!("{SERVER}/b{i}/{name}");
                (Place::Served(url.clone()), url)
            }
        };
        let late = std::cell::Cell::new(match rng.below(8) {
            0 => Late::File,
            1 => Late::Manifest,
            _ => Late::None,
        });
        let fix = std::cell::RefCell::new(None);
        // A file of the payload, put in place now or (the batch's late fix) later.
        let file_bytes = |name: &str, bytes: Vec<u8>| -> (String, Vec<u8>) {
            let (at, url) = place(name);
            if late.get() == Late::File {
                late.set(Late::None);
                *fix.borrow_mut() = Some((at, bytes.clone()));
            } else {
                self.put(&at, &bytes);
            }
            (url, bytes)
        };
        let file = |name: &str| -> (String, Vec<u8>) {
            let bytes = format!("{seed}/{i}/{name}\n")
                .repeat(1 + rng.below(40))
                .into_bytes();
            file_bytes(name, bytes)
        };
        if rng.below(4) == 0 {
            // One object per container (a zip, tar or tar.gz of a few files, unpacked by
            // Processing).
            let mut rows = Vec::new();
            let mut objects = Vec::new();
            for c in 0..1 + rng.below(3) {
                let (entries, expected) = container_entries(seed, i, c, rng);
                let (packed, ext) = pack(&entries, (i + c) % 3);
                let name = format!("c{c}.{ext}");
                let (url, _) = file_bytes(&name, packed);
                rows.push(vec![url.clone(), name]);
                objects.push((url, expected));
            }
            let fields = [checkm::FILE_URL, checkm::FILE_NAME];
            let url = self.batch_manifest(
                place("batch.checkm"),
                ManifestKind::ContainerBatch,
                &fields,
                &rows,
                objects,
            );
            return Payload {
                url,
                payload_type: "container-batch-manifest",
                late: fix.into_inner(),
            };
        }
        if rng.below(3) == 0 {
            // One object per file.
            let mut rows = Vec::new();
            let mut objects = Vec::new();
            for f in 0..1 + rng.below(4) {
                let name = format!("s{f}.txt");
                let (url, bytes) = file(&name);
                rows.push(vec![url.clone(), name.clone()]);
                objects.push((
                    url,
                    Expected {
                        files: [(name, sha256_hex(&bytes))].into(),
                        ark: None,
                    },
                ));
            }
            let fields = [checkm::FILE_URL, checkm::FILE_NAME];
            let url = self.batch_manifest(
                place("batch.checkm"),
                ManifestKind::SingleFileBatch,
                &fields,
                &rows,
                objects,
            );
            return Payload {
                url,
                payload_type: "single-file-batch-manifest",
                late: fix.into_inner(),
            };
        }
        // A manifest of object manifests.
        let mut rows = Vec::new();
        let mut objects = Vec::new();
        for o in 0..1 + rng.below(4) {
            let mut expected = Expected::default();
            let mut object_rows = Vec::new();
            for f in 0..1 + rng.below(3) {
                let (url, bytes) = file(&format!("o{o}-f{f}.bin"));
                let sha = sha256_hex(&bytes);
                // Declared sizes and digests now and then (the download is held to them).
                let declared = rng.below(2) == 0;
                let name = format!("dir{f}/f{f}.bin");
                let or_none = |s: String| if declared { s } else { String::new() };
                object_rows.push(vec![
                    url,
                    or_none("sha256".into()),
                    or_none(sha.clone()),
                    or_none(bytes.len().to_string()),
                    name.clone(),
                ]);
                expected.files.insert(name, sha);
            }
            let (at, url) = place(&format!("o{o}.checkm"));
            let first_wrong = late.get() == Late::Manifest;
            if let Some(later) = self.object_manifest(at, &object_rows, first_wrong) {
                late.set(Late::None);
                *fix.borrow_mut() = Some(later);
            }
            if rng.below(3) == 0 {
                // Each storage its own objects (see [`Storage::of`]).
                let place = Storage::of(i).letter();
                expected.ark = Some(format!(
                    "ark:/99999/sim{seed}{place}{}",
                    rng.below(SHARED_ARKS)
                ));
            }
            rows.push(vec![
                url.clone(),
                format!("o{o}.checkm"),
                expected.ark.clone().unwrap_or_default(),
            ]);
            objects.push((url, expected));
        }
        let fields = [checkm::FILE_URL, checkm::FILE_NAME, checkm::PRIMARY_ID];
        let url = self.batch_manifest(
            place("batch.checkm"),
            ManifestKind::Batch,
            &fields,
            &rows,
            objects,
        );
        Payload {
            url,
            payload_type: "batch-manifest",
            late: fix.into_inner(),
        }
    }
}

/// The files of container `c` of batch `i` (a few, with repeated text), and what its object
/// must become.
fn container_entries(
    seed: u64,
    i: usize,
    c: usize,
    rng: &Seeded,
) -> (Vec<(String, Vec<u8>)>, Expected) {
    let mut expected = Expected::default();
    let mut entries = Vec::new();
    for f in 0..1 + rng.below(3) {
        let name = format!("part{f}/c{c}-{f}.txt");
        let bytes = format!("{seed}/{i}/{name}\n")
            .repeat(1 + rng.below(40))
            .into_bytes();
        expected.files.insert(name.clone(), sha256_hex(&bytes));
        entries.push((name, bytes));
    }
    (entries, expected)
}

/// The depositors' payload server, as Lading's fetcher meets it: each answer takes a while;
/// some are a 503, some bodies are cut short by a reset, some drip in slowly; a URL it does
/// not (yet) serve is a 404.
pub struct PayloadServer {
    pub dice: Arc<Seeded>,
    pub served: Served,
    pub answers: Arc<Mutex<Answers>>,
    /// While set, the server fails (503s, bodies cut short, dripping bodies); once the
    /// faults stop it answers whole, as the rest of the world does.
    pub faults: Arc<std::sync::atomic::AtomicBool>,
}

/// What the payload server answered, over a run.
#[derive(Debug, Default, Clone, Copy)]
pub struct Answers {
    pub whole: u64,
    pub unavailable: u64,
    pub not_found: u64,
    pub reset: u64,
    pub dripping: u64,
}

impl Source for PayloadServer {
    fn connect<'a>(
        &'a self,
        _url: &'a str,
    ) -> lading_core::BoxFuture<'a, std::io::Result<tokio::io::DuplexStream>> {
        Box::pin(async move {
            let (client, server) = tokio::io::duplex(16 * 1024);
            let me = PayloadServer {
                dice: self.dice.clone(),
                served: self.served.clone(),
                answers: self.answers.clone(),
                faults: self.faults.clone(),
            };
            let me = Arc::new(me);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let me = me.clone();
                    async move { Ok::<_, std::convert::Infallible>(me.answer(req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(server), service)
                    .await;
            });
            Ok(client)
        })
    }
}

impl PayloadServer {
    /// The answer to one request (a GET or a HEAD of a URL it serves; the rest are 404).
    async fn answer(&self, req: hyper::Request<hyper::body::Incoming>) -> hyper::Response<Pieces> {
        let url = format!("{SERVER}{}", req.uri());
        let body = self
            .served
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&url)
            .cloned();
        if req.method() == hyper::Method::HEAD {
            return match body {
                Some(b) => respond(200, Some(b.len()), Vec::new()),
                None => respond(404, None, Vec::new()),
            };
        }
        let (took, roll) = (self.dice.below(300), self.dice.below(100));
        let roll = if self.faults.load(std::sync::atomic::Ordering::Relaxed) {
            roll
        } else {
            99
        };
        tokio::time::sleep(Duration::from_millis(took as u64)).await;
        let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        if roll < 5 {
            answers.unavailable += 1;
            return respond(503, None, Vec::new());
        }
        let Some(body) = body else {
            answers.not_found += 1;
            return respond(404, None, Vec::new());
        };
        // Cut short after some bytes (the connection breaks), or dripping (a pause before
        // every piece).
        let cut = (roll < 9).then(|| self.dice.below(body.len().max(1)));
        let pause = if (9..14).contains(&roll) { 1_500 } else { 0 };
        match (cut, pause) {
            (Some(_), _) => answers.reset += 1,
            (None, 0) => answers.whole += 1,
            _ => answers.dripping += 1,
        }
        drop(answers);
        let mut pieces: Vec<(u64, Option<bytes::Bytes>)> = Vec::new();
        let mut at = 0;
        while at < body.len() {
            let n = (1 + self.dice.below(512)).min(body.len() - at);
            if cut.is_some_and(|c| at + n > c) {
                pieces.push((pause, None));
                break;
            }
            pieces.push((
                pause,
                Some(bytes::Bytes::copy_from_slice(&body[at..at + n])),
            ));
            at += n;
        }
        respond(200, Some(body.len()), pieces)
    }
}

fn respond(
    status: u16,
    len: Option<usize>,
    pieces: Vec<(u64, Option<bytes::Bytes>)>,
) -> hyper::Response<Pieces> {
    let mut r = hyper::Response::builder().status(status);
    if let Some(n) = len {
        r = r.header(hyper::header::CONTENT_LENGTH, n);
    }
    r.body(Pieces {
        left: pieces.into(),
        pause: None,
    })
    .expect("a response")
}

/// A response's body as the server sends it: pieces, each after its pause (ms); a piece of
/// `None` breaks the connection there.
pub struct Pieces {
    left: std::collections::VecDeque<(u64, Option<bytes::Bytes>)>,
    pause: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl http_body::Body for Pieces {
    type Data = bytes::Bytes;
    type Error = String;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, String>>> {
        use std::task::Poll;
        let Some((ms, _)) = self.left.front() else {
            return Poll::Ready(None);
        };
        if *ms > 0 {
            let ms = *ms;
            let sleep = self
                .pause
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(ms))));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.pause = None;
        }
        match self.left.pop_front() {
            Some((_, Some(b))) => Poll::Ready(Some(Ok(http_body::Frame::data(b)))),
            Some((_, None)) => Poll::Ready(Some(Err("the connection broke".into()))),
            None => Poll::Ready(None),
        }
    }
    fn is_end_stream(&self) -> bool {
        self.left.is_empty()
    }
}

/// `entries` packed as a zip (`kind` 0), a tar (1) or a tar.gz (2); with its file extension.
fn pack(entries: &[(String, Vec<u8>)], kind: usize) -> (Vec<u8>, &'static str) {
    use std::io::Write;
    if kind == 0 {
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        for (name, bytes) in entries {
            zip.start_file(name.as_str(), opts).expect("a zip entry");
            zip.write_all(bytes).expect("a zip entry's bytes");
        }
        return (zip.finish().expect("a zip").into_inner(), "zip");
    }
    let mut tar = tar::Builder::new(Vec::new());
    for (name, bytes) in entries {
        let mut h = tar::Header::new_ustar();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        tar.append_data(&mut h, name, bytes.as_slice())
            .expect("a tar entry");
    }
    let packed = tar.into_inner().expect("a tar");
    if kind == 1 {
        return (packed, "tar");
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&packed).expect("a tar.gz");
    (gz.finish().expect("a tar.gz"), "tar.gz")
}

/// Where a payload batch is stored, by its number. An object shared by several batches
/// (a primary identifier they give) is shared only by batches stored in one place: an
/// object's versions are numbered where they are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// The storage root (one folder, no nodes).
    Root,
    /// Bucket node 1, copied to bucket node 2.
    Buckets,
    /// Folder node 3, copied to folder node 4.
    Folders,
}

impl Storage {
    pub fn of(batch: usize) -> Storage {
        match batch % 3 {
            1 => Storage::Buckets,
            2 => Storage::Folders,
            _ => Storage::Root,
        }
    }

    fn letter(self) -> &'static str {
        match self {
            Storage::Root => "s",
            Storage::Buckets => "n",
            Storage::Folders => "f",
        }
    }
}
