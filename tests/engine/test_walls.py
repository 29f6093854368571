"""The process walls (issue 30): each applied and checked in a real probe child, and the
parent's reading of that child's report, which treats it as hostile; and real walled children
(apply_child_walls, the one sequence every walled child runs) that run a wasmtime engine and
cannot open a file, a socket or a process."""

from __future__ import annotations

import json
import platform
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import ROOT, run_child
from wasihost.engine import walls
from wasihost.engine.spawn import PIPE, spawn
from wasihost.engine.walls import MAX_REPORT_BYTES, WALL_NAMES, Wall, parse_report, probe_walls

# A broken child must be told apart quickly; the real probe takes ~0.1 s.
SHORT_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def probed() -> dict[str, Wall]:
    return {w.name: w for w in probe_walls()}


def _enforced_or_refused(wall: Wall) -> None:
    """The wall is enforced; or the kernel refused it (a container without user namespaces, a
    kernel without Landlock), and the test is skipped saying so. Never a failed probe, nor a
    wall applied but not holding."""
    if wall.state == "unavailable" and not wall.detail.startswith(
        ("probe failed", "applied but not holding")
    ):
        pytest.skip(f"the kernel refuses {wall.name} here: {wall.detail}")
    assert wall.state == "enforced", wall


@pytest.mark.parametrize("name", ["no_new_privs", "namespaces", "landlock", "rlimits"])
def test_each_wall_is_enforced_in_the_probe_child(probed: dict[str, Wall], name: str) -> None:
    _enforced_or_refused(probed[name])


def test_the_report_names_every_wall_in_order_with_landlocks_abi() -> None:
    report = probe_walls()
    assert [w.name for w in report] == list(WALL_NAMES)
    landlock = report[WALL_NAMES.index("landlock")]
    if landlock.state == "enforced":
        assert landlock.detail.startswith("ABI "), landlock


# What the seccomp wall says when this machine has no pyseccomp or libseccomp to load.
NO_LIBSECCOMP = (
    "pyseccomp cannot be imported",
    "libseccomp cannot be loaded",
    "libseccomp without",
)


def test_seccomp_is_enforced_in_the_probe_child(probed: dict[str, Wall]) -> None:
    seccomp = probed["seccomp"]
    if seccomp.state == "unavailable" and seccomp.detail.startswith(NO_LIBSECCOMP):
        pytest.skip(f"no libseccomp here: {seccomp.detail}")
    assert seccomp.state == "enforced", seccomp
    pattern = r"libseccomp \d+\.\d+\.\d+, allow-list of (\d+) calls, default EPERM"
    found = re.fullmatch(pattern, seccomp.detail)
    assert found is not None, seccomp
    # Every call of SECCOMP_ALLOWED exists on x86_64, and six more are allowed on conditions.
    if platform.machine() == "x86_64":
        assert int(found.group(1)) == len(walls.SECCOMP_ALLOWED) + 6


def test_the_probe_leaves_the_calling_process_unwalled() -> None:
    before = walls.net_namespace()
    nnp = walls.no_new_privs()
    probe_walls()
    # unshare and Landlock cannot be undone: they must only ever happen in the child.
    assert walls.net_namespace() == before
    assert walls.no_new_privs() == nnp
    assert walls.net_isolation_problem(before) == "still in the parent's network namespace"


UNWALLED_CHECKS = """
import errno, json, re, sys, tempfile
from wasihost.engine import walls
answers = walls.seccomp_answers()
# The filter as libseccomp has it, in its pseudo-code: which calls have a rule of their own.
syscalls, _ = walls.build_seccomp_filter()
with tempfile.TemporaryFile("w+") as pfc:
    syscalls.export_pfc(pfc)
    pfc.seek(0)
    ruled = sorted(set(re.findall(r'filter for syscall "(\\w+)"', pfc.read())))
print(json.dumps({
    "answers": {name: errno.errorcode.get(code, code) for name, code in answers.items()},
    "problem": walls.seccomp_problem(),
    "ruled": ruled,
}))
"""

