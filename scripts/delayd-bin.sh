# Sourced by the scripts that run delayd: sets `bin` to the binary to run, the release build
# unless DELAYD_BIN names another, building the release or debug build when it is missing.
bin=${DELAYD_BIN:-target/release/delayd}
if [ ! -x "$bin" ]; then
  case "$bin" in
    target/release/delayd) cargo build --release -p delayd ;;
    target/debug/delayd) cargo build -p delayd ;;
    *) echo "DELAYD_BIN=$bin is not an executable" >&2; exit 1 ;;
  esac
fi
