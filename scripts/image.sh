#!/usr/bin/env bash
# Builds the drivelet image without Docker or a registry, as an archive containerd
# imports (`ctr -n k8s.io images import`): a Debian 12 root filesystem made by
# debootstrap with the packages of the Dockerfile's runtime stage, the release binary
# and config/drivelet.toml, with the Dockerfile's entrypoint and command. The
# Dockerfile stays the public build; this is the same runtime contents for machines
# with no Docker engine (CI, the e2e suite on ../shared/k8s).
#
#   scripts/image.sh [OUT.tar]      default: target/image/drivelet.tar
#
# Environment: IMAGE (default docker.io/library/drivelet:latest, what deploy/'s
# `drivelet:latest` resolves to), SKIP_BUILD=1 (use target/release/drivelet as it is),
# DEBIAN_MIRROR (default: the Debian archive the host's own apt sources name; the script
# names no host of its own, and stops in words when neither says one).
# The Debian root filesystem is cached under target/image/rootfs-*, keyed by the
# package list; delete it to make it afresh. Needs root (debootstrap).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/image/drivelet.tar}"
image="${IMAGE:-docker.io/library/drivelet:latest}"
# Keep in step with the Dockerfile's runtime stage.
packages="libudev1,udev,e2fsprogs,xfsprogs,util-linux,smartmontools,ca-certificates"

if [ "$(id -u)" != 0 ]; then
  echo "image.sh: run as root (debootstrap)" >&2
  exit 1
fi
command -v debootstrap >/dev/null || {
  echo "image.sh: installing debootstrap" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
}

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cargo build --release --locked
fi
[ -x target/release/drivelet ] || { echo "image.sh: no target/release/drivelet" >&2; exit 1; }

mirror="${DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
  mirror=$(grep -hoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
    | head -n1 | awk '{print $2}' || true)
fi
[ -n "$mirror" ] || {
  echo "image.sh: no Debian archive to build the image from: the host's apt sources name none (/etc/apt/sources.list, /etc/apt/sources.list.d/*.sources); set DEBIAN_MIRROR to one" >&2
  exit 1
}

mkdir -p target/image
key=$(printf '%s %s' "$packages" bookworm | sha256sum | cut -c1-12)
rootfs="target/image/rootfs-$key"
if [ ! -e "$rootfs/.complete" ]; then
  rm -rf "$rootfs" "$rootfs.tmp"
  echo "image.sh: debootstrap bookworm ($packages) from $mirror" >&2
  debootstrap --variant=minbase --include="$packages" bookworm "$rootfs.tmp" "$mirror" >/dev/null
  # What debian:bookworm-slim leaves out, and what a container never uses.
  rm -rf "$rootfs.tmp"/usr/share/doc/* "$rootfs.tmp"/usr/share/man/* "$rootfs.tmp"/usr/share/info/* \
    "$rootfs.tmp"/var/lib/apt/lists/* "$rootfs.tmp"/var/cache/apt/*.bin "$rootfs.tmp"/var/cache/apt/archives/*.deb \
    "$rootfs.tmp"/var/log/*.log "$rootfs.tmp"/var/log/apt/*
  find "$rootfs.tmp"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} + 2>/dev/null || true
  touch "$rootfs.tmp/.complete"
  mv "$rootfs.tmp" "$rootfs"
fi

python3 - "$rootfs" "$out" "$image" <<'EOF'
"""Writes a docker-archive (one layer) from the cached root filesystem plus drivelet."""
import hashlib, io, json, os, sys, tarfile, time

rootfs, out, image = sys.argv[1:4]
extra = {
    "usr/local/bin/drivelet": ("target/release/drivelet", 0o755),
    "etc/drivelet/drivelet.toml": ("config/drivelet.toml", 0o644),
}

def reset(ti):
    # Reproducible: no owner names, one fixed time.
    ti.uname = ti.gname = ""
    ti.mtime = 0
    return ti

layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
    for top in sorted(os.listdir(rootfs)):
        if top in (".complete",):
            continue
        t.add(os.path.join(rootfs, top), arcname=top, recursive=True, filter=reset)
    for dirpath in ("usr/local/bin", "etc/drivelet"):
        if not os.path.isdir(os.path.join(rootfs, dirpath)):
            d = tarfile.TarInfo(dirpath)
            d.type, d.mode = tarfile.DIRTYPE, 0o755
            t.addfile(d)
    for dst, (src, mode) in extra.items():
        ti = reset(t.gettarinfo(src, arcname=dst))
        ti.mode, ti.uid, ti.gid = mode, 0, 0
        with open(src, "rb") as f:
            t.addfile(ti, f)
data = layer.getvalue()
diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
config = {
    "architecture": "amd64",
    "os": "linux",
    "created": "1970-01-01T00:00:00Z",
    "config": {
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "Entrypoint": ["/usr/local/bin/drivelet"],
        "Cmd": ["run", "--config", "/etc/drivelet/drivelet.toml"],
    },
    "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "drivelet scripts/image.sh"}],
}
cfg = json.dumps(config, sort_keys=True).encode()
cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
manifest = json.dumps([{"Config": cfg_name, "RepoTags": [image], "Layers": ["layer.tar"]}]).encode()
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
tmp = out + ".tmp"
with tarfile.open(tmp, mode="w") as t:
    for name, blob in (("layer.tar", data), (cfg_name, cfg), ("manifest.json", manifest)):
        ti = tarfile.TarInfo(name)
        ti.size = len(blob)
        t.addfile(ti, io.BytesIO(blob))
os.replace(tmp, out)
print(f"image.sh: {image} -> {out} ({len(data) / 1048576:.1f} MiB layer)", file=sys.stderr)
EOF
