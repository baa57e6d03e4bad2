//! The `loadtest` report in text: one run, or a comparison round by round.
//! (`--format json` serialises the loadgen report types as they are.)

use std::io::Write;

/// Writes a `--target compare` report: each round's rates and same-round
/// ratios, their medians and the check over every run.
pub(super) fn write_comparison(
    out: &mut impl Write,
    c: &snapshot_receiver_loadgen::Comparison,
) -> std::io::Result<()> {
    let Some(first) = c.runs().next() else {
        return Ok(());
    };
    writeln!(
        out,
        "compare: engine (1 thread), mutex and receiver ({} producers, batch {}, {} shards), {} round{}",
        c.producers,
        c.batch,
        c.shards,
        c.rounds.len(),
        if c.rounds.len() == 1 { "" } else { "s" }
    )?;
    writeln!(
        out,
        "stream: {} deliveries, {} distinct events, {} objects, {:.0} B average body, seed {}",
        first.deliveries, first.distinct_events, first.objects, first.avg_body_bytes, first.seed
    )?;
    let cpu = |r: &snapshot_receiver_loadgen::Report| {
        r.cpu_us_per_delivery
            .map_or(String::new(), |c| format!(" ({c:.2} us CPU)"))
    };
    for (i, round) in c.rounds.iter().enumerate() {
        write!(
            out,
            "round {}: engine {:.0}/s{} | mutex {:.0}/s{} | receiver {:.0}/s{}",
            i + 1,
            round.engine.deliveries_per_s,
            cpu(&round.engine),
            round.mutex.deliveries_per_s,
            cpu(&round.mutex),
            round.receiver.deliveries_per_s,
            cpu(&round.receiver),
        )?;
        if let (Some(m), Some(r)) = (&round.mutex_unbatched, &round.receiver_unbatched) {
            write!(
                out,
                " | unbatched: mutex {:.0}/s{}, receiver {:.0}/s{}",
                m.deliveries_per_s,
                cpu(m),
                r.deliveries_per_s,
                cpu(r)
            )?;
        }
        write!(
            out,
            " | receiver/engine {:.2}, receiver/mutex {:.2}",
            round.receiver_over_engine, round.receiver_over_mutex
        )?;
        match round.receiver_over_unbatched_mutex {
            Some(x) => writeln!(out, ", receiver/unbatched mutex {x:.2}")?,
            None => writeln!(out)?,
        }
    }
    let m = &c.median;
    write!(
        out,
        "median: engine {:.0}/s, mutex {:.0}/s, receiver {:.0}/s",
        m.engine, m.mutex, m.receiver
    )?;
    if let (Some(mu), Some(ru)) = (m.mutex_unbatched, m.receiver_unbatched) {
        write!(
            out,
            ", unbatched mutex {mu:.0}/s, unbatched receiver {ru:.0}/s"
        )?;
    }
    write!(
        out,
        "; receiver/engine {:.2}, receiver/mutex {:.2}",
        m.receiver_over_engine, m.receiver_over_mutex
    )?;
    match m.receiver_over_unbatched_mutex {
        Some(x) => writeln!(out, ", receiver/unbatched mutex {x:.2}")?,
        None => writeln!(out)?,
    }
    let checks: u64 = c.runs().map(|r| r.check.assertions).sum();
    let failed = c.runs().filter(|r| !r.ok).count();
    if failed == 0 {
        writeln!(out, "check: ok in every run ({checks} assertions)")?;
    } else {
        writeln!(out, "check: FAILED in {failed} runs")?;
    }
    Ok(())
}

