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
        assert_eq!(e["host"], host(i), "entry {k}");
        assert_eq!(*e, raw.entry(k));
        assert_eq!(raw.ms(k), 1_767_225_600_000 + i as u64 * 1000);
    }
}
