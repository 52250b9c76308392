#!/usr/bin/env bash
# Smoke test of docker-compose.yml: build the image, start the three containers, check that
# they form one cluster, publish through one node and consume through another, kill a node and
# keep serving, then tear everything down (always, even on failure). The image holds the
# release build unless DELAYD_BIN names another (see scripts/docker-image.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

project=delayd-smoke
. scripts/compose.sh
echo "compose: ${compose_cmd[*]}"
compose() { "${compose_cmd[@]}" -p "$project" "$@"; }
trap 'compose down -v --remove-orphans >/dev/null 2>&1 || true' EXIT

# The same admin token and cluster secret on every node; a namespace token for the data plane.
export DELAYD_ADMIN_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export DELAYD_CLUSTER_SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
scripts/docker-image.sh
compose up -d

# Wait (bounded) for all three nodes to answer and agree on a leader.
leader_of() { curl -sf -m 2 "localhost:$1/health" | grep -o '"leader":[0-9]*' | cut -d: -f2; }
deadline=$((SECONDS + 60))
while :; do
  l1=$(leader_of 7771 || true); l2=$(leader_of 7772 || true); l3=$(leader_of 7773 || true)
  if [ -n "$l1" ] && [ "$l1" = "$l2" ] && [ "$l2" = "$l3" ]; then leader=$l1; break; fi
  [ $SECONDS -lt $deadline ] || { echo "no agreed leader"; compose logs --tail 50; exit 1; }
  sleep 0.5
done
echo "cluster formed, leader: node $leader"

# The image's health check (delayd probe → /ready) turns every container healthy.
deadline=$((SECONDS + 60))
for n in 1 2 3; do
  until [ "$(docker inspect -f '{{.State.Health.Status}}' "$(compose ps -q "delayd$n")")" = healthy ]; do
    [ $SECONDS -lt $deadline ] || { echo "delayd$n never became healthy"; compose logs --tail 50; exit 1; }
    sleep 0.5
  done
done
echo "all three containers healthy"

code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT 'localhost:7771/api/smoke/q' -d x)
[ "$code" = 401 ] || { echo "a publish without a token answered $code, not 401"; exit 1; }
token=$(curl -sf -X POST -H "Authorization: Bearer $DELAYD_ADMIN_TOKEN" localhost:7772/token/smoke \
  | sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
[ -n "$token" ] || { echo "token creation failed"; exit 1; }
echo "unauthenticated publish refused (401); token created through node 2"

id=$(curl -sf -X PUT -H "X-Token: $token" 'localhost:7771/api/smoke/q?delay_ms=500' -d hello | sed -n 's/.*"job_id":"\([^"]*\)".*/\1/p')
[ -n "$id" ] || { echo "publish failed"; exit 1; }
got=$(curl -sf "localhost:7773/api/smoke/q?timeout=5&token=$token")
echo "$got" | grep -q "\"job_id\":\"$id\"" || { echo "consume through another node failed: $got"; exit 1; }
echo "published $id through node 1, consumed through node 3"

# Lose the leader: the other two carry on.
compose kill "delayd$leader" >/dev/null
survivor=$(( leader % 3 + 1 ))
deadline=$((SECONDS + 30))
until curl -sf -m 6 -X PUT -H "X-Token: $token" "localhost:777$survivor/api/smoke/q" -d after >/dev/null; do
  [ $SECONDS -lt $deadline ] || { echo "no publish after killing the leader"; compose logs --tail 50; exit 1; }
  sleep 0.2
done
echo "killed node $leader; node $survivor still accepts publishes"
echo "compose smoke: 1 passed, 0 failed"
