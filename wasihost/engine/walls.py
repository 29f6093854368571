"""The process walls: applied in, and checked from inside, a child process (issue 30).

The out-of-process runtime will run a guest in a child behind these walls. With :mod:`.spawn`
(the one way a child is started and ended, which the compile worker uses too), this module is
the one spawn-and-wall mechanism the compile worker, the process runtime and native plugins
share. :func:`apply_child_walls` is the one sequence every walled child runs on itself:
no_new_privs, user and network namespaces, rlimits, Landlock, then seccomp, each applied and
checked from inside. ``wasihost doctor`` runs that same function in a short-lived probe child
(:func:`probe_walls`: this file run as a script, its one line of JSON parsed defensively), and
a native plugin's launcher runs it before it executes the plugin (this file run as a script
with ``--launch``, see LAUNCH_FLAG).

Each wall has a function that APPLIES it in the calling process (irreversible: call it only in
a child) and one that CHECKS it from inside. Whatever must be imported or opened is loaded by
:func:`prepare_walls`, which a child calls before the walls close the filesystem (finding
libseccomp runs ldconfig in a subprocess, which seccomp forbids, and no module can be read once
Landlock is in force).

Standard library and pyseccomp only (pyseccomp imported inside functions), and no wasmtime:
the probe child and the launcher run this file as a script under ``-I``, so it must not import
wasihost, and a child that imported the engine would pay its start-up for nothing.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import resource
import stat
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

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
# Interpreter start-up, loading libseccomp and five walls take ~100 ms; a child still running
# after this is stuck.
PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Wall:
    """One wall on this machine: ``enforced`` (applied and checked from inside the child),
    ``available`` (present, but wasihost does not apply it: no wall is reported so today) or
    ``unavailable`` (``detail`` says why)."""

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
    import socket  # loaded by prepare_walls, before Landlock forbids reading modules

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
ACCESS_FS_EXECUTE = 1 << 0
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


def _allow_reading(ruleset: int, add_rule: int, path: str, execute: bool = False) -> None:
    # A directory's rule lets it be listed and the files under it read; a file's, only that
    # file read (the kernel refuses directory rights on a file), and executed when ``execute``.
    beneath = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        is_dir = stat.S_ISDIR(os.fstat(beneath).st_mode)
        rights = ACCESS_FS_READ_FILE | (ACCESS_FS_READ_DIR if is_dir else 0)
        rights |= ACCESS_FS_EXECUTE if execute else 0
        rule = _PathBeneathAttr(rights, beneath)
        args = (ctypes.c_int(ruleset), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH))
        if _syscall(add_rule, *args, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise _os_error("landlock_add_rule")
    finally:
        os.close(beneath)


def restrict_to_reading(paths: Sequence[str], executable: Sequence[str] = ()) -> None:
    """Apply: from now on this process may read the files and list the directories under each
    of ``paths`` (a file: only that file), read and execute the files of ``executable``, and
    do nothing else to the filesystem. With no paths it can open nothing at all. Descriptors
    already open stay usable. Needs no_new_privs (or CAP_SYS_ADMIN)."""
    create, add_rule, restrict_self = _landlock_syscalls()
    attr = _RulesetAttr(_handled_access(landlock_abi()))
    ruleset = _syscall(create, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0)
    if ruleset < 0:
        raise _os_error("landlock_create_ruleset")
    try:
        for path in paths:
            _allow_reading(ruleset, add_rule, path)
        for path in executable:
            _allow_reading(ruleset, add_rule, path, execute=True)
        if _syscall(restrict_self, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise _os_error("landlock_restrict_self")
    finally:
        os.close(ruleset)


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def _read_problem(path: str) -> str | None:
    """None when ``path`` reads: a file, its first byte; a directory, its listing and the first
    byte of its first regular file, if it has one."""
    try:
        if os.path.isdir(path):
            files = [e for e in sorted(os.listdir(path)) if os.path.isfile(os.path.join(path, e))]
            if not files:
                return None
            path = os.path.join(path, files[0])
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        return f"cannot read {path}, which is allowed ({_errno_name(exc)})"
    return None


def read_restriction_problem(readable: Sequence[str], outside: Sequence[str]) -> str | None:
    """Check: None when every path of ``readable`` can be read and none of ``outside`` can be
    opened (EACCES); otherwise what is wrong."""
    for path in readable:
        problem = _read_problem(path)
        if problem is not None:
            return problem
    for path in outside:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except PermissionError:
            continue
        except OSError as exc:
            return f"opening {path} failed otherwise ({_errno_name(exc)})"
        os.close(fd)
        return f"{path}, outside the readable paths, could still be opened"
    return None


def _outside(readable: Sequence[str]) -> list[str]:
    """Paths the Landlock check expects to be refused: the interpreter's file and the root
    directory, each unless it is under one of ``readable`` (real paths)."""

    def under(path: str, base: str) -> bool:
        return os.path.commonpath([path, base]) == base

    candidates = [os.path.realpath(sys.executable)] if sys.executable else []
    return [p for p in [*candidates, "/"] if not any(under(p, base) for base in readable)]


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

# Allowed whatever their arguments. Under strace, the workload of tests/engine/test_walls.py
# (deserialise, instantiate, 3000 calls, traps by signal, fuel and epoch, a thread) made only
# calls of the memory, thread, signal and time groups below, write, ioctl(TCGETS), getrandom
# and exit_group once the filter was loaded; the rest is what an interpreter may need on the
# descriptors it holds (the process runtime's channel) and about itself. None reaches beyond
# the process. Everything not allowed here or in _seccomp_rules fails with EPERM: no new
# socket, process, program, mount, namespace, trace, or signal to another process.
SECCOMP_ALLOWED = (
    # Memory: wasmtime maps code and linear memories and resets them with madvise.
    *("brk", "mmap", "munmap", "mprotect", "madvise", "mremap", "membarrier"),
    # The process's own threads (clone itself is filtered below).
    *("futex", "gettid", "set_robust_list", "rseq", "sched_yield", "sched_getaffinity"),
    "exit",
    # Its own signals: wasmtime's trap handlers and their alternate stacks. restart_syscall is
    # how the kernel resumes a sleep that a signal interrupted.
    *("rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "sigaltstack", "restart_syscall"),
    # Time. The process runtime's engine ticks its epoch with a POSIX timer of its own
    # (engine/ticker.py, NativeTicker: timer_create with SIGEV_THREAD, a thread of this
    # process): a timer signals only this process.
    *("clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday"),
    *("timer_create", "timer_settime", "timer_gettime", "timer_getoverrun", "timer_delete"),
    # glibc's SIGEV_THREAD helper thread waits for the timer's signal in sigwaitinfo: denied,
    # it retried at once, a thread spinning beside the guest (a small call took 6x longer).
    "rt_sigtimedwait",
    # I/O on descriptors it already holds (it opens new ones only where Landlock lets it).
    *("read", "write", "readv", "writev", "pread64", "pwrite64", "lseek", "close"),
    *("fstat", "newfstatat", "getdents64", "poll", "ppoll", "select", "pselect6"),
    *("epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2"),
    *("recvfrom", "recvmsg", "sendmsg", "shutdown", "getsockopt"),
    # The filesystem: Landlock is its wall, so a refused open says EACCES as it would anywhere.
    *("openat", "getcwd", "readlink"),
    # About itself.
    *("exit_group", "getpid", "getppid", "getrandom", "uname", "sysinfo", "getrlimit"),
)

# A native plugin's launcher (this file's --launch, started by engine/native_plugins.py)
# applies the walls to itself, then executes the plugin, which keeps them: so its filter also
# lets a program start in this process. execve and execveat replace this process's program,
# never start another one (clone still makes only threads), and Landlock lets them execute
# only the dynamic loader; the plugin itself
# comes from a sealed memfd, which Landlock does not govern (internal files are outside its
# hierarchy) and which the plugin cannot make (memfd_create stays ENOSYS). A dynamically
# linked program's start needs the rest: arch_prctl to set its thread pointer,
# set_tid_address, and access to look for /etc/ld.so.preload.
SECCOMP_LAUNCHER_ALLOWED = (
    *("execve", "execveat", "arch_prctl", "set_tid_address", "access", "faccessat"),
    "faccessat2",
)

# clone only makes a thread of this process: CLONE_THREAD and CLONE_VM set, no new namespace.
# fork() and posix_spawn() are clones without CLONE_THREAD, so they fail with EPERM.
CLONE_THREAD = 0x00010000
CLONE_VM = 0x00000100
CLONE_SIGHAND = 0x00000800
_CLONE_NEW_NAMESPACES = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | CLONE_NEWNET
)
_PTRACE_ATTACH = 16


@dataclass(slots=True)
class _Prepared:
    """What the walls need loaded before the filesystem closes: ``/proc/self/status`` open (the
    thread count and the Seccomp line are read from it later), and pyseccomp with the version of
    its libseccomp, or why it cannot be loaded."""

    status_fd: int
    seccomp: Any  # the pyseccomp module, or None
    seccomp_detail: str  # "libseccomp X.Y.Z", or the reason it is unavailable


_PREPARED: list[_Prepared] = []


class _ScmpVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]


def _load_pyseccomp() -> tuple[Any, str]:
    """(pyseccomp, "libseccomp X.Y.Z"), or (None, why not). Importing pyseccomp finds libc and
    libseccomp with ctypes.util.find_library, which runs ldconfig in a subprocess."""
    try:
        import pyseccomp
    except ImportError as exc:
        return None, f"pyseccomp cannot be imported ({exc})"
    except (OSError, RuntimeError, AttributeError) as exc:  # no libseccomp, or a too old one
        return None, f"libseccomp cannot be loaded ({exc})"
    try:
        # pyseccomp has no version call of its own: ask the library it loaded (2.3+).
        get = pyseccomp._libseccomp.seccomp_version
    except AttributeError:
        return None, "libseccomp without seccomp_version (< 2.3)"
    get.restype = ctypes.POINTER(_ScmpVersion)
    v = get().contents
    return pyseccomp, f"libseccomp {v.major}.{v.minor}.{v.micro}"


def prepare_walls() -> None:
    """Load and open, while the filesystem is still open, everything :func:`apply_child_walls`
    needs: pyseccomp (and through it libseccomp), the modules the checks import, and
    ``/proc/self/status``. A child calls it before anything that closes the filesystem, and
    itself imports everything else it will need before :func:`apply_child_walls` (which calls
    this too, in case it was not). Idempotent; never raises for a missing libseccomp, which only
    makes the seccomp wall unavailable."""
    if _PREPARED:
        return
    import fcntl  # noqa: F401 - the filter's constants: modules cannot be read after Landlock
    import socket  # noqa: F401 - the namespace and seccomp checks
    import termios  # noqa: F401 - the filter's constants

    try:
        status_fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        status_fd = -1  # no /proc: the checks that read it say so
    seccomp, detail = _load_pyseccomp()
    _PREPARED.append(_Prepared(status_fd, seccomp, detail))


def _prepared() -> _Prepared:
    prepare_walls()
    return _PREPARED[0]


def _status_field(name: str) -> str | None:
    """A field of this process's ``/proc/self/status``, read through the descriptor opened by
    :func:`prepare_walls` (Landlock forbids opening it again); None without it."""
    fd = _prepared().status_fd
    if fd < 0:
        return None
    for line in os.pread(fd, 65536, 0).decode("ascii", "replace").splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    return None


def seccomp_version() -> str:
    """Check: ``libseccomp X.Y.Z``, the library pyseccomp loaded (OSError when pyseccomp or
    libseccomp cannot be loaded, with the reason)."""
    prepared = _prepared()
    if prepared.seccomp is None:
        raise OSError(errno.ENOSYS, prepared.seccomp_detail)
    return prepared.seccomp_detail


def _seccomp_rules(
    scmp: Any, launcher: bool = False
) -> Iterator[tuple[int, str, tuple[Any, ...]]]:
    """(action, call, argument conditions) of every rule but the default. Several rules for one
    call are alternatives; the conditions of one rule must all hold. ``launcher``: the filter
    of a native plugin's launcher, which also allows SECCOMP_LAUNCHER_ALLOWED."""
    import fcntl
    import termios

    allow, arg = scmp.ALLOW, scmp.Arg
    for name in SECCOMP_ALLOWED + (SECCOMP_LAUNCHER_ALLOWED if launcher else ()):
        yield allow, name, ()
    thread_mask = CLONE_THREAD | CLONE_VM | _CLONE_NEW_NAMESPACES
    yield allow, "clone", (arg(0, scmp.MASKED_EQ, thread_mask, CLONE_THREAD | CLONE_VM),)
    # glibc tries clone3 first and falls back to clone only on ENOSYS. clone3's flags are in a
    # structure in memory, which a filter cannot read.
    yield scmp.ERRNO(errno.ENOSYS), "clone3", ()
    # wasmtime puts a module's initial memory in a memfd when it can, and copies it into each
    # instance when the kernel has none (ENOSYS; EPERM fails the instantiation). An anonymous
    # file the child could fill and map is more than it needs.
    yield scmp.ERRNO(errno.ENOSYS), "memfd_create", ()
    # A signal to one of its own threads (abort() and raise() send one): never another process.
    yield allow, "tgkill", (arg(0, scmp.EQ, os.getpid()),)
    # Reading its own limits; never setting them, nor another process's.
    yield allow, "prlimit64", (arg(0, scmp.EQ, 0), arg(2, scmp.EQ, 0))
    # isatty, a socket's blocking mode, the close-on-exec flag: never TIOCSTI (typing into a
    # terminal) nor FIOSETOWN (signals at another process).
    for request in (termios.TCGETS, termios.FIONBIO, termios.FIOCLEX, termios.FIONCLEX):
        yield allow, "ioctl", (arg(1, scmp.EQ, request),)
    # Descriptor and status flags and dup: never F_SETOWN or F_SETSIG, which would aim SIGIO
    # (or any signal) at another process of the same user.
    getset = (fcntl.F_GETFD, fcntl.F_SETFD, fcntl.F_GETFL, fcntl.F_SETFL, fcntl.F_DUPFD_CLOEXEC)
    for command in getset:
        yield allow, "fcntl", (arg(1, scmp.EQ, command),)
    # send() on a connected socket: no destination address of its own.
    yield allow, "sendto", (arg(4, scmp.EQ, 0),)


