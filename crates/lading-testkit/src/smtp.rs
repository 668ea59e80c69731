//! A minimal SMTP receiver on a free loopback port, for tests of report mails.

use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A minimal SMTP receiver: speaks the protocol for real (greeting, EHLO, MAIL, RCPT, DATA,
/// QUIT) and hands each message over.
pub struct Smtp {
    pub port: u16,
    pub messages: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Smtp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Smtp {
    pub async fn start() -> Smtp {
        Smtp::start_holding(0).await
    }

    /// A receiver that, for the first `hold` messages, takes the whole message and hands it
    /// over but never gives the final `250` (as a server that dies at that moment would): the
    /// connection waits until its client goes away. Later messages are accepted.
    pub async fn start_holding(hold: usize) -> Smtp {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Smtp::serve(hold, l)
    }

    /// A receiver on `port` (one a test kept free, to start the server late: an SMTP server
    /// that comes back after an outage).
    pub async fn start_on(port: u16) -> Smtp {
        let l = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        Smtp::serve(0, l)
    }

    fn serve(hold: usize, l: tokio::net::TcpListener) -> Smtp {
        let left = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(hold));
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let tx = tx.clone();
                let left = left.clone();
                tokio::spawn(async move {
                    let (r, mut w) = s.into_split();
                    let mut r = BufReader::new(r);
                    let _ = w.write_all(b"220 localhost ESMTP test\r\n").await;
                    let mut line = String::new();
                    let mut data: Option<String> = None;
                    loop {
                        line.clear();
                        if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        if let Some(d) = data.as_mut() {
                            if line == ".\r\n" {
                                let _ = tx.send(data.take().unwrap());
                                let held = left
                                    .fetch_update(
                                        std::sync::atomic::Ordering::SeqCst,
                                        std::sync::atomic::Ordering::SeqCst,
                                        |n| n.checked_sub(1),
                                    )
                                    .is_ok();
                                if held {
                                    // No 250: wait for the client to go away.
                                    let _ = r.read_line(&mut line).await;
                                    return;
                                }
                                let _ = w.write_all(b"250 2.0.0 queued\r\n").await;
                            } else {
                                d.push_str(&line);
                            }
                            continue;
                        }
                        let verb = line.get(..4).unwrap_or("").to_ascii_uppercase();
                        let reply: &[u8] = match verb.as_str() {
                            "EHLO" | "HELO" => b"250 localhost\r\n",
                            "MAIL" | "RCPT" | "RSET" | "NOOP" => b"250 2.0.0 ok\r\n",
                            "DATA" => {
                                data = Some(String::new());
                                b"354 go ahead\r\n"
                            }
                            "QUIT" => {
                                let _ = w.write_all(b"221 bye\r\n").await;
                                return;
                            }
                            _ => b"502 5.5.2 not implemented\r\n",
                        };
                        let _ = w.write_all(reply).await;
                    }
                });
            }
        });
        Smtp {
            port,
            messages: tokio::sync::Mutex::new(rx),
            task,
        }
    }

    /// The next message (its headers and body), waiting at most 90 s.
    pub async fn next(&self) -> String {
        tokio::time::timeout(Duration::from_secs(90), self.messages.lock().await.recv())
            .await
            .expect("a mail")
            .expect("the receiver is running")
    }
}
