//! One module per subcommand: its arguments, what it runs and the writers of
//! what it prints.

pub(crate) mod audit;
#[cfg(feature = "serve")]
pub(crate) mod authority;
#[cfg(feature = "jetstream")]
pub(crate) mod consume;
pub(crate) mod fill;
#[cfg(feature = "serve")]
pub(crate) mod forward;
pub(crate) mod inspect;
#[cfg(feature = "loadtest")]
pub(crate) mod loadtest;
#[cfg(feature = "serve")]
pub(crate) mod pool;
#[cfg(feature = "jetstream")]
pub(crate) mod publish;
pub(crate) mod purge;
pub(crate) mod reconcile;
#[cfg(feature = "serve")]
pub(crate) mod reconciler;
#[cfg(feature = "serve")]
pub(crate) mod relay;
pub(crate) mod relays;
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

/// A future that resolves on SIGTERM or ctrl-c (SIGINT). On Unix both
/// handlers are installed when this is called, not when the future is first
/// polled: a signal that arrives in between is then not the default action
/// (the process killed without draining), but this future's wake-up. Must be
/// called inside a tokio runtime.
#[cfg(any(feature = "serve", feature = "jetstream"))]
pub(crate) fn stop_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let interrupt = signal(SignalKind::interrupt());
        async move {
            match (term, interrupt) {
                (Ok(mut term), Ok(mut interrupt)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = interrupt.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