def build_seccomp_filter(launcher: bool = False) -> tuple[Any, int]:
    """The allow-list filter, not loaded yet, and how many calls it allows (some only with the
    arguments above). Default action ERRNO(EPERM): an unexpected call fails where the caller
    can report it, instead of killing the process. A call made with another architecture's
    numbering (ia32's int 0x80, x32's, on x86_64) kills the process: libseccomp filters the
    native architecture only. OSError when pyseccomp or libseccomp cannot be loaded."""
    seccomp_version()
    scmp = _prepared().seccomp
    syscalls = scmp.SyscallFilter(scmp.ERRNO(errno.EPERM))
    syscalls.set_attr(scmp.Attr.ACT_BADARCH, scmp.KILL_PROCESS)
    allowed: set[str] = set()
    for action, name, conditions in _seccomp_rules(scmp, launcher):
        # A call this architecture does not have (select, poll on aarch64) resolves below 0.
        if scmp.resolve_syscall(scmp.Arch.NATIVE, name) < 0:
            continue
        syscalls.add_rule(action, name, *conditions)
        if action == scmp.ALLOW:
            allowed.add(name)
    return syscalls, len(allowed)


def apply_seccomp(launcher: bool = False) -> int:
    """Apply: load the allow-list filter (:func:`build_seccomp_filter`) on this process, for
    good. Returns how many calls it allows. Needs no_new_privs (or CAP_SYS_ADMIN), and a
    process of one thread (the filter binds the calling thread and what it starts after)."""
    syscalls, count = build_seccomp_filter(launcher)
    syscalls.load()
    return count


