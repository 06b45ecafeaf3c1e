"""User code against the worker that runs it, retried as the attack: a function that reads the worker's command
line, its environment, the token key file named there, another function's saved config and its own
environment, at import (the validation child) and in process() (a process-runtime instance), and reports
what it read in its 400 or its output. Each asserts that nothing secret comes back and that the function
still works otherwise; and that a tenant admin's code is refused on the thread runtime.

The worker is a real `pulsar-autoscale worker` process (its command line carries --token-secret-key, its
environment the key itself and other credentials), run as root, so its user code runs as nobody.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pulsar
import pytest
import requests

from pulsar_autoscale.functions.instance.instance_user import DEFAULT_UIDS
from pulsar_autoscale.netutil import free_port
from pulsar_autoscale.security import tokens
from tests.support.commands import worker_command
from tests.support.scenario import wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="isolation needs a root worker (it drops to nobody)")

SUPERUSER, TENANT_ADMIN = "admin", "acme-admin"
CANARY = f"canary-{uuid.uuid4().hex}"
FNS = "/admin/v3/functions"

# What the attacker uploads. spy() finds the worker by its command line, then reads what it names.
SPY = r'''
import json, os

def _read(path):
    try:
        with open(path, "rb") as f:
            return "READ " + f.read(4096).decode("latin-1")
    except Exception as exc:
        return "REFUSED " + type(exc).__name__

def _listdir(path):
    try:
        return "READ " + " ".join(sorted(os.listdir(path)))
    except Exception as exc:
        return "REFUSED " + type(exc).__name__

def _worker():
    for pid in sorted(os.listdir("/proc")):
        if pid.isdigit():
            try:
                cmd = [c.decode() for c in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")]
            except OSError:
                continue
            if "--token-secret-key" in cmd and "worker" in cmd:
                return pid, cmd
    return None, []

def _signal_others():
    """Signal 0 (a permission check that sends nothing) to every process of a user other than root: another
    function's instance, if it runs as the spy's own user, would take a SIGKILL as well."""
    found = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) not in (os.getpid(), os.getppid()):
            try:
                uid = int(next(l for l in open(f"/proc/{pid}/status") if l.startswith("Uid:")).split()[1])
            except (OSError, StopIteration, ValueError):
                continue
            if uid == 0:
                continue
            try:
                os.kill(int(pid), 0)
                found[pid] = "SIGNALLED"
            except PermissionError:
                found[pid] = "REFUSED"
            except ProcessLookupError:
                pass
    return found

def _arg(cmd, flag):
    return cmd[cmd.index(flag) + 1] if flag in cmd else ""

def spy():
    pid, cmd = _worker()
    key_file = _arg(cmd, "--token-secret-key").removeprefix("file://")
    data_dir = _arg(cmd, "--data-dir")
    return {"uid": os.getuid(), "worker_pid": pid, "cmdline": cmd, "key_file": key_file,
            "worker_environ": _read(f"/proc/{pid}/environ"), "worker_mem": _read(f"/proc/{pid}/mem"),
            "key": _read(key_file), "own_environ": _read("/proc/self/environ"), "env": dict(os.environ),
            "holder_config": _read(f"{data_dir}/functions/acme/ns/holder/config.json"),
            "data_dir": _listdir(data_dir), "climb": _listdir("../.."), "cwd": os.getcwd(),
            "others": _signal_others()}

AT_IMPORT = spy()
if os.environ.get("SPY_RAISE") or __name__.endswith("_raise"):
    raise RuntimeError("SPY " + json.dumps(AT_IMPORT))

def process(value):
    return json.dumps({"at_import": AT_IMPORT, "at_process": spy(), "echo": value})
'''


@pytest.fixture(scope="module")
def attacked(broker):
    """A root worker with a key file (0600, in a directory anyone may enter), the key itself in its
    environment as PULSAR_AUTOSCALE_TOKEN_SECRET_KEY, and other credentials next to it."""
    home = Path(tempfile.mkdtemp(prefix="pa-isolation-"))
    home.chmod(0o755)  # reachable: what refuses a read below is the worker's own protection
    secret = tokens.create_secret_key()
    key_file = home / "secret.key"
    key_file.write_bytes(secret)
    key_file.chmod(0o600)
    data_dir = home / "data"
    port = free_port()
    env = {
        **os.environ,
        "PULSAR_AUTOSCALE_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(secret).decode(),
        "DB_PASSWORD": CANARY,
        "MY_API_TOKEN": CANARY,
    }
    log = open(home / "worker.log", "wb")
    proc = subprocess.Popen(
        worker_command(
            broker.service_url,
            broker.metrics_url,
            str(port),
            str(data_dir),
            "--token-secret-key",
            f"file://{key_file}",
            "--superuser-roles",
            SUPERUSER,
            "--tenant-admin",
            f"acme={TENANT_ADMIN}",
        ),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    w = {"url": url, "secret": secret, "home": home, "data_dir": data_dir, "proc": proc}
    try:
        wait_until(lambda: _answers(w), 60, "the worker's API")
        r = call(
            w,
            "POST",
            "acme/ns/holder",
            SUPERUSER,
            {"instanceRuntime": "process", "secrets": {"db": CANARY}},
            b"def process(v):\n    return v\n",
        )
        assert r.status_code == 204, r.text
        yield w
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(home, ignore_errors=True)


def _answers(w) -> bool:
    try:
        return requests.get(w["url"] + f"{FNS}/acme/ns", headers=_auth(w, SUPERUSER), timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


def _auth(w, role: str) -> dict:
    return {"Authorization": f"Bearer {tokens.create_token(role, secret_key=w['secret'])}"}


def call(w, method: str, fqfn: str, role: str, config: dict, code: bytes | None = None, filename: str = "spy.py"):
    """A create (POST) or update (PUT), retried while the worker is still reaching its broker (503)."""
    tenant, ns, name = fqfn.split("/")
    cfg = {
        "tenant": tenant,
        "namespace": ns,
        "name": name,
        "className": f"{Path(filename).stem}.process",
        "inputs": [f"persistent://{tenant}/{ns}/{name}-in"],
        **config,
    }
    files = {"functionConfig": (None, json.dumps(cfg), "application/json")}
    if code is not None:
        files["data"] = (filename, code)
    answers = []

    def send():
        answers.append(requests.request(method, f"{w['url']}{FNS}/{fqfn}", headers=_auth(w, role), files=files, timeout=60))
        return answers[-1].status_code != 503

    wait_until(send, 60, lambda: f"the worker to reach its broker ({answers[-1].text})", interval_s=0.5)
    return answers[-1]


def assert_nothing_secret(w, report: dict, text: str) -> None:
    """The spy ran as a uid of its own (the worker's default with tenant admins) and obtained no credential:
    every secret read was refused, and neither the key (raw, base64, hex) nor a canary appears anywhere in what
    came back."""
    assert report["uid"] in DEFAULT_UIDS, report["uid"]
    assert report["worker_pid"] is not None and "--token-secret-key" in report["cmdline"], "the attack found its target"
    for what in ("worker_environ", "worker_mem", "key", "holder_config", "data_dir", "climb"):
        assert report[what].startswith("REFUSED"), (what, report[what][:200])
    assert not report["own_environ"].startswith("READ") or CANARY not in report["own_environ"]
    assert not [k for k in report["env"] if any(word in k.upper() for word in ("TOKEN", "SECRET", "KEY", "PASSWORD", "AUTH"))]
    secret = w["secret"]
    for leak in (CANARY, base64.b64encode(secret).decode(), secret.hex(), secret.decode("latin-1")):
        assert leak not in text, "a secret came back"


def test_code_that_reads_the_workers_secrets_at_import_gets_a_400_that_holds_none(attacked):
    r = call(
        attacked, "POST", "acme/ns/spy_raise", TENANT_ADMIN, {"instanceRuntime": "process"}, SPY.encode(), filename="spy_raise.py"
    )
    assert r.status_code == 400, (r.status_code, r.text)
    reason = r.json()["reason"]
    assert "SPY " in reason, reason[:300]  # the attack ran in the validation child and its report came back
    report = json.loads(reason[reason.index("SPY ") + 4 : reason.rindex("}") + 1])
    assert_nothing_secret(attacked, report, r.text)


def test_a_process_instance_that_reads_the_workers_secrets_outputs_none_and_still_works(attacked, broker):
    name = f"spy_{uuid.uuid4().hex[:6]}"
    r = call(
        attacked,
        "POST",
        f"acme/ns/{name}",
        TENANT_ADMIN,
        {"instanceRuntime": "process", "output": f"persistent://acme/ns/{name}-out"},
        SPY.encode(),
    )
    assert r.status_code == 204, r.text
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        consumer = client.subscribe(f"persistent://acme/ns/{name}-out", "check", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(f"persistent://acme/ns/{name}-in")
        producer.send(b"hello")
        msg = consumer.receive(60_000)
        output = msg.data().decode("latin-1")
        consumer.acknowledge(msg)
    finally:
        client.close()
    result = json.loads(output)
    assert result["echo"] == "hello"  # the function works: it got its input and its output went out
    for phase in ("at_import", "at_process"):
        assert_nothing_secret(attacked, result[phase], output)
    # the holder's instance runs as a uid of its own: the spy found it and could not signal it (nor anything else)
    others = result["at_process"]["others"]
    holder_uid = DEFAULT_UIDS.start  # the worker's first function (the fixture's) got the range's first uid
    assert result["at_process"]["uid"] != holder_uid
    holder_pids = [pid for pid in others if _uid_of(pid) == holder_uid]
    assert holder_pids and all(others[pid] == "REFUSED" for pid in holder_pids), others
    assert "SIGNALLED" not in others.values(), others


def _uid_of(pid: str) -> int | None:
    try:
        return int(next(line for line in open(f"/proc/{pid}/status") if line.startswith("Uid:")).split()[1])
    except (OSError, StopIteration):
        return None


def test_a_tenant_admins_code_is_refused_on_the_thread_runtime(attacked):
    code = b"def process(v):\n    return v\n"
    for config in ({}, {"instanceRuntime": "thread"}):  # the worker's default runtime is thread
        r = call(attacked, "POST", "acme/ns/in_worker", TENANT_ADMIN, config, code, filename="echo.py")
        assert r.status_code == 400 and "thread runtime" in r.json()["reason"], (r.status_code, r.text)
    assert (
        requests.get(f"{attacked['url']}{FNS}/acme/ns/in_worker", headers=_auth(attacked, SUPERUSER), timeout=30).status_code
        == 404
    )
    # a superuser's (trusted) code may run there; a tenant admin may not bring new code into it
    r = call(attacked, "POST", "acme/ns/trusted", SUPERUSER, {}, code, filename="echo.py")
    assert r.status_code == 204, r.text
    r = call(attacked, "PUT", "acme/ns/trusted", TENANT_ADMIN, {}, code + b"# changed\n", filename="echo.py")
    assert r.status_code == 400 and "thread runtime" in r.json()["reason"], (r.status_code, r.text)
    r = call(attacked, "PUT", "acme/ns/trusted", TENANT_ADMIN, {"parallelism": 2}, filename="echo.py")  # no new code
    assert r.status_code == 204, r.text


def test_the_worker_keeps_its_data_dir_and_a_functions_config_to_itself(attacked):
    log = (attacked["home"] / "worker.log").read_text(errors="replace")
    assert "user code runs as a uid and gid of its own per function" in log  # its start-up line says whom
    data_dir = attacked["data_dir"]
    assert data_dir.stat().st_mode & 0o777 == 0o700
    holder = data_dir / "functions" / "acme" / "ns" / "holder"
    assert (holder / "config.json").stat().st_mode & 0o777 == 0o600
    code_dirs = list((holder / "code").iterdir())
    assert (holder / "code").stat().st_mode & 0o777 == 0o700 and code_dirs
    assert code_dirs[0].stat().st_mode & 0o777 == 0o755  # the instance user's working directory


DROP_THEN_IMPORT = """
import sys
sys.path.insert(0, sys.argv[1])
import pkg                                  # loaded before the drop, as a worker loads this project's packages
from pulsar_autoscale.functions.instance.instance_user import InstanceUser, enter
enter(InstanceUser.resolve("nobody"), None)
import pkg.sub                              # and a module of it imported after, as a bundled example's class is
print(pkg.sub.VALUE)
"""


def test_user_code_imports_from_a_checkout_only_root_may_enter(tmp_path):
    """A root operator's checkout is often 0700 (under /root, or made by mktemp): the instance user reaches its
    packages through directories the worker opened before the drop. Before, a package below a sys.path entry
    was reached through that entry's open directory, which the instance user may not pass: a process instance
    of a bundled example failed with ModuleNotFoundError, again and again."""
    checkout = tmp_path / "checkout"
    (checkout / "pkg").mkdir(parents=True)
    (checkout / "pkg" / "__init__.py").write_text("")
    (checkout / "pkg" / "sub.py").write_text("VALUE = 'imported as nobody'\n")
    for path in (checkout / "pkg", checkout / "pkg" / "__init__.py", checkout / "pkg" / "sub.py"):
        path.chmod(0o755)
    checkout.chmod(0o700)
    run = subprocess.run([sys.executable, "-c", DROP_THEN_IMPORT, str(checkout)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "imported as nobody", run.stderr[-2000:]
