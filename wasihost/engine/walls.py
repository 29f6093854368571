"""The process walls: applied in, and checked from inside, a child process (issue 30, step 1).

The out-of-process runtime will run a guest in a child behind these walls. With
:mod:`.spawn` (the one way a child is started and ended, which the compile worker uses too),
this module is the start of the one spawn-and-wall mechanism the compile worker, the process
runtime and native plugins will share. For now it applies each wall in a short-lived probe
child and checks it from inside, so that ``wasihost doctor`` reports what this machine
enforces.

Each wall has a function that APPLIES it in the calling process (irreversible: call it only in
a child) and one that CHECKS it from inside. :func:`probe_walls` runs them in a fresh
interpreter (this file run as a script) and parses its one line of JSON defensively.

Standard library only (ctypes, os, resource), and no wasmtime: the probe child runs this file
as a script under ``-I``, so it must not import wasihost, and a child that imported the engine
would pay its start-up for nothing.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import resource
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

if TYPE_CHECKING:
    from .spawn import Spawned

State = Literal["enforced", "available", "unavailable"]
STATES: frozenset[str] = frozenset({"enforced", "available", "unavailable"})

# The walls in the order they are reported.
WALL_NAMES = ("no_new_privs", "namespaces", "landlock", "rlimits", "seccomp")

REPORT_SCHEMA = 1
# The child's report is five short records (~600 bytes); anything much bigger is not ours.
MAX_REPORT_BYTES = 16 * 1024
# A detail is one short human sentence; longer ones are refused rather than cut, because a
# cut would hide that the child is not saying what the probe says.
MAX_DETAIL_CHARS = 300
# Interpreter start-up plus five walls is ~50 ms; a child still running after this is stuck.
PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Wall:
    """One wall on this machine: ``enforced`` (applied and checked in the probe child),
    ``available`` (present, but wasihost does not apply it yet) or ``unavailable`` (``detail``
    says why)."""

    name: str
    state: State
    detail: str

    def as_json(self) -> dict[str, str]:
        return {"name": self.name, "state": self.state, "detail": self.detail}


def _libc() -> ctypes.CDLL:
    # The process's own libc (already mapped): CDLL(None) needs no ctypes.util.find_library,
    # which would run ldconfig in a subprocess.
    return ctypes.CDLL(None, use_errno=True)


def _os_error(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {errno.errorcode.get(code, str(code))}")


# -- no_new_privs ------------------------------------------------------------------------------

PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39


def set_no_new_privs() -> None:
    """Apply: no execve in this process or its children can gain privileges (setuid bits, file
    capabilities). It is also what lets an unprivileged process restrict itself with Landlock."""
    one, zero = ctypes.c_ulong(1), ctypes.c_ulong(0)
    if _libc().prctl(PR_SET_NO_NEW_PRIVS, one, zero, zero, zero) != 0:
        raise _os_error("prctl(PR_SET_NO_NEW_PRIVS)")


def no_new_privs() -> bool:
    """Check: whether the flag is set on this process."""
    zero = ctypes.c_ulong(0)
    got = int(_libc().prctl(PR_GET_NO_NEW_PRIVS, zero, zero, zero, zero))
    if got < 0:
        raise _os_error("prctl(PR_GET_NO_NEW_PRIVS)")
    return got == 1


# -- user and network namespaces ---------------------------------------------------------------

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000


def net_namespace() -> str:
    """This process's network namespace, as ``net:[inode]``."""
    return os.readlink("/proc/self/ns/net")


def unshare_user_and_net() -> None:
    """Apply: move this process into a new user namespace (its capabilities there are worth
    nothing outside) and a new network namespace (only a loopback, which is down)."""
    if _libc().unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        raise _os_error("unshare(CLONE_NEWUSER|CLONE_NEWNET)")


def net_isolation_problem(parent_namespace: str) -> str | None:
    """Check: None when this process is in another network namespace than ``parent_namespace``
    with no interface but ``lo``; otherwise what is wrong."""
    import socket  # the probe child imports it here, before Landlock forbids reading modules

    if net_namespace() == parent_namespace:
        return "still in the parent's network namespace"
    # if_nameindex asks the kernel for this namespace's interfaces. /sys/class/net would show
    # the namespace of whoever mounted sysfs (the host's), not this process's.
    others = sorted(name for _, name in socket.if_nameindex() if name != "lo")
    if others:
        return f"interfaces other than lo: {', '.join(others)}"
    return None


# -- Landlock ----------------------------------------------------------------------------------

