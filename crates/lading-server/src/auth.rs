//! Bearer tokens and roles. Tokens are kept only as SHA-256 digests, and looked up by digest,
//! so neither memory dumps nor lookup timing give a token away.

use crate::{ApiError, AppState};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use lading_ingest::TokenSettings;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything.
    Admin,
    /// Submit batches and read its own.
    Submitter,
    /// Accept, update and finish generic jobs of its types; nothing else.
    Processor,
}

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Principal {
    pub name: String,
    pub role: Role,
    /// A processor's job types.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<String>,
    /// A submitter's collections (`*`: every one); an admin's is empty and unrestricted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub collections: Vec<String>,
}

impl Principal {
    /// Who a submission is made as: `asked` when given and allowed (an admin may submit as
    /// anyone, a submitter only as itself), else this principal.
    pub fn submitter(&self, asked: Option<String>) -> Result<String, ApiError> {
        match (asked, self.role) {
            (Some(other), Role::Submitter) if other != self.name => Err(ApiError::forbidden(
                format!("{} may not submit as {other:?}", self.name),
            )),
            (Some(name), _) => Ok(name),
            (None, _) => Ok(self.name.clone()),
        }
    }

    /// Whether this principal may submit to profile `name`: an admin to any, a submitter to
    /// the collections of its token only (403 naming both otherwise; an unknown profile is
    /// 400). Returns the profile's collection.
    pub fn may_submit_to(
        &self,
        ingest: &lading_ingest::Ingest,
        profile: &str,
    ) -> Result<String, ApiError> {
        let collection = ingest
            .profile(profile)
            .map_err(|e| ApiError::from(lading_ingest::SubmitError::Profile(e)))?
            .collection
            .clone();
        match self.role {
            Role::Admin => Ok(collection),
            Role::Submitter
                if self
                    .collections
                    .iter()
                    .any(|c| c == "*" || *c == collection) =>
            {
                Ok(collection)
            }
            _ => Err(ApiError::forbidden(format!(
                "{} may not submit to profile {profile:?}: its collection {collection:?} is not among the token's collections ({})",
                self.name,
                self.collections.join(", ")
            ))),
        }
    }

    /// Whether this principal may open one more batch: an admin always; a submitter while
    /// fewer than `max_open_batches_per_submitter` of its batches are open (429 `open_batches`
    /// naming the key otherwise). Asked before a submission's body is read. Submissions of one
    /// submitter that arrive together may each pass it: by at most its requests in flight.
    pub async fn may_open_batch(&self, s: &AppState) -> Result<(), ApiError> {
        if self.role == Role::Admin {
            return Ok(());
        }
        let cap = s.ingest.cfg.max_open_batches_per_submitter;
        let stop_at = usize::try_from(cap).unwrap_or(usize::MAX);
        let open = s.ingest.engine.open_batches_of(&self.name, stop_at).await?;
        if (open as u64) < cap {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "open_batches",
            format!(
                "{} has {open} batches open and may have at most {cap} \
                 (max_open_batches_per_submitter); submit more once some have completed or failed",
                self.name
            ),
        ))
    }

    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.role == Role::Admin {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "{} is a {:?} token; this needs an admin token",
                self.name, self.role
            )))
        }
    }
}

/// Who made the request, as [`require_token`] put it in its extensions.
fn principal(parts: &axum::http::request::Parts) -> Result<Principal, ApiError> {
    parts
        .extensions
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "no token"))
}

/// An extractor of the request's principal, `$admit` saying whom it lets through.
macro_rules! gate {
    ($name:ident, $admit:expr) => {
        impl<S: Send + Sync> axum::extract::FromRequestParts<S> for $name {
            type Rejection = ApiError;
            async fn from_request_parts(
                parts: &mut axum::http::request::Parts,
                _: &S,
            ) -> Result<Self, ApiError> {
                principal(parts).and_then($admit).map($name)
            }
        }
    };
}

/// A processor's request (an admin's too): accept, update and finish of generic jobs. The
/// type was checked against a processor token's types by [`require_token`], before any of
/// the request was read.
pub struct Worker(pub Principal);

gate!(Worker, |p: Principal| match p.role {
    Role::Admin | Role::Processor => Ok(p),
    Role::Submitter => Err(ApiError::forbidden(format!(
        "{} is a submitter token; processing jobs needs a processor or admin token",
        p.name
    ))),
});

