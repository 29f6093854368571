"""The .whpkg reader: every hostile archive is refused with ArchiveError, nothing else, and
nothing is written anywhere while reading."""

from __future__ import annotations

import io
import stat
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.packages import REGULAR, hello_files, raw_zip, recorded_zip
from wasihost.core.errors import ArchiveError
from wasihost.packaging import archive, contents
from wasihost.packaging.archive import CONTENTS_NAME, read_archive, write_archive

SMALL = {"extension.toml": b"x = 1\n", "m.wasm": b"\0asm\1\0\0\0", "assets/a.txt": b"hi\n"}


def test_round_trip_is_deterministic_and_digest_names_the_record() -> None:
    data = write_archive(SMALL)
    assert write_archive(dict(reversed(SMALL.items()))) == data
    got = read_archive(data)
    assert dict(got.files) == SMALL
    assert got.signature is None
    assert got.record == contents.render(SMALL)


def test_the_hello_package_packs_and_reads(tmp_path: Path) -> None:
    files = hello_files(tmp_path)
    assert dict(read_archive(write_archive(files)).files) == files


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("../evil.txt", "'..' component"),
        ("a/../../evil.txt", "'..' component"),
        ("/etc/evil", "absolute path"),
        ("./a.txt", "'.' component"),
        ("a\\..\\evil.txt", "plain relative path"),
        ("C:evil.txt", "plain relative path"),
        ("a//b.txt", "plain relative path"),
        ("caf\u00e9.txt", "plain relative path"),
    ],
)
def test_path_traversal_and_odd_names_are_refused(name: str, fragment: str) -> None:
    data = raw_zip([(name, b"x")])
    with pytest.raises(ArchiveError, match=fragment):
        read_archive(data)


@pytest.mark.parametrize(
    ("mode", "fragment"),
    [
        (stat.S_IFLNK | 0o777, "symbolic link"),
        (stat.S_IFCHR | 0o666, "not a regular file"),
        (stat.S_IFIFO | 0o644, "not a regular file"),
    ],
)
def test_links_and_devices_are_refused(mode: int, fragment: str) -> None:
    data = recorded_zip(SMALL, [("link", b"/etc/passwd", mode << 16)])
    with pytest.raises(ArchiveError, match=fragment):
        read_archive(data)


def test_a_nul_in_a_name_is_refused() -> None:
    data = raw_zip([("a\x01b.txt", b"x")]).replace(b"a\x01b.txt", b"a\x00b.txt")
    with pytest.raises(ArchiveError, match="NUL byte"):
        read_archive(data)


def test_a_folder_entry_is_refused() -> None:
    with pytest.raises(ArchiveError, match="folder entry"):
        read_archive(recorded_zip(SMALL, [("assets/", b"", (stat.S_IFDIR | 0o755) << 16)]))


def test_duplicate_names_are_refused() -> None:
    data = recorded_zip(SMALL, [("m.wasm", b"other module", REGULAR)])
    with pytest.raises(ArchiveError, match="'m.wasm' appears more than once"):
        read_archive(data)


def test_names_one_file_system_would_merge_are_refused() -> None:
    with pytest.raises(ArchiveError, match="name the same file"):
        read_archive(recorded_zip(SMALL, [("M.WASM", b"x", REGULAR)]))
    with pytest.raises(ArchiveError, match="is a file and a folder"):
        read_archive(recorded_zip(SMALL, [("m.wasm/x", b"x", REGULAR)]))


def test_zip_bomb_is_refused_before_it_inflates() -> None:
    # 8 MiB of zeros deflate to about 8 KiB: a ratio near 1000, far over the bound.
    bomb = {**SMALL, "bomb.bin": bytes(8 * 1024 * 1024)}
    data = recorded_zip(bomb)
    assert len(data) < 64 * 1024
    with pytest.raises(ArchiveError, match="zip bomb"):
        read_archive(data)


