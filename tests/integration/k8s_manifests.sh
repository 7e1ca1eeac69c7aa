# The Kubernetes manifests of deploy/k8s, checked offline (no cluster runs here: docs/services.md):
#  1. k8s_schema.py: every object against the schema of Debian's python3-kubernetes models
#     (unknown fields, types, required fields), and the references between them (selectors,
#     Service ports, volumes, ConfigMaps, claims; the Secret zshard-secret is made by hand).
#  2. Each check can fail: copies with a misspelt field, a string where a number goes, a mount
#     of no volume, a selector that misses its pods and a Service port the pods lack are each
#     refused, naming the problem.
#  3. Every container runs zshard with options its --help lists, and the ConfigMap's job.json
#     is a config zshard accepts: one step of zshard train runs with it.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
K8S=$ROOT/deploy/k8s
PY=/usr/bin/python3 # Debian's, with python3-kubernetes and python3-yaml (install-deps.sh --tests)
SCHEMA=$(dirname "$0")/k8s_schema.py

if ! "$PY" -c 'import kubernetes, yaml' 2>/dev/null; then
  echo "k8s_manifests: SKIP: $PY lacks the kubernetes or yaml module (deploy/install-deps.sh --tests installs them)"
  exit 77
fi

# ---- 1. the manifests as they are ------------------------------------------------------------
checks=$((checks + 1))
out=$("$PY" "$SCHEMA" --secret zshard-secret --commands "$WORK/commands.json" "$K8S"/*.yaml 2>&1) ||
  fail "deploy/k8s: $out"
for kind in ConfigMap PersistentVolumeClaim Service Job StatefulSet Deployment; do
  checks=$((checks + 1))
  grep -q "^kind: $kind\$" "$K8S"/*.yaml || fail "deploy/k8s has no $kind"
done

# ---- 2. each check refuses what it should ----------------------------------------------------
# refused NAME NEEDLE SED-EXPRESSION FILE: FILE with the edit is refused, naming NEEDLE.
refused() {
  local name=$1 needle=$2 expr=$3 file=$4
  local dir=$WORK/case-$name
  mkdir -p "$dir"
  cp "$K8S"/*.yaml "$dir/"
  sed -i -e "$expr" "$dir/$file"
  checks=$((checks + 2))
  cmp -s "$K8S/$file" "$dir/$file" && fail "$name: the edit '$expr' changed nothing in $file"
  local rc=0
  out=$("$PY" "$SCHEMA" --secret zshard-secret "$dir"/*.yaml 2>&1) || rc=$?
  if [ $rc -eq 0 ]; then
    fail "$name: accepted"
  elif ! grep -qF -- "$needle" <<<"$out"; then
    fail "$name: refused without naming '$needle': $out"
  fi
}
refused misspelt "unknown field 'replica'" 's/^  replicas: 2$/  replica: 2/' servers.yaml
refused type "expected int, found str" 's/containerPort: 7100/containerPort: "7100"/' servers.yaml
refused mount "mounts nvme2, which is no volume" 's/- name: nvme$/- name: nvme2/' servers.yaml
# The pod template's labels (indented 8) only, not the selector's.
refused selector "does not match the template's labels" \
  's/^        app.kubernetes.io\/component: worker$/        app.kubernetes.io\/component: workers/' \
  workers.yaml
refused port "targetPort data is no named port" 's/- name: data$/- name: dataplane/' servers.yaml
refused secret "Secret other-secret is not defined" 's/secretName: zshard-secret/secretName: other-secret/' workers.yaml
refused required "\`service_name\`, must not be \`None\`" '/^  serviceName: zshard-server$/d' servers.yaml

# ---- 3. the commands and the config ----------------------------------------------------------
n=0
while IFS= read -r line; do
  n=$((n + 1))
  mapfile -t words < <("$PY" -c 'import json, sys; c = json.loads(sys.argv[1]); print("\n".join([c["where"]] + c["command"] + c["args"]))' "$line")
  where=${words[0]}
  checks=$((checks + 1))
  [ "${words[1]}" = zshard ] || fail "$where: runs ${words[1]}, not zshard"
  options_in_help "$where" "${words[2]}" "${words[@]:3}"
done <"$WORK/commands.json"
checks=$((checks + 1))
[ $n -eq 3 ] || fail "expected 3 containers (coordinator, server, worker), found $n"

"$PY" -c 'import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d.get("kind") == "ConfigMap" and d["metadata"]["name"] == "zshard-job":
        open(sys.argv[2], "w").write(d["data"]["job.json"])' "$K8S/config.yaml" "$WORK/job.json"
checks=$((checks + 1))
[ -s "$WORK/job.json" ] || fail "config.yaml has no ConfigMap zshard-job with job.json"
expect_ok "$ZSHARD" train --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps 1 --threads 2 \
  --out "$WORK/train"
finish
