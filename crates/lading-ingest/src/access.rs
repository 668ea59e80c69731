//! The access queue's stage (seed 001): a request for a stored object version is assembled
//! as a zip of the version's files, and the request moves to Completed (or Failed with the
//! reason). Run by the shared runtime ([`lading_worker::run_loops`]) like every other stage;
//! the HTTP side (requests, tokens, serving the zip) is in `lading-server`.

use crate::Ingest;
use lading_core::Event;
use lading_core::layout::{AccessId, AccessQueue};
use lading_engine::AccessLease;
use lading_worker::{Acquire, Shutdown};
use std::io::Write;

pub use crate::sources::{Source, files, source};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Where request `id`'s zip is written.
pub fn zip_path(cfg: &crate::Config, queue: AccessQueue, id: &AccessId) -> PathBuf {
    cfg.data_dir
        .join("access")
        .join(format!("{}-{id}.zip", queue.name()))
}

/// Where request `id`'s bag (`format: bag`) is written.
pub fn bag_path(cfg: &crate::Config, queue: AccessQueue, id: &AccessId) -> PathBuf {
    cfg.data_dir
        .join("access")
        .join(format!("{}-{id}.tar", queue.name()))
}

/// Whether an access request asks for a bag (its token's `format`).
pub fn wants_bag(token: &lading_core::layout::AccessToken) -> bool {
    token.extra.get("format").and_then(|f| f.as_str()) == Some("bag")
}

/// Writes the files of the version folder `dir` as a zip to `out`, which need not be seekable
/// (entries are stored uncompressed, with ZIP64 for files over 4 GiB); returns `out`, flushed.
/// The version's own record at its top ([`crate::files::VERSION_FILE`]: Lading's, naming the
/// host's folder, the job and the batch) is left out, as a storage node's copy leaves it out:
/// a version's zip is its object's files, wherever it is stored.
pub fn write_zip<W: Write>(dir: &Path, out: W) -> std::io::Result<W> {
    let mut list = files(dir)?;
    list.retain(|(name, _, _)| name != crate::files::VERSION_FILE);
    let mut zip = zip::ZipWriter::new_stream(std::io::BufWriter::with_capacity(64 << 10, out));
    for (name, path, size) in list {
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .large_file(size >= u32::MAX as u64);
        zip.start_file(name, opts).map_err(std::io::Error::other)?;
        std::io::copy(&mut std::fs::File::open(&path)?, &mut zip)?;
    }
    let mut w = zip.finish().map_err(std::io::Error::other)?;
    w.flush()?;
    w.into_inner().into_inner().map_err(|e| e.into_error())
}

/// Writes `src` as a zip to `out`, which need not be seekable. A node's copies are read
/// on the runtime; the zip's writes go to the blocking pool (`out` may block: a file, a
/// response body's channel), or are made in place on a thread that asked for it (the
/// simulator's), so that a run does not depend on another thread.
pub async fn write_source_zip<W: Write + Send + 'static>(
    src: &Source,
    out: W,
) -> std::io::Result<W> {
    let (node, ark, version, list) = match src {
        Source::Dir(d) => {
            let d = d.clone();
            return crate::blocking::io(move || write_zip(&d, out)).await;
        }
        Source::Node {
            node,
            ark,
            version,
            files,
        } => (node, ark, *version, files),
    };
    type Zip<W> = zip::ZipWriter<zip::write::StreamWriter<std::io::BufWriter<W>>>;
    // One step of the zip's own, off the async threads; the writer goes there and back.
    async fn step<W: Write + Send + 'static>(
        zip: Zip<W>,
        f: impl FnOnce(&mut Zip<W>) -> std::io::Result<()> + Send + 'static,
    ) -> std::io::Result<Zip<W>> {
        crate::blocking::io(move || {
            let mut zip = zip;
            f(&mut zip)?;
            Ok(zip)
        })
        .await
    }
    let mut zip = zip::ZipWriter::new_stream(std::io::BufWriter::with_capacity(64 << 10, out));
    for f in list {
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .large_file(f.size >= u32::MAX as u64);
        let name = f.path.clone();
        zip = step(zip, move |z| {
            z.start_file(name, opts).map_err(std::io::Error::other)
        })
        .await?;
        let (at, rel) = f.stored_at(version);
        let reader = node
            .open_read(ark, at, rel)
            .await
            .map_err(|e| std::io::Error::other(e.what))?
            .ok_or_else(|| {
                std::io::Error::other(format!("{}: {ark}|{at}|{rel} is missing", node.name()))
            })?;
        match reader {
            crate::nodes::Reader::File(mut file) => {
                zip = step(zip, move |z| std::io::copy(&mut file, z).map(|_| ())).await?;
            }
            crate::nodes::Reader::Stream(mut s) => {
                use futures_util::StreamExt;
                while let Some(chunk) = s.next().await {
                    let chunk = chunk.map_err(std::io::Error::other)?;
                    zip = step(zip, move |z| z.write_all(&chunk)).await?;
                }
            }
        }
    }
    crate::blocking::io(move || {
        let mut w = zip.finish().map_err(std::io::Error::other)?;
        w.flush()?;
        w.into_inner().into_inner().map_err(|e| e.into_error())
    })
    .await
}

