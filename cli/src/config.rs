//! `serve --config FILE`, `serve`'s environment variables and `serve
//! --print-config`.
//!
//! Every flag of `serve` is also read from the environment variable
//! `SNAPSHOT_RECEIVER_<FLAG>` (the long name in upper snake case:
//! `--memory-budget` is `SNAPSHOT_RECEIVER_MEMORY_BUDGET`) and from a TOML
//! file (TOML 1.0, <https://toml.io/en/v1.0.0>) whose keys are the long
//! names (`memory-budget = "64MiB"`, a repeated flag as an array). The
//! precedence is flag > environment > file > default: the file's values
//! become the arguments' defaults before the command line is parsed, and
//! clap's own order (command line, `env`, default) does the rest.
//!
//! `--webhook-secret` is the exception: its variable,
//! `SNAPSHOT_RECEIVER_WEBHOOK_SECRET`, holds whitespace-separated secrets
//! and is read by `serve` itself ([`crate::cmd::serve::secrets`]) when no
//! secret is given; a file's secrets count only when that variable is unset
//! or blank, so the order stays the same.
//!
//! A file's value is checked by the flag's own value parser; an unknown key
//! or a wrong value is refused with the file, line, column and key. The
//! file's flags are then checked together (conflicts, a flag's companion),
//! as clap checks a command line's ([`together`]): clap does not check
//! defaults so.
//!
//! `serve -h` shows one line per flag ([`SUMMARIES`]); `--help` the whole
//! texts.

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The prefix of every `serve` environment variable.
pub(crate) const ENV_PREFIX: &str = "SNAPSHOT_RECEIVER_";

/// The subcommand this module configures.
const SERVE: &str = "serve";

/// The id (and long name) of `--config`.
const CONFIG: &str = "config";

/// The id (and long name) of `--print-config`.
const PRINT_CONFIG: &str = "print-config";

/// The long name of the flag whose variable `serve` reads itself.
const WEBHOOK_SECRET: &str = "webhook-secret";

/// Flags whose values are secrets: `--print-config` shows each value as
/// [`REDACTED`].
const SECRET_FLAGS: [&str; 3] = [WEBHOOK_SECRET, "operator-token", "forward-secret"];

/// Flags whose values are URLs or store locations that may hold a password
/// (`postgres://user:PASSWORD@host/db`, RFC 3986 §3.2.1): `--print-config`
/// shows the password as [`REDACTED`].
const URL_FLAGS: [&str; 4] = ["store", "forward", "forward-nats", "authority"];

/// What `--print-config` shows instead of a secret.
pub(crate) const REDACTED: &str = "<redacted>";

/// What [`parse`] found on the command line.
pub(crate) enum Parsed {
    /// The arguments to run with (a file's values merged in).
    Run(ArgMatches),
    /// `serve --print-config`: the configuration was printed; exit 0.
    Printed,
}

/// The environment variable of the flag with long name `long`:
/// `SNAPSHOT_RECEIVER_` and the name in upper snake case.
pub(crate) fn env_name(long: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        long.to_ascii_uppercase().replace('-', "_")
    )
}

/// Parses `argv` with `command` (the tool's whole parser): `serve`'s flags
/// read from their environment variables and `--config FILE`, and `serve
/// --print-config` answered (printed on stdout).
///
/// # Errors
/// clap's error for bad arguments; for a config file that cannot be read,
/// is not TOML, has an unknown key or a value its flag refuses, an error of
/// kind `InvalidValue` (exit code 2) naming the file, line, column and key.
pub(crate) fn parse(command: Command, argv: Vec<OsString>) -> Result<Parsed, clap::Error> {
    let command = prepare(command);
    let first = command.clone().try_get_matches_from(argv.clone())?;
    let Some((SERVE, serve)) = first.subcommand() else {
        return Ok(Parsed::Run(first));
    };
    let Some(path) = serve.get_one::<PathBuf>(CONFIG).cloned() else {
        return finish(&command, first, &[]);
    };
    let Some(serve_command) = command.find_subcommand(SERVE) else {
        return Ok(Parsed::Run(first));
    };
    let values = read_file(serve_command, &path).map_err(|message| {
        clap::Error::raw(clap::error::ErrorKind::InvalidValue, format!("{message}\n"))
    })?;
    let from_file: Vec<String> = values.iter().map(|(long, _)| long.clone()).collect();
    let command = command.mut_subcommand(SERVE, |serve| {
        // `mut_args`, not `mut_arg`: it keeps the flags in their order.
        serve.mut_args(|arg| {
            let Some(long) = arg.get_long() else {
                return arg;
            };
            // SNAPSHOT_RECEIVER_WEBHOOK_SECRET is read by serve itself,
            // after the arguments: set, it outranks the file.
            if long == WEBHOOK_SECRET && webhook_secret_env().is_some() {
                return arg;
            }
            match values.iter().find(|(l, _)| l == long) {
                Some((_, given)) => arg.default_values(given.clone()),
                None => arg,
            }
        })
    });
    let matches = command.clone().try_get_matches_from(argv)?;
    finish(&command, matches, &from_file)
}

