#!/usr/bin/env bash
# Measures the agent's memory as kubelet counts it, on this machine: the release agent
# runs the demo (three 2 GiB loop drives, health polls as often as on the e2e kit) in a
# memory cgroup of its own, as a container does, and is sampled idle, then after a mix
# of work (lifecycles of ext4, xfs and block volumes, two clones, an online growth),
# then idle again. Each sample: the working set (the cgroup's usage less its inactive
# page cache: what kubelet reports and evicts by) with what it is made of, and the
# process's VmRSS. BENCHMARKS.md ("Idle memory") has the figures.
#
#   sudo scripts/memory.sh [BINARY]       default: target/release/drivelet
#
# The binary is read into the page cache first, from this shell's cgroup: on a node the
# image's files are in the cache already, written there by containerd, not by the pod.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/drivelet}")
dir=/tmp/drivelet-memory
name=drivelet-memory-$$
[ "$(id -u)" = 0 ] || { echo "memory.sh: run as root" >&2; exit 1; }
pgrep -x systemd-udevd >/dev/null || /lib/systemd/systemd-udevd --daemon

if [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/$name v2=0
else
  cg=/sys/fs/cgroup/$name v2=1
fi
mkdir -p "$dir/kubelet/stage" "$dir/kubelet/pods" "$cg"
sed "s#/tmp/drivelet-demo#$dir#g" config/demo.toml >"$dir/agent.toml"
printf '\n[health]\ninterval = "1s"\njitter_percent = 0\nvolume_check_interval = "2s"\n' >>"$dir/agent.toml"
cat "$bin" >/dev/null

setsid bash -c "echo \$\$ > $cg/cgroup.procs; exec $bin run --config $dir/agent.toml" >"$dir/agent.log" 2>&1 </dev/null &
agent=$!
stop() {
  kill -TERM "$agent" 2>/dev/null && while kill -0 "$agent" 2>/dev/null; do sleep 0.2; done
  rmdir "$cg" 2>/dev/null || true
}
trap stop EXIT
t0=$(date +%s)

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
stat_of() { awk -v k="$1" '$1 == k { print $2 }' "$cg/memory.stat"; }
sample() {
  local usage anon active inactive kernel
  if [ "$v2" = 1 ]; then
    usage=$(cat "$cg/memory.current") anon=$(stat_of anon) active=$(stat_of active_file)
    inactive=$(stat_of inactive_file) kernel=$(stat_of kernel)
  else
    usage=$(cat "$cg/memory.usage_in_bytes") anon=$(stat_of total_rss) active=$(stat_of total_active_file)
    inactive=$(stat_of total_inactive_file) kernel=$(cat "$cg/memory.kmem.usage_in_bytes")
  fi
  local rss
  rss=$(awk '/^(VmRSS|RssAnon|RssFile|Threads):/ { v[$1] = $2 } END {
    printf "VmRSS %.1f MiB (anonymous %.1f, files %.1f), %d threads", v["VmRSS:"] / 1024, v["RssAnon:"] / 1024, v["RssFile:"] / 1024, v["Threads:"] }' \
    "/proc/$agent/status")
  printf '%-22s %4ss  working set %5s MiB = anonymous %s + page cache active %s + kernel %s (inactive page cache %s); %s\n' \
    "$1" $(($(date +%s) - t0)) "$(mib $((usage - inactive)))" "$(mib "$anon")" "$(mib "$active")" "$(mib "$kernel")" \
    "$(mib "$inactive")" "$rss"
}
wait_until() { local now=$(($(date +%s) - t0)); [ "$1" -le "$now" ] || sleep $(($1 - now)); }

csi="$bin csi --endpoint $dir/csi.sock"
until $csi info >/dev/null 2>&1; do sleep 0.2; done
for t in 10 30 60; do wait_until "$t"; sample idle; done

life="$bin bench lifecycle --endpoint $dir/csi.sock --staging-dir $dir/kubelet/stage --target-dir $dir/kubelet/pods --concurrency 2"
$life --count 10 --size 128Mi >"$dir/work.txt"
$life --count 6 --size 512Mi --fs xfs >>"$dir/work.txt"
$life --count 6 --block >>"$dir/work.txt"
vol_id() { python3 -c 'import json, sys; print(json.load(sys.stdin)["volume_id"])'; }
k=$dir/kubelet
src=$($csi -o json create mem-src --size 128Mi --fs ext4 | vol_id)
$csi stage "$src" --staging "$k/stage/src" >/dev/null
$csi publish "$src" --staging "$k/stage/src" --target "$k/pods/src" >/dev/null
dd if=/dev/urandom of="$k/pods/src/data" bs=1M count=32 conv=fsync status=none
$csi unpublish "$src" --target "$k/pods/src" >/dev/null
$csi unstage "$src" --staging "$k/stage/src" >/dev/null
clone=$($csi -o json create mem-clone --size 128Mi --fs ext4 --source "$src" | vol_id)
bsrc=$($csi -o json create mem-bsrc --size 64Mi --block | vol_id)
bclone=$($csi -o json create mem-bclone --size 64Mi --block --source "$bsrc" | vol_id)
grow=$($csi -o json create mem-grow --size 320Mi --fs xfs | vol_id)
$csi stage "$grow" --staging "$k/stage/grow" >/dev/null
$csi expand "$grow" --size 640Mi >/dev/null
$csi node-expand "$grow" --path "$k/stage/grow" >/dev/null
$csi unstage "$grow" --staging "$k/stage/grow" >/dev/null
for v in "$clone" "$src" "$bclone" "$bsrc" "$grow"; do $csi delete "$v" >/dev/null; done
sample "after the work"
done_at=$(($(date +%s) - t0))
for d in 30 120; do wait_until $((done_at + d)); sample "work + ${d}s"; done
