//! The replay of a [`Fixture`] through a [`Receiver`], producing the report
//! of docs/CONTRACT.md §7 that the CLI prints ([`replay`], [`replay_with`],
//! [`reconcile_lines`]), and the serde forms of its lines.

use crate::core::{DecisionFields, LineFields, ReplacementCounts, StateJson, UnresolvedInput};
use crate::fixture::Fixture;
use crate::{AuthoritativeSnapshot, ReconcileError};
use crate::{BuildError, Receiver};
use crate::{Clock, ManualClock};
use crate::{Config, EqualVersionPolicy, Limits, MetricsSnapshot, Profile, Receipt};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

/// Which part of a replay a line belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// One line per delivery, in arrival order.
    Delivery,
    /// One line per authority snapshot and per held event it re-evaluated.
    Reconcile,
    /// The final line: state, counts and unresolved inputs.
    Final,
}

/// One object on the final line: `{"version": n, "state": {...}, "paused":
/// bool}`, plus `"deleted": true` for a tombstone (state `null`). (Any
/// profile's objects, not only cards.)
#[derive(Clone, Debug, Serialize)]
pub struct FinalObject {
    /// Version (u64).
    pub version: u64,
    /// State snapshot.
    pub state: StateJson,
    /// Paused flag.
    pub paused: bool,
    /// Whether the object is a tombstone (deleted at `version`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
}

/// The final line's replacement counts: `{"event": n, "authority": n}`
/// (this run's [`ReplacementCounts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ReplacementsLine {
    /// Event-driven state replacements.
    pub event: u64,
    /// Authoritative replacements (introductions included).
    pub authority: u64,
}

impl From<ReplacementCounts> for ReplacementsLine {
    fn from(c: ReplacementCounts) -> Self {
        Self {
            event: c.event_replacements,
            authority: c.authority_replacements,
        }
    }
}

/// One accepted snapshot in a replay's history (`--history`).
#[derive(Clone, Debug, Serialize)]
pub struct HistoryLine {
    /// Sequence number of the step (the effect's cursor).
    pub seq: u64,
    /// The new version.
    pub version: u64,
    /// The new state (`null`: deleted).
    pub state: StateJson,
    /// The event applied, or `authority`.
    pub cause: String,
    /// For an authority forced past a newer object: the version and state
    /// it replaced (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forced_over: Option<OverriddenLine>,
}

/// What a forced authority replaced, on a history line:
/// `{"version": n, "state": ...}`.
#[derive(Clone, Debug, Serialize)]
pub struct OverriddenLine {
    /// The object's version before the forced authority.
    pub version: u64,
    /// Its state then (`null` for a tombstone).
    pub state: StateJson,
}

/// A named unresolved input on the final line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnresolvedLine {
    /// Event identity, if the body had one.
    pub event_id: Option<Arc<str>>,
    /// The object it named, if any.
    pub object_id: Option<Arc<str>>,
    /// Hold reason or conflict kind (for example `missing_version`, `event_variant`).
    pub reason: &'static str,
    /// `superseded` (an authority replaced the object's state) or `held`.
    pub status: &'static str,
    /// The authority version that superseded it, if any.
    pub superseded_by: Option<u64>,
}

impl From<&UnresolvedInput> for UnresolvedLine {
    fn from(u: &UnresolvedInput) -> Self {
        Self {
            event_id: u.event_id.clone(),
            object_id: u.object_id.clone(),
            reason: u.reason(),
            status: if u.superseded_by.is_some() {
                "superseded"
            } else {
                "held"
            },
            superseded_by: u.superseded_by,
        }
    }
}

/// One line of the replay report, with the field names of docs/CONTRACT.md §7:
/// `step`, `phase`, then the [`LineFields`] (the same form a serialized
/// [`Receipt`] or [`crate::ReconcileReport`] has). Fields that do not apply
/// are `None` (serialized as `null`; the final line's extra fields are left
/// out on other lines). A line dereferences to its [`LineFields`], so
/// `line.decision` or `line.version` read them directly.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayLine {
    /// 1-based line number.
    pub step: usize,
    /// Which part of the replay.
    pub phase: Phase,
    /// Event and object identity, decision, the object after the step,
    /// whether it replaced the state, and the acknowledgement.
    #[serde(flatten)]
    pub fields: LineFields,
    /// The acknowledgement's meaning in words (deliveries only).
    #[serde(skip)]
    pub ack_meaning: Option<String>,
    /// A malformed delivery only: what is wrong with the body and where
    /// ([`crate::core::Delivery::malformed_reason`]), as `detail` (left out on
    /// every other line).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Final line: object id → version, state, paused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cards: Option<BTreeMap<Arc<str>, FinalObject>>,
    /// Final line: replacement counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replacements: Option<ReplacementsLine>,
    /// Final line: what `replacements`, `history` and the counters count:
    /// always `this_run` (the steps of this replay, not a durable store's
    /// earlier runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counts: Option<&'static str>,
    /// Final line: named unresolved inputs, in arrival order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unresolved: Option<Vec<UnresolvedLine>>,
    /// Final line, with `--history`: each object's accepted snapshots.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<BTreeMap<Arc<str>, Vec<HistoryLine>>>,
}

