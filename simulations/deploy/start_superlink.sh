#!/usr/bin/env bash
# Start the SuperLink of a federation on this machine, with TLS and SuperNode authentication.
# Usage: start_superlink.sh CREDENTIALS_DIR [PORT] [STATE_DB]
#   CREDENTIALS_DIR  holds ca.crt, server.pem, server.key (python -m simulations.deploy.credentials)
#   PORT             the one port of the Fleet, Control and ServerAppIo APIs (default 9092)
#   STATE_DB         SQLite file that keeps registered SuperNodes across restarts (default: in memory)
# SUPERLINK_HOST (environment) is the address to listen on (default 0.0.0.0: every interface).
# Then register each SuperNode's public key: flwr supernode register supernode-<i>.pub
set -euo pipefail
if [ $# -lt 1 ] || [ ! -d "$1" ]; then
  echo "usage: start_superlink.sh CREDENTIALS_DIR [PORT] [STATE_DB] (no credentials folder '${1:-}')" >&2
  exit 2
fi
credentials=$(cd "$1" && pwd)
port=${2:-9092}
for f in ca.crt server.pem server.key; do
  [ -f "$credentials/$f" ] || { echo "start_superlink.sh: missing $credentials/$f" >&2; exit 2; }
done
database=()
[ -n "${3:-}" ] && database=(--database "$3")
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
exec flower-superlink \
  --ssl-ca-certfile "$credentials/ca.crt" \
  --ssl-certfile "$credentials/server.pem" \
  --ssl-keyfile "$credentials/server.key" \
  --enable-supernode-auth \
  --host "${SUPERLINK_HOST:-0.0.0.0}" --port "$port" \
  --disable-runtime-dependency-installation \
  ${database[@]+"${database[@]}"}  # (bash 3.2 treats an empty array as unset)
