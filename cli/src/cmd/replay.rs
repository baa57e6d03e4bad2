//! `replay`: a fixture through a receiver, printed as a text table or as the
//! JSON Lines of docs/CONTRACT.md §7.

use crate::error::InputError;
use crate::options::{EqualVersions, Format, LimitArgs, ProfileArgs, RetentionArgs};
use crate::terminal::shown;
use snapshot_receiver::{
    format_rfc3339, parse_rfc3339,
    replay::{replay_with, Phase, ReplayLine, ReplayOptions},
    Decision, MetricsSnapshot,
};
use std::io::Write;
use std::path::PathBuf;

/// The arguments of `replay`.
#[derive(clap::Args)]
pub(crate) struct ReplayArgs {
    /// The fixture file, for example fixtures/B62-15-events.json.
    fixture: PathBuf,
    /// Output format: a readable table, or JSON Lines (docs/CONTRACT.md §7 field names).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// The replay clock (RFC 3339 UTC); default: the fixture's latest
    /// authority `as_of` or `transport.received_at`, else the wall clock
    /// (with a note on stderr when that makes deliveries older than the
    /// retention window).
    #[arg(long)]
    now: Option<String>,
    /// Record every step durably before acknowledging it: `sqlite:PATH`,
    /// `postgres://USER@HOST:PORT/DB` or `lsm:DIR` (feature `lsm`).
    /// Default: in memory. On an existing store the receiver resumes where
    /// it stopped.
    #[arg(long, value_name = "LOCATION", value_parser = crate::options::store_location)]
    store: Option<String>,
    /// PostgreSQL only: the schema for the tables (created if absent).
    #[arg(long, value_name = "NAME", requires = "store")]
    store_schema: Option<String>,
    #[command(flatten)]
    profile: ProfileArgs,
    /// An equal version with a different state: `conflict` (docs/CONTRACT.md §3, pause)
    /// or `ignore` (recorded as stale, the reducer's rule).
    #[arg(long, value_enum, default_value_t = EqualVersions::Conflict)]
    equal_versions: EqualVersions,
    /// Print each object's history of accepted snapshots (the effects of
    /// this run) at the end.
    #[arg(long)]
    history: bool,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    retention: RetentionArgs,
}

/// Runs `replay`: the clock line, the table (or JSON Lines), the counters.
pub(crate) fn run(args: ReplayArgs) -> anyhow::Result<()> {
    let ReplayArgs {
        fixture,
        format,
        now,
        store,
        store_schema,
        profile,
        equal_versions,
        history,
        limits,
        retention,
    } = args;
    let profile = profile.resolve()?;
    let records = retention.resolve()?;
    let now = match now {
        None => None,
        Some(text) => Some(
            parse_rfc3339(&text)
                .ok_or_else(|| InputError::new(format!("--now: not an RFC 3339 time: {text:?}")))?,
        ),
    };
    let fixture = super::load_fixture(&fixture)?;
    let runtime = super::runtime()?;
    let options = ReplayOptions {
        now,
        store,
        schema: store_schema,
        profile,
        equal_versions: equal_versions.into(),
        history,
        limits: limits.into(),
        records,
    };
    let mut out = std::io::stdout().lock();
    let mut text = TextTable::default();
    // The clock line comes with the first recorded line, so that a
    // store that cannot be opened prints nothing on stdout.
    let mut clock_line = match format {
        Format::Text => now
            .or_else(|| fixture.default_now())
            .map(|at| format!("replay clock: {}", format_rfc3339(at))),
        Format::Json => None,
    };
    let mut failure: Option<std::io::Error> = None;
    let result = runtime.block_on(replay_with(&fixture, options, |line| {
        if failure.is_some() {
            return;
        }
        // Each line is printed (and flushed) as soon as it is recorded; in
        // text, the table's rows wait for the end of the table.
        if let Some(clock) = clock_line.take() {
            if let Err(e) = writeln!(out, "{clock}") {
                failure = Some(e);
                return;
            }
        }
        let written = match format {
            Format::Json => serde_json::to_writer(&mut out, line)
                .map_err(std::io::Error::from)
                .and_then(|()| writeln!(out)),
            Format::Text => text.line(&mut out, line),
        };
        failure = written.and_then(|()| out.flush()).err();
    }));
    if let Some(e) = failure {
        return Err(e.into());
    }
    // A replay that stopped before its final line still shows the rows it
    // recorded.
    text.finish(&mut out)?;
    // The receiver could not be built: an invalid initial state (exit 2),
    // a store that cannot be opened (its own exit code).
    let end = result.map_err(crate::error::receiver_error)?;
    // Counters only in text: the JSON Lines stay exactly docs/CONTRACT.md §7.
    if let Format::Text = format {
        write_counters(&mut out, &end.counters)?;
    }
    if let Some(note) = end.clock.note() {
        eprintln!("{note}");
    }
    Ok(())
}

