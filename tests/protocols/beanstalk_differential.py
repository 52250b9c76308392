#!/usr/bin/env python3
"""Differential test of a beanstalkd-protocol server against the real beanstalkd.

One fixed script of raw protocol commands (exact bytes over plain sockets, no
client library) runs against two servers: --expected (the real beanstalkd)
and --actual (delayd). Their replies are normalised and compared step by step.

    beanstalkd -l 127.0.0.1 -p 11300 &
    python3 tests/protocols/beanstalk_differential.py \\
        --expected 127.0.0.1:11300 --actual 127.0.0.1:11301

Normalisation covers only what legitimately differs between two servers:

  * job ids: each server's ids become ordinals in order of first appearance,
    so "INSERTED 17" and "INSERTED 3" both read "INSERTED #1". The script
    names jobs the same way ("delete #1"), translated per server.
  * YAML bodies: stats-job and stats-tube compare only the keys in
    STATS_JOB_KEYS / STATS_TUBE_KEYS; `stats` only has to answer OK; lists
    (list-tubes-watched) are compared as sorted sets.
  * OK <bytes> byte counts, which follow from the body.

Tube names carry a random suffix shared by both runs, so the script can run
against long-lived servers. The script runs on --expected first, then on
--actual, each on its own connections. On success it prints
"N commands, replies identical"; otherwise a table of the differing steps,
and exits 1.
"""

import argparse
import re
import secrets
import socket
import sys
import time
from dataclasses import dataclass

# delayd derives `delay` from the job's due time, so a kicked job shows 0 where beanstalkd
# keeps its last put/release delay: a documented difference (docs/protocols.md), left out.
STATS_JOB_KEYS = ("id", "tube", "state", "pri", "ttr", "reserves", "timeouts", "releases", "buries", "kicks")
STATS_TUBE_KEYS = (
    "name",
    "current-jobs-urgent",
    "current-jobs-ready",
    "current-jobs-reserved",
    "current-jobs-delayed",
    "current-jobs-buried",
    "pause",
)

# Tube names used by the script: $A, $B and $NONE (never created).
SUFFIX = secrets.token_hex(4)
TUBES = {"$A": f"diff-a-{SUFFIX}", "$B": f"diff-b-{SUFFIX}", "$NONE": f"diff-none-{SUFFIX}"}

# A job id no server will have handed out by the time the script runs.
UNKNOWN_ID = "987654321987"

BODY_BINARY = "ünïcødé ✓ ".encode() + bytes([0, 255]) + b"\r\nline two"


@dataclass
class Step:
    """One protocol exchange on a named connection.

    kind is "cmd" (send, read one reply), "send" (send, leave the reply
    pending), "recv" (read the pending reply; line names the command for the
    report), "raw" (send exact bytes, read one reply), "close" (close the
    connection) or "sleep".
    """

    kind: str
    conn: str = ""
    line: str = ""
    body: bytes | None = None
    data: bytes = b""
    seconds: float = 0.0

    def label(self) -> str:
        if self.kind == "raw":
            return f"{self.conn}> raw {self.data[:40]!r}"
        if self.kind == "close":
            return f"{self.conn}> <close>"
        if self.kind == "recv":
            return f"{self.conn}> <reply to {self.line}>"
        text = f"{self.conn}> {self.line}"
        if self.body is not None:
            text += f" +{len(self.body)} bytes"
        return text


def cmd(conn: str, line: str, body: bytes | None = None) -> Step:
    return Step("cmd", conn, line, body)


def put(conn: str, pri: int, delay: int, ttr: int, body: bytes) -> Step:
    return cmd(conn, f"put {pri} {delay} {ttr} {len(body)}", body)


