//! A job's or batch's history: its last transitions, kept in its status node in a compact
//! form (see [`HISTORY_FIELD`]) and read back as [`HistoryEntry`]s.

use crate::{HISTORY_FIELD, MAX_HISTORY};
use lading_core::time::Stamp;
use serde::Serialize;
use serde_json::{Map, Value};

/// Longest message a history entry keeps.
const HISTORY_MESSAGE: usize = 300;

/// One transition of a job or batch, as the API shows it: `{"at", "from", "to", "host",
/// "retry_count", "message"}` (`from` null for the first; `retry_count` and `message` only
/// when there are).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HistoryEntry {
    pub at: Stamp,
    pub from: Option<String>,
    pub to: String,
    /// The host that made it (empty where no entry named one).
    pub host: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_count: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Appends a transition to the history in `extra`, dropping the oldest past [`MAX_HISTORY`].
/// `at` is the status's time (`yyyy-MM-dd HH:mm:ss +0000`).
pub(crate) fn push_history(
    extra: &mut Map<String, Value>,
    from: Option<&str>,
    to: &str,
    at: &str,
    host: &str,
    retry_count: u32,
    message: Option<&str>,
) {
    let mut m = message.unwrap_or("");
    let mut end = m.len().min(HISTORY_MESSAGE);
    while !m.is_char_boundary(end) {
        end -= 1;
    }
    m = &m[..end];
    let clean = |t: &str| t.replace('|', "/").replace('\n', " ");
    let secs = lading_core::time::parse_ts(at).unwrap_or(0) / 1000;
    let list = extra
        .entry(HISTORY_FIELD)
        .or_insert_with(|| Value::Array(Vec::new()));
    if !list.is_array() {
        *list = Value::Array(Vec::new());
    }
    let Value::Array(a) = list else { return };
    let host = clean(host);
    let last_host = a
        .iter()
        .rev()
        .filter_map(Value::as_str)
        .find_map(|e| e.split('|').nth(3).filter(|h| !h.is_empty()));
    let same_host = last_host == Some(host.as_str());
    let entry = format!(
        "{secs}|{}|{to}|{}|{}|{}",
        from.unwrap_or(""),
        if same_host { "" } else { host.as_str() },
        if retry_count > 0 {
            retry_count.to_string()
        } else {
            String::new()
        },
        clean(m)
    );
    a.push(Value::String(entry));
    if a.len() > MAX_HISTORY {
        // The oldest kept must name its host: the first dropped one named it, or an earlier.
        let drop = a.len() - MAX_HISTORY;
        let host = a[..=drop]
            .iter()
            .rev()
            .filter_map(Value::as_str)
            .find_map(|e| e.split('|').nth(3).filter(|h| !h.is_empty()))
            .unwrap_or("")
            .to_string();
        a.drain(..drop);
        if let Some(Value::String(first)) = a.first_mut() {
            let host = host.as_str();
            let mut f: Vec<&str> = first.splitn(6, '|').collect();
            if f.len() == 6 && f[3].is_empty() {
                f[3] = host;
                *first = f.join("|");
            }
        }
    }
}

/// A stored history, read one entry at a time: a follower that has seen all but the last
/// entry or two decodes only those (decoding all 32 on every change was a tenth of the
/// simulator's follower).
pub(crate) struct RawHistory<'a> {
    entries: Vec<&'a str>,
    /// Each entry's host: its own, or (left empty) the previous one's.
    hosts: Vec<&'a str>,
}

impl<'a> RawHistory<'a> {
    /// The history in `extra`, if it has one.
    pub(crate) fn of(extra: &'a Map<String, Value>) -> Option<RawHistory<'a>> {
        let list = extra.get(HISTORY_FIELD)?.as_array()?;
        Some(RawHistory::from_entries(
            list.iter().filter_map(Value::as_str).collect(),
        ))
    }

    /// A history of these entries, oldest first.
    pub(crate) fn from_entries(entries: Vec<&'a str>) -> RawHistory<'a> {
        let mut host = "";
        let hosts = entries
            .iter()
            .map(|e| {
                let h = pipe_fields(e)[3];
                if !h.is_empty() {
                    host = h;
                }
                host
            })
            .collect();
        RawHistory { entries, hosts }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entry `i`'s time in epoch milliseconds (0 when unreadable), as `at` of
    /// [`RawHistory::entry`] would parse back.
    pub(crate) fn ms(&self, i: usize) -> u64 {
        let e = self.entries[i];
        let at = &e[..e.bytes().position(|b| b == b'|').unwrap_or(e.len())];
        match at.parse::<u64>() {
            Ok(secs) => secs * 1000,
            Err(_) => lading_core::time::parse_ts(at).unwrap_or(0),
        }
    }

    /// Entry `i`, decoded.
    pub(crate) fn entry(&self, i: usize) -> HistoryEntry {
        let [at, from, to, _, retry, message] = pipe_fields(self.entries[i]);
        HistoryEntry {
            at: match at.parse::<u64>() {
                Ok(secs) => Stamp::Secs(secs),
                // Written before the compact form: the time as it was.
                Err(_) => Stamp::Text(at.to_string()),
            },
            from: (!from.is_empty()).then(|| from.to_string()),
            to: to.to_string(),
            host: self.hosts[i].to_string(),
            retry_count: retry.parse::<u32>().ok().filter(|n| *n > 0),
            message: (!message.is_empty()).then(|| message.to_string()),
        }
    }
}

/// An entry's six `|`-separated fields as `splitn(6, '|')` gives them ("" for those it has
/// not), found in one pass over the bytes that stops at the fifth bar: the message after it is
/// taken whole, not read (through `str::split` the fields were 1% of a simulator run; by
/// `str::find`, 2.5%).
fn pipe_fields(e: &str) -> [&str; 6] {
    let mut out = [""; 6];
    let (mut start, mut k) = (0, 0);
    for (i, b) in e.bytes().enumerate() {
        if b == b'|' {
            out[k] = &e[start..i];
            k += 1;
            start = i + 1;
            if k == 5 {
                break;
            }
        }
    }
    out[k] = &e[start..];
    out
}

/// Replaces the stored history in `extra` by its objects (as the API shows it).
pub fn expand_history(extra: &mut Map<String, Value>) {
    if extra.contains_key(HISTORY_FIELD) {
        let h = history(extra)
            .iter()
            .map(|e| serde_json::to_value(e).unwrap_or_default())
            .collect();
        extra.insert(HISTORY_FIELD.into(), Value::Array(h));
    }
}

/// The history recorded in a status's extra fields (empty when there is none).
pub fn history(extra: &Map<String, Value>) -> Vec<HistoryEntry> {
    match RawHistory::of(extra) {
        Some(h) => (0..h.len()).map(|i| h.entry(i)).collect(),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::pipe_fields;

    /// The fields are those `splitn(6, '|')` gives, whatever the number of bars.
    #[test]
    fn pipe_fields_split_as_splitn_would() {
        for e in [
            "",
            "1767225600",
            "1767225600|Pending|Estimating|host-1|2|a message",
            "1767225600||Estimating|||",
            "1767225600|a|b|c|d|e|f|g",
            "|||||",
            "||||||",
            "é|ü|ß",
        ] {
            let mut want = [""; 6];
            for (k, f) in e.splitn(6, '|').enumerate() {
                want[k] = f;
            }
            assert_eq!(pipe_fields(e), want, "{e:?}");
        }
    }
}