# The Landlock system calls have the same numbers on every architecture that uses the generic
# syscall table, x86_64 included; elsewhere (32-bit ARM, ...) they differ and are not wired.
_LANDLOCK_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
ACCESS_FS_READ_FILE = 1 << 2
ACCESS_FS_READ_DIR = 1 << 3
# Every filesystem right of each ABI version: the ruleset handles (denies unless a rule allows)
# all of them, so that the directory's read rights are the only filesystem access left.
_ACCESS_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}


class _RulesetAttr(ctypes.Structure):
    # struct landlock_ruleset_attr, ABI 1's part: the kernel accepts the short size.
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    # struct landlock_path_beneath_attr is packed in the kernel's header.
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _landlock_syscalls() -> tuple[int, int, int]:
    machine = platform.machine()
    if machine not in _LANDLOCK_SYSCALLS:
        raise OSError(errno.ENOSYS, f"Landlock system call numbers unknown for {machine}")
    return _LANDLOCK_SYSCALLS[machine]


def _syscall(number: int, *args: object) -> int:
    call = _libc().syscall
    call.restype = ctypes.c_long
    return int(call(ctypes.c_long(number), *args))


def landlock_abi() -> int:
    """Check: the kernel's Landlock ABI version (OSError when Landlock is not there)."""
    create, _, _ = _landlock_syscalls()
    version = _syscall(create, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if version < 0:
        raise _os_error("landlock_create_ruleset(VERSION)")
    return version


def _handled_access(abi: int) -> int:
    return _ACCESS_FS_BY_ABI[max(v for v in _ACCESS_FS_BY_ABI if v <= abi)]


def restrict_to_reading(directory: str) -> None:
    """Apply: from now on this process may read files and list directories under ``directory``
    and do nothing else to the filesystem (files already open stay usable). Needs
    no_new_privs (or CAP_SYS_ADMIN)."""
    create, add_rule, restrict_self = _landlock_syscalls()
    attr = _RulesetAttr(_handled_access(landlock_abi()))
    ruleset = _syscall(create, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0)
    if ruleset < 0:
        raise _os_error("landlock_create_ruleset")
    try:
        beneath = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            rule = _PathBeneathAttr(ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR, beneath)
            args = (ctypes.c_int(ruleset), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH))
            if _syscall(add_rule, *args, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                raise _os_error("landlock_add_rule")
        finally:
            os.close(beneath)
        if _syscall(restrict_self, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise _os_error("landlock_restrict_self")
    finally:
        os.close(ruleset)


def read_restriction_problem(inside: str, outside: str) -> str | None:
    """Check: None when ``inside`` can be read and ``outside`` cannot; otherwise what is
    wrong."""
    try:
        with open(inside, "rb") as f:
            f.read(1)
    except OSError as exc:
        return f"cannot read inside the allowed directory ({errno.errorcode.get(exc.errno or 0)})"
    try:
        with open(outside, "rb") as f:
            f.read(1)
    except PermissionError:
        return None
    except OSError as exc:
        return f"reading outside failed otherwise ({errno.errorcode.get(exc.errno or 0)})"
    return "a file outside the allowed directory was still readable"


# -- rlimits -----------------------------------------------------------------------------------

# The probe's limits: small enough to show the wall holds, large enough for the probe itself.
# The process runtime will take its limits from the extension's budgets.
PROBE_RLIMITS: Mapping[str, int] = {
    "RLIMIT_AS": 1 << 30,
    "RLIMIT_CPU": 10,
    "RLIMIT_NOFILE": 64,
    "RLIMIT_NPROC": 64,
    "RLIMIT_FSIZE": 1 << 20,
    "RLIMIT_CORE": 0,
}


def _lowered(name: str, value: int) -> int:
    # An unprivileged process may only lower its hard limit, never raise it.
    hard = resource.getrlimit(getattr(resource, name))[1]
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def apply_rlimits(limits: Mapping[str, int]) -> None:
    """Apply: each soft and hard limit to ``limits`` (or the current hard limit, if lower).
    Hard limits too, so that the process cannot raise them back."""
    for name, value in limits.items():
        low = _lowered(name, value)
        resource.setrlimit(getattr(resource, name), (low, low))


def rlimit_problem(limits: Mapping[str, int]) -> str | None:
    """Check: None when getrlimit gives at most ``limits`` for soft and hard."""
    for name, value in limits.items():
        soft, hard = resource.getrlimit(getattr(resource, name))
        unlimited = resource.RLIM_INFINITY
        if unlimited in (soft, hard) or soft > value or hard > value:
            return f"{name} is ({soft}, {hard}), not at most {value}"
    return None


# -- seccomp -----------------------------------------------------------------------------------


class _ScmpVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]


def seccomp_version() -> str:
    """Check: the version of the system's libseccomp (OSError when it cannot be loaded). No
    filter is built yet: that is the next step of issue 30."""
    import ctypes.util  # runs ldconfig in a subprocess: the probe child calls this first

    found = ctypes.util.find_library("seccomp")
    if found is None:
        raise OSError(errno.ENOENT, "libseccomp not found")
    lib = ctypes.CDLL(found)
    get = lib.seccomp_version  # libseccomp 2.3+
    get.restype = ctypes.POINTER(_ScmpVersion)
    v = get().contents
    return f"libseccomp {v.major}.{v.minor}.{v.micro}"


# -- the probe child ---------------------------------------------------------------------------


def _rlimits_detail(limits: Mapping[str, int]) -> str:
    return " ".join(f"{name.removeprefix('RLIMIT_')}={value}" for name, value in limits.items())


def _attempt(name: str, apply: Callable[[], str | None], detail: str) -> Wall:
    """Run one wall's apply-then-check: ``apply`` returns None when the check passed, or what
    is wrong."""
    try:
        problem = apply()
    except OSError as exc:
        return Wall(name, "unavailable", str(exc.strerror or exc))
    except ValueError as exc:  # setrlimit's refusal of a value, rather than an errno
        return Wall(name, "unavailable", str(exc))
    if problem is not None:
        return Wall(name, "unavailable", f"applied but not holding: {problem}")
    return Wall(name, "enforced", detail)


def _probe_in_child(parent_namespace: str) -> list[Wall]:
    """Apply every wall to this process, in the order a walled child will, and check each.
    Irreversible: only ever run in the probe child."""
    # seccomp first: finding the library runs ldconfig, which the walls below would stop.
    try:
        seccomp = Wall("seccomp", "available", f"{seccomp_version()}, not applied yet")
    except OSError as exc:
        seccomp = Wall("seccomp", "unavailable", str(exc.strerror or exc))
    except AttributeError:  # a libseccomp older than 2.3 has no seccomp_version
        seccomp = Wall("seccomp", "unavailable", "libseccomp without seccomp_version (< 2.3)")
    # A file the Landlock check may read, written before the walls close the directory.
    with open("inside", "wb") as f:
        f.write(b"x")
    here, outside = os.getcwd(), os.path.realpath(sys.executable)

    def nnp() -> str | None:
        set_no_new_privs()
        return None if no_new_privs() else "PR_GET_NO_NEW_PRIVS says 0"

    def namespaces() -> str | None:
        unshare_user_and_net()
        return net_isolation_problem(parent_namespace)

    def landlock() -> str | None:
        restrict_to_reading(here)
        return read_restriction_problem(os.path.join(here, "inside"), outside)

    def rlimits() -> str | None:
        apply_rlimits(PROBE_RLIMITS)
        return rlimit_problem(PROBE_RLIMITS)

    walls = {
        "no_new_privs": _attempt("no_new_privs", nnp, "set and read back"),
        "namespaces": _attempt("namespaces", namespaces, "new user and network namespace"),
        "rlimits": _attempt("rlimits", rlimits, _rlimits_detail(PROBE_RLIMITS)),
    }
    # Last: after it the child can open nothing new, not even a module to import.
    try:
        abi = landlock_abi()
    except OSError as exc:
        walls["landlock"] = Wall("landlock", "unavailable", str(exc.strerror or exc))
    else:
        walls["landlock"] = _attempt("landlock", landlock, f"ABI {abi}, reads one directory")
    walls["seccomp"] = seccomp
    return [walls[name] for name in WALL_NAMES]


def short_detail(text: str) -> str:
    """``text`` as the parent accepts a detail: printable ASCII, at most MAX_DETAIL_CHARS. An
    honest child's long or non-ASCII error text (a path, a localised message) must not turn a
    good report into a failed probe."""
    ascii_text = text.encode("ascii", "backslashreplace").decode("ascii")
    shown = "".join(c if c.isprintable() else "?" for c in ascii_text)
    return shown if len(shown) <= MAX_DETAIL_CHARS else shown[: MAX_DETAIL_CHARS - 3] + "..."


def _child_main(argv: Sequence[str]) -> int:
    parent_namespace = argv[0] if argv else ""
    walls = [
        Wall(w.name, w.state, short_detail(w.detail)) for w in _probe_in_child(parent_namespace)
    ]
    report = {"schema": REPORT_SCHEMA, "walls": [w.as_json() for w in walls]}
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0


# -- the parent --------------------------------------------------------------------------------


def failed_probe(reason: str) -> list[Wall]:
    """Every wall unavailable because the probe itself failed."""
    return [Wall(name, "unavailable", f"probe failed: {reason}") for name in WALL_NAMES]


def parse_report(raw: bytes) -> list[Wall]:
    """The walls of a probe child's output; ``failed_probe`` for anything but exactly one line
    of a well-formed report. The child is treated as hostile: every field is checked."""
    if len(raw) > MAX_REPORT_BYTES:
        return failed_probe(f"output over {MAX_REPORT_BYTES} bytes")
    lines = raw.decode("ascii", "replace").splitlines()
    if len(lines) != 1:
        return failed_probe(f"{len(lines)} lines of output, not one")
    try:
        report = json.loads(lines[0])
    except (ValueError, RecursionError):
        return failed_probe("output is not JSON")
    if not isinstance(report, dict) or set(report) != {"schema", "walls"}:
        return failed_probe("report is not {schema, walls}")
    if report["schema"] != REPORT_SCHEMA or type(report["schema"]) is not int:
        return failed_probe("unknown report schema")
    entries = report["walls"]
    if not isinstance(entries, list) or len(entries) != len(WALL_NAMES):
        return failed_probe("walls is not a list of every wall")
    walls = [_wall_of(entry, name) for entry, name in zip(entries, WALL_NAMES, strict=True)]
    if any(w is None for w in walls):
        return failed_probe("malformed wall record")
    return [w for w in walls if w is not None]


def _wall_of(entry: object, name: str) -> Wall | None:
    if not isinstance(entry, dict) or set(entry) != {"name", "state", "detail"}:
        return None
    state, detail = entry["state"], entry["detail"]
    if entry["name"] != name or not isinstance(state, str) or state not in STATES:
        return None
    # The detail reaches the operator's terminal: short printable ASCII only.
    if not isinstance(detail, str) or len(detail) > MAX_DETAIL_CHARS:
        return None
    if not (detail.isascii() and detail.isprintable()):
        return None
    return Wall(name, cast(State, state), detail)


def probe_walls(
    timeout_s: float = PROBE_TIMEOUT_S, program: Sequence[str] | None = None
) -> list[Wall]:
    """Each wall as this machine gives it, applied and checked in a fresh child interpreter:
    unshare and Landlock cannot be undone, so they are never applied to the caller.

    ``program`` replaces the child's command line (tests use it for a broken child). Never
    raises for what the child does: a child that times out, prints too much or prints
    anything but a well-formed report makes every wall ``unavailable: probe failed``."""
    from .spawn import PIPE, spawn

    try:
        parent_namespace = net_namespace()
    except OSError:
        parent_namespace = ""  # no /proc: the child's check then compares with nothing
    argv = list(program or [sys.executable, "-I", os.path.abspath(__file__), parent_namespace])
    # spawn() passes only the locale and time zone: nothing else of the parent's environment.
    try:
        child = spawn(argv, stdout=PIPE, prefix="wasihost-probe-")
    except OSError as exc:
        return failed_probe(f"cannot start the child ({exc.strerror or exc})")
    with child:
        return _collect(child, timeout_s)


def _collect(child: Spawned, timeout_s: float) -> list[Wall]:
    """Read at most MAX_REPORT_BYTES + 1 of the child's output before the deadline, then end
    it and its process group, whatever it is doing."""
    import selectors
    import time

    stdout = child.proc.stdout
    assert stdout is not None
    out, reason = bytearray(), None
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(stdout, selectors.EVENT_READ)
        while reason is None:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                reason = f"no report within {timeout_s:g} s"
                break
            chunk = os.read(stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
            if len(out) > MAX_REPORT_BYTES:
                reason = f"output over {MAX_REPORT_BYTES} bytes"
    # End of output: the child should be exiting; one that lingers is not a clean probe.
    if reason is None and not child.exited(deadline - time.monotonic()):
        reason = f"the child did not exit within {timeout_s:g} s"
    # The child leads its own session: ending it kills the group, so anything it left running.
    status = child.end()
    if reason is not None:
        return failed_probe(reason)
    if status != 0:
        return failed_probe(f"child exit status {status}")
    return parse_report(bytes(out))


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
