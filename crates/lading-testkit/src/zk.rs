//! Starts real Apache ZooKeeper servers (Debian's `zookeeper` package, run on the machine's
//! Java) on free loopback ports, each in its own temporary directory, for tests and benchmarks.
//! A server is a foreground child process; dropping the handle kills it and removes its data.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

/// Where Debian installs the server and the logging binding it needs.
const CLASSPATH: &str = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";

/// Why a server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("ZooKeeper is not installed ({0} is missing); install Debian's `zookeeper` package")]
    NotInstalled(String),
    #[error("could not start ZooKeeper: {0}")]
    Io(#[from] std::io::Error),
    #[error("ZooKeeper on port {port} did not become ready within {secs} s; its log:\n{log}")]
    NotReady { port: u16, secs: u64, log: String },
}

/// A free loopback TCP port (free when this returns; the server binds it right after).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Sends a four-letter command and returns the reply ("" when the server does not answer).
pub fn four_letter(port: u16, cmd: &str) -> String {
    let Ok(mut s) = TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().expect("addr"),
        Duration::from_millis(500),
    ) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(cmd.as_bytes()).is_err() {
        return String::new();
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// One ZooKeeper server process.
pub struct ZkNode {
    pub port: u16,
    pub dir: PathBuf,
    cfg: PathBuf,
    main_class: &'static str,
    child: Option<(Child, ChildStdin)>,
}

impl ZkNode {
    /// Runs Java under a small shell that kills it (SIGKILL) when its stdin closes: when this
    /// handle stops it, and also when the test process dies without running any destructor.
    fn spawn(&mut self) -> Result<(), ServerError> {
        let log = std::fs::File::create(self.dir.join("server.log"))?;
        let script = "java -Xmx1g -cp \"$1\" \"$2\" \"$3\" & p=$!; read _; kill -9 $p; wait $p";
        let mut child = Command::new("sh")
            .args(["-c", script, "zk"])
            .arg(CLASSPATH)
            .arg(self.main_class)
            .arg(&self.cfg)
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let stdin = child.stdin.take().expect("piped stdin");
        self.child = Some((child, stdin));
        Ok(())
    }

    /// Whether the server answers `srvr` with a mode (standalone, leader, follower).
    pub fn mode(&self) -> Option<String> {
        let out = four_letter(self.port, "srvr");
        out.lines()
            .find_map(|l| l.strip_prefix("Mode: ").map(|m| m.trim().to_string()))
    }

    fn wait_ready(&self, within: Duration) -> Result<(), ServerError> {
        // A separate Java process starts serving: no signal reaches this one.
        if crate::poll::within_blocking(within, || self.mode()).is_some() {
            return Ok(());
        }
        Err(ServerError::NotReady {
            port: self.port,
            secs: within.as_secs(),
            log: std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default(),
        })
    }

    /// Waits until the server has expired session `id` (at most a minute): a session cut
    /// off past its timeout, with no fixed sleep. Takes the port, not `self`, so a spawned
    /// task can wait too.
    pub async fn session_gone(port: u16, id: u64) {
        crate::poll::until_with(
            "the server to expire the session",
            Duration::from_secs(60),
            move || async move {
                let held = four_letter(port, "dump").contains(&format!("0x{id:x}"));
                if held { Err("still held") } else { Ok(()) }
            },
        )
        .await
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some((mut c, stdin)) = self.child.take() {
            drop(stdin);
            let _ = c.wait();
        }
    }

    /// Starts the process again on the same port and data.
    pub fn restart(&mut self) -> Result<(), ServerError> {
        self.kill();
        self.spawn()
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// `host:port` for a connect string.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for ZkNode {
    fn drop(&mut self) {
        self.kill();
    }
}

fn check_installed() -> Result<(), ServerError> {
    for jar in CLASSPATH.split(':') {
        if !Path::new(jar).exists() {
            return Err(ServerError::NotInstalled(jar.into()));
        }
    }
    Ok(())
}

fn base_config(dir: &Path, port: u16, tick_ms: u32) -> String {
    format!(
        "tickTime={tick_ms}\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
         admin.enableServer=false\n4lw.commands.whitelist=*\nmaxSessionTimeout=60000\n\
         minSessionTimeout={}\n",
        dir.join("data").display(),
        tick_ms * 2,
    )
}

/// A standalone server.
pub struct ZkServer {
    pub node: ZkNode,
    _dir: tempfile::TempDir,
}

impl ZkServer {
    /// Starts a standalone server on a free loopback port and waits until it serves.
    pub fn start() -> Result<ZkServer, ServerError> {
        check_installed()?;
        let dir = tempfile::Builder::new().prefix("lading-zk-").tempdir()?;
        let port = free_port()?;
        std::fs::create_dir_all(dir.path().join("data"))?;
        let cfg = dir.path().join("zoo.cfg");
        // A short tick allows short session timeouts in tests (minimum is two ticks).
        std::fs::write(&cfg, base_config(dir.path(), port, 500))?;
        let mut node = ZkNode {
            port,
            dir: dir.path().to_path_buf(),
            cfg,
            main_class: "org.apache.zookeeper.server.ZooKeeperServerMain",
            child: None,
        };
        node.spawn()?;
        node.wait_ready(Duration::from_secs(60))?;
        Ok(ZkServer { node, _dir: dir })
    }

    /// The connect string, without a chroot.
    pub fn connect_string(&self) -> String {
        self.node.address()
    }
}

/// A quorum of servers on loopback.
pub struct ZkEnsemble {
    pub nodes: Vec<ZkNode>,
    _dirs: Vec<tempfile::TempDir>,
}

impl ZkEnsemble {
    /// Starts `n` servers and waits until each serves (a leader has been elected).
    pub fn start(n: usize) -> Result<ZkEnsemble, ServerError> {
        check_installed()?;
        let mut ports = Vec::new();
        for _ in 0..n {
            ports.push((free_port()?, free_port()?, free_port()?));
        }
        let servers: String = ports
            .iter()
            .enumerate()
            .map(|(i, (_, q, e))| format!("server.{}=127.0.0.1:{q}:{e}\n", i + 1))
            .collect();
        let mut nodes = Vec::new();
        let mut dirs = Vec::new();
        for (i, (client, _, _)) in ports.iter().enumerate() {
            let dir = tempfile::Builder::new().prefix("lading-zk-").tempdir()?;
            std::fs::create_dir_all(dir.path().join("data"))?;
            std::fs::write(dir.path().join("data/myid"), format!("{}\n", i + 1))?;
            let cfg = dir.path().join("zoo.cfg");
            std::fs::write(
                &cfg,
                format!(
                    "{}initLimit=10\nsyncLimit=5\n{servers}",
                    base_config(dir.path(), *client, 500)
                ),
            )?;
            let mut node = ZkNode {
                port: *client,
                dir: dir.path().to_path_buf(),
                cfg,
                main_class: "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                child: None,
            };
            node.spawn()?;
            nodes.push(node);
            dirs.push(dir);
        }
        for node in &nodes {
            node.wait_ready(Duration::from_secs(60))?;
        }
        Ok(ZkEnsemble { nodes, _dirs: dirs })
    }

    /// The connect string naming every server.
    pub fn connect_string(&self) -> String {
        self.nodes
            .iter()
            .map(ZkNode::address)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Index of the current leader, if one answers.
    pub fn leader(&self) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.is_running() && n.mode().as_deref() == Some("leader"))
    }

    /// Waits until some running node reports itself leader.
    pub fn wait_leader(&self, within: Duration) -> Option<usize> {
        crate::poll::within_blocking(within, || self.leader())
    }
}

/// A TCP relay in front of a server that can lose traffic on demand, to test connection loss,
/// lost replies and session expiry against a real server. Runs on the current tokio runtime.
pub struct Relay {
    pub port: u16,
    state: std::sync::Arc<RelayState>,
}

struct RelayState {
    drop_replies: std::sync::atomic::AtomicBool,
    drop_requests: std::sync::atomic::AtomicBool,
    refuse: std::sync::atomic::AtomicBool,
    cut: tokio::sync::Notify,
    /// Requests and replies lost so far (see [`Relay::lost`]).
    lost: tokio::sync::watch::Sender<u64>,
}

impl Relay {
    /// Starts relaying a free loopback port to `127.0.0.1:server_port`.
    pub async fn start(server_port: u16) -> std::io::Result<Relay> {
        use std::sync::atomic::Ordering::SeqCst;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = l.local_addr()?.port();
        let state = std::sync::Arc::new(RelayState {
            drop_replies: Default::default(),
            drop_requests: Default::default(),
            refuse: Default::default(),
            cut: Default::default(),
            lost: tokio::sync::watch::Sender::new(0),
        });
        let st = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = l.accept().await else {
                    return;
                };
                if st.refuse.load(SeqCst) {
                    continue;
                }
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", server_port)).await
                else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, st.clone(), true));
                tokio::spawn(pump(sr, cw, st.clone(), false));
            }
        });
        Ok(Relay { port, state })
    }

    /// The server's replies are lost, and the connection cut at the first one.
    pub fn drop_replies(&self, on: bool) {
        self.state
            .drop_replies
            .store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Requests are lost, and the connection cut at the first one.
    pub fn drop_requests(&self, on: bool) {
        self.state
            .drop_requests
            .store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// How many requests and replies were lost (each cut its connection): a test waits for
    /// it to move instead of sleeping.
    pub fn lost(&self) -> tokio::sync::watch::Receiver<u64> {
        self.state.lost.subscribe()
    }

    /// A partition: live connections are cut and new ones closed at once, until `false`.
    pub fn partition(&self, on: bool) {
        self.state
            .refuse
            .store(on, std::sync::atomic::Ordering::SeqCst);
        if on {
            self.state.cut.notify_waiters();
        }
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    st: std::sync::Arc<RelayState>,
    requests: bool,
) {
    use std::sync::atomic::Ordering::SeqCst;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = st.cut.notified() => return,
        };
        let lose = if requests {
            st.drop_requests.load(SeqCst)
        } else {
            st.drop_replies.load(SeqCst)
        };
        if lose {
            st.lost.send_modify(|n| *n += 1);
            return;
        }
        if st.refuse.load(SeqCst) || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
