"""The one way wasihost starts a walled child process (issue 30: "one mechanism").

:func:`spawn` starts a fresh interpreter (or any argv) with the walls every child of wasihost
has from the first instruction:

- an environment cleared to ``LANG``, ``LC_ALL`` and ``TZ``, plus exactly what the caller
  passes;
- every file descriptor but the three standard ones (and those the caller names in
  ``pass_fds``) closed (``close_fds``);
- its own session, so its own process group;
- a working directory that is an empty private temporary directory, removed afterwards.

:meth:`Spawned.end` (also the context manager's exit) kills the whole process group with
SIGKILL, reaps the child, closes the pipes and removes the directory. It is idempotent, so
every path (an answer, a timeout, an error) ends with it.

Users: the walls probe of ``wasihost doctor`` (:mod:`.walls`) and the compile worker
(:mod:`.compiler`); the process runtime will be the third. The walls a child applies to itself
(no_new_privs, namespaces, rlimits, Landlock, seccomp: ``walls.apply_child_walls``) stay in the
child's own code.

A module of its own rather than part of :mod:`.walls`: the compile path must not load the walls
(only ``wasihost doctor`` does, tests/test_startup.py), and ``walls.py`` is also the probe
child's script, which must not carry the parent's plumbing. This module is imported only when a
child is started, never at start-up (it loads subprocess and tempfile).

A limit: a descendant that leaves the group (``setsid``/``setpgid`` of its own) escapes the
group kill. The process runtime's PID namespace is the later step that closes that.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from types import TracebackType

# What passes from the parent's environment to every child: the locale and the time zone.
PASSED_ENV = ("LANG", "LC_ALL", "TZ")

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """A child's whole environment: the parent's ``PASSED_ENV`` and ``extra``."""
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env.update(extra)
    return env


class Spawned:
    """A started child: ``proc`` (its pipes as the caller asked), ``cwd`` (its private
    directory). End it with :meth:`end` or a ``with`` block."""

    def __init__(self, proc: subprocess.Popen[bytes], cwd: str) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.cwd = cwd
        self._status: int | None = None

    def __enter__(self) -> Spawned:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.end()

    def exited(self, timeout_s: float) -> bool:
        """Whether the child has exited within ``timeout_s`` (0: now). The child is NOT reaped:
        while it is a zombie its pid, so its process group's id, cannot be reused, and
        :meth:`end` may still kill the group safely."""
        if self._status is not None:
            return True
        deadline = time.monotonic() + max(0.0, timeout_s)
        try:
            fd = os.pidfd_open(self.pid)
        except OSError:  # a kernel before 5.3: poll
            fd = -1
        try:
            while True:
                # WNOWAIT: look at the exit without reaping it.
                flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
                try:
                    if os.waitid(os.P_PID, self.pid, flags) is not None:
                        return True
                except ChildProcessError:  # reaped already (not by us): it has exited
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if fd >= 0:
                    select.select([fd], [], [], left)
                else:
                    time.sleep(min(left, 0.01))
        finally:
            if fd >= 0:
                os.close(fd)

    def end(self) -> int:
        """Kill the child's whole process group (SIGKILL), reap the child, close its pipes and
        remove its directory. Returns the child's status as ``Popen.returncode`` gives it (a
        child that had already exited keeps its own status). Idempotent."""
        if self._status is None:
            # The child is not reaped yet (only end() reaps it): its pid still names our group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            self._status = self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
            shutil.rmtree(self.cwd, ignore_errors=True)
        return self._status


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdin: int = DEVNULL,
    stdout: int = DEVNULL,
    stderr: int = DEVNULL,
    prefix: str = "wasihost-child-",
    pass_fds: Sequence[int] = (),
) -> Spawned:
    """Start ``argv`` as a walled child (see the module's docstring). ``env`` is added to the
    locale and time zone; ``stdin``/``stdout``/``stderr`` are ``PIPE``, ``DEVNULL`` or a
    descriptor of the caller's (the process runtime hands its channel socket as ``stdin``);
    ``pass_fds`` are the only other descriptors the child keeps. Raises OSError when the child
    cannot start (its directory is removed then)."""
    cwd = tempfile.mkdtemp(prefix=prefix)
    try:
        proc = subprocess.Popen(  # noqa: S603 - callers pass our own interpreter and script
            list(argv),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=child_env(env or {}),
            cwd=cwd,
            close_fds=True,
            pass_fds=tuple(pass_fds),
            start_new_session=True,
        )
    except BaseException:
        shutil.rmtree(cwd, ignore_errors=True)
        raise
    return Spawned(proc, cwd)
