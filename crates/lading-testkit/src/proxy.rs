//! A loopback HTTP/1.1 proxy in front of a real server that sees every request line and can
//! hold one request forever: the test's way to freeze a client at an exact point of a
//! conversation (a multipart upload open, its second part on the wire) and then SIGKILL it.
//!
//! It counts request lines sent and status lines answered, so a test can wait until every
//! request but the held one has had its answer, and it counts each `METHOD PATH` seen.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What the proxy has seen.
#[derive(Default)]
struct Seen {
    /// `METHOD TARGET` of each request line, in order.
    requests: Mutex<Vec<String>>,
    /// Status lines sent back.
    answers: AtomicUsize,
    /// Whether the request to hold has come (and is held).
    held: AtomicBool,
}

/// A running proxy; it stops forwarding when dropped (the held request stays unanswered).
pub struct HoldingProxy {
    pub addr: SocketAddr,
    seen: Arc<Seen>,
}

impl HoldingProxy {
    /// Forwards every connection to `target`; the first request whose line contains `hold`
    /// is not forwarded, and its connection is left as it is.
    pub fn start(target: SocketAddr, hold: &str) -> std::io::Result<HoldingProxy> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let addr = l.local_addr()?;
        let seen = Arc::new(Seen::default());
        let (s, hold) = (seen.clone(), hold.to_string());
        std::thread::spawn(move || {
            for client in l.incoming().flatten() {
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let (s, hold) = (s.clone(), hold.clone());
                std::thread::spawn(move || forward(client, server, s, &hold));
            }
        });
        Ok(HoldingProxy { addr, seen })
    }

    /// `http://ADDR`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Whether the request to hold has come.
    pub fn holding(&self) -> bool {
        self.seen.held.load(Ordering::SeqCst)
    }

    /// Requests sent that have no answer yet (the held one among them).
    pub fn unanswered(&self) -> usize {
        let sent = self.seen.requests.lock().unwrap().len();
        sent.saturating_sub(self.seen.answers.load(Ordering::SeqCst))
    }

    /// How many requests each `METHOD PATH` (query cut off) has had.
    pub fn counts(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for r in self.seen.requests.lock().unwrap().iter() {
            let key = r.split('?').next().unwrap_or(r).to_string();
            *out.entry(key).or_default() += 1;
        }
        out
    }

    /// Every request line's `METHOD TARGET`, in order.
    pub fn requests(&self) -> Vec<String> {
        self.seen.requests.lock().unwrap().clone()
    }
}

const METHODS: [&str; 5] = ["GET /", "PUT /", "POST /", "HEAD /", "DELETE /"];

fn forward(mut client: TcpStream, server: TcpStream, seen: Arc<Seen>, hold: &str) {
    // Answers: the server's bytes back to the client, counting status lines.
    {
        let (Ok(mut from), Ok(mut to)) = (server.try_clone(), client.try_clone()) else {
            return;
        };
        let seen = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 64 << 10];
            let mut tail = Vec::new();
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 || to.write_all(&buf[..n]).is_err() {
                    break;
                }
                tail.extend_from_slice(&buf[..n]);
                let lines = count(&tail, STATUS);
                seen.answers.fetch_add(lines, Ordering::SeqCst);
                // Fewer bytes than the pattern: none counted twice, none split and lost.
                keep_tail(&mut tail, STATUS.len() - 1);
            }
            let _ = to.shutdown(std::net::Shutdown::Write);
        });
    }
    let mut to = server;
    let mut buf = [0u8; 64 << 10];
    // The end of what came before, where a request line may have begun.
    let mut line = Vec::new();
    while let Ok(n) = client.read(&mut buf) {
        if n == 0 {
            break;
        }
        let mut held = false;
        for &b in &buf[..n] {
            line.push(b);
            if b != b'\n' {
                keep_tail(&mut line, 8 << 10);
                continue;
            }
            let text = String::from_utf8_lossy(&line).into_owned();
            line.clear();
            let Some(at) = METHODS.iter().filter_map(|m| text.find(m)).min() else {
                continue;
            };
            let Some(req) = text[at..].strip_suffix(" HTTP/1.1\r\n") else {
                continue;
            };
            seen.requests.lock().unwrap().push(req.to_string());
            if req.contains(hold)
                && seen
                    .held
                    .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                held = true;
            }
        }
        if held {
            // Not forwarded, never answered: the client waits until it is killed.
            std::thread::park();
            return;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// A status line's start.
const STATUS: &[u8] = b"HTTP/1.1 ";

/// Occurrences of `pat` in `hay`.
fn count(hay: &[u8], pat: &[u8]) -> usize {
    hay.windows(pat.len()).filter(|w| *w == pat).count()
}

/// Keeps the last `n` bytes of `v` (so a pattern split across reads is still found).
fn keep_tail(v: &mut Vec<u8>, n: usize) {
    if v.len() > n {
        v.drain(..v.len() - n);
    }
}
