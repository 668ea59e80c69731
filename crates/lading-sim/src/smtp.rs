//! The outside world's mail relay: an SMTP server on a pipe in memory, which Lading's own
//! SMTP client (`lading_ingest::outbox::mail_over`, lettre's conversation) talks to as it
//! would to a relay on the network. As the seed says, a connection is slow, closed after the
//! greeting, refused for a while (`421`), or takes the whole mail and goes away before its
//! `250` (the client sends it again, with the same Message-ID). Every mail it takes is
//! handed to `deliver` with its Message-ID and what it says (recipients, subject, body).

use lading_core::random::{Random, Seeded};
use serde_json::{Value, json};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream,
};

/// The longest command or text line the relay reads (SMTP's own limit is 1,000 octets).
const MAX_LINE: usize = 64 * 1024;
/// The most a mail's text may hold.
const MAX_MAIL: usize = 4 << 20;

/// The client's end of a connection to the relay.
#[derive(Debug)]
pub struct Pipe(pub DuplexStream);

impl AsyncRead for Pipe {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Pipe {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl lettre::transport::smtp::client::AsyncTokioStream for Pipe {
    fn peer_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        Ok(std::net::SocketAddr::from(([127, 0, 0, 1], 25)))
    }
}

/// How one connection goes, drawn when it opens.
#[derive(Clone, Copy, PartialEq)]
enum Fate {
    Answers,
    /// Closed right after the greeting.
    Closes,
    /// `421` to MAIL: the relay is not taking mail now.
    Refuses,
    /// Takes the mail, then goes away before its `250`.
    LosesAnswer,
}

/// A connection to a new session of the relay: the client's end, and the session's task.
pub fn connect(
    rng: &Seeded,
    deliver: impl Fn(String, Value) + Send + 'static,
) -> (Pipe, tokio::task::JoinHandle<()>) {
    let (client, server) = tokio::io::duplex(16 * 1024);
    let fate = match rng.below(100) {
        0..4 => Fate::Closes,
        4..8 => Fate::Refuses,
        8..14 => Fate::LosesAnswer,
        _ => Fate::Answers,
    };
    let slow = Duration::from_millis(rng.below(100) as u64);
    (
        Pipe(client),
        tokio::spawn(session(server, fate, slow, deliver)),
    )
}

async fn session(
    stream: DuplexStream,
    fate: Fate,
    slow: Duration,
    deliver: impl Fn(String, Value) + Send + 'static,
) {
    let (r, mut w) = tokio::io::split(stream);
    let mut r = BufReader::new(r);
    tokio::time::sleep(slow).await;
    if w.write_all(b"220 relay.sim.invalid ESMTP\r\n")
        .await
        .is_err()
        || fate == Fate::Closes
    {
        return;
    }
    let mut rcpt: Vec<String> = Vec::new();
    let mut line = Vec::new();
    // Each turn reads a command: the session ends with its connection.
    while let Some(cmd) = read_line(&mut r, &mut line).await {
        let verb = cmd.get(..4).unwrap_or_default().to_ascii_uppercase();
        let reply: &[u8] = match verb.as_str() {
            "EHLO" | "HELO" => b"250 relay.sim.invalid\r\n",
            "MAIL" if fate == Fate::Refuses => b"421 4.3.2 not taking mail now\r\n",
            "MAIL" => {
                rcpt.clear();
                b"250 2.1.0 ok\r\n"
            }
            "RCPT" => {
                let addr = cmd.split_once(':').map_or("", |(_, a)| a.trim());
                rcpt.push(addr.trim_matches(['<', '>']).to_string());
                b"250 2.1.5 ok\r\n"
            }
            "RSET" | "NOOP" => b"250 2.0.0 ok\r\n",
            "DATA" => {
                if w.write_all(b"354 go ahead\r\n").await.is_err() {
                    return;
                }
                let Some(text) = read_data(&mut r, &mut line).await else {
                    return;
                };
                match parse(&text, &rcpt) {
                    Ok((key, content)) => deliver(key, content),
                    Err(why) => deliver(String::new(), json!({ "unreadable": why })),
                }
                if fate == Fate::LosesAnswer {
                    return;
                }
                b"250 2.0.0 queued\r\n"
            }
            "QUIT" => {
                let _ = w.write_all(b"221 2.0.0 bye\r\n").await;
                return;
            }
            _ => b"502 5.5.2 not implemented\r\n",
        };
        if w.write_all(reply).await.is_err() {
            return;
        }
    }
}

/// One line, without its CRLF; `None` at the end of the connection or past [`MAX_LINE`].
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> Option<String> {
    buf.clear();
    let n = (&mut *r)
        .take(MAX_LINE as u64)
        .read_until(b'\n', buf)
        .await
        .ok()?;
    if n == 0 || !buf.ends_with(b"\n") {
        return None;
    }
    let text = String::from_utf8_lossy(buf);
    Some(text.trim_end_matches(['\r', '\n']).to_string())
}

/// A mail's text after DATA, up to the line holding only a dot, with its dot-stuffing undone.
async fn read_data<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> Option<Vec<String>> {
    let mut lines = Vec::new();
    let mut size = 0;
    while let Some(l) = read_line(r, buf).await {
        if l == "." {
            return Some(lines);
        }
        size += l.len() + 2;
        if size > MAX_MAIL {
            return None;
        }
        lines.push(l.strip_prefix('.').map_or(l.clone(), str::to_string));
    }
    None
}

/// A mail's Message-ID, and its recipients, subject and body (lines joined by `\n`).
fn parse(lines: &[String], rcpt: &[String]) -> Result<(String, Value), String> {
    let blank = lines
        .iter()
        .position(String::is_empty)
        .ok_or("no blank line after the headers")?;
    // Headers, unfolded.
    let mut headers: Vec<(String, String)> = Vec::new();
    for l in &lines[..blank] {
        if l.starts_with([' ', '\t']) {
            let (_, v) = headers
                .last_mut()
                .ok_or("a continuation before any header")?;
            v.push(' ');
            v.push_str(l.trim());
        } else {
            let (k, v) = l
                .split_once(':')
                .ok_or(format!("a header without a colon: {l:?}"))?;
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let header = |k: &str| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let key = header("message-id").ok_or("no Message-ID")?;
    let text = &lines[blank + 1..];
    let body = match header("content-transfer-encoding").as_deref() {
        None | Some("7bit") | Some("8bit") => text.join("\n"),
        Some("quoted-printable") => quoted_printable(text)?,
        Some(other) => return Err(format!("a body in {other}, which the relay does not read")),
    };
    Ok((
        key,
        json!({
            "to": rcpt,
            "subject": header("subject").unwrap_or_default(),
            "body": body,
        }),
    ))
}

/// A quoted-printable body's text (RFC 2045 §6.7): `=XX` is a byte, a line ending in `=`
/// goes on in the next.
fn quoted_printable(lines: &[String]) -> Result<String, String> {
    let mut out: Vec<u8> = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let (l, soft) = match l.strip_suffix('=') {
            Some(rest) => (rest, true),
            None => (l.as_str(), false),
        };
        let b = l.as_bytes();
        let mut k = 0;
        while k < b.len() {
            if b[k] == b'=' {
                let hex = l
                    .get(k + 1..k + 3)
                    .ok_or(format!("a cut escape in {l:?}"))?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("={hex} in {l:?}"))?);
                k += 3;
            } else {
                out.push(b[k]);
                k += 1;
            }
        }
        if !soft && i + 1 < lines.len() {
            out.push(b'\n');
        }
    }
    String::from_utf8(out).map_err(|e| format!("a body that is not UTF-8: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lading's SMTP client, over a pipe to the relay: the relay reads back exactly what was
    /// sent (a line starting with a dot, and a line long enough to be quoted-printable).
    #[tokio::test]
    async fn the_relay_reads_back_what_ladings_client_sends() {
        let long = "x".repeat(900) + " é";
        let body = format!("Completed (1):\n  jid0000000001\n.a dot first\n{long}\n");
        for (i, text) in [body.clone(), "plain\n".to_string()]
            .into_iter()
            .enumerate()
        {
            let mail = lading_ingest::report::format_mail(
                "lading@sim.invalid",
                &["a@sim.invalid".to_string()],
                "report",
                text.clone(),
                Some(format!("<lading.b{i}.report-1@sim.invalid>")),
            )
            .unwrap();
            let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let (client, server) = tokio::io::duplex(1024);
            let g = got.clone();
            let relay = tokio::spawn(session(
                server,
                Fate::Answers,
                Duration::ZERO,
                move |k, v| g.lock().unwrap().push((k, v)),
            ));
            lading_ingest::report::send_formatted(Box::new(Pipe(client)), &mail)
                .await
                .unwrap();
            relay.await.unwrap();
            let got = got.lock().unwrap().clone();
            assert_eq!(got.len(), 1, "{got:?}");
            assert_eq!(got[0].0, format!("<lading.b{i}.report-1@sim.invalid>"));
            assert_eq!(got[0].1["to"], json!(["a@sim.invalid"]));
            assert_eq!(got[0].1["subject"], "report");
            assert_eq!(
                got[0].1["body"].as_str().unwrap().trim_end(),
                text.trim_end()
            );
        }
    }

    #[test]
    fn a_mail_the_relay_cannot_read_is_named() {
        let lines = |t: &str| t.lines().map(str::to_string).collect::<Vec<_>>();
        let e = parse(&lines("Subject: x\n\nbody"), &[]).unwrap_err();
        assert!(e.contains("Message-ID"), "{e}");
        let e = parse(
            &lines("Message-ID: <k>\nContent-Transfer-Encoding: base64\n\nAAAA"),
            &[],
        )
        .unwrap_err();
        assert!(e.contains("base64"), "{e}");
        let e = quoted_printable(&lines("a=4")).unwrap_err();
        assert!(e.contains("cut escape"), "{e}");
    }
}
