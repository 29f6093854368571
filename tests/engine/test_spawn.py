"""The one spawn function (issue 30, "one mechanism"): real children, started directly and as
the compile worker. Each sees none of the parent's environment but what is passed, runs in its
own session in an empty private directory, and takes any grandchild with it when it ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import ALL_CAPS, ROOT, bare
from tests.support.guests import build, guest_wat
from wasihost.core.errors import AdmissionError
from wasihost.core.settings import EngineSettings
from wasihost.engine import compiler
from wasihost.engine.spawn import PIPE, child_env, spawn
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

CANARY = "WASIHOST_SPAWN_CANARY"

# What a child reports about itself: its environment as exec() gave it (/proc/self/environ:
# Python's locale coercion may add LC_CTYPE to os.environ later), its session and group, its
# working directory and what is in it, its open descriptors; then it forks a grandchild that
# would sleep for a minute, its standard streams let go, and says its pid.
REPORT = """
import json, os, sys, time
raw = open("/proc/self/environ", "rb").read().split(b"\\0")
env = dict(e.decode().split("=", 1) for e in raw if e)
fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
seen = {"env": env, "pid": os.getpid(), "sid": os.getsid(0), "pgrp": os.getpgrp(),
        "cwd": os.getcwd(), "listing": os.listdir("."), "fds": fds}
child = os.fork()
if child == 0:  # it lets go of the pipes: its parent's output ends when its parent's does
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    time.sleep(60)
    os._exit(0)
seen["grandchild"] = child
"""


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie not yet reaped by init counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_gone(pid: int) -> bool:
    for _ in range(200):
        if _gone(pid):
            return True
        time.sleep(0.01)
    return False


def _check_walls(seen: dict[str, Any], extra: dict[str, str]) -> None:
    assert seen["env"] == child_env(extra)
    assert CANARY not in seen["env"]
    assert seen["sid"] == seen["pid"] == seen["pgrp"]  # its own session and process group
    assert seen["listing"] == []
    assert seen["cwd"] != os.getcwd()
    assert Path(str(seen["cwd"])).name.startswith("wasihost-")


@pytest.fixture
def canary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CANARY, "the parent's secret")
    monkeypatch.setenv("TZ", "UTC")  # the locale and time zone do pass


def test_a_spawned_child_has_only_the_walls_given_and_its_group_ends_with_it(
    canary: None,
) -> None:
    stray_r, stray_w = os.pipe()
    os.set_inheritable(stray_w, True)  # close_fds must close even an inheritable descriptor
    extra = {"EXTRA": "given"}
    source = REPORT + "print(json.dumps(seen), flush=True)\ntime.sleep(60)\n"
    try:
        child = spawn([sys.executable, "-I", "-c", source], env=extra, stdout=PIPE)
        with child:
            assert child.proc.stdout is not None
            seen = json.loads(child.proc.stdout.readline())
            assert not child.exited(0)
        assert child.end() == child.end() == -9  # idempotent: killed once, reaped once
    finally:
        os.close(stray_r)
        os.close(stray_w)
    _check_walls(seen, extra)
    assert seen["cwd"] == child.cwd
    assert stray_w not in seen["fds"]
    assert set(seen["fds"]) <= {0, 1, 2, 3}  # 3: /proc/self/fd itself
    assert not os.path.exists(child.cwd)  # the private directory is removed
    assert _wait_gone(int(seen["grandchild"]))


def test_a_child_that_exited_keeps_its_status_and_its_grandchild_is_killed() -> None:
    source = REPORT + "print(json.dumps(seen), flush=True)\nsys.exit(7)\n"
    with spawn([sys.executable, "-I", "-c", source], stdout=PIPE) as child:
        assert child.proc.stdout is not None
        seen = json.loads(child.proc.stdout.readline())
        assert child.exited(10)
        # Exited but not reaped: the group can still be killed under its own id.
        assert not _gone(int(seen["grandchild"]))
    assert child.end() == 7
    assert _wait_gone(int(seen["grandchild"]))


def test_a_child_that_cannot_start_leaves_no_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where spawn() makes its directory
    with pytest.raises(FileNotFoundError):
        spawn([str(tmp_path / "no-such-program")])
    assert list(temp.iterdir()) == []


def _fake_worker(tmp_path: Path, then: str) -> tuple[Path, Path]:
    """A compile worker that reports what it sees to a file, forks a grandchild, then runs
    ``then``. The path is written into the script: the worker's environment carries nothing."""
    seen_file = tmp_path / "seen.json"
    script = tmp_path / "worker.py"
    script.write_text(
        REPORT + f"open({str(seen_file)!r}, 'w').write(json.dumps(seen))\n" + then + "\n"
    )
    return script, seen_file


