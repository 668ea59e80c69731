//! A real `lading serve` process for the trust-boundary tests (`security.rs`, `trust.rs`):
//! its own folder, config, SQLite store and three tokens (an admin; Alice, who may submit to
//! collection `alpha`; Bob, to `beta`), with helpers that submit, upload and wait as a
//! client would.

use lading_testkit::events::{Api, multipart};
use lading_testkit::{checkm, files_under};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

pub const ADMIN: &str = "root-token-0123456789abcdef";
pub const ALICE: &str = "alice-token-0123456789abcdef";
pub const BOB: &str = "bob-token-0123456789abcdef";

/// A `lading serve` process with its own folder, config and store.
pub struct Serve {
    pub child: Child,
    /// The API, as any client calls it (`s.get(token, path)`, `s.base`, `s.http`).
    pub api: Api,
    pub dir: tempfile::TempDir,
    pub stderr: Arc<std::sync::Mutex<String>>,
    /// Notified at each line the server writes to its log.
    log_grew: Arc<std::sync::Condvar>,
}

impl std::ops::Deref for Serve {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `lading serve` with `extra` tables in the config (TOML), `payload` more keys of
/// `[payload]`, and depositors allowed to reach `allow` (URL prefixes).
pub fn serve_with(allow: &[String], payload: &str, extra: &str) -> Serve {
    serve_on(None, allow, payload, extra)
}

/// [`serve_with`] on the store `store` (a `zk://` URL), or on a SQLite file of its own.
pub fn serve_on(store: Option<&str>, allow: &[String], payload: &str, extra: &str) -> Serve {
    serve_running(store, allow, payload, extra, &[])
}

/// [`serve_on`], with `args` after `serve` (`--stages …`).
pub fn serve_running(
    store: Option<&str>,
    allow: &[String],
    payload: &str,
    extra: &str,
    args: &[&str],
) -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let store = store.map_or_else(
        || format!("sqlite:{}", dir.path().join("lading.db").display()),
        str::to_string,
    );
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("profiles")).unwrap();
    std::fs::write(data.join("profiles/alpha.toml"), "collection = \"alpha\"\n").unwrap();
    std::fs::write(data.join("profiles/beta.toml"), "collection = \"beta\"\n").unwrap();
    let allow: Vec<String> = allow.iter().map(|a| format!("{a:?}")).collect();
    let cfg = format!(
        "data_dir = {data:?}\nlisten = \"127.0.0.1:0\"\nreserve_bytes = 0\n\
         unestimated_min_free_bytes = 0\nprovisioning_round_ms = 200\n{extra}\n\
         [payload]\nallow = [{}]\n{}\n\
         [[tokens]]\nname = \"root\"\ntoken = \"{ADMIN}\"\nrole = \"admin\"\n\
         [[tokens]]\nname = \"alice\"\ntoken = \"{ALICE}\"\nrole = \"submitter\"\ncollections = [\"alpha\"]\n\
         [[tokens]]\nname = \"bob\"\ntoken = \"{BOB}\"\nrole = \"submitter\"\ncollections = [\"beta\"]\n",
        allow.join(", "),
        payload,
    );
    let cfg_path = dir.path().join("lading.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    // Readable by others whatever this process's umask: `serve` is to warn about it.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cfg_path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_lading"))
        .arg("--store")
        .arg(&store)
        .arg("--config")
        .arg(&cfg_path)
        .arg("serve")
        .args(args)
        .env_remove("LADING_STORE")
        .env("LADING_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run lading serve");
    let stderr = Arc::new(std::sync::Mutex::new(String::new()));
    let log_grew = Arc::new(std::sync::Condvar::new());
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let err = child.stderr.take().unwrap();
        let seen = stderr.clone();
        let grew = log_grew.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("API on http://").nth(1) {
                    let _ = tx.send(rest.trim_end_matches("/api/v1").to_string());
                }
                let mut s = seen.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
                grew.notify_all();
            }
        });
    }
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("lading serve did not start: {}", stderr.lock().unwrap()));
    Serve {
        child,
        api: Api::new(format!("http://{addr}")),
        dir,
        stderr,
        log_grew,
    }
}

pub fn serve(allow: &[String], extra: &str) -> Serve {
    serve_with(allow, "", extra)
}