/// Whether a processor token may make this request: POST to accept, update or finish (one
/// or many, or finish-and-accept) generic jobs of one of `types`. `Err` names why not.
pub fn processor_may(
    method: &axum::http::Method,
    path: &str,
    types: &[String],
) -> Result<(), String> {
    let what = "a processor token may only accept, update and finish generic jobs of its types";
    let seg: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    // "", "api", "v1", "types", TYPE, …
    let shape_ok = method == axum::http::Method::POST
        && seg.len() >= 6
        && seg[..4] == ["", "api", "v1", "types"]
        && match &seg[5..] {
            ["accept"] | ["finish"] => true,
            ["jobs", id, op] => {
                !id.is_empty() && matches!(*op, "update" | "finish" | "finish-and-accept")
            }
            _ => false,
        };
    if !shape_ok {
        return Err(format!("{what}; not {method} {path}"));
    }
    let ty = seg[4];
    if !types.iter().any(|t| t == ty) {
        return Err(format!("{what} ({}); not {ty:?}", types.join(", ")));
    }
    Ok(())
}

/// An admin's request: as an extractor placed before the path and the body, it refuses any
/// other token with 403 before anything of the request is parsed (so a submitter learns
/// nothing of an admin route's input).
pub struct Admin(pub Principal);

gate!(Admin, |p: Principal| p.require_admin().map(|()| p));

/// Paths anyone may read without a token.
pub const PUBLIC: &[&str] = &[
    "/",
    "/api/v1/health",
    "/api/v1/ready",
    "/api/v1/openapi.json",
    "/metrics",
];

