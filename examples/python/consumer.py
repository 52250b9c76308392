#!/usr/bin/env python3
"""Consume jobs from delayd over its lmstfy-compatible HTTP API, acking each one.

Standard library only. Long-polls the queue, decodes each job's body and acks the job, then
prints one line: "consumed <job_id> <received_at_unix_ms> <body>". It stops after --count jobs
(exit 0) or when --timeout seconds have passed (exit 3 if fewer than --count arrived; exit 0
with --count 0, which means "until the timeout").

    python3 consumer.py --count 5 --timeout 60 --namespace demo --queue emails

The node's address and the namespace token come from --url/--token or from DELAYD_URL and
DELAYD_TOKEN. A non-2xx answer (other than "no job available") stops the program with the
status and delayd's error message.
"""

import argparse
import base64
import json
import math
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

# The longest single long-poll; the overall deadline is --timeout.
MAX_POLL_SECONDS = 10


class DelaydError(Exception):
    """delayd answered with a status outside 2xx, or could not be reached."""


def request(method, url, token, timeout):
    """Send one request; return (status, parsed JSON body or None)."""
    headers = {"X-Token": token} if token else {}
    req = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, _json(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, _json(e.read())
    except urllib.error.URLError as e:
        raise DelaydError(f"{method} {url}: cannot reach delayd: {e.reason}") from e


def _json(raw):
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": raw.decode("utf-8", "replace")}


def _error(what, status, answer):
    message = (answer or {}).get("error", answer)
    return DelaydError(f"{what} failed: HTTP {status}: {message}")


def reserve(queue_url, token, wait, ttr):
    """GET /api/{ns}/{q}: the next job, long-polling up to `wait` s; None when none came."""
    query = urllib.parse.urlencode({"timeout": wait, "ttr": ttr})
    status, answer = request("GET", f"{queue_url}?{query}", token, timeout=wait + 10)
    if status == 404 and (answer or {}).get("msg") == "no job available":
        return None
    if status != 200:
        raise _error("reserve", status, answer)
    return answer


def ack(queue_url, token, job):
    """DELETE /api/{ns}/{q}/job/{id}: the job is done. The lease (a delayd extension) makes
    the ack apply only while this reservation holds, not to a later redelivery."""
    query = urllib.parse.urlencode({"lease": job["lease"]}) if job.get("lease") else ""
    url = f"{queue_url}/job/{urllib.parse.quote(job['job_id'])}?{query}"
    status, answer = request("DELETE", url, token, timeout=30)
    if status != 204:
        raise _error(f"ack of {job['job_id']}", status, answer)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=os.environ.get("DELAYD_URL", "http://127.0.0.1:7777"))
    p.add_argument("--token", default=os.environ.get("DELAYD_TOKEN", ""),
                   help="a token of the namespace (or the admin token)")
    p.add_argument("--namespace", default="demo")
    p.add_argument("--queue", default="example")
    p.add_argument("--count", type=int, default=10, help="stop after this many jobs (0: no limit)")
    p.add_argument("--timeout", type=float, default=60, help="stop after this many seconds")
    p.add_argument("--ttr", type=int, default=30,
                   help="seconds to ack a job before it is delivered again")
    args = p.parse_args()

    queue_url = (f"{args.url.rstrip('/')}/api/{urllib.parse.quote(args.namespace)}"
                 f"/{urllib.parse.quote(args.queue)}")
    deadline = time.monotonic() + args.timeout
    consumed = 0
    try:
        while args.count == 0 or consumed < args.count:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            job = reserve(queue_url, args.token, min(MAX_POLL_SECONDS, math.ceil(left)), args.ttr)
            if job is None:
                continue
            received_ms = time.time_ns() // 1_000_000
            body = base64.b64decode(job["data"]).decode("utf-8", "replace")
            # Do the work here; ack only once it is done, so a crash means redelivery.
            ack(queue_url, args.token, job)
            consumed += 1
            print(f"consumed {job['job_id']} {received_ms} {body}", flush=True)
    except DelaydError as e:
        print(f"consumer: {e}", file=sys.stderr)
        return 1
    if args.count and consumed < args.count:
        print(f"consumer: timed out after {args.timeout:g} s with {consumed} of {args.count} jobs",
              file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
