#!/usr/bin/env bash
# Chaos tests against the docker-compose cluster: builds the image from the host-built binary
# (the release build, or $DELAYD_BIN: see scripts/docker-image.sh), then runs the jepsen
# harness (a debug build: it is a test tool). Arguments go to the harness, e.g.
#
#   scripts/jepsen.sh                                  # CI mode, random seed (printed first)
#   scripts/jepsen.sh --seed 42                        # CI mode, fixed seed
#   scripts/jepsen.sh --long --time-limit 900          # long mode, 15 minutes of faults
#
# Each run leaves plan.json, history.jsonl, faults.json, summary.{json,md}, timeline.svg and
# node-<id>.log under jepsen/runs/seed-<seed>/. Exit code: 0 valid, 1 anomaly, 2 unknown.
set -euo pipefail
cd "$(dirname "$0")/.."

[ -x target/debug/delayd ] && [ -x target/debug/delayd-jepsen ] ||
  cargo build --workspace --bins
scripts/docker-image.sh
exec target/debug/delayd-jepsen "$@"