def test_an_entry_lying_about_its_size_is_refused() -> None:
    data = bytearray(recorded_zip(SMALL))
    # Halve the declared size of the first entry in its central-directory record (offset 24
    # of the record): the inflated bytes no longer match, whatever zipfile makes of them.
    start = bytes(data).index(b"PK\x01\x02")
    size = int.from_bytes(data[start + 24 : start + 28], "little")
    data[start + 24 : start + 28] = (size // 2).to_bytes(4, "little")
    with pytest.raises(ArchiveError, match="not a readable zip archive"):
        read_archive(bytes(data))


@pytest.mark.parametrize("cut", [1, 22, 100, 0.5])
def test_truncated_archives_are_refused(cut: float) -> None:
    data = write_archive(SMALL)
    keep = int(len(data) * cut) if isinstance(cut, float) else len(data) - cut
    with pytest.raises(ArchiveError, match="truncated"):
        read_archive(data[:keep])


def test_bytes_before_or_after_the_archive_are_refused() -> None:
    data = write_archive(SMALL)
    with pytest.raises(ArchiveError, match="end record"):
        read_archive(data + b"trailer")
    with pytest.raises(ArchiveError, match="central directory does not end"):
        read_archive(b"#!/bin/sh\n" + data)


def test_a_forged_zip64_locator_is_refused() -> None:
    """zipfile would believe a zip64 record planted in the last entry's comment over the end
    record the reader checked; such an archive is refused before zipfile sees it."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr(CONTENTS_NAME, contents.render({}))
        zf.infolist()[-1].comment = b"PK\x06\x07" + bytes(16)
    with pytest.raises(ArchiveError, match="zip64 locator"):
        read_archive(out.getvalue())


def test_an_encrypted_entry_is_refused() -> None:
    data = bytearray(write_archive(SMALL))
    start = bytes(data).index(b"PK\x01\x02")
    data[start + 8] |= 0x1  # general-purpose flag bit 0 in the central directory
    with pytest.raises(ArchiveError, match="encrypted"):
        read_archive(bytes(data))


def test_other_compression_methods_are_refused() -> None:
    data = raw_zip([(CONTENTS_NAME, contents.render(SMALL))], compress=zipfile.ZIP_BZIP2)
    with pytest.raises(ArchiveError, match="compression method 12"):
        read_archive(data)


def test_a_file_added_to_the_archive_is_refused() -> None:
    with pytest.raises(ArchiveError, match="'extra.txt' is in the archive but not in its content"):
        read_archive(recorded_zip(SMALL, [("extra.txt", b"x", REGULAR)]))


def test_a_file_removed_from_the_archive_is_refused() -> None:
    entries = [(CONTENTS_NAME, contents.render(SMALL))]
    entries += [(n, d) for n, d in SMALL.items() if n != "m.wasm"]
    with pytest.raises(ArchiveError, match="'m.wasm' is in the content record but not in the"):
        read_archive(raw_zip(entries))


def test_a_tampered_file_is_refused() -> None:
    entries = [(CONTENTS_NAME, contents.render(SMALL))]
    entries += [(n, b"\0asm\1\0\0\0evil" if n == "m.wasm" else d) for n, d in SMALL.items()]
    with pytest.raises(ArchiveError, match="'m.wasm' has SHA-256"):
        read_archive(raw_zip(entries))


def test_an_archive_without_a_record_or_with_a_reserved_name_is_refused() -> None:
    with pytest.raises(ArchiveError, match="no content record"):
        read_archive(raw_zip(list(SMALL.items())))
    with pytest.raises(ArchiveError, match="reserved .whpkg/ folder"):
        read_archive(recorded_zip(SMALL, [(".whpkg/other", b"x", REGULAR)]))
    with pytest.raises(ArchiveError, match="reserved"):
        write_archive({**SMALL, ".whpkg/contents": b""})


def test_count_and_size_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archive, "MAX_FILES", 2)
    with pytest.raises(ArchiveError, match="entries, more than 4"):
        read_archive(recorded_zip(SMALL, [(f"f{i}", b"", REGULAR) for i in range(2)]))
    monkeypatch.setattr(archive, "MAX_FILES", 256)
    monkeypatch.setattr(archive, "MAX_FILE_BYTES", 1000)
    with pytest.raises(ArchiveError, match="'big' of 1001 bytes exceeds 1000"):
        read_archive(recorded_zip({**SMALL, "big": bytes(1001)}))
    monkeypatch.setattr(archive, "MAX_FILE_BYTES", 1 << 20)
    monkeypatch.setattr(archive, "MAX_TOTAL_BYTES", 200)
    with pytest.raises(ArchiveError, match="inflates to more than 200"):
        read_archive(recorded_zip(SMALL))


def test_reading_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for hostile in (
        raw_zip([("../evil.txt", b"x")]),
        recorded_zip(SMALL, [("link", b"/etc/passwd", (stat.S_IFLNK | 0o777) << 16)]),
    ):
        with pytest.raises(ArchiveError):
            read_archive(hostile)
    assert list(tmp_path.iterdir()) == []
    assert not (tmp_path.parent / "evil.txt").exists()


@given(
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=3),
    flips=st.lists(st.tuples(st.integers(0, 2000), st.integers(1, 255)), max_size=4),
)
def test_mangled_archives_fail_only_with_archive_error(
    cuts: list[int], flips: list[tuple[int, int]]
) -> None:
    data = bytearray(write_archive(SMALL))
    for at, mask in flips:
        data[at % len(data)] ^= mask
    for cut in cuts:
        del data[cut % max(len(data), 1) :]
    try:
        got = read_archive(bytes(data))
    except ArchiveError:
        return
    # Accepted only if it still is exactly the files the record lists (e.g. a flip inside a
    # field zipfile does not use).
    assert dict(got.files) == SMALL
