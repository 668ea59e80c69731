//! The payload policy: which URLs a depositor's submission may make this host fetch.
//!
//! A submission made through the HTTP API (and every URL in its manifests) is the depositor's
//! input, not the operator's: by default it may name only `http`/`https` on public addresses.
//! Loopback, private, link-local, unique-local, shared, documentation, multicast and
//! unspecified addresses are refused — for literal addresses here, for host names after
//! resolution on every connection ([`PublicResolver`]) and for every redirect
//! ([`Policy::redirects`]), so a name that resolves to a private address later (DNS
//! rebinding) gets nowhere either. The service config widens this explicitly with URL
//! prefixes (`[payload] allow`) and `file://` roots (`allow_file_roots`, canonicalised, so a
//! symbolic link cannot lead out). Submissions made straight on a store (the local command
//! line, the demo, the benchmarks) are the operator's own and are not restricted.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Whose URL a fetch follows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Trust {
    /// The operator's own (local command line, demo, bench, Merritt's tools): anything goes.
    #[default]
    Operator,
    /// A depositor's, through the API: checked against the [`Policy`]. `upload` is the one
    /// `file://` URL the server itself made for the depositor's uploaded file.
    Depositor { upload: Option<String> },
}

impl Trust {
    /// The trust recorded in a submission or job configuration (`"payload_trust"`,
    /// `"upload_url"`), read through `get`; absent means the operator's.
    pub fn from_fields<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Trust {
        match get(TRUST_KEY) {
            Some("depositor") => Trust::Depositor {
                upload: get(UPLOAD_KEY).map(str::to_string),
            },
            _ => Trust::Operator,
        }
    }

    /// This trust as a record's fields: `payload_trust` ([`TRUST_KEY`]) and `upload_url`
    /// ([`UPLOAD_KEY`]) of a submission or job configuration.
    pub fn fields(&self) -> lading_core::layout::PayloadTrust {
        let (payload_trust, upload_url) = match self {
            Trust::Depositor { upload } => (Some("depositor".into()), upload.clone()),
            Trust::Operator => (None, None),
        };
        lading_core::layout::PayloadTrust {
            payload_trust,
            upload_url,
        }
    }
}

/// The record key saying whose URLs a batch or job holds.
pub const TRUST_KEY: &str = "payload_trust";
/// The record key of the server-made upload URL.
pub const UPLOAD_KEY: &str = "upload_url";

/// What a depositor's URL may name beyond public http(s).
#[derive(Debug, Default)]
pub struct Policy {
    /// Allowed URL prefixes, parsed.
    allow: Vec<Prefix>,
    /// Hosts of the allowed prefixes: resolved without the public-address filter. Every URL
    /// naming one of them must match a prefix ([`Policy::check`]), at submit, at every
    /// manifest row, every fetch and every redirect, so the lifted filter reaches no other
    /// port or path of the host.
    allow_hosts: HashSet<String>,
    /// Canonical folders `file://` URLs may point into.
    file_roots: Vec<PathBuf>,
}

/// A URL the policy refuses; the message names the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

const HINT: &str =
    "the service config's [payload] allow (URL prefixes) and allow_file_roots widen this";

impl Policy {
    pub fn new(allow: &[String], file_roots: &[PathBuf]) -> Result<Policy, String> {
        let mut p = Policy::default();
        for a in allow {
            let u = reqwest::Url::parse(a)
                .map_err(|e| format!("[payload] allow: {a:?} is not a URL: {e}"))?;
            if !matches!(u.scheme(), "http" | "https") {
                return Err(format!(
                    "[payload] allow: {a:?} is not an http or https URL (use allow_file_roots for files)"
                ));
            }
            let prefix = Prefix::of(&u)
                .ok_or_else(|| format!("[payload] allow: {a:?} has no host or a bad path"))?;
            p.allow_hosts.insert(prefix.host.clone());
            p.allow.push(prefix);
        }
        for r in file_roots {
            let c = std::fs::canonicalize(r)
                .map_err(|e| format!("[payload] allow_file_roots: {}: {e}", r.display()))?;
            p.file_roots.push(c);
        }
        Ok(p)
    }

    /// Whether a depositor may have `url` fetched; checks what can be checked without a
    /// connection (the scheme, the allowed prefixes, literal addresses, `file://` roots).
    pub fn check(&self, url: &str) -> Result<(), Refused> {
        let u = reqwest::Url::parse(url.trim())
            .map_err(|e| Refused(format!("{url:?} is not a URL: {e}")))?;
        match u.scheme() {
            "file" => self.check_file(&u),
            "http" | "https" => self.check_http(&u),
            s => Err(Refused(format!(
                "the {s:?} scheme is not allowed (http or https)"
            ))),
        }
    }

