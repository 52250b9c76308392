#!/usr/bin/env bash
# The test suite: builds the binaries the end-to-end tests start, then runs every test of the
# workspace (golden scripts, the openraft storage suite, HTTP handler tests, end-to-end).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --bins
cargo test --workspace "$@"