# The calls the filter must deny, whatever their arguments: none has a rule in the filter, and
# in a walled child each answers EPERM. The arguments are harmless, and with them the kernel
# alone answers otherwise (EBADF, EFAULT, EINVAL, ESRCH, ENOTDIR...), all but pivot_root,
# which checks its capability first: so EPERM is the filter's answer. fork is made raw (and
# os.fork, a clone without CLONE_THREAD, below); vfork is not, as a vfork child returning into
# Python would corrupt its parent: the filter has no rule for it.
NOWHERE = "/dev/null/nowhere"
DENIED_CALLS: dict[str, tuple[object, ...]] = {
    "socket": (2, 1, 0),  # AF_INET, SOCK_STREAM
    "socketpair": (1, 1, 0, None),  # AF_UNIX, SOCK_STREAM, nowhere to write the pair
    "connect": (-1, None, 0),
    "bind": (-1, None, 0),
    "listen": (-1, 0),
    "accept": (-1, None, None),
    "accept4": (-1, None, None, 0),
    "execve": (NOWHERE, None, None),
    "execveat": (-100, NOWHERE, None, None, 0),  # AT_FDCWD
    "ptrace": (16, 0, 0, 0),  # PTRACE_ATTACH to no process
    "mount": (None, None, None, 0, None),
    "umount2": (None, 0),
    "pivot_root": (None, None),
    "chroot": (None,),
    "unshare": (1,),  # not a flag unshare knows
    "setns": (-1, 0),
    "fork": (),
    "vfork": None,  # not made: see above
    "kexec_load": (0, 0, None, 0),
    "kexec_file_load": (-1, -1, 0, None, 0),
    "bpf": (-1, None, 0),
    "perf_event_open": (None, 0, -1, -1, 0),
    "process_vm_readv": (0, None, 0, None, 0, 1),  # flags must be 0
    "process_vm_writev": (0, None, 0, None, 0, 1),
    "keyctl": (-1, 0, 0, 0, 0),
    "add_key": (None, None, None, 0, 0),
}


def test_each_check_sees_a_wall_that_is_not_there() -> None:
    # The checks are what make "enforced" mean something: in this unwalled process they fail.
    assert walls.read_restriction_problem([], [sys.executable]) == (
        f"{sys.executable}, outside the readable paths, could still be opened"
    )
    assert walls.read_restriction_problem(["/nonexistent-wasihost"], []) == (
        "cannot read /nonexistent-wasihost, which is allowed (ENOENT)"
    )
    assert walls.rlimit_problem({"RLIMIT_CORE": -1}) is not None
    # Without a filter each call the seccomp check makes gets the kernel's own answer, never
    # the filter's (and does no harm: no process, mount or trace is made). In a child, so that
    # this process does not keep /proc/self/status open.
    report, _ = run_child(UNWALLED_CHECKS)
    assert report == {
        "answers": {
            "socket": 0,  # made, then closed
            "execve": "ENOTDIR",
            "mount": "EFAULT",
            "ptrace": "ESRCH",
            "clone": "EINVAL",
            "clone3": "EINVAL",
        },
        "problem": "/proc/self/status says Seccomp: 0",
        "ruled": report["ruled"],
    }
    # The filter rules on what the allow-list names, and on nothing that must be denied.
    ruled = set(report["ruled"])
    assert {"clone", "clone3", "memfd_create", "ioctl", "fcntl", "openat"} <= ruled
    assert ruled.isdisjoint(DENIED_CALLS), ruled & set(DENIED_CALLS)


# -- real walled children: apply_child_walls, then a wasmtime engine ---------------------------

# A guest with a memory and a data segment, calls that trap by signal (out of bounds), by fuel
# and by epoch, and memory.grow: what a walled child must keep running.
GUEST_WAT = """
(module
  (memory (export "memory") 1 4)
  (data (i32.const 16) "walled")
  (func (export "add") (param i32 i32) (result i32)
    local.get 0 local.get 1 i32.add)
  (func (export "load") (param i32) (result i32) local.get 0 i32.load)
  (func (export "grow") (result i32) i32.const 1 memory.grow)
  (func (export "spin") (loop br 0)))
"""
# The engine's settings, the same in the parent that compiles and the child that deserialises.
# A small reservation keeps the child's address space within RLIMIT_AS below.
ENGINE_SETTINGS = {"memory_reservation": 1 << 24, "memory_guard_size": 1 << 16}
CHILD_RLIMITS = {
    "RLIMIT_AS": 1 << 30,
    "RLIMIT_CPU": 10,
    "RLIMIT_NOFILE": 64,
    "RLIMIT_FSIZE": 0,
    "RLIMIT_CORE": 0,
}
WALLED_TIMEOUT_S = 30

