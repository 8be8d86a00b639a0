#!/usr/bin/env bash
# The end-to-end suite on a real Kubernetes (the kit in ../shared/k8s: one real node,
# node-1, and two fake ones, node-2 and node-3), in one command, as root:
#   1. builds the release binary and the image archive (scripts/image.sh), and the suite;
#   2. brings the kit up with EXTRA_NODES="node-2 node-3" and imports the image into its
#      containerd;
#   3. makes node-1's three 2 GiB loop drives (/var/tmp/drivelet-e2e/drives), node-2's two
#      of 4 GiB and node-3's one of 1 GiB (/var/tmp/drivelet-e2e/NODE/drives), and the
#      smartctl stand-in the suite uses to make a drive fail;
#   4. starts the fake nodes' CSI side as host processes (scripts/e2e-node.sh: a drivelet
#      agent each, which provisions in process, node-3's first so that it holds the cluster-duties
#      Lease; drivelet's DaemonSet, on node-1 only, comes later);
#   5. runs tests/e2e (it deploys with `kubectl apply -k tests/e2e/overlay` and walks the
#      journeys; on failure it prints the kubelet and drivelet log lines that explain it);
#   6. deletes the deployment, stops the fake nodes' processes, detaches the drives and
#      takes the kit down, pass or fail.
# KEEP=1 leaves the kit, the deployment and the drives up for a look
# (`. /var/tmp/k8s-kit/kit.env; kubectl get drives`); run again to start afresh.
# KIT (default ../shared/k8s) is the kit's directory. SKIP_BUILD=1 takes the image in
# target/image/drivelet.tar as it is (a quicker rerun after changing only the suite).
# On a machine where others use the kit too, take the kit's lock with `flock -o`
# (`flock -o /tmp/drivelet-kit.lock scripts/e2e.sh`): without -o, the kit's daemons that
# up.sh starts inherit the lock's descriptor and hold the lock for as long as they run,
# which with KEEP=1 is until someone runs down.sh.
# E2E_JOURNEYS=nodes runs only the deploy journey, the journeys across nodes
# (tests/e2e/nodes.rs) and the clean-up (the output says which were not run);
# E2E_JOURNEYS=snapshots only the deploy, snapshot (tests/e2e/snapshots.rs) and clean-up
# journeys; E2E_JOURNEYS=ownership the deploy, the state dir wiped, the moved disk
# (tests/e2e/ownership.rs, tests/e2e/adopt.rs) and the clean-up; E2E_JOURNEYS=claims
# the deploy, the claims journey (tests/e2e/claims.rs: Immediate binding, claims that
# wait with a reason) and the clean-up; E2E_JOURNEYS=encryption the deploy, the
# encryption journey (tests/e2e/encryption.rs) and the clean-up; E2E_JOURNEYS=clone the
# deploy, the clone journey (tests/e2e/clone.rs) and the clean-up.
# E2E_JOURNEYS=monitoring: the deploy, Prometheus watching (tests/e2e/monitoring.rs), the
# journeys that provoke its alerts (a drive vanishing, claims used by pods, a drive
# failing), its judgement of the dashboard and the alerts, and the clean-up.
# The suite runs Debian's prometheus (installed by scripts/setup-host.sh) on
# 127.0.0.1:19090, with its data under /var/tmp/drivelet-e2e/prometheus.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
kit="${KIT:-$root/../shared/k8s}"
export KIT="$kit"
e2e=/var/tmp/drivelet-e2e
overlay=tests/e2e/overlay
fake_nodes="node-2 node-3"
[ -x "$kit/up.sh" ] || { echo "e2e.sh: no cluster kit at $kit (set KIT)" >&2; exit 1; }

log() { echo "e2e.sh: $*" >&2; }
started=$(date +%s)

scripts/setup-host.sh
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cargo build --release --locked
  SKIP_BUILD=1 scripts/image.sh target/image/drivelet.tar
fi
[ -f target/image/drivelet.tar ] || { log "no target/image/drivelet.tar (run without SKIP_BUILD)"; exit 1; }
[ -x target/release/drivelet ] || { log "no target/release/drivelet (run without SKIP_BUILD)"; exit 1; }
# Built now, so the suite's clock does not include compiling it.
log "bringing the kit up (beside the build of the suite)"
up_log=$(mktemp)
EXTRA_NODES="$fake_nodes" "$kit/up.sh" >"$up_log" 2>&1 &
up=$!
cargo test --locked --features failpoints --test e2e --no-run
if ! wait "$up"; then
  log "the kit did not come up:"
  tail -40 "$up_log" >&2
  exit 1
fi
kit_dir="${KIT_DIR:-/var/tmp/k8s-kit}"
# shellcheck disable=SC1091
. "$kit_dir/kit.env"
export KIT_DIR="$kit_dir"

