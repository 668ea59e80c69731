//! Merritt's front door: the ingest service's multipart form (`POST /poster/submit`,
//! `/poster/update`, `/poster/add`, and the forms naming the object in the path) and the UI
//! paths Merritt's Ruby client posts to (`POST /object/ingest`, `/object/update`), answered as
//! Merritt answers: a `bat:batchState` document (JSON or XML, `responseForm`), errors as
//! `exc:` documents with the HTTP status. Authentication is the API's: a bearer token, or HTTP
//! Basic with the token's name and the token (what Merritt's clients send). See
//! docs/MERRITT.md.

use crate::upload::{Form, receive};
use crate::{ApiError, AppState, Principal};
use axum::Extension;
use axum::extract::{Path as PathParams, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use lading_core::time::format_rfc3339;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// The routes of Merritt's ingest service and UI that Lading answers.
pub fn routes() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/poster/submit", post(submit))
        .route("/poster/add", post(submit))
        .route("/poster/update", post(update))
        .route(
            "/poster/submit/{scheme}/{shoulder}/{objectid}",
            post(submit_named),
        )
        .route(
            "/poster/update/{scheme}/{shoulder}/{objectid}",
            post(update_named),
        )
        .route("/object/ingest", post(submit))
        .route("/object/update", post(update))
        .route("/poster/state", get(state))
        .route("/poster/help", get(help))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::map_response(
            crate::upload::close_after_refusal,
        ))
}

/// Whether `path` is one of Merritt's submission routes, which take an upload as long as it
/// takes to send (exempt from the request timeout, as `/api/v1/batches/upload` is).
pub fn is_upload_route(path: &str) -> bool {
    matches!(
        path,
        "/poster/submit" | "/poster/add" | "/poster/update" | "/object/ingest" | "/object/update"
    ) || path.starts_with("/poster/submit/")
        || path.starts_with("/poster/update/")
}

/// The form fields Merritt's ingest service takes; others are kept out and logged.
const KNOWN: &[&str] = &[
    "type",
    "profile",
    "submitter",
    "filename",
    "size",
    "digestType",
    "digestValue",
    "creator",
    "title",
    "date",
    "localIdentifier",
    "primaryIdentifier",
    "note",
    "notification",
    "notificationFormat",
    "responseForm",
    "retainTargetURL",
];

/// How an answer is written: Merritt's `responseForm`.
#[derive(Clone, Copy, PartialEq)]
enum Answer {
    Json,
    Xml,
}

/// An `exc:` error document with its status, in the form asked for.
struct Exc(ApiError, Answer);

impl IntoResponse for Exc {
    fn into_response(self) -> Response {
        let Exc(e, form) = self;
        let reason = e.status.canonical_reason().unwrap_or("error");
        let body = match form {
            Answer::Json => json!({"exc:exception": {
                "exc:statusCode": e.status.as_u16(),
                "exc:statusDescription": reason,
                "exc:error": e.message,
            }})
            .to_string(),
            Answer::Xml => format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<exc:exception xmlns:exc=\"http://uc3.cdlib.org/ontology/mrt/exception\">\n  <exc:statusCode>{}</exc:statusCode>\n  <exc:statusDescription>{}</exc:statusDescription>\n  <exc:error>{}</exc:error>\n</exc:exception>\n",
                e.status.as_u16(),
                xml_text(reason),
                xml_text(&e.message)
            ),
        };
        (
            e.status,
            [(axum::http::header::CONTENT_TYPE, content_type(form))],
            body,
        )
            .into_response()
    }
}

fn content_type(form: Answer) -> &'static str {
    match form {
        Answer::Json => "application/json",
        Answer::Xml => "application/xml; charset=utf-8",
    }
}

/// Text as XML 1.0 character data, always well-formed: markup escaped, and every character
/// XML 1.0 forbids (controls other than tab, newline and carriage return, lone surrogates
/// cannot occur in a `str`, U+FFFE and U+FFFF) written as U+FFFD, since not even a character
/// reference may carry them.
pub(crate) fn xml_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod xml_tests {
    /// Every byte 0x00–0x1f, in an echoed field, leaves the answer well-formed XML 1.0.
    #[test]
    fn every_control_character_leaves_the_text_well_formed() {
        let all: String = (0u8..0x20).map(char::from).collect();
        let text = super::xml_text(&format!("ctl{all}end<&>\"]]>"));
        for c in text.chars() {
            let n = c as u32;
            assert!(
                n >= 0x20 || matches!(c, '\t' | '\n' | '\r'),
                "{n:#x} left in {text:?}"
            );
        }
        assert!(text.starts_with("ctl") && text.ends_with("end&lt;&amp;&gt;&quot;]]&gt;"));
    }
}