# The head of every walled child: the repository and its dependencies on the path (the child
# runs under -I, with spawn()'s cleared environment), then everything imported and opened
# before the walls close the filesystem.
CHILD_HEAD = """
import sys
sys.path[:0] = {paths!r}
import ctypes, errno, json, os, socket, threading
{imports}
from wasihost.engine import walls
walls.prepare_walls()
"""

WORKLOAD = """
module_bytes = sys.stdin.buffer.read()
status = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)  # read again below
applied = walls.apply_child_walls(rlimits={rlimits!r}, readable=[])

config = wasmtime.Config()
config.consume_fuel = True
config.epoch_interruption = True
for name, value in {settings!r}.items():
    setattr(config, name, value)
engine = wasmtime.Engine(config)
module = wasmtime.Module.deserialize(engine, module_bytes)
store = wasmtime.Store(engine)
store.set_fuel(10**9)
store.set_epoch_deadline(10**6)
exports = wasmtime.Instance(store, module, []).exports(store)
total = 0
for i in range(3000):
    total = exports["add"](store, total, i)
ticker = threading.Thread(target=lambda: [engine.increment_epoch() for _ in range(3)])
ticker.start()
ticker.join()

traps = []
def trap(name, *args):
    try:
        exports[name](store, *args)
    except wasmtime.Trap as exc:
        traps.append(str(exc.trap_code).rsplit(".", 1)[-1])
trap("load", 1 << 20)
store.set_fuel(10_000)
trap("spin")
store.set_fuel(10**12)
store.set_epoch_deadline(1)
ticker = threading.Thread(target=engine.increment_epoch)
ticker.start()
trap("spin")
ticker.join()
store.set_epoch_deadline(10**6)
grown = exports["grow"](store)

def answer(action):
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return "allowed"

def fork():
    if os.fork() == 0:
        os._exit(0)

{raw_calls}

refused = {{
    "socket": answer(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM)),
    "socketpair": answer(socket.socketpair),
    "execv": answer(lambda: os.execv("/bin/true", ["true"])),
    "fork": answer(fork),
    "posix_spawn": answer(lambda: os.posix_spawn("/bin/true", ["true"], {{}})),
    "kill_parent": answer(lambda: os.kill(os.getppid(), 0)),
    "open_interpreter": answer(lambda: open(sys.executable, "rb")),
    "open_status": answer(lambda: open("/proc/self/status", "rb")),
    "create_here": answer(lambda: open("new-file", "wb")),
    "list_root": answer(lambda: os.listdir("/")),
}}
lines = os.pread(status, 65536, 0).decode().splitlines()
print(json.dumps({{
    "walls": [[w.name, w.state, w.detail] for w in applied],
    "total": total, "traps": traps, "grown": grown, "refused": refused, "raw": raw_calls,
    "status": [line for line in lines if line.split(":")[0] in ("Seccomp", "NoNewPrivs")],
}}))
"""


# Each call of DENIED_CALLS made raw, its answer in raw_calls: "allowed", "absent" (not a call
# of this architecture) or the errno's name.
RAW_CALLS = """
import pyseccomp
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
me = os.getpid()
def raw(name, args):
    number = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    if number < 0:
        return "absent"
    def value(arg):
        if isinstance(arg, int):
            return ctypes.c_long(arg)
        return ctypes.c_char_p(arg.encode()) if isinstance(arg, str) else arg
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *map(value, args))
    if result == 0 and name == "fork" and os.getpid() != me:
        os._exit(0)  # a fork that went through: the parent reports it "allowed"
    return "allowed" if result >= 0 else errno.errorcode.get(ctypes.get_errno())
raw_calls = {name: raw(name, args) for name, args in DENIED.items() if args is not None}
"""


