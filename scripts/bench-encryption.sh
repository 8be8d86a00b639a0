#!/usr/bin/env bash
# What encryption at rest costs, measured through drivelet on real loop drives (as root):
# - IO: sequential writes and reads (dd, 1 MiB blocks, fdatasync; reads after dropping
#   the caches) of SIZE_MIB through an encrypted and a plain ext4 volume on the same
#   drive, ROUNDS rounds each, alternating;
# - crypto-erase: DeleteVolume of an encrypted 1 GiB and 8 GiB volume (each staged once
#   and filled with 256 MiB first), ROUNDS rounds each;
# - copies: CreateVolume of a clone of a 1 GiB volume holding 256 MiB in 64 files,
#   plain (used blocks) and encrypted (files re-encrypted under the clone's own key).
# Usage: sudo scripts/bench-encryption.sh [BINARY] (default target/release/drivelet).
# BENCHMARKS.md ("Encryption at rest") holds what it printed.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/drivelet}")
rounds=${ROUNDS:-5}
size_mib=${SIZE_MIB:-512}
dir=$(mktemp -d /tmp/dlt-encbench.XXXX)
agent=
cleanup() {
  [ -n "$agent" ] && kill "$agent" 2>/dev/null && wait "$agent" 2>/dev/null || true
  for m in $(findmnt -rn -o TARGET | grep "^$dir" | sort -r); do umount "$m" || true; done
  for l in $(losetup -a | grep "$dir" | cut -d: -f1); do losetup -d "$l"; done
  rm -rf "$dir"
}
trap cleanup EXIT
mkdir -p "$dir/drives" "$dir/kubelet"
truncate -s 24G "$dir/drives/d0.img"
losetup --find --show "$dir/drives/d0.img" >/dev/null
udevadm settle -t 30
cat > "$dir/bench.toml" <<EOF
[driver]
node_name = "bench-node"
[paths]
csi_socket = "$dir/csi.sock"
admin_socket = "$dir/admin.sock"
state_dir = "$dir/state"
[drives]
allow_loop = true
[drives.filters]
include_paths = ["$dir/drives/*.img"]
[volumes]
allowed_roots = ["$dir/kubelet"]
[log]
format = "compact"
level = "warn"
EOF
"$bin" run --config "$dir/bench.toml" > "$dir/agent.log" 2>&1 &
agent=$!
for _ in $(seq 60); do [ -S "$dir/csi.sock" ] && break; sleep 0.5; done
sleep 3
printf 'key=%s\n' "$(head -c32 /dev/urandom | od -An -tx1 | tr -d ' \n')" > "$dir/kek"
csi() { "$bin" csi --endpoint "$dir/csi.sock" -o json "$@"; }
id_of() { sed -n 's/.*"volume_id": *"\([^"]*\)".*/\1/p' | head -1; }
ms() { date +%s%N; }

make_vol() { # name size encrypted -> id, staged and published at $dir/kubelet/NAME
  local name=$1 size=$2 enc=$3 params=()
  [ "$enc" = 1 ] && params=(--param drivelet.io/encryption=fscrypt)
  local id
  id=$(csi create "$name" --size "$size" --fs ext4 "${params[@]}" | id_of)
  csi stage "$id" --staging "$dir/kubelet/$name-s" --fs ext4 --secrets-file "$dir/kek" >/dev/null
  csi publish "$id" --staging "$dir/kubelet/$name-s" --target "$dir/kubelet/$name" --fs ext4 >/dev/null
  echo "$id"
}
drop_vol() { # name id
  csi unpublish "$2" --target "$dir/kubelet/$1" >/dev/null
  csi unstage "$2" --staging "$dir/kubelet/$1-s" >/dev/null
}

enc=$(make_vol enc 2Gi 1)
plain=$(make_vol plain 2Gi 0)
echo "IO through ext4 volumes on one loop drive, ${size_mib} MiB, ${rounds} rounds (MiB/s):"
for r in $(seq "$rounds"); do
  for v in enc plain; do
    t0=$(ms); dd if=/dev/zero of="$dir/kubelet/$v/f" bs=1M count="$size_mib" conv=fdatasync status=none; t1=$(ms)
    sync; echo 3 > /proc/sys/vm/drop_caches
    t2=$(ms); dd if="$dir/kubelet/$v/f" of=/dev/null bs=1M status=none; t3=$(ms)
    rm -f "$dir/kubelet/$v/f"
    echo "  round $r $v: write $(( size_mib * 1000000000 / (t1 - t0) )) read $(( size_mib * 1000000000 / (t3 - t2) ))"
  done
done
drop_vol enc "$enc"; drop_vol plain "$plain"
csi delete "$enc" >/dev/null; csi delete "$plain" >/dev/null

echo "DeleteVolume of an encrypted volume (ms):"
for r in $(seq "$rounds"); do
  for size in 1Gi 8Gi; do
    id=$(make_vol "del-$size-$r" "$size" 1)
    dd if=/dev/urandom of="$dir/kubelet/del-$size-$r/f" bs=1M count=256 conv=fdatasync status=none
    drop_vol "del-$size-$r" "$id"
    t0=$(ms); csi delete "$id" >/dev/null; t1=$(ms)
    echo "  round $r $size: $(( (t1 - t0) / 1000000 ))"
    # The cleaner zeroes the freed space before it is placed again: let it finish.
    for _ in $(seq 600); do "$bin" ctl --socket "$dir/admin.sock" drives 2>/dev/null | grep -q "cleaning" || break; sleep 0.5; done
  done
done

echo "CreateVolume of a clone of a 1 GiB volume holding 256 MiB in 64 files (ms):"
for kind in plain enc; do
  e=0; [ "$kind" = enc ] && e=1
  src=$(make_vol "src-$kind" 1Gi "$e")
  for f in $(seq 64); do dd if=/dev/urandom of="$dir/kubelet/src-$kind/f$f" bs=1M count=4 status=none; done
  sync
  drop_vol "src-$kind" "$src"
  params=(); [ "$e" = 1 ] && params=(--param drivelet.io/encryption=fscrypt)
  for r in $(seq "$rounds"); do
    # The provisioner's Secret: the key-encryption key an encrypted copy needs.
    t0=$(ms)
    id=$(csi create "clone-$kind-$r" --size 1Gi --fs ext4 --source "$src" "${params[@]}" --secrets-file "$dir/kek" | id_of)
    t1=$(ms)
    echo "  round $r $kind: $(( (t1 - t0) / 1000000 ))"
    csi delete "$id" >/dev/null
    for _ in $(seq 600); do "$bin" ctl --socket "$dir/admin.sock" drives 2>/dev/null | grep -q "cleaning" || break; sleep 0.5; done
  done
  csi delete "$src" >/dev/null
done