async fn submit(s: State<AppState>, p: Extension<Principal>, form: Form) -> Response {
    take(s, p, form, false, None).await
}

async fn update(s: State<AppState>, p: Extension<Principal>, form: Form) -> Response {
    take(s, p, form, true, None).await
}

async fn submit_named(
    s: State<AppState>,
    p: Extension<Principal>,
    PathParams((scheme, shoulder, id)): PathParams<(String, String, String)>,
    form: Form,
) -> Response {
    take(
        s,
        p,
        form,
        false,
        Some(format!("{scheme}:/{shoulder}/{id}")),
    )
    .await
}

async fn update_named(
    s: State<AppState>,
    p: Extension<Principal>,
    PathParams((scheme, shoulder, id)): PathParams<(String, String, String)>,
    form: Form,
) -> Response {
    take(s, p, form, true, Some(format!("{scheme}:/{shoulder}/{id}"))).await
}

/// Merritt's payload type names as Lading's.
fn payload_type(merritt: &str) -> Option<&'static str> {
    Some(match merritt {
        "file" => "file",
        "container" => "container",
        "object-manifest" | "manifest" => "manifest",
        "single-file-batch-manifest" => "single-file-batch-manifest",
        "container-batch-manifest" => "container-batch-manifest",
        "batch-manifest" => "batch-manifest",
        _ => return None,
    })
}

/// The type of an upload named by no `type` field, guessed as Merritt guesses it: a checkm
/// manifest by its `#%profile`, a container by its name, else a file.
fn guess_type(path: &std::path::Path, name: &str) -> &'static str {
    let lower = name.to_ascii_lowercase();
    if [".zip", ".tar", ".tgz", ".tar.gz", ".gz"]
        .iter()
        .any(|e| lower.ends_with(e))
    {
        return "container";
    }
    let mut head = vec![0u8; 4096];
    let n = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    let head = String::from_utf8_lossy(&head[..n]).to_ascii_lowercase();
    if !head.starts_with("#%checkm") {
        return "file";
    }
    for (profile, ty) in [
        (
            "mrt-single-file-batch-manifest",
            "single-file-batch-manifest",
        ),
        ("mrt-container-batch-manifest", "container-batch-manifest"),
        ("mrt-batch-manifest", "batch-manifest"),
        ("mrt-ingest-manifest", "manifest"),
    ] {
        if head.contains(profile) {
            return ty;
        }
    }
    "manifest"
}

