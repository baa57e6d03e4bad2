//! `consume`: a durable receiver fed by a partitioned JetStream stream, with
//! its JSON Lines (partitions taken and released, retries, terminations,
//! acknowledgements on request, a summary last).

use crate::error::InputError;
use snapshot_receiver::{jetstream, Config, Receiver};
use std::io::Write;
use std::path::PathBuf;

/// The arguments of `consume`.
#[derive(clap::Args)]
pub(crate) struct ConsumeArgs {
    /// The NATS server.
    #[arg(long, default_value = "nats://127.0.0.1:4222", value_name = "URL")]
    nats: String,
    /// The stream.
    #[arg(long, value_name = "NAME")]
    stream: String,
    /// The durable store: `postgres://USER@HOST:PORT/DB` (shared by the
    /// processes) or `sqlite:PATH` (one process).
    #[arg(long, value_name = "LOCATION", value_parser = crate::options::store_location)]
    store: String,
    /// PostgreSQL only: the schema for the tables (created if absent).
    #[arg(long, value_name = "NAME")]
    store_schema: Option<String>,
    /// Seeds the objects of this fixture's `initial_state` that the store does not have.
    #[arg(long, value_name = "FIXTURE")]
    initial: Option<PathBuf>,
    /// The partition count this process expects (default: the stream's).
    #[arg(long, value_name = "P")]
    partitions: Option<u32>,
    /// This process's name among the consumers of the stream (default: HOST-PID).
    #[arg(long, value_name = "NAME")]
    member: Option<String>,
    /// Seconds a partition lease lives without renewal.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    lease_ttl: f64,
    /// Seconds JetStream waits for an acknowledgement before redelivering.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    ack_wait: f64,
    /// Seconds of delay asked for when a delivery could not be recorded (retry).
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    retry_delay: f64,
    /// Messages of one partition in flight at most (its consumer's
    /// max_ack_pending, and what one pull asks for).
    #[arg(long, value_name = "N", default_value_t = jetstream::DEFAULT_MAX_IN_FLIGHT as u32,
          value_parser = crate::options::whole::<u32>(1, u32::MAX.into()))]
    max_in_flight: u32,
    /// Most messages of one partition decided in one batch (one call of the
    /// receiver's batch path; the batch's acknowledgements leave after its
    /// group commit).
    #[arg(long, value_name = "N", default_value_t = jetstream::DEFAULT_BATCH as u32,
          value_parser = crate::options::whole::<u32>(1, u32::MAX.into()))]
    batch: u32,
    /// Exit when no message arrived for this many seconds.
    #[arg(long, value_name = "SECONDS")]
    idle_exit: Option<f64>,
    /// Also print one line per acknowledged message.
    #[arg(long)]
    print_acks: bool,
}

/// Runs `consume`.
pub(crate) fn run(args: ConsumeArgs) -> anyhow::Result<()> {
    let ConsumeArgs {
        nats,
        stream,
        store,
        store_schema,
        initial,
        partitions,
        member,
        lease_ttl,
        ack_wait,
        retry_delay,
        max_in_flight,
        batch,
        idle_exit,
        print_acks,
    } = args;
    let seconds = |name: &str, s: f64| {
        std::time::Duration::try_from_secs_f64(s)
            .map_err(|_| InputError::new(format!("--{name}: not a number of seconds: {s}")))
    };
    let options = jetstream::ConsumeOptions {
        stream,
        partitions,
        member,
        lease_ttl: seconds("lease-ttl", lease_ttl)?,
        ack_wait: seconds("ack-wait", ack_wait)?,
        retry_delay: seconds("retry-delay", retry_delay)?,
        max_in_flight: max_in_flight as usize,
        batch: batch as usize,
        idle_exit: idle_exit.map(|s| seconds("idle-exit", s)).transpose()?,
        ..jetstream::ConsumeOptions::default()
    };
    consume(
        &nats,
        &store,
        store_schema,
        initial.as_deref(),
        options,
        print_acks,
    )
}

