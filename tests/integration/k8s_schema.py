"""Offline checks of Kubernetes manifests, for tests/integration/k8s_manifests.sh.

usage: k8s_schema.py [--secret NAME]... [--commands FILE] MANIFEST.yaml...

The schema is the one the Kubernetes Python client's models encode (Debian's
python3-kubernetes, generated from the Kubernetes OpenAPI spec of its release): every key of
every object must be a field of its type, every value of the field's type, and every required
field present (the models' own validation).  Then what a schema cannot see: a workload's
selector matches its pod template's labels, a Service selects some pod template and names
ports those pods have, every volumeMount names a volume, and the ConfigMaps, claims and
Secrets that pods use are defined in the manifests (or named with --secret: made out of
band).  With --commands, each container's command and args go to FILE as JSON lines.

Prints each problem as FILE: KIND/NAME: PATH: what is wrong, and exits 1 if there was one.
"""
import json
import re
import sys

import yaml
from kubernetes import client

KINDS = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("batch/v1", "Job"): "V1Job",
}

problems = []


def problem(where, text):
    problems.append("%s: %s" % (where, text))


def check_value(value, typ, where):
    """Checks value (parsed YAML) against a model type string of the client."""
    if value is None:
        return
    m = re.fullmatch(r"list\[(.+)\]", typ)
    if m:
        if not isinstance(value, list):
            problem(where, "expected a list, found %s" % type(value).__name__)
            return
        for i, v in enumerate(value):
            check_value(v, m.group(1), "%s[%d]" % (where, i))
        return
    m = re.fullmatch(r"dict\(str, (.+)\)", typ)
    if m:
        if not isinstance(value, dict):
            problem(where, "expected a map, found %s" % type(value).__name__)
            return
        for k, v in value.items():
            if not isinstance(k, str):
                problem(where, "key %r is not a string" % (k,))
            check_value(v, m.group(1), "%s.%s" % (where, k))
        return
    simple = {"str": str, "int": int, "bool": bool, "float": (int, float)}
    if typ in simple:
        ok = isinstance(value, simple[typ]) and not (typ != "bool" and isinstance(value, bool))
        if not ok:
            problem(where, "expected %s, found %s %r" % (typ, type(value).__name__, value))
        return
    if typ in ("object", "datetime", "date"):
        return
    cls = getattr(client, typ, None)
    if cls is None:
        problem(where, "the schema names an unknown type %s" % typ)
        return
    if not isinstance(value, dict):
        problem(where, "expected a %s object, found %s" % (typ, type(value).__name__))
        return
    by_json = {j: a for a, j in cls.attribute_map.items()}
    for k, v in value.items():
        if k not in by_json:
            problem(where, "unknown field %r in %s" % (k, typ))
            continue
        check_value(v, cls.openapi_types[by_json[k]], "%s.%s" % (where, k))


def pod_spec(doc):
    kind = doc.get("kind")
    spec = doc.get("spec") or {}
    if kind in ("StatefulSet", "Deployment", "Job"):
        return (spec.get("template") or {}).get("spec") or {}
    return None


def template_labels(doc):
    spec = doc.get("spec") or {}
    return (((spec.get("template") or {}).get("metadata") or {}).get("labels")) or {}


def main(argv):
    secrets_out_of_band = set()
    commands_file = None
    files = []
    i = 0
    while i < len(argv):
        if argv[i] == "--secret":
            secrets_out_of_band.add(argv[i + 1])
            i += 2
        elif argv[i] == "--commands":
            commands_file = argv[i + 1]
            i += 2
        else:
            files.append(argv[i])
            i += 1
    docs = []
    for f in files:
        try:
            with open(f) as fh:
                loaded = [d for d in yaml.safe_load_all(fh) if d is not None]
        except (OSError, yaml.YAMLError) as e:
            problem(f, "cannot be read as YAML: %s" % e)
            continue
        for d in loaded:
            if not isinstance(d, dict):
                problem(f, "a document is not a map")
                continue
            name = (d.get("metadata") or {}).get("name", "?")
            docs.append((f, "%s: %s/%s" % (f, d.get("kind"), name), d))

    api = client.ApiClient()
    for f, where, d in docs:
        key = (d.get("apiVersion"), d.get("kind"))
        if key not in KINDS:
            problem(where, "apiVersion %s kind %s is not one these checks know" % key)
            continue
        check_value(d, KINDS[key], where + ": ")
        try:  # the models' own checks: required fields, enumerations
            api._ApiClient__deserialize(d, KINDS[key])
        except (ValueError, TypeError) as e:
            problem(where, "the model refuses it: %s" % e)

    defined = {}
    for f, where, d in docs:
        defined.setdefault(d.get("kind"), set()).add((d.get("metadata") or {}).get("name"))
    pods = [(where, d) for f, where, d in docs if pod_spec(d) is not None]
    commands = []
    for where, d in pods:
        spec = pod_spec(d)
        labels = template_labels(d)
        sel = ((d.get("spec") or {}).get("selector") or {}).get("matchLabels")
        if d["kind"] != "Job":
            if not sel:
                problem(where, "spec.selector.matchLabels is empty")
            elif any(labels.get(k) != v for k, v in sel.items()):
                problem(where, "spec.selector %s does not match the template's labels %s"
                        % (sel, labels))
        volumes = {v.get("name"): v for v in spec.get("volumes") or []}
        claim_templates = {(t.get("metadata") or {}).get("name")
                           for t in (d.get("spec") or {}).get("volumeClaimTemplates") or []}
        for v in volumes.values():
            cm = (v.get("configMap") or {}).get("name")
            if cm and cm not in defined.get("ConfigMap", set()):
                problem(where, "volume %s: ConfigMap %s is not defined" % (v.get("name"), cm))
            pvc = (v.get("persistentVolumeClaim") or {}).get("claimName")
            if pvc and pvc not in defined.get("PersistentVolumeClaim", set()):
                problem(where, "volume %s: claim %s is not defined" % (v.get("name"), pvc))
            sec = (v.get("secret") or {}).get("secretName")
            if sec and sec not in defined.get("Secret", set()) | secrets_out_of_band:
                problem(where, "volume %s: Secret %s is not defined" % (v.get("name"), sec))
        for c in spec.get("containers") or []:
            for m in c.get("volumeMounts") or []:
                if m.get("name") not in volumes and m.get("name") not in claim_templates:
                    problem(where, "container %s mounts %s, which is no volume of the pod"
                            % (c.get("name"), m.get("name")))
            commands.append({"where": where, "command": c.get("command") or [],
                             "args": c.get("args") or []})

    for f, where, d in docs:
        if d.get("kind") != "Service":
            continue
        sel = (d.get("spec") or {}).get("selector") or {}
        matched = [(w, p) for w, p in pods
                   if sel and all(template_labels(p).get(k) == v for k, v in sel.items())]
        if not matched:
            problem(where, "its selector %s selects no pod template" % sel)
            continue
        port_names = {p.get("name") for w, pd in matched
                      for c in pod_spec(pd).get("containers") or [] for p in c.get("ports") or []}
        for p in (d.get("spec") or {}).get("ports") or []:
            t = p.get("targetPort")
            if isinstance(t, str) and t not in port_names:
                problem(where, "targetPort %s is no named port of the pods it selects" % t)

    if commands_file:
        with open(commands_file, "w") as fh:
            for c in commands:
                fh.write(json.dumps(c) + "\n")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
