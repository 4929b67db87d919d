#!/usr/bin/env bash
# Start the SuperLink of a federation on this machine, with TLS and SuperNode authentication, behind
# an nginx reverse proxy that lets other machines reach the Fleet API only.
#
# Usage: start_superlink.sh CREDENTIALS_DIR [PUBLIC_PORT] [STATE_DB]
#   CREDENTIALS_DIR  holds ca.crt, server.pem, server.key (python -m simulations.deploy.credentials)
#   PUBLIC_PORT      the port SuperNodes connect to (default 9092): nginx, TLS with server.pem,
#                    forwarding only /v1/fleet/<call> to the SuperLink
#   STATE_DB         SQLite file that keeps registered SuperNodes across restarts (default: in memory)
# Environment:
#   PUBLIC_HOST      the address nginx listens on (default 0.0.0.0: every interface; [::] for IPv6)
#   SUPERLINK_PORT   the SuperLink's own port, on 127.0.0.1 only (default 9093): the Control API
#                    (flwr run, flwr supernode register), the ServerAppIo/Runtime API and the Fleet API
#   NGINX            the nginx binary (default: nginx on PATH, else /usr/sbin/nginx)
#
# Flower 1.41 serves its Control, Fleet and Runtime APIs from one HTTP listener, and its Control
# API has no authentication without Flower's enterprise plug-in: whoever reaches it can register
# SuperNode keys and start runs whose code executes here. So the SuperLink listens on loopback
# only, and the proxy forwards nothing but Fleet calls. Use flwr on this machine (connection
# address 127.0.0.1:SUPERLINK_PORT), or through an SSH tunnel to it. Stopping this script (or the
# SuperLink, or the proxy) stops both. Runs under umask 077: what the SuperLink and its ServerApps
# write (run directories with every retained update included) is readable by this account only.
set -euo pipefail
refuse() { echo "start_superlink.sh: invalid $1='$2': $3" >&2; exit 2; }
if [ $# -lt 1 ] || [ ! -d "$1" ]; then
  echo "usage: start_superlink.sh CREDENTIALS_DIR [PUBLIC_PORT] [STATE_DB] (no credentials folder '${1:-}')" >&2
  exit 2
fi
credentials=$(CDPATH='' cd -- "$1" && pwd)
public_port=${2:-9092}
superlink_port=${SUPERLINK_PORT:-9093}
public_host=${PUBLIC_HOST:-0.0.0.0}
for f in ca.crt server.pem server.key; do
  [ -f "$credentials/$f" ] || { echo "start_superlink.sh: missing $credentials/$f" >&2; exit 2; }
done
is_port() { [[ "$1" =~ ^[0-9]{1,5}$ ]] && [ "$1" -ge 1 ] && [ "$1" -le 65535 ]; }
is_port "$public_port" || refuse PUBLIC_PORT "$public_port" "a port number from 1 to 65535"
is_port "$superlink_port" || refuse SUPERLINK_PORT "$superlink_port" "a port number from 1 to 65535"
[ "$public_port" != "$superlink_port" ] ||
  refuse SUPERLINK_PORT "$superlink_port" "a port other than PUBLIC_PORT"
# The address goes into nginx's configuration: only address characters, nothing nginx parses.
if [[ "$public_host" =~ ^[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*$ ]]; then
  public_host="[$public_host]"  # a bare IPv6 address
fi
[[ "$public_host" =~ ^([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])$ ]] ||
  refuse PUBLIC_HOST "$public_host" "an IPv4 address, [IPv6 address] or host name of this machine"
if [ -n "${SUPERLINK_HOST:-}" ]; then
  refuse SUPERLINK_HOST "$SUPERLINK_HOST" \
    "unset: the SuperLink listens on 127.0.0.1 only; PUBLIC_HOST is the proxy's address"
fi
nginx=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
[ -x "$nginx" ] || refuse NGINX "$nginx" \
  "an nginx executable (Debian/Ubuntu: apt-get install nginx; or set NGINX=/path/to/nginx)"
command -v flower-superlink >/dev/null ||
  { echo "start_superlink.sh: flower-superlink is not on PATH (activate the environment)" >&2; exit 2; }
database=()
if [ -n "${3:-}" ]; then
  case $3 in -*) database=(--database "./$3") ;; *) database=(--database "$3") ;; esac
fi