/// Writes the report of one run: target, stream, throughput, latency, peak
/// RSS, decision counts and the check (with its failures).
pub(super) fn write_load_report(
    out: &mut impl Write,
    r: &snapshot_receiver_loadgen::Report,
) -> std::io::Result<()> {
    let us = |ns: u64| ns as f64 / 1000.0;
    let mode = match r.rate {
        Some(rate) => format!("open loop at {rate:.0}/s"),
        None => "closed loop".to_owned(),
    };
    writeln!(
        out,
        "target: {} ({mode}, {} producers, batch {}, {} shards)",
        r.target, r.producers, r.batch, r.shards
    )?;
    writeln!(
        out,
        "stream: {} deliveries, {} distinct events, {} objects, {:.0} B average body, seed {}",
        r.deliveries, r.distinct_events, r.objects, r.avg_body_bytes, r.seed
    )?;
    write!(
        out,
        "throughput: {:.0} deliveries/s ({:.3} s",
        r.deliveries_per_s, r.elapsed_s
    )?;
    match r.cpu_us_per_delivery {
        Some(cpu) => writeln!(out, ", {cpu:.2} us CPU per delivery)")?,
        None => writeln!(out, ")")?,
    }
    let l = &r.latency_ns;
    if l.count > 0 {
        writeln!(
            out,
            "ack latency: p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us, max {:.1} us",
            us(l.p50),
            us(l.p99),
            us(l.p999),
            us(l.max)
        )?;
    }
    let s = &r.service_latency_ns;
    if r.rate.is_some() && s.count > 0 {
        writeln!(
            out,
            "  from the intended send time; from the actual send: p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us, max {:.1} us",
            us(s.p50),
            us(s.p99),
            us(s.p999),
            us(s.max)
        )?;
        let p = &r.send_lateness_ns;
        writeln!(
            out,
            "  sent after the intended time by: p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us, max {:.1} us",
            us(p.p50),
            us(p.p99),
            us(p.p999),
            us(p.max)
        )?;
    }
    if let Some(store) = &r.store {
        write_store_report(out, store, r.producers * r.batch)?;
    }
    if let Some(a) = &r.authority {
        write_authority_report(out, a)?;
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    match (r.peak_rss_bytes, r.stream_rss_bytes) {
        (Some(peak), Some(stream)) => writeln!(
            out,
            "peak RSS: {:.1} MiB ({:.1} MiB once the stream was generated, before the run)",
            mib(peak),
            mib(stream)
        )?,
        (Some(peak), None) => writeln!(out, "peak RSS: {:.1} MiB", mib(peak))?,
        (None, _) => writeln!(out, "peak RSS: unknown")?,
    }
    let d = &r.decisions;
    writeln!(
        out,
        "decisions: applied {}, stale {}, duplicate {}, equal {}, conflict event_variant {}, \
         conflict version_state {}, held paused {}, held unknown_object {}, held other {}, \
         retry {}, reject {}",
        d.applied,
        d.stale,
        d.duplicate,
        d.equal,
        d.conflict_event_variant,
        d.conflict_version_state,
        d.held_paused,
        d.held_unknown_object,
        d.held_other,
        d.retry,
        d.reject
    )?;
    if r.ok {
        writeln!(out, "check: ok ({} assertions)", r.check.assertions)?;
    } else {
        writeln!(
            out,
            "check: FAILED ({} of {} assertions)",
            r.check.failed, r.check.assertions
        )?;
        for f in &r.check.failures {
            writeln!(out, "  - {f}")?;
        }
    }
    Ok(())
}

/// The `authority:` lines of a run that reconciled.
fn write_authority_report(
    out: &mut impl Write,
    a: &snapshot_receiver_loadgen::AuthorityReport,
) -> std::io::Result<()> {
    let converged = match a.converged_after_s {
        Some(s) => format!("every object converged {:.3} s after the last answer", s),
        None => "some objects did NOT converge within the drain".to_owned(),
    };
    match (&a.answered, &a.fetches) {
        (Some(answered), Some(fetches)) => writeln!(
            out,
            "authority: reconciler, {:.1} ms latency; {} authority replacements; answered {} snapshots, \
             {} absent, {} down; fetches {fetches}; {converged}",
            a.latency_ms.unwrap_or_default(),
            a.replacements,
            answered.snapshots,
            answered.absent,
            answered.down
        )?,
        _ => writeln!(
            out,
            "authority: in line, {} reconciliations, {} authority replacements; {converged}",
            a.reconciled, a.replacements
        )?,
    }
    if let Some(u) = &a.unpause_ns {
        let ms = |ns: u64| ns as f64 / 1e6;
        writeln!(
            out,
            "  un-pause after a conflict ({} objects, {} notifications missed): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            u.count,
            a.unpause_missed,
            ms(u.p50),
            ms(u.p99),
            ms(u.max)
        )?;
    }
    Ok(())
}

/// The `store:` lines of a load-test report on a durable store.
fn write_store_report(
    out: &mut impl Write,
    s: &snapshot_receiver_loadgen::StoreReport,
    in_flight: usize,
) -> std::io::Result<()> {
    let g = &s.deliveries_per_commit;
    let fsync = match (&s.fsync_per_s, &s.fsync_probe_error) {
        (Some(rate), _) => format!("{rate:.0} fsyncs/s"),
        (None, Some(why)) => format!("failed: {why}"),
        (None, None) => "not run".to_owned(),
    };
    writeln!(
        out,
        "store: {} commits, deliveries per commit mean {:.1} (p50 {}, max {}; {:.0} % of the {} in flight), \
         commit p50 {:.2} ms, p99 {:.2} ms, {} conflicts, {} failed, {} writes one by one; \
         fsync probe before the run: {fsync}",
        s.commits,
        g.mean,
        g.p50,
        g.max,
        s.commit_fill * 100.0,
        in_flight,
        s.commit_ms.p50,
        s.commit_ms.p99,
        s.conflicts,
        s.failures,
        s.writes_one_by_one
    )?;
    if let Some(b) = s.peak_rss_before_check_bytes {
        writeln!(
            out,
            "  peak RSS when the deliveries were done: {:.1} MiB (before the check reads every object back)",
            b as f64 / (1024.0 * 1024.0)
        )?;
    }
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    writeln!(
        out,
        "  memory budget: {:.1} MiB (working set {:.1} MiB, store engine {:.1} MiB)",
        mib(s.memory_budget_bytes),
        mib(s.working_set_budget_bytes),
        mib(s.store_engine_bytes)
    )?;
    if let (Some(objects), Some(reads), Some(spared)) =
        (s.objects_loaded, s.identity_reads, s.identities_spared)
    {
        writeln!(
            out,
            "  read back from the store: {objects} objects; receipts in {reads} reads, \
             {spared} new identities spared a read by the identity filter"
        )?;
    }
    let c = &s.cpu_us_per_delivery;
    let outside = c
        .outside_committer
        .map_or_else(|| "unknown".to_owned(), |v| format!("{v:.2} us"));
    writeln!(
        out,
        "  CPU per delivery: outside the committer {outside}, encode {:.2} us, execute {:.2} us, \
         commit {:.2} us, committer other {:.2} us; committer waiting in execute {:.0} %, in commit {:.0} % of the run",
        c.encode,
        c.execute,
        c.commit,
        c.committer_other,
        s.waiting_share.execute * 100.0,
        s.waiting_share.commit * 100.0
    )?;
    writeln!(out, "  {}", disk_line(s))
}

/// The report's line of bytes written during the run and kept at its end,
/// per delivery, with the totals in MiB; `unknown` for a figure not taken
/// (no `/proc`, or a store other than a SQLite file or an LSM directory).
fn disk_line(s: &snapshot_receiver_loadgen::StoreReport) -> String {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let figure = |total: Option<u64>, per: Option<f64>, what: &str| match (total, per) {
        (Some(total), Some(per)) => {
            format!("{per:.0} B per delivery ({:.1} MiB {what})", mib(total))
        }
        _ => "unknown".to_owned(),
    };
    format!(
        "disk: written {}, kept {}",
        figure(s.written_bytes, s.written_bytes_per_delivery, "in all"),
        figure(s.kept_bytes, s.kept_bytes_per_delivery, "on disk")
    )
}

/// Writes a `loadtest --soak` report: the run, the RSS after warm-up and at
/// the end, and the samples in between (at most 20 of them).
pub(super) fn write_soak_report(
    out: &mut impl Write,
    r: &snapshot_receiver_loadgen::SoakReport,
) -> std::io::Result<()> {
    let mb = |b: u64| b as f64 / 1_048_576.0;
    writeln!(
        out,
        "soak: {} deliveries ({} redeliveries) over {} objects in {:.1} s ({:.0}/s{}), \
         retention {} ms, purge every {}, audit {}",
        r.delivered,
        r.redelivered,
        r.objects,
        r.elapsed_s,
        r.delivered as f64 / r.elapsed_s.max(1e-9),
        r.cpu_s.map_or(String::new(), |c| format!(", {c:.1} s CPU")),
        r.retention_ms,
        r.purge_interval_ms
            .map_or_else(|| "never".to_owned(), |ms| format!("{ms} ms")),
        if r.audit { "on" } else { "off" },
    )?;
    if let Some(store) = &r.store {
        writeln!(
            out,
            "store: {store} (the default working set and identity cache)"
        )?;
    }
    writeln!(
        out,
        "decisions: {} applied, {} stale, {} duplicate, {} redelivered after their identity \
         expired (stale or equal), {} other",
        r.applied, r.stale, r.duplicate, r.expired_redeliveries, r.other
    )?;
    writeln!(
        out,
        "rss: {:.1} MB before, {:.1} MB after warm-up, {:.1} MB at the end ({:+.1} %), \
         {:.1} MB highest after warm-up",
        mb(r.rss_before_bytes),
        mb(r.rss_warm_bytes),
        mb(r.rss_end_bytes),
        r.growth_after_warm_pct,
        mb(r.rss_max_after_warm_bytes)
    )?;
    let step = r.samples.len().div_ceil(20).max(1);
    for s in r.samples.iter().step_by(step) {
        writeln!(
            out,
            "  {:>7.1} s {:>10} delivered {:>8.1} MB",
            s.at_ms as f64 / 1000.0,
            s.delivered,
            mb(s.rss_bytes)
        )?;
    }
    match r.failures.as_slice() {
        [] => writeln!(out, "check: ok"),
        failures => writeln!(out, "check: FAILED: {}", failures.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapshot_receiver_loadgen::{CommitMs, CpuSplit, StoreReport, WaitShare};

    fn store_report(written: Option<u64>, kept: Option<u64>) -> StoreReport {
        let per = |b: Option<u64>| b.map(|b| b as f64 / 4000.0);
        StoreReport {
            commits: 100,
            deliveries_per_commit: snapshot_receiver::store::GroupSizes {
                mean: 40.0,
                p50: 38,
                max: 64,
            },
            commit_ms: CommitMs {
                p50: 1.5,
                p99: 4.25,
            },
            fsync_per_s: Some(500.0),
            fsync_probe_error: None,
            commit_fill: 0.625,
            conflicts: 0,
            failures: 0,
            writes_one_by_one: 3,
            cpu_us_per_delivery: CpuSplit::default(),
            waiting_share: WaitShare::default(),
            peak_rss_before_check_bytes: None,
            memory_budget_bytes: 64 << 20,
            working_set_budget_bytes: 20 << 20,
            store_engine_bytes: 12 << 20,
            objects_loaded: None,
            identity_reads: None,
            identities_spared: None,
            written_bytes: written,
            written_bytes_per_delivery: per(written),
            kept_bytes: kept,
            kept_bytes_per_delivery: per(kept),
        }
    }

    #[test]
    fn the_store_report_opens_with_the_commits_and_ends_with_the_bytes_per_delivery() {
        let mut out = Vec::new();
        write_store_report(
            &mut out,
            &store_report(Some(9_932_000), Some(2_752_512)),
            64,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text.lines().next(),
            Some(
                "store: 100 commits, deliveries per commit mean 40.0 (p50 38, max 64; 62 % of the 64 \
                 in flight), commit p50 1.50 ms, p99 4.25 ms, 0 conflicts, 0 failed, 3 writes one by \
                 one; fsync probe before the run: 500 fsyncs/s"
            ),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l
                    == "  memory budget: 64.0 MiB (working set 20.0 MiB, store engine 12.0 MiB)"),
            "{text}"
        );
        assert_eq!(
            text.lines().last(),
            Some("  disk: written 2483 B per delivery (9.5 MiB in all), kept 688 B per delivery (2.6 MiB on disk)"),
            "{text}"
        );
        assert_eq!(
            disk_line(&store_report(None, None)),
            "disk: written unknown, kept unknown"
        );
    }
}
