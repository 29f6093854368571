"""Reading and writing the ``.whpkg`` archive: a zip file, bounded.

Why zip and not tar: a zip ends with a central directory that lists every entry's name, type,
sizes and compression before any data, so every entry is checked (and the whole archive
refused) before one byte is inflated; a tar must be walked entry by entry, and its gzip layer
has no sizes to check up front. Only stored and deflated entries are accepted.

An archive comes from whoever handed us the file, so :func:`read_archive` checks every bound
(archive size, entry count, central-directory size, per-file and total sizes, compression
ratio, declared and of the bytes actually read, entries that do not overlap), every name (see
:mod:`.names`), every entry type (regular files only: no links, devices or folders) and that
the files are exactly those of the content record with their recorded digests, before it
returns anything. It reads into memory and writes nothing; the only error that leaves it is
:class:`~wasihost.core.errors.ArchiveError`. zipfile reads the central directory; the entries'
data is read and inflated here, so what is counted is what is read.
"""

from __future__ import annotations

import hashlib
import io
import stat
import struct
import zipfile
import zlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import attrs

from ..core.errors import ArchiveError
from ..core.wasmbin import MAX_MODULE_BYTES
from . import contents
from .names import RESERVED_DIR, UnsafeName, check_name, check_unambiguous, quote

CONTENTS_NAME: Final = f"{RESERVED_DIR}/contents"
SIGNATURE_NAME: Final = f"{RESERVED_DIR}/signature"

# A package is a manifest, a module and a few assets; 256 files is far more than that and
# bounds the entries (and Python objects) a hostile archive makes us create.
MAX_FILES: Final = 256
# The largest module the host accepts is the largest file a package needs.
MAX_FILE_BYTES: Final = MAX_MODULE_BYTES
# The module plus 16 MiB of assets, inflated: bounds the memory one package takes to verify.
MAX_TOTAL_BYTES: Final = MAX_MODULE_BYTES + 16 * 1024 * 1024
# The archive file itself: stored (uncompressed) entries plus headers never exceed this.
MAX_ARCHIVE_BYTES: Final = MAX_TOTAL_BYTES + 1024 * 1024
# Apache POI refuses a zip entry that inflates more than 100 times (ZipSecureFile's default
# minimum inflate ratio of 0.01); wasm and text inflate 2 to 10 times.
MAX_COMPRESSION_RATIO: Final = 100
# Below this size an entry may inflate any amount: a few KiB of zeros are not a bomb.
RATIO_EXEMPT_BYTES: Final = 64 * 1024
# Each central-directory entry is 46 bytes plus its name, extra field and comment; 1 KiB per
# allowed entry is generous and bounds what zipfile parses before we see a single entry.
MAX_CENTRAL_DIRECTORY_BYTES: Final = (MAX_FILES + 2) * 1024
# The content record: one line of at most 64 + 1 + 11 + 1 + 255 + 1 characters per file.
MAX_CONTENTS_BYTES: Final = 64 + MAX_FILES * 333
# A signature record is a few lines of base64 (see signing.py).
MAX_SIGNATURE_BYTES: Final = 4096

_EOCD: Final = struct.Struct("<4s4H2LH")
_EOCD_MAGIC: Final = b"PK\x05\x06"
# zipfile looks for a zip64 locator in the 20 bytes before the end record and, if it finds
# one, trusts the zip64 record's sizes over the ones we checked; the last entry's comment or
# extra field can forge one there, so those bytes may not start with its signature.
_ZIP64_LOCATOR: Final = struct.Struct("<4sLQL")
_ZIP64_LOCATOR_MAGIC: Final = b"PK\x06\x07"
_ACCEPTED_METHODS: Final = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED})
_ENCRYPTED_FLAG: Final = 0x1
_UTF8_FLAG: Final = 0x800
# The general-purpose flags an entry may carry, those that do not change how its bytes are
# read: deflate's level hints (bits 1 and 2), a data descriptor after the data (bit 3) and a
# UTF-8 name (bit 11). Every other bit means bytes we would misread as plain data: traditional
# (bit 0) or strong (bit 6) encryption, compressed patch data (bit 5), a masked local header
# (bit 13), or something defined later.
_ACCEPTED_FLAGS: Final = 0x2 | 0x4 | 0x8 | _UTF8_FLAG
# A local file header: magic, version, flags, method, time, date, CRC, sizes, name and extra
# field lengths (its name and extra field follow, then the entry's data).
_LOCAL_HEADER: Final = struct.Struct("<4s5H3L2H")
_LOCAL_MAGIC: Final = b"PK\x03\x04"
# Compressed bytes given to the inflater at a time: the ratio is checked after each.
_INFLATE_CHUNK: Final = 64 * 1024
# What zipfile (and zlib under it) raises on bytes it cannot read.
_ZIP_FAILURES: Final = (
    zipfile.BadZipFile,
    zlib.error,
    EOFError,
    OSError,
    ValueError,
    NotImplementedError,
    RuntimeError,
)
# A fixed timestamp (zip's epoch) so that one set of files always packs to the same bytes.
_ZIP_EPOCH: Final = (1980, 1, 1, 0, 0, 0)
_REGULAR_FILE_ATTR: Final = (stat.S_IFREG | 0o644) << 16
_UNIX: Final = 3


