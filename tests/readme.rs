//! The README's service walkthrough, run as written: the authority of its
//! first block (a folder served by Python), the third command block against
//! a `serve` started as the second block starts it (on free ports and a
//! scratch store), its three answers compared with the ones the README
//! shows: the last one card-7 un-paused by the authority, no operator step.

use crate::common::repo;
use crate::serve::{scratch, Server};
use serde_json::Value;

/// The first ```sh block after `marker` in `text`.
fn block_after<'a>(text: &'a str, marker: &str) -> &'a str {
    fenced_after(text, marker, "sh")
}

/// The first block fenced as ```tag after `marker` in `text`.
fn fenced_after<'a>(text: &'a str, marker: &str, tag: &str) -> &'a str {
    let at = text.find(marker).unwrap_or_else(|| panic!("no {marker:?}"));
    let rest = &text[at..];
    let fence = format!("```{tag}\n");
    let start = rest
        .find(&fence)
        .unwrap_or_else(|| panic!("no ```{tag} block after {marker:?}"))
        + fence.len();
    let end = start + rest[start..].find("```").unwrap();
    &rest[start..end]
}

/// The README's library section as a newcomer uses it: a new cargo project
/// whose `[dependencies]` are the README's block (the path pointing at this
/// clone) and whose `main.rs` is the README's example, built outside this
/// workspace (so nothing the workspace depends on is there unless the block
/// names it) and run; it prints the line the README shows. The workspace's
/// lock file is copied in, so the build resolves the versions already
/// fetched and runs offline.
#[test]
fn the_readme_library_example_builds_as_its_own_project_and_prints_what_is_shown() {
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    let deps = fenced_after(&readme, "## Use the library", "toml");
    let example = fenced_after(&readme, "## Use the library", "rust");
    let shown = fenced_after(&readme, "It prints one line", "text");
    let clone = std::fs::canonicalize(repo(".")).unwrap();
    let path_line = "snapshot-receiver = { path = \"../snapshot-receiver\" }";
    assert!(deps.contains(path_line), "{deps}");
    let deps = deps.replace(
        path_line,
        &format!(
            "snapshot-receiver = {{ path = {:?} }}",
            clone.display().to_string()
        ),
    );
    let dir = scratch("readme-crate");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"readme-example\"\nversion = \"0.1.0\"\nedition = \"2021\"\npublish = false\n\n[workspace]\n\n{deps}"
        ),
    )
    .unwrap();
    std::fs::write(dir.join("src/main.rs"), example).unwrap();
    std::fs::copy(repo("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    // Its own target directory, kept between runs (the outer cargo holds
    // the workspace's), under the suite's target directory: never in the
    // clone when CARGO_TARGET_DIR is elsewhere.
    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-example");
    let out = std::process::Command::new(env!("CARGO"))
        .args(["run", "--quiet", "--offline", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the README's example failed: {stderr}"
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), shown);
}

#[test]
fn the_readme_service_walkthrough_answers_as_shown() {
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    let authority_block = block_after(&readme, "## Run it as a service");
    assert!(
        authority_block.starts_with("# Terminal 1: an authority"),
        "{authority_block}"
    );
    let start = block_after(&readme, "# Terminal 1: an authority");
    let serve_line = "snapshot-receiver serve --initial fixtures/B62-15-events.json \
                      --authority 'http://127.0.0.1:9001/{object_id}.json'";
    assert!(start.contains(serve_line), "{start}");
    let steps = block_after(&readme, "another shell with the same two");
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let dir = scratch("readme");
    // Terminal 1 as written, in a scratch folder, on a free port, with the
    // suite's Python when it names one.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let python = std::env::var("SNAPSHOT_RECEIVER_PYTHON").unwrap_or_else(|_| "python3".into());
    let authority_script = authority_block
        .replace("9001", &port.to_string())
        .replace("python3 ", &format!("exec {python} "));
    let mut authority = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &authority_script])
        .current_dir(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let store = format!("sqlite:{}", dir.join("walkthrough.db").display());
    let fixture = repo("fixtures/B62-15-events.json").display().to_string();
    let template = format!("http://127.0.0.1:{port}/{{object_id}}.json");
    let server = Server::start_env(
        &[
            "--initial",
            &fixture,
            "--store",
            &store,
            "--authority",
            &template,
        ],
        &[
            ("SNAPSHOT_RECEIVER_WEBHOOK_SECRET", secret),
            ("SNAPSHOT_RECEIVER_OPERATOR_TOKEN", "change-me"),
        ],
    );
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_snapshot-receiver"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = steps.replace("127.0.0.1:8080", &server.addr);
    // The wait for the un-pause is bounded here (the README's loop is not).
    let output = std::process::Command::new("timeout")
        .args(["60", "bash", "-euo", "pipefail", "-c", &script])
        .env("PATH", path)
        .env("SNAPSHOT_RECEIVER_WEBHOOK_SECRET", secret)
        .env("SNAPSHOT_RECEIVER_OPERATOR_TOKEN", "change-me")
        .output()
        .unwrap();
    let _ = authority.kill();
    let _ = authority.wait();
    assert!(
        output.status.success(),
        "{:?} {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let got: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let shown = &readme[readme.find("The three answers, in order").unwrap()..];
    let shown = &shown[shown.find("```json\n").unwrap() + 8..];
    let shown: Vec<Value> = shown[..shown.find("```").unwrap()]
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got, shown);
}

/// `sign` with the Standard Webhooks specification's example (secret, id,
/// timestamp, body) prints the specification's signature.
#[test]
fn sign_prints_the_specification_example_headers() {
    let o = crate::common::cli()
        .args([
            "sign",
            "--secret",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "--id",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            "--timestamp",
            "1614265330",
            "--data",
            r#"{"test": 2432232314}"#,
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        String::from_utf8(o.stdout).unwrap(),
        "webhook-id: msg_p5jXN8AQM9LWM0D4loKWxJek\n\
         webhook-timestamp: 1614265330\n\
         webhook-signature: v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=\n"
    );
    let o = crate::common::cli()
        .args(["sign", "--secret", "plain", "--data", "{}"])
        .env_remove("SNAPSHOT_RECEIVER_WEBHOOK_SECRET")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "error: --secret: a Standard Webhooks secret is written `whsec_<base64>` (the form the sender shows)\n"
    );
}

/// The README and the benchmarks stay references a reader gets through:
/// at most 250 and 300 lines (their history is in git), and the service
/// walkthrough says why it seeds objects with `--initial`.
#[test]
fn the_readme_and_the_benchmarks_stay_short_and_the_walkthrough_says_why_it_seeds() {
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 250, "README.md has {lines} lines, more than 250");
    let benchmarks = std::fs::read_to_string(repo("docs/BENCHMARKS.md")).unwrap();
    let lines = benchmarks.lines().count();
    assert!(
        lines <= 300,
        "docs/BENCHMARKS.md has {lines} lines, more than 300"
    );
    let service = &readme[readme.find("## Run it as a service").unwrap()..];
    let service = &service[..service.find("\n## ").unwrap_or(service.len())];
    let service = service.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        service.contains("**Why `--initial`:**")
            && service.contains("parks every event as `held` / `unknown_object`"),
        "the walkthrough does not say why it seeds: {service}"
    );
}