def _syscall_number(name: str) -> int:
    return int(_prepared().seccomp.resolve_syscall(0, name))  # 0: the native architecture


def _denied_call(name: str, *args: object) -> int:
    """The errno a raw call answers (0 when it succeeds)."""
    ctypes.set_errno(0)
    result = _syscall(_syscall_number(name), *args)
    return ctypes.get_errno() if result < 0 else 0


def seccomp_answers() -> dict[str, int]:
    """The errno each call the filter must deny answers (0: it succeeded). Each is made with
    arguments the kernel itself would refuse with another errno, so that EPERM proves the
    filter answered before the kernel looked, and an unfiltered process comes to no harm."""
    import socket

    answers = {}
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
        answers["socket"] = 0
    except OSError as exc:
        answers["socket"] = exc.errno or 0
    nowhere = ctypes.c_char_p(b"/dev/null/nowhere")  # ENOTDIR unfiltered: it cannot exist
    argv = (ctypes.c_char_p * 2)(nowhere.value, None)
    answers["execve"] = _denied_call("execve", nowhere, argv, None)
    answers["mount"] = _denied_call("mount", None, None, None, ctypes.c_ulong(0), None)  # EFAULT
    answers["ptrace"] = _denied_call("ptrace", ctypes.c_long(_PTRACE_ATTACH), 0, 0, 0)  # ESRCH
    # CLONE_SIGHAND without CLONE_VM: EINVAL unfiltered; not a thread, so EPERM filtered.
    answers["clone"] = _denied_call("clone", ctypes.c_ulong(CLONE_SIGHAND), 0, 0, 0, 0)
    answers["clone3"] = _denied_call("clone3", None, ctypes.c_size_t(0))  # EINVAL unfiltered
    return answers


