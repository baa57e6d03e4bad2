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
//! `--consume-args "--max-in-flight 1 --batch 1"` passes flags to every
//! `consume`; `--binary PATH` measures another build of the tool (for a
//! before/after comparison in one sitting).
//!
//! Beside the rate each run prints where the CPU went, summed over the run's
//! processes: the consumers (from their summaries), the committer threads'
//! phases and commit sizes (from `Receiver::store_stats`, in the summary's
//! `store` object), and nats-server and PostgreSQL (from `/proc`, every
//! process of those names, so other users of them count too).
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
    consume_args: Vec<String>,
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
        consume_args: Vec::new(),
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
            "--consume-args" => {
                a.consume_args = value.split_whitespace().map(str::to_owned).collect()
            }
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

/// CPU time (user + system, milliseconds) used so far by every process
/// whose command name is `name`, from `/proc` (Linux; 0 elsewhere).
fn cpu_ms_of(name: &str) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut ticks = 0;
    for entry in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] != name {
            continue;
        }
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let field = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // utime and stime (fields 14 and 15 of the line), in 1/100 s.
        ticks += field(11) + field(12);
    }
    ticks * 10
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
    println!(
        "\n| processes | messages | retried | waited | seconds | messages/s | commits | deliveries/commit | consume CPU µs/msg | committer CPU µs/msg (encode / execute / commit) | nats-server CPU µs/msg | PostgreSQL CPU µs/msg |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
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
        let (nats_cpu, pg_cpu) = (cpu_ms_of("nats-server"), cpu_ms_of("postgres"));
        let children: Vec<_> = (0..k)
            .map(|i| {
                Command::new(&a.binary)
                    .args(["consume", "--nats", &a.nats, "--stream", &stream])
                    .args(["--store", &a.pg, "--store-schema", &schema])
                    .args(["--initial", fixture.to_str().unwrap()])
                    .args(["--member", &format!("m{i}"), "--idle-exit", "3"])
                    .args(&a.consume_args)
                    .stdout(Stdio::piped())
                    .spawn()
            })
            .collect::<Result<_, _>>()?;
        let (mut acked, mut retried, mut terminated, mut waited) = (0u64, 0u64, 0u64, 0u64);
        let (mut consume_cpu, mut committer_cpu, mut commits) = (0.0, 0.0, 0u64);
        let mut phases = [0.0f64; 3];
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
            waited += summary["waited"].as_u64().unwrap_or(0);
            consume_cpu += summary["process_cpu_ms"].as_f64().unwrap_or(0.0);
            let store = &summary["store"];
            commits += store["commits"].as_u64().unwrap_or(0);
            committer_cpu += store["committer_cpu_ms"].as_f64().unwrap_or(0.0);
            for (i, phase) in ["encode", "execute", "commit"].iter().enumerate() {
                phases[i] += store["cpu_ms"][phase].as_f64().unwrap_or(0.0);
            }
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
        let (nats_cpu, pg_cpu) = (
            cpu_ms_of("nats-server").saturating_sub(nats_cpu),
            cpu_ms_of("postgres").saturating_sub(pg_cpu),
        );
        let seconds = last.saturating_sub(first) as f64 / 1000.0;
        let rate = acked as f64 / seconds;
        // Microseconds per acknowledged message.
        let per = |ms: f64| ms * 1000.0 / acked.max(1) as f64;
        let per_commit = if commits > 0 {
            format!("{:.0}", (acked + retried) as f64 / commits as f64)
        } else {
            "-".to_owned()
        };
        println!(
            "| {k} | {acked} | {retried} | {waited} | {seconds:.1} | {rate:.0} | {} | {per_commit} | {:.0} | {:.1} ({:.1} / {:.1} / {:.1}) | {:.0} | {:.0} |",
            if commits > 0 { commits.to_string() } else { "-".to_owned() },
            per(consume_cpu),
            per(committer_cpu),
            per(phases[0]),
            per(phases[1]),
            per(phases[2]),
            per(nats_cpu as f64),
            per(pg_cpu as f64),
        );
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