SCRIPT: list[Step] = [
    # use / watch / ignore / lists
    cmd("a", "list-tube-used"),
    cmd("a", "use $A"),
    cmd("a", "list-tube-used"),
    cmd("a", "list-tubes-watched"),
    cmd("a", "watch $A"),
    cmd("a", "watch $A"),
    cmd("a", "ignore default"),
    cmd("a", "ignore $A"),  # the last watched tube: NOT_IGNORED
    cmd("a", "ignore $B"),  # not watched: the count is unchanged
    cmd("a", "list-tubes-watched"),
    cmd("b", "use $A"),
    cmd("b", "watch $A"),
    cmd("b", "watch $B"),
    cmd("b", "ignore default"),
    cmd("b", "list-tubes-watched"),
    # empty tube
    cmd("a", "reserve-with-timeout 0"),
    cmd("a", "peek-ready"),
    cmd("a", "peek-delayed"),
    cmd("a", "peek-buried"),
    cmd("a", f"delete {UNKNOWN_ID}"),
    cmd("a", f"peek {UNKNOWN_ID}"),
    cmd("a", f"stats-job {UNKNOWN_ID}"),
    cmd("a", "stats-tube $NONE"),
    # malformed commands, each followed by a command that shows the connection is still in step
    Step("raw", "a", data=b"put x 0 60 3\r\n"),
    cmd("a", "list-tube-used"),
    Step("raw", "a", data=b"put 0 0 60 2\r\nabcd"),  # 2 bytes announced, "cd" where CRLF belongs
    cmd("a", "list-tube-used"),
    cmd("a", "frobnicate"),
    cmd("a", "list-tube-used"),
    cmd("a", "put 0 0 60"),
    cmd("a", "delete x"),
    cmd("a", "list-tube-used"),
    # put / peek / reserve / delete
    put("a", 100, 0, 60, b"hello"),  # #1
    put("a", 50, 0, 60, b""),  # #2
    put("a", 10, 0, 60, BODY_BINARY),  # #3
    cmd("a", "peek-ready"),
    cmd("a", "peek #1"),
    cmd("a", "stats-job #1"),
    cmd("a", "stats-tube $A"),
    cmd("a", "reserve-with-timeout 0"),  # #3, the lowest pri
    cmd("a", "stats-job #3"),
    cmd("a", "stats-tube $A"),
    # a reservation belongs to its connection
    cmd("b", "delete #3"),
    cmd("b", "release #3 1 0"),
    cmd("b", "bury #3 1"),
    cmd("b", "touch #3"),
    cmd("b", "reserve-job #3"),
    cmd("a", "reserve-job #3"),
    cmd("a", "kick-job #3"),
    cmd("b", "peek #3"),
    cmd("a", "touch #3"),
    cmd("a", "delete #3"),
    cmd("a", "delete #3"),
    cmd("a", "peek #3"),
    cmd("a", "stats-job #3"),
    cmd("a", "kick-job #1"),  # ready: NOT_FOUND
    cmd("b", "delete #2"),  # a ready job: any connection may delete it
    # release
    cmd("a", "reserve"),  # #1, ready, so this does not block
    cmd("a", "release #1 5 0"),
    cmd("a", "stats-job #1"),
    cmd("a", "reserve-with-timeout 0"),
    cmd("a", "release #1 7 100"),
    cmd("a", "stats-job #1"),
    cmd("a", "peek-delayed"),
    cmd("a", "reserve-with-timeout 0"),
    cmd("a", "release #1 0 0"),  # delayed, not reserved
    # delays and kick
    put("a", 20, 100, 60, b"delayed 100"),  # #4
    put("a", 30, 50, 60, b"delayed 50"),  # #5
    cmd("a", "peek-delayed"),  # the soonest: #5
    cmd("a", "kick 1"),
    cmd("a", "peek-delayed"),
    cmd("a", "peek-ready"),
    cmd("a", "kick-job #4"),
    cmd("a", "stats-job #4"),
    cmd("a", "kick 10"),
    cmd("a", "peek-delayed"),
    cmd("a", "stats-tube $A"),
    # bury
    cmd("a", "reserve-with-timeout 0"),  # #1 (pri 7)
    cmd("a", "bury #1 9"),
    cmd("a", "stats-job #1"),
    cmd("a", "peek-buried"),
    cmd("a", "reserve-with-timeout 0"),  # #4 (pri 20)
    cmd("a", "bury #4 3"),
    cmd("a", "peek-buried"),  # the first buried: #1
    put("a", 0, 100, 60, b"delayed again"),  # #6
    cmd("a", "stats-tube $A"),
    cmd("a", "kick 1"),  # buried jobs first
    cmd("a", "peek-buried"),
    cmd("a", "kick 10"),
    cmd("a", "kick 10"),  # only now the delayed job
    cmd("a", "kick 10"),
    cmd("a", "stats-tube $A"),
    cmd("a", "bury #5 0"),  # ready, not reserved
    # reserve-job: ready, buried and delayed jobs, by any connection
    cmd("b", "reserve-job #5"),
    cmd("b", "bury #5 1"),
    cmd("a", "reserve-job #5"),
    cmd("a", "kick-job #5"),
    cmd("a", "release #5 2 100"),
    cmd("b", "reserve-job #5"),
    cmd("b", "stats-job #5"),
    cmd("b", "delete #5"),
    cmd("a", "delete #1"),
    cmd("a", "delete #4"),
    cmd("a", "delete #6"),
    cmd("a", "stats-tube $A"),
    # priorities across watched tubes, then age among equals
    cmd("c", "use $A"),
    put("c", 100, 0, 60, b"A pri 100"),  # #7
    cmd("c", "use $B"),
    put("c", 1, 0, 60, b"B pri 1"),  # #8
    cmd("b", "reserve-with-timeout 0"),
    cmd("b", "reserve-with-timeout 0"),
    cmd("c", "use $A"),
    put("c", 50, 0, 60, b"first"),  # #9
    cmd("c", "use $B"),
    put("c", 50, 0, 60, b"second"),  # #10
    cmd("c", "use $A"),
    put("c", 50, 0, 60, b"third"),  # #11
    cmd("b", "reserve-with-timeout 0"),
    cmd("b", "reserve-with-timeout 0"),
    cmd("b", "reserve-with-timeout 0"),
    *[cmd("b", f"delete #{n}") for n in range(7, 12)],
    # a job within a second of its TTR: DEADLINE_SOON; a ttr of 0 becomes 1
    cmd("c", "use $B"),
    cmd("c", "watch $B"),
    cmd("c", "ignore default"),
    put("c", 0, 0, 1, b"ttr 1"),  # #12
    cmd("c", "reserve-with-timeout 0"),
    cmd("c", "reserve-with-timeout 0"),
    cmd("c", "stats-job #12"),
    cmd("c", "delete #12"),
    put("c", 0, 0, 0, b"ttr 0"),  # #13
    cmd("c", "stats-job #13"),
    cmd("c", "delete #13"),
    # closing a connection releases its reservations
    cmd("c", "use $A"),
    put("c", 0, 0, 60, b"held"),  # #14
    cmd("a", "reserve-with-timeout 0"),
    Step("close", "a"),
    cmd("b", "reserve-with-timeout 2"),
    cmd("b", "stats-job #14"),
    cmd("b", "delete #14"),
    # a waiting reserve gets a job put by another connection
    Step("send", "b", "reserve"),
    Step("sleep", seconds=0.2),  # let the reserve start waiting; the outcome is the same either way
    cmd("c", "use $B"),
    put("c", 0, 0, 60, b"while you wait"),  # #15
    Step("recv", "b", "reserve"),
    cmd("b", "delete #15"),
    # pause-tube
    put("c", 0, 0, 60, b"paused"),  # #16
    cmd("c", "pause-tube $B 100"),
    cmd("b", "reserve-with-timeout 0"),
    cmd("c", "stats-tube $B"),
    cmd("c", "peek-ready"),
    cmd("c", "pause-tube $B 0"),
    cmd("b", "reserve-with-timeout 0"),
    cmd("b", "delete #16"),
    cmd("c", "pause-tube $NONE 10"),
    cmd("c", "stats-tube $B"),
    # server stats (only that it answers OK) and quit
    cmd("c", "stats"),
    cmd("c", "quit"),
]


