#!/usr/bin/env bash
# Start SuperNode PARTITION_ID of NUM_PARTITIONS on this machine, connected to the SuperLink over TLS
# and authenticated by its key (registered beforehand with `flwr supernode register KEY.pub`).
# Usage: start_supernode.sh SUPERLINK_HOST:PORT CA_CERT PRIVATE_KEY PARTITION_ID NUM_PARTITIONS [DATA_ROOT]
#   DATA_ROOT  where this machine keeps the dataset (torchvision layout); default: the run config's
# SUPERNODE_PORT (environment): this SuperNode's local API port (default 9094; one per SuperNode
# on a host).
set -euo pipefail
if [ $# -lt 5 ]; then
  echo "usage: start_supernode.sh SUPERLINK_HOST:PORT CA_CERT PRIVATE_KEY PARTITION_ID NUM_PARTITIONS [DATA_ROOT]" >&2
  exit 2
fi
superlink=$1 ca=$2 key=$3 partition=$4 partitions=$5
refuse() { echo "start_supernode.sh: invalid $1='$2': $3" >&2; exit 2; }
[ -f "$ca" ] || refuse CA_CERT "$ca" "an existing file (the federation's ca.crt)"
[ -f "$key" ] || refuse PRIVATE_KEY "$key" "an existing file (this SuperNode's private key)"
[[ "$partitions" =~ ^[0-9]+$ ]] && [ "$partitions" -ge 1 ] ||
  refuse NUM_PARTITIONS "$partitions" "a whole number >= 1"
[[ "$partition" =~ ^[0-9]+$ ]] && [ "$partition" -lt "$partitions" ] ||
  refuse PARTITION_ID "$partition" "a whole number in [0, $partitions)"
node_config="partition-id=$partition num-partitions=$partitions"
if [ -n "${6:-}" ]; then
  [ -d "$6" ] || refuse DATA_ROOT "$6" "an existing directory"
  node_config="$node_config data-root=\"$(cd "$6" && pwd)\""
fi
exec flower-supernode \
  --superlink "$superlink" \
  --root-certificates "$ca" \
  --auth-supernode-private-key "$key" \
  --node-config "$node_config" \
  --port "${SUPERNODE_PORT:-9094}"
