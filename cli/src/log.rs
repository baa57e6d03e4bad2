//! The tool's log lines on stderr: as text for a person, or as JSON Lines
//! for a log pipeline (`--log-format json`).
//!
//! A JSON line is one object with these keys, always in this order:
//! `time` (RFC 3339 UTC, nanoseconds when not whole seconds), `level`
//! (`error`, `warn`, `info`, `debug`, `trace`), `target` (the module that
//! logged it), `message`; then the fields of the spans the line was logged
//! in, outermost first (a delivery's span gives `event_id`, `object_id`,
//! `decision`, `ack`; a request's `method`, `path`, `webhook_id`), then the
//! line's own fields (`relay`, `effect_id`, `object_id`, `attempt`,
//! `error`, ...). A field of the line replaces a span's field of the same
//! name. Numbers and booleans stay JSON numbers and booleans; everything
//! else is a string.

use std::fmt;
use std::io::Write as _;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// How log lines are written (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line of text per event, for a person reading a terminal.
    #[default]
    Text,
    /// One JSON object per line, for a log pipeline (keys in the module
    /// documentation).
    Json,
}

/// The fields of a span or an event, in the order they were first
/// recorded (a field recorded again keeps its place).
#[derive(Clone, Default)]
struct Fields(Vec<(String, serde_json::Value)>);

impl Fields {
    fn put(&mut self, field: &Field, value: serde_json::Value) {
        self.set(field.name(), value);
    }

    fn set(&mut self, name: &str, value: serde_json::Value) {
        match self.0.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => *v = value,
            None => self.0.push((name.to_owned(), value)),
        }
    }

    fn take(&mut self, name: &str) -> Option<serde_json::Value> {
        let i = self.0.iter().position(|(n, _)| n == name)?;
        Some(self.0.remove(i).1)
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, format!("{value:?}").into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, value.to_string().into());
    }
}

/// The layer that writes JSON Lines, one object per event, to the writer
/// `W` makes (stderr in the tool: [`JsonLines::stderr`]).
pub struct JsonLines<W> {
    /// Where each line goes; a writer per line, so that lines of two
    /// threads never mix.
    writer: W,
}

impl JsonLines<fn() -> std::io::Stderr> {
    /// Lines on stderr.
    pub fn stderr() -> Self {
        Self {
            writer: std::io::stderr,
        }
    }
}

impl<S, W> Layer<S> for JsonLines<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + 'static,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        match extensions.get_mut::<Fields>() {
            Some(fields) => values.record(fields),
            None => {
                let mut fields = Fields::default();
                values.record(&mut fields);
                extensions.insert(fields);
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let line = json_line(
            std::time::SystemTime::now(),
            event,
            ctx.event_scope(event).into_iter().flat_map(|scope| {
                scope
                    .from_root()
                    .filter_map(|span| span.extensions().get::<Fields>().cloned())
            }),
        );
        // One write per line, so that lines of two threads never mix.
        let _ = self.writer.make_writer().write_all(line.as_bytes());
    }
}

/// The JSON line of `event` logged at `at` inside spans whose fields are
/// `spans` (outermost first), with its newline.
fn json_line(
    at: std::time::SystemTime,
    event: &Event<'_>,
    spans: impl Iterator<Item = Fields>,
) -> String {
    let meta = event.metadata();
    let mut own = Fields::default();
    event.record(&mut own);
    let message = own.take("message").unwrap_or_else(|| "".into());
    let mut rest = Fields::default();
    for fields in spans.chain(std::iter::once(own)) {
        for (name, value) in fields.0 {
            rest.set(&name, value);
        }
    }
    let mut text = String::with_capacity(256);
    let key = |text: &mut String, name: &str, value: &serde_json::Value| {
        text.push(if text.is_empty() { '{' } else { ',' });
        text.push_str(&serde_json::Value::from(name).to_string());
        text.push(':');
        text.push_str(&value.to_string());
    };
    key(
        &mut text,
        "time",
        &snapshot_receiver::format_rfc3339(at).into(),
    );
    key(
        &mut text,
        "level",
        &meta.level().as_str().to_ascii_lowercase().into(),
    );
    key(&mut text, "target", &meta.target().into());
    key(&mut text, "message", &message);
    for (name, value) in &rest.0 {
        // The four keys every line starts with are never repeated.
        match name.as_str() {
            "time" | "level" | "target" | "message" => {
                key(&mut text, &format!("field.{name}"), value);
            }
            _ => key(&mut text, name, value),
        }
    }
    text.push_str("}\n");
    text
}

#[cfg(test)]
mod tests {
    use super::JsonLines;
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt as _;

    /// A writer into a buffer the test reads.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The lines logged by `f`, each without its `time` (checked to be RFC
    /// 3339 UTC and first).
    fn lines(f: impl FnOnce()) -> Vec<String> {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::registry().with(JsonLines {
            writer: move || writer.clone(),
        });
        tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|line| {
                let rest = line.strip_prefix("{\"time\":\"").expect(line);
                let (time, rest) = rest.split_once('"').unwrap();
                assert!(
                    snapshot_receiver::parse_rfc3339(time).is_some() && time.ends_with('Z'),
                    "{time}"
                );
                format!("{{{}", rest.strip_prefix(',').unwrap())
            })
            .collect()
    }

    #[test]
    fn a_line_has_its_spans_fields_outermost_first_then_its_own() {
        let got = lines(|| {
            let request = tracing::info_span!("request", path = "/events", webhook_id = "msg_1");
            let _r = request.enter();
            let delivery = tracing::info_span!(
                "delivery",
                event_id = "e-1",
                object_id = "card-1",
                decision = tracing::field::Empty,
            );
            delivery.record("decision", "applied");
            let _d = delivery.enter();
            tracing::warn!(
                attempt = 3_u64,
                retried = true,
                wait = 1.5,
                "refused: \"503\""
            );
            tracing::error!(object_id = "card-2", "the line's own field wins");
        });
        assert_eq!(
            got,
            [
                r#"{"level":"warn","target":"snapshot_receiver::log::tests","message":"refused: \"503\"","path":"/events","webhook_id":"msg_1","event_id":"e-1","object_id":"card-1","decision":"applied","attempt":3,"retried":true,"wait":1.5}"#,
                r#"{"level":"error","target":"snapshot_receiver::log::tests","message":"the line's own field wins","path":"/events","webhook_id":"msg_1","event_id":"e-1","object_id":"card-2","decision":"applied"}"#,
            ]
        );
    }

    #[test]
    fn fields_named_like_the_first_four_keys_do_not_replace_them() {
        let got = lines(|| {
            tracing::info!(level = "mine", time = 5_i64, "m");
        });
        assert_eq!(
            got,
            [
                r#"{"level":"info","target":"snapshot_receiver::log::tests","message":"m","field.level":"mine","field.time":5}"#
            ]
        );
    }
}
