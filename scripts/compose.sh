# Sourced by the scripts that run docker-compose.yml: sets `compose_cmd` to Compose v2 (the
# `docker compose` plugin) when it is installed, else to the standalone `docker-compose` (v1,
# end-of-life, as Debian 12 still ships it). DELAYD_COMPOSE overrides the choice, e.g.
# DELAYD_COMPOSE=docker-compose. The chaos harness (jepsen/src/backend/docker.rs) picks the
# same way.
if [ -n "${DELAYD_COMPOSE:-}" ]; then
  read -r -a compose_cmd <<<"$DELAYD_COMPOSE"
elif docker compose version >/dev/null 2>&1; then
  compose_cmd=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
  compose_cmd=(docker-compose)
else
  echo "neither \`docker compose\` (v2) nor \`docker-compose\` (v1) is installed" >&2
  exit 1
fi