async fn take(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    Form(mut multipart, over): Form,
    update: bool,
    named: Option<String>,
) -> Response {
    if let Err(e) = p.may_open_batch(&s).await {
        return Exc(e, Answer::Xml).into_response();
    }
    let mut fields = BTreeMap::new();
    // A form that names its profile before its file is refused before the file is read when
    // the caller may not submit to it (Merritt's Ruby client sends the file first: then the
    // file is received, refused below, and removed).
    let gate = |f: &BTreeMap<String, String>| match f.get("profile").map(|p| p.trim()) {
        Some(profile) if !profile.is_empty() => p.may_submit_to(&s.ingest, profile).map(|_| ()),
        _ => Ok(()),
    };
    let (mut scrap, saved) =
        match receive(&s, &p, &mut multipart, Some(&mut fields), Some(&gate)).await {
            Ok(x) => x,
            Err(e) => return Exc(e, Answer::Xml).into_response(),
        };
    let form = match fields.get("responseForm").map(|f| f.to_ascii_lowercase()) {
        Some(f) if f == "json" => Answer::Json,
        _ => Answer::Xml,
    };
    if over.load(Ordering::Relaxed) {
        let e = ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "a part's headers are longer than {} bytes (http.max_part_header_bytes)",
                s.ingest.cfg.http.max_part_header_bytes
            ),
        );
        return Exc(e, form).into_response();
    }
    let answer = async {
        let (path, _size) = match saved {
            Ok(x) => x,
            Err(e) if e.message.contains("no \"file\" part") => {
                return Err(ApiError::bad_request(
                    "missing the form field \"file\" (the payload: a file, container or manifest)",
                ));
            }
            Err(e) => return Err(e),
        };
        check_digest(&path, fields.get("digestType"), fields.get("digestValue")).await?;
        let extra: Vec<&String> = fields
            .keys()
            .filter(|k| !KNOWN.contains(&k.as_str()) && !k.starts_with("DC."))
            .collect();
        if !extra.is_empty() {
            tracing::warn!(fields = ?extra, "Merritt form fields Lading does not use");
        }
        let kept = kept_fields(&fields)?;
        let profile = fields
            .get("profile")
            .filter(|p| !p.trim().is_empty())
            .ok_or_else(|| ApiError::bad_request("missing the form field \"profile\""))?
            .trim()
            .to_string();
        p.may_submit_to(&s.ingest, &profile)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let ty = match fields.get("type").map(|t| t.trim()) {
            Some(t) if !t.is_empty() => payload_type(t).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "unknown type {t:?} (file, container, object-manifest, single-file-batch-manifest, container-batch-manifest, batch-manifest)"
                ))
            })?,
            _ => guess_type(&path, &name),
        };
        let primary = named.or_else(|| {
            fields
                .get("primaryIdentifier")
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        });
        if update && primary.is_none() {
            return Err(ApiError::bad_request(
                "an update names its object: the form field \"primaryIdentifier\" (or /poster/update/SCHEME/SHOULDER/ID)",
            ));
        }
        let get = |k: &str, dc: &str| {
            fields
                .get(k)
                .or_else(|| fields.get(dc))
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let payload_url = format!("file://{}", path.display());
        let sub = lading_ingest::Submission {
            profile,
            submitter: p.name.clone(),
            payload_url: payload_url.clone(),
            payload_type: ty.to_string(),
            title: get("title", "DC.title"),
            creator: get("creator", "DC.creator"),
            date: get("date", "DC.date"),
            local_id: get("localIdentifier", "DC.identifier"),
            primary_id: primary,
            trust: lading_ingest::Trust::Depositor {
                upload: Some(payload_url),
            },
        };
        let bid = lading_ingest::submit_keeping(&s.ingest, &sub, kept).await?;
        let info = s.ingest.engine.batch(&bid).await?;
        let uuid = info
            .submission
            .text("batchID")
            .unwrap_or_default()
            .to_string();
        let agent = fields
            .get("submitter")
            .cloned()
            .unwrap_or_else(|| p.name.clone());
        Ok(batch_state(&uuid, &agent, s.ingest.engine.clock().now_ms()))
    }
    .await;
    match answer {
        Ok(state) => {
            scrap.0 = None;
            let body = match form {
                Answer::Json => Value::Object(state).to_string(),
                Answer::Xml => to_xml(&state),
            };
            (
                StatusCode::OK,
                [(axum::http::header::CONTENT_TYPE, content_type(form))],
                body,
            )
                .into_response()
        }
        Err(e) => Exc(e, form).into_response(),
    }
}

/// The fields Lading maps onto its own submission; every other field is kept as it came.
const MAPPED: &[&str] = &[
    "type",
    "profile",
    "title",
    "creator",
    "date",
    "localIdentifier",
    "primaryIdentifier",
    "digestType",
    "digestValue",
    "responseForm",
    "DC.title",
    "DC.creator",
    "DC.date",
    "DC.identifier",
];

/// Most bytes of form fields kept with a batch's submission (names and values): the
/// submission is one node of the tree, which ZooKeeper holds to 1 MiB.
pub const MAX_KEPT_BYTES: usize = 32 << 10;

