//! The text log's fields without colours: what `tracing-subscriber`'s `DefaultFields` writes
//! when ANSI is off, at less cost.
//!
//! The text formatter writes a span's fields out when the span is made, whether or not a
//! line is ever logged inside it, and the HTTP middleware makes one span per request. With
//! colours off, `DefaultFields` still wraps every field name and `=` in `nu_ansi_term`
//! styles that turn out empty, and that wrapping was about 2 % of a leader's instructions
//! under load (callgrind, in docs/bench/consume-path.md). [`PlainFields`] writes the same
//! text directly: `name=value` pairs separated by spaces, the message bare and first where
//! it was logged first, the `log.` fields of records bridged from the `log` crate left out
//! (the formatter shows them as the line's target and place), a raw identifier's `r#`
//! dropped, the message's terminal control characters escaped when the writer asks for it,
//! and an error field as its escaped text followed by `name.sources=[…]` when it has
//! sources, as `DefaultFields` does.

use std::fmt::{self, Write};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::FormatFields;

/// See the module docs. Used only when the log is not coloured.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlainFields;

impl<'writer> FormatFields<'writer> for PlainFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let escape = writer.sanitizes_ansi_escapes();
        let writer = Buffered { writer, buf: [0; BUFFERED_BYTES], len: 0 };
        let mut visitor = Visitor { writer, escape, first: true, result: Ok(()) };
        fields.record(&mut visitor);
        visitor.result.and_then(|()| visitor.writer.flush())
    }
}

/// What [`Buffered`] holds before it writes through: a request span's fields fit.
const BUFFERED_BYTES: usize = 256;

/// Gathers the small writes of formatting (a name, `=`, a value, a space) and passes them on
/// in one: a span's fields go into a string that starts empty, and written piece by piece it
/// grew 4.5 times per request span on average (some 1,500 instructions a request under
/// load).
struct Buffered<'writer> {
    writer: Writer<'writer>,
    buf: [u8; BUFFERED_BYTES],
    len: usize,
}

impl Buffered<'_> {
    fn flush(&mut self) -> fmt::Result {
        let held = std::mem::take(&mut self.len);
        // Only whole `str`s are ever copied in, so the bytes held are UTF-8.
        let text = std::str::from_utf8(&self.buf[..held]).map_err(|_| fmt::Error)?;
        self.writer.write_str(text)
    }
}

impl Write for Buffered<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if let Some(room) = self.buf.get_mut(self.len..self.len + s.len()) {
            room.copy_from_slice(s.as_bytes());
            self.len += s.len();
            return Ok(());
        }
        self.flush()?;
        if s.len() > BUFFERED_BYTES {
            return self.writer.write_str(s);
        }
        self.write_str(s)
    }
}

struct Visitor<'writer> {
    writer: Buffered<'writer>,
    /// Whether the message's control characters are escaped.
    escape: bool,
    first: bool,
    result: fmt::Result,
}

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        // A message given as a string field is written bare, like one from a format string.
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    /// An error as its text, escaped like a message (it may carry what a client sent), then
    /// the chain of its sources as `name.sources=[…]`.
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let text = Escaped(value, self.escape);
        match value.source() {
            Some(source) => {
                let sources = Sources(source, self.escape);
                self.record_debug(
                    field,
                    &format_args!("{text} {}.sources={sources}", field.name()),
                );
            }
            None => self.record_debug(field, &format_args!("{text}")),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let name = field.name();
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        let separator = if std::mem::take(&mut self.first) { "" } else { " " };
        self.result = if name == "message" {
            if self.escape {
                write!(self.writer, "{separator}")
                    .and_then(|()| write!(Escaping(&mut self.writer), "{value:?}"))
            } else {
                write!(self.writer, "{separator}{value:?}")
            }
        } else {
            let name = name.strip_prefix("r#").unwrap_or(name);
            write!(self.writer, "{separator}{name}={value:?}")
        };
    }
}

