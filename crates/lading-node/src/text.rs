//! The API's records as a person reads them (`lading status`, `jobs list`, `jobs show`):
//! aligned `key: value` lines for one record, a table for a list, the queue summary as
//! counts per state, times in RFC 3339.

use serde_json::Value;

/// Transitions (a record's `status.history`): one line each, oldest first.
pub fn history(list: &Value) -> String {
    let list = list.as_array().map(Vec::as_slice).unwrap_or_default();
    if list.is_empty() {
        return "no transitions recorded\n".into();
    }
    let mut out = String::new();
    for h in list {
        let s = |k: &str| h[k].as_str().unwrap_or("").to_string();
        let from = if h["from"].is_null() {
            "-".into()
        } else {
            s("from")
        };
        out.push_str(&format!("{}  {from} → {}", s("at"), s("to")));
        // The host is hidden from submitters: then the line names none.
        if !s("host").is_empty() {
            out.push_str(&format!("  on {}", s("host")));
        }
        if let Some(n) = h["retry_count"].as_u64() {
            out.push_str(&format!("  (retry {n})"));
        }
        if let Some(m) = h["message"].as_str() {
            out.push_str(&format!("  {m}"));
        }
        out.push('\n');
    }
    out
}

/// A record as `key: value` lines (nested keys joined by `.`), a list of records as a table,
/// the queue summary (`lading status` without an id) as counts per state.
pub fn human(v: &Value) -> String {
    if let Some(rows) = v.as_array() {
        return table(rows);
    }
    if v.get("jobs").is_some_and(Value::is_object) && v.get("batches").is_some_and(Value::is_object)
    {
        return summary(v);
    }
    let mut lines = Vec::new();
    flatten("", v, &mut lines);
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    lines
        .iter()
        .map(|(k, v)| format!("{k:<width$}  {v}\n"))
        .collect()
}

/// Keys shown first, in this order; the others follow by name.
const FIRST: &[&str] = &[
    "id", "type", "state", "status", "bid", "message", "priority",
];

/// An object's keys, [`FIRST`] ones first.
fn ordered(m: &serde_json::Map<String, Value>) -> Vec<&String> {
    let rank = |k: &str| FIRST.iter().position(|f| *f == k).unwrap_or(FIRST.len());
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort_by_key(|k| rank(k));
    keys
}

fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for k in ordered(m) {
                let x = &m[k.as_str()];
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, x, out);
            }
        }
        // Lists of plain values on one line; lists of records one line each.
        Value::Array(a) if a.is_empty() => out.push((prefix.to_string(), "-".into())),
        Value::Array(a) if a.iter().all(|x| !x.is_object() && !x.is_array()) => {
            out.push((
                prefix.to_string(),
                a.iter().map(scalar).collect::<Vec<_>>().join(", "),
            ));
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                flatten(&format!("{prefix}.{i}"), x, out);
            }
        }
        x => out.push((prefix.to_string(), shown(prefix, x))),
    }
}

/// A value as text; an epoch-milliseconds field (`…_ms`) as an RFC 3339 time.
fn shown(key: &str, v: &Value) -> String {
    match v.as_u64() {
        Some(ms) if key.ends_with("_ms") && ms > 1_000_000_000_000 => {
            lading_core::time::format_rfc3339(ms)
        }
        _ => scalar(v),
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        Value::Object(m) if m.is_empty() => "-".into(),
        x => x.to_string(),
    }
}

/// Rows of records under the columns of the first one (nested values as compact JSON).
fn table(rows: &[Value]) -> String {
    let Some(first) = rows.first().and_then(Value::as_object) else {
        return if rows.is_empty() {
            "(none)\n".into()
        } else {
            rows.iter().map(|r| format!("{}\n", scalar(r))).collect()
        };
    };
    let cols = ordered(first);
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| cols.iter().map(|c| shown(c, &r[c.as_str()])).collect())
        .collect();
    let widths: Vec<usize> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cells
                .iter()
                .map(|r| r[i].len())
                .chain([c.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |vals: Vec<String>| {
        let cells: Vec<String> = vals
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect();
        format!("{}\n", cells.join("  ").trim_end())
    };
    let mut s = line(cols.iter().map(|c| c.to_uppercase()).collect());
    for r in cells {
        s.push_str(&line(r));
    }
    s
}

/// Counts per state of jobs and batches, in the pipeline's order, then what else is listed.
fn summary(v: &Value) -> String {
    let mut s = String::new();
    for (what, order) in [
        (
            "jobs",
            lading_core::JobState::ALL
                .iter()
                .map(|x| x.name())
                .collect::<Vec<_>>(),
        ),
        (
            "batches",
            lading_core::BatchState::ALL
                .iter()
                .map(|x| x.name())
                .collect(),
        ),
    ] {
        let counts: Vec<String> = order
            .iter()
            .map(|st| format!("{st} {}", v[what][*st].as_u64().unwrap_or(0)))
            .collect();
        s.push_str(&format!("{what:<14} {}\n", counts.join("  ")));
    }
    // Outside services down: one line each, with the work waiting on it.
    for d in v["dependencies_down"].as_array().into_iter().flatten() {
        let since = d["down_since_ms"]
            .as_u64()
            .map(lading_core::time::format_rfc3339)
            .unwrap_or_default();
        let address = d["address"].as_str().filter(|a| !a.is_empty());
        s.push_str(&format!(
            "{:<14} {}{} since {since}: {}; {} jobs waiting\n",
            "down",
            d["label"].as_str().unwrap_or("?"),
            address.map(|a| format!(" ({a})")).unwrap_or_default(),
            d["cause"].as_str().unwrap_or(""),
            d["waiting"].as_u64().unwrap_or(0)
        ));
    }
    let mut rest = v.clone();
    if let Some(m) = rest.as_object_mut() {
        m.remove("jobs");
        m.remove("batches");
        m.remove("dependencies_down");
    }
    let mut lines = Vec::new();
    flatten("", &rest, &mut lines);
    for (k, x) in lines {
        s.push_str(&format!("{k:<14} {x}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn records_tables_and_times_read_as_text() {
        let job = json!({"id": "a", "state": "pending", "data": {"x": 1},
            "scheduled_ms": 1_795_623_699_188u64, "list": ["p", "q"], "message": ""});
        let text = human(&job);
        assert!(text.contains("scheduled_ms  2026-11-25T"), "{text}");
        assert!(text.contains("data.x        1"), "{text}");
        assert!(text.contains("list          p, q"), "{text}");
        assert!(text.contains("message       -"), "{text}");
        let t = human(&json!([job, {"id": "bb", "state": "running"}]));
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("ID  STATE"), "{t}");
        assert!(text.starts_with("id "), "{text}");
        assert!(lines[2].starts_with("bb  running"), "{t}");
        assert_eq!(human(&json!([])), "(none)\n");
        let s = human(&json!({"jobs": {"Pending": 2}, "batches": {"Completed": 1},
            "paused_queues": [], "outbox": {"dead": 0}}));
        assert!(s.starts_with("jobs           Pending 2  Held 0"), "{s}");
        assert!(s.contains("Completed 1"), "{s}");
        assert!(s.contains("outbox.dead    0"), "{s}");
    }
}
