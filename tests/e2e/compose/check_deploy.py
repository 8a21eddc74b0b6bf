#!/usr/bin/env python3
"""Checks the deployment files against the code (ctest compose_consistency, k8s_manifests).

  check_deploy.py compose --bin BUILD/bin --root REPO [--file docker-compose.yml] [--override F]
  check_deploy.py k8s     --bin BUILD/bin --root REPO [--dir deploy/k8s]
  check_deploy.py schemas --root REPO [--dir deploy/k8s]   (Kubernetes' schemas: k8s_schema.py)
  check_deploy.py mutate  --bin BUILD/bin --root REPO   (each mutation below must be caught)

The truth is the binaries themselves: every program, command, flag and GRADHUB_* variable a
file names must be in `<binary> --help`, and every port must be one the program listens on,
with the flags given (or their variables, or the defaults --help prints). Also: every service,
Secret, volume and mounted repo path a file names exists; depends_on conditions have health
checks; Kubernetes Services select pods that exist and reach their ports; Prometheus scrapes
the HTTP ports. Exit 0 when all is consistent, 1 with one line per problem.
"""
import argparse
import copy
import os
import re
import subprocess
import sys
import tempfile

import yaml

import k8s_schema

# The image's entrypoint (deploy/docker-entrypoint.sh): first argument -> program.
SELECTORS = {
    "api": "gradhub-api", "checkpoint": "gradhub-checkpoint", "metrics": "gradhub-metrics",
    "agent": "gradhub-agent", "trainer": "gradhub-trainer", "cli": "gradhub",
    "gradhub": "gradhub", "gradhub-api": "gradhub-api", "gradhub-checkpoint": "gradhub-checkpoint",
    "gradhub-metrics": "gradhub-metrics", "gradhub-agent": "gradhub-agent",
    "gradhub-trainer": "gradhub-trainer", "node-token": "gradhub-api", "certs": "gradhub",
}
# Selectors that imply a command and take positional arguments (node-token FILE; certs DIR
# CA_DIR). A command of two words ("cluster certs") has flags of its own: `gradhub cluster
# certs --help` lists them.
IMPLIED = {"node-token": ("create-node-token", 1), "certs": ("cluster certs", 2)}
# Commands that call no server: their client flags' defaults (--server localhost:7070) name
# nothing.
OFFLINE_COMMANDS = {"cluster certs"}
# Variables the entrypoint itself reads.
ENTRYPOINT_VARS = {"GRADHUB_NODE_TOKEN_FILE"}
# Where each server listens: flag -> kind. A value host:port or a bare port.
LISTEN_FLAGS = {
    "gradhub-api": {"grpc-address": "grpc", "http-port": "http"},
    "gradhub-checkpoint": {"grpc-port": "grpc", "http-port": "http"},
    "gradhub-metrics": {"grpc-port": "grpc", "http-port": "http"},
}
# Flags that name another server's endpoint: flag -> (program it must be, kind of port).
ENDPOINT_FLAGS = {
    "server": ("gradhub-api", "grpc"),
    "store-address": ("gradhub-api", "grpc"),
    "checkpoint-server": ("gradhub-checkpoint", "grpc"),
    "metrics-server": ("gradhub-metrics", "grpc"),
}
# Third-party images: the ports they listen on.
KNOWN_IMAGES = {"postgres": {5432: "postgres"}, "prometheus": {9090: "http"},
                "grafana": {3000: "http"}}


class Help:
    """What `<binary> --help` says: commands, flags (name -> variable, default)."""

    def __init__(self, text):
        self.commands = set()
        self.flags = {}
        lines = text.splitlines()
        in_commands = False
        for i, line in enumerate(lines):
            if line.startswith("Commands:"):
                in_commands = True
                continue
            if in_commands:
                if not line.strip():
                    in_commands = False
                    continue
                m = re.match(r"^  ([a-z][a-z0-9-]*)", line)
                if m:
                    self.commands.add(m.group(1))
            m = re.match(r"^  --([a-z0-9-]+)(?:  \[\$([A-Z0-9_]+)\])?\s*$", line)
            if m:
                desc = lines[i + 1] if i + 1 < len(lines) else ""
                d = re.search(r'\(default "?(.*?)"?\)\s*$', desc)
                self.flags[m.group(1)] = (m.group(2), d.group(1) if d else None)
        self.variables = {v: f for f, (v, _) in self.flags.items() if v}


_help_cache = {}