@pytest.mark.parametrize(
    ("then", "settings", "reason"),
    [
        ("print('no', file=sys.stderr); sys.exit(1)", {}, r"worker failed \(status 1\): no"),
        ("time.sleep(60)", {"compile_timeout_seconds": 1}, "1 s of wall-clock time"),
    ],
)
def test_the_compile_worker_is_spawned_walled_and_ended_with_its_group(
    canary: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    then: str,
    settings: dict[str, int],
    reason: str,
) -> None:
    script, seen_file = _fake_worker(tmp_path, then)
    monkeypatch.setattr(compiler, "WORKER", script)
    engine_settings = EngineSettings(compile_in_process_max_bytes=0, **settings)
    host = Host(Policy(allow=ALL_CAPS), cache_dir=None, settings=engine_settings)
    with host, pytest.raises(AdmissionError, match=reason):
        host.admit(bare(build(guest_wat())))
    seen = json.loads(seen_file.read_text())
    _check_walls(seen, compiler.worker_env())
    assert not os.path.exists(seen["cwd"])
    assert _wait_gone(seen["grandchild"])  # on the error path and the timeout path alike


def test_the_worker_is_passed_pythonpath_only_when_the_interpreter_needs_it() -> None:
    # Here wasmtime is in the interpreter's own site-packages: nothing to pass.
    assert compiler.worker_env() == compiler._WORKER_ENV


HOST_FROM_A_CHECKOUT = """
import json
from tests.support.common import ALL_CAPS, bare
from tests.support.guests import build, guest_wat
from wasihost.core.settings import EngineSettings
from wasihost.engine import compiler
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
settings = EngineSettings(compile_in_process_max_bytes=0)
with Host(Policy(allow=ALL_CAPS), cache_dir=None, settings=settings) as host:
    result = host.admit(bare(build(guest_wat()))).call("run")
    print(json.dumps({"result": result, "workers": host.engine.compiler.worker_compiles,
                      "env": compiler.worker_env()}))
"""


def test_a_host_with_wasmtime_only_on_pythonpath_still_compiles_in_a_worker(
    tmp_path: Path,
) -> None:
    # A venv without the system's site-packages: its interpreter finds wasmtime only through
    # PYTHONPATH, as a host run from a source checkout with its dependencies beside it. The
    # worker, started with the environment cleared, must be given that one directory.
    import wasmtime

    deps = os.path.dirname(os.path.dirname(os.path.abspath(wasmtime.__file__)))
    venv.EnvBuilder(with_pip=False, symlinks=True).create(tmp_path / "venv")
    python = str(tmp_path / "venv" / "bin" / "python")
    bare_import = subprocess.run(
        [python, "-I", "-c", "import wasmtime"], capture_output=True, check=False
    )
    assert bare_import.returncode != 0  # the venv alone does not have it
    run = subprocess.run(
        [python, "-c", HOST_FROM_A_CHECKOUT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{deps}"},
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["env"] == {**compiler._WORKER_ENV, "PYTHONPATH": deps}
    assert (report["result"], report["workers"]) == (None, 1)


WALLED_WORKER = """
import importlib.util, json, os, socket, sys
spec = importlib.util.spec_from_file_location("real_worker", {worker!r})
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)
before = os.readlink("/proc/self/ns/net")
worker._wall_self({{"RLIMIT_CORE": 0, "RLIMIT_CPU": 30, "RLIMIT_AS": 2 << 30}})
seen = {{"net_changed": os.readlink("/proc/self/ns/net") != before}}
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    seen["socket"] = "opened"
except OSError as exc:
    seen["socket"] = exc.errno
try:
    open({outside!r}, "rb")
    seen["read_outside"] = "read"
except OSError as exc:
    seen["read_outside"] = exc.errno
try:
    os.fork()
    seen["fork"] = "forked"
except OSError as exc:
    seen["fork"] = exc.errno
print(json.dumps(seen), file=sys.stderr)
sys.exit(1)
"""


def test_the_compile_worker_applies_every_wall_a_walled_child_has(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # One mechanism (issue 30): the worker compiling a hostile module runs behind the walls
    # of the process runtime's children, not only in their spawn.
    import errno

    secret = tmp_path / "outside.txt"
    secret.write_text("not for the worker")
    script = tmp_path / "worker.py"
    script.write_text(WALLED_WORKER.format(worker=str(compiler.WORKER), outside=str(secret)))
    monkeypatch.setattr(compiler, "WORKER", script)
    host = Host(
        Policy(allow=ALL_CAPS),
        cache_dir=None,
        settings=EngineSettings(compile_in_process_max_bytes=0),
    )
    with host, pytest.raises(AdmissionError) as info:
        host.admit(bare(build(guest_wat())))
    seen = json.loads(info.value.problems[0].split("): ", 1)[1])
    assert seen == {
        "net_changed": True,
        "socket": errno.EPERM,
        "read_outside": errno.EACCES,
        "fork": errno.EPERM,
    }, seen
