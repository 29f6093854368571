"""Loading a package from disk: a directory with ``extension.toml`` and its module, or a bare
``.wasm`` file. Every file is read with a size bound and every path stays inside the package.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import attrs

from .errors import ManifestError, PackageError
from .manifest import Manifest, parse_manifest
from .wasmbin import MAX_MODULE_BYTES

MANIFEST_NAME = "extension.toml"
# Real manifests are a few hundred bytes; 64 KiB bounds what a hostile one makes us parse.
MAX_MANIFEST_BYTES = 64 * 1024


@attrs.frozen
class Package:
    """A package's manifest (absent for a bare module), its module bytes and their digest."""

    source: str
    manifest: Manifest | None
    wasm: bytes = attrs.field(repr=False)
    sha256: str

    @property
    def name(self) -> str:
        return self.manifest.id if self.manifest is not None else Path(self.source).stem


def _read_bounded(path: Path, limit: int, what: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise PackageError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise PackageError(f"{what} {path} cannot be opened: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise PackageError(f"{what} {path} is larger than {limit} bytes")
    return data


def manifest_text(root: Path) -> bytes:
    """The raw bytes of a package's manifest, bounded as when loading."""
    return _read_bounded(root / MANIFEST_NAME, MAX_MANIFEST_BYTES, "manifest")


def load_package(source: str | os.PathLike[str], known_capabilities: frozenset[str]) -> Package:
    """Load a package directory or a bare module; raise a specific error for anything wrong."""
    path = Path(source)
    if path.is_dir():
        text = _read_bounded(path / MANIFEST_NAME, MAX_MANIFEST_BYTES, "manifest")
        try:
            manifest = parse_manifest(text.decode("utf-8"), known_capabilities)
        except UnicodeDecodeError:
            raise ManifestError("", "manifest is not UTF-8") from None
        root = path.resolve()
        module_path = (root / manifest.module).resolve()
        if not module_path.is_relative_to(root):
            raise PackageError(f"module {manifest.module!r} resolves outside the package")
        wasm = _read_bounded(module_path, MAX_MODULE_BYTES, "module")
        digest = hashlib.sha256(wasm).hexdigest()
        if manifest.sha256 is not None and manifest.sha256 != digest:
            raise PackageError(
                f"module {manifest.module} has SHA-256 {digest}, "
                f"the manifest says {manifest.sha256}"
            )
        return Package(str(path), manifest, wasm, digest)
    if path.exists() and not path.is_file():
        raise PackageError(f"{path} is neither a package directory nor a module file")
    wasm = _read_bounded(path, MAX_MODULE_BYTES, "module")
    return Package(str(path), None, wasm, hashlib.sha256(wasm).hexdigest())
