//! Text for a terminal: what the commands print in their text format goes
//! through [`shown`], so that a string a client chose (an object or event
//! id, a relay name, a destination's error text) cannot move the cursor,
//! recolour the screen, ring the bell, reverse what follows it or start a
//! line of its own. JSON output needs none of this (serde_json escapes
//! control characters, and a JSON reader sees the others as what they are).

use std::borrow::Cow;
use std::fmt;

/// Whether `c` would not show as itself on a terminal (or on a page): a
/// control character (C0 U+0000–U+001F, DEL U+007F, C1 U+0080–U+009F), a
/// bidirectional formatting character (Unicode UAX #9 §2: ALM U+061C,
/// LRM/RLM U+200E/U+200F, the embeddings and overrides U+202A–U+202E, the
/// isolates U+2066–U+2069), a zero-width character (U+200B–U+200D,
/// U+2060–U+2065) or BOM (U+FEFF), or the line and paragraph separators
/// U+2028/U+2029.
pub(crate) fn invisible(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2069}'
                | '\u{FEFF}'
        )
}

/// `text` as a terminal line shows it: tab, line feed and carriage return
/// as `\t`, `\n`, `\r`; every other [`invisible`] character as `\u{hex}`
/// (lower-case hex, no padding: `\u{1b}`, `\u{202e}`), as Rust writes them.
/// Everything else (`é`, `字`, emoji, a backslash) is left as it is: a
/// backslash is harmless on a terminal, and doubling it would double every
/// escape of the JSON states printed (`\"`, `\u0007`). So a text holding
/// a backslash and `n` shows like one holding a line feed; `--format json`
/// tells them apart. Borrowed when nothing needs escaping.
pub(crate) fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(invisible) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if invisible(c) => {
                use std::fmt::Write as _;
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `text`, a message of several lines the tool wrote (an error with its
/// causes, which may quote a store's or a sender's text), each line
/// escaped as [`escape`] does and its line feeds kept: what it quotes
/// cannot act on the terminal, though a line feed inside a quoted text
/// still starts a line.
pub(crate) fn escape_lines(text: &str) -> String {
    text.split('\n').map(escape).collect::<Vec<_>>().join("\n")
}

/// Standard error for the log lines (`-v`, RUST_LOG): each event's line
/// escaped as [`escape`] renders text, its final line feed kept, so that a
/// field holding a sender's text (an object id, a destination's refusal)
/// cannot act on the terminal or forge a log line. The fmt layer writes
/// each event with one `write_all` of the whole line.
pub(crate) struct EscapedStderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for EscapedStderr {
    type Writer = EscapingWriter<std::io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        EscapingWriter(std::io::stderr())
    }
}

/// A writer that escapes what it is given ([`EscapedStderr`]): each write
/// is taken as one line of text (invalid UTF-8 replaced by U+FFFD), its
/// trailing line feed kept.
pub(crate) struct EscapingWriter<W>(pub(crate) W);

impl<W: std::io::Write> std::io::Write for EscapingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (line, end) = match text.strip_suffix('\n') {
            Some(line) => (line, "\n"),
            None => (&*text, ""),
        };
        self.0
            .write_all(format!("{}{end}", escape(line)).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// A string to print to a terminal: displays as [`escape`] renders it,
/// padded and aligned by the format's width (`{:<10}`) like a `str`.
#[derive(Clone, Copy)]
pub(crate) struct Shown<'a>(&'a str);

/// `text`, to be printed with `{}` ([`Shown`]).
pub(crate) fn shown(text: &str) -> Shown<'_> {
    Shown(text)
}

/// `text` or `-` when there is none, to be printed with `{}`.
pub(crate) fn shown_or_dash(text: Option<&str>) -> Shown<'_> {
    Shown(text.unwrap_or("-"))
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&escape(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::{escape, shown};

    #[test]
    fn control_characters_are_escaped_and_other_text_is_left() {
        assert_eq!(
            escape("card-\u{1b}[31mX\nforged line\u{202e}"),
            "card-\\u{1b}[31mX\\nforged line\\u{202e}"
        );
        assert_eq!(
            escape("a\tb\rc\u{7}d\u{0}e\u{7f}f"),
            "a\\tb\\rc\\u{7}d\\u{0}e\\u{7f}f"
        );
        // C1 controls (CSI U+009B would start a sequence on some terminals).
        assert_eq!(escape("\u{80}\u{9b}\u{9f}"), "\\u{80}\\u{9b}\\u{9f}");
        // Every bidi control, the separators, zero-width characters, BOM.
        assert_eq!(
            escape("\u{61c}\u{200e}\u{200f}\u{202a}\u{202b}\u{202c}\u{202d}\u{202e}"),
            "\\u{61c}\\u{200e}\\u{200f}\\u{202a}\\u{202b}\\u{202c}\\u{202d}\\u{202e}"
        );
        assert_eq!(
            escape("\u{2066}\u{2067}\u{2068}\u{2069}\u{2028}\u{2029}"),
            "\\u{2066}\\u{2067}\\u{2068}\\u{2069}\\u{2028}\\u{2029}"
        );
        assert_eq!(
            escape("\u{200b}\u{200d}\u{2060}\u{feff}"),
            "\\u{200b}\\u{200d}\\u{2060}\\u{feff}"
        );
        // A backslash stays (JSON states keep their escapes as they are).
        assert_eq!(escape(r#"{"a":"b\"\u0007"}"#), r#"{"a":"b\"\u0007"}"#);
        // Printable non-ASCII stays; the edges of the ranges stay.
        assert_eq!(
            escape("café 字 🦀 ~ \u{a0}\u{2027}\u{202f}\u{206a}"),
            "café 字 🦀 ~ \u{a0}\u{2027}\u{202f}\u{206a}"
        );
        assert!(matches!(
            escape("card-7"),
            std::borrow::Cow::Borrowed("card-7")
        ));
    }

    #[test]
    fn a_message_keeps_its_lines_and_escapes_the_rest() {
        assert_eq!(
            super::escape_lines("no relay \u{1b}]0;x\u{7}\n  cargo install\r\u{202e}"),
            "no relay \\u{1b}]0;x\\u{7}\n  cargo install\\r\\u{202e}"
        );
        assert_eq!(super::escape_lines("one line"), "one line");
    }

    #[test]
    fn a_log_line_is_escaped_but_its_end() {
        use std::io::Write as _;
        let mut w = super::EscapingWriter(Vec::new());
        w.write_all(b" WARN relay: refused object=card-\x1b[31mX\nforged line\xe2\x80\xae\n")
            .unwrap();
        w.write_all(b"plain line\n").unwrap();
        assert_eq!(
            String::from_utf8(w.0).unwrap(),
            " WARN relay: refused object=card-\\u{1b}[31mX\\nforged line\\u{202e}\nplain line\n"
        );
    }

    #[test]
    fn shown_pads_what_it_escaped() {
        assert_eq!(format!("[{:<8}]", shown("a\nb")), "[a\\nb    ]");
        assert_eq!(format!("[{:>6}]", shown("é")), "[     é]");
        assert_eq!(format!("{}", super::shown_or_dash(None)), "-");
    }
}
