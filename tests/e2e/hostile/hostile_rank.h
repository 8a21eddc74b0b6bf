// The program the hostile-rank suite places as a rank of tenant B's script job: it tries, as a
// tenant's code would, every attack of issue 36's list against tenant A's jobs on the same node,
// and prints one line per attempt:
//   ATTACK <name>: refused (<why>)      the platform stopped it
//   ATTACK <name>: SUCCEEDED <what>     it got through (the suite fails on any of these)
// Its one argument is a JSON object: victim_job, victim_attempt, victim_pids, victim_dirs,
// agent_pid, agent_dir, other_tenant_file, postgres_port, secret_sha256s. At the end
// it prints its own job token (TOKEN <secret>) and exits, so that the suite can try the token
// once the attempt has ended.
#pragma once

namespace gradhub::testing {

inline constexpr char kHostileRankScript[] = R"PY(
import ctypes, errno, http.client, json, os, re, signal, socket, ssl, struct, sys, urllib.parse

args = json.loads(sys.argv[1])
token = os.environ.get("GRADHUB_JOB_TOKEN", "")
secret_pattern = re.compile(rb"gh[a-z]*_[0-9A-Za-z_-]{16,}")

def report(name, ok_for_attacker, detail):
    verdict = "SUCCEEDED" if ok_for_attacker else "refused"
    print(f"ATTACK {name}: {verdict} ({str(detail)[:200]})", flush=True)

def attempt(name, action):
    """action() returns what it got; an OSError of EACCES/EPERM/ENOENT-on-/proc is a refusal."""
    try:
        got = action()
        report(name, True, repr(got)[:120])
    except Exception as error:
        report(name, False, f"{type(error).__name__}: {error}")

# The suite's secrets (the node token, the tenants' tokens), as sha256 hex digests: a match is
# a leak. Secrets of other processes on a shared test machine are not this cluster's.
watched = set(args["secret_sha256s"])

def secrets_in(data):
    import hashlib
    return [m[:8] for m in secret_pattern.findall(data)
            if hashlib.sha256(m).hexdigest() in watched]

# 1. No node token anywhere it can read: its environment and argv, every /proc entry it may
#    read, the agent's directory and its own.
def scan_for_secrets():
    found = []
    for key, value in os.environ.items():
        if key != "GRADHUB_JOB_TOKEN":
            found += [("env " + key, m) for m in secrets_in(value.encode())]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for part in ("environ", "cmdline"):
            try:
                found += [(f"/proc/{pid}/{part}", m)
                          for m in secrets_in(open(f"/proc/{pid}/{part}", "rb").read())]
            except OSError:
                pass
    for root in (args["agent_dir"], os.getcwd(), os.environ.get("GRADHUB_CODE_DIR", "")):
        for directory, _, files in os.walk(root):
            for name in files:
                try:
                    with open(os.path.join(directory, name), "rb") as f:
                        found += [(os.path.join(directory, name), m)
                                  for m in secrets_in(f.read(1 << 20))]
                except OSError:
                    pass
    if found:
        return found
    raise PermissionError("none of the cluster's secrets in anything readable")
attempt("node-token", scan_for_secrets)

# 2. Its credential against the other job's checkpoints, metrics and store keys.
def request(base, method, path, body=None, extra_headers=None):
    url = urllib.parse.urlsplit(base)
    if url.scheme == "https":
        context = ssl.create_default_context(cafile=os.environ.get("GRADHUB_TLS_CA") or None)
        connection = http.client.HTTPSConnection(url.hostname, url.port, context=context, timeout=10)
    else:
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    headers.update(extra_headers or {})
    connection.request(method, url.path.rstrip("/") + path, body=body, headers=headers)
    response = connection.getresponse()
    return response.status, response.read()

def http_attack(base, method, path, body=None, extra_headers=None):
    status, answer = request(base, method, path, body, extra_headers)
    if status < 300:
        return f"{status} {answer[:100]!r}"
    raise PermissionError(f"HTTP {status}")

victim = args["victim_job"]
victim_id = victim.removeprefix("jobs/")
checkpoints = os.environ["GRADHUB_CHECKPOINT_URL"]
attempt("checkpoint-latest", lambda: http_attack(checkpoints, "GET", f"/v1/jobs/{victim_id}/checkpoints:latest"))
attempt("checkpoint-list", lambda: http_attack(checkpoints, "GET", f"/v1/jobs/{victim_id}/checkpoints"))
import hashlib
upload = b"x" * 16  # a well-formed upload, so that only authorization can refuse it
attempt("checkpoint-upload", lambda: http_attack(
    checkpoints, "PUT", f"/v1/jobs/{victim_id}/checkpoints/999999?attempt={args['victim_attempt']}",
    upload, {"Content-Type": "application/octet-stream",
             "X-Checkpoint-Sha256": hashlib.sha256(upload).hexdigest()}))
attempt("checkpoint-delete", lambda: http_attack(checkpoints, "DELETE", f"/v1/jobs/{victim_id}/checkpoints/1"))
metrics = os.environ.get("GRADHUB_METRICS_URL", "")
batch = {"job": victim, "attempt": args["victim_attempt"], "rank": 0,
         "steps": [{"step": 123456, "loss": 1e9}]}
attempt("telemetry", lambda: http_attack(metrics, "POST", "/v1/telemetry", json.dumps(batch).encode()))

def store_attack():
    from gradhub import _C  # the engine's store client
    address = os.environ["GRADHUB_STORE"].removeprefix("grpc://")
    prefix = f"jobs/{victim_id}/attempts/{args['victim_attempt']}/"
    store = _C.platform_store(address, token, prefix, os.environ.get("GRADHUB_TLS_CA", ""))
    store.set("hostile", b"x")
    return store.get("hostile", 2)
attempt("store-keys", store_attack)

# 3. Signals and ptrace against the other job's ranks.
libc = ctypes.CDLL(None, use_errno=True)
def ptrace_attach(pid):
    if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return "attached"
for pid in args["victim_pids"]:
    attempt(f"signal-{pid}", lambda pid=pid: os.kill(pid, signal.SIGKILL))
    attempt(f"ptrace-{pid}", lambda pid=pid: ptrace_attach(pid))
    attempt(f"environ-{pid}", lambda pid=pid: open(f"/proc/{pid}/environ", "rb").read())
    attempt(f"mem-{pid}", lambda pid=pid: open(f"/proc/{pid}/mem", "rb").read(1))

# 4. The other job's rank directories.
for i, directory in enumerate(args["victim_dirs"]):
    attempt(f"rank-dir-{i}", lambda directory=directory: os.listdir(directory))

# 5. A path in the other tenant's data root.
attempt("other-tenant-data", lambda: open(args["other_tenant_file"], "rb").read())

# 6. PostgreSQL: a startup message as each likely user; AuthenticationOk (R, 0) means it got in.
def postgres(user):
    with socket.create_connection(("127.0.0.1", args["postgres_port"]), timeout=5) as s:
        params = b"user\0" + user.encode() + b"\0database\0postgres\0\0"
        s.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
        kind = s.recv(1)
        if kind == b"R":
            length, code = struct.unpack("!ii", s.recv(8))
            if code == 0:
                return f"AuthenticationOk as {user}"
            raise PermissionError(f"the server asks for a password (auth request {code})")
        raise PermissionError(f"the server answered {kind!r}")
for user in ("postgres", "gradhub"):
    attempt(f"postgres-{user}", lambda user=user: postgres(user))

# The control: the same token does work for its own job while the attempt runs.
try:
    import gradhub
    gradhub.save_checkpoint(1, b"control")
    print("CONTROL own-checkpoint: ok", flush=True)
except Exception as error:
    print(f"CONTROL own-checkpoint: failed ({type(error).__name__}: {error})", flush=True)

print(f"TOKEN {token}", flush=True)
print("HOSTILE DONE", flush=True)
)PY";

}  // namespace gradhub::testing
