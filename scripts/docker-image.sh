#!/usr/bin/env bash
# Builds the `delayd:local` image without a registry and without compiling inside Docker: the
# host-built binary plus exactly the shared libraries `ldd` lists, on an empty (scratch) base.
#
#   scripts/docker-image.sh                                  # target/release/delayd (built if absent)
#   DELAYD_BIN=target/debug/delayd scripts/docker-image.sh   # another build instead
set -euo pipefail
cd "$(dirname "$0")/.."

# An image is what gets deployed: the release build unless DELAYD_BIN names another (CI
# passes its debug build, to keep to one build profile).
. scripts/delayd-bin.sh
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
