#!/usr/bin/env bash
# Builds the `delayd:local` image without a registry and without compiling inside Docker: the
# host-built binary plus exactly the shared libraries `ldd` lists, on an empty (scratch) base.
#
#   scripts/docker-image.sh            # builds target/debug/delayd if needed, tags delayd:local
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${DELAYD_BIN:-target/debug/delayd}
[ -x "$bin" ] || cargo build -p delayd
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT

mkdir -p "$ctx/rootfs/data" "$ctx/rootfs/tmp"
cp "$bin" "$ctx/rootfs/delayd"
# Every library the binary links, at the path the loader expects, and the loader itself.
ldd "$bin" | awk '/=> \// {print $3} /^[ \t]*\/lib/ {print $1}' | while read -r lib; do
  mkdir -p "$ctx/rootfs$(dirname "$lib")"
  cp -L "$lib" "$ctx/rootfs$lib"
done
cp docker/Dockerfile "$ctx/Dockerfile"
docker build -q -t delayd:local "$ctx" >/dev/null 2>&1 || docker build -t delayd:local "$ctx"
echo "built delayd:local ($(docker image inspect delayd:local --format '{{.Size}}') bytes)"