class Session:
    """Runs the script against one server, normalising its replies."""

    def __init__(self, addr: tuple[str, int], timeout: float):
        self.addr = addr
        self.timeout = timeout
        self.conns: dict[str, tuple[socket.socket, object]] = {}
        self.dead: set[str] = set()
        self.pending: dict[str, str] = {}  # connection -> command whose reply is unread
        self.ordinal_of: dict[int, int] = {}  # server's job id -> placeholder number
        self.id_of: dict[int, int] = {}  # placeholder number -> server's job id

    def conn(self, name: str):
        if name not in self.conns:
            sock = socket.create_connection(self.addr, timeout=self.timeout)
            self.conns[name] = (sock, sock.makefile("rb"))
        return self.conns[name]

    def close_all(self) -> None:
        for sock, reader in self.conns.values():
            reader.close()
            sock.close()

    # --- ids ---

    def translate(self, line: str) -> str:
        """Replaces tube names and #n placeholders with this server's values."""
        for placeholder, name in TUBES.items():
            line = line.replace(placeholder, name)

        def job_id(m: re.Match) -> str:
            n = int(m.group(1))
            if n not in self.id_of:
                return f"<no job #{n} on this server>"
            return str(self.id_of[n])

        return re.sub(r"#(\d+)", job_id, line)

    def placeholder(self, raw_id: bytes) -> str:
        try:
            job_id = int(raw_id)
        except ValueError:
            return raw_id.decode(errors="replace")
        if job_id not in self.ordinal_of:
            n = len(self.ordinal_of) + 1
            self.ordinal_of[job_id] = n
            self.id_of[n] = job_id
        return f"#{self.ordinal_of[job_id]}"

    # --- running ---

    def run(self, step: Step) -> str | None:
        """Runs one step; returns its normalised reply (None for steps without one)."""
        if step.kind == "sleep":
            time.sleep(step.seconds)
            return None
        if step.conn in self.dead:
            return "<connection already lost>"
        if step.kind == "close":
            if step.conn in self.conns:
                sock, reader = self.conns.pop(step.conn)
                reader.close()
                sock.close()
            self.dead.add(step.conn)
            return None
        try:
            sock, reader = self.conn(step.conn)
            if step.kind == "recv":
                return self.read_reply(step.conn, reader, self.pending.pop(step.conn))
            if step.kind == "raw":
                sock.sendall(step.data)
                return self.read_reply(step.conn, reader, step.data.decode(errors="replace"))
            line = self.translate(step.line)
            data = line.encode() + b"\r\n"
            if step.body is not None:
                data += step.body + b"\r\n"
            sock.sendall(data)
            if step.kind == "send":
                self.pending[step.conn] = line
                return None
            return self.read_reply(step.conn, reader, line)
        except (TimeoutError, socket.timeout):
            self.dead.add(step.conn)
            return f"<no reply within {self.timeout:g} s>"
        except OSError as e:
            self.dead.add(step.conn)
            return f"<{type(e).__name__}: {e}>"

    def read_reply(self, conn: str, reader, command: str) -> str:
        line = reader.readline()
        if not line:
            self.dead.add(conn)
            return "<connection closed>"
        if not line.endswith(b"\r\n"):
            self.dead.add(conn)
            return f"<reply without CRLF: {line!r}>"
        words = line[:-2].split(b" ")
        status = words[0]
        if status in (b"INSERTED", b"BURIED") and len(words) == 2:
            return f"{status.decode()} {self.placeholder(words[1])}"
        if status in (b"RESERVED", b"FOUND") and len(words) == 3 and words[2].isdigit():
            body = self.read_body(conn, reader, words[2])
            return f"{status.decode()} {self.placeholder(words[1])} {words[2].decode()} {body!r}"
        if status == b"OK" and len(words) == 2 and words[1].isdigit():
            body = self.read_body(conn, reader, words[1])
            return "OK " + self.normalise_yaml(command, body)
        return line[:-2].decode(errors="replace")

    def read_body(self, conn: str, reader, size: bytes) -> bytes:
        data = reader.read(int(size) + 2)
        if not data.endswith(b"\r\n") or len(data) != int(size) + 2:
            self.dead.add(conn)
            return data + b"<body not followed by CRLF>"
        return data[:-2]

    def normalise_yaml(self, command: str, body: bytes) -> str:
        text = body.decode(errors="replace")
        verb = command.split(" ", 1)[0]
        if verb == "stats":
            return "<server stats>"
        lines = text.split("\n")
        if lines[0] != "---":
            return f"<not YAML: {text!r}>"
        lines = [line for line in lines[1:] if line]
        if verb in ("list-tubes-watched", "list-tubes"):
            return "[" + ", ".join(sorted(line.removeprefix("- ") for line in lines)) + "]"
        fields = dict(line.split(": ", 1) for line in lines if ": " in line)
        keys = {"stats-job": STATS_JOB_KEYS, "stats-tube": STATS_TUBE_KEYS}.get(verb)
        if keys is None:
            return repr(text)
        if "id" in fields:
            fields["id"] = self.placeholder(fields["id"].encode())
        return "{" + ", ".join(f"{k}: {fields.get(k, '<missing>')}" for k in keys) + "}"


