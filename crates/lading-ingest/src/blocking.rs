//! Blocking work (file-system calls, hashing, unpacking, the inventory's SQLite) kept off the
//! async threads: on tokio's blocking pool, or — on a thread that asked for it, the
//! simulator's — in place.
//!
//! Why in place: a blocking task ends when the operating system's scheduler says, so where
//! its completion falls among the other tasks of a run is not decided by the seed. The
//! simulator runs every process on one thread with paused time; done in place, the work takes
//! no simulated time and lands exactly where the seed's run put it, and the same seed gives
//! the same run.

use std::cell::Cell;
use std::path::{Path, PathBuf};

thread_local! {
    static IN_PLACE: Cell<bool> = const { Cell::new(false) };
}

/// From now on, blocking work started on this thread runs in place. For a thread that runs a
/// current-thread runtime and must repeat exactly (the simulator's); nothing else calls it.
pub fn in_place_on_this_thread() {
    IN_PLACE.with(|c| c.set(true));
}

/// Whether blocking work on this thread runs in place.
pub fn in_place() -> bool {
    IN_PLACE.with(Cell::get)
}

/// Blocking work that did not return: it panicked (or its runtime is shutting down).
#[derive(Debug, thiserror::Error)]
#[error("blocking work stopped: {0}")]
pub struct Stopped(String);

impl From<Stopped> for std::io::Error {
    fn from(e: Stopped) -> Self {
        std::io::Error::other(e.to_string())
    }
}

/// Runs `f` on the blocking pool (in place on a thread that asked for it), and its result.
pub async fn run<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Stopped> {
    if in_place() {
        return std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
            Stopped(
                p.downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into()),
            )
        });
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Stopped(e.to_string()))
}

/// [`run`] of an I/O step: one error either way.
pub async fn io<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    run(f).await?
}

/// `std::fs::read`, off the async threads.
pub async fn read(p: impl AsRef<Path>) -> std::io::Result<Vec<u8>> {
    let p = p.as_ref().to_path_buf();
    io(move || std::fs::read(p)).await
}

/// `std::fs::read_to_string`, off the async threads.
pub async fn read_to_string(p: impl AsRef<Path>) -> std::io::Result<String> {
    let p = p.as_ref().to_path_buf();
    io(move || std::fs::read_to_string(p)).await
}

/// `std::fs::metadata`, off the async threads.
pub async fn metadata(p: impl AsRef<Path>) -> std::io::Result<std::fs::Metadata> {
    let p = p.as_ref().to_path_buf();
    io(move || std::fs::metadata(p)).await
}

/// `std::fs::create_dir_all`, off the async threads.
pub async fn create_dir_all(p: impl AsRef<Path>) -> std::io::Result<()> {
    let p = p.as_ref().to_path_buf();
    io(move || std::fs::create_dir_all(p)).await
}

/// `std::fs::remove_file`, off the async threads.
pub async fn remove_file(p: impl AsRef<Path>) -> std::io::Result<()> {
    let p = p.as_ref().to_path_buf();
    io(move || std::fs::remove_file(p)).await
}

/// `std::fs::rename`, off the async threads.
pub async fn rename(from: impl AsRef<Path>, to: impl AsRef<Path>) -> std::io::Result<()> {
    let (from, to): (PathBuf, PathBuf) = (from.as_ref().into(), to.as_ref().into());
    io(move || std::fs::rename(from, to)).await
}

/// A file written from async code: through tokio's file (its writes on the blocking pool),
/// or, on a thread that asked for work in place ([`in_place_on_this_thread`]), written
/// directly, so that no write's end depends on another thread.
pub enum Writer {
    Pool(tokio::fs::File),
    InPlace(std::fs::File),
}

impl Writer {
    /// Creates (or truncates) the file at `p`.
    pub async fn create(p: impl AsRef<Path>) -> std::io::Result<Writer> {
        if in_place() {
            return std::fs::File::create(p).map(Writer::InPlace);
        }
        tokio::fs::File::create(p).await.map(Writer::Pool)
    }
}

impl tokio::io::AsyncWrite for Writer {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Writer::Pool(f) => std::pin::Pin::new(f).poll_write(cx, buf),
            Writer::InPlace(f) => std::task::Poll::Ready(std::io::Write::write(f, buf)),
        }
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Writer::Pool(f) => std::pin::Pin::new(f).poll_flush(cx),
            Writer::InPlace(f) => std::task::Poll::Ready(std::io::Write::flush(f)),
        }
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Writer::Pool(f) => std::pin::Pin::new(f).poll_shutdown(cx),
            Writer::InPlace(_) => std::task::Poll::Ready(Ok(())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_work_runs_on_the_calling_thread_and_a_panic_is_an_error() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let here = std::thread::current().id();
        rt.block_on(async {
            // On the pool by default: another thread.
            let there = run(|| std::thread::current().id()).await.unwrap();
            assert_ne!(there, here);
            assert!(!in_place());
        });
        in_place_on_this_thread();
        rt.block_on(async {
            assert_eq!(run(|| std::thread::current().id()).await.unwrap(), here);
            let e = run(|| -> u32 { panic!("the disk caught fire") })
                .await
                .unwrap_err();
            assert!(e.to_string().contains("the disk caught fire"), "{e}");
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("a/b");
            create_dir_all(&p).await.unwrap();
            std::fs::write(p.join("f"), b"x").unwrap();
            rename(p.join("f"), p.join("g")).await.unwrap();
            assert_eq!(read(p.join("g")).await.unwrap(), b"x");
            assert_eq!(read_to_string(p.join("g")).await.unwrap(), "x");
            assert_eq!(metadata(p.join("g")).await.unwrap().len(), 1);
            remove_file(p.join("g")).await.unwrap();
            let missing = read(p.join("g")).await.unwrap_err();
            assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
        });
    }
}
