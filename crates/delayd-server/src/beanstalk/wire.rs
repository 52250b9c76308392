//! beanstalkd's text protocol on the wire: command lines in, parsed into [`Request`]s, a
//! `put`'s body read after its line, and replies out. Every size a client sends is bounded.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// Longest command line beanstalkd accepts, its `\r\n` excluded (a 200-byte tube name and
/// the command around it).
pub const MAX_LINE_BYTES: usize = 224;
/// Longest tube name.
pub const MAX_TUBE_BYTES: usize = 200;

/// One command, its arguments parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `put <pri> <delay> <ttr> <bytes>`: the body follows the line.
    Put { pri: u32, delay_s: u32, ttr_s: u32, bytes: u32 },
    /// `use <tube>`.
    Use(String),
    /// `reserve`, or `reserve-with-timeout <seconds>`.
    Reserve { timeout_s: Option<u32> },
    /// `reserve-job <id>`.
    ReserveJob(u64),
    /// `delete <id>`.
    Delete(u64),
    /// `release <id> <pri> <delay>`.
    Release { id: u64, pri: u32, delay_s: u32 },
    /// `bury <id> <pri>`.
    Bury { id: u64, pri: u32 },
    /// `touch <id>`.
    Touch(u64),
    /// `watch <tube>`.
    Watch(String),
    /// `ignore <tube>`.
    Ignore(String),
    /// `peek <id>`.
    Peek(u64),
    /// `peek-ready`.
    PeekReady,
    /// `peek-delayed`.
    PeekDelayed,
    /// `peek-buried`.
    PeekBuried,
    /// `kick <bound>`.
    Kick(u32),
    /// `kick-job <id>`.
    KickJob(u64),
    /// `stats-job <id>`.
    StatsJob(u64),
    /// `stats-tube <tube>`.
    StatsTube(String),
    /// `stats`.
    Stats,
    /// `list-tubes`.
    ListTubes,
    /// `list-tube-used`.
    ListTubeUsed,
    /// `list-tubes-watched`.
    ListTubesWatched,
    /// `pause-tube <tube> <delay>`.
    PauseTube { tube: String, delay_s: u32 },
    /// `quit`.
    Quit,
}

impl Request {
    /// The command's name, for metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Put { .. } => "put",
            Request::Use(_) => "use",
            Request::Reserve { timeout_s: None } => "reserve",
            Request::Reserve { timeout_s: Some(_) } => "reserve-with-timeout",
            Request::ReserveJob(_) => "reserve-job",
            Request::Delete(_) => "delete",
            Request::Release { .. } => "release",
            Request::Bury { .. } => "bury",
            Request::Touch(_) => "touch",
            Request::Watch(_) => "watch",
            Request::Ignore(_) => "ignore",
            Request::Peek(_) => "peek",
            Request::PeekReady => "peek-ready",
            Request::PeekDelayed => "peek-delayed",
            Request::PeekBuried => "peek-buried",
            Request::Kick(_) => "kick",
            Request::KickJob(_) => "kick-job",
            Request::StatsJob(_) => "stats-job",
            Request::StatsTube(_) => "stats-tube",
            Request::Stats => "stats",
            Request::ListTubes => "list-tubes",
            Request::ListTubeUsed => "list-tube-used",
            Request::ListTubesWatched => "list-tubes-watched",
            Request::PauseTube { .. } => "pause-tube",
            Request::Quit => "quit",
        }
    }
}

/// Why a line is not a command, as beanstalkd answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineError {
    /// `BAD_FORMAT`: a known command with wrong arguments (or a bad tube name).
    BadFormat,
    /// `UNKNOWN_COMMAND`.
    Unknown,
}

impl LineError {
    /// The reply line.
    pub fn reply(self) -> &'static [u8] {
        match self {
            LineError::BadFormat => b"BAD_FORMAT\r\n",
            LineError::Unknown => b"UNKNOWN_COMMAND\r\n",
        }
    }
}

/// Whether `name` is a tube name beanstalkd accepts: 1 to 200 bytes of letters, digits and
/// `-+/;.$_()`, not starting with `-`.
pub fn valid_tube(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TUBE_BYTES
        && !name.starts_with('-')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-+/;.$_()".contains(&b))
}

