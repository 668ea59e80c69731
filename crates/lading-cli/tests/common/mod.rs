//! What the tests that run `lading` processes on a SQLite store share.

#![allow(dead_code)]

pub mod serve;

use lading_core::time::system_clock;
use lading_engine::Engine;
use lading_ingest::checkm::{self, ManifestKind};
use lading_store_sqlite::{SqliteOptions, SqliteTree};
use lading_testkit::payload_server::PayloadServer;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::Arc;
use std::time::Duration;

/// Longest a test waits for another process's progress.
pub const UNTIL: Duration = Duration::from_secs(90);

/// A child process that is SIGKILLed when dropped, also when the test fails half-way.
pub struct Reap(pub Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An engine of this test process's own on the store the processes share.
pub async fn engine(db: &Path) -> Arc<Engine> {
    let tree = Arc::new(SqliteTree::open(db, SqliteOptions::default()).unwrap());
    let e = Arc::new(Engine::new(tree, system_clock(), "observer"));
    e.init().await.unwrap();
    e
}

/// Waits until `cond` holds, looked at again and again: another process's progress has no event
/// this process could wait on (its commits reach this handle only when it reads).
pub async fn until(what: &str, cond: impl AsyncFnMut() -> bool) {
    lading_testkit::poll::until_true(what, UNTIL, cond).await
}

/// A store, a data folder with a `demo` profile, and a config, in a temporary folder.
pub struct Setup {
    pub dir: Arc<tempfile::TempDir>,
    pub db: PathBuf,
    pub config: PathBuf,
    /// Environment every `lading` of this setup runs with.
    pub env: Vec<(&'static str, &'static str)>,
}

/// A [`Setup`] whose `demo` profile has `profile` lines added, and whose config (the data
/// folder, no reserve, no free-space floor) has `extra` lines added.
pub fn setup(profile: &str, extra: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("profiles")).unwrap();
    std::fs::write(
        data.join("profiles/demo.toml"),
        format!("collection = \"demo\"\n{profile}"),
    )
    .unwrap();
    let config = dir.path().join("lading.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\nreserve_bytes = 0\nunestimated_min_free_bytes = 0\n{}{extra}",
            data.display(),
            // Reports of reopened batches at once, unless the test is about that.
            if extra.contains("report_settle_s") {
                ""
            } else {
                "report_settle_s = 0\n"
            }
        ),
    )
    .unwrap();
    Setup {
        db: dir.path().join("lading.db"),
        dir: Arc::new(dir),
        config,
        env: Vec::new(),
    }
}

impl Setup {
    /// `lading` on this setup's store and config, and nothing from the test's environment.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_lading"));
        c.arg("--store")
            .arg(format!("sqlite:{}", self.db.display()))
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .env_remove("LADING_STORE")
            .env_remove("LADING_CONFIG")
            .envs(self.env.iter().copied());
        c
    }
}

/// Writes `files` into `payload` (served by `server`) and an object manifest of them: its URL.
pub fn object_manifest(server: &PayloadServer, payload: &Path, files: &[(&str, &[u8])]) -> String {
    let rows: Vec<Vec<String>> = files
        .iter()
        .map(|(name, bytes)| {
            std::fs::write(payload.join(name), bytes).unwrap();
            vec![server.url(name), bytes.len().to_string(), name.to_string()]
        })
        .collect();
    let m = checkm::write(
        ManifestKind::Object,
        &[checkm::FILE_URL, checkm::FILE_SIZE, checkm::FILE_NAME],
        &rows,
    );
    std::fs::write(payload.join("object.checkm"), m).unwrap();
    server.url("object.checkm")
}

/// `lading --store sqlite:STORE ARGS…`, run in the store's folder.
pub fn lading(store: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lading"))
        // In the test's own folder: without a config, a command's data folder is
        // `./lading-data`, which must not be made in the source tree.
        .current_dir(store.parent().expect("the store is in a folder"))
        .arg("--store")
        .arg(format!("sqlite:{}", store.display()))
        .args(args)
        .env_remove("LADING_STORE")
        .output()
        .expect("run lading")
}

/// A finished command's standard output and error, as text.
pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}
