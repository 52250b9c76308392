#!/usr/bin/env python3
"""Publish delayed jobs to delayd over its lmstfy-compatible HTTP API.

Standard library only. Each job's body is "<prefix>-<n>"; for every job published this prints
one line: "published <job_id> <body>".

    python3 producer.py --count 5 --delay 10 --namespace demo --queue emails

The node's address and the namespace token come from --url/--token or from DELAYD_URL and
DELAYD_TOKEN. A non-2xx answer stops the program with the status and delayd's error message.
"""

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request


class DelaydError(Exception):
    """delayd answered with a status outside 2xx, or could not be reached."""


def request(method, url, token, body=None, timeout=30.0):
    """Send one request; return (status, parsed JSON body or None)."""
    headers = {"X-Token": token} if token else {}
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, _json(resp.read())
    except urllib.error.HTTPError as e:
        # urllib raises on every status >= 400; the caller decides which ones are errors.
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


def publish(base, token, namespace, queue, body, delay, ttl, tries):
    """PUT /api/{ns}/{q}: one job; returns its id."""
    query = urllib.parse.urlencode({"delay": delay, "ttl": ttl, "tries": tries})
    path = f"/api/{urllib.parse.quote(namespace)}/{urllib.parse.quote(queue)}"
    status, answer = request("PUT", f"{base}{path}?{query}", token, body.encode())
    if status not in (200, 201):
        message = (answer or {}).get("error", answer)
        raise DelaydError(f"publish failed: HTTP {status}: {message}")
    return answer["job_id"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=os.environ.get("DELAYD_URL", "http://127.0.0.1:7777"))
    p.add_argument("--token", default=os.environ.get("DELAYD_TOKEN", ""),
                   help="a token of the namespace (or the admin token)")
    p.add_argument("--namespace", default="demo")
    p.add_argument("--queue", default="example")
    p.add_argument("--count", type=int, default=10, help="jobs to publish")
    p.add_argument("--delay", type=int, default=0, help="seconds until each job is due")
    p.add_argument("--ttl", type=int, default=3600,
                   help="seconds a job lives unconsumed (0: forever)")
    p.add_argument("--tries", type=int, default=3, help="deliveries before the dead letter")
    p.add_argument("--prefix", default="job", help="bodies are <prefix>-<n>")
    args = p.parse_args()

    base = args.url.rstrip("/")
    try:
        for n in range(args.count):
            body = f"{args.prefix}-{n}"
            job_id = publish(base, args.token, args.namespace, args.queue, body,
                             args.delay, args.ttl, args.tries)
            print(f"published {job_id} {body}", flush=True)
    except DelaydError as e:
        print(f"producer: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