def run_script(addr: tuple[str, int], timeout: float) -> list[str | None]:
    session = Session(addr, timeout)
    try:
        return [session.run(step) for step in SCRIPT]
    finally:
        session.close_all()


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def print_table(rows: list[tuple[str, str, str, str]], width: int) -> None:
    header = ("step", "command", "expected", "actual")
    widths = [min(width, max(len(r[i]) for r in [header, *rows])) for i in range(4)]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(clip(cell, w).ljust(w) for cell, w in zip(row, widths)).rstrip())


def parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected host:port, got {text!r}")
    return host, int(port)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--expected", type=parse_addr, required=True, help="the real beanstalkd, host:port")
    parser.add_argument("--actual", type=parse_addr, required=True, help="the server under test, host:port")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for any reply (default %(default)s)")
    parser.add_argument("--width", type=int, default=60, help="widest table column (default %(default)s)")
    parser.add_argument("--transcript", action="store_true", help="print every step, not only those that differ")
    args = parser.parse_args()

    for role in ("expected", "actual"):
        addr = getattr(args, role)
        try:
            socket.create_connection(addr, timeout=args.timeout).close()
        except OSError as e:
            print(f"cannot connect to the {role} server {addr[0]}:{addr[1]}: {e}", file=sys.stderr)
            return 2
    results = {role: run_script(getattr(args, role), args.timeout) for role in ("expected", "actual")}

    rows = []
    commands = differing = 0
    for number, (step, want, got) in enumerate(zip(SCRIPT, results["expected"], results["actual"]), 1):
        if step.kind in ("sleep", "close", "send"):
            continue
        commands += 1
        if want != got:
            differing += 1
        if want != got or args.transcript:
            marker = "" if want == got else " !="
            rows.append((f"{number}{marker}", step.label(), want or "", got or ""))

    if rows:
        print_table(rows, args.width)
    if differing:
        print(f"{differing} of {commands} replies differ (tube suffix {SUFFIX})")
        return 1
    print(f"{commands} commands, replies identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