/// The form's fields Lading does not map (`note`, `notification`, `submitter`, the other
/// `DC.*`, and fields it does not know), kept with the batch's submission; more than
/// [`MAX_KEPT_BYTES`] of them is refused, naming the limit.
fn kept_fields(fields: &BTreeMap<String, String>) -> Result<Map<String, Value>, ApiError> {
    let kept: Map<String, Value> = fields
        .iter()
        .filter(|(k, _)| !MAPPED.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let bytes: usize = kept
        .iter()
        .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
        .sum();
    if bytes > MAX_KEPT_BYTES {
        return Err(ApiError::bad_request(format!(
            "the form's other fields ({}) hold {bytes} bytes; at most {MAX_KEPT_BYTES} are kept with a batch",
            kept.keys().cloned().collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(kept)
}

/// The form's `digestType`/`digestValue` of the uploaded file, checked when given (400
/// naming both digests when they differ, or an unknown algorithm).
async fn check_digest(
    path: &std::path::Path,
    ty: Option<&String>,
    value: Option<&String>,
) -> Result<(), ApiError> {
    let (Some(ty), Some(want)) = (
        ty.filter(|t| !t.trim().is_empty()),
        value.filter(|v| !v.trim().is_empty()),
    ) else {
        return Ok(());
    };
    let alg = lading_ingest::checkm::HashAlg::parse(ty.trim()).ok_or_else(|| {
        ApiError::bad_request(format!(
            "unknown digestType {ty:?} (md5, sha1, sha256 or sha512)"
        ))
    })?;
    let p = path.to_path_buf();
    let found = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        use std::io::Read;
        let mut h = lading_ingest::fetch::Hasher::new(alg);
        let mut f = std::fs::File::open(&p)?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                return Ok(h.hex());
            }
            h.update(&buf[..n]);
        }
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(|e| ApiError::internal(e.to_string()))?;
    if !found.eq_ignore_ascii_case(want.trim()) {
        return Err(ApiError::bad_request(format!(
            "the uploaded file's {} digest is {found}, not the digestValue {}",
            alg.name(),
            want.trim()
        )));
    }
    Ok(())
}

/// Merritt's `bat:batchState` of a batch just queued.
fn batch_state(uuid: &str, agent: &str, now_ms: u64) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        "bat:batchState".into(),
        json!({
            "bat:batchID": format!("bid-{uuid}"),
            "bat:batchStatus": "QUEUED",
            "bat:userAgent": agent,
            "bat:submissionDate": format_rfc3339(now_ms),
            // Merritt writes an empty list as "".
            "bat:jobStates": "",
        }),
    );
    m
}

/// The same document as Merritt's XML, in its namespace.
fn to_xml(state: &Map<String, Value>) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    out.push_str("<bat:batchState xmlns:bat=\"http://uc3.cdlib.org/ontology/mrt/ingest/batch\">\n");
    if let Some(Value::Object(inner)) = state.get("bat:batchState") {
        for (k, v) in inner {
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            out.push_str(&format!("  <{k}>{}</{k}>\n", xml_text(&text)));
        }
    }
    out.push_str("</bat:batchState>\n");
    out
}

/// `GET /poster/state`: the service's state, as Merritt's `ing:ingestServiceState`.
async fn state(State(s): State<AppState>) -> Response {
    let paused = s
        .ingest
        .engine
        .queue_paused("ingest")
        .await
        .unwrap_or(false);
    let body = json!({"ing:ingestServiceState": {
        "ing:serviceID": "lading",
        "ing:serviceName": "Lading",
        "ing:submissionState": if paused { "frozen" } else { "thawed" },
        "ing:version": env!("CARGO_PKG_VERSION"),
    }});
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// `GET /poster/help`: the routes and fields, in words.
async fn help() -> Response {
    let text = "Lading answers Merritt's ingest form:\n\
        POST /poster/submit, /poster/add, /object/ingest: a new object (or batch)\n\
        POST /poster/update, /object/update: a new version of primaryIdentifier\n\
        POST /poster/submit/SCHEME/SHOULDER/ID, /poster/update/SCHEME/SHOULDER/ID: the object named in the path\n\
        multipart fields: file (required), profile (required), type, submitter, filename, creator, title, date,\n\
        localIdentifier, primaryIdentifier, note, responseForm (xml or json), DC.*\n\
        Authorization: Basic NAME:TOKEN or Bearer TOKEN\n";
    (StatusCode::OK, text).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merritts_type_names_and_the_guess() {
        assert_eq!(payload_type("object-manifest"), Some("manifest"));
        assert_eq!(payload_type("batch-manifest"), Some("batch-manifest"));
        assert_eq!(payload_type("bogus"), None);
        let d = tempfile::tempdir().unwrap();
        let m = d.path().join("m.checkm");
        std::fs::write(
            &m,
            "#%checkm_0.7\n#%profile http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest\n",
        )
        .unwrap();
        assert_eq!(guess_type(&m, "m.checkm"), "manifest");
        let f = d.path().join("a.txt");
        std::fs::write(&f, "hello").unwrap();
        assert_eq!(guess_type(&f, "a.txt"), "file");
        assert_eq!(guess_type(&f, "a.ZIP"), "container");
    }

    #[test]
    fn the_answer_has_merritts_shape() {
        let st = batch_state("u-1", "agent", 0);
        let v = Value::Object(st.clone());
        assert_eq!(v["bat:batchState"]["bat:batchID"], "bid-u-1");
        assert_eq!(v["bat:batchState"]["bat:jobStates"], "");
        let x = to_xml(&st);
        assert!(x.contains("<bat:batchID>bid-u-1</bat:batchID>"), "{x}");
        assert!(x.contains("xmlns:bat="), "{x}");
    }
}
