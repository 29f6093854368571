"""Make a plain command say when its memory could not grow.

A ``memory.grow`` past the store's limit answers -1 to the guest and tells the host nothing
(wasmtime's limiter has no callback in the C API): the program's allocator returns NULL and it
dies in its own words ("Out of memory", a Rust ``unreachable`` after "memory allocation of N
bytes failed"), with no word of the limit that caused it. So before a plain command is compiled,
each of its ``memory.grow`` instructions becomes a call of one function appended to the module,
which grows the memory as the instruction would and, when the grow was refused, records the size
it asked for in an exported global. After a failed run the host reads that global and names the
limit (``Instance.refused_memory_bytes``). What the guest sees is unchanged: the same result
from the same grow, a few more instructions paid from its fuel.

Bytes in, bytes out, and the caller's validator says which modules the engine accepts: only a
module that validates is rewritten, and the rewrite is kept only if it validates too. The probe's
function and global take the next free indices, so in a module that does not validate a
``call``, ``ref.func`` or ``global.set`` of those indices would have become a valid call of the
probe or a write of its global (a forged refusal, a broken module compiled); a valid module
cannot name them. A module it cannot rewrite (no memory.grow, a grow of another memory, a
64-bit memory, no type, function, code or export section, an export of the probe's name) is
returned as it is, and the host then reads no refusal from it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

# Sizes and counts are read as the header scan reads a u32 (at most 5 bytes, below 2^32): the
# rewrite encodes them anew, so a longer encoding, refused by the compiler as it stands, would
# come out repaired.
from .wasmbin import PAGE_BYTES, WasmFormatError, read_header, read_u32

if TYPE_CHECKING:
    from .wasmbin import ModuleHeader

# Where the probe's global is exported: a name no toolchain emits (the ':' is unusual in export
# names). A module that exports it already is not probed.
GROW_REFUSED_EXPORT = "wasihost:memory-grow-refused"

_TYPE, _FUNCTION, _GLOBAL, _EXPORT, _CODE = 1, 3, 6, 7, 10
_EXPORT_GLOBAL = 3
_CALL = 0x10
# The appended function's type, (i32) -> i32 as memory.grow's of a 32-bit memory, and its
# global: a mutable i64 initialised to 0 (no refusal), the pages the last refused grow asked
# for otherwise.
_FUNC_TYPE = b"\x60\x01\x7f\x01\x7f"
_GLOBAL_I64_ZERO = b"\x7e\x01\x42\x00\x0b"


def _uleb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _grow_function(global_index: int) -> bytes:
    """The body that replaces each ``memory.grow 0``: grow by the argument, and when that
    answered -1, record the pages asked for (memory.size + delta, as unsigned 64-bit)."""
    code = (
        b"\x01\x01\x7f"  # one local: the grow's result (i32)
        b"\x20\x00\x40\x00\x22\x01"  # local.get 0; memory.grow 0; local.tee 1
        b"\x41\x7f\x46\x04\x40"  # i32.const -1; i32.eq; if
        b"\x3f\x00\xad\x20\x00\xad\x7c"  # memory.size; extend_u; local.get 0; extend_u; add
        + b"\x24"
        + _uleb(global_index)  # global.set
        + b"\x0b\x20\x01\x0b"  # end; local.get 1; end
    )
    return _uleb(len(code)) + code


def _append(payload: bytes, item: bytes) -> bytes:
    """A vector section's payload with one more item at its end."""
    count, rest = read_u32(payload, 0)
    return _uleb(count + 1) + payload[rest:] + item


def _sections(wasm: bytes) -> list[tuple[int, bytes]]:
    sections = []
    pos = 8
    while pos < len(wasm):
        section_id = wasm[pos]
        size, start = read_u32(wasm, pos + 1)
        if start + size > len(wasm):
            raise _Malformed  # re-framed, a truncated section would read as a whole one
        sections.append((section_id, wasm[start : start + size]))
        pos = start + size
    return sections


class _Malformed(Exception):
    """The module is not one the probe can rewrite faithfully: it is compiled as it is, and
    the compiler refuses it."""


class _OverShape(Exception):
    """The rewrite would cross a limit of admission's shape scan (``codeshape``) that the
    module is within: the probe's one more function, or calls longer than the grows they
    replace (a function index past 127 takes two LEB bytes) in a body or code section at its
    limit. The module is compiled as it is: the rewrite must not make it refused."""


def _count(sections: list[tuple[int, bytes]], section_id: int) -> int:
    for sid, payload in sections:
        if sid == section_id:
            return read_u32(payload, 0)[0]
    return 0


