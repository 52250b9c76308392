#!/usr/bin/env python3
"""Client scenarios for a Disque-protocol server, using redis-py's raw commands.

Each scenario sends Disque commands through `redis.Redis.execute_command`
and checks the replies against Disque's documented behaviour: ADDJOB returns
a "D-" id; GETJOB returns [queue, id, body] per job (None when nothing
comes); a job not acknowledged within RETRY is delivered again, at once after
NACK; DELAY holds a job back; WORKING extends the lease; GETJOB with several
queues, TIMEOUT and COUNT; QLEN, QPEEK, JSHOW, ACKJOB, FASTACK and DELJOB;
DEQUEUE, QSCAN and JSCAN; HELLO listing the cluster's nodes (--nodes).

    pip install redis
    python3 tests/protocols/disque_clients.py --addr 127.0.0.1:7711 [--auth TOKEN] [--nodes 3]

With --auth, every connection sends `AUTH TOKEN` before anything else.
Queues are named with a random suffix, so reruns against a long-lived server
do not collide. One line is printed per scenario passed; the first failure is
reported and the script exits 1.

redis-py is pinned to RESP2 (Disque's HELLO is not Redis's handshake) and
told not to send CLIENT SETINFO, so the server sees only the commands below.
"""

import argparse
import inspect
import secrets
import sys
import threading
import time

import redis

ADDR: tuple[str, int] = ("127.0.0.1", 7711)
AUTH: str | None = None
IO_TIMEOUT = 10.0
SUFFIX = secrets.token_hex(4)
NODES = 1  # how many nodes HELLO must list (--nodes)
ADD_TIMEOUT_MS = "5000"  # ADDJOB's replication timeout (delayd accepts and ignores it)


