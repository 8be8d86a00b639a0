#!/usr/bin/env bash
# The CSI side of one of the kit's fake nodes (../shared/k8s, "Extra nodes"), as host
# processes beside the cluster, for the end-to-end suite (scripts/e2e.sh starts them,
# tests/e2e/nodes.rs stops and restarts them):
#   - a drivelet agent (`drivelet run`) with NODE_NAME=NODE, the kit's admin kubeconfig,
#     its own config, state and sockets under /var/tmp/drivelet-e2e/NODE/ and an include
#     filter for its own loop drives only (/var/tmp/drivelet-e2e/NODE/drives/*.img), so it
#     never touches node-1's drives and node-1's agent never touches its, and /metrics on
#     127.0.0.1:981N for node-N. It provisions NODE's claims and publishes its capacity
#     in process, as the DaemonSet's agent does (no sidecar).
# Each writes $KIT_DIR/run/NAME.pid and NAME.exe, so the kit's down.sh stops what is left.
#
#   e2e-node.sh drives NODE SIZE...   make and attach NODE's loop drives (e.g. 4G 4G)
#   e2e-node.sh start NODE            the agent (unless it runs),
#                                     then register the driver on NODE (node.sh csi)
#   e2e-node.sh stop NODE             stop the agent (SIGTERM: a clean shutdown)
#   e2e-node.sh kill NODE             kill -9 the agent
#   e2e-node.sh down NODE             stop the agent (and a provisioner an earlier version left)
#   e2e-node.sh detach NODE           detach NODE's loop drives
# Environment: KIT (default ../shared/k8s), KIT_DIR (default /var/tmp/k8s-kit).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
kit="${KIT:-$root/../shared/k8s}"
kit_dir="${KIT_DIR:-/var/tmp/k8s-kit}"
e2e=/var/tmp/drivelet-e2e
driver=csi.drivelet.io

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1 node=$2
shift 2
dir="$e2e/$node"
run="$kit_dir/run"
# The agent's /metrics port: 9810 + the node's number (node-2: 9812), else 9819.
case ${node##*-} in
  [0-8]) http_port=$((9810 + ${node##*-})) ;;
  *) http_port=9819 ;;
esac
log() { echo "e2e-node.sh: $node: $*" >&2; }

pid_of() { # NAME: the live pid in $run/NAME.pid whose executable is NAME.exe, else nothing
  local p
  p=$(cat "$run/$1.pid" 2>/dev/null) || return 0
  [ -n "$p" ] && [ "$(readlink -f "/proc/$p/exe" 2>/dev/null)" = "$(cat "$run/$1.exe" 2>/dev/null)" ] && echo "$p"
  return 0
}

signal() { # NAME SIGNAL: signal it and wait until it is gone
  local p
  p=$(pid_of "$1")
  [ -n "$p" ] || return 0
  kill -"$2" "$p" 2>/dev/null || true
  for _ in $(seq 1 200); do
    kill -0 "$p" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$p" 2>/dev/null; then
    log "$1 ($p) ignored SIG$2 for 20 s; killing it"
    kill -KILL "$p" 2>/dev/null || true
  fi
  rm -f "$run/$1.pid" "$run/$1.exe"
}

spawn() { # NAME EXE ARGS...: start in the background with its own log, record pid and exe
  local name=$1 exe=$2
  shift 2
  mkdir -p "$run" "$dir"
  setsid "$exe" "$@" >>"$dir/$name.log" 2>&1 </dev/null &
  echo $! >"$run/$name.pid"
  readlink -f "$exe" >"$run/$name.exe"
}

config() {
  mkdir -p "$dir/state"
  cat >"$dir/drivelet.toml" <<EOF
# Written by scripts/e2e-node.sh: drivelet for the fake node $node, a host process.
[driver]
name = "$driver"
node_name = "$node"
[paths]
csi_socket = "$dir/csi.sock"
admin_socket = "$dir/admin.sock"
state_dir = "$dir/state"
[kubelet]
# No kubelet runs this node's plugins: node.sh csi registers the driver.
registration = false
[kubernetes]
enabled = true
kubeconfig = "$kit_dir/admin.kubeconfig"
attach = true
events = true
drive_objects = true
label_node = false
# A candidate for the cluster duties like every agent (the Lease and the removed
# volumes live in drivelet-system, as the DaemonSet's).
cluster_duties = true
namespace = "drivelet-system"
[http]
# /metrics for the suite's Prometheus (tests/e2e/monitoring.rs): node-N on port 9810+N.
address = "127.0.0.1:$http_port"
[volumes]
allowed_roots = ["/var/lib/kubelet"]
[log]
format = "compact"
level = "info"
[drives]
allow_loop = true
[drives.filters]
include_paths = ["$dir/drives/*.img"]
[health]
smartctl = "$e2e/bin/smartctl"
interval = "5s"
volume_check_interval = "5s"
EOF
}

case $cmd in
  drives)
    [ $# -ge 1 ] || usage
    mkdir -p "$dir/drives"
    i=0
    for size in "$@"; do
      truncate -s "$size" "$dir/drives/drive-$i.img"
      losetup -j "$dir/drives/drive-$i.img" | grep -q . || losetup --find --show "$dir/drives/drive-$i.img" >/dev/null
      i=$((i + 1))
    done
    ;;
  start)
    exe="$e2e/bin/drivelet"
    [ -x "$exe" ] || { log "no $exe (scripts/e2e.sh copies the release binary there)"; exit 1; }
    config
    if [ -z "$(pid_of "drivelet-$node")" ]; then
      rm -f "$dir/csi.sock" "$dir/admin.sock"
      NODE_NAME="$node" KUBECONFIG="$kit_dir/admin.kubeconfig" \
        spawn "drivelet-$node" "$exe" run --config "$dir/drivelet.toml"
    fi
    ok=
    for _ in $(seq 1 150); do
      if "$exe" csi --endpoint "$dir/csi.sock" info >/dev/null 2>&1; then ok=1; break; fi
      [ -n "$(pid_of "drivelet-$node")" ] || { log "drivelet exited; its log:"; tail -n 20 "$dir/drivelet-$node.log" >&2; exit 1; }
      sleep 0.2
    done
    [ -n "$ok" ] || { log "drivelet's CSI socket does not answer after 30 s"; tail -n 20 "$dir/drivelet-$node.log" >&2; exit 1; }
    "$kit/node.sh" csi "$node" "$driver" "$node" "topology.drivelet.io/node=$node" >/dev/null
    ;;
  stop) signal "drivelet-$node" TERM ;;
  kill) signal "drivelet-$node" KILL ;;
  down)
    signal "drivelet-$node" TERM
    signal "csi-provisioner-$node" TERM
    ;;
  detach)
    for f in "$dir"/drives/*.img; do
      [ -e "$f" ] || continue
      for dev in $(losetup -j "$f" -O NAME -n 2>/dev/null); do losetup -d "$dev" 2>/dev/null || true; done
    done
    ;;
  *) usage ;;
esac