def binary_help(bin_dir, program, command=()):
    key = (program, tuple(command))
    if key not in _help_cache:
        path = os.path.join(bin_dir, program)
        out = subprocess.run([path, *command, "--help"], capture_output=True, text=True,
                             timeout=30)
        _help_cache[key] = Help(out.stdout + out.stderr)
    return _help_cache[key]


def port_of(value):
    """7070 from '0.0.0.0:7070', '7070', 'host:7070'; None otherwise."""
    m = re.search(r"(?:^|:)(\d+)$", str(value))
    return int(m.group(1)) if m else None


def container_port(mapping):
    """The container side of a compose ports entry: '${X:-7070}:7070' -> 7070."""
    if isinstance(mapping, dict):
        return int(mapping.get("target"))
    text = re.sub(r"\$\{[^}]*\}", "X", str(mapping)).split("/")[0]
    return int(text.rsplit(":", 1)[-1])


def strip_vars(text):
    """'${A:-x}' -> 'x', '${A}' -> ''."""
    return re.sub(r"\$\{[A-Z0-9_]+(?::?-([^}]*))?(?::?\?[^}]*)?\}", lambda m: m.group(1) or "",
                  str(text))


class Program:
    """One gradhub program as a file runs it: its argv and environment, checked against --help."""

    def __init__(self, where, bin_dir, argv, env, errors):
        self.where, self.errors = where, errors
        self.program, self.flags, self.command, self.env = None, {}, None, {}
        if not argv:
            errors.append(f"{where}: no command (the image's entrypoint needs a program)")
            return
        selector = str(argv[0])
        if selector not in SELECTORS:
            errors.append(f"{where}: '{selector}' chooses no program of the image "
                          f"({', '.join(sorted(set(SELECTORS)))})")
            return
        self.program = SELECTORS[selector]
        self.help = binary_help(bin_dir, self.program)
        args = [str(a) for a in argv[1:]]
        if selector in IMPLIED:
            self.command, positional = IMPLIED[selector]
            words = self.command.split()
            if words[0] not in self.help.commands:
                errors.append(f"{where}: {self.program} has no command '{self.command}'")
            elif len(words) > 1:
                self.help = binary_help(bin_dir, self.program, words)
                if not self.help.flags:
                    errors.append(f"{where}: {self.program} has no command '{self.command}'")
            if len(args) < positional:
                errors.append(f"{where}: {selector} takes {positional} argument(s)")
            args = args[positional:]
        i = 0
        while i < len(args):
            a = args[i]
            if a.startswith("--"):
                name, eq, value = a[2:].partition("=")
                if name not in self.help.flags:
                    errors.append(f"{where}: {self.program} has no flag --{name}")
                elif not eq:
                    if i + 1 >= len(args):
                        errors.append(f"{where}: --{name} has no value")
                    else:
                        value = args[i + 1]
                        i += 1
                self.flags[name] = value
            elif self.command is None:
                self.command = a
                if a not in self.help.commands:
                    errors.append(f"{where}: {self.program} has no command '{a}' "
                                  f"(it has {sorted(self.help.commands) or 'none'})")
            else:
                errors.append(f"{where}: unexpected argument '{a}' after command {self.command}")
            i += 1
        self.env = {}
        for var, value in (env or {}).items():
            if var.startswith("GRADHUB_") and var not in self.help.variables and \
                    var not in ENTRYPOINT_VARS:
                errors.append(f"{where}: {self.program} reads no variable {var}")
            self.env[var] = strip_vars(value)

    def value(self, flag):
        """The flag's effective value: flag, else its variable, else the default."""
        if flag in self.flags:
            return strip_vars(self.flags[flag])
        var, default = self.help.flags.get(flag, (None, None))
        if var and var in self.env:
            return self.env[var]
        return default

    def serves_tls(self):
        """Whether this server serves TLS only (--tls-cert, or its variable)."""
        return self.program in LISTEN_FLAGS and bool(self.value("tls-cert"))

    def listens(self):
        """{port: kind} this program serves on."""
        ports = {}
        if self.program is None:
            return ports
        for flag, kind in LISTEN_FLAGS.get(self.program, {}).items():
            p = port_of(self.value(flag))
            if p:
                ports[p] = kind
        return ports

    def endpoints(self):
        """(flag, host, port, program, kind) of every flag naming another server."""
        out = []
        if self.program is None or self.command in OFFLINE_COMMANDS:
            return out
        for flag, (target, kind) in ENDPOINT_FLAGS.items():
            if flag not in self.help.flags:
                continue
            # A list of replicas' addresses (host:port,host:port): each is checked.
            for v in (self.value(flag) or "").split(","):
                if ":" in v:
                    host, _, port = v.strip().rpartition(":")
                    out.append((flag, host, int(port) if port.isdigit() else None, target, kind))
        return out