pub struct Auth {
    by_digest: HashMap<[u8; 32], Principal>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Auth {
    /// From the config's `[[tokens]]`; refuses unknown roles, short or repeated tokens.
    pub fn new(tokens: &[TokenSettings]) -> Result<Auth, String> {
        let mut by_digest = HashMap::new();
        for t in tokens {
            let role = match t.role.as_str() {
                "admin" => Role::Admin,
                "submitter" => Role::Submitter,
                "processor" => Role::Processor,
                other => {
                    return Err(format!(
                        "token {:?}: unknown role {other:?} (admin, submitter or processor)",
                        t.name
                    ));
                }
            };
            match (role, t.types.is_empty()) {
                (Role::Processor, true) => {
                    return Err(format!(
                        "token {:?}: a processor token needs types = [\"TYPE\", …], the job types it may process",
                        t.name
                    ));
                }
                (Role::Admin | Role::Submitter, false) => {
                    return Err(format!(
                        "token {:?}: types applies to processor tokens only",
                        t.name
                    ));
                }
                _ => {}
            }
            match (role, t.collections.is_empty()) {
                (Role::Submitter, true) => {
                    return Err(format!(
                        "token {:?}: a submitter token needs collections = [\"COLLECTION\", …], the collections it may submit to ([\"*\"] for every one)",
                        t.name
                    ));
                }
                (Role::Admin | Role::Processor, false) => {
                    return Err(format!(
                        "token {:?}: collections applies to submitter tokens only",
                        t.name
                    ));
                }
                _ => {}
            }
            for ty in &t.types {
                lading_jobs::check_type(ty).map_err(|e| format!("token {:?}: {e}", t.name))?;
            }
            if t.token.len() < 16 {
                return Err(format!("token {:?} is shorter than 16 characters", t.name));
            }
            let p = Principal {
                name: t.name.clone(),
                role,
                types: t.types.clone(),
                collections: t.collections.clone(),
            };
            if by_digest.insert(digest(&t.token), p).is_some() {
                return Err(format!("token {:?} is given twice", t.name));
            }
        }
        Ok(Auth { by_digest })
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// Adds the generated admin token.
    pub fn with_admin(mut self, token: &str) -> Auth {
        self.by_digest.insert(
            digest(token),
            Principal {
                name: "admin".into(),
                role: Role::Admin,
                types: Vec::new(),
                collections: Vec::new(),
            },
        );
        self
    }

    /// The holder of the `Authorization` value, or 401: `Bearer TOKEN`, or `Basic` with the
    /// token's name as the user and the token as the password (what Merritt's clients send).
    pub fn check(&self, header: Option<&str>) -> Result<Principal, ApiError> {
        let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m);
        let h = header.ok_or_else(|| {
            unauthorized("missing Authorization: Bearer TOKEN (or Basic NAME:TOKEN)")
        })?;
        // The scheme is case-insensitive (RFC 9110 §11.1).
        let (scheme, value) = h.split_once(' ').ok_or_else(|| {
            unauthorized("Authorization must be Bearer TOKEN or Basic NAME:TOKEN")
        })?;
        if scheme.eq_ignore_ascii_case("bearer") {
            return self
                .by_digest
                .get(&digest(value.trim()))
                .cloned()
                .ok_or_else(|| unauthorized("unknown token"));
        }
        if scheme.eq_ignore_ascii_case("basic") {
            // One message for every wrong pair: it tells nothing of which half was wrong.
            let wrong = || unauthorized("unknown user name or password");
            let pair = base64_decode(value.trim()).ok_or_else(wrong)?;
            let pair = String::from_utf8(pair).map_err(|_| wrong())?;
            let (user, password) = pair.split_once(':').ok_or_else(wrong)?;
            return match self.by_digest.get(&digest(password)) {
                Some(p) if p.name == user => Ok(p.clone()),
                _ => Err(wrong()),
            };
        }
        Err(unauthorized(
            "Authorization must be Bearer TOKEN or Basic NAME:TOKEN",
        ))
    }
}

/// Standard base64 (RFC 4648, padding optional); `None` for anything else.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let s = s.trim_end_matches('=');
    if s.len() > 8192 || s.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes() {
        acc = (acc << 6) | u32::from(val(c)?);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// The generated admin token of `data_dir` (`admin.token`, mode 0600): read if present,
/// made otherwise. Returns the token, its file, and whether it was made now.
pub fn admin_token(data_dir: &Path) -> std::io::Result<(String, PathBuf, bool)> {
    let path = data_dir.join("admin.token");
    match std::fs::read_to_string(&path) {
        Ok(t) if t.trim().len() >= 16 => return Ok((t.trim().to_string(), path, false)),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::create_dir_all(data_dir)?;
    let token = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let tmp = data_dir.join("admin.token.tmp");
    {
        use std::io::Write;
        #[cfg(unix)]
        use std::os::unix::fs::OpenOptionsExt;
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create(true).truncate(true);
        #[cfg(unix)]
        o.mode(0o600);
        let mut f = o.open(&tmp)?;
        f.write_all(token.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    Ok((token, path, true))
}

/// Middleware: every path but [`PUBLIC`] needs a known token; the holder is put in the
/// request's extensions for the handler.
pub async fn require_token(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    if PUBLIC.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let header = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match s.auth.check(header) {
        Ok(p) => {
            // Deny by default: a processor token reaches only its own few routes, whatever
            // any handler would do with it.
            if p.role == Role::Processor
                && let Err(why) = processor_may(req.method(), req.uri().path(), &p.types)
            {
                return ApiError::forbidden(why).into_response();
            }
            req.extensions_mut().insert(p);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_are_the_tokens_name_and_token() {
        assert_eq!(base64_decode("YWxpY2U6c2VjcmV0").unwrap(), b"alice:secret");
        assert_eq!(base64_decode("YQ==").unwrap(), b"a");
        assert!(base64_decode("a*b=").is_none());
        let auth = Auth::new(&[TokenSettings {
            name: "alice".into(),
            token: "alice-token-0123456789".into(),
            role: "submitter".into(),
            types: Vec::new(),
            collections: vec!["a".into()],
        }])
        .unwrap();
        // alice:alice-token-0123456789
        let ok = "Basic YWxpY2U6YWxpY2UtdG9rZW4tMDEyMzQ1Njc4OQ==";
        assert_eq!(auth.check(Some(ok)).unwrap().name, "alice");
        // bob:alice-token-0123456789 (the right token, another name) and a wrong token.
        for bad in [
            "Basic Ym9iOmFsaWNlLXRva2VuLTAxMjM0NTY3ODk=",
            "Basic YWxpY2U6d3Jvbmc=",
            "Basic !!!",
        ] {
            let e = auth.check(Some(bad)).unwrap_err();
            assert_eq!(e.status, StatusCode::UNAUTHORIZED, "{bad}");
        }
    }
}
