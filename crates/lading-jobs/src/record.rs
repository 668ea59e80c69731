//! A job's record, as stored and as readers see it, and how a run ends.

use super::*;

/// The record at `/generic-jobs/TYPE/jobs/ID`. Unknown fields are kept.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub state: State,
    /// The job's data: any JSON, the creator's to set and the processor's to update.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub data: Value,
    /// When the job is (or was) due, ms since the epoch.
    pub scheduled_ms: u64,
    /// Set while running when the job was added again or resubmitted: `finish` re-enqueues it.
    #[serde(default)]
    pub resubmit: bool,
    /// The scheduled time the resubmitted job gets (now, when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resubmit_ms: Option<u64>,
    /// Data given by an `add` while the job ran: the data of its next run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub next_data: Option<Value>,
    /// The lock of the processor running it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<String>,
    /// Who runs it (`host:pid` or the name the processor gave).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Last change; while running, the last heartbeat. The activity monitor reads this.
    pub updated_ms: u64,
    pub added_ms: u64,
    /// Times accepted.
    #[serde(default)]
    pub runs: u64,
    /// Times the activity monitor re-enqueued it.
    #[serde(default)]
    pub stalls: u64,
    /// Lower runs first (among due jobs); -1000 to 1000.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// Runs that ended in error since the job was added, last succeeded or was retried.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: u32,
    /// The last run's error, when it ended in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When it finished or failed (ms); names its `finished`/`failed` entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    /// Transitions so far (each state it entered counts one).
    #[serde(default)]
    pub seq: u64,
    /// The states of the last transitions (at most [`HISTORY`]), oldest first, the last one
    /// `state`: a subscriber that was slower than the job still sees each one, in order.
    /// Stored as one letter per state (`p`ending, `r`unning, `f`inished, `x` failed).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "history_letters",
        deserialize_with = "history_from_letters"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "prf"))]
    pub history: Vec<State>,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: serde_json::Map<String, Value>,
}

fn history_letters<S: serde::Serializer>(h: &[State], s: S) -> Result<S::Ok, S::Error> {
    let letters: String = h
        .iter()
        .map(|st| match st {
            State::Pending => 'p',
            State::Running => 'r',
            State::Finished => 'f',
            State::Failed => 'x',
        })
        .collect();
    s.serialize_str(&letters)
}

fn history_from_letters<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<State>, D::Error> {
    let letters = String::deserialize(d)?;
    letters
        .chars()
        .map(|c| match c {
            'p' => Ok(State::Pending),
            'r' => Ok(State::Running),
            'f' => Ok(State::Finished),
            'x' => Ok(State::Failed),
            other => Err(serde::de::Error::custom(format!(
                "history letter {other:?} is none of p, r, f, x"
            ))),
        })
        .collect()
}

pub(crate) fn is_zero<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Transitions a record remembers for subscribers.
pub const HISTORY: usize = 8;
/// Longest error message kept (longer ones keep their end).
pub const MAX_ERROR: usize = 4096;
/// Priorities allowed: lower runs first.
pub const PRIORITIES: std::ops::RangeInclusive<i32> = -1000..=1000;

impl Record {
    /// The record as stored: JSON of plain fields and a `Value`, which always serializes.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a job record is plain JSON")
    }

    /// A new pending job.
    pub(crate) fn new(data: Value, scheduled_ms: u64, priority: i32, now: u64) -> Record {
        let mut rec = Record {
            state: State::Pending,
            data,
            scheduled_ms,
            resubmit: false,
            resubmit_ms: None,
            next_data: None,
            lock: None,
            owner: None,
            updated_ms: now,
            added_ms: now,
            runs: 0,
            stalls: 0,
            priority,
            attempts: 0,
            last_error: None,
            ended_ms: None,
            seq: 0,
            history: Vec::new(),
            extra: Default::default(),
        };
        rec.enter(State::Pending);
        rec
    }

    /// Moves to `state`, remembering the transition.
    pub(crate) fn enter(&mut self, state: State) {
        self.state = state;
        self.seq += 1;
        self.history.push(state);
        if self.history.len() > HISTORY {
            self.history.remove(0);
        }
    }

    /// The ops removing the entry of a finished or failed job (none when it has none).
    pub(crate) fn leave_end(&mut self, ty: &str, id: &str) -> Vec<Op> {
        let ops = match (self.state, self.ended_ms) {
            (State::Finished, Some(ms)) => vec![Op::delete(finished_path(ty, ms, id), None)],
            (State::Failed, Some(ms)) => vec![Op::delete(failed_path(ty, ms, id), None)],
            _ => Vec::new(),
        };
        self.ended_ms = None;
        ops
    }

    /// Ends the job in `state` (finished or failed) at `now`: the op making its entry.
    pub(crate) fn end(&mut self, state: State, ty: &str, id: &str, now: u64) -> Op {
        self.enter(state);
        self.ended_ms = Some(now);
        match state {
            State::Failed => Op::create(failed_path(ty, now, id), None),
            _ => Op::create(finished_path(ty, now, id), None),
        }
    }

    /// Pending at `scheduled_ms`: the op making its entry.
    pub(crate) fn enqueue(&mut self, ty: &str, id: &str, scheduled_ms: u64) -> Op {
        self.enter(State::Pending);
        self.scheduled_ms = scheduled_ms;
        Op::create(pending_path(ty, self.priority, scheduled_ms, id), None)
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Done; the job's final data when given.
    Success(Option<Value>),
    /// Failed with `message`: retried by the type's policy, failed after its last attempt.
    /// Its data is updated when given.
    Error {
        message: String,
        data: Option<Value>,
    },
}

/// A job as a reader sees it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    #[serde(rename = "type")]
    pub ty: String,
    pub id: String,
    #[serde(flatten)]
    pub record: Record,
}
