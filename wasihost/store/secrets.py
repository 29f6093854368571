"""Secret stores: where the host keeps credentials that guests may use but never read.

A store maps a secret's *name* (the reference a guest holds) to its bytes, read afresh at each
use so that rotating or deleting a secret takes effect at once. Three stores:

- :class:`FileSecretStore`: one file per secret in a directory only the host's user can
  reach. The directory and each file are checked on their open handles (owner, mode, type)
  at every read, so a secret left readable by others, or swapped for a link, is refused
  rather than used.
- :class:`EnvSecretStore`: ``WASIHOST_SECRET_<NAME>`` variables of the host process.
- :class:`MemorySecretStore`: values the embedder fetched itself (from a vault, a keyring).

No store ever puts a value in an exception text, a ``repr`` or a log line.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from ..core.errors import ConfigError

# A name is a reference, shown in grant scopes and logs: short, lowercase, no path separators,
# so it can never name a file outside a FileSecretStore's directory.
SECRET_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
# API tokens, HMAC keys and passwords are tens to hundreds of bytes; 4 KiB holds a PEM private
# key. Anything bigger is a file, not a credential, and a read of it is refused.
MAX_SECRET_BYTES = 4096
ENV_PREFIX = "WASIHOST_SECRET_"
# Group or other access of any kind: a secret another user can read, or replace, is no secret.
_FOREIGN_ACCESS = 0o077


class SecretUnavailable(Exception):
    """A secret exists but may not be used (wrong owner or mode, too big, not a file). The text
    names the secret and the reason, never its value."""


def check_secret_name(name: object) -> str:
    if not isinstance(name, str) or not SECRET_NAME_RE.fullmatch(name):
        raise ConfigError(
            f"secret name {name!r} is not 1..64 of [a-z0-9_-] starting with a letter or digit"
        )
    return name


class SecretStore(Protocol):
    """Where the host reads secrets by name."""

    def read(self, name: str) -> bytes | None:
        """The secret's bytes, ``None`` if the store has no such secret; raises
        :class:`SecretUnavailable` if it has one that must not be used."""
        ...


class MemorySecretStore:
    """Secrets the embedder holds in memory; :meth:`set` and :meth:`delete` rotate them."""

    def __init__(self, secrets: Mapping[str, bytes | str] = ()) -> None:  # type: ignore[assignment]
        self._lock = threading.Lock()
        self._values: dict[str, bytes] = {}
        for name, value in dict(secrets).items():
            self.set(name, value)

    def set(self, name: str, value: bytes | str) -> None:
        check_secret_name(name)
        data = value.encode() if isinstance(value, str) else bytes(value)
        if not 0 < len(data) <= MAX_SECRET_BYTES:
            raise ConfigError(f"secret {name!r} must be 1..{MAX_SECRET_BYTES} bytes")
        with self._lock:
            self._values[name] = data

    def delete(self, name: str) -> None:
        with self._lock:
            self._values.pop(name, None)

    def read(self, name: str) -> bytes | None:
        with self._lock:
            return self._values.get(name)

    def __repr__(self) -> str:
        return f"MemorySecretStore({len(self._values)} secrets)"


class EnvSecretStore:
    """Secrets in the host's environment: ``api_token`` is ``WASIHOST_SECRET_API_TOKEN``.

    Only names of ``[a-z0-9_]`` map to variables (``a-b`` and ``a_b`` would otherwise both
    be ``A_B``); the environment is read at each use."""

    def __init__(self, prefix: str = ENV_PREFIX, environ: Mapping[str, str] | None = None) -> None:
        if not re.fullmatch(r"[A-Z][A-Z0-9_]{0,63}", prefix):
            raise ConfigError(f"secret variable prefix {prefix!r} is not [A-Z][A-Z0-9_]*")
        self.prefix = prefix
        self._environ = environ if environ is not None else os.environ

    def read(self, name: str) -> bytes | None:
        if "-" in name:
            return None
        value = self._environ.get(self.prefix + name.upper())
        if value is None:
            return None
        data = value.encode()
        if not 0 < len(data) <= MAX_SECRET_BYTES:
            raise SecretUnavailable(f"secret {name!r}: its variable is empty or over the bound")
        return data

    def __repr__(self) -> str:
        return f"EnvSecretStore(prefix={self.prefix!r})"


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & _FOREIGN_ACCESS


class FileSecretStore:
    """One file per secret, named as the secret, in ``directory``.

    The directory must be owned by the host's user with no group or other access (``0700``),
    and so must each file (``0600`` or ``0400``), a regular file, never a link. A trailing
    newline is not part of the secret (``echo token > file`` works)."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        fd = self._open_dir()
        os.close(fd)

    def _open_dir(self) -> int:
        try:
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(self.directory, flags)
        except OSError as exc:
            raise ConfigError(
                f"secret directory {self.directory}: {exc.strerror or exc} (it must be a real "
                "directory, not a link)"
            ) from None
        st = os.fstat(fd)
        if not _private(st):
            os.close(fd)
            raise ConfigError(
                f"secret directory {self.directory} must be owned by this user with mode 0700 "
                f"(it is mode {stat.S_IMODE(st.st_mode):04o}, uid {st.st_uid})"
            )
        return fd

    def read(self, name: str) -> bytes | None:
        check_secret_name(name)
        try:
            dir_fd = self._open_dir()
        except ConfigError as exc:
            raise SecretUnavailable(str(exc)) from None
        try:
            try:
                fd = os.open(
                    name,
                    os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                    dir_fd=dir_fd,
                )
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise SecretUnavailable(
                    f"secret {name!r}: {exc.strerror or exc} (a link is refused)"
                ) from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise SecretUnavailable(f"secret {name!r} is not a regular file")
                if not _private(st):
                    raise SecretUnavailable(
                        f"secret {name!r} must be owned by this user with mode 0600 or 0400 "
                        f"(it is mode {stat.S_IMODE(st.st_mode):04o})"
                    )
                data = os.read(fd, MAX_SECRET_BYTES + 2)
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)
        if data.endswith(b"\n"):
            data = data[:-1]
        if not 0 < len(data) <= MAX_SECRET_BYTES:
            raise SecretUnavailable(f"secret {name!r} is empty or over {MAX_SECRET_BYTES} bytes")
        return data

    def __repr__(self) -> str:
        return f"FileSecretStore({str(self.directory)!r})"