    fn check_http(&self, u: &reqwest::Url) -> Result<(), Refused> {
        let parsed = Prefix::of(u);
        if let Some(p) = &parsed
            && self.allow.iter().any(|a| a.admits(p))
        {
            return Ok(());
        }
        let host = u.host_str().unwrap_or("").trim_matches(['[', ']']);
        if self.allow_hosts.contains(&host.to_ascii_lowercase()) {
            // A host the operator allowed under some prefixes only: its other ports and
            // paths are as closed as any internal address (the prefixes are not shown).
            return Err(Refused(format!(
                "{host}:{} is allowed only under the prefixes of [payload] allow, and {} is outside them",
                u.port_or_known_default().unwrap_or(0),
                u.path()
            )));
        }
        if !u.username().is_empty() || u.password().is_some() {
            return Err(Refused(
                "URLs with a user name or password are not allowed".into(),
            ));
        }
        match u.host() {
            Some(url::Host::Ipv4(ip)) => check_ip(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => check_ip(IpAddr::V6(ip)),
            Some(url::Host::Domain(d)) => {
                let d = d.trim_end_matches('.').to_ascii_lowercase();
                if d == "localhost" || d.ends_with(".localhost") {
                    Err(Refused(format!(
                        "{d} is a loopback name; only public addresses are allowed ({HINT})"
                    )))
                } else {
                    Ok(())
                }
            }
            None => Err(Refused("the URL has no host".into())),
        }
    }

    fn check_file(&self, u: &reqwest::Url) -> Result<(), Refused> {
        // One message for everything outside the roots, so a refusal never tells whether a
        // path exists.
        let outside = || {
            Refused(format!(
                "file:// URLs may name only files under the configured roots ({HINT})"
            ))
        };
        if self.file_roots.is_empty() || u.host_str().is_some_and(|h| !h.is_empty()) {
            return Err(outside());
        }
        let path = u.to_file_path().map_err(|_| outside())?;
        let lexical = normalize(&path).ok_or_else(outside)?;
        if !self.file_roots.iter().any(|r| lexical.starts_with(r)) {
            return Err(outside());
        }
        // Inside a root by name: a symbolic link must not lead out of it.
        match std::fs::canonicalize(&path) {
            Ok(c) if self.file_roots.iter().any(|r| c.starts_with(r)) => Ok(()),
            Ok(_) => Err(outside()),
            // Missing inside an allowed root: the fetch says so.
            Err(_) => Ok(()),
        }
    }

    /// The redirect policy of the depositors' client: each hop is checked like the first
    /// (never to `file://`), at most 10 hops.
    pub fn redirects(self: &Arc<Self>) -> reqwest::redirect::Policy {
        let me = self.clone();
        reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= 10 {
                return attempt.error(Refused("more than 10 redirects".into()));
            }
            let checked = match attempt.url().scheme() {
                "http" | "https" => me.check_http(attempt.url()),
                s => Err(Refused(format!("a redirect to the {s:?} scheme"))),
            };
            match checked {
                Ok(()) => attempt.follow(),
                Err(e) => {
                    let msg = format!("redirect to {} refused: {e}", attempt.url());
                    attempt.error(Refused(msg))
                }
            }
        })
    }

    /// The resolver of the depositors' client: names resolve to public addresses only,
    /// except the hosts of allowed prefixes.
    pub fn resolver(self: &Arc<Self>) -> Arc<PublicResolver> {
        Arc::new(PublicResolver(self.clone()))
    }
}

/// An allowed URL prefix, or a URL in the form compared with one: scheme, host (lower case,
/// without an IPv6 literal's brackets), port (the scheme's default when absent), user info,
/// and the path percent-decoded with `.` and `..` folded away, so no spelling of a path
/// leads out of a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Prefix {
    scheme: String,
    host: String,
    port: u16,
    user: String,
    path: String,
}

impl Prefix {
    fn of(u: &reqwest::Url) -> Option<Prefix> {
        let decoded = percent_decode(u.path())?.replace('\\', "/");
        let mut folded = normalize(Path::new(&decoded))?
            .to_string_lossy()
            .into_owned();
        if decoded.ends_with('/') && !folded.ends_with('/') {
            folded.push('/');
        }
        Some(Prefix {
            scheme: u.scheme().to_ascii_lowercase(),
            host: u.host_str()?.trim_matches(['[', ']']).to_ascii_lowercase(),
            port: u.port_or_known_default()?,
            user: format!("{}:{}", u.username(), u.password().unwrap_or("")),
            path: folded,
        })
    }

