//! The three state machines of SPEC §1 — job, batch and access — as plain data and pure
//! functions. Backends never decide a move; they apply what these functions return.
//!
//! Every state documents which service moves items *out* of it, so a reader can tell who is
//! responsible for a job stuck there.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A move that the state table does not allow. Names both states, so the message alone tells
/// an operator what was attempted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct IllegalTransition {
    pub kind: &'static str,
    pub from: String,
    pub to: String,
    /// What would be allowed instead, in words, when the table alone does not say it.
    pub why: Option<&'static str>,
    /// The admin action that was asked for (`requeue`, `release`, …), named in the message
    /// instead of the move it would have made.
    pub asked: Option<&'static str>,
}

impl fmt::Display for IllegalTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.asked {
            Some(asked) => write!(f, "cannot {asked} this {}: it is {}", self.kind, self.from)?,
            None => write!(
                f,
                "illegal {} transition from {} to {}",
                self.kind, self.from, self.to
            )?,
        }
        if let Some(w) = self.why {
            write!(f, "; {w}")?;
        }
        Ok(())
    }
}

impl IllegalTransition {
    /// The same refusal, named as the admin action `asked`.
    pub fn asked(self, asked: &'static str) -> IllegalTransition {
        IllegalTransition {
            asked: Some(asked),
            ..self
        }
    }
}

macro_rules! state_enum {
    ($(#[$meta:meta])* $name:ident, $kind:literal { $($(#[$vmeta:meta])* $variant:ident => $json:literal, $node:literal;)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$vmeta])* $variant,)* }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];
            pub const KIND: &'static str = $kind;

            /// The capitalised name written into status JSON (`"Pending"`).
            pub const fn name(self) -> &'static str {
                match self { $($name::$variant => $json,)* }
            }

            /// The lower-case form used in node paths (`/jobs/states/pending`).
            pub fn node_name(self) -> &'static str {
                match self { $($name::$variant => $node,)* }
            }

            /// Reads a state name leniently: any case, with or without `-`/`_`
            /// (`UpdateReporting`, `update-reporting`, `PENDING`).
            pub fn parse(s: &str) -> Option<Self> {
                // The stored form first (every status read parses one): no allocation on
                // either path (this was ten allocations a parse, a few percent of lading-sim).
                $(if s == $json { return Some($name::$variant); })*
                let lenient = |name: &str| {
                    let mut given = s.bytes().filter(|b| *b != b'-' && *b != b'_');
                    name.bytes().all(|n| given.next().is_some_and(|g| g.eq_ignore_ascii_case(&n)))
                        && given.next().is_none()
                };
                $(if lenient($json) { return Some($name::$variant); })*
                None
            }

            /// [`Self::parse`], or a message naming the valid states.
            pub fn parse_named(s: &str) -> Result<Self, String> {
                Self::parse(s).ok_or_else(|| {
                    let all: Vec<&str> = Self::ALL.iter().map(|x| x.name()).collect();
                    format!("unknown {} state {:?} (one of {})", $kind, s, all.join(", "))
                })
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.name()) }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> { s.serialize_str(self.name()) }
        }

        /// A state in the API's document: one of the names.
        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .enum_values(Some([$($json),*]))
                    .into()
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $name {}

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
                $name::parse_named(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

state_enum!(
    /// Job states. Moved out of by: Pending — the job acquirer (→ Estimating, or Held when the
    /// collection is held); Held — an admin release; Estimating…Notify — that stage's worker;
    /// Failed — an admin requeue or delete; Completed, Deleted — nobody (cleanup purges them).
    JobState, "job" {
        Pending => "Pending", "pending";
        Held => "Held", "held";
        Estimating => "Estimating", "estimating";
        Provisioning => "Provisioning", "provisioning";
        Downloading => "Downloading", "downloading";
        Processing => "Processing", "processing";
        Storing => "Storing", "storing";
        Recording => "Recording", "recording";
        Notify => "Notify", "notify";
        Completed => "Completed", "completed";
        Failed => "Failed", "failed";
        Deleted => "Deleted", "deleted";
    }
);

state_enum!(
    /// Batch states. Moved out of by: Pending — batch intake; Held — an admin release;
    /// Processing — the engine, when the last job leaves `batch-processing`; Reporting and
    /// UpdateReporting — the reporter; Failed — an admin (update-reporting or delete).
    BatchState, "batch" {
        Pending => "Pending", "pending";
        Held => "Held", "held";
        Processing => "Processing", "processing";
        Reporting => "Reporting", "reporting";
        UpdateReporting => "UpdateReporting", "update-reporting";
        Completed => "Completed", "completed";
        Failed => "Failed", "failed";
        Deleted => "Deleted", "deleted";
    }
);

state_enum!(
    /// Access (object assembly) states. Moved out of by: Pending and Processing — the
    /// assembly worker; Failed — an admin retry or delete.
    AccessState, "access" {
        Pending => "Pending", "pending";
        Processing => "Processing", "processing";
        Completed => "Completed", "completed";
        Failed => "Failed", "failed";
        Deleted => "Deleted", "deleted";
    }
);

/// What the caller asks of a state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<S> {
    /// The automatic successor on success.
    Success,
    /// The automatic successor on failure.
    Fail,
    /// An explicit target from the table.
    To(S),
}

