//! RESP2, the Redis serialization protocol Disque speaks: commands in (arrays of bulk
//! strings, or inline lines), replies out. Every size a client sends is bounded.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// Most arguments one command may carry (an ACKJOB of many ids stays far below).
pub const MAX_ARGS: usize = 4096;
/// Longest line: an inline command, or the header of an array or a bulk string.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// A reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+text`.
    Simple(String),
    /// `-text`: the first word is the error's kind (`ERR`, `NOAUTH`, ...).
    Error(String),
    /// `:n`.
    Int(i64),
    /// `$len bytes`, or the null bulk string.
    Bulk(Option<Vec<u8>>),
    /// `*n items`, or the null array.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// `+OK`.
    pub fn ok() -> Reply {
        Reply::Simple("OK".into())
    }

    /// An `ERR` error with `message`.
    pub fn err(message: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {message}"))
    }

    /// A bulk string of text.
    pub fn text(s: impl Into<String>) -> Reply {
        Reply::Bulk(Some(s.into().into_bytes()))
    }

    /// Appends the reply's encoding to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        // Error and status lines must not break the framing.
        let line = |s: &str| s.replace(['\r', '\n'], " ");
        match self {
            Reply::Simple(s) => out.extend_from_slice(format!("+{}\r\n", line(s)).as_bytes()),
            Reply::Error(s) => out.extend_from_slice(format!("-{}\r\n", line(s)).as_bytes()),
            Reply::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Reply::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
            Reply::Bulk(Some(b)) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Array(None) => out.extend_from_slice(b"*-1\r\n"),
            Reply::Array(Some(items)) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for item in items {
                    item.write(out);
                }
            }
        }
    }
}

/// Why a command could not be read; the connection is answered with it and closed.
#[derive(Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// The bytes are not RESP, or break a bound.
    Bad(String),
    /// The connection failed or closed mid-command.
    Io(String),
}

/// Reads one line without its `\r\n`, at most [`MAX_LINE_BYTES`]; `None` at a clean end.
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Option<Vec<u8>>, ProtocolError> {
    let mut line = Vec::new();
    let n = r
        .take(MAX_LINE_BYTES as u64 + 2)
        .read_until(b'\n', &mut line)
        .await
        .map_err(|e| ProtocolError::Io(e.to_string()))?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        return Err(ProtocolError::Bad("line too long or unterminated".into()));
    }
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Ok(Some(line))
}

fn number(line: &[u8], what: &str) -> Result<i64, ProtocolError> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ProtocolError::Bad(format!("invalid {what} length")))
}

/// Reads one command: its arguments, the name first. `None` when the client closed the
/// connection between commands. Its arguments together are at most `max_bytes`; memory grows
/// with the bytes that actually arrive, never with a length the client only announced.
pub async fn read_command<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max_bytes: usize,
) -> Result<Option<Vec<Vec<u8>>>, ProtocolError> {
    let Some(line) = read_line(r).await? else { return Ok(None) };
    let Some(rest) = line.strip_prefix(b"*") else {
        // An inline command, as typed into telnet.
        let args: Vec<Vec<u8>> = line
            .split(|b| b.is_ascii_whitespace())
            .filter(|a| !a.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        if args.len() > MAX_ARGS {
            return Err(ProtocolError::Bad("too many arguments".into()));
        }
        return Ok(Some(args));
    };
    let n = number(rest, "multibulk")?;
    if n < 0 || n as usize > MAX_ARGS {
        return Err(ProtocolError::Bad("invalid multibulk length".into()));
    }
    let mut args = Vec::with_capacity(n as usize);
    let mut total = 0usize;
    for _ in 0..n {
        let header = read_line(r).await?.ok_or_else(|| ProtocolError::Io("closed".into()))?;
        let len = match header.strip_prefix(b"$") {
            Some(len) => number(len, "bulk")?,
            None => return Err(ProtocolError::Bad("expected '$'".into())),
        };
        total = total.saturating_add(usize::try_from(len).unwrap_or(usize::MAX));
        if len < 0 || total > max_bytes {
            return Err(ProtocolError::Bad(format!(
                "invalid bulk length: a command carries at most {max_bytes} bytes"
            )));
        }
        let mut arg = Vec::new();
        let want = len as u64 + 2;
        let got = r
            .take(want)
            .read_to_end(&mut arg)
            .await
            .map_err(|e| ProtocolError::Io(e.to_string()))?;
        if got as u64 != want {
            return Err(ProtocolError::Io("closed mid-command".into()));
        }
        if !arg.ends_with(b"\r\n") {
            return Err(ProtocolError::Bad("bulk string without its CRLF".into()));
        }
        arg.truncate(len as usize);
        args.push(arg);
    }
    Ok(Some(args))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parse(bytes: &[u8]) -> Result<Option<Vec<Vec<u8>>>, ProtocolError> {
        read_command(&mut tokio::io::BufReader::new(bytes), 16).await
    }

    #[tokio::test]
    async fn commands_are_read_as_arrays_or_inline() {
        let got = parse(b"*2\r\n$4\r\nQLEN\r\n$1\r\nq\r\n").await;
        assert_eq!(got, Ok(Some(vec![b"QLEN".to_vec(), b"q".to_vec()])));
        assert_eq!(parse(b"PING  x\r\n").await, Ok(Some(vec![b"PING".to_vec(), b"x".to_vec()])));
        assert_eq!(parse(b"").await, Ok(None));
        assert!(
            matches!(parse(b"*1\r\n$17\r\n").await, Err(ProtocolError::Bad(_))),
            "over max_bulk"
        );
        assert!(matches!(parse(b"*99999\r\n").await, Err(ProtocolError::Bad(_))));
        assert!(matches!(parse(b"*1\r\n$2\r\nabcd\r\n").await, Err(ProtocolError::Bad(_))));
    }

    #[test]
    fn replies_are_framed() {
        let mut out = Vec::new();
        let reply = Reply::Array(Some(vec![
            Reply::text("q"),
            Reply::Int(-3),
            Reply::Bulk(None),
            Reply::Array(None),
            Reply::Error("ERR a\r\nb".into()),
        ]));
        reply.write(&mut out);
        assert_eq!(out, b"*5\r\n$1\r\nq\r\n:-3\r\n$-1\r\n*-1\r\n-ERR a  b\r\n".to_vec());
    }
}