/// A field of the text report: `-` when absent, else its text escaped for
/// a terminal ([`crate::terminal::escape`]: ids and states are the
/// client's).
fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(
        || "-".to_owned(),
        |v| crate::terminal::escape(&v.to_string()).into_owned(),
    )
}

/// One column of the delivery table (the last one, the state after the
/// step, is not padded).
struct Column {
    /// The heading.
    header: &'static str,
    /// The narrowest the column is: what the reference fixture needs, so a
    /// table of short ids and decisions looks the same on every run.
    min: usize,
    /// Numbers are right-aligned, words left-aligned.
    right: bool,
}

/// The padded columns, in order; `state after` follows them.
const COLUMNS: [Column; 8] = [
    Column {
        header: "#",
        min: 3,
        right: true,
    },
    Column {
        header: "event",
        min: 12,
        right: false,
    },
    Column {
        header: "object",
        min: 12,
        right: false,
    },
    Column {
        header: "decision",
        min: 34,
        right: false,
    },
    Column {
        header: "ver",
        min: 4,
        right: true,
    },
    Column {
        header: "paused",
        min: 6,
        right: false,
    },
    Column {
        header: "repl",
        min: 5,
        right: false,
    },
    Column {
        header: "ack",
        min: 11,
        right: false,
    },
];

/// One delivery or reconciliation line of the table.
struct Row {
    /// The section it is printed in.
    phase: Phase,
    /// The padded cells, one per [`COLUMNS`] entry.
    cells: [String; 8],
    /// The state after the step, the last column.
    state: String,
    /// What the acknowledgement means, printed under the row (deliveries only).
    ack_meaning: Option<String>,
    /// What is wrong with a malformed body, printed under the row.
    detail: Option<String>,
}

impl Row {
    fn of(line: &ReplayLine) -> Self {
        Self {
            phase: line.phase,
            cells: [
                line.step.to_string(),
                opt(&line.event_id),
                opt(&line.object_id),
                decision_cell(line),
                opt(&line.version),
                opt(&line.paused),
                line.replacement
                    .map_or("-", |r| if r { "yes" } else { "no" })
                    .to_owned(),
                line.ack.map_or("-", |a| a.as_str()).to_owned(),
            ],
            state: opt(&line.state),
            ack_meaning: line.ack_meaning.clone(),
            detail: line.detail.clone(),
        }
    }
}

/// The decision column: the decision with its reason or conflict kind, and
/// a duplicate worded as [`Decision`]'s `Display` words it.
fn decision_cell(line: &ReplayLine) -> String {
    if let Some(original) = &line.original_decision {
        return Decision::duplicate_of(original).to_string();
    }
    let decision = line.decision.unwrap_or("-");
    match line.reason.as_deref().or(line.conflict) {
        Some(detail) => format!("{decision} ({})", shown(detail)),
        None => decision.to_owned(),
    }
}

/// Prints the text report: the delivery and reconciliation sections as one
/// table, then the final section. The table's rows are kept until it ends
/// (the final line, or [`TextTable::finish`]), so that every column is as
/// wide as its widest cell and stays aligned for long ids and decisions.
#[derive(Default)]
struct TextTable {
    /// The rows not printed yet.
    rows: Vec<Row>,
    /// The section printed last, to head each section once.
    printed: Option<Phase>,
}

impl TextTable {
    fn line(&mut self, out: &mut impl Write, line: &ReplayLine) -> std::io::Result<()> {
        if line.phase != Phase::Final {
            self.rows.push(Row::of(line));
            return Ok(());
        }
        self.finish(out)?;
        writeln!(out, "\n== final ==")?;
        write_final(out, line)
    }

