#!/usr/bin/env bash
# Prepares a Debian/Ubuntu host (as root) to build drivelet and run it or its tests:
# installs the build and runtime packages that are missing, starts systemd-udevd if it
# is not running, and replays udev events so existing devices get their records.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  echo "run as root: drivelet manages block devices" >&2
  exit 1
fi

need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
[ -e /usr/include/google/protobuf/descriptor.proto ] || need+=(libprotobuf-dev)
[ -e /usr/include/libudev.h ] || need+=(libudev-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v udevadm >/dev/null || need+=(udev)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v mkfs.xfs >/dev/null || need+=(xfsprogs)
command -v losetup >/dev/null || need+=(util-linux)
command -v blkid >/dev/null || need+=(util-linux)
command -v smartctl >/dev/null || need+=(smartmontools)
command -v sfdisk >/dev/null || need+=(fdisk)
command -v modprobe >/dev/null || need+=(kmod)
# tests/integration/csi/csi_sanity.rs unpacks the community conformance suite (../shared/tools/csi-sanity.zst).
command -v zstd >/dev/null || need+=(zstd)
# tests/integration/disks/foreign_data.rs puts the data a node's disks commonly carry on loop drives
# (btrfs, FAT, LUKS, an LVM physical volume, a bcache backing device) and reads the md
# superblocks it writes back with mdadm --examine.
command -v mkfs.btrfs >/dev/null || need+=(btrfs-progs)
command -v mkfs.vfat >/dev/null || need+=(dosfstools)
command -v cryptsetup >/dev/null || need+=(cryptsetup-bin)
command -v pvcreate >/dev/null || need+=(lvm2)
command -v make-bcache >/dev/null || need+=(bcache-tools)
command -v mdadm >/dev/null || need+=(mdadm)
# tests/integration/cluster/monitoring.rs checks deploy/monitoring's alerts with promtool, and
# tests/integration/csi/http.rs the text format /metrics answers with promtool check metrics;
# tests/e2e/monitoring.rs runs a real Prometheus beside the cluster kit.
command -v promtool >/dev/null || need+=(prometheus)
# scripts/validate-deploy.sh (run by tests/integration/cluster/deploy.rs) checks deploy/ with the Python
# package kubernetes-validate; tests/integration/csi/interop.rs calls the gRPC sockets with grpcio.
command -v python3 >/dev/null || need+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

kubernetes_validate="kubernetes-validate==1.37.0"
if ! python3 -c 'import kubernetes_validate.utils' 2>/dev/null; then
  echo "installing: $kubernetes_validate (pip)"
  # Debian 12's python3 refuses pip installs into the system environment unless told.
  python3 -m pip install --quiet --disable-pip-version-check "$kubernetes_validate" 2>/dev/null \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "$kubernetes_validate"
fi

# gRPC C-core's Python binding: tests/integration/csi/interop.rs calls both gRPC sockets with it.
grpcio="grpcio==1.76.0"
if ! python3 -c 'import grpc' 2>/dev/null; then
  echo "installing: $grpcio (pip)"
  python3 -m pip install --quiet --disable-pip-version-check "$grpcio" 2>/dev/null \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "$grpcio"
fi

if ! pgrep -x systemd-udevd >/dev/null; then
  udevd=/lib/systemd/systemd-udevd
  [ -x "$udevd" ] || udevd=/usr/lib/systemd/systemd-udevd
  "$udevd" --daemon
fi
udevadm trigger --subsystem-match=block --action=add || true
udevadm settle --timeout=30 || true

modprobe loop 2>/dev/null || true
if [ ! -e /dev/loop-control ]; then
  echo "no /dev/loop-control: this kernel has no loop device support" >&2
  exit 1
fi