def _raw_calls() -> str:
    return f"DENIED = {DENIED_CALLS!r}\n{RAW_CALLS}"


def _child_head(*modules: str) -> str:
    import importlib.util

    import wasmtime

    deps = {str(Path(wasmtime.__file__).resolve().parents[1])}
    pyseccomp = importlib.util.find_spec("pyseccomp")  # found, not imported (nor required)
    if pyseccomp is not None and pyseccomp.origin is not None:
        deps.add(str(Path(pyseccomp.origin).resolve().parent))
    paths = [str(ROOT), *sorted(deps)]
    return CHILD_HEAD.format(paths=paths, imports="\n".join(f"import {m}" for m in modules))


def _run_walled(source: str, stdin: bytes = b"") -> tuple[int, str, str]:
    """Run ``source`` as a child started by spawn(), like every walled child; its status,
    stdout and stderr."""
    argv = [sys.executable, "-I", "-c", source]
    with spawn(argv, stdin=PIPE, stdout=PIPE, stderr=PIPE, env={"RUST_BACKTRACE": "0"}) as child:
        out, err = child.proc.communicate(stdin, timeout=WALLED_TIMEOUT_S)
    return child.end(), out.decode(), err.decode()


def _compiled_guest() -> bytes:
    import wasmtime

    config = wasmtime.Config()
    config.consume_fuel = True
    config.epoch_interruption = True
    for name, value in ENGINE_SETTINGS.items():
        setattr(config, name, value)
    return bytes(wasmtime.Module(wasmtime.Engine(config), GUEST_WAT).serialize())


def _seccomp_here(probed: dict[str, Wall]) -> None:
    if probed["seccomp"].state != "enforced":
        pytest.skip(f"seccomp is not enforced here: {probed['seccomp'].detail}")


@pytest.fixture(scope="module")
def walled_run(probed: dict[str, Wall]) -> dict[str, Any]:
    _seccomp_here(probed)
    source = _child_head("wasmtime") + WORKLOAD.format(
        rlimits=CHILD_RLIMITS, settings=ENGINE_SETTINGS, raw_calls=_raw_calls()
    )
    status, out, err = _run_walled(source, _compiled_guest())
    assert status == 0, err[-2000:]
    report: dict[str, Any] = json.loads(out)
    return report


def test_a_walled_child_runs_a_wasmtime_engine(walled_run: dict[str, Any]) -> None:
    # Every wall enforced (the landlock detail: it reads nothing) ...
    states = {name: (state, detail) for name, state, detail in walled_run["walls"]}
    for name in WALL_NAMES:
        if states[name][0] != "enforced":
            _enforced_or_refused(Wall(name, *states[name]))
    assert states["landlock"][1].endswith(", reads nothing")
    # ... and still: a module the parent compiled, 3000 calls, a thread that ticks the epoch,
    # a trap by signal, by fuel and by epoch, and memory.grow.
    assert walled_run["total"] == sum(range(3000))
    assert walled_run["traps"] == ["MEMORY_OUT_OF_BOUNDS", "OUT_OF_FUEL", "INTERRUPT"]
    assert walled_run["grown"] == 1


def test_a_walled_child_can_start_no_process_nor_open_a_socket_or_a_file(
    walled_run: dict[str, Any],
) -> None:
    # EPERM is the filter's answer; EACCES is Landlock's (open is allowed by the filter so
    # that the filesystem's wall is the one that answers).
    assert walled_run["refused"] == {
        "socket": "EPERM",
        "socketpair": "EPERM",
        "execv": "EPERM",
        "fork": "EPERM",
        "posix_spawn": "EPERM",
        "kill_parent": "EPERM",
        "open_interpreter": "EACCES",
        "open_status": "EACCES",
        "create_here": "EACCES",
        "list_root": "EACCES",
    }