# What the filter answers each call of seccomp_answers with.
SECCOMP_EXPECTED = {
    "socket": errno.EPERM,
    "execve": errno.EPERM,
    "mount": errno.EPERM,
    "ptrace": errno.EPERM,
    "clone": errno.EPERM,
    "clone3": errno.ENOSYS,
}


def seccomp_problem(launcher: bool = False) -> str | None:
    """Check: None when ``/proc/self/status`` says ``Seccomp: 2`` (a filter) and each call of
    :func:`seccomp_answers` gets the filter's answer; otherwise what is wrong. A launcher's
    filter lets execve through to the kernel, which refuses the nonexistent path itself."""
    mode = _status_field("Seccomp")
    if mode != "2":
        return f"/proc/self/status says Seccomp: {mode}"
    expected = {**SECCOMP_EXPECTED, "execve": errno.ENOTDIR} if launcher else SECCOMP_EXPECTED
    for name, got in seccomp_answers().items():
        if got != expected[name]:
            said = errno.errorcode.get(got, str(got)) if got else "success"
            return f"{name} answered {said}, not {errno.errorcode[expected[name]]}"
    return None


# -- every wall, in a child ------------------------------------------------------------------------


def _rlimits_detail(limits: Mapping[str, int]) -> str:
    return " ".join(f"{name.removeprefix('RLIMIT_')}={value}" for name, value in limits.items())