def is_gradhub_image(svc):
    build = svc.get("build") or {}
    dockerfile = build.get("dockerfile", "") if isinstance(build, dict) else ""
    return "gradhub" in str(svc.get("image", "")) and "Dockerfile" in dockerfile or \
        "deploy/Dockerfile" in dockerfile


def third_party(svc):
    image = strip_vars(svc.get("image", ""))
    for name, ports in KNOWN_IMAGES.items():
        if re.search(rf"(^|/){name}(:|$)", image):
            return name, ports
    return None, {}


def check_compose(root, bin_dir, path, override=None, base=None):
    errors = []
    with open(path) as f:
        doc = yaml.safe_load(f)
    services = doc.get("services") or {}
    volumes = set((doc.get("volumes") or {}).keys())
    # Relative paths are relative to the compose file's folder (a mutant's: the repository).
    base = base or os.path.dirname(os.path.abspath(path))
    programs, listens = {}, {}
    for name, svc in services.items():
        where = f"{os.path.relpath(path, root)}: services.{name}"
        if not isinstance(svc, dict):
            errors.append(f"{where}: not a mapping")
            continue
        build = svc.get("build")
        if isinstance(build, dict):
            ctx = os.path.join(base, build.get("context", "."))
            if not os.path.isdir(ctx):
                errors.append(f"{where}: build context {build.get('context')} does not exist")
            df = os.path.join(ctx, build.get("dockerfile", "Dockerfile"))
            if not os.path.isfile(df):
                errors.append(f"{where}: dockerfile {build.get('dockerfile')} does not exist")
        if is_gradhub_image(svc):
            prog = Program(where, bin_dir, svc.get("command"), svc.get("environment"), errors)
            programs[name] = prog
            listens[name] = prog.listens()
        else:
            kind, ports = third_party(svc)
            if kind is None:
                errors.append(f"{where}: image {svc.get('image')} is neither gradhub's nor known")
            listens[name] = dict(ports)
            if kind == "prometheus":
                for a in svc.get("command") or []:
                    if str(a).startswith("--web.listen-address="):
                        listens[name] = {port_of(str(a).split("=", 1)[1]): "http"}
        for mapping in svc.get("ports") or []:
            try:
                p = container_port(mapping)
            except (TypeError, ValueError):
                errors.append(f"{where}: cannot read port mapping {mapping}")
                continue
            if p not in listens[name]:
                errors.append(f"{where}: publishes container port {p}, but it listens on "
                              f"{sorted(listens[name]) or 'nothing'}")
        hc = svc.get("healthcheck") or {}
        test = " ".join(str(t) for t in (hc.get("test") or []))
        for m in re.finditer(r"(https?)://(localhost|127\.0\.0\.1):(\d+)(/\S*)?", test):
            if name in programs and programs[name].serves_tls() and m.group(1) != "https":
                errors.append(f"{where}: health check over {m.group(1)}, but it serves TLS only")
            m = re.match(r"https?://(localhost|127\.0\.0\.1):(\d+)(/\S*)?", m.group(0))
            p = int(m.group(2))
            if listens[name].get(p) != "http":
                errors.append(f"{where}: health check on port {p}, not its HTTP port "
                              f"({[q for q, k in listens[name].items() if k == 'http']})")
            if name in programs and m.group(3) not in ("/readyz", "/healthz"):
                errors.append(f"{where}: health check path {m.group(3)} (gradhub serves "
                              "/readyz and /healthz)")
        deps = svc.get("depends_on") or {}
        for dep in deps:
            if dep not in services:
                errors.append(f"{where}: depends_on {dep}, which is no service")
            elif isinstance(deps, dict) and (deps[dep] or {}).get("condition") == \
                    "service_healthy" and not (services[dep] or {}).get("healthcheck"):
                errors.append(f"{where}: waits for {dep} to be healthy, which has no healthcheck")
        for v in svc.get("volumes") or []:
            source = str(v).split(":")[0] if not isinstance(v, dict) else v.get("source", "")
            if source.startswith(".") or source.startswith("/"):
                full = os.path.normpath(os.path.join(base, source))
                if source.startswith("."):
                    if not os.path.exists(full):
                        errors.append(f"{where}: mounts {source}, which does not exist")
                    elif not full.startswith(root):
                        errors.append(f"{where}: mounts {source}, outside the repository")
            elif source and source not in volumes:
                errors.append(f"{where}: volume {source} is not declared under volumes:")
    # Endpoints named by flags and variables: an existing service, the right program, port.
    for name, prog in programs.items():
        where = f"{os.path.relpath(path, root)}: services.{name}"
        for flag, host, port, target, kind in prog.endpoints():
            if host not in services:
                errors.append(f"{where}: --{flag} names {host}, which is no service")
            elif programs.get(host) is None or programs[host].program != target:
                errors.append(f"{where}: --{flag} names {host}, which does not run {target}")
            elif listens[host].get(port) != kind:
                errors.append(f"{where}: --{flag}={host}:{port}, but {host}'s {kind} port is "
                              f"{[p for p, k in listens[host].items() if k == kind]}")
        for flag in ("checkpoint-url", "metrics-url"):
            m = re.match(r"(https?)://([^:/]+)", prog.value(flag) or "") if \
                prog.program and flag in prog.help.flags else None
            if m and m.group(2) in programs and programs[m.group(2)].serves_tls():
                if m.group(1) != "https":
                    errors.append(f"{where}: --{flag} is {m.group(1)}, but {m.group(2)} serves "
                                  "TLS only")
        for flag, host, port, target, kind in prog.endpoints():
            if host in programs and programs[host].serves_tls() and "tls-ca" in prog.help.flags \
                    and not prog.value("tls-ca"):
                errors.append(f"{where}: --{flag} names {host}, which serves TLS only, and "
                              "there is no --tls-ca")
        url = prog.env.get("GRADHUB_DATABASE_URL", "")
        m = re.search(r"@([^:/]+):(\d+)/", url)
        if m and (m.group(1) not in services or
                  listens.get(m.group(1), {}).get(int(m.group(2))) != "postgres"):
            errors.append(f"{where}: GRADHUB_DATABASE_URL names {m.group(1)}:{m.group(2)}, "
                          "which is no PostgreSQL service port")
    # The GPU agent: the gpu profile and an NVIDIA device reservation.
    gpu = [n for n, s in services.items() if "gpu" in (s.get("profiles") or [])]
    if not gpu:
        errors.append("no service under the gpu profile")
    for n in gpu:
        devices = (((services[n].get("deploy") or {}).get("resources") or {})
                   .get("reservations") or {}).get("devices") or []
        if not any(d.get("driver") == "nvidia" and "gpu" in (d.get("capabilities") or [])
                   for d in devices):
            errors.append(f"services.{n}: no NVIDIA device reservation")
    # Prometheus' config: mounted from the repo, scraping each gradhub server's HTTP port.
    for name, svc in services.items():
        if third_party(svc)[0] != "prometheus":
            continue
        for v in svc.get("volumes") or []:
            src, _, dst = str(v).partition(":")
            if dst.startswith("/etc/prometheus/prometheus.yml") and src.startswith("."):
                cfg = os.path.join(base, src)
                if os.path.isfile(cfg):
                    errors += check_prometheus(cfg, root, programs, listens)
    if override:
        with open(override) as f:
            over = yaml.safe_load(f) or {}
        for name in (over.get("services") or {}):
            if name not in services:
                errors.append(f"{os.path.relpath(override, root)}: overrides {name}, "
                              "which is no service of the compose file")
    for name in ("gradhub-api", "gradhub-checkpoint", "gradhub-metrics"):
        if not any(p.program == name for p in programs.values()):
            errors.append(f"no service runs {name}")
    agents = [p for p in programs.values() if p.program == "gradhub-agent"]
    if len([n for n, p in programs.items()
            if p.program == "gradhub-agent" and n not in gpu]) < 2:
        errors.append("fewer than two CPU agents")
    return errors