/// `matches` to run with, or, with `serve --print-config`, the
/// configuration printed ([`Parsed::Printed`]).
fn finish(
    command: &Command,
    matches: ArgMatches,
    from_file: &[String],
) -> Result<Parsed, clap::Error> {
    use std::io::Write as _;
    let (Some((SERVE, serve)), Some(serve_command)) =
        (matches.subcommand(), command.find_subcommand(SERVE))
    else {
        return Ok(Parsed::Run(matches));
    };
    if !serve.get_flag(PRINT_CONFIG) {
        return Ok(Parsed::Run(matches));
    }
    let text = render(serve_command, serve, from_file);
    // A reader that went away (`| head`) is not an error of ours.
    let _ = std::io::stdout().write_all(text.as_bytes());
    Ok(Parsed::Printed)
}

/// `serve`'s flags with the long names [`read_file`] accepts: every one
/// with a long name but `--help`, `--config` and `--print-config`.
fn settable(serve: &Command) -> impl Iterator<Item = (&Arg, &str)> {
    serve.get_arguments().filter_map(|arg| {
        let long = arg.get_long()?;
        (!arg.is_global_set() && !matches!(long, "help" | CONFIG | PRINT_CONFIG))
            .then_some((arg, long))
    })
}

/// `command` with `serve`'s `--config` and `--print-config`, and its flags
/// read from their environment variables ([`env_name`]).
fn prepare(command: Command) -> Command {
    command.mut_subcommand(SERVE, |serve| {
        let exit_codes = serve.get_after_help().cloned().unwrap_or_default();
        serve
            // No width: clap puts every `-h` line's help beside its flag
            // (at a width it moves all of them below their flags once one
            // line is too long), and `main` wraps what is wider than
            // its help width. `--help` is laid out below the flags anyway.
            .term_width(0)
            // `-h`: the exit codes in one line; `--help`: the whole list.
            .after_long_help(exit_codes)
            .after_help(
                "Exit status: 0 done, 2 bad arguments, input or config file, 1 any other \
                 failure (--help says more). Every flag is also read from \
                 SNAPSHOT_RECEIVER_<FLAG> and --config FILE.",
            )
            // `mut_args`, not `mut_arg`: it keeps the flags in their order.
            .mut_args(summarised)
            .mut_args(|arg| match arg.get_long() {
                Some(long)
                    if long != WEBHOOK_SECRET
                        && long != "help"
                        && !arg.is_global_set()
                        && arg.get_env().is_none() =>
                {
                    let name = env_name(long);
                    // The rule is said once, under the flags (`serve --help`).
                    arg.env(name).hide_env(true)
                }
                _ => arg,
            })
            .arg(
                Arg::new(CONFIG)
                    .long(CONFIG)
                    .value_name("FILE")
                    .value_parser(clap::value_parser!(PathBuf))
                    .help("Read flags from a TOML file (`memory-budget = \"64MiB\"`); flags and environment outrank it")
                    .long_help(
                        "Read flags from a TOML file, one key per flag by its long name \
                         (`memory-budget = \"64MiB\"`, `insecure = true`, \
                         a repeated flag as an array of strings); an unknown key or a value the \
                         flag refuses is named with its line. Every flag is also read from \
                         the environment variable SNAPSHOT_RECEIVER_<FLAG> (the long name in \
                         upper snake case: SNAPSHOT_RECEIVER_MEMORY_BUDGET; \
                         SNAPSHOT_RECEIVER_WEBHOOK_SECRET holds whitespace-separated \
                         secrets). Precedence: flag > environment > file > default.",
                    ),
            )
            .arg(
                Arg::new(PRINT_CONFIG)
                    .long(PRINT_CONFIG)
                    .action(ArgAction::SetTrue)
                    .help("Print the effective configuration as TOML (secrets redacted) and exit"),
            )
    })
}