def _attempt(name: str, apply: Callable[[], str | None], detail: str | Callable[[], str]) -> Wall:
    """Run one wall's apply-then-check: ``apply`` returns None when the check passed, or what
    is wrong. ``detail`` (or what it returns, once applied) describes the enforced wall."""
    try:
        problem = apply()
    except OSError as exc:
        return Wall(name, "unavailable", str(exc.strerror or exc))
    except ValueError as exc:  # setrlimit's refusal of a value, rather than an errno
        return Wall(name, "unavailable", str(exc))
    if problem is not None:
        return Wall(name, "unavailable", f"applied but not holding: {problem}")
    return Wall(name, "enforced", detail if isinstance(detail, str) else detail())


def _one_thread() -> None:
    # unshare(CLONE_NEWUSER) refuses a process of several threads, and Landlock and seccomp
    # would bind only the calling one: the others would run unwalled.
    threads = _status_field("Threads")
    if threads is not None and threads != "1":
        raise RuntimeError(f"apply_child_walls needs a process of one thread, not {threads}")


def _reads(readable: Sequence[str], executable: Sequence[str] = ()) -> str:
    if executable:
        return (
            f"executes only {', '.join(executable)}; reads only {len(readable) + len(executable)} "
            "files"
        )
    if not readable:
        return "reads nothing"
    return f"reads only under {len(readable)} path{'s' if len(readable) > 1 else ''}"