def check_prometheus(cfg, root, programs, listens):
    errors = []
    with open(cfg) as f:
        doc = yaml.safe_load(f)
    scraped = set()
    for job in doc.get("scrape_configs") or []:
        for sc in job.get("static_configs") or []:
            for target in sc.get("targets") or []:
                host, _, port = target.rpartition(":")
                if host in ("localhost", "127.0.0.1"):
                    continue
                if host not in listens:
                    errors.append(f"{os.path.relpath(cfg, root)}: job {job.get('job_name')} "
                                  f"scrapes {target}, and {host} is no service")
                elif listens[host].get(int(port)) != "http":
                    errors.append(f"{os.path.relpath(cfg, root)}: job {job.get('job_name')} "
                                  f"scrapes {target}, not {host}'s HTTP port")
                scraped.add(host)
    for name, prog in programs.items():
        if prog.program in LISTEN_FLAGS and prog.command in (None, "serve") and \
                name not in scraped:
            errors.append(f"{os.path.relpath(cfg, root)}: does not scrape {name}")
    return errors


# ------------------------------------------------------------------------------------------
# Kubernetes

API_VERSIONS = {"Deployment": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1",
                "Service": "v1", "Secret": "v1", "ConfigMap": "v1", "Namespace": "v1",
                "PersistentVolumeClaim": "v1", "ServiceAccount": "v1",
                "PodDisruptionBudget": "policy/v1",
                "Kustomization": "kustomize.config.k8s.io/v1beta1"}
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")