def test_a_walled_child_gets_eperm_for_every_call_the_filter_denies(
    walled_run: dict[str, Any],
) -> None:
    made = {name for name, args in DENIED_CALLS.items() if args is not None}
    answers = walled_run["raw"]
    assert set(answers) == made
    # A call this architecture does not have (aarch64 has no fork) is denied by not existing.
    assert {name: answer for name, answer in answers.items() if answer != "absent"} == {
        name: "EPERM" for name, answer in answers.items() if answer != "absent"
    }
    if platform.machine() == "x86_64":
        assert "absent" not in answers.values()


UNFILTERED = """
walls.set_no_new_privs()
walls.unshare_user_and_net()  # no capability outside: kexec_load and mount do nothing here
{raw_calls}
print(json.dumps(raw_calls))
"""


def test_without_the_filter_the_kernel_answers_those_calls_otherwise() -> None:
    # The control of the test above: no_new_privs and a user namespace as in a walled child,
    # no filter. Only pivot_root answers EPERM by itself; fork goes through.
    status, out, err = _run_walled(_child_head() + UNFILTERED.format(raw_calls=_raw_calls()))
    if status != 0 and "unshare" in err:
        pytest.skip(f"no user namespaces here: {err[-300:]}")
    assert status == 0, err[-2000:]
    answers = json.loads(out)
    assert answers["fork"] == "allowed"
    assert {name for name, answer in answers.items() if answer == "EPERM"} <= {"pivot_root"}


def test_a_walled_childs_status_says_seccomp_filter_and_no_new_privs(
    walled_run: dict[str, Any],
) -> None:
    assert walled_run["status"] == ["NoNewPrivs:\t1", "Seccomp:\t2"]


NO_PYSECCOMP = """
sys.modules["pyseccomp"] = None  # as on a machine without it: importing it raises
walls.prepare_walls()
try:  # a readable path that does not exist is refused before any wall
    walls.apply_child_walls(rlimits={}, readable=["/nonexistent-wasihost"])
    missing = "applied"
except FileNotFoundError:
    missing = "refused, no_new_privs %s" % walls.no_new_privs()
applied = walls.apply_child_walls(rlimits={"RLIMIT_CORE": 0}, readable=[])
print(json.dumps({"missing": missing, "walls": [[w.name, w.state, w.detail] for w in applied]}))
"""


def test_without_pyseccomp_the_wall_is_unavailable_and_the_others_still_apply(
    probed: dict[str, Wall],
) -> None:
    head = _child_head().replace("walls.prepare_walls()\n", "")
    status, out, err = _run_walled(head + NO_PYSECCOMP)
    assert status == 0, err[-2000:]
    report = json.loads(out)
    assert report["missing"] == "refused, no_new_privs False"
    got = {name: (state, detail) for name, state, detail in report["walls"]}
    assert got["seccomp"][0] == "unavailable"
    assert got["seccomp"][1].startswith("pyseccomp cannot be imported ("), got["seccomp"]
    for name in ("no_new_privs", "namespaces", "landlock", "rlimits"):
        assert got[name][0] == probed[name].state, (name, got[name])