@attrs.frozen
class Archive:
    """A verified archive: the packed files, their content record and signature (if any).

    ``digest`` is the package digest, the SHA-256 of the content record."""

    files: Mapping[str, bytes] = attrs.field(repr=False)
    record: bytes = attrs.field(repr=False)
    signature: bytes | None = attrs.field(repr=False)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.record).hexdigest()


def read_archive(data: bytes) -> Archive:
    """Check and read a ``.whpkg``; raise :class:`ArchiveError` for anything wrong."""
    return _match_record(_read_entries(data))


def _read_entries(data: bytes) -> dict[str, bytes]:
    """Every entry of the zip ``data`` by name, each checked and inflated here (not yet
    matched against the content record)."""
    if len(data) > MAX_ARCHIVE_BYTES:
        raise ArchiveError(f"archive of {len(data)} bytes exceeds {MAX_ARCHIVE_BYTES}")
    count, cd_offset = _check_end_record(data)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            infos = zf.infolist()
        if len(infos) != count:
            raise ArchiveError(
                f"central directory holds {len(infos)} entries, its end record says {count}"
            )
        _check_entries(infos)
        spans = _entry_spans(data, infos, cd_offset)
        raw = {info.filename: _read_entry(data, info, spans[info.filename]) for info in infos}
    except _ZIP_FAILURES as exc:
        raise ArchiveError(f"not a readable zip archive: {exc}") from None
    return raw


def _check_end_record(data: bytes) -> tuple[int, int]:
    """The end-of-central-directory record must be the archive's last 22 bytes (no comment),
    describe one disk, and have the central directory end exactly where it starts: so no
    zip64 records, no prepended or appended bytes, and zipfile reads what we checked. Returns
    the entry count and where the central directory starts (where entry data must end)."""
    if len(data) < _EOCD.size or data[-_EOCD.size : -_EOCD.size + 4] != _EOCD_MAGIC:
        raise ArchiveError(
            "no zip end record at the end of the file (truncated, or not a .whpkg archive)"
        )
    (_, disk, cd_disk, on_disk, total, cd_size, cd_offset, comment) = _EOCD.unpack(
        data[-_EOCD.size :]
    )
    locator = len(data) - _EOCD.size - _ZIP64_LOCATOR.size
    if locator >= 0 and data[locator : locator + 4] == _ZIP64_LOCATOR_MAGIC:
        raise ArchiveError("archive has a zip64 locator; a .whpkg is never zip64")
    if comment != 0 or disk != 0 or cd_disk != 0 or on_disk != total:
        raise ArchiveError("zip end record describes a comment or several disks")
    if total > MAX_FILES + 2:
        raise ArchiveError(f"archive holds {total} entries, more than {MAX_FILES + 2}")
    if cd_size > MAX_CENTRAL_DIRECTORY_BYTES:
        raise ArchiveError(
            f"central directory of {cd_size} bytes exceeds {MAX_CENTRAL_DIRECTORY_BYTES}"
        )
    if cd_offset + cd_size != len(data) - _EOCD.size:
        raise ArchiveError(
            "central directory does not end where the end record starts "
            "(truncated, extended, or a zip64 archive)"
        )
    return int(total), int(cd_offset)


