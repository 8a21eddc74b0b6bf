#!/usr/bin/env python3
"""Makes k8s_schemas/kubernetes-1.27.1-strict.json from npm's kubernetes-models (README.md).

  regenerate.py MODELS_DIR APIMACHINERY_DIR > kubernetes-1.27.1-strict.json

MODELS_DIR and APIMACHINERY_DIR: the `package/` folders of `npm pack kubernetes-models@4.3.1`
and `npm pack @kubernetes-models/apimachinery@1.2.1`, unpacked. Their _schemas/*.js each hold
one definition of Kubernetes' OpenAPI as a JSON literal (`const schema = {...};`) registered
under its OpenAPI name. Only the kinds below and what they reference are kept, rewritten as
plain JSON Schema draft 7 that Debian's python3-jsonschema reads:
  - `"$ref": "io.k8s.X#"` -> `"$ref": "#/definitions/io.k8s.X"`;
  - `"nullable": true` (OpenAPI's) -> "null" added to `type` (and to `enum`);
  - strict, as kubeconform's -strict schemas: `additionalProperties: false` on every object
    that lists its properties and says nothing of others, since the API server (kubectl's
    default --validate=strict) rejects unknown fields; a misspelt field must fail here too.
"""
import glob
import json
import os
import re
import sys

KUBERNETES_VERSION = "1.27.1"
SOURCE = "npm kubernetes-models@4.3.1 + @kubernetes-models/apimachinery@1.2.1"
# The kinds deploy/k8s uses or is likely to (kustomize's Kustomization has no OpenAPI schema).
KINDS = [
    "io.k8s.api.apps.v1.Deployment", "io.k8s.api.apps.v1.StatefulSet",
    "io.k8s.api.apps.v1.DaemonSet", "io.k8s.api.core.v1.Service", "io.k8s.api.core.v1.Secret",
    "io.k8s.api.core.v1.ConfigMap", "io.k8s.api.core.v1.Namespace",
    "io.k8s.api.core.v1.PersistentVolumeClaim", "io.k8s.api.core.v1.ServiceAccount",
    "io.k8s.api.policy.v1.PodDisruptionBudget", "io.k8s.api.networking.v1.NetworkPolicy",
]


def read_definitions(folders):
    """{OpenAPI name: schema} from every _schemas/*.js of the packages."""
    defs = {}
    for folder in folders:
        for path in sorted(glob.glob(os.path.join(folder, "_schemas", "*.js"))):
            with open(path) as f:
                text = f.read()
            body = re.search(r"const schema = (\{.*?\});\n", text, re.S)
            name = re.search(r'register\)\("([^"]+)", schema\)', text)
            if body and name:
                defs[name.group(1)] = json.loads(body.group(1))
    return defs


def rewrite(node, refs):
    """The node as plain draft 7 (see the module's doc); collects the names it references."""
    if isinstance(node, list):
        return [rewrite(n, refs) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "$ref":
            name = value.rstrip("#")
            refs.add(name)
            out[key] = "#/definitions/" + name
        elif key == "properties":
            out[key] = {p: rewrite(s, refs) for p, s in value.items()}
        elif key != "nullable":
            out[key] = rewrite(value, refs)
    if node.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = out["enum"] + [None]
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def main():
    defs = read_definitions(sys.argv[1:3])
    kept, todo = {}, list(KINDS)
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        if name not in defs:
            sys.exit(f"regenerate: no definition {name} in the packages")
        refs = set()
        kept[name] = rewrite(defs[name], refs)
        todo += sorted(refs)
    kinds = {}
    for name in KINDS:
        props = kept[name]["properties"]
        kinds[f"{props['apiVersion']['enum'][0]} {props['kind']['enum'][0]}"] = name
    doc = {"$comment": f"Kubernetes {KUBERNETES_VERSION} from {SOURCE}, strict "
                       "(tests/e2e/compose/k8s_schemas/README.md)",
           "x-kubernetes-version": KUBERNETES_VERSION, "x-kinds": kinds,
           "definitions": dict(sorted(kept.items()))}
    json.dump(doc, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
