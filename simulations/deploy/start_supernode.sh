#!/usr/bin/env bash
# Start SuperNode PARTITION_ID of NUM_PARTITIONS on this machine, connected to the SuperLink's
# public (proxy) port over TLS and authenticated by its key (registered beforehand, on the
# SuperLink's machine, with `flwr supernode register KEY.pub`).
# Usage: start_supernode.sh SUPERLINK_HOST:PORT CA_CERT PRIVATE_KEY PARTITION_ID NUM_PARTITIONS [DATA_ROOT]
#   DATA_ROOT  where this machine keeps the dataset (torchvision layout); default: the run config's.
#              Any UTF-8 path without control characters or $NAME / ${...} (which the ClientApp
#              would expand); it reaches the ClientApp unchanged.
# SUPERNODE_PORT (environment): this SuperNode's local API port (default 9094; one per SuperNode
# on a host).
set -euo pipefail
if [ $# -lt 5 ]; then
  echo "usage: start_supernode.sh SUPERLINK_HOST:PORT CA_CERT PRIVATE_KEY PARTITION_ID NUM_PARTITIONS [DATA_ROOT]" >&2
  exit 2
fi
superlink=$1 ca=$2 key=$3 partition=$4 partitions=$5
refuse() { echo "start_supernode.sh: invalid $1='$2': $3" >&2; exit 2; }
absolute() { case $1 in /*) printf '%s' "$1" ;; *) printf '%s/%s' "$PWD" "$1" ;; esac; }
[[ "$superlink" =~ ^([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$ ]] ||
  refuse SUPERLINK_HOST:PORT "$superlink" "host:port or [IPv6]:port of the SuperLink's proxy"
[ -f "$ca" ] || refuse CA_CERT "$ca" "an existing file (the federation's ca.crt)"
[ -f "$key" ] || refuse PRIVATE_KEY "$key" "an existing file (this SuperNode's private key)"
[[ "$partitions" =~ ^[0-9]+$ ]] && [ "$partitions" -ge 1 ] ||
  refuse NUM_PARTITIONS "$partitions" "a whole number >= 1"
[[ "$partition" =~ ^[0-9]+$ ]] && [ "$partition" -lt "$partitions" ] ||
  refuse PARTITION_ID "$partition" "a whole number in [0, $partitions)"
[[ "${SUPERNODE_PORT:-9094}" =~ ^[0-9]{1,5}$ ]] ||
  refuse SUPERNODE_PORT "$SUPERNODE_PORT" "a port number from 1 to 65535"

# Flower parses --node-config with the regular expression (\S+?)=('[^']*'|"[^"]*"|\S+) and then as
# TOML (flwr.common.config.parse_config_args): a double-quoted TOML string survives whole as long
# as it holds no '"', so '"' is written as the TOML escape \u0022 and '\' as \\. TOML cannot hold
# control characters, and Flower passes the value on as UTF-8 text: such paths are refused.
toml_string() {
  local bs='\' quote='"' s
  s=${1//"$bs"/"$bs$bs"}
  s=${s//"$quote"/"${bs}u0022"}
  printf '"%s"' "$s"
}
carriable() {
  local LC_ALL=C  # byte by byte: [[:cntrl:]] is then exactly 0x01-0x1f and 0x7f
  [[ "$1" != *[[:cntrl:]]* ]] || return 1
  ! command -v iconv >/dev/null || printf '%s' "$1" | iconv -f UTF-8 -t UTF-8 >/dev/null 2>&1
}
node_config="partition-id=$partition num-partitions=$partitions"
if [ -n "${6:-}" ]; then
  [ -d "$6" ] || refuse DATA_ROOT "$6" "an existing directory"
  data_root=$(CDPATH='' cd -- "$6" && pwd && echo .)  # the '.' keeps a trailing newline
  data_root=${data_root%$'\n.'}
  carriable "$data_root" ||
    refuse DATA_ROOT "$6" "a folder whose path is UTF-8 text without control characters"
  # The ClientApp expands $NAME and ${NAME} in data-root (os.path.expandvars): a folder literally
  # named so would be looked for elsewhere.
  [[ ! "$data_root" =~ \$([A-Za-z0-9_]|\{[^}]*\}) ]] ||
    refuse DATA_ROOT "$6" 'a folder whose path has no $NAME or ${...} (the ClientApp expands them)'
  node_config="$node_config data-root=$(toml_string "$data_root")"
fi
exec flower-supernode \
  --superlink "$superlink" \
  --root-certificates "$(absolute "$ca")" \
  --auth-supernode-private-key "$(absolute "$key")" \
  --node-config "$node_config" \
  --port "${SUPERNODE_PORT:-9094}"