/// Parses one command line (without its `\r\n`).
pub fn parse(line: &[u8]) -> Result<Request, LineError> {
    let line = std::str::from_utf8(line).map_err(|_| LineError::BadFormat)?;
    let mut words = line.split(' ');
    let name = words.next().unwrap_or_default();
    let args: Vec<&str> = words.collect();
    let request = match (name, args.as_slice()) {
        ("put", [pri, delay, ttr, bytes]) => Request::Put {
            pri: int(pri)?,
            delay_s: int(delay)?,
            ttr_s: int(ttr)?,
            bytes: int(bytes)?,
        },
        ("use", [tube]) => Request::Use(tube_arg(tube)?),
        ("reserve", []) => Request::Reserve { timeout_s: None },
        ("reserve-with-timeout", [secs]) => Request::Reserve { timeout_s: Some(int(secs)?) },
        ("reserve-job", [id]) => Request::ReserveJob(int(id)?),
        ("delete", [id]) => Request::Delete(int(id)?),
        ("release", [id, pri, delay]) => {
            Request::Release { id: int(id)?, pri: int(pri)?, delay_s: int(delay)? }
        }
        ("bury", [id, pri]) => Request::Bury { id: int(id)?, pri: int(pri)? },
        ("touch", [id]) => Request::Touch(int(id)?),
        ("watch", [tube]) => Request::Watch(tube_arg(tube)?),
        ("ignore", [tube]) => Request::Ignore(tube_arg(tube)?),
        ("peek", [id]) => Request::Peek(int(id)?),
        ("peek-ready", []) => Request::PeekReady,
        ("peek-delayed", []) => Request::PeekDelayed,
        ("peek-buried", []) => Request::PeekBuried,
        ("kick", [bound]) => Request::Kick(int(bound)?),
        ("kick-job", [id]) => Request::KickJob(int(id)?),
        ("stats-job", [id]) => Request::StatsJob(int(id)?),
        ("stats-tube", [tube]) => Request::StatsTube(tube_arg(tube)?),
        ("stats", []) => Request::Stats,
        ("list-tubes", []) => Request::ListTubes,
        ("list-tube-used", []) => Request::ListTubeUsed,
        ("list-tubes-watched", []) => Request::ListTubesWatched,
        ("pause-tube", [tube, delay]) => {
            Request::PauseTube { tube: tube_arg(tube)?, delay_s: int(delay)? }
        }
        ("quit", []) => Request::Quit,
        (
            "put"
            | "use"
            | "reserve"
            | "reserve-with-timeout"
            | "reserve-job"
            | "delete"
            | "release"
            | "bury"
            | "touch"
            | "watch"
            | "ignore"
            | "peek"
            | "peek-ready"
            | "peek-delayed"
            | "peek-buried"
            | "kick"
            | "kick-job"
            | "stats-job"
            | "stats-tube"
            | "stats"
            | "list-tubes"
            | "list-tube-used"
            | "list-tubes-watched"
            | "pause-tube"
            | "quit",
            _,
        ) => {
            // beanstalkd recognises a command by its name and the space after it, except
            // `pause-tube` and the prefixes `stats` and `reserve` of argument-free commands:
            // without arguments the others are not commands at all.
            let bare = args.is_empty()
                && !(name == "pause-tube"
                    || name.starts_with("stats")
                    || name.starts_with("reserve"));
            return Err(if bare { LineError::Unknown } else { LineError::BadFormat });
        }
        _ => return Err(LineError::Unknown),
    };
    Ok(request)
}

/// An unsigned decimal as beanstalkd reads one: digits only, within the type.
fn int<T: std::str::FromStr>(arg: &str) -> Result<T, LineError> {
    if arg.is_empty() || !arg.bytes().all(|b| b.is_ascii_digit()) {
        return Err(LineError::BadFormat);
    }
    arg.parse().map_err(|_| LineError::BadFormat)
}

fn tube_arg(arg: &str) -> Result<String, LineError> {
    if valid_tube(arg) {
        Ok(arg.to_string())
    } else {
        Err(LineError::BadFormat)
    }
}

/// Why a line or a body could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadError {
    /// The line is longer than [`MAX_LINE_BYTES`]: answered `BAD_FORMAT`, then the
    /// connection closes (the rest of the line cannot be told from the next command).
    TooLong,
    /// The connection failed or closed mid-command.
    Io,
}

/// Reads one command line without its `\r\n`; `None` at a clean end between commands. As
/// in beanstalkd, only `\r\n` ends a line: a bare `\n` is part of it.
pub async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Option<Vec<u8>>, ReadError> {
    let mut line = Vec::new();
    loop {
        let room = (MAX_LINE_BYTES + 2).saturating_sub(line.len());
        if room == 0 {
            return Err(ReadError::TooLong);
        }
        let n =
            r.take(room as u64).read_until(b'\n', &mut line).await.map_err(|_| ReadError::Io)?;
        if n == 0 {
            return if line.is_empty() { Ok(None) } else { Err(ReadError::Io) };
        }
        if line.ends_with(b"\r\n") {
            line.truncate(line.len() - 2);
            return Ok(Some(line));
        }
    }
}

/// What came after a `put` line.
#[derive(Debug, PartialEq, Eq)]
pub enum Body {
    /// The body.
    Data(Vec<u8>),
    /// Over the limit: the bytes were read and dropped (`JOB_TOO_BIG`).
    TooBig,
    /// The body was not followed by `\r\n` (`EXPECTED_CRLF`).
    NoCrlf,
}

