//! One module per subcommand: its arguments, what it runs and the writers of
//! what it prints.

pub(crate) mod audit;
#[cfg(feature = "jetstream")]
pub(crate) mod consume;
pub(crate) mod inspect;
#[cfg(feature = "loadtest")]
pub(crate) mod loadtest;
#[cfg(feature = "jetstream")]
pub(crate) mod publish;
pub(crate) mod purge;
pub(crate) mod reconcile;
pub(crate) mod replay;
#[cfg(feature = "serve")]
pub(crate) mod serve;
#[cfg(feature = "serve")]
pub(crate) mod sign;

use crate::error::InputError;
use anyhow::Context as _;
use snapshot_receiver::fixture::Fixture;

/// A multi-thread tokio runtime with every driver enabled.
///
/// # Errors
/// When the runtime cannot start (no threads left, for example).
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

/// Reads a fixture file (docs/CONTRACT.md §6).
///
/// # Errors
/// An [`InputError`] with the fixture error's one-line message, which names
/// the file and already says its cause (so the cause is not chained again).
pub(crate) fn load_fixture(path: &std::path::Path) -> Result<Fixture, InputError> {
    Fixture::load(path).map_err(|e| InputError::new(e.to_string()))
}

/// Resolves on SIGTERM or ctrl-c (SIGINT).
#[cfg(any(feature = "serve", feature = "jetstream"))]
pub(crate) async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