/// Writes `src` as a zip to `out` (through `out.part`, fsynced, then renamed).
pub async fn source_zip_to_file(src: &Source, out: &Path) -> std::io::Result<()> {
    let part = out.with_extension("zip.part");
    let p = part.clone();
    let file = crate::blocking::io(move || {
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::File::create(&p)
    })
    .await?;
    let f = write_source_zip(src, file).await?;
    let out = out.to_path_buf();
    crate::blocking::io(move || {
        f.sync_all()?;
        std::fs::rename(&part, out)
    })
    .await
}

async fn assemble(ingest: &Ingest, lease: &AccessLease) -> Result<(), String> {
    if let Some(why) = &lease.unreadable {
        return Err(why.clone());
    }
    let ark = lease
        .token
        .ark
        .as_deref()
        .ok_or("the request's token names no `ark` (the object to assemble)")?;
    let version = lease
        .token
        .version
        .ok_or("the request's token names no `version` (of the object to assemble)")?;
    let src = source(ingest, ark, version, None).await?;
    if wants_bag(&lease.token) {
        let out = bag_path(&ingest.cfg, lease.queue, &lease.id);
        let now = ingest.engine.clock().now_ms();
        let r = crate::restore::bag_to_file(&src, ark, version, now, &out)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(request = %lease.id, bag = %r.name, files = r.payload_files, "assembled a bag");
        return Ok(());
    }
    let out = zip_path(&ingest.cfg, lease.queue, &lease.id);
    source_zip_to_file(&src, &out)
        .await
        .map_err(|e| e.to_string())
}

/// One access queue as a loop of the runtime.
struct AccessLoop {
    ingest: Arc<Ingest>,
    queue: AccessQueue,
}

/// How long an idle access loop waits before asking again (it also wakes on new requests,
/// on a request's status landing, on the queue's pause flag and on a stop).
const IDLE_WAIT: Duration = Duration::from_secs(60);

impl Acquire for AccessLoop {
    type Lease = AccessLease;
    const WHAT: &'static str = "access request";
    fn state_name(&self) -> &str {
        self.queue.lock_name()
    }
    async fn wait(&self, stop: Shutdown) -> Result<Option<AccessLease>, String> {
        self.ingest
            .engine
            .wait_access_or(self.queue, IDLE_WAIT, stop.into_stopped())
            .await
            .map_err(|e| e.to_string())
    }
    async fn handle(&self, lease: AccessLease, _: &mut Shutdown) -> Option<AccessLease> {
        use tracing::Instrument;
        let e = &self.ingest.engine;
        let span = tracing::info_span!("access", request = %lease.id, queue = lease.queue.name());
        let stage = ACCESS_STAGE_NAMES[usize::from(self.queue == AccessQueue::Large)];
        let _running =
            self.ingest
                .stats
                .running("access", lease.id.as_str(), stage, e.clock().now_ms());
        let r = async {
            // One its assembler left in Processing is assembled again from the start.
            let lease = match lease.status.status {
                lading_core::AccessState::Pending => {
                    e.access_advance(lease, Event::Success).await?
                }
                _ => lease,
            };
            let (ev, msg) = match assemble(&self.ingest, &lease).await {
                Ok(()) => (Event::Success, None),
                Err(why) => (Event::Fail, Some(why)),
            };
            e.access_transition(lease, ev, msg).await
        }
        .instrument(span.clone())
        .await;
        if let Err(err) = r {
            let _in = span.enter();
            tracing::warn!(queue = self.queue.name(), "access request: {err}");
        }
        None
    }
    async fn release(&self, lease: AccessLease) {
        let _ = self.ingest.engine.release_access_lease(lease).await;
    }
}

/// The access queues as stage names (`lading worker --stages access-small`), small first.
pub const ACCESS_STAGE_NAMES: [&str; 2] = ["access-small", "access-large"];

/// Serves one access queue until shut down: takes the oldest Pending request, assembles its
/// zip, marks it Completed (or Failed with the reason).
pub async fn run(ingest: Arc<Ingest>, queue: AccessQueue, shutdown: Shutdown) {
    lading_worker::run_loops(Arc::new(AccessLoop { ingest, queue }), 1, shutdown).await
}