def _check_entries(infos: list[zipfile.ZipInfo]) -> None:
    total = 0
    for info in infos:
        name = info.filename
        if info.orig_filename != name:
            raise ArchiveError(f"entry name {quote(info.orig_filename)} holds a NUL byte")
        if not name:
            # Before anything asks zipfile about the name: ZipInfo.is_dir reads its last
            # character, and an empty name left the reader with an IndexError.
            raise ArchiveError("an entry has an empty name (pack the archive again)")
        if info.is_dir():
            raise ArchiveError(f"entry {quote(name)} is a folder entry")
        mode = info.external_attr >> 16
        if mode and not stat.S_ISREG(mode):
            kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
            raise ArchiveError(f"entry {quote(name)} is {kind}")
        try:
            check_name(name)
        except UnsafeName as exc:
            raise ArchiveError(f"entry name refused: {exc}") from None
        _check_flags(name, info.flag_bits)
        if info.compress_type not in _ACCEPTED_METHODS:
            raise ArchiveError(
                f"entry {quote(name)} uses compression method {info.compress_type}; "
                "only stored and deflated are accepted"
            )
        if info.file_size > MAX_FILE_BYTES:
            raise ArchiveError(
                f"entry {quote(name)} of {info.file_size} bytes exceeds {MAX_FILE_BYTES}"
            )
        if (
            info.file_size > RATIO_EXEMPT_BYTES
            and info.file_size > info.compress_size * MAX_COMPRESSION_RATIO
        ):
            raise ArchiveError(
                f"entry {quote(name)} inflates {info.compress_size} bytes to {info.file_size}, "
                f"more than {MAX_COMPRESSION_RATIO} times (a zip bomb?)"
            )
        total += info.file_size
        if total > MAX_TOTAL_BYTES:
            raise ArchiveError(f"archive inflates to more than {MAX_TOTAL_BYTES} bytes")
    names = [info.filename for info in infos]
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise ArchiveError(f"entry {quote(duplicate)} appears more than once")
    try:
        check_unambiguous(names)
    except UnsafeName as exc:
        raise ArchiveError(f"entry names refused: {exc}") from None


def _check_flags(name: str, flags: int) -> None:
    if flags & _ENCRYPTED_FLAG:
        raise ArchiveError(f"entry {quote(name)} is encrypted")
    unknown = flags & ~_ACCEPTED_FLAGS
    if unknown:
        raise ArchiveError(
            f"entry {quote(name)} has zip flags {unknown:#06x} set (encryption, patch data or "
            "a masked header): only plain stored or deflated entries are accepted; "
            "pack it again with `wasihost pack`"
        )


def _entry_spans(
    data: bytes, infos: list[zipfile.ZipInfo], cd_offset: int
) -> dict[str, tuple[int, int]]:
    """Where each entry's compressed bytes are (start, end), from its local header, which must
    name the entry and its method as the central directory does. The entries' local headers
    and data may not overlap one another nor the central directory: each byte of the archive
    is read for one entry at most, so the compressed bytes the ratio rule counts are distinct
    bytes of the file (entries sharing one deflate stream made a small archive inflate to the
    total bound)."""
    spans: dict[str, tuple[int, int]] = {}
    taken_to = 0
    for info in sorted(infos, key=lambda i: i.header_offset):
        name, at = info.filename, info.header_offset
        if at < taken_to or at + _LOCAL_HEADER.size > cd_offset:
            raise ArchiveError(f"entry {quote(name)} overlaps another entry or the directory")
        (magic, _, flags, method, _, _, _, _, _, name_len, extra_len) = _LOCAL_HEADER.unpack_from(
            data, at
        )
        start = at + _LOCAL_HEADER.size + name_len + extra_len
        local_name = data[at + _LOCAL_HEADER.size : at + _LOCAL_HEADER.size + name_len]
        encoding = "utf-8" if flags & _UTF8_FLAG else "cp437"
        if (
            magic != _LOCAL_MAGIC
            or local_name.decode(encoding, errors="replace") != info.orig_filename
            or method != info.compress_type
        ):
            raise ArchiveError(
                f"entry {quote(name)}: its local header does not match its directory record"
            )
        _check_flags(name, flags)
        end = start + info.compress_size
        if end > cd_offset:
            raise ArchiveError(f"entry {quote(name)} overlaps another entry or the directory")
        spans[name] = (start, end)
        taken_to = end
    return spans


def _read_entry(data: bytes, info: zipfile.ZipInfo, span: tuple[int, int]) -> bytes:
    """The entry's bytes, inflated here rather than by zipfile: its compressed size must be
    exactly its deflate stream (zipfile stops at the stream's end and ignores what follows,
    so a declared size padded past a tiny stream passed the ratio rule), and the ratio is
    bounded by the compressed bytes read so far at each step, so a bomb stops early."""
    name = info.filename
    compressed = data[span[0] : span[1]]
    if info.compress_type == zipfile.ZIP_STORED:
        inflated = compressed
    else:
        inflated = _inflate(compressed, info)
    if len(inflated) != info.file_size:
        raise ArchiveError(
            f"not a readable zip archive: entry {quote(name)} holds {len(inflated)} bytes, "
            f"its header says {info.file_size}"
        )
    if zlib.crc32(inflated) != info.CRC:
        raise ArchiveError(f"not a readable zip archive: entry {quote(name)} fails its CRC")
    return inflated


