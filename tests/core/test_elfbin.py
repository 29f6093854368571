"""The header reader of native plugins' executables (core/elfbin.py): facts from the committed
native fixtures, and clear refusals of everything else, each bounded."""

from __future__ import annotations

import struct

import pytest

from tests.support.common import FIXTURES
from wasihost.core.elfbin import (
    MAX_PROGRAM_HEADERS,
    ElfFormatError,
    native_problem,
    read_elf_header,
)

HELLO = (FIXTURES / "hello-native" / "hello-native").read_bytes()


def test_a_fixture_is_a_pie_for_x86_64_naming_glibcs_loader() -> None:
    header = read_elf_header(HELLO)
    assert (header.machine, header.kind, header.interpreter) == (
        "x86_64",
        "position-independent executable",
        "/lib64/ld-linux-x86-64.so.2",
    )
    assert native_problem(HELLO, "x86_64") is None
    assert "built for x86_64, and this host is aarch64" in (native_problem(HELLO, "aarch64") or "")


def _patched(offset: int, fmt: str, value: int) -> bytes:
    data = bytearray(HELLO)
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "not an ELF executable"),
        (b"\0asm\1\0\0\0" + b"\0" * 64, "WebAssembly module"),
        (HELLO[:4] + b"\1" + HELLO[5:], "not a 64-bit little-endian"),
        (_patched(16, "<H", 1), "not an executable"),  # ET_REL
        (_patched(56, "<H", MAX_PROGRAM_HEADERS + 1), "program headers, over"),
        (_patched(32, "<Q", len(HELLO)), "runs past the end"),
        (_patched(54, "<H", 8), "program headers of 8 bytes"),
        (HELLO[:200], "runs past the end"),
    ],
)
def test_malformed_executables_are_refused_saying_why(data: bytes, problem: str) -> None:
    with pytest.raises(ElfFormatError, match=problem):
        read_elf_header(data)


def test_an_interpreter_out_of_bounds_or_not_a_path_is_refused() -> None:
    header_at = struct.unpack_from("<Q", HELLO, 32)[0]
    count = struct.unpack_from("<H", HELLO, 56)[0]
    interp = next(
        header_at + i * 56 for i in range(count) if struct.unpack_from("<I", HELLO, header_at + i * 56)[0] == 3
    )
    too_far = _patched(interp + 8, "<Q", len(HELLO))
    with pytest.raises(ElfFormatError, match="out of bounds"):
        read_elf_header(too_far)
    offset = struct.unpack_from("<Q", HELLO, interp + 8)[0]
    relative = bytearray(HELLO)
    relative[offset : offset + 1] = b"l"
    with pytest.raises(ElfFormatError, match="not an absolute path"):
        read_elf_header(bytes(relative))
    other = bytearray(HELLO)
    other[offset + 1 : offset + 6] = b"usr/x"
    assert "may execute only /lib64/ld-linux-x86-64.so.2" in (native_problem(bytes(other), "x86_64") or "")