/// Reads a `put`'s `bytes` of body and its `\r\n`. A body over `max_bytes` is read and
/// dropped without being kept, as beanstalkd does, so the connection stays in step.
pub async fn read_body<R: AsyncBufRead + Unpin>(
    r: &mut R,
    bytes: u32,
    max_bytes: usize,
) -> Result<Body, ReadError> {
    let want = u64::from(bytes) + 2;
    if bytes as usize > max_bytes {
        let dropped = tokio::io::copy(&mut r.take(want), &mut tokio::io::sink())
            .await
            .map_err(|_| ReadError::Io)?;
        return if dropped == want { Ok(Body::TooBig) } else { Err(ReadError::Io) };
    }
    let mut body = Vec::with_capacity(bytes as usize + 2);
    let got = r.take(want).read_to_end(&mut body).await.map_err(|_| ReadError::Io)?;
    if got as u64 != want {
        return Err(ReadError::Io);
    }
    if !body.ends_with(b"\r\n") {
        return Ok(Body::NoCrlf);
    }
    body.truncate(bytes as usize);
    Ok(Body::Data(body))
}

/// A reply line with a body: `<head>\r\n<body>\r\n`.
pub fn with_body(head: &str, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len() + body.len() + 4);
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n");
    out
}

/// A reply line: `<line>\r\n`.
pub fn line(line: &str) -> Vec<u8> {
    format!("{line}\r\n").into_bytes()
}

/// An `OK <bytes>` reply carrying a YAML document of `fields`, in order.
pub fn yaml_map(fields: &[(&str, String)]) -> Vec<u8> {
    let mut doc = String::from("---\n");
    for (key, value) in fields {
        doc.push_str(key);
        doc.push_str(": ");
        doc.push_str(value);
        doc.push('\n');
    }
    with_body(&format!("OK {}", doc.len()), doc.as_bytes())
}

/// An `OK <bytes>` reply carrying a YAML list.
pub fn yaml_list<'a>(items: impl IntoIterator<Item = &'a str>) -> Vec<u8> {
    let mut doc = String::from("---\n");
    for item in items {
        doc.push_str("- ");
        doc.push_str(item);
        doc.push('\n');
    }
    with_body(&format!("OK {}", doc.len()), doc.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_strictly() {
        assert_eq!(
            parse(b"put 1 2 3 4"),
            Ok(Request::Put { pri: 1, delay_s: 2, ttr_s: 3, bytes: 4 })
        );
        assert_eq!(parse(b"reserve-with-timeout 0"), Ok(Request::Reserve { timeout_s: Some(0) }));
        assert_eq!(parse(b"use my.tube(1)"), Ok(Request::Use("my.tube(1)".into())));
        assert_eq!(parse(b"kick 4294967295"), Ok(Request::Kick(u32::MAX)));
        for bad in [
            &b"put 1 2 3"[..],
            b"put -1 0 1 1",
            b"put 1 2 3 x",
            b"put 4294967296 0 1 1",
            b"delete 1 2",
            b"stats-job",
            b"reserve-job",
            b"use -tube",
            b"use a b",
            b"watch t\xff",
            b"reserve ",
            b"stats-job +1",
        ] {
            assert_eq!(parse(bad), Err(LineError::BadFormat), "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(parse(b"frobnicate"), Err(LineError::Unknown));
        assert_eq!(parse(b"delete"), Err(LineError::Unknown), "no space after the name");
        assert_eq!(parse(b""), Err(LineError::Unknown));
    }

    #[tokio::test]
    async fn lines_and_bodies_are_bounded() {
        let mut r = tokio::io::BufReader::new(&b"use a\r\nput 0 0 1 3\r\n"[..]);
        assert_eq!(read_line(&mut r).await, Ok(Some(b"use a".to_vec())));
        assert_eq!(read_line(&mut r).await, Ok(Some(b"put 0 0 1 3".to_vec())));
        assert_eq!(read_line(&mut r).await, Ok(None));

        let long = [b'x'; MAX_LINE_BYTES + 10];
        let mut r = tokio::io::BufReader::new(&long[..]);
        assert_eq!(read_line(&mut r).await, Err(ReadError::TooLong));
        let mut r = tokio::io::BufReader::new(&b"\nuse a\r\nuse b\n"[..]);
        assert_eq!(read_line(&mut r).await, Ok(Some(b"\nuse a".to_vec())), "a bare LF is data");
        assert_eq!(read_line(&mut r).await, Err(ReadError::Io), "cut off mid-line");

        let mut r = tokio::io::BufReader::new(&b"abc\r\nabcdef\r\nabcX\r"[..]);
        assert_eq!(read_body(&mut r, 3, 5).await, Ok(Body::Data(b"abc".to_vec())));
        assert_eq!(read_body(&mut r, 6, 5).await, Ok(Body::TooBig));
        assert_eq!(read_body(&mut r, 3, 5).await, Ok(Body::NoCrlf));
        assert_eq!(read_body(&mut r, 3, 5).await, Err(ReadError::Io));
    }

    #[test]
    fn yaml_replies_count_their_bytes() {
        assert_eq!(yaml_list(["default", "b"]), b"OK 18\r\n---\n- default\n- b\n\r\n".to_vec());
        assert_eq!(yaml_map(&[("id", "1".into())]), b"OK 10\r\n---\nid: 1\n\r\n".to_vec());
    }
}