def k8s_objects(directory):
    """The manifests' files and [(file name, object)] of every document in them."""
    objects = []
    files = sorted(f for f in os.listdir(directory) if f.endswith((".yaml", ".yml")))
    for fname in files:
        with open(os.path.join(directory, fname)) as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    objects.append((fname, doc))
    return files, objects


def check_k8s_schemas(directory):
    """Every manifest against Kubernetes' own schemas (k8s_schema.py), kustomization.yaml
    excepted."""
    return k8s_schema.check(k8s_objects(directory)[1])


def check_k8s(root, bin_dir, directory):
    errors = []
    files, objects = k8s_objects(directory)
    by_kind = {}
    for fname, o in objects:
        where = f"deploy/k8s/{fname}"
        kind = o.get("kind")
        name = (o.get("metadata") or {}).get("name")
        if not o.get("apiVersion") or not kind or (not name and kind != "Kustomization"):
            errors.append(f"{where}: an object without apiVersion, kind or metadata.name")
            continue
        if kind not in API_VERSIONS:
            errors.append(f"{where}: {kind} {name}: unknown kind")
        elif API_VERSIONS[kind] != o["apiVersion"]:
            errors.append(f"{where}: {kind} {name}: apiVersion {o['apiVersion']}, "
                          f"not {API_VERSIONS[kind]}")
        if kind == "Kustomization":
            for r in o.get("resources") or []:
                if r not in files:
                    errors.append(f"{where}: resource {r} does not exist")
            for fn in files:
                if fn != fname and fn not in (o.get("resources") or []):
                    errors.append(f"{where}: does not list {fn}")
            continue
        by_kind.setdefault(kind, {})[name] = (where, o)
    secrets = {n: set((o.get("stringData") or {}).keys()) | set((o.get("data") or {}).keys())
               for n, (_, o) in by_kind.get("Secret", {}).items()}
    # Secrets the files say how to make (`kubectl create secret generic NAME --from-file=F`,
    # e.g. gradhub-tls, which holds private keys): their keys are the files' names.
    for fname in files:
        with open(os.path.join(directory, fname)) as f:
            text = f.read()
        for m in re.finditer(r"create secret generic (\S+)((?:\s*\\?\s*#?\s*--from-\S+)+)", text):
            keys = {os.path.basename(v.split("=", 1)[1]) for v in re.findall(r"--from-file=\S+",
                                                                          m.group(2))}
            keys |= {v.split("=", 2)[1] for v in re.findall(r"--from-literal=\S+", m.group(2))}
            secrets.setdefault(m.group(1), keys)
    configmaps = {n: set((o.get("data") or {}).keys())
                  for n, (_, o) in by_kind.get("ConfigMap", {}).items()}
    pods = {}  # workload name -> (labels, {port name/number: kind}, program)
    for kind in WORKLOADS:
        for name, (where, o) in by_kind.get(kind, {}).items():
            where = f"{where}: {kind} {name}"
            spec = o.get("spec") or {}
            tmpl = spec.get("template") or {}
            labels = (tmpl.get("metadata") or {}).get("labels") or {}
            sel = (spec.get("selector") or {}).get("matchLabels") or {}
            if not sel or any(labels.get(k) != v for k, v in sel.items()):
                errors.append(f"{where}: selector {sel} does not match its pod labels {labels}")
            pspec = tmpl.get("spec") or {}
            volumes = {v.get("name") for v in pspec.get("volumes") or []}
            volumes |= {(c.get("metadata") or {}).get("name")
                        for c in spec.get("volumeClaimTemplates") or []}
            for v in pspec.get("volumes") or []:
                s = (v.get("secret") or {}).get("secretName")
                if s and s not in secrets:
                    errors.append(f"{where}: volume {v.get('name')} uses Secret {s}, not defined")
                for item in (v.get("secret") or {}).get("items") or []:
                    if s in secrets and item.get("key") not in secrets[s]:
                        errors.append(f"{where}: volume {v.get('name')} uses key "
                                      f"{item.get('key')} of Secret {s}, not defined")
            if kind == "StatefulSet":
                if spec.get("serviceName") not in by_kind.get("Service", {}):
                    errors.append(f"{where}: serviceName {spec.get('serviceName')} is no Service")
                if not spec.get("volumeClaimTemplates"):
                    errors.append(f"{where}: no volumeClaimTemplates")
            ports, program, prog = {}, None, None
            for c in pspec.get("containers") or []:
                cwhere = f"{where}: container {c.get('name')}"
                if not c.get("image"):
                    errors.append(f"{cwhere}: no image")
                env = {}
                for e in c.get("env") or []:
                    ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                    cref = (e.get("valueFrom") or {}).get("configMapKeyRef")
                    if ref and ref.get("key") not in secrets.get(ref.get("name"), set()):
                        errors.append(f"{cwhere}: {e.get('name')} from Secret "
                                      f"{ref.get('name')} key {ref.get('key')}, not defined")
                    if cref and cref.get("key") not in configmaps.get(cref.get("name"), set()):
                        errors.append(f"{cwhere}: {e.get('name')} from ConfigMap "
                                      f"{cref.get('name')} key {cref.get('key')}, not defined")
                    env[e.get("name")] = e.get("value", "<from " + ("secret" if ref else "ref") + ">")
                argv = list(c.get("args") or [])
                prog = Program(cwhere, bin_dir, argv, env, errors)
                program = prog.program
                listen = prog.listens()
                named = {}
                for p in c.get("ports") or []:
                    cp = p.get("containerPort")
                    if cp not in listen:
                        errors.append(f"{cwhere}: containerPort {cp}, but {program} listens on "
                                      f"{sorted(listen) or 'nothing'}")
                    ports[cp] = listen.get(cp)
                    if p.get("name"):
                        named[p["name"]] = cp
                        ports[p["name"]] = listen.get(cp)
                for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                    hg = (c.get(probe) or {}).get("httpGet")
                    if hg:
                        p = named.get(hg.get("port"), hg.get("port"))
                        if listen.get(p) != "http":
                            errors.append(f"{cwhere}: {probe} on port {hg.get('port')}, not its "
                                          "HTTP port")
                        if hg.get("path") not in ("/readyz", "/healthz"):
                            errors.append(f"{cwhere}: {probe} path {hg.get('path')}")
                for m in c.get("volumeMounts") or []:
                    if m.get("name") not in volumes:
                        errors.append(f"{cwhere}: mounts volume {m.get('name')}, not defined")
                if program == "gradhub-agent":
                    limits = (c.get("resources") or {}).get("limits") or {}
                    if "nvidia.com/gpu" not in limits:
                        errors.append(f"{cwhere}: the agent requests no nvidia.com/gpu")
            ann = (tmpl.get("metadata") or {}).get("annotations") or {}
            if program in LISTEN_FLAGS:
                if ann.get("prometheus.io/scrape") != "true":
                    errors.append(f"{where}: no prometheus.io/scrape: \"true\" annotation")
                elif ports.get(int(ann.get("prometheus.io/port", 0))) != "http":
                    errors.append(f"{where}: prometheus.io/port {ann.get('prometheus.io/port')} "
                                  "is not its HTTP port")
            if program == "gradhub-agent":
                if kind != "DaemonSet":
                    errors.append(f"{where}: the agent is not a DaemonSet")
                if not pspec.get("nodeSelector") and not pspec.get("affinity"):
                    errors.append(f"{where}: no nodeSelector for GPU nodes")
                if not any(t.get("key") == "nvidia.com/gpu" for t in pspec.get("tolerations") or []):
                    errors.append(f"{where}: no toleration of nvidia.com/gpu")
            pods[name] = (labels, ports, program, prog, where)
    # Services: select a pod; their ports reach a container port.
    service_ports = {}
    for name, (where, o) in by_kind.get("Service", {}).items():
        where = f"{where}: Service {name}"
        sel = (o.get("spec") or {}).get("selector") or {}
        targets = [p for p in pods.values() if sel and all(p[0].get(k) == v for k, v in sel.items())]
        if not targets:
            errors.append(f"{where}: selector {sel} matches no pod template")
            continue
        service_ports[name] = {}
        for sp in (o.get("spec") or {}).get("ports") or []:
            tp = sp.get("targetPort", sp.get("port"))
            kind = targets[0][1].get(tp)
            if tp not in targets[0][1]:
                errors.append(f"{where}: port {sp.get('port')} targets {tp}, which no container "
                              "of the selected pods declares")
            service_ports[name][sp.get("port")] = (kind, targets[0][2])
    # PodDisruptionBudgets guard pods that exist.
    for name, (where, o) in by_kind.get("PodDisruptionBudget", {}).items():
        sel = (((o.get("spec") or {}).get("selector") or {}).get("matchLabels")) or {}
        if not any(sel and all(p[0].get(k) == v for k, v in sel.items()) for p in pods.values()):
            errors.append(f"{where}: PodDisruptionBudget {name}: selector {sel} matches no pod "
                          "template")
    # Endpoints named by flags: a Service, in front of the right program, on the right port.
    for labels, ports, program, prog, where in pods.values():
        if prog is None or prog.program is None:
            continue
        for flag, host, port, target, kind in prog.endpoints():
            svc = host.split(".")[0]
            if svc in ("127", "localhost"):
                continue
            if svc not in service_ports:
                errors.append(f"{where}: --{flag} names {host}, which is no Service")
            elif service_ports[svc].get(port) != (kind, target):
                errors.append(f"{where}: --{flag}={host}:{port}, which is not {target}'s {kind} "
                              "port behind that Service")
    for need in ("gradhub-api", "gradhub-checkpoint", "gradhub-metrics", "gradhub-agent"):
        if not any(p[2] == need for p in pods.values()):
            errors.append(f"no workload runs {need}")
    return errors