    /// Whether `url` lies under this prefix: the same scheme, host, port and user info, and
    /// a path equal to the prefix's or below it (at a `/`).
    fn admits(&self, url: &Prefix) -> bool {
        let under = match self.path.strip_suffix('/') {
            Some(dir) => url.path.starts_with(&self.path) || url.path == dir,
            None => {
                url.path == self.path
                    || url
                        .path
                        .strip_prefix(&self.path)
                        .is_some_and(|rest| rest.starts_with('/'))
            }
        };
        under
            && self.scheme == url.scheme
            && self.host == url.host
            && self.port == url.port
            && self.user == url.user
    }
}

/// `s` with its `%XX` escapes decoded; `None` when the result is not UTF-8 or holds a NUL.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    let s = String::from_utf8(out).ok()?;
    (!s.contains('\0')).then_some(s)
}

/// `path` with `.` and `..` folded away lexically; `None` if it climbs above `/`.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::RootDir => out.push("/"),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(n) => out.push(n),
            Component::Prefix(_) => return None,
        }
    }
    out.is_absolute().then_some(out)
}

fn check_ip(ip: IpAddr) -> Result<(), Refused> {
    if is_public(ip) {
        Ok(())
    } else {
        Err(Refused(format!(
            "{ip} is not a public address (loopback, private, link-local, unique-local and \
             unspecified addresses are refused; {HINT})"
        )))
    }
}

/// Whether `ip` is a globally routed unicast address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let s = v6.segments();
            // NAT64 (64:ff9b::/96) carries an IPv4 address.
            if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
                let o = v6.octets();
                return is_public_v4(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
            }
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link local
                || (s[0] & 0xffc0) == 0xfec0 // site local (deprecated)
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || s[..6] == [0; 6]) // IPv4-compatible and other ::/96
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || o[0] == 0
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // shared address space
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // benchmarking
        || o[0] >= 240) // reserved
}

/// Resolves names for depositors' fetches: non-public addresses are dropped (the hosts of
/// allowed prefixes excepted); a name left with none is refused.
pub struct PublicResolver(Arc<Policy>);

