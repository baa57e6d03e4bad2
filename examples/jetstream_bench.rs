//! Throughput of the JetStream path with 1, 2 and 3 `consume` processes on
//! one PostgreSQL database, measured in one run (docs/BENCHMARKS-jetstream.md).
//!
//! ```sh
//! cargo build --release && cargo run --release --example jetstream_bench -- \
//!     --deliveries 60000 --processes 1,2,3
//! ```
//!
//! `--processes 1,2,3,1,2,3` repeats the runs (interleaved, so that a
//! change in the machine's load hits every count alike); the last table
//! gives the median of each count and its ratio to one process.
//!
//! For each process count: a fresh stream and schema, the same generated
//! stream (duplicates, reordering, variants) published first, then that many
//! `snapshot-receiver consume` processes started together, each exiting
//! after 3 idle seconds. The rate is acknowledged messages divided by the
//! time from the first message any process received to the last
//! acknowledgement any process got (start-up and the idle wait excluded).

#[allow(dead_code)]
#[path = "../tests/common/stream_gen.rs"]
mod stream_gen;

use snapshot_receiver::jetstream::{connect, Publisher};
use std::process::{Command, Stdio};
use std::time::SystemTime;

struct Args {
    deliveries: usize,
    processes: Vec<usize>,
    partitions: u32,
    binary: String,
    nats: String,
    pg: String,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        deliveries: 60_000,
        processes: vec![1, 2, 3],
        partitions: 48,
        binary: "target/release/snapshot-receiver".to_owned(),
        nats: std::env::var("SNAPSHOT_RECEIVER_NATS_URL")
            .unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned()),
        pg: std::env::var("SNAPSHOT_RECEIVER_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |_| format!("{flag}: bad value {value:?}");
        match flag.as_str() {
            "--deliveries" => a.deliveries = value.parse().map_err(bad)?,
            "--partitions" => a.partitions = value.parse().map_err(bad)?,
            "--processes" => {
                a.processes = value
                    .split(',')
                    .map(|n| {
                        n.parse()
                            .map_err(|_| format!("--processes: bad value {value:?}"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--binary" => a.binary = value,
            "--nats" => a.nats = value,
            "--pg" => a.pg = value,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

fn psql(pg: &str, sql: &str) {
    let (pg, sql) = (pg.to_owned(), sql.to_owned());
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&pg, postgres::NoTls).expect("PostgreSQL");
        c.batch_execute(&sql).expect("SQL");
    })
    .join()
    .unwrap();
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = args()?;
    let at = snapshot_receiver::format_rfc3339(SystemTime::now());
    let g = stream_gen::generate(a.deliveries, 17, &at);
    let fixture = std::env::temp_dir().join(format!("sr-bench-{}.json", std::process::id()));
    std::fs::write(&fixture, stream_gen::fixture_json(&g))?;
    println!(
        "{} deliveries generated over {} objects; {} partitions; binary {}",
        g.bodies.len(),
        g.objects,
        a.partitions,
        a.binary
    );
    println!("\n| processes | messages | retried | seconds | messages/s |");
    println!("|---|---|---|---|---|");
    let mut rates: std::collections::BTreeMap<usize, Vec<f64>> = Default::default();
    for &k in &a.processes {
        let stream = format!("SR_BENCH_{k}_{}", std::process::id());
        let schema = format!("sr_bench_{k}_{}", std::process::id());
        psql(&a.pg, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
        let client = connect(&a.nats).await?;
        let js = async_nats::jetstream::new(client.clone());
        let _ = js.delete_stream(&stream).await;
        let publisher = Publisher::new(client, &stream, Some(a.partitions), None).await?;
        let published = publisher.publish_all(&g.bodies).await?;
        let children: Vec<_> = (0..k)
            .map(|i| {
                Command::new(&a.binary)
                    .args(["consume", "--nats", &a.nats, "--stream", &stream])
                    .args(["--store", &a.pg, "--store-schema", &schema])
                    .args(["--initial", fixture.to_str().unwrap()])
                    .args(["--member", &format!("m{i}"), "--idle-exit", "3"])
                    .stdout(Stdio::piped())
                    .spawn()
            })
            .collect::<Result<_, _>>()?;
        let (mut acked, mut retried, mut terminated) = (0u64, 0u64, 0u64);
        let (mut first, mut last) = (u64::MAX, 0u64);
        for child in children {
            let out = child.wait_with_output()?;
            if !out.status.success() {
                return Err(format!("consume failed: {}", out.status).into());
            }
            let text = String::from_utf8(out.stdout)?;
            let summary: serde_json::Value =
                serde_json::from_str(text.lines().last().ok_or("no summary")?)?;
            acked += summary["acknowledged"].as_u64().unwrap_or(0);
            retried += summary["retried"].as_u64().unwrap_or(0);
            terminated += summary["terminated"].as_u64().unwrap_or(0);
            first = first.min(
                summary["first_message_unix_ms"]
                    .as_u64()
                    .unwrap_or(u64::MAX),
            );
            last = last.max(summary["last_ack_unix_ms"].as_u64().unwrap_or(0));
        }
        let stored = published.published - published.dropped_as_duplicate;
        // The generated stream has one body over the id limit: terminated.
        if acked + terminated != stored {
            return Err(format!("{k} processes acknowledged {acked} of {stored}").into());
        }
        let seconds = last.saturating_sub(first) as f64 / 1000.0;
        let rate = acked as f64 / seconds;
        println!("| {k} | {acked} | {retried} | {seconds:.1} | {rate:.0} |");
        rates.entry(k).or_default().push(rate);
        let _ = js.delete_stream(&stream).await;
        let _ = js.delete_stream(format!("KV_sr-leases-{stream}")).await;
        psql(&a.pg, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
    }
    let _ = std::fs::remove_file(&fixture);
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let one = rates.get(&1).map(|v| median(v));
    println!("\n| processes | runs | median messages/s | ratio to 1 process |");
    println!("|---|---|---|---|");
    for (k, v) in &rates {
        let m = median(v);
        let ratio = one.map_or("-".to_owned(), |o| format!("{:.2}", m / o));
        println!("| {k} | {} | {m:.0} | {ratio} |", v.len());
    }
    Ok(())
}
