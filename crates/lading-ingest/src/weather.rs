//! Errors classified once, where they happen (SPEC §11): whether a failed call means the
//! service it went to is *unavailable* (a refused or reset connection, a timeout, a DNS or TLS
//! failure, a 5xx, throttling), which costs the job time and no attempt, and the cause in
//! plain words. Everything else is about the job's own request.

use std::error::Error as StdError;

/// The plain cause of an I/O error that says the other side is not there.
pub fn io_cause(e: &std::io::Error) -> Option<&'static str> {
    use std::io::ErrorKind as K;
    Some(match e.kind() {
        K::ConnectionRefused => "connection refused",
        K::ConnectionReset => "connection reset",
        K::ConnectionAborted => "connection aborted",
        K::TimedOut => "timed out",
        K::NotConnected => "not connected",
        K::BrokenPipe => "connection closed (broken pipe)",
        K::UnexpectedEof => "connection closed before the answer",
        K::HostUnreachable => "host unreachable",
        K::NetworkUnreachable => "network unreachable",
        K::NetworkDown => "network down",
        K::AddrNotAvailable => "address not available",
        _ => return None,
    })
}

/// The plain cause of a `reqwest` error that says the server is unavailable.
pub fn reqwest_cause(e: &reqwest::Error) -> Option<String> {
    if let Some(c) = chain_cause(e) {
        return Some(c);
    }
    if e.is_timeout() {
        return Some("timed out".into());
    }
    if e.is_connect() {
        return Some("cannot connect".into());
    }
    if let Some(s) = e.status()
        && (s.is_server_error() || s.as_u16() == 429 || s.as_u16() == 408)
    {
        return Some(format!("answered {s}"));
    }
    None
}

/// The first cause in `e`'s chain that says the other side is not there: an I/O error of
/// that kind, a DNS failure, a TLS handshake failure.
pub fn chain_cause(e: &(dyn StdError + 'static)) -> Option<String> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(x) = cur {
        if let Some(io) = x.downcast_ref::<std::io::Error>()
            && let Some(c) = io_cause(io)
        {
            return Some(c.to_string());
        }
        let text = x.to_string();
        if text.contains("dns error") || text.contains("failed to lookup address") {
            return Some("the name does not resolve (DNS)".into());
        }
        if text.contains("tls handshake") || text.contains("TLS handshake") {
            return Some("TLS handshake failed".into());
        }
        cur = x.source();
    }
    None
}

/// Whether (and why, plainly) an `object_store` error means the node is unavailable: the
/// connection failed or timed out, or the server answered 5xx, 408, 429 or S3's
/// `SlowDown`/`ServiceUnavailable`/`InternalError`/`RequestTimeout`.
pub fn object_store_cause(e: &object_store::Error) -> Option<String> {
    if let Some(c) = chain_cause(e) {
        return Some(c);
    }
    let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(x) = cur {
        if let Some(h) = x.downcast_ref::<object_store::client::HttpError>() {
            use object_store::client::HttpErrorKind as K;
            match h.kind() {
                K::Connect => return Some("cannot connect".into()),
                K::Timeout => return Some("timed out".into()),
                K::Interrupted | K::Request => {
                    return Some("the connection broke off".into());
                }
                _ => {}
            }
        }
        cur = x.source();
    }
    let text = e.to_string();
    // object_store's own words for an answer's status; S3's error codes, words no key holds.
    if let Some(i) = text.find("non-2xx status code: ") {
        let code = &text[i + 21..];
        let n: String = code.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(n) = n.parse::<u16>()
            && (n >= 500 || n == 408 || n == 429)
        {
            return Some(format!("answered {n}"));
        }
    }
    [
        ("<Code>SlowDown</Code>", "asked us to slow down (SlowDown)"),
        ("<Code>ServiceUnavailable</Code>", "service unavailable"),
        ("<Code>InternalError</Code>", "internal error"),
        ("<Code>RequestTimeout</Code>", "request timeout"),
    ]
    .iter()
    .find(|(code, _)| text.contains(code))
    .map(|(_, why)| why.to_string())
}

/// Whether an `object_store` error is a 4xx about the request (a key the server refuses):
/// no retry can cure it.
pub fn object_store_refused(e: &object_store::Error) -> Option<String> {
    let text = e.to_string();
    let i = text.find("non-2xx status code: ")?;
    let n: String = text[i + 21..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let n: u16 = n.parse().ok()?;
    if !(400..500).contains(&n) || matches!(n, 404 | 408 | 409 | 412 | 429) {
        return None;
    }
    let code = text
        .split("<Code>")
        .nth(1)
        .and_then(|r| r.split("</Code>").next())
        .filter(|c| c.len() < 64 && c.chars().all(|ch| ch.is_ascii_alphanumeric()));
    Some(match code {
        Some("KeyTooLongError") => "the storage node refused the file name (too long)".into(),
        Some(c) => format!("the storage node refused the request ({n} {c})"),
        None => format!("the storage node refused the request ({n})"),
    })
}

/// `HOST[:PORT]` of `url`, which names the dependency a payload or callback URL reaches
/// (`unknown` for a URL without a host).
pub fn host_of(url: &str) -> String {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| {
            u.host_str()
                .map(|h| u.port().map_or(h.to_string(), |p| format!("{h}:{p}")))
        })
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_connection_is_unavailable_in_plain_words() {
        let e = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(chain_cause(&e).as_deref(), Some("connection refused"));
        let e = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(chain_cause(&e), None);
    }

    #[test]
    fn statuses_and_s3_codes_are_told_apart() {
        let g = |t: &str| object_store::Error::Generic {
            store: "S3",
            source: t.to_string().into(),
        };
        let e = g(
            "Error performing PUT http://h/k in 1ms - Server returned non-2xx status code: 503 Service Unavailable: ",
        );
        assert_eq!(object_store_cause(&e).as_deref(), Some("answered 503"));
        assert_eq!(object_store_refused(&e), None);
        let e = g(
            "Error performing PUT http://h/ark%3A1 - Server returned non-2xx status code: 400 Bad Request: <Error><Code>KeyTooLongError</Code></Error>",
        );
        assert_eq!(object_store_cause(&e), None);
        assert_eq!(
            object_store_refused(&e).as_deref(),
            Some("the storage node refused the file name (too long)")
        );
        let e = g("<Error><Code>SlowDown</Code></Error>");
        assert!(object_store_cause(&e).unwrap().contains("SlowDown"));
        // The simulator's own faults are not outages: they stay ordinary retries.
        let e = g("PUT k: 503 Service Unavailable (the simulated node)");
        assert_eq!(object_store_cause(&e), None);
        // A refused connection under the client's own error is an outage.
        let e = object_store::Error::Generic {
            store: "S3",
            source: Box::new(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "LIST-UPLOADS k: down",
            )),
        };
        assert_eq!(
            object_store_cause(&e).as_deref(),
            Some("connection refused")
        );
    }
}
