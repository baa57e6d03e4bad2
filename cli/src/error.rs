//! The tool's errors and exit codes: [`InputError`] (bad input, exit 2),
//! [`Exit`] (an operator command's own code), and [`exit_code`], the one
//! place an error becomes an exit code (called by `main`).

/// The exit codes of the operator commands, shown by their `--help`.
pub(crate) const OPERATOR_EXIT_STATUS: &str = "\
Exit status:
  0  done
  1  any other failure (the store could not be read or written, for example
     SQLite busy past its 5 s timeout; reconcile: the snapshots printed
     before the failure were applied, the rest not)
  2  bad arguments (an unreadable --snapshot file, a bad --now, a --store
     that is not a store location, or `memory`, which nothing outside the
     receiver's process can read)
  3  no such store (a SQLite file that does not exist; nothing is created)
  4  not a receiver store (no receiver tables in the file or schema, a schema
     that does not exist, a file that is not SQLite; nothing is created)
  5  reconcile: a bad snapshot line (its number and what is wrong are
     printed); nothing was applied
  6  reconcile: a snapshot was refused as older than its object (not forced);
     the other lines were applied";

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

/// The exit code of a failed command: an [`Exit`]'s own code; for a store
/// error anywhere in the chain that says the store is missing or is not a
/// receiver's, [`EXIT_NO_STORE`] or [`EXIT_NOT_A_STORE`], or that its
/// location is not one, [`EXIT_REFUSED`]; [`EXIT_REFUSED`]
/// when an [`InputError`] is the error or its context; else [`EXIT_FAILED`].
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
