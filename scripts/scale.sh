#!/usr/bin/env bash
# The scale harness: what each drivelet agent costs the Kubernetes API server as the
# cluster grows, on the cluster kit (../shared/k8s) with fake nodes. As root:
#
#   sudo K=20 FOREIGN=1000 scripts/scale.sh
#
# It brings the kit up without a kubelet (WITH_KUBELET=0) with the fake Nodes scale-01 ..
# scale-K (one agent each) and foreign-1 .. foreign-3 (Nodes with no agent: what is on
# them is other nodes' business), starts K agents as host processes (`drivelet run`, as
# scripts/e2e-node.sh runs one, but with no drives: the include filter matches nothing),
# and measures, from the API server's /metrics and each agent's:
#   1. the watches the agents hold (apiserver_longrunning_requests{verb="WATCH"}, after
#      less before), in all and per agent;
#   2. idle requests per agent per second over IDLE seconds (drivelet_kube_requests_total
#      of each agent when it has it; else the API server's apiserver_request_total, less
#      the rate measured before the agents started, divided by K);
#   3. watch events per claim: C claims+PVs of foreign-1 made in a burst, the API
#      server's apiserver_watch_events_total (PV, claim and VolumeAttachment) delta / C,
#      and the agents' drivelet_kube_watch_events_total and
#      drivelet_kube_foreign_watch_events_total deltas when they have them;
#   4. memory against foreign objects: each agent's VmRSS before and after FOREIGN
#      PV+claim pairs of foreign-2 are made and have settled, in KiB per pair (the median
#      of the agents that are not elected, and the elected agent's);
#   5. the requests each agent made while starting (its counter once settled, or the
#      server-side estimate).
# It writes OUT (JSON; the raw samples stay in /var/tmp/drivelet-scale/samples) and
# prints a markdown table row. Then it stops the agents, deletes the synthetic objects
# (label drivelet-scale/synthetic=true) and the scale Nodes, and takes the kit down
# (down.sh), unless KEEP=1 (everything stays up: run again, or down.sh).
#
# Environment:
#   K=10          agents (Nodes scale-01 .. scale-K)
#   FOREIGN=1000  synthetic foreign PV+claim pairs for the memory figure (0: skip it)
#   IDLE=60       seconds of the idle window (and of the baseline window before it)
#   C=20          claims of the watch-event burst
#   SIDECAR=0     1: also the kit's csi-provisioner in node-deployment mode per node
#   BIN=target/release/drivelet   the binary (copied first: a rebuild does not change it)
#   OUT=target/scale/K.json       the results
#   SETTLE=20     seconds an agent is given to finish starting (less if its request
#                 counter stops moving first)
#   QUIET_MAX=900 seconds at most to wait for the cluster to be quiet (before the
#                 baseline, after the foreign pairs: the kit's controller binds them one
#                 by one, and every watcher gets each update)
#   KEEP=0        1: leave the agents, the objects and the kit up
#   KIT=../shared/k8s, KIT_DIR=/var/tmp/k8s-kit
#   LOCK=/tmp/drivelet-kit.lock, LOCK_WAIT=3600   the kit's lock (flock -o), as for e2e.sh
#   BUSY_WAIT=3600  seconds to wait while the kit is in use by an end-to-end run
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

lock=${LOCK:-/tmp/drivelet-kit.lock}
if [ -z "${SCALE_LOCKED:-}" ]; then
  [ "$(id -u)" = 0 ] || { echo "scale.sh: run as root" >&2; exit 1; }
  if ! flock -n "$lock" true 2>/dev/null; then echo "scale.sh: waiting for the kit's lock $lock" >&2; fi
  SCALE_LOCKED=1 exec flock -o -w "${LOCK_WAIT:-3600}" "$lock" "$0" "$@"
fi

kit=${KIT:-$root/../shared/k8s}
export KIT_DIR=${KIT_DIR:-/var/tmp/k8s-kit}
K=${K:-10} FOREIGN=${FOREIGN:-1000} IDLE=${IDLE:-60} C=${C:-20} SIDECAR=${SIDECAR:-0}
SETTLE=${SETTLE:-20} KEEP=${KEEP:-0} QUIET_MAX=${QUIET_MAX:-900}
BIN=${BIN:-target/release/drivelet}
OUT=${OUT:-target/scale/$K.json}
driver=csi.drivelet.io
work=/var/tmp/drivelet-scale
samples=$work/samples
run=$KIT_DIR/run
api=https://127.0.0.1:6443
t_start=$(date +%s)

