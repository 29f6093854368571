"""Which paths a package may hold: short, relative, ASCII, normalised, one meaning only.

A name that passes :func:`check_name` is safe to join under an install directory on any
common file system: it cannot be absolute, climb with ``..``, carry a drive letter or a
backslash, or differ from another accepted name only by case.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

# The common file-name limit of POSIX file systems, applied to the whole path (the manifest's
# module path has the same bound).
MAX_NAME_CHARS: Final = 255
# Deeper trees are not packages people write; bounds the directories an install creates.
MAX_NAME_DEPTH: Final = 16
# The archive's own records live under this folder; no packed file may use it.
RESERVED_DIR: Final = ".whpkg"
# A package archive's file suffix. Here, with no heavy import, so that telling an archive from a
# directory or module (wasihost.packaging.package.is_archive) loads none of the archive or crypto
# code.
PACKAGE_SUFFIX: Final = ".whpkg"

# Portable file-name characters (POSIX's portable filename character set, plus "+"): nothing
# that a shell, a Windows path or a Unicode normalisation could read two ways.
_COMPONENT = re.compile(r"[A-Za-z0-9._+-]+")


class UnsafeName(ValueError):
    """A path a package may not hold; the message says why."""


def check_name(name: str) -> None:
    """Return if ``name`` is an acceptable package path; raise :class:`UnsafeName` if not."""
    if not name:
        raise UnsafeName("an empty name")
    if len(name) > MAX_NAME_CHARS:
        raise UnsafeName(f"a name longer than {MAX_NAME_CHARS} characters")
    if name.startswith("/"):
        raise UnsafeName(f"{quote(name)} is an absolute path")
    parts = name.split("/")
    if len(parts) > MAX_NAME_DEPTH:
        raise UnsafeName(f"{quote(name)} is nested deeper than {MAX_NAME_DEPTH} levels")
    for part in parts:
        if part in (".", ".."):
            raise UnsafeName(f"{quote(name)} has a {part!r} component")
        if not _COMPONENT.fullmatch(part):
            raise UnsafeName(
                f"{quote(name)} is not a plain relative path of letters, digits and ._+-"
            )


def check_unambiguous(names: Iterable[str]) -> None:
    """No two names that one file system could merge: equal after case folding, or one a
    file where another needs a directory."""
    folded: dict[str, str] = {}
    for name in names:
        key = name.casefold()
        if key in folded:
            raise UnsafeName(f"{quote(name)} and {quote(folded[key])} name the same file")
        folded[key] = name
    for key, name in folded.items():
        parts = key.split("/")
        for depth in range(1, len(parts)):
            prefix = "/".join(parts[:depth])
            if prefix in folded:
                raise UnsafeName(f"{quote(folded[prefix])} is a file and a folder of {quote(name)}")


# Messages quote at most this many characters of a name from an archive.
_QUOTE_CHARS: Final = 80


def quote(name: str) -> str:
    text = ascii(name)
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 3] + "..."
