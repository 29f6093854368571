"""The file-system side of packaging: packing a directory, reading and writing archives and
key files. Everything else in this subpackage works on bytes."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from ..core.errors import ArchiveError, ConfigError
from .archive import MAX_ARCHIVE_BYTES, MAX_FILE_BYTES, MAX_FILES, MAX_TOTAL_BYTES
from .names import PACKAGE_SUFFIX as _SUFFIX
from .names import RESERVED_DIR, UnsafeName, check_name
from .regular_files import open_regular, read_fd
from .trust import MAX_KEY_FILE_BYTES, SigningKey

# Defined in .names (which imports nothing heavy); kept here for code that takes it from here.
PACKAGE_SUFFIX = _SUFFIX
_CREATE_SECRET = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# The private key is the publisher's alone: owner read/write, as ssh-keygen writes its keys.
PRIVATE_KEY_MODE = 0o600
PUBLIC_KEY_MODE = 0o644


def _read_fd_bounded(fd: int, limit: int, what: str) -> bytes:
    try:
        data = read_fd(fd, limit)
    except OSError as exc:
        raise ArchiveError(f"{what} cannot be read: {exc.strerror}") from None
    if len(data) > limit:
        raise ArchiveError(f"{what} is larger than {limit} bytes")
    return data


def pack_directory(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` by its relative path; links and special files are
    refused (a package holds plain files only), as are names the archive would refuse."""
    if not root.is_dir():
        raise ArchiveError(f"{root} is not a directory")
    files: dict[str, bytes] = {}
    total = 0
    for folder, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for entry in [*dirs, *names]:
            path = Path(folder, entry)
            rel = path.relative_to(root).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise ArchiveError(f"cannot pack {rel}: a symbolic link (packages hold files)")
            if rel.split("/", 1)[0] == RESERVED_DIR:
                raise ArchiveError(f"cannot pack {rel}: {RESERVED_DIR}/ is reserved")
            try:
                check_name(rel)
            except UnsafeName as exc:
                raise ArchiveError(f"cannot pack: {exc}") from None
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise ArchiveError(f"cannot pack {rel}: not a regular file")
            if len(files) == MAX_FILES:
                raise ArchiveError(f"cannot pack {root}: more than {MAX_FILES} files")
            try:
                fd = open_regular(path)  # it may have changed since the lstat
            except OSError as exc:
                raise ArchiveError(f"cannot pack {rel}: {exc.strerror}") from None
            data = _read_fd_bounded(fd, MAX_FILE_BYTES, f"file {rel}")
            total += len(data)
            if total > MAX_TOTAL_BYTES:
                raise ArchiveError(f"cannot pack {root}: more than {MAX_TOTAL_BYTES} bytes")
            files[rel] = data
    return files


def read_package_file(path: Path) -> bytes:
    """A ``.whpkg``'s bytes, bounded before they are parsed."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        raise ArchiveError(f"package {path} does not exist") from None
    except OSError as exc:
        raise ArchiveError(f"package {path} cannot be opened: {exc.strerror}") from None
    return _read_fd_bounded(fd, MAX_ARCHIVE_BYTES, f"package {path}")


def write_package_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ConfigError(f"cannot write {path}: {exc.strerror}") from None


def _create(path: Path, mode: int, text: str) -> None:
    fd = os.open(path, _CREATE_SECRET, mode)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        os.fchmod(f.fileno(), mode)  # the umask may only have lowered it; say it exactly
        f.write(text)


def write_key_pair(prefix: str, key: SigningKey) -> tuple[Path, Path]:
    """``PREFIX.key`` (0600, never overwriting) and ``PREFIX.pub``; neither is left alone."""
    private, public = Path(prefix + ".key"), Path(prefix + ".pub")
    for path in (private, public):
        if os.path.lexists(path):
            raise ConfigError(f"{path} exists: keygen never overwrites a key")
    try:
        _create(private, PRIVATE_KEY_MODE, key.private_text())
    except OSError as exc:
        raise ConfigError(f"cannot create {private}: {exc.strerror}") from None
    try:
        _create(public, PUBLIC_KEY_MODE, key.public_line())
    except OSError as exc:
        private.unlink()
        raise ConfigError(f"cannot create {public}: {exc.strerror}") from None
    return private, public


def read_signing_key(path: Path) -> SigningKey:
    """A private key file; like ssh, refused if others may read it."""
    try:
        fd = open_regular(path)
    except OSError as exc:
        raise ConfigError(f"key file {path} cannot be opened: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if mode & 0o077:
        os.close(fd)
        error = ConfigError(f"key file {path} is readable by others (mode {mode & 0o777:o})")
        error.hint = f"chmod 600 {path}"
        raise error
    try:
        data = _read_fd_bounded(fd, MAX_KEY_FILE_BYTES, f"key file {path}")
        text = data.decode("ascii")
    except (ArchiveError, UnicodeDecodeError):
        raise ConfigError(f"key file {path} is not a wasihost key file") from None
    return SigningKey.parse(text, str(path))
