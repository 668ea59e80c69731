//! How a job's and a batch's status are read: field by field, the known ones typed and every
//! other kept as it is in `extra`, as `#[serde(flatten)]` would read them, without its
//! buffering (every field copied once into a generic value first: a status is decoded at
//! almost every call of the engine, and that was 4% of a simulator run).
//!
//! What the derived form did, this does: a repeated known field is refused, a repeated other
//! field keeps its last value, `message: ""` is none, and only an object is a status.

use super::{BatchStatus, JobStatus};
use crate::state::{BatchState, JobState};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;

/// A field's name, borrowed from the input when it can be.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct K;
        impl<'de> Visitor<'de> for K {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(K)
    }
}

/// `message` as Merritt writes it: `""` (or `null`) for none.
struct Message(Option<String>);

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        super::message_field::deserialize(d).map(Message)
    }
}

/// Reads a status object's fields: `known` takes the value of a field it knows and says so;
/// every other field goes, as it is, into the map returned.
fn fields<'de, A: MapAccess<'de>>(
    mut m: A,
    mut known: impl FnMut(&str, &mut A) -> Result<bool, A::Error>,
) -> Result<Map<String, Value>, A::Error> {
    let mut extra = Map::new();
    while let Some(Key(k)) = m.next_key()? {
        if !known(&k, &mut m)? {
            let v: Value = m.next_value()?;
            extra.insert(k.into_owned(), v);
        }
    }
    Ok(extra)
}

/// Sets `slot` from the next value, refusing a second one.
fn once<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    slot: &mut Option<T>,
    name: &'static str,
    m: &mut A,
) -> Result<bool, A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(name));
    }
    *slot = Some(m.next_value()?);
    Ok(true)
}

impl<'de> Deserialize<'de> for JobStatus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = JobStatus;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("struct JobStatus")
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<JobStatus, A::Error> {
                let mut status: Option<JobState> = None;
                let mut last_successful: Option<Option<JobState>> = None;
                let mut last_modified: Option<String> = None;
                let mut retry_count: Option<u32> = None;
                let mut message: Option<Message> = None;
                let extra = fields(m, |k, m| match k {
                    "status" => once(&mut status, "status", m),
                    "last_successful_status" => {
                        once(&mut last_successful, "last_successful_status", m)
                    }
                    "last_modified" => once(&mut last_modified, "last_modified", m),
                    "retry_count" => once(&mut retry_count, "retry_count", m),
                    "message" => once(&mut message, "message", m),
                    _ => Ok(false),
                })?;
                Ok(JobStatus {
                    status: status.ok_or_else(|| de::Error::missing_field("status"))?,
                    last_successful_status: last_successful.flatten(),
                    last_modified: last_modified.unwrap_or_default(),
                    retry_count: retry_count.unwrap_or_default(),
                    message: message.and_then(|m| m.0),
                    extra,
                })
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for BatchStatus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = BatchStatus;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("struct BatchStatus")
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<BatchStatus, A::Error> {
                let mut status: Option<BatchState> = None;
                let mut last_modified: Option<String> = None;
                let mut message: Option<Message> = None;
                let extra = fields(m, |k, m| match k {
                    "status" => once(&mut status, "status", m),
                    "last_modified" => once(&mut last_modified, "last_modified", m),
                    "message" => once(&mut message, "message", m),
                    _ => Ok(false),
                })?;
                Ok(BatchStatus {
                    status: status.ok_or_else(|| de::Error::missing_field("status"))?,
                    last_modified: last_modified.unwrap_or_default(),
                    message: message.and_then(|m| m.0),
                    extra,
                })
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The derived forms this replaces, kept here to compare with.
    #[derive(Debug, PartialEq, Deserialize)]
    struct DerivedJob {
        status: JobState,
        #[serde(default)]
        last_successful_status: Option<JobState>,
        #[serde(default)]
        last_modified: String,
        #[serde(default)]
        retry_count: u32,
        #[serde(default, with = "super::super::message_field")]
        message: Option<String>,
        #[serde(flatten)]
        extra: Map<String, Value>,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct DerivedBatch {
        status: BatchState,
        #[serde(default)]
        last_modified: String,
        #[serde(default, with = "super::super::message_field")]
        message: Option<String>,
        #[serde(flatten)]
        extra: Map<String, Value>,
    }

    /// Every shape reads as the derived form read it: the same fields, or an error both
    /// ways (a repeated known field, a missing or unknown state, a wrong type, not an
    /// object).
    #[test]
    fn statuses_read_as_the_derived_form_read_them() {
        let inputs = [
            r#"{"status":"Pending"}"#,
            r#"{"status":"Estimating","last_successful_status":"Pending","last_modified":"2026-01-01T00:00:00Z","retry_count":2,"message":"","history":["1|a|b|h||"],"queueNode":"/q","n":{"a":[1,2]}}"#,
            r#"{"message":"kept","status":"Failed","retry_count":0,"last_successful_status":null}"#,
            r#"{"status":"Pending","x":1,"x":2}"#,
            r#"{"status":"Pending","message":null}"#,
            r#"{"status":"Pending","status":"Held"}"#,
            r#"{"status":"Pending","retry_count":-1}"#,
            r#"{"status":"Pending","retry_count":"1"}"#,
            r#"{"status":"Pending","last_modified":null}"#,
            r#"{"status":"Nonsense"}"#,
            r#"{"status":"Processing","st\u0061tus":"Held"}"#,
            r#"{"st\u0061tus":"Held","es\"caped":"\u00e9"}"#,
            r#"{}"#,
            r#"["Pending"]"#,
            r#""Pending""#,
            r#"{"status":"Completed","message":"done","message":"again"}"#,
        ];
        for s in inputs {
            // Every field, or nothing when it is refused, both ways.
            let ours = serde_json::from_str::<JobStatus>(s).ok();
            let derived = serde_json::from_str::<DerivedJob>(s)
                .ok()
                .map(|d| JobStatus {
                    status: d.status,
                    last_successful_status: d.last_successful_status,
                    last_modified: d.last_modified,
                    retry_count: d.retry_count,
                    message: d.message,
                    extra: d.extra,
                });
            assert_eq!(ours, derived, "{s}");
            let ours = serde_json::from_str::<BatchStatus>(s).ok();
            let derived = serde_json::from_str::<DerivedBatch>(s)
                .ok()
                .map(|d| BatchStatus {
                    status: d.status,
                    last_modified: d.last_modified,
                    message: d.message,
                    extra: d.extra,
                });
            assert_eq!(ours, derived, "{s}");
            // Through a value too (the API's bodies are read so).
            if let Ok(v) = serde_json::from_str::<Value>(s) {
                let ours = serde_json::from_value::<JobStatus>(v.clone()).ok();
                let derived = serde_json::from_value::<DerivedJob>(v).ok();
                assert_eq!(ours.is_some(), derived.is_some(), "{s}");
                if let (Some(o), Some(d)) = (ours, derived) {
                    assert_eq!((o.status, o.extra), (d.status, d.extra), "{s}");
                }
            }
        }
    }
}
