//! JSON read from stored bytes.

/// `T` from the JSON in `bytes`, as `serde_json::from_slice` reads it, with the bytes checked
/// as UTF-8 once: `from_slice` checks each string it reads on its own, and statuses are
/// mostly short strings (`lading-sim` seeds 1–4: half a million checks, a fifth of all JSON
/// decoding). Bytes that are not UTF-8 go to `from_slice`, for its error.
pub fn from_bytes<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> serde_json::Result<T> {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::from_bytes;

    /// What `from_slice` reads, and its errors, for text and for bytes that are not UTF-8.
    #[test]
    fn reads_as_from_slice_does() {
        let ok = br#"{"status":"Pending","history":["a|b","\u00e9"]}"#;
        let v: serde_json::Value = from_bytes(ok).unwrap();
        assert_eq!(v, serde_json::from_slice::<serde_json::Value>(ok).unwrap());
        for bad in [&b"{\"s\":\"\xff\"}"[..], b"{\"s\":", b"[1,]"] {
            let ours = from_bytes::<serde_json::Value>(bad).unwrap_err();
            let theirs = serde_json::from_slice::<serde_json::Value>(bad).unwrap_err();
            assert_eq!(ours.to_string(), theirs.to_string());
        }
    }
}