log() { echo "[scale $(($(date +%s) - t_start))s] $*" >&2; }
die() { log "error: $*"; exit 1; }
[[ $K =~ ^[1-9][0-9]*$ ]] || die "K=$K: a positive number"
[[ $FOREIGN =~ ^[0-9]+$ && $IDLE =~ ^[1-9][0-9]*$ && $C =~ ^[1-9][0-9]*$ ]] || die "FOREIGN, IDLE and C are numbers"
[ -x "$BIN" ] || die "no binary $BIN (nice -n 19 cargo build --release --locked)"
[ -x "$kit/up.sh" ] || die "no kit at $kit (KIT=DIR)"

width=${#K}; [ "$width" -ge 2 ] || width=2
nodes=()
for i in $(seq 1 "$K"); do nodes+=("$(printf "scale-%0${width}d" "$i")"); done
foreign=(foreign-1 foreign-2 foreign-3)

kc() { "$KIT_DIR/bin/kubectl" --kubeconfig="$KIT_DIR/admin.kubeconfig" "$@"; }
token() { cut -d, -f1 "$KIT_DIR/pki/tokens.csv" | head -n1; }
apiget() { curl -fsS --max-time 20 --cacert "$KIT_DIR/pki/ca.crt" -H "Authorization: Bearer $(token)" "$api$1"; }
kit_up() { curl -fsS --max-time 3 -k "$api/readyz" >/dev/null 2>&1; }

pid_of() { # NAME: the live pid in $run/NAME.pid whose executable is NAME.exe, else nothing
  local p
  p=$(cat "$run/$1.pid" 2>/dev/null) || return 0
  [ -n "$p" ] && [ "$(readlink -f "/proc/$p/exe" 2>/dev/null)" = "$(cat "$run/$1.exe" 2>/dev/null)" ] && echo "$p"
  return 0
}

# What else uses the kit: a kubelet (an e2e run with its real node), an e2e agent or
# provisioner of a fake node (drivelet-node-N, csi-provisioner-node-N), a drivelet-e2e
# namespace. Prints the first thing found.
kit_busy() {
  local f name
  for f in "$run"/*.pid; do
    [ -e "$f" ] || continue
    name=$(basename "$f" .pid)
    case $name in
      kubelet | containerd | drivelet-* | csi-provisioner-node-*)
        [ -n "$(pid_of "$name")" ] && { echo "$name is running"; return 0; } ;;
    esac
  done
  if kit_up; then
    name=$(kc get ns -o name 2>/dev/null | grep -m1 'drivelet-e2e' || true)
    [ -n "$name" ] && { echo "$name exists"; return 0; }
    name=$(kc get ds -A -o name 2>/dev/null | grep -m1 drivelet || true)
    [ -n "$name" ] && { echo "$name is deployed"; return 0; }
  fi
  return 1
}

waited=0
while why=$(kit_busy); do
  [ "$waited" -lt "${BUSY_WAIT:-3600}" ] || die "the kit is still in use ($why); try later"
  log "the kit is in use ($why); waiting"
  sleep 30
  waited=$((waited + 30))
done

# ---- the kit, its Nodes, the namespace and the Drive CRD
stop_name() { # NAME: SIGTERM, KILL after 20 s, forget its pid files
  local p
  p=$(pid_of "$1")
  if [ -n "$p" ]; then
    kill -TERM "$p" 2>/dev/null || true
    for _ in $(seq 1 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && { log "$1 ($p) ignored SIGTERM for 20 s; killing it"; kill -KILL "$p" 2>/dev/null || true; }
  fi
  rm -f "$run/$1.pid" "$run/$1.exe"
}

stop_all() { # every agent and provisioner of this harness, this run's or an earlier one's
  local f
  for f in "$run"/scale-agent-*.pid "$run"/scale-provisioner-*.pid; do
    [ -e "$f" ] || continue
    stop_name "$(basename "$f" .pid)" &
  done
  wait || true
}

# the agents of an earlier KEEP=1 run, before their binary is replaced
stop_all
mkdir -p "$work/bin" "$(dirname "$OUT")"
rm -rf "$samples"
mkdir -p "$samples"
cp "$BIN" "$work/bin/drivelet.new" && mv -f "$work/bin/drivelet.new" "$work/bin/drivelet"
exe=$work/bin/drivelet
bin_version=$("$exe" --version 2>/dev/null | head -n1 || true)
bin_sha=$(sha256sum "$exe" | cut -c1-16)

log "kit up: WITH_KUBELET=0, EXTRA_NODES: ${nodes[0]} .. ${nodes[-1]} and ${foreign[*]}"
WITH_KUBELET=0 EXTRA_NODES="${nodes[*]} ${foreign[*]}" "$kit/up.sh" >/dev/null 2>"$work/up.log" ||
  { tail -n 20 "$work/up.log" >&2; die "up.sh failed (log: $work/up.log)"; }
kc apply -f deploy/namespace.yaml -f deploy/crd-drive.yaml >/dev/null
kc wait --for=condition=Established crd/drives.drivelet.io --timeout=60s >/dev/null
# the driver on each scale node, as kubelet's plugin registration would put it
printf '%s\n' "${nodes[@]}" | xargs -P 4 -I{} "$kit/node.sh" csi {} "$driver" {} "topology.drivelet.io/node={}" >/dev/null 2>>"$work/up.log"

# ---- samples: the API server's metrics and each agent's, RSS, the Lease holder
agents_started=0
sample() { # NAME
  local d=$samples/$1 n p
  mkdir -p "$d"
  date +%s.%N >"$d/time"
  apiget /metrics | grep -E '^apiserver_(request_total|longrunning_requests|registered_watchers|watch_events_total)\{' >"$d/apiserver.txt" ||
    die "reading the API server's /metrics"
  if [ "$agents_started" = 1 ]; then
    for i in "${!nodes[@]}"; do
      n=${nodes[$i]}
      curl -fsS --max-time 5 "http://127.0.0.1:$((20001 + i))/metrics" >"$d/agent-$n.txt" 2>/dev/null || echo "# unreachable" >"$d/agent-$n.txt"
      p=$(pid_of "scale-agent-$n")
      if [ -n "$p" ]; then awk '/^VmRSS:/ {print $2}' "/proc/$p/status" >"$d/rss-$n"; else echo 0 >"$d/rss-$n"; fi
    done
    kc -n drivelet-system get lease drivelet-cluster-duties -o 'jsonpath={.spec.holderIdentity}' >"$d/holder" 2>/dev/null || true
  fi
}
server_sum() { # SAMPLE FAMILY [FILTER-REGEX]: the sum of a family's series in a sample
  grep -E "^$2\{" "$samples/$1/apiserver.txt" | grep -E "${3:-.}" | awk '{s += $NF} END {printf "%d\n", s}'
}
watch_events() { server_sum "$1" apiserver_watch_events_total 'kind="(PersistentVolume|PersistentVolumeClaim|VolumeAttachment)"|resource="(persistentvolumes|persistentvolumeclaims|volumeattachments)"'; }
agent_requests() { # NODE: the agent's drivelet_kube_requests_total, summed; empty if absent
  curl -fsS --max-time 5 "http://127.0.0.1:$((20001 + $1))/metrics" 2>/dev/null |
    awk '/^drivelet_kube_requests_total[{ ]/ {s += $NF; f = 1} END {if (f) printf "%d\n", s}'
}
quiet() { # NAME SECONDS-MIN SECONDS-MAX: until, over 5 s, the PV, claim and VolumeAttachment
  # watch events grow by 5 at most (the duties and controllers touch a few now and then)
  # and every agent's VmRSS moves by less than 1% (256 KiB at least)
  local name=$1 t0=$SECONDS ev last_ev="" i p r moved
  local -a rss=() last_rss=()
  shift
  while :; do
    sleep 5
    ev=$(apiget /metrics | grep -E '^apiserver_watch_events_total\{' |
      grep -E 'kind="(PersistentVolume|PersistentVolumeClaim|VolumeAttachment)"|resource="(persistentvolumes|persistentvolumeclaims|volumeattachments)"' |
      awk '{s += $NF} END {printf "%d\n", s}')
    moved=0
    for i in "${!nodes[@]}"; do
      p=$(pid_of "scale-agent-${nodes[$i]}") r=0
      [ -n "$p" ] && r=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
      rss[$i]=$r
      [ -n "${last_rss[$i]:-}" ] || { moved=1; continue; }
      awk -v a="$r" -v b="${last_rss[$i]}" 'BEGIN {d = a - b; if (d < 0) d = -d; t = b / 100; if (t < 256) t = 256; exit !(d >= t)}' &&
        moved=$((moved + 1))
    done
    [ "$agents_started" = 1 ] || moved=0
    echo "$((SECONDS - t0)) s: watch events +$((ev - ${last_ev:-ev})), agents whose RSS moved: $moved, RSS KiB: ${rss[*]}" >>"$samples/quiet-$name.log"
    if [ $((SECONDS - t0)) -ge "$1" ] && [ -n "$last_ev" ] && [ $((ev - last_ev)) -le 5 ] && [ "$moved" = 0 ]; then
      echo "$((SECONDS - t0))" >"$samples/quiet-$name.seconds"; return 0
    fi
    [ $((SECONDS - t0)) -ge "$2" ] && { log "not quiet after $2 s; measuring anyway ($samples/quiet-$name.log)"; echo "$2 (not quiet)" >"$samples/quiet-$name.seconds"; return 0; }
    last_ev=$ev last_rss=("${rss[@]}")
  done
}

# ---- the agents
config() { # I NODE
  local i=$1 n=$2 dir=$work/$2
  mkdir -p "$dir/state"
  cat >"$dir/drivelet.toml" <<EOF
# Written by scripts/scale.sh: a drivelet agent for the fake node $n with no drives.
[driver]
name = "$driver"
node_name = "$n"
[paths]
csi_socket = "$dir/csi.sock"
admin_socket = "$dir/admin.sock"
state_dir = "$dir/state"
[kubelet]
registration = false
[kubernetes]
enabled = true
kubeconfig = "$KIT_DIR/admin.kubeconfig"
attach = true
events = true
drive_objects = true
label_node = false
cluster_duties = true
namespace = "drivelet-system"
[http]
address = "127.0.0.1:$((20001 + i))"
[volumes]
allowed_roots = ["/var/lib/kubelet"]
[log]
format = "compact"
level = "info"
[drives]
allow_loop = true
[drives.filters]
# a path that does not exist: this agent manages no drive
include_paths = ["$dir/no-drives/*"]
EOF
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$KEEP" = 1 ]; then
    log "KEEP=1: the agents, the synthetic objects and the kit stay up (logs: $work/NODE/agent.log)"
    exit "$rc"
  fi
  log "stopping the agents"
  stop_all
  if kit_up; then
    log "deleting the synthetic objects"
    python3 scripts/scale_objects.py delete >/dev/null || log "some synthetic objects are left"
    log "deleting the scale and foreign Nodes"
    printf '%s\n' "${nodes[@]}" "${foreign[@]}" | xargs -P 8 -I{} "$kit/node.sh" delete {} >/dev/null 2>&1 || true
    holder=$(kc -n drivelet-system get lease drivelet-cluster-duties -o 'jsonpath={.spec.holderIdentity}' 2>/dev/null || true)
    [[ $holder == scale-* ]] && kc -n drivelet-system delete lease drivelet-cluster-duties >/dev/null 2>&1 || true
  fi
  log "taking the kit down"
  "$kit/down.sh" >/dev/null 2>"$work/down.log" || log "down.sh failed (log: $work/down.log)"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# leftovers of an earlier KEEP=1 run: its objects (its agents are stopped above)
python3 scripts/scale_objects.py delete >/dev/null 2>&1 || true
# scale Nodes of an earlier, larger run (KEEP=1) would stand as agentless nodes
for n in $(kc get nodes -l k8s-kit/fake-node=true -o name | sed 's#^node/##' | grep -E '^scale-[0-9]+$' || true); do
  [[ " ${nodes[*]} " == *" $n "* ]] || { "$kit/node.sh" delete "$n" >/dev/null 2>&1 || true; log "deleted the Node $n of an earlier run"; }
done

# the kit's controllers may still be busy with an earlier run's objects (binding,
# releasing): the baseline starts once the PV and claim watch events stand still
log "waiting until the kit's controllers are quiet"
quiet pre-baseline 10 "$QUIET_MAX"
log "baseline: ${IDLE} s with no agent"
sample base0
sleep "$IDLE"
sample base1
# the same burst as below with no agent: the watch events the cluster sends without them
log "burst with no agent: $C claims of foreign-1"
sample burst_base0
python3 scripts/scale_objects.py create --count "$C" --node foreign-1 --prefix burst-base >"$samples/burst_base0/create.json" 2>/dev/null
quiet burst-base 5 60
sample burst_base1

log "starting $K agents ($bin_version, sha256 $bin_sha)"
for i in "${!nodes[@]}"; do
  n=${nodes[$i]} dir=$work/${nodes[$i]}
  config "$i" "$n"
  "$exe" check-config "$dir/drivelet.toml" >/dev/null 2>"$dir/check-config.log" ||
    { cat "$dir/check-config.log" >&2; die "check-config $dir/drivelet.toml"; }
  rm -f "$dir/csi.sock" "$dir/admin.sock"
  NODE_NAME="$n" KUBECONFIG="$KIT_DIR/admin.kubeconfig" setsid "$exe" run --config "$dir/drivelet.toml" \
    >"$dir/agent.log" 2>&1 </dev/null &
  echo $! >"$run/scale-agent-$n.pid"
  readlink -f "$exe" >"$run/scale-agent-$n.exe"
done
agents_started=1
t_agents=$(date +%s.%N)
for i in "${!nodes[@]}"; do
  n=${nodes[$i]} ok=
  for _ in $(seq 1 300); do
    curl -fsS --max-time 2 "http://127.0.0.1:$((20001 + i))/metrics" >/dev/null 2>&1 && { ok=1; break; }
    [ -n "$(pid_of "scale-agent-$n")" ] || { tail -n 20 "$work/$n/agent.log" >&2; die "the agent of $n exited"; }
    sleep 0.2
  done
  [ -n "$ok" ] || die "the agent of $n serves no /metrics after 60 s (log: $work/$n/agent.log)"
done
log "every agent serves /metrics ($(awk -v a="$t_agents" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s)"

if [ "$SIDECAR" = 1 ]; then
  for n in "${nodes[@]}"; do
    NODE_NAME="$n" NAMESPACE=drivelet-system setsid "$KIT_DIR/bin/csi-provisioner" \
      --kubeconfig="$KIT_DIR/admin.kubeconfig" --csi-address="$work/$n/csi.sock" \
      --node-deployment=true --node-deployment-immediate-binding=false \
      --strict-topology=true --immediate-topology=false \
      --enable-capacity=true --capacity-for-immediate-binding=true \
      --capacity-poll-interval=15s --capacity-ownerref-level=-1 \
      --extra-create-metadata=true >"$work/$n/provisioner.log" 2>&1 </dev/null &
    echo $! >"$run/scale-provisioner-$n.pid"
    readlink -f "$KIT_DIR/bin/csi-provisioner" >"$run/scale-provisioner-$n.exe"
  done
  log "started $K csi-provisioners"
fi

# start-up: until the Lease has a holder and every agent's request counter stands still
# for two polls (4 s), or SETTLE s
t0=$SECONDS last="" prev_same="" holder=""
while [ $((SECONDS - t0)) -lt "$SETTLE" ]; do
  sleep 2
  now=""
  for i in "${!nodes[@]}"; do now+="$(agent_requests "$i") "; done
  holder=$(kc -n drivelet-system get lease drivelet-cluster-duties -o 'jsonpath={.spec.holderIdentity}' 2>/dev/null || true)
  [[ " ${nodes[*]} " == *" $holder "* ]] || { last=""; continue; }
  [ -n "${now// /}" ] && [ "$now" = "$last" ] && [ -n "$prev_same" ] && break
  prev_same=$([ "$now" = "$last" ] && echo 1 || true)
  last=$now
done
log "settled after $((SECONDS - t0)) s; the cluster duties: ${holder:-nobody}"
for n in "${nodes[@]}"; do
  [ -n "$(pid_of "scale-agent-$n")" ] || { tail -n 5 "$work/$n/agent.log" >&2; die "the agent of $n exited (log: $work/$n/agent.log)"; }
done
sample started

log "idle: $IDLE s"
sleep "$IDLE"
sample idle

log "burst: $C claims of foreign-1"
sample burst0
python3 scripts/scale_objects.py create --count "$C" --node foreign-1 --prefix burst >"$samples/burst0/create.json" 2>/dev/null
quiet burst 5 60
sample burst1

if [ "$FOREIGN" -gt 0 ]; then
  sample foreign0
  log "memory: $FOREIGN foreign pairs of foreign-2"
  python3 scripts/scale_objects.py create --count "$FOREIGN" --node foreign-2 --prefix foreign >"$samples/foreign0/create.json" 2>"$samples/foreign0/create.log"
  log "waiting until the agents and the watches are quiet (30 s at least)"
  quiet foreign 30 "$QUIET_MAX"
  sample foreign1
fi

# ---- the figures
python3 - "$samples" "$OUT" "$K" "$FOREIGN" "$IDLE" "$C" "$SIDECAR" "$bin_version" "$bin_sha" "${nodes[*]}" <<'PY'
import json, os, re, statistics, sys
samples, out, K, FOREIGN, IDLE, C, SIDECAR, version, sha, nodes = sys.argv[1:]
K, FOREIGN, IDLE, C, SIDECAR, nodes = int(K), int(FOREIGN), int(IDLE), int(C), int(SIDECAR), nodes.split()
series = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
label = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

def parse(path):
    rows = []
    if not os.path.exists(path):
        return rows
    for line in open(path):
        m = series.match(line)
        if not m or line.startswith('#'):
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        rows.append((m.group(1), dict(label.findall(m.group(2) or '')), v))
    return rows

def have(name):
    return os.path.isdir(f"{samples}/{name}")

def t(name):
    return float(open(f"{samples}/{name}/time").read())

def server(name):
    return parse(f"{samples}/{name}/apiserver.txt")

def agent(name, node):
    return parse(f"{samples}/{name}/agent-{node}.txt")

def total(rows, family, pred=lambda l: True):
    return sum(v for n, l, v in rows if n == family and pred(l))

def by(rows, family, key, pred=lambda l: True):
    d = {}
    for n, l, v in rows:
        if n == family and pred(l):
            k = l.get(key) or l.get('kind') or l.get('resource') or ''
            d[k] = d.get(k, 0) + v
    return d

def delta(d1, d0):
    return {k: d1.get(k, 0) - d0.get(k, 0) for k in set(d1) | set(d0) if d1.get(k, 0) - d0.get(k, 0)}

def rss(name, node):
    try:
        return int(open(f"{samples}/{name}/rss-{node}").read().strip() or 0)
    except OSError:
        return 0

def stats(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"min": round(min(xs), 3), "median": round(statistics.median(xs), 3), "max": round(max(xs), 3)}

holder = open(f"{samples}/idle/holder").read().strip() if os.path.exists(f"{samples}/idle/holder") else ""
others = [n for n in nodes if n != holder]
res = {"k": K, "foreign_pairs": FOREIGN, "idle_seconds": IDLE, "burst_claims": C, "sidecar": bool(SIDECAR),
       "binary": {"version": version, "sha256_prefix": sha}, "elected": holder}

# 1. watches held
watch = lambda l: l.get('verb') == 'WATCH'
w0, w1 = server('burst_base1'), server('idle')
before, after = total(w0, 'apiserver_longrunning_requests', watch), total(w1, 'apiserver_longrunning_requests', watch)
res["watches"] = {"source": "apiserver_longrunning_requests{verb=\"WATCH\"}", "before": before, "after": after,
                  "held_by_agents": after - before, "per_agent": round((after - before) / K, 2),
                  "by_resource": delta(by(w1, 'apiserver_longrunning_requests', 'resource', watch),
                                       by(w0, 'apiserver_longrunning_requests', 'resource', watch))}
if SIDECAR:
    res["watches"]["note"] = "with SIDECAR=1 the provisioners' watches are in the figure"

# server-side request rate with no agent (heartbeats of the fake nodes, controllers)
req = 'apiserver_request_total'
notwatch = lambda l: l.get('verb') != 'WATCH'
# The fake Nodes' heartbeats are most of the server's load, and they come every 10 s or
# so, a step too coarse for a window's rate: their requests (kubectl patch: a GET and a
# PATCH of nodes/status and of the node's Lease) are taken out by name first. The
# agents renew and read their own Lease with PUT and GET, never PATCH, so each PATCH of
# a Lease stands for one heartbeat GET of one.
def others_total(rows):
    def hb(l):
        v, r, sub = l.get('verb'), l.get('resource'), l.get('subresource')
        return (r == 'nodes' and sub == 'status' and v in ('GET', 'PATCH')) or (r == 'leases' and v == 'PATCH')
    lease_patches = total(rows, req, lambda l: l.get('resource') == 'leases' and l.get('verb') == 'PATCH')
    return total(rows, req, lambda l: not hb(l)) - lease_patches
base_rate = (others_total(server('base1')) - others_total(server('base0'))) / (t('base1') - t('base0'))
counter = any(n == 'drivelet_kube_requests_total' for node in nodes for n, _, _ in agent('idle', node))

def agent_total(name, node, family='drivelet_kube_requests_total'):
    return total(agent(name, node), family)

# 2. idle requests per agent per second
dt_idle = t('idle') - t('started')
idle = {"seconds": round(dt_idle, 1), "server_baseline_per_second": round(base_rate, 2),
        "server_baseline_note": "requests per second with no agent, less the fake Nodes' heartbeats"}
server_idle = (others_total(server('idle')) - others_total(server('started'))) / dt_idle
idle["server_per_second_with_agents"] = round(server_idle, 2)
idle["server_estimate_per_agent_per_second"] = round((server_idle - base_rate) / K, 3)
def vr(rows):
    d = {}
    for n, l, v in rows:
        if n == req:
            k = f"{l.get('verb')} {l.get('resource') or l.get('subresource')}" + (f"/{l['subresource']}" if l.get('resource') and l.get('subresource') else '')
            d[k] = d.get(k, 0) + v
    return d
per_s = lambda d, dt: {k: round(v / dt, 3) for k, v in sorted(d.items(), key=lambda kv: -kv[1])}
idle["server_by_verb_resource_per_second"] = per_s(delta(vr(server('idle')), vr(server('started'))), dt_idle)
idle["server_baseline_by_verb_resource_per_second"] = per_s(delta(vr(server('base1')), vr(server('base0'))), t('base1') - t('base0'))
if counter:
    rates = {n: (agent_total('idle', n) - agent_total('started', n)) / dt_idle for n in nodes}
    idle["source"] = "each agent's drivelet_kube_requests_total"
    idle["per_agent_per_second"] = stats(list(rates.values()))
    idle["non_elected_per_second"] = stats([rates[n] for n in others])
    idle["elected_per_second"] = round(rates.get(holder, 0), 3) if holder else None
    idle["by_agent"] = {n: round(r, 3) for n, r in rates.items()}
    verbs = {}
    for n in nodes:
        for k, v in delta(by(agent('idle', n), 'drivelet_kube_requests_total', 'verb'),
                          by(agent('started', n), 'drivelet_kube_requests_total', 'verb')).items():
            verbs[k] = verbs.get(k, 0) + v
    idle["agents_by_verb_per_second"] = {k: round(v / dt_idle, 3) for k, v in verbs.items()}
else:
    idle["source"] = ("the API server's apiserver_request_total less the fake Nodes' heartbeats and less the rest's rate "
                      "before the agents started, divided by K (the agents share one identity; no drivelet_kube_requests_total)")
    e = (server_idle - base_rate) / K
    idle["per_agent_per_second"] = {"min": None, "median": round(e, 3), "max": None}
    idle["elected_per_second"] = None
res["idle_requests"] = idle

# 3. watch events per claim
pvk = lambda l: (l.get('kind') in ('PersistentVolume', 'PersistentVolumeClaim', 'VolumeAttachment') or
                 l.get('resource') in ('persistentvolumes', 'persistentvolumeclaims', 'volumeattachments'))
wev = 'apiserver_watch_events_total'
b0, b1 = server('burst0'), server('burst1')
ev = total(b1, wev, pvk) - total(b0, wev, pvk)
bb0, bb1 = server('burst_base0'), server('burst_base1')
ev0 = total(bb1, wev, pvk) - total(bb0, wev, pvk)
burst = {"claims": C, "source": "apiserver_watch_events_total (PersistentVolume, PersistentVolumeClaim, VolumeAttachment)",
         "server_events": ev, "server_per_claim": round(ev / C, 2),
         "server_by_kind": delta(by(b1, wev, 'kind', pvk), by(b0, wev, 'kind', pvk)),
         "server_per_claim_without_agents": round(ev0 / C, 2),
         "server_by_kind_without_agents": delta(by(bb1, wev, 'kind', pvk), by(bb0, wev, 'kind', pvk)),
         "agents_per_claim": round((ev - ev0) / C, 2), "per_agent_per_claim": round((ev - ev0) / C / K, 2)}
for fam in ('drivelet_kube_watch_events_total', 'drivelet_kube_foreign_watch_events_total'):
    if any(n == fam for node in nodes for n, _, _ in agent('burst1', node)):
        d = {n: (agent_total('burst1', n, fam) - agent_total('burst0', n, fam)) / C for n in nodes}
        burst[fam + "_per_claim"] = {"agents": stats([d[x] for x in others]), "elected": round(d.get(holder, 0), 2) if holder else None}
try:
    burst["creation"] = json.load(open(f"{samples}/burst0/create.json"))
except (OSError, ValueError):
    pass
res["watch_events"] = burst

# 4. memory against foreign objects
if FOREIGN and have('foreign1'):
    r0 = {n: rss('foreign0', n) for n in nodes}
    r1 = {n: rss('foreign1', n) for n in nodes}
    per = {n: (r1[n] - r0[n]) / FOREIGN for n in nodes}
    f0, f1 = server('foreign0'), server('foreign1')
    fev = total(f1, wev, pvk) - total(f0, wev, pvk)
    res["memory"] = {
        "source": "VmRSS of /proc/PID/status, KiB",
        "settle_seconds": open(f"{samples}/quiet-foreign.seconds").read().strip() if os.path.exists(f"{samples}/quiet-foreign.seconds") else None,
        "pairs": FOREIGN,
        "rss_kib_before": stats(list(r0.values())), "rss_kib_after": stats(list(r1.values())),
        "kib_per_pair_non_elected": stats([per[n] for n in others]),
        "kib_per_pair_elected": round(per.get(holder, 0), 3) if holder else None,
        "elected_rss_kib_before": r0.get(holder), "elected_rss_kib_after": r1.get(holder),
        "by_agent_kib": {n: [r0[n], r1[n]] for n in nodes},
        "server_watch_events_per_pair": round(fev / FOREIGN, 2),
        "elected_after": open(f"{samples}/foreign1/holder").read().strip() if os.path.exists(f"{samples}/foreign1/holder") else "",
    }
    try:
        res["memory"]["creation"] = json.load(open(f"{samples}/foreign0/create.json"))
    except (OSError, ValueError):
        pass
    if counter:
        dtf = t('foreign1') - t('foreign0')
        res["memory"]["agent_requests_per_agent"] = stats([agent_total('foreign1', n) - agent_total('foreign0', n) for n in nodes])

# 5. requests at start-up
dt_start = t('started') - t('burst_base1')
su = {"seconds": round(dt_start, 1)}
srv = others_total(server('started')) - others_total(server('burst_base1')) - base_rate * dt_start
su["server_estimate_per_agent"] = round(srv / K, 1)
su["server_by_verb_resource"] = {k: v for k, v in sorted(delta(vr(server('started')), vr(server('burst_base1'))).items(), key=lambda kv: -kv[1])}
if counter:
    c = {n: agent_total('started', n) for n in nodes}
    su["source"] = "each agent's drivelet_kube_requests_total once settled"
    su["per_agent"] = stats(list(c.values()))
    su["elected"] = c.get(holder)
else:
    su["source"] = "the API server's apiserver_request_total from before the agents to settled, less the baseline, divided by K"
    su["per_agent"] = {"min": None, "median": round(srv / K, 1), "max": None}
res["startup_requests"] = su

json.dump(res, open(out, 'w'), indent=2, sort_keys=False)
fmt = lambda x, d=2: '-' if x is None else (f"{x:.{d}f}" if isinstance(x, float) else str(x))
ir = res["idle_requests"]
mem = res.get("memory", {})
kp = (mem.get("kib_per_pair_non_elected") or {}).get("median")
row = [str(K), f"{res['watches']['held_by_agents']} ({res['watches']['per_agent']:.1f}/agent)",
       f"{burst['server_per_claim']:.1f} ({burst['per_agent_per_claim']:.1f}/agent)",
       (f"{fmt(ir['per_agent_per_second']['median'], 3)} / {fmt(ir['per_agent_per_second']['max'], 3)} (elected {fmt(ir['elected_per_second'], 3)})"
        if counter else f"{fmt(ir['per_agent_per_second']['median'], 3)} (server estimate)"),
       (f"{fmt(kp, 2)} (elected {fmt(mem.get('kib_per_pair_elected'), 2)})" if mem else "-"),
       (f"{fmt(su['per_agent']['median'], 0)} / {fmt(su['per_agent']['max'], 0)}" if counter
        else f"{fmt(su['per_agent']['median'], 0)} (server estimate)")]
print("| K | watches held | watch events per claim | idle requests/s per agent: median / max (elected) | KiB per foreign pair (elected) | start-up requests per agent: median / max |")
print("|---|---|---|---|---|---|")
print("| " + " | ".join(row) + " |")
PY
log "results: $OUT (samples: $samples)"