/// The one-line help of each of `serve`'s flags for `-h` (`--help` keeps
/// the flag's whole text): the flags come from option groups other commands
/// share, whose doc comments are one paragraph. A unit test checks that
/// every flag has one.
const SUMMARIES: [(&str, &str); 57] = [
    ("listen", "Address to listen on, HOST:PORT"),
    (
        "store",
        "Where decisions are recorded: sqlite:PATH, postgres://..., memory",
    ),
    ("store-schema", "PostgreSQL only: the schema for the tables"),
    ("initial", "Seed objects from this fixture's initial_state"),
    ("profile", "Envelope profile: card, shipment or generic"),
    ("profile-file", "A profile in a JSON file"),
    (
        "version-pointer",
        "Generic profile: JSON Pointer to the version",
    ),
    ("max-body-bytes", "Largest accepted body in bytes"),
    ("max-depth", "Deepest accepted JSON nesting"),
    (
        "max-id-bytes",
        "Longest accepted event_id / object_id in bytes",
    ),
    (
        "max-held-per-object",
        "Most events held for one known object",
    ),
    (
        "max-parked-per-object",
        "Most events parked for one unknown object",
    ),
    ("max-parked-per-shard", "Most parked events per shard"),
    ("audit-retention", "Seconds audit rows are kept"),
    (
        "history-retention",
        "Seconds history (outbox) rows are kept",
    ),
    ("working-set", "Most objects kept in memory"),
    ("identity-cache", "Most event identities kept in memory"),
    (
        "memory-budget",
        "Memory the receiver may use (512MiB, 2GiB)",
    ),
    (
        "identity-filter",
        "Identities the stored-identity filter is sized for",
    ),
    (
        "webhook-secret",
        "A webhook signing secret (repeat to rotate)",
    ),
    (
        "signature-tolerance",
        "Seconds webhook-timestamp may be off",
    ),
    ("signature-header", "Generic form: the header with the HMAC"),
    ("signature-encoding", "Generic form: hex or base64"),
    ("signature-prefix", "Generic form: text before the MAC"),
    ("insecure", "Accept unsigned deliveries on any address"),
    ("operator-token", "Operator endpoints' bearer token"),
    ("retry-after", "Retry-After seconds of a 503"),
    ("shutdown-timeout", "Seconds to finish requests at shutdown"),
    (
        "log-summary-interval",
        "Seconds between summaries of repeated lines",
    ),
    (
        "shutdown-delay",
        "Seconds /readyz says stopping before closing",
    ),
    ("header-timeout", "Seconds to send a request head"),
    ("body-timeout", "Seconds to send a body"),
    ("idle-timeout", "Seconds a kept-alive connection may idle"),
    ("max-connections", "Most open connections"),
    ("forward", "POST every effect to this http:// URL"),
    ("forward-nats", "Publish every effect to this NATS server"),
    ("forward-subject", "Subject prefix for --forward-nats"),
    ("forward-secret", "Secret effects are signed with"),
    ("forward-relay", "The forwarding relay's name"),
    ("forward-lease", "Seconds the relay's name is held"),
    ("forward-timeout", "Seconds one attempt may take"),
    ("forward-schedule", "Waits between attempts, seconds"),
    ("forward-rate", "Most requests per second"),
    ("forward-concurrency", "Most objects in flight at once"),
    (
        "forward-coalesce",
        "Send only the newest of waiting effects",
    ),
    ("authority", "Fetch authoritative snapshots from this URL"),
    ("authority-timeout", "Seconds one fetch may take"),
    ("authority-concurrency", "Most fetches in flight at once"),
    ("authority-rate", "Most fetches per second (0: no limit)"),
    ("authority-burst", "Fetches at once after a quiet spell"),
    ("authority-backoff", "Seconds before a failed fetch's retry"),
    (
        "authority-backoff-max",
        "Longest wait between fetches, seconds",
    ),
    (
        "authority-breaker-failures",
        "Failures in a row that open the breaker",
    ),
    ("authority-breaker-open", "Seconds the breaker stays open"),
    ("authority-resync", "Refetch objects unconfirmed this long"),
    ("authority-rescan", "Seconds between scans for needs"),
    ("otlp-endpoint", "Export spans to this OTLP/HTTP collector"),
];