/// `consume`: a durable receiver fed by the stream until SIGTERM, ctrl-c or
/// the idle time; JSON Lines on stdout, a summary last.
fn consume(
    nats: &str,
    store: &str,
    schema: Option<String>,
    initial: Option<&std::path::Path>,
    options: jetstream::ConsumeOptions,
    print_acks: bool,
) -> anyhow::Result<()> {
    let initial = match initial {
        Some(path) => super::load_fixture(path)?.initial_state,
        None => Vec::new(),
    };
    super::runtime()?.block_on(async {
        // Keeping the audit trail in memory would grow without bound: the store has it.
        let mut builder = Receiver::builder().config(Config {
            audit: false,
            ..Config::default()
        });
        for (id, version, state) in &initial {
            builder = builder.object(id, *version, state);
        }
        let url = store.to_owned();
        builder = match schema {
            Some(schema) if url.starts_with("postgres") => builder.store_with(move || {
                snapshot_receiver::store::PostgresStore::connect_in_schema(&url, Some(&schema))
            }),
            Some(_) => {
                return Err(InputError::new("--store-schema needs a postgres:// store").into())
            }
            None => builder.store(&url),
        };
        let receiver = builder.build().map_err(crate::error::receiver_error)?;
        let client = jetstream::connect(nats).await?;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let signals = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                super::stop_signal().await;
                shutdown.cancel();
            }
        });
        let sink: jetstream::EventSink = std::sync::Arc::new(move |event| {
            if let Some(line) = event_line(event, print_acks) {
                // Line-buffered: each line is out before the next event.
                let _ = writeln!(std::io::stdout().lock(), "{line}");
            }
        });
        let report = jetstream::consume(&receiver, client, options, shutdown, sink).await;
        signals.abort();
        let store = receiver.store_stats();
        receiver.shutdown().await;
        let report = report?;
        let ms = |t: Option<std::time::SystemTime>| {
            t.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as u64)
        };
        println!(
            "{}",
            serde_json::json!({
                "event": "summary",
                "member": report.member,
                "acknowledged": report.acknowledged,
                "retried": report.retried,
                "terminated": report.terminated,
                "waited": report.waited,
                "ack_failures": report.ack_failures,
                "partitions_taken": report.partitions_taken,
                "first_message_unix_ms": ms(report.first_message),
                "last_ack_unix_ms": ms(report.last_ack),
                "per_second": report.rate(),
                "store": store.as_ref().map(store_line),
                "process_cpu_ms": snapshot_receiver_loadgen::process_cpu_time().map(|d| d.as_millis() as u64),
            })
        );
        Ok(())
    })
}

/// The store's group-commit figures of the run, for the summary: commits,
/// deliveries per commit (of the commits that carried a delivery: mean to
/// two decimals, median and largest), commit times and where the committer
/// thread's CPU went (milliseconds to the microsecond, three decimals).
fn store_line(stats: &snapshot_receiver::store::CommitStats) -> serde_json::Value {
    let ms = |d: std::time::Duration| d.as_micros() as f64 / 1e3;
    let sizes = stats.deliveries_per_commit();
    let mean = (sizes.mean * 100.0).round() / 100.0;
    serde_json::json!({
        "commits": stats.commits,
        "conflicts": stats.conflicts,
        "failures": stats.failures,
        "deliveries": stats.deliveries,
        "deliveries_per_commit": {"mean": mean, "p50": sizes.p50, "max": sizes.max},
        "commit_ms": {"p50": ms(stats.commit_time(0.5)), "p99": ms(stats.commit_time(0.99))},
        "committer_cpu_ms": ms(stats.thread_cpu),
        "cpu_ms": {
            "encode": ms(stats.phases.encode.cpu),
            "execute": ms(stats.phases.execute.cpu),
            "commit": ms(stats.phases.commit.cpu),
        },
        "wall_ms": {
            "encode": ms(stats.phases.encode.wall),
            "execute": ms(stats.phases.execute.wall),
            "commit": ms(stats.phases.commit.wall),
        },
    })
}

/// The JSON line of a consume event (`None`: not printed).
fn event_line(event: &jetstream::ConsumeEvent, print_acks: bool) -> Option<serde_json::Value> {
    use jetstream::ConsumeEvent as E;
    Some(match event {
        E::Joined { member, partitions } => {
            serde_json::json!({"event": "joined", "member": member, "partitions": partitions})
        }
        E::Took { partition } => serde_json::json!({"event": "took", "partition": partition}),
        E::Released { partition } => {
            serde_json::json!({"event": "released", "partition": partition})
        }
        E::Lost { partition } => serde_json::json!({"event": "lost", "partition": partition}),
        E::Acknowledged {
            partition,
            stream_sequence,
            delivered,
            event_id,
            decision,
        } if print_acks => serde_json::json!({
            "event": "ack",
            "partition": partition,
            "seq": stream_sequence,
            "delivered": delivered,
            "event_id": event_id.as_deref(),
            "decision": decision.as_str(),
        }),
        E::Acknowledged { .. } => return None,
        E::Retry {
            partition,
            stream_sequence,
            reason,
        } => {
            serde_json::json!({"event": "retry", "partition": partition, "seq": stream_sequence, "reason": reason})
        }
        E::Terminated {
            partition,
            stream_sequence,
            reason,
        } => {
            serde_json::json!({"event": "terminated", "partition": partition, "seq": stream_sequence, "reason": reason})
        }
        _ => return None,
    })
}