impl Serve {
    /// Whether the server's log comes to hold `needle`: waits for it line by line (the
    /// reader of the server's stderr may not have read a line the server wrote before it
    /// answered), a minute at most.
    pub fn log_has(&self, needle: &str) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut log = self.stderr.lock().unwrap();
        while !log.contains(needle) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            log = self.log_grew.wait_timeout(log, left).unwrap().0;
        }
        true
    }

    /// The server's `/metrics` page (no token needed).
    pub async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub async fn upload(
        &self,
        token: &str,
        query: &str,
        name: &str,
        content: &[u8],
    ) -> (StatusCode, Value) {
        let (ct, body) = multipart("file", name, content);
        let path = format!("/api/v1/batches/upload?{query}");
        self.send(token, "POST", &path, &ct, body).await
    }

    /// Every batch id in the store.
    pub async fn batches(&self) -> Vec<String> {
        self.batch_ids(ADMIN, "limit=1000").await
    }

    /// Submits a batch by URL (`body`) as `token`: the answer's status and body.
    pub async fn submit(&self, token: &str, body: Value) -> (StatusCode, Value) {
        self.post(token, "/api/v1/batches", body).await
    }

    /// Submits a batch that must be taken (201), and waits for it to end; returns it.
    pub async fn submit_finished(&self, token: &str, body: Value) -> Value {
        let (st, v) = self.submit(token, body).await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        self.finished(v["id"].as_str().unwrap()).await
    }

    /// The only job of the batch an upload or submission answered `made` with (checked to
    /// be 201), once the batch ended: checked to have failed saying `says`.
    pub async fn only_job_failed(&self, made: (StatusCode, Value), says: &str) -> Value {
        let (st, v) = made;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        let b = self.finished(v["id"].as_str().unwrap()).await;
        let job = self.only_job(&b).await;
        assert_eq!(job["status"]["status"], "Failed", "{job}");
        assert!(message(&job).contains(says), "{says:?} in {job}");
        job
    }

    /// Submits `url` as Alice's (profile alpha) and waits for it to complete.
    pub async fn alices_completed(&self, url: &str) -> Value {
        let b =
            (self.submit_finished(ALICE, json!({"payload_url": url, "profile": "alpha"}))).await;
        assert_eq!(b["status"]["status"], "Completed", "{b}");
        b
    }

    /// Waits for batch `bid` to end (Completed or Failed), on its event stream; returns it.
    pub async fn finished(&self, bid: &str) -> Value {
        let ended =
            |v: &Value| matches!(v["status"]["status"].as_str(), Some("Completed" | "Failed"));
        (self.api)
            .until_batch(ADMIN, bid, Duration::from_secs(120), ended)
            .await
    }

    /// The jobs of a finished batch, read as the admin.
    pub async fn jobs_of(&self, batch: &Value) -> Vec<Value> {
        let mut out = Vec::new();
        for ids in batch["jobs"].as_object().unwrap().values() {
            for id in ids.as_array().unwrap() {
                let (_, j) = self
                    .get(ADMIN, &format!("/api/v1/jobs/{}", id.as_str().unwrap()))
                    .await;
                out.push(j);
            }
        }
        out
    }

    /// The one job of a finished batch, with the batch's failure message when there is none.
    pub async fn only_job(&self, batch: &Value) -> Value {
        let jobs = self.jobs_of(batch).await;
        assert_eq!(jobs.len(), 1, "{batch}");
        jobs.into_iter().next().unwrap()
    }

    /// Bob's upload of a single-file batch manifest of one `row`; its one job once the batch
    /// has finished.
    pub async fn single_file_batch_job(&self, row: &str) -> Value {
        let b = self.single_file_batch(row).await;
        self.only_job(&b).await
    }

    /// Bob's upload of a single-file batch manifest of one `row`, once it has finished.
    /// Uploads `text` as Bob's single-file batch manifest (profile beta).
    pub async fn bobs_batch_manifest(&self, text: &str) -> (StatusCode, Value) {
        let q = "profile=beta&type=single-file-batch-manifest";
        self.upload(BOB, q, "m.checkm", text.as_bytes()).await
    }

    pub async fn single_file_batch(&self, row: &str) -> Value {
        let m = checkm(
            "mrt-single-file-batch-manifest",
            "nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileLastModified | nfo:fileName",
            &[row.to_string()],
        );
        let (st, v) = self.bobs_batch_manifest(&m).await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        self.finished(v["id"].as_str().unwrap()).await
    }

    /// Asserts no file in the working folders grew large (a bomb or endless download cut
    /// off in time leaves none).
    pub fn no_large_working_files(&self) {
        for f in files_under(&self.data().join("work")) {
            let n = std::fs::metadata(&f).unwrap().len();
            assert!(n < 2 << 20, "{} is {n} bytes", f.display());
        }
    }

    /// Asserts a refused payload left nothing: no large working file, nothing stored.
    pub fn left_nothing(&self) {
        self.no_large_working_files();
        assert!(self.stored_files().is_empty());
    }

    /// Files under the storage root.
    pub fn stored_files(&self) -> Vec<PathBuf> {
        files_under(&self.data().join("storage"))
    }

    /// Asserts `/api/v1/health` answers OK: a server a flood locked others out of refuses the
    /// connection, closes it, or never answers (the 30 s cap). No duration is asserted: on a
    /// loaded machine a healthy answer can be slow.
    pub async fn healthy(&self) {
        let r = reqwest::Client::new()
            .get(format!("{}/api/v1/health", self.base))
            .timeout(Duration::from_secs(30))
            .send()
            .await;
        match r {
            Ok(r) => assert!(r.status().is_success(), "health answered {}", r.status()),
            Err(e) => panic!("health did not answer: {e}"),
        }
    }
}

pub fn message(v: &Value) -> String {
    v["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}