/// `arg` with its [`SUMMARIES`] line as its `-h` help and its whole text
/// as its `--help` text.
fn summarised(arg: Arg) -> Arg {
    let Some(long) = arg.get_long() else {
        return arg;
    };
    let Some((_, summary)) = SUMMARIES.iter().find(|(l, _)| *l == long) else {
        return arg;
    };
    if arg.get_long_help().is_some() {
        return arg.help(*summary);
    }
    match arg.get_help().cloned() {
        Some(full) => arg.long_help(full).help(*summary),
        None => arg.help(*summary),
    }
}

/// The non-blank value of `SNAPSHOT_RECEIVER_WEBHOOK_SECRET`.
fn webhook_secret_env() -> Option<String> {
    std::env::var(crate::cmd::serve::SECRETS_ENV)
        .ok()
        .filter(|text| !text.trim().is_empty())
}

/// The flags a config file sets: each key's long name and its values as
/// the command line would give them, checked by the flag's value parser.
///
/// # Errors
/// `config FILE: ...` when the file cannot be read or is not TOML (with
/// the line and column of the fault), `config FILE line L column C: ...`
/// for an unknown key (with the nearest known name) or a value of the
/// wrong type or refused by the flag.
fn read_file(serve: &Command, path: &Path) -> Result<Vec<(String, Vec<String>)>, String> {
    let shown = path.display();
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("config {shown}: cannot read: {e}"))?;
    let at = |offset: usize| {
        let (line, column) = line_column(&text, offset);
        format!("config {shown} line {line} column {column}")
    };
    let table = toml::de::DeTable::parse(&text).map_err(|e| match e.span() {
        Some(span) => format!("{}: {}", at(span.start), e.message().trim_end()),
        None => format!("config {shown}: {}", e.message().trim_end()),
    })?;
    // In the file's order, so that the first fault is the one named.
    let mut entries: Vec<_> = table.get_ref().iter().collect();
    entries.sort_by_key(|(key, _)| key.span().start);
    let known: Vec<(&Arg, &str)> = settable(serve).collect();
    let mut out = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        let name = key.get_ref().as_ref();
        let key_at = at(key.span().start);
        let Some((arg, long)) = known.iter().find(|(_, long)| *long == name) else {
            let hint = if matches!(name, CONFIG | PRINT_CONFIG) {
                " (a command-line flag only)".to_owned()
            } else {
                nearest(name, known.iter().map(|(_, long)| *long))
                    .map(|near| format!(" (did you mean \"{near}\"?)"))
                    .unwrap_or_default()
            };
            return Err(format!("{key_at}: unknown key \"{name}\"{hint}"));
        };
        let values = values_of(arg, long, value)
            .map_err(|(offset, why)| format!("{}: key \"{long}\": {why}", at(offset)))?;
        out.push(((*long).to_owned(), values));
    }
    together(serve, &out).map_err(|why| format!("config {shown}: {why}"))?;
    Ok(out)
}

/// Checks the file's flags together as clap checks a command line's: two
/// that conflict (`forward` and `forward-nats`, `profile` and
/// `profile-file`) or one whose companion is missing (`signature-encoding`
/// without `signature-header`) are refused; defaults are not checked so.
///
/// # Errors
/// clap's sentence, for example `the argument '--forward-nats <URL>' cannot
/// be used with '--forward <URL>'`.
fn together(serve: &Command, values: &[(String, Vec<String>)]) -> Result<(), String> {
    use clap::error::ErrorKind;
    let mut argv: Vec<OsString> = Vec::new();
    for (long, given) in values {
        let switch = serve
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()))
            .is_some_and(|a| matches!(a.get_action(), ArgAction::SetTrue));
        for value in given {
            match (switch, value.as_str()) {
                (true, "true") => argv.push(format!("--{long}").into()),
                (true, _) => {}
                (false, _) => argv.push(format!("--{long}={value}").into()),
            }
        }
    }
    // Only the file: no environment variable takes part.
    let alone = serve
        .clone()
        .no_binary_name(true)
        .mut_args(|arg| arg.env(None::<&str>));
    match alone.try_get_matches_from(argv) {
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::ArgumentConflict | ErrorKind::MissingRequiredArgument
            ) =>
        {
            // clap's first paragraph, on one line (the usage after it is
            // the command line's, not the file's).
            let rendered = e.render().to_string();
            let first: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let first = first.join(" ");
            Err(first.strip_prefix("error: ").unwrap_or(&first).to_owned())
        }
        // Each value was checked on its own already ([`check`]).
        _ => Ok(()),
    }
}

