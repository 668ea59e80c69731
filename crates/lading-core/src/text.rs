//! Text that leaves the process (status messages, reports, mails, logs) without secrets.

use std::borrow::Cow;

/// `text` with the password of every URL in it replaced by `***`: `https://ann:s3cret@host/x`
/// becomes `https://ann:***@host/x`, and a user name alone (a token, as in
/// `https://TOKEN@host/`) becomes `***`. A fetch error quotes the URL it failed on, and that
/// text is recorded in a job's status, mailed and logged; an operator's allowed prefix may
/// carry credentials (`[payload] allow`).
pub fn without_passwords(text: &str) -> Cow<'_, str> {
    if !text.contains("://") || !text.contains('@') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        // The authority ends where the path, query or fragment starts, or the URL does.
        let end = tail
            .find(|c: char| {
                matches!(
                    c,
                    '/' | '?' | '#' | '"' | '\'' | '<' | '>' | '(' | ')' | ','
                ) || c.is_whitespace()
            })
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(a) => {
                match authority[..a].split_once(':') {
                    Some((user, _)) => {
                        out.push_str(user);
                        out.push_str(":***");
                    }
                    None => out.push_str("***"),
                }
                out.push_str(&authority[a..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::without_passwords as w;

    #[test]
    fn passwords_and_tokens_in_urls_are_hidden_and_the_rest_kept() {
        assert_eq!(
            w("cannot fetch https://ann:s3cret@host:8443/a@b/c?x=1: reset"),
            "cannot fetch https://ann:***@host:8443/a@b/c?x=1: reset"
        );
        assert_eq!(w("https://TOKEN@github.com/x"), "https://***@github.com/x");
        assert_eq!(
            w("\"http://a:p@x\" and http://b:q@y answered 503"),
            "\"http://a:***@x\" and http://b:***@y answered 503"
        );
        // A password holding an '@' or a ':' is hidden whole.
        assert_eq!(w("http://u:p@ss:w@h/"), "http://u:***@h/");
        for same in [
            "no URL here, mail ann@example.org",
            "http://host/path@v2 answered 404",
            "file:///srv/a@b/c is not a regular file",
            "",
        ] {
            assert_eq!(w(same), same);
        }
    }
}
