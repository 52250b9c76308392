#!/usr/bin/env bash
# Counts the user-space instructions one node of a local 3-node release cluster runs for a
# benchmark workload, with valgrind's callgrind (docs/bench/consume-path.md, "one node's
# instructions counted"). Timings on this shared 2-core machine move by 10 % and more from run
# to run; an instruction count of the same binary doing the same work moves by a few percent
# at most (inside a cluster, how requests fall into log entries still depends on timing), so
# two builds can be told apart by a smaller difference.
#
# It starts three nodes on loopback in a temp directory of their own, node N under
# `valgrind --tool=callgrind`, with Raft timing loose enough for a node some fifty times
# slower (heartbeat 500 ms, election timeouts 6-8 s on every node). It moves the lead to the
# counted node (--role leader) or to another one (--role follower) with
# `POST /admin/leader?to=N`, then for each workload runs `delayd-bench --target ... --via-leader`
# (every client on the leader, a fixed number of jobs) between two callgrind dumps: one just
# before it (a dump also zeroes the counters, and unlike `callgrind_control -z` it zeroes the
# calls to PLT stubs too, so the second file's per-function costs add up to its total) and one
# once every node has applied everything the leader logged. A drain preloads its jobs with bulk
# publishes first; the same number of jobs published in bulk (delay 0, as the preload sends
# them) is counted on its own beforehand, and the drain's line also shows its count with that
# taken off. Kernel time is not counted. Every node is stopped on the way out.
#
#   scripts/count-node.sh                                      # node 1 leads; publish-http, drain
#   scripts/count-node.sh --role follower --jobs 3000
#   scripts/count-node.sh --role leader --workloads "drain drain-ackfirst" --out /tmp/a
#   scripts/count-node.sh --bin /tmp/delayd-before --out /tmp/a   # build A; then build B:
#   scripts/count-node.sh --out /tmp/b
#   callgrind_annotate --inclusive=yes /tmp/a/leader-node1-3-drain.callgrind | head -60
#
# Options:
#   --role leader|follower  the counted node leads, or follows another node (default leader)
#   --node N                the node counted, 1-3 (default 1)
#   --jobs N                jobs per workload: publish-* stop after N, drains preload N
#                           (rounded up to a multiple of 64, a bulk publish) (default 3000)
#   --clients C             concurrent clients, all on the leader (default 64)
#   --workloads "A B"       delayd-bench workloads, one bench run and one count each
#                           (default "publish-http drain")
#   --no-preload            do not count the bulk preload of the drains on its own
#   --out DIR               where the dumps, the bench's JSON and logs and summary.tsv go
#                           (default: a new temp directory, printed at the end)
#   --bin PATH              the delayd binary of all three nodes (default $DELAYD_BIN, else
#                           target/release/delayd)
#   --bench PATH            the delayd-bench binary (default target/release/delayd-bench)
#
# Neither binary is built here: cargo build --release -p delayd -p delayd-bench.
# The environment can change: HTTP_BASE (7970) and GRPC_BASE (8070), the node i listening on
# base + i; DELAYD_HEARTBEAT_MS (500), DELAYD_ELECTION_TIMEOUT_MIN_MS (6000),
# DELAYD_ELECTION_TIMEOUT_MAX_MS (8000), DELAYD_TRANSFER_TIMEOUT_MS (10000) and any other
# DELAYD_* setting of the nodes; VALGRIND_OPTS (read by valgrind itself); START_TIMEOUT_S (300,
# for the cluster to form), CATCHUP_TIMEOUT_S (600, for every node to apply what the leader
# logged); BENCH_SECS (1800, the longest a workload runs, should it stop counting its jobs).
set -euo pipefail
shopt -s inherit_errexit
here=$PWD
case "$0" in /*) self=$0 ;; *) self=$here/$0 ;; esac
cd "$(dirname "$0")/.."

usage() { sed -n '2,/^set -euo/p' "$self" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "count-node: $*" >&2; exit 1; }
say() { echo "count-node: $*" >&2; }
# An absolute path for a path given on the command line (relative to where the script was run).
abs() { case "$1" in /*) echo "$1" ;; *) echo "$here/$1" ;; esac; }

role=leader node=1 jobs=3000 clients=64 workloads="publish-http drain" preload=yes out=""
bin=${DELAYD_BIN:-target/release/delayd}
bench=target/release/delayd-bench
while [ $# -gt 0 ]; do
  case "$1" in
    --role) role=${2:?--role needs a value}; shift 2 ;;
    --node) node=${2:?--node needs a value}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a value}; shift 2 ;;
    --clients) clients=${2:?--clients needs a value}; shift 2 ;;
    --workloads) workloads=${2:?--workloads needs a value}; shift 2 ;;
    --no-preload) preload=no; shift ;;
    --out) out=$(abs "${2:?--out needs a value}"); shift 2 ;;
    --bin) bin=$(abs "${2:?--bin needs a value}"); shift 2 ;;
    --bench) bench=$(abs "${2:?--bench needs a value}"); shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
case "$role" in leader | follower) ;; *) die "--role must be leader or follower, not $role" ;; esac
case "$node" in 1 | 2 | 3) ;; *) die "--node must be 1, 2 or 3, not $node" ;; esac
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive number, not $jobs"
[[ "$clients" =~ ^[1-9][0-9]*$ ]] || die "--clients must be a positive number, not $clients"
read -r -a wl <<<"${workloads//,/ }"
[ ${#wl[@]} -gt 0 ] || die "--workloads names none"

for tool in valgrind callgrind_control curl jq; do
  command -v "$tool" >/dev/null || die "$tool not found (apt-get install -y valgrind curl jq)"
done
[ -x "$bin" ] || die "$bin is not an executable (cargo build --release -p delayd, or --bin)"
[ -x "$bench" ] ||
  die "$bench is not an executable (cargo build --release -p delayd-bench, or --bench)"
# Defaults (and $DELAYD_BIN, as in the other scripts) are relative to the repository root.
case "$bin" in /*) ;; *) bin=$PWD/$bin ;; esac
case "$bench" in /*) ;; *) bench=$PWD/$bench ;; esac

# The workload names the bench knows, from its --help ("[possible values: ...]").
known=$("$bench" --help | tr '\n' ' ' | sed -n 's/.*--workloads <[A-Z_]*>//p' |
  grep -o 'possible values: [^]]*' | head -1 | sed 's/possible values: //; s/,//g')
for w in "${wl[@]}"; do
  case " $known " in *" $w "*) ;; *) die "unknown workload $w; delayd-bench knows: $known" ;; esac
  case "$w" in
    publish-http | publish-bulk | publish-grpc-stream | drain*) ;;
    *) say "warning: --jobs does not bound $w: its count covers whatever it runs for" ;;
  esac
done

http_base=${HTTP_BASE:-7970}
grpc_base=${GRPC_BASE:-8070}
export DELAYD_HEARTBEAT_MS=${DELAYD_HEARTBEAT_MS:-500}
export DELAYD_ELECTION_TIMEOUT_MIN_MS=${DELAYD_ELECTION_TIMEOUT_MIN_MS:-6000}
export DELAYD_ELECTION_TIMEOUT_MAX_MS=${DELAYD_ELECTION_TIMEOUT_MAX_MS:-8000}
# A hand-over to the slowed node must not give up before it has won its election.
export DELAYD_TRANSFER_TIMEOUT_MS=${DELAYD_TRANSFER_TIMEOUT_MS:-10000}
start_timeout=${START_TIMEOUT_S:-300}
catchup_timeout=${CATCHUP_TIMEOUT_S:-600}

url() { echo "http://127.0.0.1:$((http_base + $1))"; }
for i in 1 2 3; do
  for port in $((http_base + i)) $((grpc_base + i)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      die "port $port is in use (another cluster? set HTTP_BASE / GRPC_BASE)"
    fi
  done
done

# The wanted leader: the counted node, or for a follower the next node (always the same one,
# so that runs compare).
if [ "$role" = leader ]; then want=$node; else want=$((node % 3 + 1)); fi
tag="$role-node$node"
work=$(mktemp -d "${TMPDIR:-/tmp}/delayd-count.XXXXXX")
if [ -z "$out" ]; then out=$(mktemp -d "${TMPDIR:-/tmp}/delayd-count-out.XXXXXX"); fi
mkdir -p "$out"
cg="$work/callgrind.out" # callgrind appends .1, .2, ... per dump
# valgrind's pipes for callgrind_control (through vgdb) go with the rest, even after a SIGKILL.
vgdb_prefix="$work/vgdb-pipe"

pids=()
# Stops every node: SIGTERM, then SIGKILL after 15 s (nodes stopping together keep trying to
# hand the lead over to one another until the transfer timeout; their data is thrown away).
stop_nodes() {
  local pid deadline=$((SECONDS + 15))
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  pids=()
}
# shellcheck disable=SC2317 # run by the trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [ ${#pids[@]} -eq 0 ] || stop_nodes
  rm -rf "$work"
  [ "$rc" -eq 0 ] || say "failed (exit $rc); node logs and bench output in $out"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

token_file="$work/admin-token"
(umask 077 && head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$token_file")
token=$(cat "$token_file")
peers="1=127.0.0.1:$((grpc_base + 1)),2=127.0.0.1:$((grpc_base + 2)),3=127.0.0.1:$((grpc_base + 3))"

for i in 1 2 3; do
  mkdir -p "$work/node$i"
  args=(--node-id "$i" --data-dir "$work/node$i" --http-addr "127.0.0.1:$((http_base + i))"
    --grpc-addr "127.0.0.1:$((grpc_base + i))" --peers "$peers" --admin-token-file "$token_file")
  if [ "$i" = "$node" ]; then
    # Instrumented from the start, so that callgrind sees every call that is under way when
    # a count begins (counting itself is reset by the dump before each workload).
    valgrind --tool=callgrind --callgrind-out-file="$cg" --vgdb-prefix="$vgdb_prefix" \
      "$bin" "${args[@]}" \
      >"$out/$tag.node$i.log" 2>&1 &
    vg_pid=$!
  else
    "$bin" "${args[@]}" >"$out/$tag.node$i.log" 2>&1 &
  fi
  pids+=($!)
done
say "nodes started (node $node under callgrind, pid $vg_pid); logs in $out/$tag.node*.log"

# --- Cluster state, from each node's /health (no credential needed) -----------------------

alive() {
  local i
  for i in 1 2 3; do
    kill -0 "${pids[$((i - 1))]}" 2>/dev/null ||
      { tail -n 20 "$out/$tag.node$i.log" >&2; die "node $i exited (log above)"; }
  done
}
# health FIELD NODE: one field of the node's /health answer, empty when it does not answer.
health() {
  curl -sf -m 10 "$(url "$2")/health" 2>/dev/null | jq -r ".$1 // empty" 2>/dev/null || true
}
# The leader every node names, or nothing while they disagree.
agreed_leader() {
  local l1 l2 l3
  l1=$(health leader 1) l2=$(health leader 2) l3=$(health leader 3)
  if [ -n "$l1" ] && [ "$l1" = "$l2" ] && [ "$l2" = "$l3" ]; then echo "$l1"; fi
}
# wait_leader WANT SECS: until all three name WANT (any leader if WANT is empty).
wait_leader() {
  local deadline=$((SECONDS + $2)) l
  while :; do
    alive
    l=$(agreed_leader)
    if [ -n "$l" ] && { [ -z "$1" ] || [ "$l" = "$1" ]; }; then echo "$l"; return; fi
    [ $SECONDS -lt $deadline ] || die "after ${2}s the nodes name leaders" \
      "$(health leader 1)/$(health leader 2)/$(health leader 3), not ${1:-one}"
    sleep 0.5
  done
}
# Puts the lead on node $want, asking a node that runs at full speed.
place_leader() {
  local current ask deadline=$((SECONDS + 120)) answer
  current=$(wait_leader "" "$start_timeout")
  [ "$current" != "$want" ] || return 0
  ask=$((node % 3 + 1))
  say "moving the lead from node $current to node $want"
  until answer=$(curl -sS --fail-with-body -m 60 -X POST -H "Authorization: Bearer $token" \
    "$(url "$ask")/admin/leader?to=$want" 2>&1); do
    alive
    [ $SECONDS -lt $deadline ] || die "POST /admin/leader?to=$want kept failing: $answer"
    say "POST /admin/leader?to=$want: $answer; retrying"
    sleep 2
  done
  wait_leader "$want" 120 >/dev/null
}
# Waits until every node has applied the index the leader has logged up to now.
wait_applied() {
  local target i a deadline=$((SECONDS + catchup_timeout))
  alive
  target=$(health last_log_index "$want")
  [ -n "$target" ] || die "node $want (the leader) does not answer /health"
  for i in 1 2 3; do
    while :; do
      alive
      a=$(health last_applied "$i")
      if [ -n "$a" ] && [ "$a" -ge "$target" ]; then break; fi
      [ $SECONDS -lt $deadline ] ||
        die "node $i applied ${a:-?} of the leader's $target within ${catchup_timeout}s"
      sleep 0.5
    done
  done
}

# --- Counting ------------------------------------------------------------------------------

dumps=0
# dump HINT: writes callgrind's counters since the last dump to a file, named in $dumped, and
# zeroes them.
dump() {
  local said
  said=$(callgrind_control --vgdb-prefix="$vgdb_prefix" -d "$1" "$vg_pid" 2>&1) ||
    die "callgrind_control -d failed: $said"
  dumps=$((dumps + 1))
  dumped="$cg.$dumps"
  [ -s "$dumped" ] || die "callgrind wrote no $dumped"
}
# Instructions (Ir) of a dump: its summary line, what callgrind_annotate calls PROGRAM TOTALS.
instructions() { sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$1" | head -1; }
# One line of summary.tsv: the arguments joined by tabs.
tsv() { local IFS=$'\t'; echo "$*"; }
# 1234567 -> 1,234,567
group() {
  local n=${1#-} sign="" s=""
  [ "${1:0:1}" != "-" ] || sign=-
  while [ ${#n} -gt 3 ]; do s=",${n: -3}$s" n=${n:0:${#n}-3}; done
  echo "$sign$n$s"
}

wait_leader "" "$start_timeout" >/dev/null
place_leader
say "node $want leads; the counted node $node is the $role"

stamp=$(date +%s)
runs=() # "label workload" of each count, in order
if [ "$preload" = yes ]; then
  for w in "${wl[@]}"; do
    case "$w" in drain*) runs+=("preload publish-bulk"); break ;; esac
  done
fi
for w in "${wl[@]}"; do runs+=("$w $w"); done

declare -A ir_of jobs_of
failed=0
rows=()
k=0
for run in "${runs[@]}"; do
  label=${run%% *} w=${run#* }
  k=$((k + 1))
  place_leader
  extra=()
  # The preload of a drain publishes ready jobs (delay 0) in bulk; count the same.
  [ "$label" != preload ] || extra=(--publish-delay-ms 0)
  term0=$(health term "$want")
  base="$out/$tag-$k-$label"
  dump "before $label" # only to zero the counters
  rm -f "$dumped"
  say "counting $label ($w, $jobs jobs, c = $clients) on node $node"
  rc=0
  DELAYD_TOKEN=$token "$bench" --target "$(url 1),$(url 2),$(url 3)" --via-leader \
    --clients "$clients" --workloads "$w" --jobs "$jobs" --drain-jobs "$jobs" \
    --secs "${BENCH_SECS:-1800}" \
    --namespace "count-$stamp-$k" --json "$base.bench.json" ${extra[@]+"${extra[@]}"} \
    >"$base.bench.log" 2>&1 || rc=$?
  [ "$rc" -ne 130 ] || exit 130 # the bench was interrupted (Ctrl-C)
  wait_applied
  dump "$label"
  mv "$dumped" "$base.callgrind"
  term1=$(health term "$want") lead1=$(agreed_leader)
  ir=$(instructions "$base.callgrind")
  [ -n "$ir" ] || die "no summary line in $base.callgrind"
  done_jobs=$(jq -r --arg w "$w" '[.rows[] | select(.workload == $w)][0].jobs // empty' \
    "$base.bench.json" 2>/dev/null || true)
  status=$(jq -r --arg w "$w" '[.rows[] | select(.workload == $w)][0].status // empty' \
    "$base.bench.json" 2>/dev/null || true)
  note=""
  if [ "$rc" -ne 0 ] || [ "$status" != ok ] || [ -z "$done_jobs" ] || [ "$done_jobs" -eq 0 ]; then
    note="BENCH FAILED (exit $rc, status ${status:-none}; see $base.bench.log)"
    failed=1
    tail -n 15 "$base.bench.log" >&2
  fi
  if [ "$term0" != "$term1" ] || [ "$lead1" != "$want" ]; then
    note="$note LEADERSHIP CHANGED (term $term0 -> $term1, leader ${lead1:-none})"
    failed=1
  fi
  ir_of[$label]=$ir jobs_of[$label]=${done_jobs:-0}
  per_job="" net=""
  if [ "${done_jobs:-0}" -gt 0 ]; then
    per_job=$(((ir + done_jobs / 2) / done_jobs))
    case "$w" in
      drain*)
        if [ -n "${ir_of[preload]:-}" ] && [ "${jobs_of[preload]}" -gt 0 ]; then
          # The preload's count, scaled to this drain's jobs, taken off.
          net=$(awk -v ir="$ir" -v j="$done_jobs" -v pir="${ir_of[preload]}" \
            -v pj="${jobs_of[preload]}" 'BEGIN { printf "%.0f", (ir - pir * j / pj) / j }')
        fi
        ;;
    esac
  fi
  line=$(printf '%-10s %-5s %-22s %7s %16s %10s %12s  %s' "$role" "$node" "$label" \
    "${done_jobs:-?}" "$(group "$ir")" "$(group "${per_job:-0}")" \
    "${net:+$(group "$net")}" "$note" | sed 's/ *$//')
  echo "$line"
  rows+=("$line")
  [ -s "$out/summary.tsv" ] || tsv role node counted workload jobs clients instructions per_job \
    per_job_net file note >"$out/summary.tsv"
  tsv "$role" "$node" "$label" "$w" "${done_jobs:-}" "$clients" "$ir" "$per_job" "$net" \
    "$base.callgrind" "$note" >>"$out/summary.tsv"
done

stop_nodes
echo
echo "instructions of node $node ($role; node $want led), $(basename "$bin"), c = $clients:"
printf '%-10s %-5s %-22s %7s %16s %10s %12s\n' role node counted jobs instructions "per job" \
  "net per job"
printf '%s\n' "${rows[@]}"
[ "$preload" = no ] || [ -z "${ir_of[preload]:-}" ] ||
  echo "(preload: publish-bulk of ready jobs, as a drain preloads them; net per job takes it off)"
echo "dumps, bench JSON and logs in $out (callgrind_annotate --inclusive=yes FILE)"
exit "$failed"
