"""A small, bounded reader of a wasm module's section headers.

Admission must know the module's ABI marker and its declared memory and table minimums before
the engine compiles anything: wasmtime-py has no API for custom sections, and a module that
declares 60,000 pages should be refused by name, not by an instantiation failure. This reader
never allocates more than the input and stops at the first inconsistency.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import attrs

WASM_MAGIC = b"\x00asm"
WASM_VERSION = b"\x01\x00\x00\x00"
PAGE_BYTES = 65536

# The biggest Rust guests we know of are a few MB; 64 MiB leaves room without letting a
# hostile package make the host compile (or even scan) arbitrary amounts of code.
MAX_MODULE_BYTES = 64 * 1024 * 1024
# Rust and wasi-libc modules carry ~15 sections plus a handful of custom ones; 10,000
# bounds the scan of a file made of empty sections.
MAX_SECTIONS = 10_000
# A marker is "MAJOR.MINOR"; anything longer is malformed.
MAX_MARKER_BYTES = 16
# Engines refuse more than a handful of memories/tables anyway; count-bound the loop.
MAX_DECLARED = 100_000
# wasmparser's own limits (wasmtime refuses more): params and results of one function type,
# and the bytes of a name (an import's module and name, an export's, a custom section's).
# Without them the scanner vouched for headers the engine will not parse, after working on
# them: it read names of up to 64 MiB and types of any arity.
MAX_FUNCTION_PARAMS = 1000
MAX_FUNCTION_RESULTS = 1000
MAX_NAME_BYTES = 100_000
# Every value type of the type section becomes an element of a FuncType tuple (8 bytes and a
# Python loop step each): 64 MiB of them cost 7 s and 600 MiB before wasmtime saw the module,
# and wasmparser's per-type limit still allows 64,000 types of 1,000. Real modules declare a
# few hundred at most (the fixtures and WASI testsuite programs: 132); 100,000 is 750x that.
MAX_TYPE_VALUES = 100_000
# A module's names are quoted in refusals at most this long (a name may be 100,000 bytes, and
# a module may carry 100,000 of them); the rest is elided and its length said.
MAX_QUOTED_NAME = 64

# Headers of recently admitted modules, keyed by the module's bytes: admitting the same module
# again (a restart, another host, a benchmark) skips the scan (about 200 µs for a 44 KB Rust
# module). Bounded in entries and in the bytes the keys keep alive (32 x 1 MiB); bigger modules
# are scanned every time, their scan being small beside their compilation anyway.
HEADER_CACHE_ENTRIES = 32
HEADER_CACHE_MAX_MODULE_BYTES = 1024 * 1024

SECTION_CUSTOM = 0
SECTION_TYPE = 1
SECTION_IMPORT = 2
SECTION_FUNCTION = 3
SECTION_TABLE = 4
SECTION_MEMORY = 5
SECTION_EXPORT = 7
SECTION_START = 8

# The order in which the known sections must appear, each at most once (the core spec's, with
# the tag section of exception handling between memory and global). wasmtime refuses a
# repeated or misplaced section; refusing it here too keeps the scan from accumulating: without
# it, 160 import sections of 100,000 imports each fit in 64 MiB and made 16 million entries
# (a 16 MiB module took 22 s and 1.3 GiB to scan, before wasmtime ever saw it).
# Ids in order: type, import, function, table, memory, tag, global, export, start, element,
# data count, code, data.
_SECTION_ORDER = {
    sid: rank for rank, sid in enumerate((1, 2, 3, 4, 5, 13, 6, 7, 8, 9, 12, 10, 11), 1)
}

# The sections the scan decodes entry by entry (custom sections are a name and opaque bytes).
_READ_WHOLE = frozenset((1, 2, 3, 4, 5, 7, 8))

_VALTYPES = {
    0x7F: "i32",
    0x7E: "i64",
    0x7D: "f32",
    0x7C: "f64",
    0x7B: "v128",
    0x70: "funcref",
    0x6F: "externref",
}
_KINDS = {0x00: "func", 0x01: "table", 0x02: "memory", 0x03: "global", 0x04: "tag"}


class WasmFormatError(ValueError):
    """The bytes are not a wasm module this reader can vouch for."""


def shown_name(name: str) -> str:
    """A name from a module, as a refusal quotes it: whole if short, else its start and its
    length (a hostile module's names would otherwise make its refusal as large as itself)."""
    if len(name) <= MAX_QUOTED_NAME:
        return name
    return f"{name[:MAX_QUOTED_NAME]}... ({len(name.encode('utf-8', 'replace'))} bytes)"


@attrs.frozen
class Limits:
    """A memory or table's declared limits (pages for memories, elements for tables)."""

    minimum: int
    maximum: int | None
    is_64: bool = False
    shared: bool = False


@attrs.frozen
class FuncType:
    params: tuple[str, ...]
    results: tuple[str, ...]

    def __str__(self) -> str:
        return f"({', '.join(self.params)}) -> ({', '.join(self.results)})"


@attrs.frozen
class ImportEntry:
    """One import; ``func_type`` is set for function imports."""

    module: str
    name: str
    kind: str
    func_type: FuncType | None = None


@attrs.frozen
class ExportEntry:
    """One export; ``func_type`` is set for function exports, and ``reexports`` for a function
    the module imports (its ``module.name``) rather than defines."""

    name: str
    kind: str
    func_type: FuncType | None = None
    reexports: str | None = None


@attrs.frozen
class ModuleHeader:
    """What admission needs from a module before compiling it."""

    size: int
    custom_sections: tuple[tuple[str, bytes], ...]
    memories: tuple[Limits, ...]
    tables: tuple[Limits, ...]
    imported_memories: tuple[Limits, ...]
    imported_tables: tuple[Limits, ...]
    has_start: bool
    imports: tuple[ImportEntry, ...] = ()
    exports: tuple[ExportEntry, ...] = ()

    def custom(self, name: str) -> list[bytes]:
        return [data for n, data in self.custom_sections if n == name]


class _Reader:
    def __init__(self, data: bytes, pos: int, end: int) -> None:
        self.data = data
        self.pos = pos
        self.end = end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise WasmFormatError("unexpected end of section")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def uleb(self, bits: int) -> int:
        result = 0
        shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
            if shift >= bits:  # at most ceil(bits / 7) bytes, as wasmtime reads them
                raise WasmFormatError("integer encoding too long")
        if result >= 1 << bits:
            raise WasmFormatError("integer out of range")
        return result

    def take(self, n: int) -> bytes:
        if n > self.end - self.pos:
            raise WasmFormatError("length runs past the end of its section")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def name(self) -> str:
        size = self.uleb(32)
        if size > MAX_NAME_BYTES:
            raise WasmFormatError(f"name of {size} bytes is over {MAX_NAME_BYTES}")
        raw = self.take(size)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise WasmFormatError("name is not UTF-8") from None

    def limits(self, *, memory: bool) -> Limits:
        flags = self.byte()
        if flags > 0x07 or (not memory and flags > 0x05):
            raise WasmFormatError(f"unknown limits flags 0x{flags:02x}")
        is_64 = bool(flags & 0x04)
        shared = bool(flags & 0x02)
        bits = 64 if is_64 else 32
        minimum = self.uleb(bits)
        maximum = self.uleb(bits) if flags & 0x01 else None
        return Limits(minimum, maximum, is_64, shared)


def _count(r: _Reader) -> int:
    n = r.uleb(32)
    if n > MAX_DECLARED:
        raise WasmFormatError(f"section declares {n} entries")
    return n


def _read_types(r: _Reader) -> list[FuncType]:
    types = []
    budget = MAX_TYPE_VALUES
    for _ in range(_count(r)):
        form = r.byte()
        if form != 0x60:
            raise WasmFormatError(f"unsupported type form 0x{form:02x}")
        sig = []
        for most, what in ((MAX_FUNCTION_PARAMS, "params"), (MAX_FUNCTION_RESULTS, "results")):
            n = _count(r)
            if n > most:
                raise WasmFormatError(f"function type of {n} {what}, over {most}")
            budget -= n
            if budget < 0:
                raise WasmFormatError(
                    f"type section declares over {MAX_TYPE_VALUES} value types in all"
                )
            vals = []
            for _ in range(n):
                code = r.byte()
                if code not in _VALTYPES:
                    raise WasmFormatError(f"unsupported value type 0x{code:02x}")
                vals.append(_VALTYPES[code])
            sig.append(tuple(vals))
        types.append(FuncType(sig[0], sig[1]))
    return types


def _func_type(types: list[FuncType], index: int) -> FuncType:
    if index >= len(types):
        raise WasmFormatError(f"type index {index} out of range")
    return types[index]


def _read_imports(
    r: _Reader,
    types: list[FuncType],
    memories: list[Limits],
    tables: list[Limits],
    imports: list[ImportEntry],
    func_types: list[FuncType],
) -> None:
    for _ in range(_count(r)):
        module = r.name()
        name = r.name()
        kind = r.byte()
        if kind not in _KINDS:
            raise WasmFormatError(f"unknown import kind 0x{kind:02x}")
        if kind == 0x00:
            ft = _func_type(types, r.uleb(32))
            func_types.append(ft)
            imports.append(ImportEntry(module, name, "func", ft))
            continue
        imports.append(ImportEntry(module, name, _KINDS[kind]))
        if kind == 0x01:  # table: reftype + limits
            r.byte()
            tables.append(r.limits(memory=False))
        elif kind == 0x02:
            memories.append(r.limits(memory=True))
        elif kind == 0x03:  # global: valtype + mutability
            r.byte()
            r.byte()
        else:  # tag: attribute + type index
            r.byte()
            r.uleb(32)


_header_cache: OrderedDict[bytes, ModuleHeader] = OrderedDict()
_header_lock = threading.Lock()


def read_header_cached(data: bytes) -> ModuleHeader:
    """:func:`read_header`, remembered for the last few modules (see HEADER_CACHE_ENTRIES).

    The key is the bytes themselves (equal bytes, equal header; a bytes object caches its own
    hash, so a hit on the same object costs no pass over it). A malformed module is never
    remembered: it raises every time."""
    if type(data) is not bytes or len(data) > HEADER_CACHE_MAX_MODULE_BYTES:
        return read_header(data)
    with _header_lock:
        header = _header_cache.get(data)
        if header is not None:
            _header_cache.move_to_end(data)
            return header
    header = read_header(data)
    with _header_lock:
        _header_cache[data] = header
        while len(_header_cache) > HEADER_CACHE_ENTRIES:
            _header_cache.popitem(last=False)
    return header


def read_u32(data: bytes, pos: int) -> tuple[int, int]:
    """The unsigned LEB128 u32 at ``pos`` and the offset after it, bounded as the header scan
    (and wasmtime) reads one; :class:`WasmFormatError` otherwise."""
    reader = _Reader(data, pos, len(data))
    return reader.uleb(32), reader.pos


def read_header(data: bytes) -> ModuleHeader:
    """Scan ``data``'s sections; raise :class:`WasmFormatError` on anything malformed."""
    if len(data) > MAX_MODULE_BYTES:
        raise WasmFormatError(f"module of {len(data)} bytes exceeds {MAX_MODULE_BYTES}")
    if len(data) < 8 or data[:4] != WASM_MAGIC:
        raise WasmFormatError("not a wasm module (bad magic)")
    if data[4:8] != WASM_VERSION:
        raise WasmFormatError("not a core wasm module of version 1 (components are not accepted)")
    top = _Reader(data, 8, len(data))
    custom: list[tuple[str, bytes]] = []
    memories: list[Limits] = []
    tables: list[Limits] = []
    imported_memories: list[Limits] = []
    imported_tables: list[Limits] = []
    has_start = False
    types: list[FuncType] = []
    imports: list[ImportEntry] = []
    func_types: list[FuncType] = []
    raw_exports: list[tuple[str, int, int]] = []
    sections = 0
    last_rank = 0
    while top.pos < top.end:
        sections += 1
        if sections > MAX_SECTIONS:
            raise WasmFormatError(f"more than {MAX_SECTIONS} sections")
        section_id = top.byte()
        size = top.uleb(32)
        if size > top.end - top.pos:
            raise WasmFormatError(f"section {section_id} runs past the end of the module")
        if section_id != SECTION_CUSTOM:
            rank = _SECTION_ORDER.get(section_id)
            if rank is None:
                raise WasmFormatError(f"unknown section id {section_id}")
            if rank <= last_rank:
                raise WasmFormatError(f"section {section_id} is repeated or out of order")
            last_rank = rank
        r = _Reader(data, top.pos, top.pos + size)
        top.pos += size
        if section_id == SECTION_CUSTOM:
            name = r.name()
            custom.append((name, data[r.pos : r.end]))
        elif section_id == SECTION_TYPE:
            types = _read_types(r)
        elif section_id == SECTION_IMPORT:
            _read_imports(r, types, imported_memories, imported_tables, imports, func_types)
        elif section_id == SECTION_FUNCTION:
            for _ in range(_count(r)):
                func_types.append(_func_type(types, r.uleb(32)))
        elif section_id == SECTION_EXPORT:
            for _ in range(_count(r)):
                raw_exports.append((r.name(), r.byte(), r.uleb(32)))
        elif section_id == SECTION_TABLE:
            for _ in range(_count(r)):
                if r.data[r.pos : r.pos + 2] == b"\x40\x00":
                    raise WasmFormatError("tables with initialisers are not supported")
                r.byte()
                tables.append(r.limits(memory=False))
        elif section_id == SECTION_MEMORY:
            for _ in range(_count(r)):
                memories.append(r.limits(memory=True))
        elif section_id == SECTION_START:
            has_start = True
            r.uleb(32)
        if section_id in _READ_WHOLE and r.pos != r.end:
            # wasmtime refuses trailing bytes too; a section read here is read whole.
            raise WasmFormatError(f"section {section_id} has bytes past its entries")
    exports = []
    # Function indices count the imported functions first.
    func_imports = [i for i in imports if i.kind == "func"]
    for name, kind, index in raw_exports:
        reexports = None
        if kind not in _KINDS:
            raise WasmFormatError(f"export {shown_name(name)!r} has unknown kind 0x{kind:02x}")
        ft = None
        if kind == 0x00:
            if index >= len(func_types):
                raise WasmFormatError(
                    f"export {shown_name(name)!r} names function {index}, which does not exist"
                )
            ft = func_types[index]
            if index < len(func_imports):
                imported = func_imports[index]
                reexports = f"{shown_name(imported.module)}.{shown_name(imported.name)}"
        exports.append(ExportEntry(name, _KINDS[kind], ft, reexports))
    return ModuleHeader(
        size=len(data),
        imports=tuple(imports),
        exports=tuple(exports),
        custom_sections=tuple(custom),
        memories=tuple(memories),
        tables=tuple(tables),
        imported_memories=tuple(imported_memories),
        imported_tables=tuple(imported_tables),
        has_start=has_start,
    )