def apply_child_walls(
    *,
    rlimits: Mapping[str, int],
    readable: Sequence[str] = (),
    executable: Sequence[str] | None = None,
) -> list[Wall]:
    """Apply every wall to this process, for good, and check each from inside: no_new_privs,
    a new user and network namespace, ``rlimits`` (soft and hard), Landlock (reading only under
    the paths of ``readable``; with none, nothing on the filesystem can be opened), then the
    seccomp allow-list. Returns the walls in WALL_NAMES' order, each ``enforced`` or
    ``unavailable`` with the reason: a wall the kernel refuses does not stop the others.

    ``executable`` (files, possibly none) makes the walls of a native plugin's launcher:
    Landlock lets those files be read and executed too, and the seccomp filter lets this
    process replace its program (SECCOMP_LAUNCHER_ALLOWED), which keeps every wall.

    The one sequence of every walled child (the doctor's probe, the process runtime). Only ever
    call it in a child of one thread (RuntimeError otherwise), after :func:`prepare_walls` and
    after importing and opening everything the child will need: afterwards it can read no
    module, start no process and open no socket. A path of ``readable`` that does not exist is
    the caller's mistake, not a wall the kernel refuses: FileNotFoundError, before any wall."""
    prepare_walls()
    _one_thread()
    readable = [os.path.realpath(path) for path in readable]
    launcher = executable is not None
    executable = [os.path.realpath(path) for path in executable or ()]
    for path in readable + executable:
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, "a readable path does not exist", path)
    outside = _outside(readable + executable)
    try:
        before = net_namespace()
    except OSError:
        before = ""  # no /proc: the check then compares with nothing

    def nnp() -> str | None:
        set_no_new_privs()
        return None if no_new_privs() else "PR_GET_NO_NEW_PRIVS says 0"

    def namespaces() -> str | None:
        unshare_user_and_net()
        return net_isolation_problem(before)

    def limits() -> str | None:
        apply_rlimits(rlimits)
        return rlimit_problem(rlimits)

    def landlock() -> str | None:
        restrict_to_reading(readable, executable)
        return read_restriction_problem(readable + executable, outside)

    counted: list[int] = []

    def seccomp() -> str | None:
        counted.append(apply_seccomp(launcher))
        return seccomp_problem(launcher)

    walls = {
        "no_new_privs": _attempt("no_new_privs", nnp, "set and read back"),
        "namespaces": _attempt("namespaces", namespaces, "new user and network namespace"),
        "rlimits": _attempt("rlimits", limits, _rlimits_detail(rlimits)),
        "landlock": _attempt(
            "landlock", landlock, lambda: f"ABI {landlock_abi()}, {_reads(readable, executable)}"
        ),
    }
    # Last: after it the child can start nothing and open no socket, even to check a wall.
    walls["seccomp"] = _attempt(
        "seccomp",
        seccomp,
        lambda: f"{seccomp_version()}, allow-list of {counted[0]} calls, default EPERM",
    )
    return [walls[name] for name in WALL_NAMES]


# -- the probe child ---------------------------------------------------------------------------


