//! URLs fit for output: the one place where a URL the operator gave (a
//! store, a forwarding destination, a NATS server) loses its secrets before
//! it is printed or logged (banners, errors, the status page).
//!
//! Secrets are a userinfo's password (`scheme://user:PASSWORD@host`,
//! RFC 3986 §3.2.1), a bare userinfo of a NATS URL (`nats://TOKEN@host`:
//! NATS reads it as a token), and the values of query parameters whose name
//! says secret (`?password=...`, `?sslpassword=...`, `?token=...`,
//! `?access_token=...`, `?secret=...`, `?api_key=...`, ...). Each is
//! written [`HIDDEN`].

/// What a secret is replaced with.
pub(crate) const HIDDEN: &str = "***";

/// `url` with its secrets replaced by [`HIDDEN`]; text that is not a URL
/// (`sqlite:rx.db`, `memory`) comes back as it is. (Only the `serve`
/// build prints a URL whole: its banners, `relay` and `sign --post`; the
/// default build hides secrets inside error texts alone, [`in_text`].)
#[cfg_attr(not(feature = "serve"), allow(dead_code))]
pub(crate) fn url(url: &str) -> String {
    let mut out = url.to_owned();
    // From the last: the earlier ranges stay where they are.
    for range in secrets(url).into_iter().rev() {
        out.replace_range(range, HIDDEN);
    }
    out
}

/// `text` (an error message, say) with every secret of `url` in it
/// replaced by [`HIDDEN`]: for messages a library wrote about `url`.
pub(crate) fn in_text(text: &str, url: &str) -> String {
    let mut out = text.to_owned();
    for range in secrets(url) {
        out = out.replace(&url[range], HIDDEN);
    }
    out
}

/// Where the secrets of `url` are, in the order they appear (none
/// empty).
fn secrets(url: &str) -> Vec<std::ops::Range<usize>> {
    let mut found = Vec::new();
    let Some((scheme, _)) = url.split_once("://") else {
        return found;
    };
    let start = scheme.len() + 3;
    let rest = &url[start..];
    // The authority ends at the first `/`, `?` or `#` (RFC 3986 §3.2);
    // its userinfo at its last `@`.
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if let Some(at) = rest[..authority_end].rfind('@') {
        match rest[..at].find(':') {
            Some(colon) => found.push(start + colon + 1..start + at),
            None if is_nats(scheme) => found.push(start..start + at),
            None => {}
        }
    }
    let after = start + authority_end;
    if let Some(q) = url[after..].find('?') {
        let mut at = after + q + 1;
        let end = url[at..].find('#').map_or(url.len(), |h| at + h);
        for pair in url[at..end].split('&') {
            if let Some((name, value)) = pair.split_once('=') {
                if secret_name(name) {
                    let value_start = at + name.len() + 1;
                    found.push(value_start..value_start + value.len());
                }
            }
            at += pair.len() + 1;
        }
    }
    found.retain(|r| !r.is_empty());
    found
}

/// Whether `scheme` is one of a NATS server's (`nats`, `tls`, `ws`, `wss`).
fn is_nats(scheme: &str) -> bool {
    ["nats", "tls", "ws", "wss"]
        .iter()
        .any(|s| s.eq_ignore_ascii_case(scheme))
}

/// Whether a query parameter's name says its value is a secret.
fn secret_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "password", "passwd", "secret", "token", "api_key", "apikey", "auth",
    ]
    .iter()
    .any(|word| name.contains(word))
        || matches!(name.as_str(), "pass" | "pwd" | "key" | "sig" | "signature")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_tokens_and_secret_parameters_are_hidden() {
        for (given, shown) in [
            (
                "postgres://app:s3cr3t@db.internal:5432/rx",
                "postgres://app:***@db.internal:5432/rx",
            ),
            (
                "nats://user:PASSWORD@127.0.0.1:4222",
                "nats://user:***@127.0.0.1:4222",
            ),
            ("nats://T0KEN@127.0.0.1:4222", "nats://***@127.0.0.1:4222"),
            (
                "http://user:PASSWORD@app.internal/hook",
                "http://user:***@app.internal/hook",
            ),
            (
                "postgres://app@db/rx?sslmode=require&password=pw&sslpassword=kp",
                "postgres://app@db/rx?sslmode=require&password=***&sslpassword=***",
            ),
            (
                "http://app.internal/hook?access_token=abc&x=1",
                "http://app.internal/hook?access_token=***&x=1",
            ),
            // An `@` in the path is not a userinfo.
            (
                "http://app.internal/hooks/a@b?api_key=k#top",
                "http://app.internal/hooks/a@b?api_key=***#top",
            ),
            // The password is hidden, not the same text elsewhere.
            ("postgres://pw:pw@db/rx", "postgres://pw:***@db/rx"),
            // Nothing secret: as given.
            ("postgres://app@db/rx", "postgres://app@db/rx"),
            ("http://127.0.0.1:9000/hook", "http://127.0.0.1:9000/hook"),
            ("sqlite:rx.db", "sqlite:rx.db"),
            ("memory", "memory"),
        ] {
            assert_eq!(url(given), shown, "{given}");
        }
    }

    #[test]
    fn a_message_about_a_url_loses_its_secrets() {
        assert_eq!(
            in_text(
                "cannot connect to nats://u:hunter2@h:4222 (auth hunter2 refused)",
                "nats://u:hunter2@h:4222"
            ),
            "cannot connect to nats://u:***@h:4222 (auth *** refused)"
        );
    }
}
