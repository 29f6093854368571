"""The header of a native plugin's executable (``runtime = "native-process"``): bytes in, facts out.

A native plugin ships an ELF executable where a Wasm extension ships a module. Admission reads
only what decides whether this host can start it at all, before anything runs: that it is a
64-bit little-endian ELF executable (or position-independent executable) for this host's
machine, and which program interpreter (dynamic loader) it names, if any. The launcher lets the
plugin's process execute that loader and nothing else (engine/launcher.py), so a plugin naming
another is refused here, with the reason, rather than failing in its child.

Everything is bounded: the program header table must lie inside the file, at most
``MAX_PROGRAM_HEADERS`` entries are read, and the interpreter's path is at most
``MAX_INTERPRETER_BYTES``. Pure: no I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

MAGIC: Final = b"\x7fELF"
# e_machine values for the machines wasihost runs on, by the name platform.machine() gives.
MACHINES: Final = {"x86_64": 62, "aarch64": 183}
# The program interpreter (glibc's dynamic loader) a plugin may name on each machine: the
# launcher lets a plugin's process execute this file, and read the libraries of LIBRARIES.
LOADERS: Final = {"x86_64": "/lib64/ld-linux-x86-64.so.2", "aarch64": "/lib/ld-linux-aarch64.so.1"}
# What a Rust executable built against glibc links (Rust's std needs libc and, to unwind,
# libgcc_s; libm for some float functions). A plugin needing another fails to start, saying so.
LIBRARIES: Final = ("libc.so.6", "libgcc_s.so.1", "libm.so.6")
_MACHINE_NAMES: Final = {number: name for name, number in MACHINES.items()}
# ET_EXEC and ET_DYN (a position-independent executable is ET_DYN).
_EXECUTABLE_TYPES: Final = {2: "executable", 3: "position-independent executable"}
PT_INTERP: Final = 3
# Linkers write a dozen program headers; a table of thousands is not an executable's.
MAX_PROGRAM_HEADERS: Final = 256
# /lib64/ld-linux-x86-64.so.2 is 27 bytes; PATH_MAX bounds any real one.
MAX_INTERPRETER_BYTES: Final = 4096
_HEADER_BYTES: Final = 64
_PROGRAM_HEADER_BYTES: Final = 56


class ElfFormatError(ValueError):
    """The bytes are not an executable this reader accepts; the message says why."""


@dataclass(frozen=True, slots=True)
class ElfHeader:
    """What admission needs of a native executable."""

    machine: str  # "x86_64", "aarch64", or "e_machine N" for one wasihost does not know
    kind: str  # "executable" or "position-independent executable"
    interpreter: str | None  # PT_INTERP's path; None for a statically linked executable


def is_elf(data: bytes) -> bool:
    return data[:4] == MAGIC


def read_elf_header(data: bytes) -> ElfHeader:
    """The header facts of ``data``, or :class:`ElfFormatError` naming the first problem."""
    if len(data) < _HEADER_BYTES or not is_elf(data):
        if data[:4] == b"\0asm":
            raise ElfFormatError(
                "it is a WebAssembly module, not a native executable: use runtime 'wasm' or "
                "'wasm-process' for it"
            )
        raise ElfFormatError("it is not an ELF executable (no \\x7fELF header)")
    if data[4] != 2 or data[5] != 1:
        raise ElfFormatError("it is not a 64-bit little-endian ELF file")
    if data[6] != 1:
        raise ElfFormatError(f"ELF version {data[6]}, not 1")
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    kind = _EXECUTABLE_TYPES.get(e_type)
    if kind is None:
        raise ElfFormatError(f"ELF type {e_type} is not an executable (a library or object file?)")
    (phoff,) = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    if phnum > MAX_PROGRAM_HEADERS:
        raise ElfFormatError(f"{phnum} program headers, over {MAX_PROGRAM_HEADERS}")
    if phnum and phentsize < _PROGRAM_HEADER_BYTES:
        raise ElfFormatError(f"program headers of {phentsize} bytes, under {_PROGRAM_HEADER_BYTES}")
    if phoff + phnum * phentsize > len(data):
        raise ElfFormatError("its program header table runs past the end of the file")
    interpreter = None
    for i in range(phnum):
        at = phoff + i * phentsize
        (p_type,) = struct.unpack_from("<I", data, at)
        if p_type != PT_INTERP:
            continue
        if interpreter is not None:
            raise ElfFormatError("it names two program interpreters")
        (offset,) = struct.unpack_from("<Q", data, at + 8)
        (size,) = struct.unpack_from("<Q", data, at + 32)
        if not 1 < size <= MAX_INTERPRETER_BYTES or offset + size > len(data):
            raise ElfFormatError("its program interpreter's path is out of bounds")
        raw = data[offset : offset + size]
        if raw[-1:] != b"\0" or b"\0" in raw[:-1]:
            raise ElfFormatError("its program interpreter's path is not one NUL-ended string")
        try:
            interpreter = raw[:-1].decode("ascii")
        except UnicodeDecodeError:
            raise ElfFormatError("its program interpreter's path is not ASCII") from None
        if not interpreter.startswith("/") or not interpreter.isprintable():
            raise ElfFormatError(f"its program interpreter {interpreter!r} is not an absolute path")
    machine = _MACHINE_NAMES.get(e_machine, f"e_machine {e_machine}")
    return ElfHeader(machine, kind, interpreter)


def native_problem(data: bytes, machine: str) -> str | None:
    """Why ``data`` cannot run as a native plugin on a host of ``machine``
    (platform.machine()), or None."""
    try:
        header = read_elf_header(data)
    except ElfFormatError as exc:
        return str(exc)
    if header.machine != machine:
        return f"it is built for {header.machine}, and this host is {machine}"
    loader = LOADERS.get(machine)
    if header.interpreter is not None and header.interpreter != loader:
        return (
            f"it names the program interpreter {header.interpreter}; a plugin's process may "
            f"execute only {loader or 'no loader on this machine'} (link it against glibc, or "
            "statically)"
        )
    return None
