//! `serve --config FILE`, `serve`'s environment variables and `serve
//! --print-config` (docs/SERVE.md, "Configuration"); `serve -h` is short.

use crate::common::{cli, spawn_quiet};
use crate::serve::{envelope, scratch, within_seconds, Server, NEW_SECRET, OLD_SECRET};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// `text` written to `name` in a fresh scratch folder of test `test`.
fn config_file(test: &str, name: &str, text: &str) -> PathBuf {
    let path = scratch(test).join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// `serve ARGS` without the secrets' variables of the test's environment.
fn serve(args: &[&str]) -> Command {
    let mut command = cli();
    command
        .arg("serve")
        .args(args)
        .env_remove("SNAPSHOT_RECEIVER_WEBHOOK_SECRET")
        .env_remove("SNAPSHOT_RECEIVER_OPERATOR_TOKEN")
        .env_remove("SNAPSHOT_RECEIVER_FORWARD_SECRET");
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The `key = value  # source` lines of `--print-config` output for `keys`.
fn lines_of(output: &Output, keys: &[&str]) -> Vec<String> {
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    keys.iter()
        .map(|key| {
            out.lines()
                .find(|l| {
                    l.starts_with(&format!("{key} = ")) || l.starts_with(&format!("# {key}:"))
                })
                .unwrap_or_else(|| panic!("no line for {key}:\n{out}"))
                .to_owned()
        })
        .collect()
}

/// A file sets the address, the store, the secrets and the shutdown delay
/// of a server that runs: unsigned deliveries are refused, one signed with
/// either secret of the file is recorded.
#[test]
fn a_config_file_drives_serve() {
    let dir = scratch("config-drives");
    let store = dir.join("r.db");
    let path = config_file(
        "config-drives-file",
        "serve.toml",
        &format!(
            "# the front door\nlisten = \"127.0.0.1:0\"\nstore = \"sqlite:{}\"\n\
             webhook-secret = [\"{NEW_SECRET}\", \"{OLD_SECRET}\"]\nshutdown-delay = 0\n\
             initial = \"{}\"\n",
            store.display(),
            crate::common::repo("fixtures/B62-15-events.json").display(),
        ),
    );
    let mut command = serve(&["--config", path.to_str().unwrap()]);
    command.stdout(Stdio::piped());
    let server = Server::attach(spawn_quiet(&mut command));
    assert!(server.addr.starts_with("127.0.0.1:"), "{}", server.addr);
    let e1 = envelope("e-901", "card-8", 4, r#"{"stage":"review"}"#);
    assert_eq!(server.post(&[], &e1).status, 401);
    assert_eq!(server.post_signed(OLD_SECRET, &e1).status, 200);
    let e2 = envelope("e-902", "card-8", 5, r#"{"stage":"done"}"#);
    assert_eq!(server.post_signed(NEW_SECRET, &e2).status, 200);
    let (status, _) = server.stop();
    assert!(status.success(), "{status:?}");
    assert!(store.exists(), "the file's store was not used");
}

/// Flag > environment > file > default, each shown with where it came from.
#[test]
fn a_flag_outranks_the_environment_which_outranks_the_file() {
    let path = config_file(
        "config-precedence",
        "serve.toml",
        "retry-after = 7\nidle-timeout = 8\nheader-timeout = 9\n\
         signature-header = \"X-Hub-Signature-256\"\nsignature-prefix = \"sha256=\"\n",
    );
    let output = serve(&[
        "--config",
        path.to_str().unwrap(),
        "--print-config",
        "--retry-after",
        "3",
    ])
    .env("SNAPSHOT_RECEIVER_RETRY_AFTER", "5")
    .env("SNAPSHOT_RECEIVER_IDLE_TIMEOUT", "6")
    .output()
    .unwrap();
    assert_eq!(
        lines_of(
            &output,
            &[
                "retry-after",
                "idle-timeout",
                "header-timeout",
                "body-timeout",
                "signature-prefix"
            ]
        ),
        [
            "retry-after = 3  # flag",
            "idle-timeout = 6  # env SNAPSHOT_RECEIVER_IDLE_TIMEOUT",
            "header-timeout = 9  # file",
            "body-timeout = 30  # default",
            "signature-prefix = \"sha256=\"  # file",
        ]
    );
    assert_eq!(text(&output.stderr), "");
    // What --print-config prints, --config reads back: the same values.
    let printed = config_file("config-precedence-back", "back.toml", &text(&output.stdout));
    let again = serve(&["--config", printed.to_str().unwrap(), "--print-config"])
        .output()
        .unwrap();
    assert_eq!(
        lines_of(&again, &["retry-after", "idle-timeout", "header-timeout"]),
        [
            "retry-after = 3  # file",
            "idle-timeout = 6  # file",
            "header-timeout = 9  # file"
        ]
    );
    // SNAPSHOT_RECEIVER_WEBHOOK_SECRET (whitespace-separated secrets)
    // outranks the file's secrets too.
    let secrets = config_file(
        "config-precedence-secrets",
        "s.toml",
        &format!("webhook-secret = [\"{NEW_SECRET}\"]\n"),
    );
    let output = serve(&["--config", secrets.to_str().unwrap(), "--print-config"])
        .env(
            "SNAPSHOT_RECEIVER_WEBHOOK_SECRET",
            format!("{NEW_SECRET} {OLD_SECRET}"),
        )
        .output()
        .unwrap();
    assert_eq!(
        lines_of(&output, &["webhook-secret"]),
        ["webhook-secret = [\"<redacted>\", \"<redacted>\"]  # env SNAPSHOT_RECEIVER_WEBHOOK_SECRET"]
    );
}

/// Every secret is `<redacted>` in --print-config: the webhook secrets,
/// the operator's token, the forwarding secret and a URL's password.
#[test]
fn print_config_redacts_every_secret() {
    let path = config_file(
        "config-redacts",
        "serve.toml",
        &format!(
            "webhook-secret = [\"{NEW_SECRET}\", \"{OLD_SECRET}\"]\n\
             operator-token = \"t0ken-in-file\"\n\
             store = \"postgres://app:pa55word@db.example:5432/receiver\"\n\
             forward = \"http://hook:f0rw4rd@app.example/effects\"\n"
        ),
    );
    let output = serve(&["--config", path.to_str().unwrap(), "--print-config"])
        .env(
            "SNAPSHOT_RECEIVER_FORWARD_SECRET",
            "whsec_Zm9yd2FyZC1zZWNyZXQ=",
        )
        .output()
        .unwrap();
    assert_eq!(
        lines_of(
            &output,
            &[
                "webhook-secret",
                "operator-token",
                "forward-secret",
                "store",
                "forward"
            ]
        ),
        [
            "webhook-secret = [\"<redacted>\", \"<redacted>\"]  # file",
            "operator-token = \"<redacted>\"  # file",
            "forward-secret = \"<redacted>\"  # env SNAPSHOT_RECEIVER_FORWARD_SECRET",
            "store = \"postgres://app:<redacted>@db.example:5432/receiver\"  # file",
            "forward = \"http://hook:<redacted>@app.example/effects\"  # file",
        ]
    );
    let out = text(&output.stdout);
    for secret in [
        NEW_SECRET,
        OLD_SECRET,
        "t0ken-in-file",
        "pa55word",
        "f0rw4rd",
        "Zm9yd2FyZC1zZWNyZXQ",
    ] {
        assert!(!out.contains(secret), "{secret} shown:\n{out}");
    }
}

/// An unknown key and a value of the wrong type are refused (exit 2),
/// naming the file, the line, the column and the key; nothing starts.
#[test]
fn an_unknown_key_or_a_wrong_type_is_refused_with_its_line() {
    let cases = [
        (
            "unknown.toml",
            "listen = \"127.0.0.1:0\"\nmemry-budget = \"64MiB\"\n",
            "line 2 column 1: unknown key \"memry-budget\" (did you mean \"memory-budget\"?)",
        ),
        (
            "digits.toml",
            "# limits\n\nretry-after = \"soon\"\n",
            "line 3 column 15: key \"retry-after\": invalid digit found in string",
        ),
        (
            "switch.toml",
            "insecure = \"yes\"\n",
            "line 1 column 12: key \"insecure\": expected true or false, found a string",
        ),
        (
            "array.toml",
            "listen = [\"127.0.0.1:0\"]\n",
            "line 1 column 10: key \"listen\": an array, but this flag takes one value",
        ),
        (
            "enum.toml",
            "signature-encoding = \"hexx\"\n",
            "line 1 column 22: key \"signature-encoding\": \"hexx\" is not one of \"hex\", \"base64\"",
        ),
        (
            "both.toml",
            "forward = \"http://127.0.0.1:9/e\"\nforward-nats = \"nats://127.0.0.1:4222\"\n",
            "the argument '--forward <URL>' cannot be used with '--forward-nats <URL>'",
        ),
        (
            "alone.toml",
            "signature-encoding = \"base64\"\n",
            "the following required arguments were not provided: --signature-header <NAME>",
        ),
        (
            "size.toml",
            "memory-budget = true\n",
            "line 1 column 17: key \"memory-budget\": expected a string or a number, found a boolean",
        ),
    ];
    for (name, body, message) in cases {
        let path = config_file(&format!("config-refused-{name}"), name, body);
        let output = within_seconds(
            20,
            &mut serve(&[
                "--config",
                path.to_str().unwrap(),
                "--store",
                "memory",
                "--listen",
                "127.0.0.1:0",
            ]),
        );
        assert_eq!(output.status.code(), Some(2), "{name}");
        assert_eq!(text(&output.stdout), "", "{name}");
        assert_eq!(
            text(&output.stderr),
            if message.starts_with("line ") {
                format!("error: config {} {message}\n", path.display())
            } else {
                format!("error: config {}: {message}\n", path.display())
            },
            "{name}"
        );
    }
}

/// `serve -h` is one line per flag (no flag's long text); `--help` has it.
#[test]
fn short_help_is_short() {
    let short = serve(&["-h"]).output().unwrap();
    assert_eq!(short.status.code(), Some(0));
    let short = text(&short.stdout);
    let long = text(&serve(&["--help"]).output().unwrap().stdout);
    let flags = long
        .lines()
        .filter(|l| l.trim_start().starts_with("--") || l.trim_start().starts_with("-h,"))
        .count();
    let short_lines = short.lines().count();
    // The usage and heading, a line per flag, the exit codes.
    assert!(
        short_lines <= flags + 30,
        "{short_lines} lines for {flags} flags:\n{short}"
    );
    let working_set_long = "Paused objects and objects holding events always stay";
    assert!(long.contains(working_set_long), "{long}");
    assert!(!short.contains(working_set_long), "{short}");
    assert!(short.contains("--config <FILE>"), "{short}");
}

/// `sign --help` lists the exit codes `sign` has, none of a store's.
#[test]
fn sign_help_lists_its_own_exit_codes() {
    let output = cli().args(["sign", "--help"]).output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    let help = text(&output.stdout);
    let codes: Vec<&str> = help
        .lines()
        .skip_while(|l| *l != "Exit status:")
        .filter(|l| l.starts_with("  ") && l.trim_start().len() > 2)
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.len() == 1 && w.chars().all(|c| c.is_ascii_digit()))
        .collect();
    assert_eq!(codes, ["0", "1", "2"], "{help}");
    assert!(!help.contains("store"), "{help}");
}