# ------------------------------------------------------------------------------------------
# Mutations: each must make the check fail (the test that the test can fail).

COMPOSE_MUTATIONS = [
    ("a flag that does not exist", "--slots=2", "--slot=2"),
    ("a port flag made wrong", "--http-port=8080", "--http-port=8090"),
    ("a published port made wrong", ":7071\"", ":7171\""),
    ("an endpoint on the wrong port", "--checkpoint-server=gradhub-checkpoint:7071",
     "--checkpoint-server=gradhub-checkpoint:7072"),
    ("an endpoint naming no service", "--metrics-server=gradhub-metrics:7072",
     "--metrics-server=metrics:7072"),
    ("a replica in an address list on the wrong port", "gradhub-api:7070,gradhub-api-2:7070",
     "gradhub-api:7070,gradhub-api-2:8080"),
    ("a command that does not exist", "      - serve\n", "      - serv\n"),
    ("a variable no program reads", "GRADHUB_DATA_ROOTS:", "GRADHUB_DATA_ROOT:"),
    ("a mounted path missing from the repo", "./dashboard/dashboards:", "./dashboard/dashboardz:"),
    ("a health check on the wrong port", "https://localhost:9464/readyz",
     "https://localhost:9465/readyz"),
    ("depends_on a service that does not exist", "    depends_on:\n      postgres:",
     "    depends_on:\n      postgress:"),
    ("a program the image does not have", "      - metrics\n", "      - metric\n"),
    ("a plaintext health check of a TLS server", '"https://localhost:8081/readyz"',
     '"http://localhost:8081/readyz"'),
    ("a plaintext URL of a TLS server", "--checkpoint-url=https://gradhub-checkpoint:8081",
     "--checkpoint-url=http://gradhub-checkpoint:8081"),
    ("an agent that does not trust the servers' CA", "      - --tls-ca=/etc/gradhub/tls/ca.pem\n",
     "      - --tls-ca=\n"),
]
K8S_MUTATIONS = [
    ("api.yaml", "a flag that does not exist", "--http-port=8080", "--http-prot=8080"),
    ("api.yaml", "a container port made wrong", "containerPort: 7070", "containerPort: 7077"),
    ("metrics.yaml", "a scrape port made wrong", "prometheus.io/port: \"9464\"",
     "prometheus.io/port: \"7072\""),
    ("agent.yaml", "an endpoint on the wrong port", "--server=gradhub-api:7070",
     "--server=gradhub-api:8080"),
    ("checkpoint.yaml", "a Service selecting nothing", "app.kubernetes.io/name: gradhub-checkpoint\n  ports",
     "app.kubernetes.io/name: gradhub-checkpointz\n  ports"),
    ("agent.yaml", "no GPU requested", "nvidia.com/gpu: 1", "example.com/gpu: 1"),
    ("api.yaml", "a Secret key that does not exist", "key: database-url", "key: database-uri"),
    ("agent.yaml", "a key of the TLS Secret that does not exist", "{key: ca.pem, path: ca.pem}",
     "{key: ca.crt, path: ca.pem}"),
    ("api.yaml", "a PodDisruptionBudget guarding nothing",
     "  minAvailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: gradhub-api",
     "  minAvailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: gradhub-ap"),
]
# Caught by the schema check alone (check_k8s does not look at these fields).
K8S_SCHEMA_MUTATIONS = [
    ("metrics.yaml", "a misspelt field", "  replicas: 1\n", "  replica: 1\n"),
    ("api.yaml", "a string where an integer goes", "containerPort: 8080",
     "containerPort: \"8080\""),
    ("metrics.yaml", "a string where an integer goes", "periodSeconds: 10",
     "periodSeconds: \"10\""),
    ("agent.yaml", "a value outside an enum", "type: DirectoryOrCreate", "type: DirectoryOrCreat"),
]


