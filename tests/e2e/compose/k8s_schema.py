"""The Kubernetes manifests against the API's own schemas (ctest k8s_schemas).

The schemas are Kubernetes 1.27.1's OpenAPI definitions, vendored strict in
k8s_schemas/kubernetes-1.27.1-strict.json (k8s_schemas/README.md says from where and how to
make them again); the validator is python3-jsonschema (Debian's 4.10.3, draft 7). A field the
API does not know, a string where an integer goes, a value outside an enum, a required field
missing: each is one line naming the file, the object and the field's path.
"""
import json
import os

import jsonschema

SCHEMAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "k8s_schemas",
                       "kubernetes-1.27.1-strict.json")
# kustomize's own file: no kind of the API server, so no OpenAPI schema (check_deploy.py's
# k8s check reads its resources instead).
NOT_API_KINDS = {"kustomize.config.k8s.io/v1beta1 Kustomization"}


def load(path=SCHEMAS):
    with open(path) as f:
        return json.load(f)


def causes(error):
    """The specific causes: through oneOf (a definition or null) into the branch that was
    meant, so that `spec.replica` is named rather than "spec is not valid under any"."""
    if not error.context:
        return [error]
    branches = {}
    for e in error.context:
        branches.setdefault(e.relative_schema_path[0], []).append(e)
    # The branch meant is the one whose errors go deepest into the document; of equals, not
    # the `null` one.
    meant = max(branches.values(), key=lambda es: (max(len(e.absolute_path) for e in es),
                                                   es[0].schema != {"type": "null"}))
    return [c for e in meant for c in causes(e)]


def where(error):
    path = ""
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else ("." if path else "") + str(part)
    return path or "(the object)"


def check(objects, schemas=None):
    """Problems of [(file name, object)]; none when every object is valid for its kind."""
    schemas = schemas or load()
    version = schemas["x-kubernetes-version"]
    errors, validators = [], {}
    for fname, obj in objects:
        key = f"{obj.get('apiVersion')} {obj.get('kind')}"
        name = (obj.get("metadata") or {}).get("name")
        at = f"deploy/k8s/{fname}: {obj.get('kind')} {name}"
        if key in NOT_API_KINDS:
            continue
        definition = schemas["x-kinds"].get(key)
        if definition is None:
            errors.append(f"{at}: no schema of Kubernetes {version} for '{key}' (a wrong "
                          "apiVersion or kind, or one to add to k8s_schemas/regenerate.py)")
            continue
        if key not in validators:
            validators[key] = jsonschema.Draft7Validator(
                {"definitions": schemas["definitions"], "$ref": "#/definitions/" + definition})
        found = [c for e in validators[key].iter_errors(obj) for c in causes(e)]
        for e in sorted(found, key=lambda e: [str(p) for p in e.absolute_path]):
            errors.append(f"{at}: {where(e)}: {e.message} (Kubernetes {version} schema)")
    return errors
