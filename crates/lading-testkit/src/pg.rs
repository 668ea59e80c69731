//! Starts a real PostgreSQL server (Debian's `postgresql` package) on a free loopback port, in
//! its own temporary directory, for tests. `initdb` refuses to run as root, so under root the
//! server runs as Debian's `postgres` user. Dropping the handle stops the server (fast
//! shutdown) and removes its data; the server also stops when the test process dies.

use crate::zk::free_port;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

/// Why a server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error(
        "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb); install Debian's `postgresql` package"
    )]
    NotInstalled,
    #[error("could not start PostgreSQL: {0}")]
    Io(#[from] std::io::Error),
    #[error("PostgreSQL: {what} failed; its output:\n{log}")]
    Failed { what: String, log: String },
    #[error("PostgreSQL on port {port} did not become ready within {secs} s; its log:\n{log}")]
    NotReady { port: u16, secs: u64, log: String },
}

/// The newest installed server's `bin` folder.
fn bin_dir() -> Result<PathBuf, PgError> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| PgError::NotInstalled)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b).ok_or(PgError::NotInstalled)
}

/// The uid and gid to run as: ours, or `postgres`'s when we are root.
fn run_as() -> Result<Option<(u32, u32)>, PgError> {
    let out = Command::new("id").arg("-u").output()?;
    if String::from_utf8_lossy(&out.stdout).trim() != "0" {
        return Ok(None);
    }
    let id = |flag: &str| -> Result<u32, PgError> {
        let o = Command::new("id").args([flag, "postgres"]).output()?;
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .map_err(|_| PgError::Failed {
                what: "finding the `postgres` user (needed to run the server as root)".into(),
                log: String::from_utf8_lossy(&o.stderr).into_owned(),
            })
    };
    Ok(Some((id("-u")?, id("-g")?)))
}

fn command(program: &Path, user: Option<(u32, u32)>) -> Command {
    let mut c = Command::new(program);
    if let Some((uid, gid)) = user {
        c.uid(uid).gid(gid);
    }
    c
}

/// A private PostgreSQL server. Its superuser is `lading`, with trust authentication on
/// loopback only.
pub struct PgServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<(Child, ChildStdin)>,
}

impl PgServer {
    pub fn start() -> Result<PgServer, PgError> {
        let bin = bin_dir()?;
        let user = run_as()?;
        let dir = tempfile::Builder::new().prefix("lading-pg-").tempdir()?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
        }
        let data = dir.path().join("data");
        let out = command(&bin.join("initdb"), user)
            .arg("-D")
            .arg(&data)
            .args(["-U", "lading", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()?;
        if !out.status.success() {
            return Err(PgError::Failed {
                what: "initdb".into(),
                log: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        let port = free_port()?;
        let log_path = dir.path().join("server.log");
        let mut log = std::fs::File::create(&log_path)?;
        // Under a small shell that stops the server when its stdin closes: when this handle
        // is dropped, and also when the test process dies without running any destructor.
        let script = "\"$1\" -D \"$2\" -p \"$3\" -k \"$4\" -c listen_addresses=127.0.0.1 \
                      -c max_connections=200 & p=$!; read _; kill -INT $p; wait $p";
        let mut child = command(Path::new("sh"), user)
            .args(["-c", script, "pg"])
            .arg(bin.join("postgres"))
            .arg(&data)
            .arg(port.to_string())
            .arg(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().expect("piped stdin");
        // Its log is copied to `server.log`; the line saying it accepts connections is the
        // signal that it is ready (`false`: the log ended first).
        let (tx, ready) = std::sync::mpsc::channel();
        let err = BufReader::new(child.stderr.take().expect("piped stderr"));
        std::thread::spawn(move || {
            for line in err.lines().map_while(Result::ok) {
                let _ = writeln!(log, "{line}");
                if line.contains("ready to accept connections") {
                    let _ = tx.send(true);
                }
            }
            let _ = tx.send(false);
        });
        let server = PgServer {
            port,
            dir,
            child: Some((child, stdin)),
        };
        let within = Duration::from_secs(60);
        match ready.recv_timeout(within) {
            Ok(true) => Ok(server),
            _ => Err(PgError::NotReady {
                port,
                secs: within.as_secs(),
                log: std::fs::read_to_string(&log_path).unwrap_or_default(),
            }),
        }
    }

    /// A URL for database `db` (`postgres` always exists; see [`PgServer::create_db`]).
    pub fn url(&self, db: &str) -> String {
        format!("postgres://lading@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates an empty database named `name` and returns its URL.
    pub fn create_db(&self, name: &str) -> Result<String, PgError> {
        let bin = bin_dir()?;
        let out = Command::new(bin.join("createdb"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "lading",
                name,
            ])
            .output()?;
        if !out.status.success() {
            return Err(PgError::Failed {
                what: format!("createdb {name}"),
                log: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(self.url(name))
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some((mut c, stdin)) = self.child.take() {
            drop(stdin);
            let _ = c.wait();
        }
    }
}