def run_mutations(root, bin_dir):
    failures = 0
    with open(os.path.join(root, "docker-compose.yml")) as f:
        text = f.read()
    if check_compose(root, bin_dir, os.path.join(root, "docker-compose.yml")):
        print("mutate: the unmutated docker-compose.yml does not pass")
        return 1
    for what, old, new in COMPOSE_MUTATIONS:
        if old not in text:
            print(f"mutate: compose '{what}': '{old}' is not in docker-compose.yml")
            failures += 1
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "docker-compose.yml")
            with open(path, "w") as f:
                f.write(text.replace(old, new, 1))
            errors = check_compose(root, bin_dir, path, base=root)
        print(f"mutate: compose, {what}: {'caught: ' + errors[0] if errors else 'NOT CAUGHT'}")
        failures += not errors
    failures += mutate_k8s(root, "k8s", K8S_MUTATIONS, lambda d: check_k8s(root, bin_dir, d))
    failures += mutate_k8s(root, "k8s schemas", K8S_SCHEMA_MUTATIONS, check_k8s_schemas)
    total = len(COMPOSE_MUTATIONS) + len(K8S_MUTATIONS) + len(K8S_SCHEMA_MUTATIONS)
    print(f"mutate: {total - failures} of {total} mutations caught")
    return 1 if failures else 0


