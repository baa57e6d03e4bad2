//! `sign`: a body signed the way a Standard Webhooks sender signs it, with
//! the MAC of the verifier `serve` checks (`serve::webhook`), printed as
//! the three headers or posted.

use super::serve::webhook;
use crate::error::InputError;
use anyhow::Context as _;
use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

/// The exit codes of `sign` (its `--help` shows them): it opens no store,
/// so it has none of the store codes the other commands share.
pub(crate) const EXIT_STATUS: &str = "\
Exit status:
  0  done: the headers printed, or the body posted and answered 2xx
  1  --post: the answer's status is not 2xx (printed on stderr as `HTTP STATUS`
     after the answer's body), or no connection or answer
  2  bad arguments or input: a body file that cannot be read, no secret or one
     that is not `whsec_<base64>`, a --post URL that is not http://HOST[:PORT]/...";

/// The arguments of `sign`.
#[derive(clap::Args)]
pub(crate) struct SignArgs {
    /// The body: a file (`-`: standard input). Signed as its exact bytes.
    #[arg(
        value_name = "FILE",
        required_unless_present = "data",
        conflicts_with = "data"
    )]
    body: Option<PathBuf>,
    /// The body as text on the command line instead of a file.
    #[arg(long, value_name = "JSON")]
    data: Option<String>,
    /// The signing secret, `whsec_<base64>` (default: the first secret in
    /// SNAPSHOT_RECEIVER_WEBHOOK_SECRET, the variable `serve` reads).
    #[arg(long, value_name = "SECRET")]
    secret: Option<String>,
    /// The `webhook-id` (default: `msg_` and the first 16 hex digits of the
    /// body's SHA-256, so a re-sent body keeps its id, as a retry does).
    #[arg(long, value_name = "ID")]
    id: Option<String>,
    /// The `webhook-timestamp`, Unix seconds (default: now).
    #[arg(long, value_name = "SECONDS")]
    timestamp: Option<u64>,
    /// POST the signed body to this `http://HOST:PORT/PATH` and print the
    /// answer's body (exit 1 when its status is not 2xx, after printing
    /// `HTTP STATUS` on stderr). Without it the three headers are printed,
    /// one `name: value` a line (for `curl -H @FILE`).
    #[arg(long, value_name = "URL")]
    post: Option<String>,
}

/// Runs `sign`.
pub(crate) fn run(args: SignArgs) -> anyhow::Result<()> {
    let body = match (&args.data, &args.body) {
        (Some(text), _) => text.clone().into_bytes(),
        (None, Some(path)) if path.as_os_str() == "-" => {
            let mut bytes = Vec::new();
            std::io::stdin()
                .read_to_end(&mut bytes)
                .context("cannot read the body from standard input")?;
            bytes
        }
        (None, Some(path)) => std::fs::read(path)
            .map_err(|e| InputError::new(format!("{}: cannot read: {e}", path.display())))?,
        (None, None) => return Err(InputError::new("give a body: FILE, `-` or --data").into()),
    };
    let secret = match args.secret {
        Some(secret) => secret,
        None => super::serve::secrets(Vec::new())
            .into_iter()
            .next()
            .ok_or_else(|| {
                InputError::new(format!(
                    "no secret: give --secret whsec_... or set {}",
                    super::serve::SECRETS_ENV
                ))
            })?,
    };
    let timestamp = match args.timestamp {
        Some(seconds) => seconds,
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .context("the system clock is before 1970")?
            .as_secs(),
    }
    .to_string();
    let id = args.id.unwrap_or_else(|| default_id(&body));
    let signature = webhook::standard_signature(&secret, &id, &timestamp, &body)
        .map_err(|e| InputError::new(format!("--secret: {e}")))?;
    let headers = [
        (webhook::ID_HEADER, id),
        (webhook::TIMESTAMP_HEADER, timestamp),
        (webhook::SIGNATURE_HEADER, signature),
    ];
    let Some(url) = args.post else {
        let mut out = std::io::stdout().lock();
        for (name, value) in &headers {
            writeln!(out, "{name}: {value}")?;
        }
        return Ok(());
    };
    let (status, answer) = super::runtime()?.block_on(post(&url, &headers, body))?;
    let mut out = std::io::stdout().lock();
    out.write_all(&answer)?;
    if !answer.ends_with(b"\n") {
        writeln!(out)?;
    }
    out.flush()?;
    if !status.is_success() {
        return Err(anyhow::anyhow!("HTTP {status}"));
    }
    Ok(())
}

/// `msg_` and the first 16 hex digits of the body's SHA-256.
fn default_id(body: &[u8]) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(body);
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("msg_{hex}")
}

/// POSTs `body` with `headers` (and `Content-Type: application/json`) to
/// `url` over plain HTTP/1.1: the answer's status and body.
///
/// # Errors
/// An [`InputError`] for a URL that is not `http://HOST[:PORT]/...`; the
/// connection's or the exchange's error otherwise.
async fn post(
    url: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> anyhow::Result<(axum::http::StatusCode, bytes::Bytes)> {
    use http_body_util::BodyExt as _;
    // Messages name the URL with its secrets hidden.
    let shown = crate::redact::url(url);
    let bad = |why: &str| InputError::new(format!("--post {shown:?}: {why}"));
    let uri: axum::http::Uri = url.parse().map_err(|e| bad(&format!("not a URL ({e})")))?;
    if uri.scheme_str() != Some("http") {
        return Err(bad(
            "sign speaks plain http:// only (for https, print the headers and use curl -H @FILE)",
        )
        .into());
    }
    let authority = uri.authority().ok_or_else(|| bad("no host"))?.clone();
    let address = format!(
        "{}:{}",
        authority.host(),
        authority.port_u16().unwrap_or(80)
    );
    let stream = tokio::net::TcpStream::connect(&address)
        .await
        .with_context(|| format!("--post {shown}: cannot connect to {address}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .with_context(|| format!("--post {shown}: HTTP handshake"))?;
    let connection = tokio::spawn(connection);
    let mut request = axum::http::Request::post(uri)
        .header(axum::http::header::HOST, authority.as_str())
        .header(axum::http::header::CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .map_err(|e| bad(&e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .with_context(|| format!("--post {shown}: no answer"))?;
    let status = response.status();
    let answer = response
        .into_body()
        .collect()
        .await
        .with_context(|| format!("--post {shown}: reading the answer"))?
        .to_bytes();
    drop(sender);
    connection.abort();
    Ok((status, answer))
}
