#!/usr/bin/env bash
# Checks the monitoring kit in deploy/monitoring/ with promtool (Debian's `prometheus`
# package): the alert rules parse and their unit tests pass, every PromQL query of the Grafana
# dashboard parses, and the example Prometheus configuration is valid. That the metric names
# they use are the ones delayd exports is checked against a live node by
# tests/e2e/monitoring.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v promtool >/dev/null || { echo "promtool not found: apt-get install prometheus" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 not found" >&2; exit 1; }

promtool check rules deploy/monitoring/*.rules.yml
promtool test rules deploy/monitoring/rules-test.yml
promtool check config --syntax-only deploy/monitoring/prometheus.yml

# The dashboard's queries, with Grafana's variables replaced by values, as recording rules:
# promtool then parses each one as PromQL.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - deploy/monitoring/delayd-dashboard.json >"$tmp/dashboard.rules.yml" <<'PY'
import json, sys

def exprs(node):
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            yield node["expr"]
        for v in node.values():
            yield from exprs(v)
    elif isinstance(node, list):
        for v in node:
            yield from exprs(v)

values = {"$__rate_interval": "5m", "$__interval": "1m", "$job": "delayd", "$instance": ".*",
          "$namespace": ".*"}
found = list(exprs(json.load(open(sys.argv[1]))))
if not found:
    sys.exit("no query found in the dashboard")
print("groups:\n  - name: dashboard\n    rules:")
for i, e in enumerate(found):
    for k in sorted(values, key=len, reverse=True):
        e = e.replace(k, values[k])
    if "$" in e:
        sys.exit(f"an unknown variable in a dashboard query: {e}")
    print(f"      - record: dashboard_query_{i}\n        expr: {json.dumps(e)}")
PY
echo "dashboard queries:"
promtool check rules "$tmp/dashboard.rules.yml"
echo "monitoring kit: ok"