# A call in another architecture's numbering, after the walls: x32's getpid (the x32 bit set
# on x86_64's number) and ia32's getpid through int 0x80 (from a page of machine code mapped
# before the walls). Each prints "walled" first, so a death before the walls shows.
OTHER_ABI = """
import mmap
code = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
code.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))  # mov eax, 20; int 0x80; ret
ia32_getpid = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(code)))
libc = ctypes.CDLL(None, use_errno=True)
walls.apply_child_walls(rlimits={{}}, readable=[])
print("walled", flush=True)
{call}
print("survived", flush=True)
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x32 and ia32 are x86_64's")
@pytest.mark.parametrize(
    "call", ["libc.syscall(0x40000000 | 39)", "ia32_getpid()"], ids=["x32", "ia32"]
)
def test_a_call_in_another_abis_numbering_kills_the_walled_child(
    probed: dict[str, Wall], call: str
) -> None:
    _seccomp_here(probed)
    status, out, err = _run_walled(_child_head() + OTHER_ABI.format(call=call))
    assert (status, out) == (-signal.SIGSYS, "walled\n"), err[-2000:]


def test_the_child_shortens_its_own_details_to_what_the_parent_accepts() -> None:
    for text in ("é\x1b[2J" + "x" * 1000, "ok", ""):
        shown = walls.short_detail(text)
        entries = [{"name": n, "state": "unavailable", "detail": shown} for n in WALL_NAMES]
        line = json.dumps({"schema": 1, "walls": entries}).encode() + b"\n"
        assert [w.detail for w in parse_report(line)] == [shown] * len(WALL_NAMES)
    assert walls.short_detail("ok") == "ok"


def _child(source: str) -> list[str]:
    return [sys.executable, "-I", "-c", source]


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("print('garbage')", "output is not JSON"),
        (f"print('x' * {4 * MAX_REPORT_BYTES})", f"output over {MAX_REPORT_BYTES} bytes"),
        ("import sys; sys.stdout.write('{' * 100000)", f"output over {MAX_REPORT_BYTES} bytes"),
        ("print('[' * 5000 + ']' * 5000)", "output is not JSON"),  # json's recursion limit
        ("import time; time.sleep(30)", "no report within 1 s"),
        ("pass", "0 lines of output, not one"),
        ("print('{}'); print('{}')", "2 lines of output, not one"),
        ("import sys; sys.exit(3)", "child exit status 3"),
        (
            "import os; os.close(1); import time; time.sleep(30)",
            "the child did not exit within 1 s",
        ),
    ],
)
def test_a_broken_or_hostile_child_is_a_failed_probe_not_a_traceback(
    source: str, reason: str
) -> None:
    report = probe_walls(timeout_s=SHORT_TIMEOUT_S, program=_child(source))
    assert [w.name for w in report] == list(WALL_NAMES)
    assert {(w.state, w.detail) for w in report} == {("unavailable", f"probe failed: {reason}")}


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie not yet reaped by init counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_child_that_forks_and_exits_takes_its_group_with_it(tmp_path: Path) -> None:
    # The grandchild holds stdout open: the probe waits out its deadline, then kills the group.
    pid_file = tmp_path / "pid"
    source = (
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0: time.sleep(30)\n"
        f"open({str(pid_file)!r}, 'w').write(str(pid))\n"
    )
    report = probe_walls(timeout_s=SHORT_TIMEOUT_S, program=_child(source))
    assert report[0].detail == "probe failed: no report within 1 s"
    grandchild = int(pid_file.read_text())
    for _ in range(100):
        if _gone(grandchild):
            break
        time.sleep(0.01)
    assert _gone(grandchild)


def _entries() -> list[dict[str, object]]:
    return [{"name": n, "state": "enforced", "detail": "ok"} for n in WALL_NAMES]


def _report(**changes: object) -> bytes:
    doc: dict[str, object] = {"schema": 1, "walls": _entries()}
    doc.update(changes)
    return json.dumps(doc).encode() + b"\n"


def _one(**fields: object) -> list[dict[str, object]]:
    """Every wall's record, the first one changed."""
    entries = _entries()
    entries[0].update(fields)
    return entries


def test_a_well_formed_report_is_read_as_it_is() -> None:
    assert parse_report(_report()) == [Wall(n, "enforced", "ok") for n in WALL_NAMES]


@pytest.mark.parametrize(
    "raw",
    [
        _report(schema=2),
        _report(schema=True),  # True == 1 in Python; not in a report
        _report(schema="1"),
        _report(extra=1),
        _report(walls={}),
        _report(walls=_one()[:-1]),
        _report(walls=list(reversed(_one()))),
        _report(walls=_one(state="ENFORCED")),
        _report(walls=_one(state=1)),
        _report(walls=_one(detail=None)),
        _report(walls=_one(detail="\x1b[2Jcleared")),
        _report(walls=_one(detail="é")),
        _report(walls=_one(detail="x" * 301)),
        _report(walls=_one(extra="")),
        _report(walls=[*_one()[:-1], "seccomp"]),
        _report(walls=_one(name="landlock")),
        b"[]\n",
        b"\xff\xfe\n",
    ],
)
def test_a_malformed_report_is_a_failed_probe(raw: bytes) -> None:
    report = parse_report(raw)
    assert [w.name for w in report] == list(WALL_NAMES)
    assert all(w.state == "unavailable" and w.detail.startswith("probe failed: ") for w in report)
