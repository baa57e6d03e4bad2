//! `publish`: a fixture's deliveries, in order, to a partitioned JetStream
//! stream; one JSON line with the counts.

use snapshot_receiver::jetstream;
use std::path::PathBuf;

/// The arguments of `publish`.
#[derive(clap::Args)]
pub(crate) struct PublishArgs {
    /// The fixture whose deliveries are published.
    fixture: PathBuf,
    /// The NATS server.
    #[arg(long, default_value = "nats://127.0.0.1:4222", value_name = "URL")]
    nats: String,
    /// The stream.
    #[arg(long, value_name = "NAME")]
    stream: String,
    /// Partitions of a new stream (default 64); must match an existing one.
    #[arg(long, value_name = "P")]
    partitions: Option<u32>,
    /// Subjects of a new stream are PREFIX.N, N the partition number (default: the stream name).
    #[arg(long, value_name = "PREFIX")]
    subject_prefix: Option<String>,
}

/// Runs `publish`.
pub(crate) fn run(args: PublishArgs) -> anyhow::Result<()> {
    publish(
        &args.fixture,
        &args.nats,
        &args.stream,
        args.partitions,
        args.subject_prefix.as_deref(),
    )
}

/// `publish`: the fixture's deliveries, in order, to the stream.
fn publish(
    fixture: &std::path::Path,
    nats: &str,
    stream: &str,
    partitions: Option<u32>,
    prefix: Option<&str>,
) -> anyhow::Result<()> {
    let fixture = super::load_fixture(fixture)?;
    super::runtime()?.block_on(async {
        let client = jetstream::connect(nats).await?;
        let publisher = jetstream::Publisher::new(client, stream, partitions, prefix).await?;
        let report = publisher
            .publish_all(fixture.deliveries.iter().map(|d| &d.body))
            .await?;
        let secs = report.elapsed.as_secs_f64();
        println!(
            "{}",
            serde_json::json!({
                "event": "published",
                "stream": stream,
                "partitions": publisher.layout().partitions,
                "subjects": format!("{}.<partition>", publisher.layout().subject_prefix),
                "published": report.published,
                "dropped_as_duplicate": report.dropped_as_duplicate,
                "seconds": secs,
                "per_second": if secs > 0.0 { report.published as f64 / secs } else { 0.0 },
            })
        );
        Ok(())
    })
}