    /// Prints the rows kept so far, each section under its heading.
    fn finish(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        let mut widths = COLUMNS.map(|c| c.min.max(c.header.chars().count()));
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(&row.cells) {
                *width = (*width).max(cell.chars().count());
            }
        }
        for row in self.rows.drain(..) {
            if self.printed != Some(row.phase) {
                self.printed = Some(row.phase);
                if row.phase == Phase::Delivery {
                    writeln!(out, "\n== deliveries (arrival order) ==")?;
                    let headers = COLUMNS.iter().map(|c| c.header);
                    write_row(out, &widths, headers, "state after")?;
                } else {
                    writeln!(out, "\n== reconciliation ==")?;
                }
            }
            write_row(
                out,
                &widths,
                row.cells.iter().map(String::as_str),
                &row.state,
            )?;
            if let Some(detail) = &row.detail {
                writeln!(out, "{:>5}malformed: {}", "", shown(detail))?;
            }
            if let Some(meaning) = &row.ack_meaning {
                writeln!(out, "{:>5}ack means: {meaning}", "")?;
            }
        }
        Ok(())
    }
}

/// One table line: the cells padded to `widths` (two spaces after the step
/// number, one between the others), then `last` unpadded.
fn write_row<'a>(
    out: &mut impl Write,
    widths: &[usize; 8],
    cells: impl Iterator<Item = &'a str>,
    last: &str,
) -> std::io::Result<()> {
    let mut line = String::new();
    for (i, ((cell, column), &width)) in cells.zip(&COLUMNS).zip(widths).enumerate() {
        let gap = if i == 0 { "  " } else { " " };
        if column.right {
            line.push_str(&format!("{cell:>width$}{gap}"));
        } else {
            line.push_str(&format!("{cell:<width$}{gap}"));
        }
    }
    writeln!(out, "{line}{last}")
}

fn write_final(out: &mut impl Write, line: &ReplayLine) -> std::io::Result<()> {
    for (id, card) in line.cards.iter().flatten() {
        let state = if card.deleted {
            "deleted (tombstone)".to_owned()
        } else {
            crate::terminal::escape(&card.state.to_string()).into_owned()
        };
        let paused = if card.paused { " (paused)" } else { "" };
        writeln!(out, "{} v{} {state}{paused}", shown(id), card.version)?;
    }
    if let Some(r) = line.replacements {
        writeln!(
            out,
            "replacements (this run): {} event + {} authority = {}",
            r.event,
            r.authority,
            r.event + r.authority
        )?;
    }
    if let Some(history) = &line.history {
        writeln!(
            out,
            "history (this run's accepted snapshots; one effect each):"
        )?;
        for (id, entries) in history {
            for h in entries {
                let forced = h.forced_over.as_ref().map_or_else(String::new, |over| {
                    format!(
                        ", forced over v{} {}",
                        over.version,
                        shown(&over.state.to_string())
                    )
                });
                writeln!(
                    out,
                    "  {} v{} {} <- {}{forced} (effect #{})",
                    shown(id),
                    h.version,
                    shown(&h.state.to_string()),
                    shown(&h.cause.to_string()),
                    h.seq
                )?;
            }
        }
    }
    let unresolved = line.unresolved.as_deref().unwrap_or_default();
    if unresolved.is_empty() {
        writeln!(out, "unresolved: none")?;
    } else {
        writeln!(out, "unresolved inputs:")?;
        for u in unresolved {
            let by = u
                .superseded_by
                .map_or_else(String::new, |v| format!(" by authority v{v}"));
            writeln!(
                out,
                "  {} on {}: {} ({}{by})",
                opt(&u.event_id),
                opt(&u.object_id),
                u.reason,
                u.status
            )?;
        }
    }
    Ok(())
}

/// The receiver's counters after the replay, one `key value` per line, every
/// counter (zeros included) so the list has the same shape on every run.
fn write_counters(out: &mut impl Write, counters: &MetricsSnapshot) -> std::io::Result<()> {
    writeln!(out, "\n== counters (this run) ==")?;
    let width = counters.keys().map(String::len).max().unwrap_or(0);
    for (key, value) in counters {
        writeln!(out, "{key:<width$} {value}")?;
    }
    Ok(())
}