fn illegal<S: fmt::Display>(
    kind: &'static str,
    from: S,
    to: impl fmt::Display,
) -> IllegalTransition {
    IllegalTransition {
        kind,
        from: from.to_string(),
        to: to.to_string(),
        why: None,
        asked: None,
    }
}

impl JobState {
    /// The stages a job goes through, in order (Pending, then each stage's success
    /// successor up to Notify).
    pub const PIPELINE: [JobState; 8] = [
        JobState::Pending,
        JobState::Estimating,
        JobState::Provisioning,
        JobState::Downloading,
        JobState::Processing,
        JobState::Storing,
        JobState::Recording,
        JobState::Notify,
    ];

    /// The pipeline's states latest first: the order a worker that drives every stage looks
    /// for work in, so jobs drain through rather than pile up at the start.
    pub const LATEST_FIRST: [JobState; 8] = {
        let p = JobState::PIPELINE;
        [p[7], p[6], p[5], p[4], p[3], p[2], p[1], p[0]]
    };

    /// Every state this one may move to (SPEC §1).
    pub fn targets(self) -> &'static [JobState] {
        use JobState::*;
        match self {
            Pending => &[Held, Estimating, Failed],
            Held => &[Pending, Deleted],
            Estimating => &[Provisioning, Failed],
            Provisioning => &[Downloading, Failed],
            Downloading => &[Processing, Failed],
            Processing => &[Storing, Failed],
            Storing => &[Recording, Failed],
            Recording => &[Notify, Failed],
            Notify => &[Completed, Failed],
            Failed => &[
                Pending,
                Estimating,
                Provisioning,
                Downloading,
                Processing,
                Storing,
                Recording,
                Notify,
                Deleted,
            ],
            Completed | Deleted => &[],
        }
    }

    /// The automatic successor on success, if this state has one.
    pub fn success(self) -> Option<JobState> {
        use JobState::*;
        Some(match self {
            Estimating => Provisioning,
            Provisioning => Downloading,
            Downloading => Processing,
            Processing => Storing,
            Storing => Recording,
            Recording => Notify,
            Notify => Completed,
            _ => return None,
        })
    }

    /// The automatic successor on failure, if this state has one.
    pub fn fail(self) -> Option<JobState> {
        use JobState::*;
        match self {
            Pending | Estimating | Provisioning | Downloading | Processing | Storing
            | Recording | Notify => Some(Failed),
            _ => None,
        }
    }

    /// A stage a worker runs: the states between Pending and Completed.
    pub fn is_stage(self) -> bool {
        self.success().is_some()
    }

    /// No move leads out of it.
    pub fn is_terminal(self) -> bool {
        self.targets().is_empty()
    }

    /// Admin delete is allowed: Failed and Held (by transition), Completed and Deleted
    /// (purge of a finished job).
    pub fn is_deletable(self) -> bool {
        matches!(
            self,
            JobState::Failed | JobState::Held | JobState::Completed | JobState::Deleted
        )
    }

    /// The batch reference folder a job in this state lives in.
    pub fn batch_folder(self) -> &'static str {
        match self {
            JobState::Completed => "batch-completed",
            JobState::Failed => "batch-failed",
            JobState::Deleted => "batch-deleted",
            _ => "batch-processing",
        }
    }

    /// Resolves an event to a target state, or refuses it.
    pub fn resolve(self, event: Event<JobState>) -> Result<JobState, IllegalTransition> {
        let to = match event {
            Event::Success => self
                .success()
                .ok_or_else(|| illegal("job", self, "its success successor (none)"))?,
            Event::Fail => self.fail().ok_or_else(|| illegal("job", self, "Failed"))?,
            Event::To(t) => t,
        };
        if self.targets().contains(&to) {
            Ok(to)
        } else {
            Err(illegal("job", self, to))
        }
    }
}