detach_drives() {
  for n in $fake_nodes; do scripts/e2e-node.sh detach "$n"; done
  for f in "$e2e"/drives/*.img; do
    [ -e "$f" ] || continue
    for dev in $(losetup -j "$f" -O NAME -n 2>/dev/null); do losetup -d "$dev" 2>/dev/null || true; done
  done
}

driver_pvs() {
  kubectl get pv -o jsonpath='{range .items[?(@.spec.csi.driver=="csi.drivelet.io")]}{.metadata.name}{"\n"}{end}' 2>/dev/null
}

driver_contents() {
  kubectl get volumesnapshotcontents -o jsonpath='{range .items[?(@.spec.driver=="csi.drivelet.io")]}{.metadata.name}{"\n"}{end}' 2>/dev/null
}

undeploy() {
  # Nothing confirms a graceful deletion on a fake node: its pods go by force.
  kubectl delete pods -n drivelet-e2e-nodes --all --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
  # VolumeSnapshots first, while drivelet still runs to delete their snapshots.
  kubectl delete volumesnapshots -n drivelet-e2e --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl delete namespace drivelet-e2e drivelet-e2e-nodes --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || true
  # The claims' PVs are deleted by the provisioner and drivelet: wait for them while
  # both still run. Any left after that (drivelet was not running) are dropped by force,
  # so the next run starts from an empty cluster.
  for _ in $(seq 1 90); do
    [ -z "$(driver_pvs)" ] && break
    sleep 1
  done
  kubectl delete -k "$overlay" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || true
  for pv in $(driver_pvs); do
    log "PV $pv outlived drivelet; removing it by force"
    kubectl patch pv "$pv" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
    kubectl delete pv "$pv" --wait=false >/dev/null 2>&1 || true
  done
  for c in $(driver_contents); do
    log "VolumeSnapshotContent $c outlived drivelet; removing it by force"
    kubectl patch volumesnapshotcontent "$c" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
    kubectl delete volumesnapshotcontent "$c" --wait=false >/dev/null 2>&1 || true
  done
  kubectl delete volumeattachments --all --wait=false >/dev/null 2>&1 || true
  # An attachment of a node whose agent is gone keeps its finalizer: dropped by force too.
  for va in $(kubectl get volumeattachments -o name 2>/dev/null); do
    kubectl patch "$va" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
  done
  # The DaemonSet's pod must be gone before its drives and state go.
  for _ in $(seq 1 60); do
    kubectl get pods -n drivelet-system -o name 2>/dev/null | grep -q . || break
    sleep 1
  done
  for n in $fake_nodes; do scripts/e2e-node.sh down "$n" || true; done
}

stop_prometheus() {
  pkill -f "$e2e/prometheus/prometheus.yml" 2>/dev/null || true
}

cleanup() {
  rc=$?
  stop_prometheus
  if [ "${KEEP:-0}" = 1 ]; then
    log "KEEP=1: the kit, the deployment and the drives stay up"
  else
    log "taking the deployment, the drives and the kit down"
    undeploy
    detach_drives
    rm -rf "$e2e" /var/lib/drivelet
    "$kit/down.sh" >/dev/null 2>&1 || log "down.sh failed; run $kit/down.sh"
  fi
  log "finished in $(( $(date +%s) - started ))s, exit $rc"
  exit $rc
}
trap cleanup EXIT

# A previous run left with KEEP=1 (or stopped half-way): start from nothing.
stop_prometheus
for n in $fake_nodes; do kubectl uncordon "$n" >/dev/null 2>&1 || true; done
undeploy
detach_drives
# drivelet's volume store (a hostPath) must match the blank drives made below.
rm -rf "$e2e" /var/lib/drivelet

log "importing the image"
ctr images import target/image/drivelet.tar >/dev/null

log "making the drives and the smartctl stand-in under $e2e"
mkdir -p "$e2e/drives" "$e2e/bin" "$e2e/smart" "$e2e/fixtures"
cp tests/fixtures/smartctl/*.json "$e2e/fixtures/"
# `smartctl --json -a DEVICE` prints the output chosen for DEVICE in $e2e/smart/NAME
# ("FIXTURE EXIT-CODE"), else what smartctl prints for a device it cannot open.
cat >"$e2e/bin/smartctl" <<EOF
#!/bin/sh
for a in "\$@"; do dev="\$a"; done
choice="$e2e/smart/\$(basename "\$dev")"
[ -f "\$choice" ] || choice="$e2e/smart/default"
read -r fixture code < "\$choice"
cat "\$fixture"
exit "\$code"
EOF
chmod 755 "$e2e/bin/smartctl"
open_failed="$e2e/fixtures/error-open-failed-megaraid.json"
echo "$open_failed $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["smartctl"]["exit_status"])' "$open_failed")" \
  >"$e2e/smart/default"
for i in 0 1 2; do
  truncate -s 2G "$e2e/drives/drive-$i.img"
  losetup --find --show "$e2e/drives/drive-$i.img" >/dev/null
done
scripts/e2e-node.sh drives node-2 4G 4G
scripts/e2e-node.sh drives node-3 1G
udevadm settle --timeout=30 || true

# The fake nodes' agents run the binary the image holds, from a copy the suite's files
# keep (a rebuild meanwhile does not change what runs). They need the namespace (their
# Lease, the provisioners' capacity objects) and the Drive CRD before the DaemonSet.
cp target/release/drivelet "$e2e/bin/drivelet"
kubectl apply -f deploy/namespace.yaml -f deploy/crd-drive.yaml >/dev/null
kubectl wait --for=condition=Established crd/drives.drivelet.io --timeout=60s >/dev/null
log "starting the CSI side of $fake_nodes (logs: $e2e/NODE/*.log)"
scripts/e2e-node.sh start node-3
for _ in $(seq 1 100); do
  [ "$(kubectl get lease -n drivelet-system drivelet-cluster-duties -o 'jsonpath={.spec.holderIdentity}' 2>/dev/null)" = node-3 ] && break
  sleep 0.2
done
scripts/e2e-node.sh start node-2

log "running the suite"
timeout 1200 cargo test --locked --features failpoints --test e2e