/// The texts of `value` for `arg`, each checked by the flag's value parser.
///
/// # Errors
/// The offset of the value at fault and what is wrong: an array for a flag
/// given once, a boolean for a flag that takes a value (or anything else
/// for an on/off flag), a table or date-time, or the value parser's error.
fn values_of(
    arg: &Arg,
    long: &str,
    value: &toml::Spanned<toml::de::DeValue<'_>>,
) -> Result<Vec<String>, (usize, String)> {
    let repeated = matches!(arg.get_action(), ArgAction::Append);
    let items: Vec<&toml::Spanned<toml::de::DeValue<'_>>> = match value.get_ref() {
        toml::de::DeValue::Array(items) if repeated => items.iter().collect(),
        toml::de::DeValue::Array(_) => {
            return Err((
                value.span().start,
                "an array, but this flag takes one value".to_owned(),
            ))
        }
        _ => vec![value],
    };
    items
        .into_iter()
        .map(|item| {
            let text = scalar(arg, item.get_ref()).map_err(|why| (item.span().start, why))?;
            check(arg, long, &text).map_err(|why| (item.span().start, why))?;
            Ok(text)
        })
        .collect()
}

/// One TOML value as the text of a command-line value.
///
/// # Errors
/// What the value is and what the flag wants, when they do not fit.
fn scalar(arg: &Arg, value: &toml::de::DeValue<'_>) -> Result<String, String> {
    use toml::de::DeValue;
    let switch = matches!(arg.get_action(), ArgAction::SetTrue);
    match value {
        DeValue::Boolean(yes) if switch => Ok(yes.to_string()),
        _ if switch => Err(format!("expected true or false, found {}", kind_of(value))),
        DeValue::String(text) => Ok(text.to_string()),
        DeValue::Integer(int) => i128::from_str_radix(int.as_str(), int.radix())
            .map(|n| n.to_string())
            .map_err(|e| format!("{e}")),
        DeValue::Float(float) => Ok(float.as_str().to_owned()),
        DeValue::Boolean(_) | DeValue::Datetime(_) | DeValue::Array(_) | DeValue::Table(_) => Err(
            format!("expected a string or a number, found {}", kind_of(value)),
        ),
    }
}

