#!/usr/bin/env python3
"""Snapshot size and install time for N stored jobs.

Starts a 3-node cluster with scripts/local-cluster.sh, stores N delayed jobs (bulk publishes
of 64 jobs with 100-byte bodies), triggers a snapshot on the leader, then adds a fourth node
through the admin API and times how long it takes to catch up (it can only do so by
installing the snapshot, since the log behind it is purged). Prints the figures.

    scripts/bench-snapshot.py --jobs 1000000
"""
import argparse, concurrent.futures, glob, json, os, shutil, signal, subprocess, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--jobs", type=int, default=1_000_000)
ap.add_argument("--data", default="/tmp/delayd-snapbench")
ap.add_argument("--bin", default="target/release/delayd")
args = ap.parse_args()
os.chdir(os.path.join(os.path.dirname(__file__), ".."))
shutil.rmtree(args.data, ignore_errors=True)
os.makedirs(args.data)

def call(method, url, body=None, timeout=30):
    req = urllib.request.Request(url, data=body, method=method)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
        return json.loads(raw) if raw else None

env = dict(os.environ, DATA=args.data, DELAYD_BIN=args.bin, HTTP_BASE="7990", GRPC_BASE="7995")
flags = ["--keep-logs", "100"]
cluster = subprocess.Popen(["scripts/local-cluster.sh", "3"], env=env, start_new_session=True)
extra = []
try:
    H = lambda i: f"http://127.0.0.1:{7990 + i}"
    deadline = time.time() + 30
    while True:
        try:
            leader = call("GET", H(1) + "/health")["leader"]
            if leader:
                break
        except Exception:
            pass
        if time.time() > deadline:
            raise SystemExit("cluster did not form")
        time.sleep(0.1)
    body = json.dumps(["x" * 98] * 64).encode()
    t0 = time.time()
    def publish(_):
        call("PUT", H(leader) + "/api/bench/snap/bulk?delay=86400&ttl=0", body)
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        list(ex.map(publish, range(args.jobs // 64)))
    stored = args.jobs // 64 * 64
    print(f"stored {stored} jobs in {time.time() - t0:.1f} s")

    t0 = time.time()
    call("POST", H(leader) + "/admin/snapshot")
    applied = call("GET", H(leader) + "/health")["last_applied"]
    while True:
        st = call("GET", H(leader) + "/admin/cluster")
        me = [n for n in st["nodes"] if n["id"] == leader][0]
        if me.get("snapshot") is not None and me["snapshot"] >= applied:
            break
        time.sleep(0.2)
    snaps = glob.glob(f"{args.data}/node{leader}/snapshots/*.snap")
    size = max(os.path.getsize(p) for p in snaps)
    print(f"snapshot built in {time.time() - t0:.1f} s: {size / 1e6:.1f} MB ({size / stored:.0f} bytes/job)")

    os.makedirs(f"{args.data}/node4", exist_ok=True)
    log = open(f"{args.data}/node4.log", "w")
    extra.append(subprocess.Popen([args.bin, "--node-id", "4", "--data-dir", f"{args.data}/node4",
        "--http-addr", "127.0.0.1:7999", "--grpc-addr", "127.0.0.1:8004", "--join",
        "--admin-token-file", f"{args.data}/admin-token"], stdout=log, stderr=log))
    time.sleep(1)
    t0 = time.time()
    call("POST", H(leader) + "/admin/nodes?id=4&addr=127.0.0.1:8004", timeout=600)
    target = call("GET", H(leader) + "/health")["last_applied"]
    while call("GET", "http://127.0.0.1:7999/health")["last_applied"] is None or \
            call("GET", "http://127.0.0.1:7999/health")["last_applied"] < target:
        time.sleep(0.1)
    print(f"node 4 installed the snapshot and caught up in {time.time() - t0:.1f} s")
    d = [call("GET", u + "/admin/digest") for u in (H(leader), "http://127.0.0.1:7999")]
    print("digests:", d[0]["digest"], d[1]["digest"], "entries", d[0]["entries"], d[1]["entries"])
finally:
    for p in extra:
        p.terminate()
    os.killpg(cluster.pid, signal.SIGTERM)
    cluster.wait()
