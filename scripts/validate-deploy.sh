#!/usr/bin/env bash
# Validates deploy/ offline, without a cluster:
# - the kustomization: every file it lists exists, and every manifest in deploy/ is
#   listed (so nothing is left out of `kubectl apply -k deploy/`);
# - every object in the listed manifests against the OpenAPI schemas of each Kubernetes
#   version in K8S_VERSIONS, strictly (an unknown field is an error, and so is a kind
#   the schemas do not know: nothing is skipped);
# - when kubectl is installed, also the output of `kubectl kustomize deploy/` (the
#   generated ConfigMap, the image and namespace rewrites).
# Needs python3 with kubernetes-validate; scripts/setup-host.sh installs it.
# Exit 0 when all is valid, 1 when something is not, 2 when the tools are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_VERSIONS="${K8S_VERSIONS:-1.30.0 1.33.0}"

if ! python3 -c 'import kubernetes_validate.utils, yaml' 2>/dev/null; then
  echo "validate-deploy: python3 cannot import kubernetes_validate; install it with" \
       "scripts/setup-host.sh (or: python3 -m pip install kubernetes-validate)" >&2
  exit 2
fi

rendered=""
cleanup() { [ -z "$rendered" ] || rm -f "$rendered"; }
trap cleanup EXIT
if command -v kubectl >/dev/null 2>&1; then
  rendered=$(mktemp)
  kubectl kustomize deploy/ >"$rendered"
  echo "validate-deploy: rendered deploy/ with $(kubectl version --client 2>/dev/null | head -n1)"
else
  echo "validate-deploy: kubectl not installed; validating the manifests as written, not the rendered kustomization"
fi

python3 - "$K8S_VERSIONS" "$rendered" <<'PY'
import os
import sys

import yaml
from kubernetes_validate import utils

versions = sys.argv[1].split()
rendered = sys.argv[2]
deploy = "deploy"
errors = []

with open(os.path.join(deploy, "kustomization.yaml")) as f:
    kustomization = yaml.safe_load(f)
resources = kustomization.get("resources") or []
generated = [
    name
    for gen in kustomization.get("configMapGenerator") or []
    for name in gen.get("files") or []
]
for name in resources + generated:
    if not os.path.isfile(os.path.join(deploy, name)):
        errors.append(f"kustomization.yaml names {name}, which is not in {deploy}/")
manifests = sorted(
    n for n in os.listdir(deploy) if n.endswith((".yaml", ".yml")) and n != "kustomization.yaml"
)
for name in manifests:
    if name not in resources:
        errors.append(f"{deploy}/{name} is not listed in kustomization.yaml resources")


def validate(label, path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    if not docs:
        errors.append(f"{label}: no objects")
    seen = set()
    for doc in docs:
        what = f"{label}: {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
        key = (doc.get("apiVersion"), doc.get("kind"), (doc.get("metadata") or {}).get("name"))
        if key in seen:
            errors.append(f"{what} appears twice")
        seen.add(key)
        before = len(errors)
        for version in versions:
            try:
                utils.validate(doc, version, strict=True)
            except utils.ValidationError as e:
                path_ = ".".join(str(p) for p in e.path)
                errors.append(f"{what} is invalid for Kubernetes {version}: {path_}: {e.message}")
            except utils.SchemaNotFoundError as e:
                errors.append(f"{what}: {e.message}")
        if len(errors) == before:
            print(f"ok   {what} (Kubernetes {', '.join(versions)})")


for name in resources:
    path = os.path.join(deploy, name)
    if os.path.isfile(path):
        validate(f"{deploy}/{name}", path)
if rendered:
    validate("kubectl kustomize deploy/", rendered)

for e in errors:
    print(f"FAIL {e}")
if errors:
    print(f"validate-deploy: {len(errors)} problem(s)")
    sys.exit(1)
print("validate-deploy: all manifests valid")
PY