def probe_refused_grows(
    wasm: bytes, header: ModuleHeader, validates: Callable[[bytes], bool]
) -> bytes:
    """``wasm`` with every ``memory.grow`` of memory 0 recording its refusals in the global
    exported as :data:`GROW_REFUSED_EXPORT`; ``wasm`` itself when there is nothing to probe,
    when ``validates`` (the engine's validation, under the configuration that will compile
    it) refuses ``wasm`` or would refuse the rewrite, or when its sections or code are
    malformed. This runs before the compiler: a rewrite must never turn a broken module into
    one that compiles, nor a module that compiles into one that does not (a limit of the
    engine's, such as its most globals, may be reached by the probe's one more)."""
    # The code walker only where a command is compiled: the engine imports this module for
    # the export's name, and a warm `wasihost run` loads no code scanner.
    from .codeshape import CodeShapeError

    if any(e.name == GROW_REFUSED_EXPORT for e in header.exports):
        return wasm
    try:
        probed = _probe(wasm, header)
    except (_Malformed, _OverShape, IndexError, CodeShapeError, WasmFormatError):
        return wasm
    if probed is wasm or not validates(wasm) or not validates(probed):
        return wasm
    try:
        # The header scan's own limits (module bytes, entries of a section, value types of
        # the type section) hold for the module: the probe's one more must not cross them.
        read_header(probed)
    except WasmFormatError:
        return wasm
    return probed


def _probe(wasm: bytes, header: ModuleHeader) -> bytes:
    sections = _sections(wasm)
    present = {sid for sid, _ in sections}
    memories = header.imported_memories + header.memories
    # A 64-bit memory's grow takes and answers an i64 (admission refuses such memories; the
    # probe's (i32) -> i32 made a valid module one that failed to validate).
    if not memories or memories[0].is_64 or not {_TYPE, _FUNCTION, _CODE, _EXPORT} <= present:
        return wasm
    from .codeshape import grow_sites

    code = next(payload for sid, payload in sections if sid == _CODE)
    sites = grow_sites(code)
    if not any(sites):
        return wasm
    from .codeshape import MAX_FUNCTIONS

    if _count(sections, _FUNCTION) >= MAX_FUNCTIONS:
        return wasm  # the probe's one more would be over admission's limit
    functions = sum(1 for i in header.imports if i.kind == "func") + _count(sections, _FUNCTION)
    global_index = sum(1 for i in header.imports if i.kind == "global") + _count(sections, _GLOBAL)
    type_index = _count(sections, _TYPE)
    call = bytes([_CALL]) + _uleb(functions)
    out: list[tuple[int, bytes]] = []
    for sid, payload in sections:
        if sid == _EXPORT and _GLOBAL not in present:
            out.append((_GLOBAL, _uleb(1) + _GLOBAL_I64_ZERO))
        out.append((sid, _probed_section(sid, payload, sites, call, type_index, global_index)))
    return wasm[:8] + b"".join(bytes([sid]) + _uleb(len(p)) + p for sid, p in out)


def _probed_section(
    sid: int,
    payload: bytes,
    sites: list[list[tuple[int, int]]],
    call: bytes,
    type_index: int,
    global_index: int,
) -> bytes:
    """One section of the probed module: the probe's type, function, global and export
    appended where they belong, its grows made calls; any other section as it was."""
    if sid == _TYPE:
        return _append(payload, _FUNC_TYPE)
    if sid == _FUNCTION:
        return _append(payload, _uleb(type_index))
    if sid == _GLOBAL:
        return _append(payload, _GLOBAL_I64_ZERO)
    if sid == _EXPORT:
        name = GROW_REFUSED_EXPORT.encode()
        return _append(
            payload, _uleb(len(name)) + name + bytes([_EXPORT_GLOBAL]) + _uleb(global_index)
        )
    if sid == _CODE:
        from .codeshape import MAX_CODE_BYTES

        code = _append(_rewrite_code(payload, sites, call), _grow_function(global_index))
        if len(code) > MAX_CODE_BYTES:
            raise _OverShape  # a call may be longer than the grow it replaces
        return code
    return payload


def _rewrite_code(code: bytes, sites: list[list[tuple[int, int]]], call: bytes) -> bytes:
    """The code section's payload with each site (offset and length of a ``memory.grow 0``
    within its body) replaced by ``call``, and each body's size written anew."""
    from .codeshape import MAX_FUNCTION_BODY_BYTES

    count, i = read_u32(code, 0)
    bodies = [_uleb(count)]
    for body_sites in sites:
        size, start = read_u32(code, i)
        body = code[start : start + size]
        i = start + size
        if body_sites:
            parts = []
            last = 0
            for offset, length in body_sites:
                parts += [body[last:offset], call]
                last = offset + length
            parts.append(body[last:])
            body = b"".join(parts)
            if len(body) > MAX_FUNCTION_BODY_BYTES:
                raise _OverShape
        bodies += [_uleb(len(body)), body]
    if i != len(code):
        raise _Malformed  # bytes after the last body would be dropped
    return b"".join(bodies)


def refused_bytes(pages: int) -> int:
    """The memory size a refused grow asked for, in bytes, from the probe's global."""
    return pages * PAGE_BYTES


__all__ = ["GROW_REFUSED_EXPORT", "probe_refused_grows", "refused_bytes"]