impl std::ops::Deref for ReplayLine {
    type Target = LineFields;

    fn deref(&self) -> &LineFields {
        &self.fields
    }
}

impl std::ops::DerefMut for ReplayLine {
    fn deref_mut(&mut self) -> &mut LineFields {
        &mut self.fields
    }
}

impl ReplayLine {
    fn new(step: usize, phase: Phase, fields: LineFields) -> Self {
        Self {
            step,
            phase,
            fields,
            ack_meaning: None,
            detail: None,
            cards: None,
            replacements: None,
            counts: None,
            unresolved: None,
            history: None,
        }
    }

    fn from_receipt(step: usize, receipt: &Receipt) -> Self {
        let mut line = Self::new(step, Phase::Delivery, LineFields::from(receipt));
        line.ack_meaning = Some(receipt.ack_meaning());
        line
    }
}

/// The whole replay: every line in order; the last one is the final line.
#[derive(Clone, Debug)]
pub struct ReplayReport {
    /// The lines, in order.
    pub lines: Vec<ReplayLine>,
    /// The receiver's counters at the end of the replay
    /// ([`crate::Receiver::metrics`]); not part of the docs/CONTRACT.md §7 lines.
    pub counters: MetricsSnapshot,
    /// Where the replay clock came from, and what that did to the deliveries.
    pub clock: ReplayClock,
}

/// Where a replay's clock stood (docs/CONTRACT.md §6), and how many
/// deliveries it made look older than the retention window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayClock {
    /// Where the clock's starting point came from.
    pub source: ClockSource,
    /// The retention window the deliveries were judged against.
    pub retention: std::time::Duration,
    /// Deliveries that count as older than `retention` before the clock at
    /// their arrival (docs/CONTRACT.md §5: an `occurred_at` more than the
    /// window back, or one that is not RFC 3339), counted only when the
    /// clock is the wall clock ([`ClockSource::WallClock`]; 0 otherwise).
    pub older_than_retention: usize,
    /// Deliveries replayed.
    pub deliveries: usize,
}

/// Where a replay clock's starting point came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockSource {
    /// Given by the caller (`--now`).
    Given,
    /// The fixture's latest authority `as_of` or `transport.received_at`.
    Fixture,
    /// Neither: the system time when the replay started.
    WallClock,
}

impl ReplayClock {
    /// The one-line note for a replay whose clock fell back to the wall
    /// clock while some delivery is older than the retention window (its
    /// decisions then depend on the day it runs: a delivery that would apply
    /// or conflict is held as `expired_identity`); `None` otherwise.
    pub fn note(&self) -> Option<String> {
        if self.source != ClockSource::WallClock || self.older_than_retention == 0 {
            return None;
        }
        Some(format!(
            "note: no --now, no transport.received_at and no authority as_of, so the replay \
             clock is the wall clock, and {} of {} deliveries occurred more than {} before it \
             (held as expired_identity where they would apply or conflict); pass --now RFC3339 \
             to replay as of the fixture's time",
            self.older_than_retention,
            self.deliveries,
            window_text(self.retention)
        ))
    }
}

impl ReplayReport {
    /// The final line.
    pub fn final_line(&self) -> Option<&ReplayLine> {
        self.lines.last().filter(|l| l.phase == Phase::Final)
    }
}

/// How to run a replay.
#[derive(Default)]
pub struct ReplayOptions {
    /// The replay clock; default [`Fixture::default_now`], else the system
    /// time ([`ClockSource::WallClock`], which [`ReplayClock::note`] points
    /// out).
    pub now: Option<SystemTime>,
    /// A durable store location (`sqlite:PATH`, `postgres://...`); default in memory.
    pub store: Option<String>,
    /// For PostgreSQL: the schema the tables live in.
    pub schema: Option<String>,
    /// The envelope profile; default the fixture's, else `card`.
    pub profile: Option<Profile>,
    /// What an equal version with a different state means.
    pub equal_versions: EqualVersionPolicy,
    /// Put each object's history on the final line.
    pub history: bool,
    /// Size and queue limits (default [`Limits::default`]).
    pub limits: Limits,
    /// How long a durable store keeps audit and history rows (default
    /// [`crate::store::Retention::default`], 7 days each).
    pub records: crate::store::Retention,
}

