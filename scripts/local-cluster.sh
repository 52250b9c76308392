#!/usr/bin/env bash
# Starts an N-node delayd cluster on loopback (default 3), each node with its own data
# directory under ${DATA:-./cluster-data}, and prints each node's HTTP address. Ctrl-C (or
# SIGTERM) stops them all. Restarting with the same DATA resumes the same cluster. The nodes
# run target/release/delayd (built if absent) unless DELAYD_BIN names another binary.
#
#   scripts/local-cluster.sh 3
#   HTTP_BASE=9000 GRPC_BASE=9100 scripts/local-cluster.sh 5
#   DELAYD_BIN=target/debug/delayd scripts/local-cluster.sh 3
#   DELAYD_WORKER_THREADS=2 scripts/local-cluster.sh 3  # each node's Tokio workers (default:
#                                                       # one fewer than the cores, at least 1)
set -euo pipefail
cd "$(dirname "$0")/.."

n=${1:-3}
data=${DATA:-./cluster-data}
http_base=${HTTP_BASE:-7770}
grpc_base=${GRPC_BASE:-7870}
. scripts/delayd-bin.sh

peers=""
for i in $(seq 1 "$n"); do
  peers+="${peers:+,}$i=127.0.0.1:$((grpc_base + i))"
done

# One admin token for the whole cluster, made once and kept with the data.
token_file="$data/admin-token"
mkdir -p "$data"
if [ ! -s "$token_file" ]; then
  (umask 077 && head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$token_file")
fi

pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' INT TERM EXIT
for i in $(seq 1 "$n"); do
  mkdir -p "$data/node$i"
  "$bin" --node-id "$i" --data-dir "$data/node$i" \
    --http-addr "127.0.0.1:$((http_base + i))" --grpc-addr "127.0.0.1:$((grpc_base + i))" \
    --peers "$peers" --admin-token-file "$token_file" >"$data/node$i.log" 2>&1 &
  pids+=($!)
  echo "node $i: http://127.0.0.1:$((http_base + i))  (grpc 127.0.0.1:$((grpc_base + i)), log $data/node$i.log)"
done
echo "admin token in $token_file"
echo "cluster status: curl -H \"Authorization: Bearer \$(cat $token_file)\" http://127.0.0.1:$((http_base + 1))/admin/cluster"
wait
