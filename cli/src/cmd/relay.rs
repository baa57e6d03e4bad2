//! `relay`: forwards the effects a durable store records to the application
//! (`cmd::forward`) without serving, until SIGTERM or ctrl-c.

use super::forward::ForwardArgs;
use crate::error::InputError;
use snapshot_receiver::Receiver;
use std::io::Write as _;

/// The arguments of `relay`.
#[derive(clap::Args)]
pub(crate) struct RelayArgs {
    /// The durable store whose effects are forwarded: `sqlite:PATH` or
    /// `postgres://USER@HOST:PORT/DB` (the one `serve` records to).
    #[arg(long, value_name = "LOCATION")]
    store: String,
    /// PostgreSQL only: the schema of the tables.
    #[arg(long, value_name = "NAME")]
    store_schema: Option<String>,
    #[command(flatten)]
    forward: ForwardArgs,
}

/// Runs `relay` until SIGTERM or ctrl-c.
pub(crate) fn run(args: RelayArgs) -> anyhow::Result<()> {
    let Some(forward) = args.forward.resolve()? else {
        return Err(InputError::new(
            "relay needs a destination: --forward URL (or --forward-nats URL)",
        )
        .into());
    };
    let location = snapshot_receiver::store::Location::parse(&args.store)
        .map_err(|e| InputError::new(format!("--store: {e}")))?;
    if location.is_memory() {
        return Err(InputError::new(
            "--store memory: a relay reads a durable store (sqlite:PATH or postgres://...); \
             to forward from memory, use serve --forward",
        )
        .into());
    }
    super::runtime()?.block_on(async {
        let mut builder = Receiver::builder();
        if let Some(schema) = &args.store_schema {
            builder = builder.store_schema(schema);
        }
        let receiver = builder
            .store(&args.store)
            .build()
            .map_err(|e| InputError::new(format!("--store: {e}")))?;
        let stopped = super::stop_signal();
        let (name, url) = (forward.options.name.clone(), forward.url.clone());
        let relay = forward.start(&receiver).await?;
        {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "relaying effects to {url} as relay {name}");
            let _ = out.flush();
        }
        stopped.await;
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