/// Writes through to `W`, with the characters a terminal could take as the start of a
/// control sequence (ESC, BEL, backspace, form feed, DEL and the C1 controls) written as
/// escapes: a message built from what a client sent cannot restyle or rewrite the terminal
/// it is read on.
struct Escaping<'a, W>(&'a mut W);

impl<W: Write> Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        while let Some(at) = rest.find(is_control) {
            self.0.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            match c {
                '\u{80}'..='\u{9f}' => write!(self.0, "\\u{{{:x}}}", u32::from(c))?,
                c => write!(self.0, "\\x{:02x}", u32::from(c))?,
            }
            rest = &rest[at + c.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

/// A value's text, escaped as [`Escaping`] does when the flag is set; the same either way it
/// is formatted.
struct Escaped<'a, T: ?Sized>(&'a T, bool);

impl<T: fmt::Display + ?Sized> fmt::Display for Escaped<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.1 {
            write!(Escaping(f), "{}", self.0)
        } else {
            write!(f, "{}", self.0)
        }
    }
}

impl<T: fmt::Display + ?Sized> fmt::Debug for Escaped<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// An error and the errors under it, as a list of their escaped texts.
struct Sources<'a>(&'a (dyn std::error::Error + 'static), bool);

impl fmt::Display for Sources<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        let mut next = Some(self.0);
        while let Some(error) = next {
            list.entry(&Escaped(error, self.1));
            next = error.source();
        }
        list.finish()
    }
}

fn is_control(c: char) -> bool {
    matches!(c, '\x1b' | '\x07' | '\x08' | '\x0c' | '\x7f' | '\u{80}'..='\u{9f}')
}

#[cfg(test)]
mod tests {
    use std::io;

    use tracing_subscriber::fmt::format::DefaultFields;

    use super::*;
    use crate::log_sink::Sink;

    /// An error with a source, for the `.sources` list.
    #[derive(Debug)]
    struct Outer(io::Error);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("outer")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// What a request's lines look like: its span's fields, then the event's, message first.
    fn lines<F>(fields: F) -> String
    where
        F: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let sink = Sink::default();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(sink.clone())
            .fmt_fields(fields)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(
                "request",
                request_id = %"01ARZ3NDEKTSV4RRFFQ69G5FAV",
                method = %"GET",
                route = %"/api/{ns}/{q}",
            );
            let _in = span.enter();
            tracing::info!(status = 200u16, micros = 17u64, "request done");
            tracing::warn!(r#type = "raw", text = "quoted \"s\"", "escaped \x1b[31m\u{9b}red");
            tracing::info!(count = 3, later = true, "message first");
            tracing::info!(message = "a message field", n = 1);
            // Longer than what the fields are gathered in before they are written, and a
            // value that starts with the gathering nearly full.
            let long = "long ".repeat(60);
            tracing::info!(a = %long, b = %"é".repeat(200), c = %long, "longer than the buffer");
            let inner = io::Error::other("inner \x1b[2J");
            let outer = io::Error::new(io::ErrorKind::NotFound, Outer(inner));
            tracing::warn!(error = &outer as &dyn std::error::Error, "failed");
            let alone = io::Error::other("alone");
            tracing::warn!(error = &alone as &dyn std::error::Error, "failed");
        });
        sink.text()
    }

    #[test]
    fn lines_read_as_the_default_fields_write_them_without_colours() {
        let plain = lines(PlainFields);
        assert_eq!(plain, lines(DefaultFields::new()));
        assert!(plain.contains(
            "request{request_id=01ARZ3NDEKTSV4RRFFQ69G5FAV method=GET route=/api/{ns}/{q}}: "
        ));
        assert!(plain.contains(r#"escaped \x1b[31m\u{9b}red type="raw" text="quoted \"s\"""#));
        assert!(plain.contains("message first count=3 later=true"), "{plain}");
        assert!(plain.contains("a message field n=1"), "{plain}");
        let long = "long ".repeat(60);
        assert!(plain.contains(&format!("buffer a={long} b={} c={long}", "é".repeat(200))));
        assert!(plain.contains(r"error=outer error.sources=[inner \x1b[2J]"), "{plain}");
    }
}