def _probe_in_child() -> list[Wall]:
    """Apply every wall to this process through :func:`apply_child_walls`, reading only its own
    directory. Irreversible: only ever run in the probe child."""
    prepare_walls()
    # A file the Landlock check may read, written before the walls close the directory.
    with open("inside", "wb") as f:
        f.write(b"x")
    return apply_child_walls(rlimits=PROBE_RLIMITS, readable=[os.getcwd()])


def short_detail(text: str) -> str:
    """``text`` as the parent accepts a detail: printable ASCII, at most MAX_DETAIL_CHARS. An
    honest child's long or non-ASCII error text (a path, a localised message) must not turn a
    good report into a failed probe."""
    ascii_text = text.encode("ascii", "backslashreplace").decode("ascii")
    shown = "".join(c if c.isprintable() else "?" for c in ascii_text)
    return shown if len(shown) <= MAX_DETAIL_CHARS else shown[: MAX_DETAIL_CHARS - 3] + "..."


def _child_main(argv: Sequence[str]) -> int:
    # Directories to search for pyseccomp after the interpreter's own (see import_dirs).
    sys.path.extend(argv)
    walls = [Wall(w.name, w.state, short_detail(w.detail)) for w in _probe_in_child()]
    report = {"schema": REPORT_SCHEMA, "walls": [w.as_json() for w in walls]}
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0


# -- a native plugin's launcher ----------------------------------------------------------------

# ``python -I walls.py --launch [--path DIR]... [--read FILE]... [--exec FILE]... --
# PLUGIN_FD CONTROL_FD NAME=VALUE...``: the process a native plugin runs in (engine/
# native_plugins.py). It applies every wall to itself, reading only the ``--read`` files and
# executing only the ``--exec`` ones, then replaces its program with the plugin's executable
# (the sealed memfd PLUGIN_FD), which keeps every wall. The plugin's command line is its
# control descriptor and the rlimits; its environment is the launcher's (the locale, the
# per-child secret) and WALLS_ENV, the walls as checked here.
LAUNCH_FLAG = "--launch"
WALLS_ENV = "WASIHOST_CHILD_WALLS"
# The per-child secret's variable (hex), as every child of the process runtime gets it.
SECRET_ENV = "WASIHOST_CHILD_SECRET"  # noqa: S105 - a variable's name, not a secret
# The channel protocol's version (core/channel.PROTOCOL_VERSION) and HELLO's kind (Kind.HELLO).
_PROTOCOL_VERSION = 1
_HELLO = 1
# Exit status when the plugin cannot be executed (as a shell says of a command it cannot run).
CANNOT_EXECUTE = 126
# A native plugin's rlimits arrive as RLIMIT_NAME=VALUE, nothing else.
_RLIMIT_ARG = "RLIMIT_"


def _cbor_text(text: str) -> bytes:
    data = text.encode("utf-8")
    return _cbor_head(3, len(data)) + data


def _cbor_head(major: int, argument: int) -> bytes:
    """A CBOR item's head: its major type and its argument (a length, or an unsigned value
    for major 0), in the shortest form up to 4 bytes (a pid, a secret's length)."""
    if argument < 24:
        return bytes([major << 5 | argument])
    if argument < 1 << 8:
        return bytes([major << 5 | 24, argument])
    if argument < 1 << 16:
        return bytes([major << 5 | 25]) + argument.to_bytes(2, "big")
    return bytes([major << 5 | 26]) + argument.to_bytes(4, "big")


def launcher_hello(secret: bytes, walls: Sequence[Wall]) -> bytes:
    """The launcher's own HELLO frame, ``[HELLO, version, secret, pid, walls]`` with its
    4-byte length: the walls as the launcher checked them, sent before the plugin runs. The
    host takes the walls from this frame, never from the plugin's HELLO: the plugin is
    untrusted code, and its report of its walls would be its word."""
    body = _cbor_head(4, 5) + _cbor_head(0, _HELLO) + _cbor_head(0, _PROTOCOL_VERSION)
    body += _cbor_head(2, len(secret)) + secret + _cbor_head(0, os.getpid()) + walls_cbor(walls)
    return len(body).to_bytes(4, "big") + body