impl reqwest::dns::Resolve for PublicResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0.clone();
        let host = name.as_str().to_ascii_lowercase();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if policy.allow_hosts.contains(&host) {
                return Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs);
            }
            let public: Vec<SocketAddr> = addrs
                .iter()
                .copied()
                .filter(|a| is_public(a.ip()))
                .collect();
            if public.is_empty() {
                let shown: Vec<String> = addrs.iter().map(|a| a.ip().to_string()).collect();
                return Err(Box::new(Refused(format!(
                    "{host} resolves to no public address ({}); {HINT}",
                    shown.join(", ")
                )))
                    as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The policy's refusal somewhere in `e`'s chain of causes.
pub fn refusal_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refused> {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(r) = c.downcast_ref::<Refused>() {
            return Some(r);
        }
        cur = c.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_and_special_addresses_are_not_public() {
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::7f00:1",
            "::127.0.0.1",
        ] {
            assert!(!is_public(a.parse().unwrap()), "{a}");
        }
        for a in ["93.184.215.14", "8.8.8.8", "2606:4700::1111"] {
            assert!(is_public(a.parse().unwrap()), "{a}");
        }
    }

    #[test]
    fn depositor_urls_are_checked() {
        let p = Policy::new(&["http://127.0.0.1:9000/ok/".into()], &[]).unwrap();
        assert!(p.check("http://127.0.0.1:9000/ok/file").is_ok());
        assert!(p.check("HTTP://127.0.0.1:9000/ok/file").is_ok());
        for bad in [
            "http://127.0.0.1:9000/other",
            "http://127.0.0.1:9001/ok/file",
            "http://localhost/x",
            "http://[::1]/x",
            "http://0x7f000001/x",
            "http://2130706433/x",
            "file:///etc/passwd",
            "FILE:///etc/passwd",
            "file://x/relative",
            "ftp://example.org/x",
            "gopher://example.org/x",
            "http://user:pw@example.org/x",
        ] {
            let e = p.check(bad).unwrap_err();
            assert!(!e.0.is_empty(), "{bad}");
        }
        assert!(p.check("https://example.org/x").is_ok());
    }

    #[test]
    fn a_named_host_is_allowed_only_under_its_prefixes() {
        let p = Policy::new(
            &[
                "http://files.internal:8081/ok/".into(),
                "https://Data.Example/pub".into(),
            ],
            &[],
        )
        .unwrap();
        for good in [
            "http://files.internal:8081/ok/a.txt",
            "http://FILES.internal:8081/ok/sub/../b.txt",
            "http://files.internal:8081/ok/",
            "http://files.internal:8081/ok",
            "https://data.example/pub",
            "https://data.example:443/pub/x",
        ] {
            assert!(p.check(good).is_ok(), "{good}");
        }
        for bad in [
            // Another port, another path, and every spelling of climbing out.
            "http://files.internal:8082/ok/a.txt",
            "http://files.internal/ok/a.txt",
            "http://files.internal:8081/internal/secret.txt",
            "http://files.internal:8081/ok/../internal/secret.txt",
            "http://files.internal:8081/ok/%2e%2e/internal/secret.txt",
            "http://files.internal:8081/ok/..%2finternal/secret.txt",
            "http://files.internal:8081/ok/..%2F..%2F..%2Fsecret.txt",
            "http://files.internal:8081/ok%2F..%2Finternal",
            "http://files.internal:8081/okay/a.txt",
            "https://files.internal:8081/ok/a.txt",
            "http://u:p@files.internal:8081/ok/a.txt",
            "https://data.example/public",
            "https://data.example/pub/..%5c..%5csecret",
            "http://data.example/pub/x",
        ] {
            let e = p.check(bad).unwrap_err();
            assert!(
                e.0.contains("allowed only under the prefixes"),
                "{bad}: {e}"
            );
        }
        // Other names are untouched: public ones pass (their addresses are checked at
        // connection), loopback names do not.
        assert!(p.check("https://example.org/x").is_ok());
        assert!(p.check("http://localhost:8081/ok/a.txt").is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_resolver_drops_non_public_addresses_unless_the_host_is_allowed() {
        use reqwest::dns::Resolve;
        // A name that resolves only to loopback, as a rebinding name would at fetch time:
        // the resolver itself refuses it (the name check is not involved here).
        let p = Arc::new(Policy::new(&[], &[]).unwrap());
        let r = p.resolver();
        let err = match r.resolve("localhost".parse().unwrap()).await {
            Ok(a) => panic!("resolved to {:?}", a.collect::<Vec<_>>()),
            Err(e) => e,
        };
        let refused = refusal_in(err.as_ref()).expect("a policy refusal");
        assert!(refused.0.contains("no public address"), "{refused}");
        // An allowed prefix's host resolves as usual.
        let p = Arc::new(Policy::new(&["http://localhost:9/".into()], &[]).unwrap());
        let addrs: Vec<_> = p
            .resolver()
            .resolve("localhost".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert!(!addrs.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_name_that_resolves_to_this_host_is_refused_after_resolution() {
        // The machine's own name passes the name check but resolves to a loopback or
        // private address: the fetch is refused by the resolver, fatally, and no connection
        // reaches the listener.
        let host = std::fs::read_to_string("/etc/hostname")
            .unwrap_or_default()
            .trim()
            .to_string();
        let addrs: Vec<SocketAddr> = match tokio::net::lookup_host((host.as_str(), 0)).await {
            Ok(a) => a.collect(),
            Err(_) => Vec::new(),
        };
        if host.is_empty() || addrs.is_empty() || addrs.iter().any(|a| is_public(a.ip())) {
            eprintln!("skipped: this host's name {host:?} resolves to {addrs:?}");
            return;
        }
        let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let f = crate::fetch::Fetcher::new();
        let url = format!("http://{host}:{port}/m.checkm");
        assert!(
            Policy::default().check(&url).is_ok(),
            "the name itself passes"
        );
        let e = f
            .get_text(&url, &Trust::Depositor { upload: None })
            .await
            .unwrap_err();
        match e {
            crate::fetch::FetchError::Fatal(m) => {
                assert!(
                    m.contains("payload policy") && m.contains("no public address"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(l.accept().is_err(), "a connection was made");
    }

    #[test]
    fn file_roots_are_canonical_and_links_do_not_lead_out() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("deposits");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("a.txt"), b"a").unwrap();
        std::fs::write(dir.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), root.join("link")).unwrap();
        let p = Policy::new(&[], std::slice::from_ref(&root)).unwrap();
        let url = |p: &Path| format!("file://{}", p.display());
        assert!(p.check(&url(&root.join("a.txt"))).is_ok());
        let outside = p.check(&url(&dir.path().join("secret"))).unwrap_err();
        let via_link = p.check(&url(&root.join("link"))).unwrap_err();
        let climbing = p.check(&format!("{}/../secret", url(&root))).unwrap_err();
        let missing = p.check(&url(&dir.path().join("nope"))).unwrap_err();
        // One message whether the path exists or not.
        assert_eq!(outside, via_link);
        assert_eq!(outside, climbing);
        assert_eq!(outside, missing);
    }
}
