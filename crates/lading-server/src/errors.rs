//! [`ApiError`]: what a caller of the API reads when a request fails, and the one place where
//! the service's internal errors become it.
//!
//! The rule (docs/SECURITY.md, "What a depositor reads"): a caller reads the problem in its
//! own terms — the identifiers, names and values it sent, and the service's fixed words — and
//! never a server path, a storage node's or store's address, or an error chain. Every
//! conversion from an internal error type below is an exhaustive `match` (no catch-all arm),
//! so a new variant must be decided on here: either it is about the caller's request and its
//! text is built from the request's parts, or it is the service's own trouble and the caller
//! reads a fixed sentence with an error id while the log has the detail under the same id.
//! The test at the bottom walks every variant of every error type a caller can cause.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lading_core::tree::TreeError;
use lading_engine::EngineError;
use lading_ingest::SubmitError;
use lading_ingest::config::ConfigError;
use lading_ingest::deletion::DeletionError;
use lading_jobs::JobsError;
use serde_json::json;

/// An error as the API reports it: `{"error": message, "kind": kind}` with `status`.
/// `message` is what the caller reads (see the module's rule).
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
}

impl ApiError {
    /// A refusal whose text the handler composed from the request's own parts.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
        }
    }
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid", message)
    }
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }
    /// An error the caller cannot act on: the detail (paths, addresses, error chains) goes
    /// to the log only, under an error id that the answer gives, so an operator can match
    /// the two.
    pub fn internal(detail: impl Into<String>) -> ApiError {
        let id = error_id();
        tracing::error!(error_id = %id, detail = %detail.into(), "internal error");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("internal error (error id {id}; the operator's log has the detail)"),
        )
    }

    /// A refusal whose operator detail stays in the log: the caller reads `safe` and the
    /// error id, the log has both and `detail`.
    pub fn logged(status: StatusCode, kind: &'static str, safe: &str, detail: &str) -> ApiError {
        let id = error_id();
        tracing::warn!(error_id = %id, %detail, "{safe}");
        ApiError::new(status, kind, format!("{safe} (error id {id})"))
    }

    /// The store not answering (a lost connection, an expired session, a busy store): try
    /// again later. The store's own words (its address among them) go to the log.
    pub fn unavailable(detail: &str) -> ApiError {
        ApiError::logged(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the service's store is not answering; try again shortly",
            detail,
        )
    }
}

/// A short id for one error, shown to the caller and logged with the detail: unique in this
/// process (a counter) and across restarts (the process's start second).
pub fn error_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let start = *START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    format!(
        "E{:x}-{}",
        start % 0x1_0000_0000,
        N.fetch_add(1, Ordering::Relaxed) + 1
    )
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"error": self.message, "kind": self.kind})),
        )
            .into_response()
    }
}

/// A store error: a write too large for the store is the caller's (413, naming the sizes);
/// one that a retry may cure is 503; anything else is the service's own trouble.
impl From<TreeError> for ApiError {
    fn from(t: TreeError) -> ApiError {
        match t.root() {
            TreeError::TooLarge { bytes, limit, .. } => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!(
                    "the request is {bytes} bytes as stored, more than the store takes in \
                     one write ({limit} bytes): shorten its fields"
                ),
            ),
            _ if t.is_retryable() => ApiError::unavailable(&t.to_string()),
            TreeError::NoNode(_)
            | TreeError::NodeExists(_)
            | TreeError::BadVersion { .. }
            | TreeError::NotEmpty(_)
            | TreeError::NoChildrenForEphemerals(_)
            | TreeError::InvalidPath(..)
            | TreeError::SessionExpired
            | TreeError::ConnectionLoss(_)
            | TreeError::Multi { .. }
            | TreeError::NotOurs(..)
            | TreeError::Backend(_) => ApiError::internal(t.to_string()),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        let (status, kind) = match &e {
            EngineError::NoBatch(_) | EngineError::NoJob(_) | EngineError::NoAccess(_) => {
                (StatusCode::NOT_FOUND, "not_found")
            }
            EngineError::Illegal(_) => (StatusCode::CONFLICT, "illegal_transition"),
            EngineError::Locked(_) | EngineError::ForeignLocked(_) => {
                (StatusCode::CONFLICT, "locked")
            }
            EngineError::LeaseLost(_) | EngineError::Conflict(_) => {
                (StatusCode::CONFLICT, "conflict")
            }
            EngineError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid"),
            EngineError::Corrupt { .. } => return ApiError::internal(e.to_string()),
            EngineError::Tree(_) => {
                let EngineError::Tree(t) = e else {
                    unreachable!()
                };
                return t.into();
            }
        };
        ApiError::new(status, kind, e.to_string())
    }
}