def walls_cbor(walls: Sequence[Wall]) -> bytes:
    """The walls as the plugin's HELLO carries them: a CBOR array of [name, state, detail]
    text triples. Written by hand: the launcher imports nothing beyond the standard library
    and pyseccomp (it runs as a script, and every import is start-up time), and the shape is
    fixed and tiny."""
    out = bytearray(_cbor_head(4, len(walls)))
    for wall in walls:
        out += _cbor_head(4, 3)
        for text in (wall.name, wall.state, short_detail(wall.detail)):
            out += _cbor_text(text)
    return bytes(out)


def _launch_main(argv: Sequence[str]) -> int:
    """The launcher (see LAUNCH_FLAG). Never returns when the plugin starts."""
    options: dict[str, list[str]] = {"--path": [], "--read": [], "--exec": []}
    args = list(argv)
    while args and args[0] in options:
        options[args.pop(0)].append(args.pop(0))
    if len(args) < 3 or args[0] != "--":
        print(
            "wasihost launcher: usage: --launch [OPTIONS] -- PLUGIN_FD CONTROL_FD ...",
            file=sys.stderr,
        )
        return 2
    plugin_fd, control, limit_args = int(args[1]), args[2], args[3:]
    rlimits = {}
    for item in limit_args:
        name, _, value = item.partition("=")
        if not name.startswith(_RLIMIT_ARG) or not value.isdigit():
            print(f"wasihost launcher: not an rlimit: {item!r}", file=sys.stderr)
            return 2
        rlimits[name] = int(value)
    sys.path.extend(options["--path"])
    prepare_walls()
    walls = apply_child_walls(
        rlimits=rlimits, readable=options["--read"], executable=options["--exec"]
    )
    env = dict(os.environ)
    env[WALLS_ENV] = walls_cbor(walls).hex()
    try:
        secret = bytes.fromhex(env.get(SECRET_ENV, ""))
    except ValueError:
        secret = b""
    frame = launcher_hello(secret, walls)
    while frame:  # descriptor 0 is the channel; the frame fits its buffer many times over
        frame = frame[os.write(0, frame) :]
    # The plugin does not inherit its own executable's descriptor.
    os.set_inheritable(plugin_fd, False)
    try:
        # The launcher's whole job: replace itself with the plugin (an argv, no shell).
        os.execve(plugin_fd, ["wasihost-plugin", control, *limit_args], env)  # noqa: S606
    except OSError as exc:
        print(
            f"wasihost launcher: cannot execute the plugin ({exc.strerror or exc})",
            file=sys.stderr,
        )
    return CANNOT_EXECUTE


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

    argv = list(program or [sys.executable, "-I", os.path.abspath(__file__), *import_dirs()])
    # spawn() passes only the locale and time zone: nothing else of the parent's environment.
    try:
        child = spawn(argv, stdout=PIPE, prefix="wasihost-probe-")
    except OSError as exc:
        return failed_probe(f"cannot start the child ({exc.strerror or exc})")
    with child:
        return _collect(child, timeout_s)


def import_dirs() -> list[str]:
    """The directory the probe child must search for pyseccomp beyond its interpreter's own
    (none when pyseccomp is in the interpreter's site-packages). A host run with its
    dependencies on PYTHONPATH finds pyseccomp where a child under ``-I`` does not look, as the
    compile worker's environment allows for wasmtime; the child appends the directory after its
    own paths, so that it shadows nothing."""
    import importlib.util
    import site

    spec = importlib.util.find_spec("pyseccomp")  # finds it without importing it
    if spec is None or spec.origin is None:
        return []
    root = os.path.dirname(os.path.abspath(spec.origin))
    own = {os.path.realpath(p) for p in site.getsitepackages()}
    return [] if os.path.realpath(root) in own else [root]


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
    if sys.argv[1:2] == [LAUNCH_FLAG]:
        sys.exit(_launch_main(sys.argv[2:]))
    sys.exit(_child_main(sys.argv[1:]))