# Whatever the SuperLink and its ServerApps write (the state database, run directories holding every
# retained client update, checkpoints, models) is for this account only: 0700 folders, 0600 files.
umask 077
# The proxy's files live in a private folder of their own; its configuration names no path of
# the user's (nginx would read a '$' in one as a variable): the credentials are linked in.
proxy_dir=$(mktemp -d "${TMPDIR:-/tmp}/fedunlearn-proxy.XXXXXX")
superlink_pid='' proxy_pid='' proxy_workers=''
# nginx's workers outlive a master that was killed outright, still holding the public port: they
# are noted while the master lives and stopped with it (if they are still nginx workers).
note_workers() { proxy_workers=$(pgrep -P "$proxy_pid" 2>/dev/null || true); }
stop_workers() {
  for pid in $proxy_workers; do
    [[ "$(ps -o args= -p "$pid" 2>/dev/null)" == "nginx: worker process"* ]] && kill -TERM "$pid"
  done
}
stop() {
  trap - EXIT INT TERM
  set +e
  [ -z "$proxy_pid" ] || ! kill -0 "$proxy_pid" 2>/dev/null || note_workers
  for pid in $superlink_pid $proxy_pid; do kill -TERM "$pid" 2>/dev/null; done
  stop_workers 2>/dev/null
  for _ in $(seq 50); do  # up to 10 s for a clean shutdown, then no more waiting
    alive=0
    for pid in $superlink_pid $proxy_pid; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.2
  done
  for pid in $superlink_pid $proxy_pid; do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf -- "$proxy_dir"
}
trap stop EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
for f in ca.crt server.pem server.key; do ln -s -- "$credentials/$f" "$proxy_dir/$f"; done
cat >"$proxy_dir/nginx.conf" <<EOF
# Written by start_superlink.sh; relative paths are in this folder.
daemon off;
worker_processes 1;
pid nginx.pid;
error_log stderr notice;
events { worker_connections 1024; }
http {
    access_log off;
    server_tokens off;
    client_body_temp_path client_body_temp;
    proxy_temp_path proxy_temp;
    fastcgi_temp_path fastcgi_temp;
    uwsgi_temp_path uwsgi_temp;
    scgi_temp_path scgi_temp;
    upstream superlink { server 127.0.0.1:$superlink_port; keepalive 8; }
    server {
        listen $public_host:$public_port ssl;
        ssl_certificate server.pem;
        ssl_certificate_key server.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        # Flower splits arrays into 5 MB objects; one request carries at most one of them.
        client_max_body_size 64m;
        # Only Fleet calls (/v1/fleet/<name>, matched after nginx has decoded and normalised the
        # path) go through, and the SuperLink gets exactly the matched path (\$uri), never the
        # client's raw one: /v1/fleet/../control/... cannot reach the Control API.
        location ~ ^/v1/fleet/[a-z][a-z-]*\$ {
            proxy_pass https://superlink\$uri;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For \$remote_addr;
            proxy_set_header X-Forwarded-Proto https;
            proxy_request_buffering off;
            proxy_buffering off;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate ca.crt;
            proxy_ssl_name localhost;
            proxy_ssl_session_reuse on;
        }
        location / { return 404; }
    }
}
EOF
nginx_args=(-e stderr -p "$proxy_dir/" -c "$proxy_dir/nginx.conf")
if ! "$nginx" -t -q "${nginx_args[@]}"; then
  echo "start_superlink.sh: nginx refused its configuration (above)" >&2
  exit 2
fi

export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
flower-superlink \
  --ssl-ca-certfile "$credentials/ca.crt" \
  --ssl-certfile "$credentials/server.pem" \
  --ssl-keyfile "$credentials/server.key" \
  --enable-supernode-auth \
  --host 127.0.0.1 --port "$superlink_port" \
  --disable-runtime-dependency-installation \
  ${database[@]+"${database[@]}"} &  # (bash 3.2 treats an empty array as unset)
superlink_pid=$!
"$nginx" "${nginx_args[@]}" &
proxy_pid=$!
echo "start_superlink.sh: SuperNodes connect to $public_host:$public_port (Fleet API only);" \
  "flwr on this machine to 127.0.0.1:$superlink_port" >&2
while kill -0 "$superlink_pid" 2>/dev/null && kill -0 "$proxy_pid" 2>/dev/null; do
  note_workers
  sleep 0.5
done
if kill -0 "$superlink_pid" 2>/dev/null; then
  wait "$proxy_pid" && status=0 || status=$?
  echo "start_superlink.sh: the proxy (nginx) exited with status $status; stopping the SuperLink" >&2
else
  wait "$superlink_pid" && status=0 || status=$?
  echo "start_superlink.sh: the SuperLink exited with status $status; stopping the proxy" >&2
fi
exit "$status"