def _inflate(compressed: bytes, info: zipfile.ZipInfo) -> bytes:
    name = info.filename
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    parts: list[bytes] = []
    produced = given = 0
    pending = b""
    while not inflater.eof:
        if not pending and given < len(compressed):
            pending = compressed[given : given + _INFLATE_CHUNK]
            given += len(pending)
        # At most a byte past what the ratio allows for the bytes given so far, or past the
        # declared size: either is refused below, before anything more is inflated.
        allowed = min(max(RATIO_EXEMPT_BYTES, given * MAX_COMPRESSION_RATIO), info.file_size)
        piece = inflater.decompress(pending, max(allowed + 1 - produced, 1))
        pending = inflater.unconsumed_tail
        if not piece and not pending and given >= len(compressed) and not inflater.eof:
            raise ArchiveError(
                f"not a readable zip archive: entry {quote(name)}'s deflate stream is truncated"
            )
        parts.append(piece)
        produced += len(piece)
        if produced > info.file_size:
            raise ArchiveError(
                f"not a readable zip archive: entry {quote(name)} inflates to more than its "
                f"header's {info.file_size} bytes"
            )
        _check_ratio(name, produced, given)
    read = given - len(inflater.unused_data)
    if read != len(compressed):
        raise ArchiveError(
            f"entry {quote(name)}'s deflate stream is {read} bytes, its header says "
            f"{len(compressed)}: the rest would count toward its compression ratio unread"
        )
    _check_ratio(name, produced, read)
    return b"".join(parts)


def _check_ratio(name: str, inflated: int, read: int) -> None:
    if inflated > RATIO_EXEMPT_BYTES and inflated > read * MAX_COMPRESSION_RATIO:
        raise ArchiveError(
            f"entry {quote(name)} inflates {read} bytes read to {inflated}, more than "
            f"{MAX_COMPRESSION_RATIO} times (a zip bomb?)"
        )


def _match_record(raw: dict[str, bytes]) -> Archive:
    record = raw.pop(CONTENTS_NAME, None)
    if record is None:
        raise ArchiveError(f"archive has no content record ({CONTENTS_NAME})")
    if len(record) > MAX_CONTENTS_BYTES:
        raise ArchiveError(f"content record of {len(record)} bytes exceeds {MAX_CONTENTS_BYTES}")
    signature = raw.pop(SIGNATURE_NAME, None)
    if signature is not None and len(signature) > MAX_SIGNATURE_BYTES:
        raise ArchiveError(f"signature of {len(signature)} bytes exceeds {MAX_SIGNATURE_BYTES}")
    try:
        entries = contents.parse(record)
    except contents.ContentsError as exc:
        raise ArchiveError(str(exc)) from None
    for name in sorted(raw):
        if name.split("/", 1)[0] == RESERVED_DIR:
            raise ArchiveError(f"entry {quote(name)} is in the reserved {RESERVED_DIR}/ folder")
        if name not in entries:
            raise ArchiveError(
                f"file {quote(name)} is in the archive but not in its content record"
            )
    for name, entry in entries.items():
        data = raw.get(name)
        if data is None:
            raise ArchiveError(
                f"file {quote(name)} is in the content record but not in the archive"
            )
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != entry.size or digest != entry.sha256:
            raise ArchiveError(
                f"file {quote(name)} has SHA-256 {digest} ({len(data)} bytes), "
                f"the content record says {entry.sha256} ({entry.size} bytes)"
            )
    return Archive(MappingProxyType(raw), record, signature)


def write_archive(files: Mapping[str, bytes], signature: bytes | None = None) -> bytes:
    """The archive of ``files`` with their content record (and ``signature``): deterministic,
    and checked by :func:`read_archive` before it is returned, so that what we write we
    would also accept."""
    for name in files:
        try:
            check_name(name)
        except UnsafeName as exc:
            raise ArchiveError(f"cannot pack: {exc}") from None
        if name.split("/", 1)[0] == RESERVED_DIR:
            raise ArchiveError(f"cannot pack {quote(name)}: {RESERVED_DIR}/ is reserved")
    entries = [(CONTENTS_NAME, contents.render(files))]
    entries += [(name, files[name]) for name in sorted(files)]
    if signature is not None:
        entries.append((SIGNATURE_NAME, signature))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = _UNIX
            info.external_attr = _REGULAR_FILE_ATTR
            zf.writestr(info, data)
    result = out.getvalue()
    read_archive(result)
    return result
