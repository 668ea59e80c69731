//! A stored record as Lading reads it: its typed view, and the JSON exactly as it was stored.
//!
//! A job's configuration and a batch's submission are written by Lading, by Merritt's ingest
//! service and by operators' tools. Lading's code reads them through their types
//! ([`crate::layout::JobConfiguration`], [`crate::layout::BatchSubmission`]); a record
//! another writer left in another shape (a number where a URL belongs) is not a reason to
//! hide the job: it is shown exactly as stored, and a stage that needs its fields fails the
//! job naming the node ([`Recorded::typed`]'s reason). What is shown and written back is the
//! stored JSON, never a re-encoding of the typed view, so nothing an older or other writer
//! put there is reordered or lost.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// A record of type `T` as stored (see the module's docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded<T> {
    raw: Value,
    typed: Result<T, String>,
}

impl<T: DeserializeOwned + Default> Recorded<T> {
    /// The record stored at `path` as `raw` (`null`: none stored, `T`'s default).
    pub fn of(path: &str, raw: Value) -> Self {
        let typed = crate::layout::read_record(path, &raw);
        Recorded { raw, typed }
    }

    /// Changes the stored JSON (a depositor's view without server paths) and reads it again.
    pub fn edit(&mut self, f: impl FnOnce(&mut Value)) {
        f(&mut self.raw);
        if let Ok(t) = crate::layout::read_record("", &self.raw) {
            self.typed = Ok(t);
        }
    }
}

impl<T: Serialize> Recorded<T> {
    /// A record made by Lading from its type.
    pub fn new(t: T) -> Self {
        let raw = serde_json::to_value(&t).unwrap_or(Value::Null);
        Recorded { raw, typed: Ok(t) }
    }
}

impl<T> Recorded<T> {
    /// The typed view, or why the stored record is not of `T`'s shape (naming its node).
    pub fn typed(&self) -> Result<&T, &str> {
        self.typed.as_ref().map_err(String::as_str)
    }

    /// The JSON as stored.
    pub fn raw(&self) -> &Value {
        &self.raw
    }

    /// A text field of the stored JSON by its key, whatever the record's shape: for searches
    /// over what a depositor wrote and for fields only another writer names.
    pub fn text(&self, key: &str) -> Option<&str> {
        self.raw.get(key).and_then(Value::as_str)
    }
}

impl<T: Default> Default for Recorded<T> {
    fn default() -> Self {
        Recorded {
            raw: Value::Null,
            typed: Ok(T::default()),
        }
    }
}

impl<T> Serialize for Recorded<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

impl<'de, T: DeserializeOwned + Default> Deserialize<'de> for Recorded<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Recorded::of("the record", Value::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::JobConfiguration;
    use serde_json::json;

    #[test]
    fn a_record_of_another_shape_is_kept_as_stored_and_named() {
        let raw = json!({"payload_url": 5, "zeta": 1, "alpha": 2});
        let r: Recorded<JobConfiguration> = Recorded::of("/jobs/jid1/configuration", raw.clone());
        let why = r.typed().unwrap_err();
        assert!(why.contains("/jobs/jid1/configuration is corrupt"), "{why}");
        assert_eq!(serde_json::to_value(&r).unwrap(), raw, "shown as stored");
        let ok: Recorded<JobConfiguration> = Recorded::of(
            "/p",
            json!({"profile": "merritt_demo", "filename": "f.zip"}),
        );
        assert_eq!(ok.typed().unwrap().profile(), Some("merritt_demo"));
        assert_eq!(ok.text("filename"), Some("f.zip"));
        let none: Recorded<JobConfiguration> = Recorded::of("/p", Value::Null);
        assert_eq!(none.typed().unwrap(), &JobConfiguration::default());
        let mut e = ok.clone();
        e.edit(|v| v["filename"] = json!("g.zip"));
        assert_eq!(
            e.typed().unwrap().merritt_filename(),
            Some("g.zip"),
            "read again"
        );
    }
}
