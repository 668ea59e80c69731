//! Unit tests of a job's history as the engine keeps it.

use super::*;

/// Past the cap, the oldest kept entry names its host; each entry decodes alike whole or
/// one at a time, with its time, and its host carried from the last that named one.
#[test]
fn a_capped_history_keeps_each_entrys_host_and_time() {
    let mut extra = Map::new();
    let n = MAX_HISTORY + 7;
    let host = |i: usize| if i % 5 < 3 { "a" } else { "b" };
    for i in 0..n {
        let at = lading_core::time::format_ts(1_767_225_600_000 + i as u64 * 1000);
        push_history(&mut extra, Some("x"), "y", &at, host(i), 0, None);
    }
    let all = history(&extra);
    assert_eq!(all.len(), MAX_HISTORY);
    let raw = RawHistory::of(&extra).unwrap();
    for (k, e) in all.iter().enumerate() {
        let i = n - MAX_HISTORY + k;
        assert_eq!(e.host, host(i), "entry {k}");
        assert_eq!(*e, raw.entry(k));
        assert_eq!(raw.ms(k), 1_767_225_600_000 + i as u64 * 1000);
    }
}

/// Typed, an entry shows as it did: `at` as text, `from` null for the first, `retry_count`
/// and `message` only when there are; a time written as text before the compact form reads
/// as it was.
#[test]
fn an_entry_shows_as_the_api_always_showed_it() {
    let mut extra = Map::new();
    let at = lading_core::time::format_ts(1_767_225_600_000);
    push_history(&mut extra, None, "Pending", &at, "h:1", 0, None);
    push_history(
        &mut extra,
        Some("Pending"),
        "Failed",
        &at,
        "h:1",
        2,
        Some("no|way"),
    );
    extra
        .get_mut(HISTORY_FIELD)
        .and_then(Value::as_array_mut)
        .unwrap()
        .push(Value::from(
            "2025-12-31 23:59:59 +0000|Failed|Pending|h:2||",
        ));
    let shown: Vec<Value> = history(&extra)
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    assert_eq!(
        shown,
        [
            serde_json::json!({"at": "2026-01-01 00:00:00 +0000", "from": null, "to": "Pending", "host": "h:1"}),
            serde_json::json!({"at": "2026-01-01 00:00:00 +0000", "from": "Pending", "to": "Failed", "host": "h:1", "retry_count": 2, "message": "no/way"}),
            serde_json::json!({"at": "2025-12-31 23:59:59 +0000", "from": "Failed", "to": "Pending", "host": "h:2"}),
        ]
    );
    assert_eq!(history(&extra)[2].at.ms(), 1_767_225_599_000);
}