/// Replays a fixture through a fresh [`Receiver`] in memory: every delivery in
/// arrival order, then every authority snapshot, then the final state.
///
/// The clock is a [`ManualClock`] standing at `now` (default:
/// [`Fixture::default_now`], else the system time), moved to each delivery's
/// `transport.received_at` when it has one.
///
/// # Errors
/// [`BuildError`] when the fixture's initial state is invalid or there is no
/// tokio runtime.
pub async fn replay(
    fixture: &Fixture,
    now: Option<SystemTime>,
) -> Result<ReplayReport, BuildError> {
    let mut lines = Vec::new();
    let options = ReplayOptions {
        now,
        ..ReplayOptions::default()
    };
    let end = replay_with(fixture, options, |line| lines.push(line.clone())).await?;
    Ok(ReplayReport {
        lines,
        counters: end.counters,
        clock: end.clock,
    })
}

/// Applies one authoritative snapshot through `receiver`
/// ([`Receiver::reconcile`], docs/CONTRACT.md §4) and returns its reconcile
/// lines (§7), numbered from `first_step`: the `authority` line (reason
/// `forced over version N` for a forced one) and one line per held event it
/// decided again or left unresolved, or one `authority_refused` line whose
/// reason names both versions and whose object fields show the object as
/// it stays. The same lines `replay` prints for a fixture's `authority`.
/// The error of a refused or failed snapshot comes back too, so that a
/// caller can tell a refusal ([`ReconcileError::AuthorityOlder`]) from a
/// store that could not record it ([`ReconcileError::StoreFailed`]).
pub async fn reconcile_lines(
    receiver: &Receiver,
    snapshot: &AuthoritativeSnapshot,
    first_step: usize,
) -> (Vec<ReplayLine>, Option<ReconcileError>) {
    let mut lines = Vec::new();
    match receiver.reconcile(snapshot.clone()).await {
        Ok(report) => {
            lines.push(ReplayLine::new(
                first_step,
                Phase::Reconcile,
                LineFields::authority(&report),
            ));
            for r in &report.reevaluated {
                let fields = LineFields::reevaluation(Some(snapshot.object_id.clone()), r);
                lines.push(ReplayLine::new(
                    first_step + lines.len(),
                    Phase::Reconcile,
                    fields,
                ));
            }
        }
        Err(e) => {
            let mut fields = LineFields {
                object_id: Some(snapshot.object_id.clone()),
                replacement: Some(false),
                ..LineFields::of_decision(DecisionFields {
                    decision: Some("authority_refused"),
                    reason: Some(crate::core::error_chain(&e)),
                    ..DecisionFields::default()
                })
            };
            if let ReconcileError::AuthorityOlder { .. } = e {
                let object = receiver.object(&snapshot.object_id).await;
                fields = fields.with_object(object.as_ref());
            }
            lines.push(ReplayLine::new(first_step, Phase::Reconcile, fields));
            return (lines, Some(e));
        }
    }
    (lines, None)
}