impl BatchState {
    pub fn targets(self) -> &'static [BatchState] {
        use BatchState::*;
        match self {
            Pending => &[Held, Processing],
            Held => &[Pending, Deleted],
            Processing => &[Reporting, Failed],
            Reporting => &[Completed, Failed],
            Failed => &[UpdateReporting, Deleted],
            UpdateReporting => &[Completed, Failed],
            Completed | Deleted => &[],
        }
    }

    pub fn success(self) -> Option<BatchState> {
        use BatchState::*;
        match self {
            Processing => Some(Reporting),
            Reporting | UpdateReporting => Some(Completed),
            _ => None,
        }
    }

    pub fn fail(self) -> Option<BatchState> {
        use BatchState::*;
        match self {
            Processing | Reporting | UpdateReporting => Some(Failed),
            _ => None,
        }
    }

    pub fn is_terminal(self) -> bool {
        self.targets().is_empty()
    }

    pub fn resolve(self, event: Event<BatchState>) -> Result<BatchState, IllegalTransition> {
        let to = match event {
            Event::Success => self
                .success()
                .ok_or_else(|| illegal("batch", self, "its success successor (none)"))?,
            Event::Fail => self
                .fail()
                .ok_or_else(|| illegal("batch", self, "Failed"))?,
            Event::To(t) => t,
        };
        if self.targets().contains(&to) {
            Ok(to)
        } else {
            Err(illegal("batch", self, to))
        }
    }
}

impl AccessState {
    pub fn targets(self) -> &'static [AccessState] {
        use AccessState::*;
        match self {
            Pending => &[Processing],
            Processing => &[Completed, Failed],
            Failed => &[Processing, Deleted],
            Completed | Deleted => &[],
        }
    }

    pub fn resolve(self, event: Event<AccessState>) -> Result<AccessState, IllegalTransition> {
        use AccessState::*;
        let to = match event {
            Event::Success => match self {
                Pending => Processing,
                Processing => Completed,
                _ => return Err(illegal("access", self, "its success successor (none)")),
            },
            Event::Fail => match self {
                Processing => Failed,
                _ => return Err(illegal("access", self, "Failed")),
            },
            Event::To(t) => t,
        };
        if self.targets().contains(&to) {
            Ok(to)
        } else {
            Err(illegal("access", self, to))
        }
    }
}

/// The bookkeeping half of a job's `status` node: everything except the timestamp and message,
/// which the caller supplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobProgress {
    pub state: JobState,
    pub last_successful: Option<JobState>,
    pub retry_count: u32,
}

impl JobProgress {
    pub fn new() -> Self {
        JobProgress {
            state: JobState::Pending,
            last_successful: None,
            retry_count: 0,
        }
    }

    /// Applies one move (SPEC §1). `last_successful_status` becomes the old state on a forward
    /// move out of a stage that does not lead into Failed or Deleted; moves into or out of
    /// Failed/Deleted, and moves of Pending/Held, leave it as it was.
    pub fn apply(self, event: Event<JobState>) -> Result<JobProgress, IllegalTransition> {
        let to = self.state.resolve(event)?;
        let mut next = self;
        next.state = to;
        if self.state.is_stage() && !matches!(to, JobState::Failed | JobState::Deleted) {
            next.last_successful = Some(self.state);
        }
        Ok(next)
    }

    /// The default target of an admin requeue: the stage that failed, i.e. the success
    /// successor of `last_successful_status`, or Pending when that is null.
    pub fn requeue_target(self) -> JobState {
        self.last_successful
            .and_then(JobState::success)
            .unwrap_or(JobState::Pending)
    }

    /// An admin requeue of a Failed job: to `target` (default: the stage that failed) with
    /// `retry_count` + 1. Only Failed jobs can be requeued, and only to a table target that is
    /// not Deleted.
    pub fn requeue(self, target: Option<JobState>) -> Result<JobProgress, IllegalTransition> {
        let to = target.unwrap_or_else(|| self.requeue_target());
        if self.state != JobState::Failed {
            return Err(IllegalTransition {
                why: Some("only a Failed job can be requeued"),
                ..illegal("job", self.state, to).asked("requeue")
            });
        }
        if to == JobState::Deleted {
            return Err(IllegalTransition {
                why: Some("a requeue to Deleted is a delete: delete it instead"),
                ..illegal("job", self.state, to).asked("requeue")
            });
        }
        let mut next = self.apply(Event::To(to))?;
        next.retry_count += 1;
        Ok(next)
    }
}

impl Default for JobProgress {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_pipeline_is_the_chain_of_successes() {
        let p = JobState::PIPELINE;
        assert!(
            p[0].targets().contains(&p[1]),
            "Pending is taken into Estimating"
        );
        for w in p[1..].windows(2) {
            assert_eq!(w[0].success(), Some(w[1]));
        }
        assert_eq!(p[p.len() - 1].success(), Some(JobState::Completed));
    }