/// A profile that cannot be used: the caller reads the profile's name, the operator's log
/// has its file and what is wrong in it.
impl From<ConfigError> for ApiError {
    fn from(c: ConfigError) -> ApiError {
        match c {
            ConfigError::UnknownProfile { ref name, .. } => ApiError::logged(
                StatusCode::BAD_REQUEST,
                "invalid",
                &format!("unknown profile {name:?}"),
                &c.to_string(),
            ),
            ConfigError::BadProfileName(_) => ApiError::bad_request(c.to_string()),
            ConfigError::Read { .. }
            | ConfigError::Parse { .. }
            | ConfigError::Env { .. }
            | ConfigError::UnknownNode(_) => ApiError::logged(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the profile cannot be read; an operator must fix it",
                &c.to_string(),
            ),
        }
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> ApiError {
        match e {
            SubmitError::Engine(e) => e.into(),
            SubmitError::Profile(c) => c.into(),
            e @ SubmitError::Forbidden(_) => ApiError::forbidden(e.to_string()),
            e @ SubmitError::Inventory(_) => ApiError::internal(e.to_string()),
            // Each of these names only what the submission said.
            e @ (SubmitError::PayloadType(_)
            | SubmitError::Url(_)
            | SubmitError::Submitter
            | SubmitError::Policy { .. }
            | SubmitError::PrimaryId(_)) => ApiError::bad_request(e.to_string()),
        }
    }
}

impl From<JobsError> for ApiError {
    fn from(e: JobsError) -> ApiError {
        let (status, kind) = match &e {
            JobsError::NoJob { .. }
            | JobsError::NoType(_)
            | JobsError::NoSubscription(_)
            | JobsError::NoSchedule { .. } => (StatusCode::NOT_FOUND, "not_found"),
            JobsError::WrongState { .. } => (StatusCode::CONFLICT, "wrong_state"),
            JobsError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid"),
            JobsError::TooManySubscriptions(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many"),
            JobsError::Halt { .. } => (StatusCode::CONFLICT, "halt"),
            JobsError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            JobsError::Corrupt { .. } => return ApiError::internal(e.to_string()),
            JobsError::Tree(_) => {
                let JobsError::Tree(t) = e else {
                    unreachable!()
                };
                return t.into();
            }
        };
        ApiError::new(status, kind, e.to_string())
    }
}

impl From<DeletionError> for ApiError {
    fn from(e: DeletionError) -> ApiError {
        let (status, kind) = match &e {
            DeletionError::NotFound(_)
            | DeletionError::NoObject(_)
            | DeletionError::NoVersion { .. } => (StatusCode::NOT_FOUND, "not_found"),
            DeletionError::Deleted { .. } => (StatusCode::GONE, "deleted"),
            DeletionError::Open { .. } | DeletionError::NotRequested { .. } => {
                (StatusCode::CONFLICT, "wrong_state")
            }
            DeletionError::Reason => (StatusCode::BAD_REQUEST, "invalid"),
            DeletionError::SameAdmin { .. } => (StatusCode::FORBIDDEN, "second_admin"),
            DeletionError::Inventory(_) | DeletionError::Corrupt(..) => {
                return ApiError::internal(e.to_string());
            }
        };
        ApiError::new(status, kind, e.to_string())
    }
}

/// An operator verb's error ([`crate::ops::OpsError`]) as the API reports it: the error it
/// carries, mapped as its type is everywhere else.
impl From<crate::ops::OpsError> for ApiError {
    fn from(e: crate::ops::OpsError) -> ApiError {
        use crate::ops::OpsError as O;
        match e {
            O::Api(a) => a,
            O::Engine(x) => x.into(),
            O::Submit(x) => x.into(),
            O::BadId(x) => ApiError::bad_request(x.to_string()),
            O::Json(x) => ApiError::internal(format!("a record as JSON: {x}")),
            O::Unsupported(why) => ApiError::bad_request(why),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Every variant of every internal error type a caller can cause, carrying operator
    //! detail (a server folder, a store's and a node's address, a password) wherever the
    //! variant has room for it: what the caller reads never holds that detail, and each
    //! variant's status is one a client can act on.

    use super::*;

    /// Operator detail: none of it may reach a caller.
    const SECRETS: [&str; 4] = ["/srv/SECRET", "10.0.0.9:2181", "hunter2", "os error"];

    fn detail(what: &str) -> String {
        format!("{what} at /srv/SECRET/data via 10.0.0.9:2181 (postgres://u:hunter2@db) os error 2")
    }

    fn trees() -> Vec<TreeError> {
        let d = detail;
        let all = vec![
            TreeError::NoNode(d("node")),
            TreeError::NodeExists(d("node")),
            TreeError::BadVersion {
                path: d("node"),
                expected: 1,
                actual: 2,
            },
            TreeError::NotEmpty(d("node")),
            TreeError::NoChildrenForEphemerals(d("node")),
            TreeError::InvalidPath(d("node"), "why"),
            TreeError::SessionExpired,
            TreeError::ConnectionLoss(d("connection")),
            TreeError::Multi {
                index: 0,
                op_path: d("node"),
                cause: Box::new(TreeError::Backend(d("backend"))),
            },
            TreeError::NotOurs(d("store"), d("why")),
            TreeError::TooLarge {
                path: d("node"),
                bytes: 2_000_000,
                limit: 1_000_000,
            },
            TreeError::Backend(d("backend")),
        ];
        // Exhaustive: a new variant does not compile until it is in the list above.
        for t in &all {
            match t {
                TreeError::NoNode(_)
                | TreeError::NodeExists(_)
                | TreeError::BadVersion { .. }
                | TreeError::NotEmpty(_)
                | TreeError::NoChildrenForEphemerals(_)
                | TreeError::InvalidPath(..)
                | TreeError::SessionExpired
                | TreeError::ConnectionLoss(_)
                | TreeError::Multi { .. }
                | TreeError::NotOurs(..)
                | TreeError::TooLarge { .. }
                | TreeError::Backend(_) => {}
            }
        }
        all
    }

    fn engines() -> Vec<EngineError> {
        let illegal = lading_core::IllegalTransition {
            kind: "batch",
            from: "Pending".into(),
            to: "Completed".into(),
            why: None,
            asked: None,
        };
        let mut all = vec![
            EngineError::NoBatch("bid1".into()),
            EngineError::NoJob("jid1".into()),
            EngineError::NoAccess("a1".into()),
            EngineError::Illegal(illegal),
            EngineError::LeaseLost("/jobs/jid1".into()),
            EngineError::Locked("jid1".into()),
            EngineError::ForeignLocked("bid1".into()),
            EngineError::Corrupt {
                path: detail("node"),
                reason: detail("json"),
            },
            EngineError::Invalid("bad id \"x\"".into()),
            EngineError::Conflict("/jobs/jid1".into()),
        ];
        all.extend(trees().into_iter().map(EngineError::Tree));
        for e in &all {
            match e {
                EngineError::NoBatch(_)
                | EngineError::NoJob(_)
                | EngineError::NoAccess(_)
                | EngineError::Illegal(_)
                | EngineError::LeaseLost(_)
                | EngineError::Locked(_)
                | EngineError::ForeignLocked(_)
                | EngineError::Corrupt { .. }
                | EngineError::Invalid(_)
                | EngineError::Conflict(_)
                | EngineError::Tree(_) => {}
            }
        }
        all
    }

    fn configs() -> Vec<ConfigError> {
        let all = vec![
            ConfigError::Read {
                path: detail("profile").into(),
                error: std::io::Error::other(detail("io")),
            },
            ConfigError::Parse {
                path: detail("profile").into(),
                error: detail("toml"),
            },
            ConfigError::UnknownProfile {
                name: "nope".into(),
                path: detail("profile").into(),
            },
            ConfigError::BadProfileName("../x".into()),
            ConfigError::Env {
                name: "LADING_X".into(),
                error: detail("env"),
            },
            ConfigError::UnknownNode(detail("node")),
        ];
        for c in &all {
            match c {
                ConfigError::Read { .. }
                | ConfigError::Parse { .. }
                | ConfigError::UnknownProfile { .. }
                | ConfigError::BadProfileName(_)
                | ConfigError::Env { .. }
                | ConfigError::UnknownNode(_) => {}
            }
        }
        all
    }

    fn submits() -> Vec<SubmitError> {
        let mut all = vec![
            SubmitError::PayloadType("tarball".into()),
            SubmitError::Url("not a URL: \"x\"".into()),
            SubmitError::Submitter,
            SubmitError::Policy {
                url: "http://example.org/x".into(),
                why: "its host is not allowed".into(),
            },
            SubmitError::PrimaryId("ark:/99999/a|b has '|'".into()),
            SubmitError::Forbidden("alice may not submit to profile \"beta\"".into()),
            SubmitError::Inventory(detail("inventory")),
        ];
        all.extend(configs().into_iter().map(SubmitError::Profile));
        all.extend(engines().into_iter().map(SubmitError::Engine));
        for e in &all {
            match e {
                SubmitError::Profile(_)
                | SubmitError::PayloadType(_)
                | SubmitError::Url(_)
                | SubmitError::Submitter
                | SubmitError::Policy { .. }
                | SubmitError::PrimaryId(_)
                | SubmitError::Forbidden(_)
                | SubmitError::Inventory(_)
                | SubmitError::Engine(_) => {}
            }
        }
        all
    }

    fn jobs() -> Vec<JobsError> {
        let mut all = vec![
            JobsError::NoType("t".into()),
            JobsError::NoJob {
                ty: "t".into(),
                id: "j".into(),
            },
            JobsError::Halt {
                ty: "t".into(),
                id: "j".into(),
                why: "removed",
            },
            JobsError::NoSubscription(7),
            JobsError::TooManySubscriptions(100),
            JobsError::Invalid("bad".into()),
            JobsError::Corrupt {
                path: detail("node"),
                reason: detail("json"),
            },
            JobsError::Conflict("t/j".into()),
            JobsError::WrongState {
                ty: "t".into(),
                id: "j".into(),
                state: lading_jobs::State::Pending,
                why: "not running",
            },
            JobsError::NoSchedule {
                ty: "t".into(),
                name: "s".into(),
            },
        ];
        all.extend(trees().into_iter().map(JobsError::Tree));
        for e in &all {
            match e {
                JobsError::NoType(_)
                | JobsError::NoJob { .. }
                | JobsError::Halt { .. }
                | JobsError::NoSubscription(_)
                | JobsError::TooManySubscriptions(_)
                | JobsError::Invalid(_)
                | JobsError::Corrupt { .. }
                | JobsError::Conflict(_)
                | JobsError::WrongState { .. }
                | JobsError::NoSchedule { .. }
                | JobsError::Tree(_) => {}
            }
        }
        all
    }

    fn deletions() -> Vec<DeletionError> {
        let all = vec![
            DeletionError::NotFound("del1".into()),
            DeletionError::NoObject("ark:/1/x".into()),
            DeletionError::NoVersion {
                ark: "ark:/1/x".into(),
                version: 3,
            },
            DeletionError::Deleted {
                target: "ark:/1/x".into(),
                id: "del1".into(),
            },
            DeletionError::Open {
                target: "ark:/1/x".into(),
                id: "del1".into(),
            },
            DeletionError::Reason,
            DeletionError::SameAdmin {
                id: "del1".into(),
                name: "alice".into(),
            },
            DeletionError::NotRequested {
                id: "del1".into(),
                status: "deleted",
                verb: "approved",
            },
            DeletionError::Inventory(lading_ingest::inventory::InventoryError::Io(
                std::io::Error::other(detail("sqlite")),
            )),
            DeletionError::Corrupt("del1".into(), detail("json")),
        ];
        for e in &all {
            match e {
                DeletionError::NotFound(_)
                | DeletionError::NoObject(_)
                | DeletionError::NoVersion { .. }
                | DeletionError::Deleted { .. }
                | DeletionError::Open { .. }
                | DeletionError::Reason
                | DeletionError::SameAdmin { .. }
                | DeletionError::NotRequested { .. }
                | DeletionError::Inventory(_)
                | DeletionError::Corrupt(..) => {}
            }
        }
        all
    }

    fn reads_no_secret(what: &str, a: &ApiError) {
        for s in SECRETS {
            assert!(
                !a.message.contains(s),
                "{what} hands the caller {s:?}: {}",
                a.message
            );
        }
        assert!(!a.message.is_empty(), "{what}: no message");
        if a.status.is_server_error() {
            assert!(a.message.contains("error id"), "{what}: {}", a.message);
        }
    }

    #[test]
    fn no_error_a_caller_can_cause_hands_it_operator_detail() {
        let mut n = 0;
        for e in submits() {
            let what = format!("{e:?}");
            reads_no_secret(&what, &ApiError::from(e));
            n += 1;
        }
        for e in jobs() {
            let what = format!("{e:?}");
            reads_no_secret(&what, &ApiError::from(e));
            n += 1;
        }
        for e in deletions() {
            let what = format!("{e:?}");
            reads_no_secret(&what, &ApiError::from(e));
            n += 1;
        }
        for e in engines() {
            let what = format!("{e:?}");
            reads_no_secret(&what, &ApiError::from(crate::ops::OpsError::from(e)));
            n += 1;
        }
        assert!(n > 60, "{n} errors walked");
    }

    #[test]
    fn each_kind_keeps_the_status_a_client_acts_on() {
        let too_large = TreeError::TooLarge {
            path: "/batches/x".into(),
            bytes: 2_000_000,
            limit: 1_000_000,
        };
        let a = ApiError::from(EngineError::Tree(too_large));
        assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(a.message.contains("1000000 bytes"), "{}", a.message);
        let a = ApiError::from(EngineError::Tree(TreeError::ConnectionLoss(detail("c"))));
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
        let a = ApiError::from(SubmitError::Profile(ConfigError::UnknownProfile {
            name: "nope".into(),
            path: detail("p").into(),
        }));
        assert_eq!(a.status, StatusCode::BAD_REQUEST);
        assert!(
            a.message.starts_with("unknown profile \"nope\""),
            "{}",
            a.message
        );
        let a = ApiError::from(EngineError::NoJob("jid9".into()));
        assert_eq!(
            (a.status, a.message.as_str()),
            (StatusCode::NOT_FOUND, "no such job: jid9")
        );
    }

    #[test]
    fn job_api_errors_map_to_statuses_that_name_them() {
        let cases = [
            (
                JobsError::NoSubscription(7),
                StatusCode::NOT_FOUND,
                "not_found",
            ),
            (
                JobsError::TooManySubscriptions(100_000),
                StatusCode::TOO_MANY_REQUESTS,
                "too_many",
            ),
            (
                JobsError::Invalid("x".into()),
                StatusCode::BAD_REQUEST,
                "invalid",
            ),
        ];
        for (e, status, kind) in cases {
            let msg = e.to_string();
            let api = ApiError::from(e);
            assert_eq!((api.status, api.kind), (status, kind), "{msg}");
            assert_eq!(api.message, msg);
        }
    }
}
