#!/usr/bin/env python3
"""Synthetic storage objects for the scale harness (scripts/scale.sh), straight through
the API server's REST API (Python 3 standard library only).

  scale_objects.py create --count N --node NODE --prefix P [--attachments] [--snapshot-contents]
  scale_objects.py delete [--prefix P]      every object it made (or only prefix P's)

create makes, for each index i in 0..N-1:
  - a PersistentVolume synthetic-P-i of driver csi.drivelet.io (volumeHandle synthetic-P-i,
    1Gi, ReadWriteOnce, reclaim policy Retain, storageClassName drivelet-scale, required
    node affinity topology.drivelet.io/node In [NODE], claimRef to the claim below);
  - a PersistentVolumeClaim synthetic-P-i in namespace drivelet-scale bound to it by name
    (annotations volume.kubernetes.io/selected-node: NODE and
    volume.kubernetes.io/storage-provisioner: csi.drivelet.io);
  - with --attachments, a VolumeAttachment synthetic-P-i (attacher csi.drivelet.io,
    nodeName NODE, the PV as its source);
  - with --snapshot-contents, a VolumeSnapshotContent synthetic-P-i (driver
    csi.drivelet.io, deletionPolicy Retain, source.volumeHandle the PV's, and a
    volumeSnapshotRef to a VolumeSnapshot that does not exist).
Every object (and the namespace drivelet-scale) carries the label
drivelet-scale/synthetic=true and drivelet-scale/prefix=P. No StorageClass is made: the
claims are bound by name, so nothing provisions. An object that exists already counts as
made (a rerun is harmless).

delete removes them by that label (a collection delete per kind), then takes the
finalizers off what is left (the PV and claim protection finalizers, the snapshot
controller's) until nothing labelled is left, and deletes the namespace (waiting until it is gone) when no
prefix is given.

Access: https://127.0.0.1:6443 (API), the bearer token in the first field of
$KIT_DIR/pki/tokens.csv, the CA $KIT_DIR/pki/ca.crt (else no verification: the address
is the loopback). --concurrency (default 16) requests at once, each worker with its own
kept-alive connection. Prints the rate to stderr and a JSON summary to stdout.
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import ssl
import sys
import threading
import time
import urllib.parse

DRIVER = "csi.drivelet.io"
NAMESPACE = "drivelet-scale"
CLASS = "drivelet-scale"
LABEL = "drivelet-scale/synthetic"
PREFIX_LABEL = "drivelet-scale/prefix"
TOPOLOGY_KEY = "topology.drivelet.io/node"


class Api:
    """A tiny REST client: one kept-alive HTTPS connection per thread, retries on
    throttling, server errors and dropped connections."""

    def __init__(self, server, token, cafile):
        u = urllib.parse.urlsplit(server)
        self.host, self.port = u.hostname, u.port or 443
        if cafile and os.path.exists(cafile):
            self.ctx = ssl.create_default_context(cafile=cafile)
            self.ctx.check_hostname = False  # the serving cert names the API's hosts; the CA is what matters
        else:
            self.ctx = ssl._create_unverified_context()
        self.headers = {"Authorization": "Bearer " + token, "Accept": "application/json"}
        self.local = threading.local()

    def _conn(self):
        c = getattr(self.local, "conn", None)
        if c is None:
            c = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=60)
            self.local.conn = c
        return c

    def request(self, method, path, body=None, content_type="application/json", ok_codes=()):
        """(status, parsed body or None). Retries 429, 5xx and connection errors for a
        minute; other statuses are returned as they are."""
        data = None if body is None else json.dumps(body).encode()
        headers = dict(self.headers)
        if data is not None:
            headers["Content-Type"] = content_type
        delay, deadline = 0.2, time.time() + 60
        while True:
            try:
                c = self._conn()
                c.request(method, path, body=data, headers=headers)
                r = c.getresponse()
                raw = r.read()
                status = r.status
            except (http.client.HTTPException, OSError):
                try:
                    self.local.conn.close()
                except Exception:
                    pass
                self.local.conn = None
                if time.time() > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 5)
                continue
            if (status == 429 or status >= 500) and time.time() < deadline:
                time.sleep(delay)
                delay = min(delay * 2, 5)
                continue
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = {"raw": raw[:500].decode(errors="replace")}
            return status, parsed


def labels(prefix):
    return {LABEL: "true", PREFIX_LABEL: prefix}


def pv(prefix, i, node):
    name = f"synthetic-{prefix}-{i}"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": labels(prefix)},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": CLASS,
            "volumeMode": "Filesystem",
            "csi": {"driver": DRIVER, "volumeHandle": name, "fsType": "ext4"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": TOPOLOGY_KEY, "operator": "In", "values": [node]}]}]}},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": NAMESPACE, "name": name},
        },
    }


def pvc(prefix, i, node):
    name = f"synthetic-{prefix}-{i}"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": labels(prefix),
            "annotations": {
                "volume.kubernetes.io/selected-node": node,
                "volume.kubernetes.io/storage-provisioner": DRIVER,
            },
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": CLASS,
            "volumeMode": "Filesystem",
            "volumeName": name,
        },
    }


def attachment(prefix, i, node):
    name = f"synthetic-{prefix}-{i}"
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "VolumeAttachment",
        "metadata": {"name": name, "labels": labels(prefix)},
        "spec": {"attacher": DRIVER, "nodeName": node, "source": {"persistentVolumeName": name}},
    }


def snapshot_content(prefix, i, node):
    name = f"synthetic-{prefix}-{i}"
    return {
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshotContent",
        "metadata": {"name": name, "labels": labels(prefix)},
        "spec": {
            "driver": DRIVER,
            "deletionPolicy": "Retain",
            "source": {"volumeHandle": name},
            "volumeSnapshotRef": {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                                  "namespace": NAMESPACE, "name": f"missing-{name}"},
        },
    }


# kind: (collection path, namespaced)
KINDS = {
    "PersistentVolumeClaim": (f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims", True),
    "PersistentVolume": ("/api/v1/persistentvolumes", False),
    "VolumeAttachment": ("/apis/storage.k8s.io/v1/volumeattachments", False),
    "VolumeSnapshotContent": ("/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents", False),
}


def ensure_namespace(api):
    s, b = api.request("POST", "/api/v1/namespaces", {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {LABEL: "true"}}})
    if s not in (201, 409):
        sys.exit(f"scale_objects.py: creating namespace {NAMESPACE}: HTTP {s}: {b}")
    if s == 409:  # it may still be going from an earlier delete
        for _ in range(120):
            s, b = api.request("GET", f"/api/v1/namespaces/{NAMESPACE}")
            if s == 200 and not b.get("metadata", {}).get("deletionTimestamp"):
                return
            if s == 404:
                return ensure_namespace(api)
            time.sleep(1)
        sys.exit(f"scale_objects.py: namespace {NAMESPACE} is still terminating")


def create(api, args):
    ensure_namespace(api)
    makers = [("PersistentVolume", pv), ("PersistentVolumeClaim", pvc)]
    if args.attachments:
        makers.append(("VolumeAttachment", attachment))
    if args.snapshot_contents:
        makers.append(("VolumeSnapshotContent", snapshot_content))
    counts = {"made": 0, "existed": 0}
    lock = threading.Lock()

    def one(i):
        for kind, make in makers:
            path, _ = KINDS[kind]
            s, b = api.request("POST", path, make(args.prefix, i, args.node))
            if s == 201:
                key = "made"
            elif s == 409:
                key = "existed"
            else:
                raise RuntimeError(f"creating {kind} synthetic-{args.prefix}-{i}: HTTP {s}: {b}")
            with lock:
                counts[key] += 1

    t0 = time.time()
    errors = []
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        for f in concurrent.futures.as_completed([pool.submit(one, i) for i in range(args.start, args.start + args.count)]):
            if f.exception() is not None:
                errors.append(str(f.exception()))
    dt = max(time.time() - t0, 1e-6)
    objects = counts["made"] + counts["existed"]
    summary = {
        "action": "create", "prefix": args.prefix, "node": args.node, "count": args.count,
        "kinds": [k for k, _ in makers], "made": counts["made"], "existed": counts["existed"],
        "errors": len(errors), "seconds": round(dt, 2),
        "objects_per_second": round(objects / dt, 1), "indexes_per_second": round(args.count / dt, 1),
    }
    print(f"scale_objects.py: {objects} objects ({counts['existed']} existed) for {args.count} indexes "
          f"on {args.node} in {dt:.1f} s: {objects / dt:.0f} objects/s, {args.count / dt:.0f} indexes/s"
          + (f"; {len(errors)} failed, first: {errors[0]}" if errors else ""), file=sys.stderr)
    print(json.dumps(summary))
    return 1 if errors else 0


def list_names(api, kind, selector):
    path, _ = KINDS[kind]
    names, cont = [], ""
    while True:
        q = {"labelSelector": selector, "limit": "500"}
        if cont:
            q["continue"] = cont
        s, b = api.request("GET", path + "?" + urllib.parse.urlencode(q))
        if s == 404:
            return []  # no such resource (no CRD) or no namespace
        if s != 200:
            raise RuntimeError(f"listing {kind}: HTTP {s}: {b}")
        for it in b.get("items", []):
            m = it["metadata"]
            names.append((m["name"], bool(m.get("finalizers"))))
        cont = b.get("metadata", {}).get("continue", "")
        if not cont:
            return names


def delete(api, args):
    selector = f"{LABEL}=true" + (f",{PREFIX_LABEL}={args.prefix}" if args.prefix else "")
    t0 = time.time()
    total = 0
    order = ["VolumeAttachment", "VolumeSnapshotContent", "PersistentVolumeClaim", "PersistentVolume"]
    for kind in order:
        names = list_names(api, kind, selector)
        total += len(names)
        if names:
            path, _ = KINDS[kind]
            s, b = api.request("DELETE", path + "?" + urllib.parse.urlencode({"labelSelector": selector}))
            if s not in (200, 202, 404):
                raise RuntimeError(f"deleting {kind}: HTTP {s}: {b}")
    # what finalizers hold: take them off, until nothing labelled is left
    deadline = time.time() + args.timeout
    left = {}
    while time.time() < deadline:
        left = {k: list_names(api, k, selector) for k in order}
        if not any(left.values()):
            break
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            futures = []
            for kind, names in left.items():
                path, _ = KINDS[kind]
                for name, has_finalizers in names:
                    if has_finalizers:
                        futures.append(pool.submit(api.request, "PATCH", f"{path}/{name}",
                                                   {"metadata": {"finalizers": None}},
                                                   "application/merge-patch+json"))
                    else:  # made after the collection delete, or not taken by it
                        futures.append(pool.submit(api.request, "DELETE", f"{path}/{name}"))
            for f in futures:
                f.result()
        time.sleep(1)
    remaining = sum(len(v) for v in left.values())
    if not args.prefix and not remaining:
        s, _ = api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
        while s in (200, 202) and time.time() < deadline:  # until it is gone: its controller's work is done
            time.sleep(1)
            s, _ = api.request("GET", f"/api/v1/namespaces/{NAMESPACE}")
    dt = max(time.time() - t0, 1e-6)
    print(f"scale_objects.py: deleted {total} objects in {dt:.1f} s ({total / dt:.0f}/s)"
          + (f"; {remaining} still there" if remaining else ""), file=sys.stderr)
    print(json.dumps({"action": "delete", "prefix": args.prefix, "objects": total,
                      "remaining": remaining, "seconds": round(dt, 2)}))
    return 1 if remaining else 0


def main():
    kit_dir = os.environ.get("KIT_DIR", "/var/tmp/k8s-kit")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("action", choices=["create", "delete"])
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--start", type=int, default=0, help="first index (create)")
    p.add_argument("--node", default="")
    p.add_argument("--prefix", default="")
    p.add_argument("--attachments", action="store_true")
    p.add_argument("--snapshot-contents", action="store_true")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--timeout", type=float, default=300, help="delete: seconds to wait for the objects to go")
    p.add_argument("--server", default=os.environ.get("API_SERVER", "https://127.0.0.1:6443"))
    p.add_argument("--token-file", default=f"{kit_dir}/pki/tokens.csv")
    p.add_argument("--ca", default=f"{kit_dir}/pki/ca.crt")
    args = p.parse_args()
    with open(args.token_file) as f:
        token = f.readline().split(",")[0].strip()
    api = Api(args.server, token, args.ca)
    if args.action == "create":
        if args.count <= 0 or not args.node or not args.prefix:
            p.error("create needs --count N (> 0), --node NODE and --prefix P")
        return create(api, args)
    return delete(api, args)


if __name__ == "__main__":
    sys.exit(main())