/// A retention window in words: whole days, hours, minutes or seconds
/// (`24 h`, `90 s`).
fn window_text(window: std::time::Duration) -> String {
    let secs = window.as_secs();
    match secs {
        0 => format!("{} ms", window.as_millis()),
        s if s % 86_400 == 0 && s >= 7 * 86_400 => format!("{} days", s / 86_400),
        s if s % 3600 == 0 => format!("{} h", s / 3600),
        s if s % 60 == 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

/// What a replay ends with besides its lines.
#[derive(Clone, Debug)]
pub struct ReplayEnd {
    /// The receiver's counters at the end ([`crate::Receiver::metrics`]):
    /// this run's, like every count of the final line.
    pub counters: MetricsSnapshot,
    /// Where the replay clock came from, and what that did to the deliveries.
    pub clock: ReplayClock,
}

/// [`replay`] with options, handing each line to `sink` as soon as it is
/// decided (so a caller can print progress, and a crash loses nothing that
/// was printed: with a durable store a line is printed only after its commit).
/// Returns the receiver's counters at the end ([`crate::Receiver::metrics`])
/// and where the clock came from ([`ReplayClock::note`] says when that
/// deserves a note).
///
/// Every count the final line carries (`replacements`, `history`) and the
/// counters are this run's: on a durable store with earlier runs, those
/// runs' replacements are in its audit trail and history
/// ([`crate::Receiver::stored_effects_since`]), not in this report.
///
/// # Errors
/// [`BuildError`] when the receiver cannot be built (invalid initial state,
/// no tokio runtime, a store that cannot be opened).
pub async fn replay_with(
    fixture: &Fixture,
    options: ReplayOptions,
    mut sink: impl FnMut(&ReplayLine),
) -> Result<ReplayEnd, BuildError> {
    let (source, start) = match (options.now, fixture.default_now()) {
        (Some(now), _) => (ClockSource::Given, now),
        (None, Some(now)) => (ClockSource::Fixture, now),
        (None, None) => (ClockSource::WallClock, SystemTime::now()),
    };
    let clock = Arc::new(ManualClock::new(start));
    let config = Config {
        profile: options
            .profile
            .or_else(|| fixture.profile.clone())
            .unwrap_or_default(),
        equal_versions: options.equal_versions,
        limits: options.limits,
        // Fixtures are small: the replay keeps every record in memory.
        trail_capacity: usize::MAX,
        ..Config::default()
    };
    let mut builder = Receiver::builder()
        .config(config)
        .clock(clock.clone() as Arc<dyn Clock>)
        .audit_retention(options.records.audit)
        .history_retention(options.records.history)
        .purge_batch(options.records.batch);
    for (id, version, state) in &fixture.initial_state {
        builder = builder.object(id, *version, state);
    }
    if let Some(location) = &options.store {
        builder = builder.store(location);
    }
    if let Some(schema) = &options.schema {
        builder = builder.store_schema(schema);
    }
    let receiver = builder.build()?;
    let retention = receiver.context().config().retention;
    let mut clock_report = ReplayClock {
        source,
        retention,
        older_than_retention: 0,
        deliveries: fixture.deliveries.len(),
    };
    let mut step = 0;
    let mut next = || {
        step += 1;
        step
    };
    for d in &fixture.deliveries {
        let at = d.received_at.unwrap_or(start);
        clock.set(at);
        let parsed = receiver.context().parser().parse(&d.body);
        if source == ClockSource::WallClock {
            let old = parsed.as_ref().is_ok_and(|p| p.older_than(at, retention));
            clock_report.older_than_retention += usize::from(old);
        }
        let receipt = receiver.deliver(&d.body).await;
        let mut line = ReplayLine::from_receipt(next(), &receipt);
        line.detail = parsed
            .ok()
            .and_then(|p| p.malformed_reason().map(str::to_owned));
        sink(&line);
    }
    clock.set(start);
    for snapshot in &fixture.authority {
        let (lines, _) = reconcile_lines(&receiver, snapshot, next()).await;
        for line in &lines {
            sink(line);
        }
        for _ in 1..lines.len() {
            next();
        }
    }
    let mut last = ReplayLine::new(next(), Phase::Final, LineFields::default());
    last.cards = Some(
        receiver
            .objects()
            .await
            .into_iter()
            .map(|o| {
                let card = FinalObject {
                    version: o.version,
                    deleted: o.state.is_null(),
                    state: o.state,
                    paused: o.paused,
                };
                (o.object_id, card)
            })
            .collect(),
    );
    last.replacements = Some(receiver.counters().await.into());
    last.counts = Some("this_run");
    last.unresolved = Some(
        receiver
            .unresolved()
            .await
            .iter()
            .map(UnresolvedLine::from)
            .collect(),
    );
    if options.history {
        let mut history: BTreeMap<Arc<str>, Vec<HistoryLine>> = BTreeMap::new();
        // Nothing is evicted with an unbounded trail. The history by step
        // number, read once the replay is over: no cursor that could pass
        // an effect not yet visible.
        #[allow(deprecated)]
        let effects = receiver.effects_since(0).await.unwrap_or_default();
        for r in effects {
            history
                .entry(r.object_id.clone())
                .or_default()
                .push(HistoryLine {
                    seq: r.seq,
                    version: r.version,
                    state: r.state,
                    cause: r.cause.wire().to_owned(),
                    forced_over: r.forced.map(|over| OverriddenLine {
                        version: over.version,
                        state: over.state,
                    }),
                });
        }
        last.history = Some(history);
    }
    sink(&last);
    let counters = receiver.metrics();
    receiver.shutdown().await;
    Ok(ReplayEnd {
        counters,
        clock: clock_report,
    })
}
