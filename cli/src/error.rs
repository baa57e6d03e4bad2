//! The tool's errors and exit codes: [`InputError`] (bad input, exit 2),
//! [`Exit`] (an operator command's own code), [`exit_code`], the one place
//! an error becomes an exit code, and [`describe`], the one place it
//! becomes a message (both called by `main`).

/// The exit codes of every command but `loadtest` and `sign` (which have
/// their own), as each `--help` shows them and docs/DEPLOYMENT.md's table
/// lists them.
pub(crate) const EXIT_STATUS: &str = "\
Exit status:
  0  done
  1  any other failure: the store could not be opened, read or written (a server
     that does not answer, SQLite busy past its 5 s timeout); reconcile: the
     snapshots printed before the failure were applied, the rest not
  2  bad arguments or input: a flag's value (a --store that is not a store
     location, or needs a feature this build left out, or `memory` where a
     store is read from outside its process; a bad --now), a file that cannot
     be read or is not of its format
  3  no such store: a SQLite file that does not exist (inspect, audit,
     reconcile, purge, relay, relays; nothing is created)
  4  not a receiver store: no receiver tables in the file or schema, a schema
     that does not exist, a file that is not SQLite (nothing is created)
  5  reconcile: a bad snapshot line (its number and what is wrong are
     printed); nothing was applied
  6  reconcile: a snapshot was refused as older than its object (not forced);
     the other lines were applied
  7  reconcile --fetch: the authority has no such object (404 or 410);
     nothing changed
  8  reconcile --fetch: the authority is unavailable (no connection, a refusal,
     no whole answer within --authority-timeout); nothing changed
  9  reconcile --fetch: a bad answer (a redirect, or a body that is not the
     object's snapshot within the limits); nothing changed";

/// A failure with an exit code of its own, for the operator commands.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct Exit {
    /// The exit code.
    code: u8,
    /// What went wrong, in one line.
    message: String,
}

impl Exit {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Exit code: the store named does not exist.
pub(crate) const EXIT_NO_STORE: u8 = 3;

/// Exit code: the location holds no receiver store.
pub(crate) const EXIT_NOT_A_STORE: u8 = 4;

/// Exit code: a bad line in `reconcile --snapshot`; nothing was applied.
pub(crate) const EXIT_BAD_SNAPSHOT: u8 = 5;

/// Exit code: `reconcile` refused a snapshot older than its object.
pub(crate) const EXIT_SNAPSHOT_REFUSED: u8 = 6;

/// Exit code: `reconcile --fetch` found no such object at the authority.
#[cfg_attr(not(feature = "serve"), allow(dead_code))]
pub(crate) const EXIT_NO_SUCH_OBJECT: u8 = 7;

/// Exit code: `reconcile --fetch` could not get an answer from the
/// authority (no connection, a refusal, a timeout).
#[cfg_attr(not(feature = "serve"), allow(dead_code))]
pub(crate) const EXIT_AUTHORITY_UNAVAILABLE: u8 = 8;

/// Exit code: `reconcile --fetch` got a bad answer from the authority.
#[cfg_attr(not(feature = "serve"), allow(dead_code))]
pub(crate) const EXIT_BAD_ANSWER: u8 = 9;

/// An error caused by the user's input, or a refusal to start with what the
/// user gave: exit code [`EXIT_REFUSED`]. Its message (and sources) are the
/// wrapped error's.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub(crate) struct InputError(Box<dyn std::error::Error + Send + Sync>);

impl InputError {
    /// An input error with this message.
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self(message.into().into())
    }

    /// An input error that is `error` (its message and sources).
    pub(crate) fn wrap(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self(error.into())
    }
}

/// The exit code of bad input and of a refusal to start.
pub(crate) const EXIT_REFUSED: u8 = 2;

/// The exit code of every other failure, among them a failed `loadtest` check.
pub(crate) const EXIT_FAILED: u8 = 1;

/// The exit code of a failed command ([`EXIT_STATUS`]): an [`Exit`]'s own
/// code; for a store error anywhere in the chain that says the store is
/// missing or is not a receiver's, [`EXIT_NO_STORE`] or [`EXIT_NOT_A_STORE`],
/// or that its location is not one, [`EXIT_REFUSED`]; [`EXIT_REFUSED`] when
/// an [`InputError`] is the error or its context; else [`EXIT_FAILED`]
/// (among them every other store error: the same cause, a server that does
/// not answer for example, exits the same from every command).
pub(crate) fn exit_code(e: &anyhow::Error) -> u8 {
    use snapshot_receiver::store::StoreError;
    if let Some(exit) = e.downcast_ref::<Exit>() {
        return exit.code;
    }
    for cause in e.chain() {
        match cause.downcast_ref::<StoreError>() {
            Some(StoreError::Missing(_)) => return EXIT_NO_STORE,
            Some(StoreError::NotAStore(_)) => return EXIT_NOT_A_STORE,
            Some(StoreError::InvalidLocation(_)) => return EXIT_REFUSED,
            _ => {}
        }
    }
    if e.downcast_ref::<InputError>().is_some() {
        EXIT_REFUSED
    } else {
        EXIT_FAILED
    }
}

/// The features of this build of the tool that add commands or store
/// locations, in the order of `cli/Cargo.toml`.
pub(crate) fn built_features() -> Vec<&'static str> {
    [
        ("serve", cfg!(feature = "serve")),
        ("postgres", cfg!(feature = "postgres")),
        ("jetstream", cfg!(feature = "jetstream")),
        ("loadtest", cfg!(feature = "loadtest")),
        ("lsm", cfg!(feature = "lsm")),
        ("mimalloc", cfg!(feature = "mimalloc")),
    ]
    .into_iter()
    .filter_map(|(name, built)| built.then_some(name))
    .collect()
}

/// The README's install command with `feature` added to this build's own
/// features, so that following it keeps what the user has.
pub(crate) fn install_with(feature: &str) -> String {
    let mut features = built_features();
    if !features.contains(&feature) {
        features.push(feature);
    }
    format!(
        "cargo install --locked --path cli --features {}",
        features.join(",")
    )
}

/// The error for a receiver that could not be built: a store error as it is
/// (its exit code is its kind's, see [`exit_code`]; its message names the
/// location), a refusal of what the user gave as an [`InputError`], and no
/// runtime as a failure of the tool.
pub(crate) fn receiver_error(e: snapshot_receiver::BuildError) -> anyhow::Error {
    use snapshot_receiver::BuildError;
    match e {
        BuildError::Store(store) => anyhow::Error::new(store),
        BuildError::NoRuntime => anyhow::Error::new(e),
        other => InputError::wrap(other).into(),
    }
}

/// The message `main` prints for `e`: its context and causes joined by
/// `: `, each said once. A cause whose words the message already holds is
/// left out (a client error that repeats its source's text, as async-nats
/// and rusqlite do); one that holds the previous cause's words replaces it.
pub(crate) fn describe(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || parts.iter().any(|p| p.contains(&text)) {
            continue;
        }
        match parts.last_mut() {
            Some(last) if text.contains(last.as_str()) => *last = text,
            _ => parts.push(text),
        }
    }
    parts.join(": ")
}