/// A TOML value's kind in words, for an error.
fn kind_of(value: &toml::de::DeValue<'_>) -> &'static str {
    use toml::de::DeValue;
    match value {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a date-time",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

/// `text` checked by `arg`'s value parser, as the command line's would be
/// (on a parser of that one flag, without its relations to others).
///
/// # Errors
/// The parser's reason: its own error's text (`invalid digit found in
/// string`, a store location's fault), or the values it takes.
fn check(arg: &Arg, long: &str, text: &str) -> Result<(), String> {
    use clap::error::{ContextKind, ContextValue};
    let alone = Arg::new(arg.get_id().clone())
        .long(long.to_owned())
        .value_parser(arg.get_value_parser().clone())
        .action(ArgAction::Set)
        .allow_hyphen_values(true);
    let parsed = Command::new(SERVE)
        .no_binary_name(true)
        .disable_help_flag(true)
        .arg(alone)
        .try_get_matches_from([OsString::from(format!("--{long}")), OsString::from(text)]);
    let Err(e) = parsed else {
        return Ok(());
    };
    if let Some(source) = std::error::Error::source(&e) {
        return Err(source.to_string());
    }
    if let Some(ContextValue::Strings(valid)) = e.get(ContextKind::ValidValue) {
        return Err(format!(
            "\"{text}\" is not one of {}",
            valid
                .iter()
                .map(|v| format!("\"{v}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Err(e.kind().to_string())
}

/// The known name nearest `name` (Jaro similarity above 0.7, as clap's own
/// suggestions), if any.
fn nearest<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    known
        .map(|k| (strsim::jaro(name, k), k))
        .filter(|(score, _)| *score > 0.7)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k)
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(start..).map_or(0, |s| s.chars().count()) + 1;
    (line, column)
}

/// `serve`'s effective configuration as a TOML file `--config` reads back:
/// one `key = value` line per flag, in `--help`'s order, with where the
/// value came from as a comment (`flag`, `env NAME`, `file`, `default`);
/// a flag with no value is a comment; secrets and URL passwords are
/// [`REDACTED`].
fn render(serve_command: &Command, serve: &ArgMatches, from_file: &[String]) -> String {
    let mut out =
        String::from("# serve's effective configuration (flag > environment > file > default)\n");
    for (arg, long) in settable(serve_command) {
        let id = arg.get_id().as_str();
        let mut values: Vec<String> = serve
            .get_raw(id)
            .map(|raw| raw.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let mut source = match serve.value_source(id) {
            Some(ValueSource::CommandLine) => "flag".to_owned(),
            Some(ValueSource::EnvVariable) => {
                format!(
                    "env {}",
                    arg.get_env()
                        .map_or_else(String::new, |e| e.to_string_lossy().into_owned())
                )
            }
            Some(ValueSource::DefaultValue) if from_file.iter().any(|f| f == long) => {
                "file".to_owned()
            }
            _ => "default".to_owned(),
        };
        if long == WEBHOOK_SECRET && values.is_empty() {
            if let Some(all) = webhook_secret_env() {
                values = all.split_whitespace().map(str::to_owned).collect();
                source = format!("env {}", crate::cmd::serve::SECRETS_ENV);
            }
        }
        if SECRET_FLAGS.contains(&long) {
            values = values.iter().map(|_| REDACTED.to_owned()).collect();
        } else if URL_FLAGS.contains(&long) {
            values = values.iter().map(|v| without_password(v)).collect();
        }
        let switch = matches!(arg.get_action(), ArgAction::SetTrue);
        let repeated = matches!(arg.get_action(), ArgAction::Append);
        let shown: Vec<String> = values
            .iter()
            .map(|v| {
                if switch || v.parse::<i64>().is_ok() {
                    v.clone()
                } else {
                    toml_string(v)
                }
            })
            .collect();
        let _ = match (shown.as_slice(), repeated) {
            ([], _) => writeln!(out, "# {long}: not set"),
            ([one], false) => writeln!(out, "{long} = {one}  # {source}"),
            (all, _) => writeln!(out, "{long} = [{}]  # {source}", all.join(", ")),
        };
    }
    out
}

/// `url` with the password of its user information, if any, replaced by
/// [`REDACTED`] (`scheme://user:<redacted>@host/...`).
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user_info, host)) => match user_info.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:{REDACTED}@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// `text` as a TOML basic string (TOML 1.0 §String): quotes, backslash and
/// control characters escaped.
fn toml_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_serve_flag_has_a_summary() {
        use clap::CommandFactory as _;
        let command = crate::Cli::command();
        let serve = command.find_subcommand(SERVE).unwrap();
        let missing: Vec<&str> = settable(serve)
            .map(|(_, long)| long)
            .filter(|long| !SUMMARIES.iter().any(|(l, _)| l == long))
            .collect();
        assert_eq!(missing, Vec::<&str>::new());
    }

    #[test]
    fn env_names_are_upper_snake_case() {
        assert_eq!(env_name("memory-budget"), "SNAPSHOT_RECEIVER_MEMORY_BUDGET");
    }

    #[test]
    fn passwords_in_urls_are_redacted() {
        assert_eq!(
            without_password("postgres://app:s3cret@db:5432/x?sslmode=require"),
            "postgres://app:<redacted>@db:5432/x?sslmode=require"
        );
        assert_eq!(
            without_password("postgres://app@db/x"),
            "postgres://app@db/x"
        );
        assert_eq!(without_password("sqlite:a@b:c"), "sqlite:a@b:c");
    }

    #[test]
    fn strings_are_escaped() {
        assert_eq!(toml_string("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
    }

    #[test]
    fn lines_and_columns_count_from_one() {
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_column("ab", 0), (1, 1));
    }
}
