"""Helpers for the .whpkg tests: the hello fixture with a publisher, keys, hostile zips."""

from __future__ import annotations

import hashlib
import io
import shutil
import stat
import warnings
import zipfile
from pathlib import Path

from tests.support.common import FIXTURES
from wasihost.packaging import contents, signing
from wasihost.packaging.archive import CONTENTS_NAME, SIGNATURE_NAME, write_archive
from wasihost.packaging.files import pack_directory
from wasihost.packaging.package import identity
from wasihost.packaging.trust import SigningKey, TrustStore

PUBLISHER = "acme.example"
REGULAR = (stat.S_IFREG | 0o644) << 16


def hello_dir(tmp: Path, *, version: str = "0.1.0", publisher: str | None = PUBLISHER) -> Path:
    """A copy of fixtures/hello declaring ``publisher`` and ``version``."""
    root = tmp / f"hello-{version}-{publisher}"
    shutil.copytree(FIXTURES / "hello", root)
    text = (root / "extension.toml").read_text()
    line = f'version = "{version}"'
    if publisher is not None:
        line += f'\npublisher = "{publisher}"'
    (root / "extension.toml").write_text(text.replace('version = "0.1.0"', line))
    return root


def hello_files(tmp: Path, **kwargs: str | None) -> dict[str, bytes]:
    return pack_directory(hello_dir(tmp, **kwargs))


def signature_for(files: dict[str, bytes], key: SigningKey) -> bytes:
    """The signature record ``wasihost sign`` would add to the archive of ``files``."""
    from wasihost.core.manifest import parse_manifest
    from wasihost.host.defaults import default_registry

    manifest = parse_manifest(files["extension.toml"].decode(), default_registry().capabilities())
    module = hashlib.sha256(files[manifest.module]).hexdigest()
    digest = hashlib.sha256(contents.render(files)).hexdigest()
    return signing.sign(identity(manifest, module), digest, key)


def signed_archive(files: dict[str, bytes], key: SigningKey) -> bytes:
    return write_archive(files, signature_for(files, key))


def trust_of(*keys: SigningKey) -> TrustStore:
    return TrustStore.parse("".join(k.public_line() for k in keys))


def raw_zip(
    entries: list[tuple[str, bytes]] | list[tuple[str, bytes, int]],
    *,
    compress: int = zipfile.ZIP_DEFLATED,
) -> bytes:
    """A zip of exactly ``entries`` (name, data[, external_attr]) with no checks at all."""
    out = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate names we want
        with zipfile.ZipFile(out, "w") as zf:
            for entry in entries:
                name, data = entry[0], entry[1]
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = compress
                info.create_system = 3
                info.external_attr = entry[2] if len(entry) == 3 else REGULAR  # type: ignore[misc]
                zf.writestr(info, data)
    return out.getvalue()


def recorded_zip(
    files: dict[str, bytes], extra: list[tuple[str, bytes, int]] | None = None
) -> bytes:
    """A zip holding ``files`` and their correct content record, plus ``extra`` entries the
    record may not list: the hostile archive a careless reader would accept."""
    entries: list[tuple[str, bytes, int]] = [(CONTENTS_NAME, contents.render(files), REGULAR)]
    entries += [(n, d, REGULAR) for n, d in sorted(files.items())]
    return raw_zip(entries + (extra or []))


__all__ = ["CONTENTS_NAME", "SIGNATURE_NAME"]
