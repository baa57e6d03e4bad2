//! Hostile JSON (issue 7): deep, wide and long documents, broken encodings,
//! surrogates, NUL bytes, a BOM, trailing garbage and empty bodies. Each gets
//! a named outcome with an exact assertion, and after each one the receiver
//! still decides a normal delivery and has lost nothing it recorded before.

use crate::common::{body, t, T};
use crate::limits::refused;
use snapshot_receiver::{
    Ack, AuditEntry, ConflictKind, Decision, HoldReason, Limits, ManualClock, Outcome, Receipt,
    Receiver, RejectReason, Verdict,
};
use std::sync::Arc;

/// A receiver with one object per topic, and a counter of the normal
/// deliveries used to prove it still works.
struct Harness {
    rx: Receiver,
    /// How many normal deliveries (`ok-1`, `ok-2`, ...) card-7 has applied.
    normal: u64,
}

impl Harness {
    fn new(limits: Limits) -> Self {
        let rx = Receiver::builder()
            .clock(Arc::new(ManualClock::new(t())))
            .limits(limits)
            .object("card-7", 10, r#"{"n":0}"#)
            .object("card-n", 1, r#"{"n":0}"#)
            .object("card-z", 1, r#"{"s":""}"#)
            .object("card-w", 1, "{}")
            .build()
            .unwrap();
        Self { rx, normal: 0 }
    }

    /// A normal delivery is still decided, and every earlier normal delivery
    /// is still recorded with its decision.
    async fn still_works(&mut self) {
        self.normal += 1;
        let n = self.normal;
        let version = (100 + n).to_string();
        let b = body(
            &format!("ok-{n}"),
            "card-7",
            Some(&version),
            T,
            &format!("{{\"n\":{n}}}"),
        );
        let r = self.rx.deliver(b.as_bytes()).await;
        assert_eq!(r.decision(), Some(Decision::Applied), "ok-{n}");
        for k in 1..=n {
            let record = self.rx.context().registry().get(&format!("ok-{k}"));
            assert_eq!(record.map(|r| r.decision), Some(Verdict::Applied), "ok-{k}");
        }
        let card = self.rx.object("card-7").await.unwrap();
        assert_eq!((card.version, card.paused), (100 + n, false));
    }

    /// Expects a recorded decision.
    async fn decided(&mut self, bytes: &[u8], decision: Decision) -> Receipt {
        let r = self.rx.deliver(bytes).await;
        assert_eq!(r.decision(), Some(decision));
        assert_eq!(r.ack(), Ack::Acknowledge);
        self.still_works().await;
        r
    }

    /// Expects a refusal over a limit that records nothing.
    async fn rejected(&mut self, bytes: &[u8], why: RejectReason) {
        refused(&self.rx, bytes, Outcome::Rejected(why)).await;
        self.still_works().await;
    }

    /// Expects `held` / `malformed`: acknowledged, not registered (no
    /// trustworthy identity), the exact bytes and the error kept in the audit
    /// trail. A second delivery of the same bytes is a duplicate of that
    /// hold (recognised by the digest of the bytes), held no second time.
    async fn malformed(&mut self, bytes: &[u8], error: &str) {
        let identities = self.rx.context().registry().len();
        let r = self.rx.deliver(bytes).await;
        assert_eq!(r.decision(), Some(Decision::Held(HoldReason::Malformed)));
        assert_eq!(r.ack(), Ack::Acknowledge);
        let last = self.rx.audit().await.pop().unwrap();
        match last.entry {
            AuditEntry::Malformed {
                bytes: kept,
                error: why,
            } => {
                assert_eq!(&*kept, bytes);
                assert_eq!(why, error);
            }
            other => panic!("expected a malformed record, got {other:?}"),
        }
        let held = self.rx.unresolved().await.len();
        let r = self.rx.deliver(bytes).await;
        let original = Verdict::Held(HoldReason::Malformed);
        assert_eq!(r.decision(), Some(Decision::Duplicate { original }));
        assert_eq!(r.ack(), Ack::Acknowledge);
        assert_eq!(self.rx.unresolved().await.len(), held);
        assert_eq!(self.rx.context().registry().len(), identities);
        self.still_works().await;
    }
}

fn deep(levels: usize) -> String {
    format!("{}{}", "[".repeat(levels), "]".repeat(levels))
}

#[tokio::test]
async fn ten_thousand_levels_deep_is_rejected_too_deep() {
    let mut h = Harness::new(Limits::default());
    let too_deep = RejectReason::TooDeep { limit: 64 };
    let in_state = body("d-1", "card-7", Some("12"), T, &deep(10_000));
    h.rejected(in_state.as_bytes(), too_deep.clone()).await;
    h.rejected(deep(10_000).as_bytes(), too_deep.clone()).await;
    // Never closed: refused at level 65, before the missing brackets matter.
    let unclosed = "{\"a\":".repeat(10_000);
    h.rejected(unclosed.as_bytes(), too_deep).await;

    // Whatever the configuration says, the parser stops at 1024 levels.
    let mut h = Harness::new(Limits {
        max_depth: usize::MAX,
        ..Limits::default()
    });
    h.rejected(in_state.as_bytes(), RejectReason::TooDeep { limit: 1024 })
        .await;
}

#[tokio::test]
async fn one_megabyte_strings_within_at_and_over_the_body_limit() {
    let mut h = Harness::new(Limits::default());
    let limit = Limits::default().max_body_bytes;
    let with = |id: &str, version: &str, s: &str| {
        body(
            id,
            "card-w",
            Some(version),
            T,
            &format!("{{\"s\":\"{s}\"}}"),
        )
    };
    // 1,000,000 bytes of string: within the 1 MiB limit, applied.
    let within = with("s-1", "2", &"x".repeat(1_000_000));
    assert!(within.len() < limit);
    h.decided(within.as_bytes(), Decision::Applied).await;
    let card = h.rx.object("card-w").await.unwrap();
    assert_eq!(card.state.as_str().len(), 1_000_000 + 8);

    // Exactly at the limit: applied.
    let overhead = with("s-2", "3", "").len();
    let at = with("s-2", "3", &"y".repeat(limit - overhead));
    assert_eq!(at.len(), limit);
    h.decided(at.as_bytes(), Decision::Applied).await;

    // A 1 MiB string: the body is over the limit, rejected.
    let over = with("s-3", "4", &"z".repeat(limit));
    let size = over.len();
    h.rejected(over.as_bytes(), RejectReason::BodyTooLarge { size, limit })
        .await;
    assert!(h.rx.context().registry().get("s-3").is_none());
    assert_eq!(h.rx.object("card-w").await.unwrap().version, 3);

    // ~1 MB of `\u0041` escapes is the same content as the plain letters.
    let escaped = with("s-4", "5", &"\\u0041".repeat(170_000));
    h.decided(escaped.as_bytes(), Decision::Applied).await;
    let plain = with("s-4", "5", &"A".repeat(170_000));
    let original = Verdict::Applied;
    h.decided(plain.as_bytes(), Decision::Duplicate { original })
        .await;
}

fn wide_state(keys: impl Iterator<Item = usize>) -> String {
    let members: Vec<String> = keys.map(|i| format!("\"k{i}\":{i}")).collect();
    format!("{{{}}}", members.join(","))
}

#[tokio::test]
async fn a_hundred_thousand_keys() {
    let state = wide_state(0..100_000);
    let b = body("w-1", "card-w", Some("2"), T, &state);
    // Over the default 1 MiB: rejected.
    let mut h = Harness::new(Limits::default());
    let (size, limit) = (b.len(), Limits::default().max_body_bytes);
    h.rejected(b.as_bytes(), RejectReason::BodyTooLarge { size, limit })
        .await;

    let mut h = Harness::new(Limits {
        max_body_bytes: 4 << 20,
        ..Limits::default()
    });
    h.decided(b.as_bytes(), Decision::Applied).await;
    // The same members in reverse order are the same content.
    let reversed = body(
        "w-1",
        "card-w",
        Some("2"),
        T,
        &wide_state((0..100_000).rev()),
    );
    let original = Verdict::Applied;
    h.decided(reversed.as_bytes(), Decision::Duplicate { original })
        .await;
    // One repeated key among 100,001 makes the body malformed.
    let repeated = state.replace("}", ",\"k50000\":0}");
    let b = body("w-2", "card-w", Some("3"), T, &repeated);
    let at = b.rfind("\"k50000\"").unwrap();
    h.malformed(
        b.as_bytes(),
        &format!("duplicate key \"k50000\" at byte {at}"),
    )
    .await;
    // 100,000 transport keys beside the envelope are not semantic content.
    let extra: Vec<String> = (0..100_000).map(|i| format!("\"x{i}\":{i}")).collect();
    let b = body("w-3", "card-w", Some("3"), T, "{}").replacen(
        '{',
        &format!("{{{},", extra.join(",")),
        1,
    );
    h.decided(b.as_bytes(), Decision::Applied).await;
}

#[tokio::test]
async fn ten_thousand_digit_numbers_are_exact() {
    let mut h = Harness::new(Limits::default());
    let digits = format!("1{}3", "2".repeat(9_998));
    assert_eq!(digits.len(), 10_000);
    let state = |n: &str| format!("{{\"n\":{n}}}");
    let b = body("n-1", "card-n", Some("2"), T, &state(&digits));
    h.decided(b.as_bytes(), Decision::Applied).await;
    let card = h.rx.object("card-n").await.unwrap();
    assert_eq!(card.state.as_str(), state(&digits), "kept exactly");

    // The same value spelled differently: a duplicate.
    let original = Verdict::Applied;
    for same in [format!("{digits}.000"), format!("{digits}0e-1")] {
        let b = body("n-1", "card-n", Some("2"), T, &state(&same));
        h.decided(b.as_bytes(), Decision::Duplicate { original })
            .await;
    }
    // Another event with the same version and value: equal.
    let b = body("n-2", "card-n", Some("2"), T, &state(&digits));
    h.decided(b.as_bytes(), Decision::Equal).await;
    // As a version it is beyond u64: invalid_version.
    let b = body("n-3", "card-7", Some(&digits), T, "{}");
    h.decided(b.as_bytes(), Decision::Held(HoldReason::InvalidVersion))
        .await;
    // An exponent of more than 30 digits is refused by the parser.
    let b = body(
        "n-4",
        "card-n",
        Some("3"),
        T,
        &state(&format!("1e{}", "1".repeat(31))),
    );
    let at = b.find("e1111").unwrap() + 1;
    h.malformed(
        b.as_bytes(),
        &format!("number exponent has more than 30 digits at byte {at}"),
    )
    .await;

    // The last digit changed under the same event id: a variant.
    let last_changed = format!("1{}4", "2".repeat(9_998));
    let b = body("n-1", "card-n", Some("2"), T, &state(&last_changed));
    let conflict = Decision::Conflict(ConflictKind::EventVariant);
    h.decided(b.as_bytes(), conflict).await;
    let first = h.rx.context().registry().get("n-1").unwrap();
    assert_eq!(first.decision, Verdict::Applied, "the first record stays");
    let card = h.rx.object("card-n").await.unwrap();
    assert_eq!((card.version, card.paused), (2, true));
    assert_eq!(card.state.as_str(), state(&digits));
}

#[tokio::test]
async fn invalid_utf8_is_malformed() {
    let mut h = Harness::new(Limits::default());
    let b = body("u-1", "card-z", Some("2"), T, r#"{"s":"@@"}"#);
    let at = b.find("@@").unwrap();
    for bad in [&b"\xff\xfe"[..], b"\xc0\xaf", b"\xed\xa0\x80"] {
        let mut bytes = b.as_bytes().to_vec();
        bytes.splice(at..at + 2, bad.iter().copied());
        h.malformed(&bytes, &format!("invalid UTF-8 at byte {at}"))
            .await;
    }
    // Cut in the middle of a multi-byte character at the very end.
    let mut cut = b.into_bytes();
    cut.extend_from_slice(b"\xe2\x82");
    let at = cut.len() - 2;
    h.malformed(&cut, &format!("invalid UTF-8 at byte {at}"))
        .await;
}

#[tokio::test]
async fn lone_surrogate_escapes_are_malformed_pairs_are_one_character() {
    let mut h = Harness::new(Limits::default());
    let lone = "unpaired UTF-16 surrogate escape";
    for s in [r"\ud800", r"\udc00", r"x\ud800\u0041", r"\udbff\udbff"] {
        let b = body("l-1", "card-z", Some("2"), T, &format!("{{\"s\":\"{s}\"}}"));
        let at = b.find(r"\ud").unwrap();
        h.malformed(b.as_bytes(), &format!("{lone} at byte {at}"))
            .await;
    }
    let b = body(r"l-\ud800", "card-z", Some("2"), T, "{}");
    let at = b.find(r"\ud").unwrap();
    h.malformed(b.as_bytes(), &format!("{lone} at byte {at}"))
        .await;

    // A valid pair is the character it encodes: the raw form is a duplicate.
    let escaped = body("l-2", "card-z", Some("2"), T, r#"{"s":"\ud83d\ude00"}"#);
    h.decided(escaped.as_bytes(), Decision::Applied).await;
    let raw = body("l-2", "card-z", Some("2"), T, "{\"s\":\"\u{1F600}\"}");
    let original = Verdict::Applied;
    h.decided(raw.as_bytes(), Decision::Duplicate { original })
        .await;
}

#[tokio::test]
async fn nul_bytes_raw_are_malformed_escaped_are_content() {
    let mut h = Harness::new(Limits::default());
    let b = body("z-1", "card-z", Some("2"), T, "{\"s\":\"a\0b\"}");
    let at = b.find('\0').unwrap();
    let control = "unescaped control character in string";
    h.malformed(b.as_bytes(), &format!("{control} at byte {at}"))
        .await;
    let ok = body("z-1", "card-z", Some("2"), T, r#"{"s":"ab"}"#);
    let after = format!("{ok}\0");
    let trailing = "unexpected characters after the JSON value";
    h.malformed(
        after.as_bytes(),
        &format!("{trailing} at byte {}", ok.len()),
    )
    .await;
    let before = format!("\0{ok}");
    h.malformed(before.as_bytes(), "expected a JSON value at byte 0")
        .await;

    // `\u0000` is a valid escape: the state keeps it and it is content.
    let escaped = body("z-2", "card-z", Some("2"), T, r#"{"s":"a\u0000b"}"#);
    h.decided(escaped.as_bytes(), Decision::Applied).await;
    let card = h.rx.object("card-z").await.unwrap();
    assert_eq!(card.state.as_str(), r#"{"s":"a\u0000b"}"#);
    assert_eq!(card.state.to_value()["s"], "a\u{0}b");
    // An id may not: PostgreSQL text cannot hold U+0000, so every backend
    // refuses it alike, this one included.
    let nul_id = body(r"z-\u0000", "card-z", Some("1"), T, "{}");
    let field = "event_id";
    h.rejected(nul_id.as_bytes(), RejectReason::NulInId { field })
        .await;
    assert!(h.rx.context().registry().get("z-\0").is_none());
    // "a\u0000b" is not "ab": same version, other state, a conflict.
    let without = body("z-3", "card-z", Some("2"), T, r#"{"s":"ab"}"#);
    let conflict = Decision::Conflict(ConflictKind::VersionState);
    h.decided(without.as_bytes(), conflict).await;
}

#[tokio::test]
async fn bom_trailing_garbage_empty_and_whitespace_bodies() {
    let mut h = Harness::new(Limits::default());
    let ok = body("g-1", "card-z", Some("2"), T, r#"{"s":"ok"}"#);
    // One leading byte-order mark is ignored (see the end); any other is not.
    let misplaced = "misplaced byte-order mark";
    let twice = format!("\u{feff}\u{feff}{ok}");
    h.malformed(twice.as_bytes(), &format!("{misplaced} at byte 3"))
        .await;
    let after_space = format!(" \u{feff}{ok}");
    h.malformed(after_space.as_bytes(), &format!("{misplaced} at byte 1"))
        .await;
    let after_body = format!("{ok}\u{feff}");
    let at = ok.len();
    h.malformed(after_body.as_bytes(), &format!("{misplaced} at byte {at}"))
        .await;
    let between = ok.replacen(",", ",\u{feff}", 1);
    let at = ok.find(',').unwrap() + 1;
    h.malformed(between.as_bytes(), &format!("{misplaced} at byte {at}"))
        .await;
    let trailing = "unexpected characters after the JSON value";
    for garbage in ["x", "}", ",", &ok, "// comment"] {
        let b = format!("{ok}{garbage}");
        h.malformed(b.as_bytes(), &format!("{trailing} at byte {}", ok.len()))
            .await;
    }
    let b = format!("{ok} \n x");
    h.malformed(
        b.as_bytes(),
        &format!("{trailing} at byte {}", ok.len() + 3),
    )
    .await;
    h.malformed(b"", "empty input: no JSON value at byte 0")
        .await;
    h.malformed(b" \n\t\r ", "empty input: no JSON value at byte 5")
        .await;
    // Trailing whitespace is not garbage.
    let spaced = format!("{ok} \n\t\r");
    h.decided(spaced.as_bytes(), Decision::Applied).await;
    // Nor is one leading byte-order mark: the same content, a duplicate.
    let marked = format!("\u{feff}{ok}");
    let original = Verdict::Applied;
    h.decided(marked.as_bytes(), Decision::Duplicate { original })
        .await;
    // Every malformed body above is still held, with its bytes: 12 bodies,
    // each delivered twice and held once.
    let unresolved = h.rx.unresolved().await;
    let malformed = unresolved
        .iter()
        .filter(|u| u.held_as == Verdict::Held(HoldReason::Malformed))
        .count();
    assert_eq!(malformed, 12);
}