    #[test]
    fn names_round_trip_and_parse_leniently() {
        for s in JobState::ALL {
            assert_eq!(JobState::parse(s.name()), Some(*s));
            assert_eq!(JobState::parse(s.node_name()), Some(*s));
        }
        for s in BatchState::ALL {
            assert_eq!(BatchState::parse(s.name()), Some(*s));
            assert_eq!(BatchState::parse(s.node_name()), Some(*s));
        }
        assert_eq!(
            BatchState::parse("update_reporting"),
            Some(BatchState::UpdateReporting)
        );
        assert_eq!(JobState::parse("Bogus"), None);
        assert_eq!(JobState::parse("PENDING"), Some(JobState::Pending));
        assert_eq!(
            BatchState::parse("UPDATE_reporting"),
            Some(BatchState::UpdateReporting)
        );
        // A prefix or a longer name is not the state.
        assert_eq!(JobState::parse("Pendin"), None);
        assert_eq!(JobState::parse("Pendings"), None);
        assert_eq!(JobState::parse(""), None);
    }

    #[test]
    fn illegal_transition_names_both_states() {
        let err = JobState::Completed
            .resolve(Event::To(JobState::Pending))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "illegal job transition from Completed to Pending"
        );
        let err = BatchState::Pending
            .resolve(Event::To(BatchState::Completed))
            .unwrap_err();
        assert!(err.to_string().contains("Pending") && err.to_string().contains("Completed"));
    }

    #[test]
    fn last_successful_status_follows_the_seed_walkthrough() {
        let p = JobProgress::new();
        let p = p.apply(Event::To(JobState::Estimating)).unwrap();
        assert_eq!(p.last_successful, None, "Pending → Estimating keeps nil");
        let p = p.apply(Event::Success).unwrap();
        assert_eq!(
            (p.state, p.last_successful),
            (JobState::Provisioning, Some(JobState::Estimating))
        );
        let p = p.apply(Event::Success).unwrap().apply(Event::Fail).unwrap();
        assert_eq!(
            (p.state, p.last_successful),
            (JobState::Failed, Some(JobState::Provisioning))
        );
        let r = p.requeue(None).unwrap();
        assert_eq!(
            (r.state, r.last_successful, r.retry_count),
            (JobState::Downloading, Some(JobState::Provisioning), 1)
        );
    }

    #[test]
    fn requeue_with_null_last_successful_goes_to_pending() {
        let p = JobProgress::new().apply(Event::Fail).unwrap();
        assert_eq!(p.requeue(None).unwrap().state, JobState::Pending);
    }

    #[test]
    fn requeue_refuses_non_failed_and_deleted_target() {
        assert!(JobProgress::new().requeue(None).is_err());
        let f = JobProgress::new().apply(Event::Fail).unwrap();
        assert!(f.requeue(Some(JobState::Deleted)).is_err());
        assert!(f.requeue(Some(JobState::Completed)).is_err());
    }

    fn job_event() -> impl Strategy<Value = Event<JobState>> {
        prop_oneof![
            Just(Event::Success),
            Just(Event::Fail),
            proptest::sample::select(JobState::ALL.to_vec()).prop_map(Event::To),
        ]
    }

    fn batch_event() -> impl Strategy<Value = Event<BatchState>> {
        prop_oneof![
            Just(Event::Success),
            Just(Event::Fail),
            proptest::sample::select(BatchState::ALL.to_vec()).prop_map(Event::To),
        ]
    }

    proptest! {
        #[test]
        fn no_job_event_sequence_leaves_the_table(events in proptest::collection::vec((job_event(), any::<bool>()), 0..60)) {
            let mut p = JobProgress::new();
            for (ev, requeue) in events {
                let before = p;
                let res = if requeue && p.state == JobState::Failed { p.requeue(None) } else { p.apply(ev) };
                match res {
                    Ok(next) => {
                        prop_assert!(before.state.targets().contains(&next.state), "{:?} -> {:?}", before.state, next.state);
                        prop_assert!(next.retry_count >= before.retry_count);
                        if let Some(ls) = next.last_successful { prop_assert!(ls.is_stage()); }
                        p = next;
                    }
                    Err(_) => prop_assert_eq!(p, before),
                }
            }
        }

        #[test]
        fn requeue_lands_on_the_stage_that_failed(stages in 0usize..8) {
            // Walk `stages` successes from Pending, then fail there.
            let mut p = JobProgress::new();
            if stages > 0 { p = p.apply(Event::To(JobState::Estimating)).unwrap(); }
            for _ in 1..stages { p = p.apply(Event::Success).unwrap(); }
            let failed_in = p.state;
            let f = p.apply(Event::Fail).unwrap();
            let r = f.requeue(None).unwrap();
            let expected = if failed_in == JobState::Estimating { JobState::Pending } else { failed_in };
            prop_assert_eq!(r.state, expected);
            prop_assert_eq!(r.retry_count, 1);
        }

        #[test]
        fn no_batch_event_sequence_leaves_the_table(events in proptest::collection::vec(batch_event(), 0..40)) {
            let mut s = BatchState::Pending;
            for ev in events {
                if let Ok(next) = s.resolve(ev) {
                    prop_assert!(s.targets().contains(&next));
                    s = next;
                }
            }
        }
    }
}
