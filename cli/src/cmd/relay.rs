//! `relay`: forwards the effects a durable store records to the application
//! (`cmd::forward`) without serving, until SIGTERM or ctrl-c. On a long
//! catch-up (the relay [`CATCH_UP_EFFECTS`] or more behind) a progress bar
//! on stderr shows its cursor against the outbox's last position, when
//! stderr is a terminal; the relay's own log lines (`-v`) say the same
//! elsewhere.

use super::forward::ForwardArgs;
use crate::error::InputError;
use crate::options::StoreArgs;
use snapshot_receiver::relay::{Relay, CATCH_UP_EFFECTS};
use snapshot_receiver::Receiver;
use std::io::Write as _;

/// The arguments of `relay`.
#[derive(clap::Args)]
pub(crate) struct RelayArgs {
    /// The store whose effects are forwarded (the one `serve` records to).
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    forward: ForwardArgs,
    /// The body limit of the receiver recording the store (serve's
    /// --max-body-bytes), in bytes: with --forward-nats, the relay refuses
    /// to start when the effect of such a body would not fit in one
    /// message of the NATS server (its max_payload).
    #[arg(long, value_name = "BYTES",
          default_value_t = snapshot_receiver::Limits::default().max_body_bytes)]
    max_body_bytes: usize,
}

/// Runs `relay` until SIGTERM or ctrl-c.
pub(crate) fn run(args: RelayArgs) -> anyhow::Result<()> {
    let Some(forward) = args.forward.resolve()? else {
        return Err(InputError::new(if cfg!(feature = "jetstream") {
            "relay needs a destination: --forward URL (or --forward-nats URL)"
        } else {
            "relay needs a destination: --forward URL (--forward-nats URL needs a build \
                 with the jetstream feature: cargo install --locked --path cli --features \
                 serve,jetstream)"
        })
        .into());
    };
    let location = snapshot_receiver::store::Location::parse(&args.store.store)
        .map_err(|e| InputError::new(format!("--store: {e}")))?;
    if location.is_memory() {
        return Err(InputError::new(
            "--store memory: a relay reads a durable store (sqlite:PATH or postgres://...); \
             to forward from memory, use serve --forward",
        )
        .into());
    }
    // The store must exist and be a receiver's before a receiver opens it
    // (opening would create the tables): exit 3 or 4, nothing created.
    drop(args.store.reader()?);
    super::runtime()?.block_on(async {
        let mut builder = Receiver::builder();
        if let Some(schema) = &args.store.store_schema {
            builder = builder.store_schema(schema);
        }
        let receiver = builder
            .store(&args.store.store)
            .build()
            .map_err(|e| InputError::new(format!("--store: {e}")))?;
        let stopped = super::stop_signal();
        let (name, url) = (forward.options.name.clone(), forward.url.clone());
        let relay = forward.start(&receiver, args.max_body_bytes).await?;
        {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "relaying effects to {} as relay {}",
                crate::terminal::shown(&url),
                crate::terminal::shown(&name)
            );
            let _ = out.flush();
        }
        tokio::select! {
            () = stopped => {}
            () = show_progress(&relay) => {}
        }
        let progress = relay.stop().await?;
        receiver.shutdown().await;
        let _ = writeln!(
            std::io::stdout(),
            "stopped at position {} ({} delivered, {} parked, {} failed)",
            progress.position,
            progress.delivered,
            progress.parked,
            progress.failed
        );
        Ok(())
    })
}

/// Draws the catch-up bar while the relay runs (never returns): shown while
/// the relay is [`CATCH_UP_EFFECTS`] or more behind, cleared once it is
/// back. Hidden when stderr is not a terminal (indicatif's own check).
async fn show_progress(relay: &Relay) {
    use indicatif::{ProgressBar, ProgressStyle};
    let style = ProgressStyle::with_template(
        "catching up {bar:40} {pos}/{len} effects ({per_sec}, {eta} left)",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    let mut bar: Option<ProgressBar> = None;
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let p = relay.progress();
        let behind = p.last.saturating_sub(p.position) >= CATCH_UP_EFFECTS;
        match (&bar, behind) {
            (None, true) => {
                let shown = ProgressBar::new(p.last).with_style(style.clone());
                shown.set_position(p.position);
                bar = Some(shown);
            }
            (Some(shown), true) => {
                shown.set_length(p.last);
                shown.set_position(p.position);
            }
            (Some(shown), false) => {
                shown.finish_and_clear();
                bar = None;
            }
            (None, false) => {}
        }
    }
}