def mutate_k8s(root, label, mutations, check):
    """How many of the mutations of deploy/k8s `check` (a folder -> problems) lets through."""
    failures = 0
    k8s = os.path.join(root, "deploy", "k8s")
    if check(k8s):
        print(f"mutate: the unmutated deploy/k8s does not pass the {label} check")
        return 1
    for fname, what, old, new in mutations:
        with open(os.path.join(k8s, fname)) as f:
            text = f.read()
        if old not in text:
            print(f"mutate: {label} '{what}': '{old}' is not in deploy/k8s/{fname}")
            failures += 1
            continue
        with tempfile.TemporaryDirectory() as tmp:
            for fn in os.listdir(k8s):
                with open(os.path.join(k8s, fn)) as src, open(os.path.join(tmp, fn), "w") as dst:
                    dst.write(src.read().replace(old, new, 1) if fn == fname else src.read())
            errors = check(tmp)
        print(f"mutate: {label}, {what}: {'caught: ' + errors[0] if errors else 'NOT CAUGHT'}")
        failures += not errors
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["compose", "k8s", "schemas", "mutate"])
    ap.add_argument("--bin")
    ap.add_argument("--root", required=True)
    ap.add_argument("--file")
    ap.add_argument("--override")
    ap.add_argument("--dir")
    a = ap.parse_args()
    root = os.path.realpath(a.root)
    if a.what == "mutate":
        return run_mutations(root, a.bin)
    if a.what != "schemas" and not a.bin:
        ap.error(f"{a.what} needs --bin (the build's bin/)")
    if a.what == "schemas":
        errors = check_k8s_schemas(a.dir or os.path.join(root, "deploy", "k8s"))
    elif a.what == "compose":
        errors = check_compose(root, a.bin, a.file or os.path.join(root, "docker-compose.yml"),
                               a.override)
    else:
        errors = check_k8s(root, a.bin, a.dir or os.path.join(root, "deploy", "k8s"))
    for e in errors:
        print(e)
    print(f"{a.what}: {'OK' if not errors else str(len(errors)) + ' problem(s)'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