class ScenarioFailed(Exception):
    """A scenario's expectation did not hold."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ScenarioFailed(message)


def check_eq(actual, expected, what: str) -> None:
    check(actual == expected, f"{what}: expected {expected!r}, got {actual!r}")


def queue(name: str) -> str:
    """A queue name private to this run."""
    return f"dq-{name}-{SUFFIX}"


def connect() -> redis.Redis:
    """A RESP2 connection that sends AUTH first when a token was given."""
    options = dict(host=ADDR[0], port=ADDR[1], password=AUTH, protocol=2, socket_timeout=IO_TIMEOUT)
    parameters = inspect.signature(redis.Redis.__init__).parameters
    if "driver_info" in parameters:  # redis-py >= 7: no CLIENT SETINFO on connect
        options["driver_info"] = None
    elif "lib_name" in parameters:
        options.update(lib_name=None, lib_version=None)
    return redis.Redis(**options)


class Disque:
    """Thin helpers over execute_command; replies stay as the server sent them."""

    def __init__(self) -> None:
        self.r = connect()

    def close(self) -> None:
        self.r.close()

    def __enter__(self) -> "Disque":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def addjob(self, q: str, body: bytes, *options) -> str:
        reply = self.r.execute_command("ADDJOB", q, body, ADD_TIMEOUT_MS, *options)
        job_id = reply.decode() if isinstance(reply, bytes) else reply
        check(isinstance(job_id, str) and job_id.startswith("D-"), f"ADDJOB reply {reply!r}: expected a D- id")
        return job_id

    def getjob(self, *args) -> list[tuple[str, str, bytes]] | None:
        """GETJOB ... FROM ...: the jobs as (queue, id, body), or None for the null reply."""
        reply = self.r.execute_command("GETJOB", *args)
        if reply is None:
            return None
        check(isinstance(reply, list) and len(reply) > 0, f"GETJOB reply {reply!r}: expected a non-empty array or nil")
        jobs = []
        for item in reply:
            check(isinstance(item, list) and len(item) >= 3, f"GETJOB item {item!r}: expected [queue, id, body]")
            jobs.append((item[0].decode(), item[1].decode(), item[2]))
        return jobs

    def getjob_with_counters(self, *args) -> dict[str, object]:
        """One job from GETJOB WITHCOUNTERS, as {queue, id, body, nacks, additional-deliveries}."""
        reply = self.r.execute_command("GETJOB", "WITHCOUNTERS", *args)
        check(isinstance(reply, list) and len(reply) == 1, f"GETJOB WITHCOUNTERS reply {reply!r}: expected one job")
        item = reply[0]
        check(len(item) == 7, f"GETJOB WITHCOUNTERS item {item!r}: expected 7 fields")
        job = {"queue": item[0].decode(), "id": item[1].decode(), "body": item[2]}
        job.update({item[i].decode(): item[i + 1] for i in (3, 5)})
        return job

    def count(self, command: str, *args) -> int:
        reply = self.r.execute_command(command, *args)
        check(isinstance(reply, int), f"{command} reply {reply!r}: expected an integer")
        return reply

    def jshow(self, job_id: str) -> dict[str, object] | None:
        reply = self.r.execute_command("JSHOW", job_id)
        if reply is None:
            return None
        check(isinstance(reply, list) and len(reply) % 2 == 0, f"JSHOW reply {reply!r}: expected field/value pairs")
        fields = {}
        for key, value in zip(reply[::2], reply[1::2]):
            if isinstance(value, bytes) and key != b"body":
                value = value.decode()
            fields[key.decode()] = value
        return fields


def timed(fn, *args):
    """Runs fn and returns (its result, seconds taken)."""
    start = time.monotonic()
    result = fn(*args)
    return result, time.monotonic() - start


def ids(jobs) -> list[str]:
    return [job_id for _, job_id, _ in jobs or []]


# --- scenarios ----------------------------------------------------------------


def add_get_ack() -> None:
    q = queue("basic")
    body = "naïve café ✓ 日本語 ".encode() + bytes([0, 1, 255]) + b"\r\nafter CRLF"
    with Disque() as d:
        job_id = d.addjob(q, body)
        check_eq(d.count("QLEN", q), 1, "QLEN after ADDJOB")
        peeked = d.r.execute_command("QPEEK", q, 1)
        check(isinstance(peeked, list) and len(peeked) == 1, f"QPEEK reply {peeked!r}: expected one job")
        check_eq((peeked[0][1].decode(), peeked[0][2]), (job_id, body), "QPEEK id and body")
        shown = d.jshow(job_id)
        check(shown is not None, "JSHOW of a queued job answered nil")
        check_eq((shown["id"], shown["queue"], shown["state"]), (job_id, q, "queued"), "JSHOW id/queue/state")

        check_eq(d.getjob("NOHANG", "FROM", q), [(q, job_id, body)], "GETJOB NOHANG")
        check_eq(d.count("QLEN", q), 0, "QLEN while the job is delivered")
        shown = d.jshow(job_id)
        check_eq(shown and shown["state"], "active", "JSHOW state once delivered")
        check_eq(d.getjob("NOHANG", "FROM", q), None, "GETJOB NOHANG while the only job is delivered")
        check_eq(d.count("ACKJOB", job_id), 1, "ACKJOB")
        check_eq(d.count("ACKJOB", job_id), 0, "second ACKJOB of the same id")
        shown = d.jshow(job_id)
        check(shown is None or shown["state"] == "acked", f"JSHOW after ACKJOB: {shown!r}")

        fast_id = d.addjob(q, b"fast")
        check_eq(ids(d.getjob("NOHANG", "FROM", q)), [fast_id], "GETJOB before FASTACK")
        check_eq(d.count("FASTACK", fast_id), 1, "FASTACK")

        doomed = d.addjob(q, b"never delivered")
        check_eq(d.count("DELJOB", doomed), 1, "DELJOB of a queued job")
        check_eq(d.jshow(doomed), None, "JSHOW after DELJOB")
        check_eq(d.count("QLEN", q), 0, "QLEN after DELJOB")
        check_eq(d.getjob("NOHANG", "FROM", q), None, "GETJOB NOHANG on the emptied queue")


def delay() -> None:
    q = queue("delay")
    with Disque() as d:
        added_at = time.monotonic()
        job_id = d.addjob(q, b"later", "DELAY", "1")
        check_eq(d.getjob("NOHANG", "FROM", q), None, "GETJOB NOHANG right after ADDJOB DELAY 1")
        check_eq(d.count("QLEN", q), 0, "QLEN while delayed")
        jobs = d.getjob("TIMEOUT", "3000", "FROM", q)
        waited = time.monotonic() - added_at
        check_eq(ids(jobs), [job_id], "GETJOB TIMEOUT 3000 for a DELAY 1 job")
        check(waited >= 0.8, f"DELAY 1 job delivered {waited:.2f} s after ADDJOB")
        check_eq(d.count("ACKJOB", job_id), 1, "ACKJOB of the delayed job")


def retry_redelivers() -> None:
    q = queue("retry")
    with Disque() as d:
        job_id = d.addjob(q, b"retry me", "RETRY", "1")
        check_eq(ids(d.getjob("NOHANG", "FROM", q)), [job_id], "first delivery")
        check_eq(d.getjob("NOHANG", "FROM", q), None, "GETJOB NOHANG right after delivery")
        start = time.monotonic()
        again = d.getjob_with_counters("TIMEOUT", "3000", "FROM", q)
        waited = time.monotonic() - start
        check_eq(again["id"], job_id, "redelivered id")
        check_eq(again["body"], b"retry me", "redelivered body")
        check(waited >= 0.5, f"redelivered {waited:.2f} s after the first delivery, before RETRY 1 ran out")
        check_eq(again["additional-deliveries"], 1, "additional-deliveries after one redelivery")
        check_eq(d.count("ACKJOB", job_id), 1, "ACKJOB after redelivery")


def nack_redelivers_at_once() -> None:
    q = queue("nack")
    with Disque() as d:
        job_id = d.addjob(q, b"nack me", "RETRY", "60")
        check_eq(ids(d.getjob("NOHANG", "FROM", q)), [job_id], "first delivery")
        check_eq(d.count("NACK", job_id), 1, "NACK")
        check_eq(ids(d.getjob("NOHANG", "FROM", q)), [job_id], "GETJOB NOHANG right after NACK")
        check_eq(d.count("ACKJOB", job_id), 1, "ACKJOB after NACK")
        check_eq(d.count("NACK", job_id), 0, "NACK of an acknowledged job")


def working_extends_lease() -> None:
    q = queue("working")
    with Disque() as d:
        job_id = d.addjob(q, b"long task", "RETRY", "30")
        check_eq(ids(d.getjob("NOHANG", "FROM", q)), [job_id], "delivery")
        seconds = d.r.execute_command("WORKING", job_id)
        check(isinstance(seconds, int) and seconds > 0, f"WORKING reply {seconds!r}: expected a positive integer")
        check_eq(d.getjob("NOHANG", "FROM", q), None, "GETJOB NOHANG after WORKING")
        check_eq(d.count("DELJOB", job_id), 1, "DELJOB of a delivered job")
        try:
            reply = d.r.execute_command("WORKING", job_id)
        except redis.ResponseError:
            pass
        else:
            raise ScenarioFailed(f"WORKING of a deleted job: expected an error, got {reply!r}")


def multi_queue_getjob() -> None:
    q1, q2 = queue("multi-1"), queue("multi-2")
    with Disque() as d:
        jobs, took = timed(d.getjob, "TIMEOUT", "200", "FROM", q1, q2)
        check_eq(jobs, None, "GETJOB TIMEOUT 200 on two empty queues")
        check(0.15 <= took <= 2.0, f"GETJOB TIMEOUT 200 took {took:.2f} s")

        in_q2 = d.addjob(q2, b"in q2")
        check_eq(d.getjob("NOHANG", "FROM", q1, q2), [(q2, in_q2, b"in q2")], "GETJOB FROM q1 q2 with a job in q2")
        second_q2 = d.addjob(q2, b"q2 again")
        in_q1 = d.addjob(q1, b"in q1")
        check_eq(ids(d.getjob("NOHANG", "FROM", q1, q2)), [in_q1], "GETJOB FROM q1 q2 with jobs in both")
        check_eq(ids(d.getjob("NOHANG", "FROM", q1, q2)), [second_q2], "then the job in q2")
        check_eq(d.count("ACKJOB", in_q2, second_q2, in_q1), 3, "ACKJOB of three ids")

    # A waiting GETJOB gets a job added by another connection while it waits.
    added: list[str] = []
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            time.sleep(0.3)  # give the GETJOB time to start waiting; it gets the job either way
            with Disque() as p:
                added.append(p.addjob(q2, b"while you wait"))
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    with Disque() as d:
        thread = threading.Thread(target=producer, daemon=True)
        thread.start()
        jobs = d.getjob("TIMEOUT", "5000", "FROM", q1, q2)
        thread.join(IO_TIMEOUT)
        check(not errors, f"producer failed: {errors and errors[0]!r}")
        check_eq(ids(jobs), added, "job added while GETJOB waited")
        check_eq(d.count("ACKJOB", *added), 1, "ACKJOB of the waited-for job")


def count_limits_batch() -> None:
    q = queue("count")
    with Disque() as d:
        added = [d.addjob(q, f"job {i}".encode()) for i in range(5)]
        first = d.getjob("NOHANG", "COUNT", "3", "FROM", q)
        check(first is not None and len(first) == 3, f"GETJOB COUNT 3 with 5 queued: got {ids(first)}")
        check_eq(sorted(ids(first)), sorted(added[:3]), "GETJOB COUNT 3 takes the oldest three")
        rest = d.getjob("NOHANG", "COUNT", "3", "FROM", q)
        check_eq(sorted(ids(rest)), sorted(added[3:]), "GETJOB COUNT 3 with 2 left")
        check_eq(d.getjob("NOHANG", "COUNT", "3", "FROM", q), None, "GETJOB COUNT 3 on the emptied queue")
        check_eq(d.count("ACKJOB", *added), 5, "ACKJOB of five ids")


def dequeue_and_scans() -> None:
    q = queue("scan")
    other = queue("scan-other")
    with Disque() as d:
        added = [d.addjob(q, f"scan {i}".encode(), "RETRY", "1") for i in range(3)]
        d.addjob(other, b"elsewhere")
        # DEQUEUE takes a queued job out of its queue without delivering it; it comes back
        # once its RETRY runs out.
        check_eq(d.count("DEQUEUE", added[0]), 1, "DEQUEUE of a queued job")
        check_eq(d.count("QLEN", q), 2, "QLEN after DEQUEUE")
        check_eq((d.jshow(added[0]) or {}).get("state"), "active", "JSHOW state after DEQUEUE")
        back = None
        deadline = time.monotonic() + 5
        while back is None and time.monotonic() < deadline:
            check_eq(d.count("QLEN", q) >= 2, True, "QLEN while waiting")
            if d.count("QLEN", q) == 3:
                back = True
            else:
                time.sleep(0.05)
        check(back is not None, "the dequeued job did not come back after its RETRY")

        # QSCAN lists queues, filtered by their length.
        cursor, names = d.r.execute_command("QSCAN", "COUNT", "100", "MINLEN", "3")
        names = [n.decode() for n in names]
        check(q in names and other not in names, f"QSCAN MINLEN 3: got {names}")
        cursor, names = d.r.execute_command("QSCAN", "MAXLEN", "1")
        names = [n.decode() for n in names]
        check(other in names and q not in names, f"QSCAN MAXLEN 1: got {names}")

        # JSCAN pages through a queue's jobs with a cursor, ending at cursor 0.
        seen, cursor, pages = [], b"0", 0
        while True:
            cursor, page = d.r.execute_command("JSCAN", cursor, "COUNT", "2", "QUEUE", q)
            seen.extend(job.decode() for job in page)
            pages += 1
            check(pages <= 10, "JSCAN did not end")
            if cursor in (b"0", 0):
                break
        check_eq(sorted(seen), sorted(added), "JSCAN of the queue, two per page")
        _, page = d.r.execute_command("JSCAN", "0", "QUEUE", q, "STATE", "queued", "REPLY", "all")
        check_eq(len(page), 3, "JSCAN STATE queued REPLY all")
        check(all(b"body" in job for job in page), f"JSCAN REPLY all shows jobs: {page[:1]}")
        check_eq(d.count("ACKJOB", *added), 3, "ACKJOB of the scanned jobs")


def hello_lists_nodes() -> None:
    with Disque() as d:
        reply = d.r.execute_command("HELLO")
        check(isinstance(reply, list) and len(reply) >= 3, f"HELLO reply {reply!r}")
        check_eq(reply[0], 1, "HELLO version")
        nodes = reply[2:]
        check(len(nodes) >= NODES, f"HELLO lists {len(nodes)} nodes, expected {NODES}: {nodes}")
        for node in nodes:
            check(len(node) == 4 and node[2].decode().isdigit(), f"HELLO node {node!r}")
        check(any(node[0] == reply[1] for node in nodes), "HELLO lists the node answering")


SCENARIOS = [
    ("ADDJOB/GETJOB/ACKJOB, QLEN, QPEEK, JSHOW, FASTACK, DELJOB", add_get_ack),
    ("DELAY", delay),
    ("RETRY redelivers a job not acknowledged", retry_redelivers),
    ("NACK redelivers at once", nack_redelivers_at_once),
    ("WORKING", working_extends_lease),
    ("GETJOB from several queues, TIMEOUT, a waiting GETJOB", multi_queue_getjob),
    ("GETJOB COUNT", count_limits_batch),
    ("DEQUEUE, QSCAN, JSCAN", dequeue_and_scans),
    ("HELLO lists the cluster's nodes", hello_lists_nodes),
]


def parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected host:port, got {text!r}")
    return host, int(port)


def main() -> int:
    global ADDR, AUTH, IO_TIMEOUT, NODES
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--addr", type=parse_addr, required=True, help="Disque-protocol server, host:port")
    parser.add_argument("--auth", metavar="TOKEN", help="send AUTH TOKEN on every connection first")
    parser.add_argument("--io-timeout", type=float, default=IO_TIMEOUT,
                        help="seconds any single reply may take (default %(default)s)")
    parser.add_argument("--nodes", type=int, default=NODES,
                        help="how many nodes HELLO must list (default %(default)s)")
    args = parser.parse_args()
    ADDR, AUTH, IO_TIMEOUT, NODES = args.addr, args.auth, args.io_timeout, args.nodes

    for name, scenario in SCENARIOS:
        try:
            scenario()
        except ScenarioFailed as e:
            print(f"FAIL {name}: {e}", file=sys.stderr)
            return 1
        except Exception as e:  # an error reply, a dropped connection, a malformed reply
            print(f"FAIL {name}: unexpected {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        print(f"ok   {name}")
    print(f"{len(SCENARIOS)} scenarios passed (queue suffix {SUFFIX})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
