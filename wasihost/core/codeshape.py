"""The static shape pre-check of a module's code, run before anything compiles it.

Pure and bounded. Compile cost is not linear in module size: with fuel and epoch
instrumentation on, every ``loop`` costs ~20 KB of compiler memory and ~0.1 ms, nesting makes it
worse (100,000 nested loops in 300 KB took 34 s and 2 GB), and every function has a fixed cost
(99,000 empty functions took 633 MiB). So before the engine sees a module, this scan decodes
every function body just far enough to measure what drives that cost, and refuses a module
over any limit with an :class:`~wasihost.core.errors.AdmissionError` naming the function and the
limit. It stops at the first limit crossed, so a bomb costs a scan of its prefix only.

What the scan admits is still compiled under a budget (a worker process with rlimits, see
``engine/compiler.py``): these limits keep honest modules fast to admit and make the worst
admitted module's compile cost per KB small and known (``docs/engine.md``).
"""

from __future__ import annotations

import attrs

from .errors import AdmissionError
from .wasmbin import ModuleHeader

SECTION_FUNCTION = 3
SECTION_CODE = 10

# The largest fixtures and WASI testsuite programs (130 KB Rust) define ~500 functions; a
# 4 MB Rust release build ~10,000. Each function costs the compiler ~75 us and ~6 KB even when
# empty, and the count is what a many-tiny-functions bomb scales.
MAX_FUNCTIONS = 50_000
# wasmparser's own limit is 7.6 MB per body; real functions stay under 100 KB (the largest
# body in the fixtures and testsuite is 20 KB). A body's size bounds its compile work.
MAX_FUNCTION_BODY_BYTES = 1024 * 1024
# All bodies together: 16 MiB of code is a very large program (a 4 MB Rust build has ~3 MB),
# and at ~1 ms/KB for ordinary code it is already ~16 s of compiling.
MAX_CODE_BYTES = 16 * 1024 * 1024
# wasmparser refuses more than 50,000 locals per function. Locals are SSA values for the
# compiler, and with many of them live at once register allocation costs ~ locals^2 x blocks
# (measured: 5,000 locals live across 50 loops, 2.4 s; 2,000 across 125, 1.3 s). The fixtures
# and WASI testsuite programs declare at most 355.
MAX_LOCALS = 2_000
# Every block, loop and `if` where a local's definitions meet gets a parameter for it, so the
# product of locals and blocks drives compile cost (10,000 locals live across 100 nested loops
# took 16 s of CPU for 59 KB). The fixtures and WASI testsuite programs peak at ~20,000; the
# limit leaves 12x of headroom and, with MAX_LOCALS, bounds one function's share to ~1.5 s.
MAX_LOCALS_X_BLOCKS = 250_000
# Nested control costs the compiler superlinear time (nested `if`s: 5,000 took 0.5 s and
# 20,000 took 5 s). Compilers keep nesting shallow: the deepest function in the fixtures and
# the WASI testsuite is 80 deep, and a `match` of N arms nests N blocks, so 1,000 leaves room
# for generated dispatch code (12x the deepest seen).
MAX_CONTROL_DEPTH = 1_000
# Every loop header gets fuel and epoch checks: ~20 KB of compiler memory and ~0.1 ms each,
# whether nested or one after another. The fixtures and the WASI testsuite have at most 226
# loops in a module and 55 in one function.
MAX_LOOPS_PER_FUNCTION = 2_000
MAX_LOOPS = 50_000
# A br_table's targets are edges of the control graph; Cranelift refuses more than 65,520.
MAX_BR_TABLE_TARGETS = 65_520


class CodeShapeError(AdmissionError):
    """A function's shape is over a limit, or its code is malformed; names the function."""


@attrs.frozen
class CodeShape:
    """What the scan measured: the cost drivers of the worst function and of the module."""

    functions: int
    code_bytes: int
    loops: int
    max_body_bytes: int
    max_locals: int
    max_depth: int
    max_loops_per_function: int
    max_locals_x_blocks: int
    # Instructions the compiler expands into branches and calls of its own (see _LEB_BRANCH):
    indirect: int = 0  # table accesses and indirect calls, in all functions
    max_branches: int = 0  # conditional branches, in the worst function


# Immediate kinds of one-byte opcodes.
_NONE, _LEB, _LEB2, _BLOCK, _END, _BR_TABLE, _F32, _F64, _MEMARG, _SELECT_T = range(10)
_TRY_TABLE, _FC, _FD, _BAD = 10, 11, 12, 13
# memory.grow: one LEB (the memory index), and its offset noted when the caller asks
# (growprobe rewrites each one).
_GROW = 16
# One LEB immediate, like _LEB, and counted: a conditional branch, or a table access or
# indirect call.
_LEB_BRANCH, _LEB_INDIRECT = 14, 15

_OPS = [_BAD] * 256
for _op in (0x00, 0x01, 0x05, 0x0A, 0x0F, 0x1A, 0x1B, 0x19, 0xD1, 0xD3, 0xD4, *range(0x45, 0xC5)):
    _OPS[_op] = _NONE
# br, br_if, call, return_call, throw, rethrow, catch, local/global/table get/set,
# memory.size/grow (memory index), i32/i64.const (LEB), ref.null (heap type), ref.func,
# call_ref, return_call_ref, br_on_null, br_on_non_null.
for _op in (0x07, 0x08, 0x09, 0x0C, 0x0D, 0x10, 0x12, 0x14, 0x15, *range(0x20, 0x27),
            0x3F, 0x40, 0x41, 0x42, 0xD0, 0xD2, 0xD5, 0xD6):  # fmt: skip
    _OPS[_op] = _LEB
for _op in (0x11, 0x13):  # call_indirect, return_call_indirect: type and table
    _OPS[_op] = _LEB2
# What the compiler turns into extra blocks and calls of its own: each conditional branch
# splits the function's control graph, and the compiler's work on one function grows faster
# than linearly with its blocks; each table access and indirect call adds bounds, null and
# type checks and a runtime call (lazily initialised tables). Measured on wasmtime 50 with
# fuel and epochs on: 6,000 `table.copy` in one 59 KB function took 7 s of CPU and 217 MB,
# 7,000 `call_indirect` 1.7 s, 12,000 `table.get` 2.5 s, 6,000 `if`s 0.5 s; the same
# count of loads or stores takes about 0.01 s.
for _op in (0x0D, 0xD5, 0xD6):  # br_if, br_on_null, br_on_non_null
    _OPS[_op] = _LEB_BRANCH
for _op in (0x14, 0x15, 0x25):  # call_ref, return_call_ref, table.get
    _OPS[_op] = _LEB_INDIRECT
# if; try and try_table, whose every call may branch to a handler (3,500 empty try_tables in a
# 48 KB function took 0.5 s of CPU).
_BRANCHING_BLOCKS = frozenset((0x04, 0x06, 0x1F))
# 0xfc sub-opcodes of table.init, table.copy, table.grow and table.fill.
_FC_INDIRECT = frozenset((12, 14, 15, 17))
for _op in (0x02, 0x03, 0x04, 0x06):  # block, loop, if, try
    _OPS[_op] = _BLOCK
_OPS[0x40] = _GROW
_OPS[0x0B] = _END
_OPS[0x18] = _END  # delegate (legacy exceptions) ends its `try`, then names a label
_OPS[0x0E] = _BR_TABLE
_OPS[0x43] = _F32
_OPS[0x44] = _F64
for _op in range(0x28, 0x3F):
    _OPS[_op] = _MEMARG
_OPS[0x1C] = _SELECT_T
_OPS[0x1F] = _TRY_TABLE
_OPS[0xFC] = _FC
_OPS[0xFD] = _FD
_LOOP = 0x03
_DELEGATE = 0x18

# 0xFC sub-opcodes (saturating truncation, bulk memory, tables, wide arithmetic): how many
# LEB immediates each has.
_FC_LEBS = {**dict.fromkeys(range(8), 0), 8: 2, 9: 1, 10: 2, 11: 1, 12: 2, 13: 1, 14: 2,
            15: 1, 16: 1, 17: 1, 19: 0, 20: 0, 21: 0, 22: 0}  # fmt: skip
# 0xFD (SIMD) sub-opcodes with immediates; every other one up to 0x113 has none.
_FD_MEMARG = frozenset((*range(12), 92, 93))
_FD_LANE = frozenset(range(21, 35))
_FD_MEMARG_LANE = frozenset(range(84, 92))
_FD_BYTES16 = frozenset((12, 13))  # v128.const, i8x16.shuffle
_FD_MAX = 0x113


def _skip_leb(data: bytes, i: int, end: int) -> int:
    while i < end and data[i] & 0x80:
        i += 1
    if i >= end:
        raise IndexError
    return i + 1


def _read_uleb(data: bytes, i: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= end or shift > 63:
            raise IndexError
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i


def _skip_valtype(data: bytes, i: int, end: int) -> int:
    if i >= end:
        raise IndexError
    if data[i] in (0x63, 0x64):  # (ref null? ht): a heap type follows
        return _skip_leb(data, i + 1, end)
    return i + 1


def _skip_memarg(data: bytes, i: int, end: int) -> int:
    align, i = _read_uleb(data, i, end)
    if align & 0x40:  # multi-memory: a memory index follows the alignment
        i = _skip_leb(data, i, end)
    return _skip_leb(data, i, end)


def _refuse(index: int, problem: str) -> CodeShapeError:
    return CodeShapeError([f"function {index}: {problem}"])


def _read_locals(data: bytes, i: int, end: int, index: int) -> tuple[int, int]:
    """A body's local declarations: how many locals, and the offset after them."""
    groups, i = _read_uleb(data, i, end)
    n_locals = 0
    for _ in range(groups):
        count, i = _read_uleb(data, i, end)
        n_locals += count
        if n_locals > MAX_LOCALS:
            raise _refuse(index, f"declares more than {MAX_LOCALS} locals (MAX_LOCALS)")
        i = _skip_valtype(data, i, end)
    return n_locals, i


# The rarer instructions' immediates, read out of _scan_body's loop: each answers the offset
# after them (and what they add to the counts).


def _skip_catches(data: bytes, i: int, end: int, index: int) -> tuple[int, int]:
    """A try_table's catch clauses: how many, and the offset after them."""
    catches, i = _read_uleb(data, i, end)
    if catches > MAX_BR_TABLE_TARGETS:
        raise _refuse(index, f"try_table with {catches} catch clauses")
    for _ in range(catches):
        clause = data[i]
        i += 1
        if clause in (0, 1):  # catch / catch_ref: a tag, then a label
            i = _skip_leb(data, i, end)
        i = _skip_leb(data, i, end)
    return catches, i


def _skip_br_table(data: bytes, i: int, end: int, index: int) -> int:
    """A br_table's targets and default: the offset after them."""
    targets, i = _read_uleb(data, i, end)
    if targets > MAX_BR_TABLE_TARGETS:
        raise _refuse(
            index,
            f"br_table with {targets} targets, over {MAX_BR_TABLE_TARGETS} (MAX_BR_TABLE_TARGETS)",
        )
    for _ in range(targets + 1):
        i = _skip_leb(data, i, end)
    return i


def _skip_fc(data: bytes, i: int, end: int, index: int) -> tuple[int, int]:
    """A 0xfc instruction after its prefix: the offset after it, and 1 if it is a table
    access (counted with the indirect calls), else 0."""
    sub, i = _read_uleb(data, i, end)
    lebs = _FC_LEBS.get(sub)
    if lebs is None:
        raise _refuse(index, f"unsupported instruction 0xfc {sub}")
    for _ in range(lebs):
        i = _skip_leb(data, i, end)
    return i, 1 if sub in _FC_INDIRECT else 0


def _scan_body(
    data: bytes, i: int, end: int, index: int, grows: list[tuple[int, int]] | None = None
) -> tuple[int, int, int, int, int, int]:
    """Check one body; return (locals, max depth, loops, locals x blocks, conditional
    branches, table accesses and indirect calls). ``IndexError`` means it is truncated.
    ``grows``, when given, gets the offset and length of each ``memory.grow`` of memory 0."""
    n_locals, i = _read_locals(data, i, end, index)
    depth = max_depth = 1  # the body itself is a block ended by the final `end`
    loops = blocks = branches = indirect = 0
    # Past this many blocks the locals-times-blocks product crosses its limit.
    blocks_allowed = MAX_LOCALS_X_BLOCKS // n_locals if n_locals else MAX_FUNCTION_BODY_BYTES
    ops = _OPS
    while i < end:
        op = data[i]
        i += 1
        kind = ops[op]
        if kind == _NONE:
            continue
        if kind == _LEB:
            while data[i] & 0x80:
                i += 1
            i += 1
        elif kind == _MEMARG:
            i = _skip_memarg(data, i, end)
        elif kind in (_BLOCK, _TRY_TABLE):
            depth += 1
            blocks += 1
            if blocks > blocks_allowed:
                raise _refuse(
                    index,
                    f"{n_locals} locals across {blocks} blocks, over {MAX_LOCALS_X_BLOCKS} "
                    "(MAX_LOCALS_X_BLOCKS)",
                )
            if depth > max_depth:
                max_depth = depth
                if depth > MAX_CONTROL_DEPTH:
                    raise _refuse(
                        index,
                        f"control nesting deeper than {MAX_CONTROL_DEPTH} (MAX_CONTROL_DEPTH)",
                    )
            if op in _BRANCHING_BLOCKS:
                branches += 1
            elif op == _LOOP:
                loops += 1
                if loops > MAX_LOOPS_PER_FUNCTION:
                    raise _refuse(
                        index,
                        f"more than {MAX_LOOPS_PER_FUNCTION} loops (MAX_LOOPS_PER_FUNCTION)",
                    )
            b = data[i]
            i = _skip_leb(data, i + 1, end) if b in (0x63, 0x64) else _skip_leb(data, i, end)
            if kind == _TRY_TABLE:
                catches, i = _skip_catches(data, i, end, index)
                branches += catches  # each an edge out of every call in the block
        elif kind == _END:
            if op == _DELEGATE:
                i = _skip_leb(data, i, end)
            depth -= 1
            if depth == 0:
                if i != end:
                    raise _refuse(index, "code continues after the body's final `end`")
                return n_locals, max_depth, loops, n_locals * blocks, branches, indirect
        elif kind == _LEB_BRANCH:
            branches += 1
            i = _skip_leb(data, i, end)
        elif kind == _LEB_INDIRECT:
            indirect += 1
            i = _skip_leb(data, i, end)
        elif kind == _LEB2:
            indirect += 1
            i = _skip_leb(data, _skip_leb(data, i, end), end)
        elif kind == _BR_TABLE:
            branches += 1
            i = _skip_br_table(data, i, end, index)
        elif kind == _GROW:
            start = i - 1
            memory, i = _read_uleb(data, i, end)
            # A memory index of more than 5 bytes is refused by the compiler: left in place.
            if grows is not None and memory == 0 and i - start <= 6:
                grows.append((start, i - start))
        elif kind == _F32:
            i += 4
        elif kind == _F64:
            i += 8
        elif kind == _SELECT_T:
            count, i = _read_uleb(data, i, end)
            for _ in range(count):
                i = _skip_valtype(data, i, end)
        elif kind == _FC:
            i, more = _skip_fc(data, i, end, index)
            indirect += more
        elif kind == _FD:
            sub, i = _read_uleb(data, i, end)
            if sub > _FD_MAX:
                raise _refuse(index, f"unsupported instruction 0xfd {sub}")
            if sub in _FD_BYTES16:
                i += 16
            elif sub in _FD_MEMARG:
                i = _skip_memarg(data, i, end)
            elif sub in _FD_LANE:
                i += 1
            elif sub in _FD_MEMARG_LANE:
                i = _skip_memarg(data, i, end) + 1
        else:
            raise _refuse(index, f"unsupported instruction 0x{op:02x}")
    raise IndexError


def scan_code(data: bytes, imported_functions: int = 0) -> CodeShape:
    """Measure every function body of ``data`` (a module that ``wasmbin.read_header`` has
    accepted) and raise :class:`CodeShapeError` at the first limit crossed. Functions are
    named by their index in the module's function index space (imports come first).

    Whatever the bytes, it returns a :class:`CodeShape` or raises :class:`CodeShapeError`.
    """
    try:
        return _scan_sections(data, imported_functions)
    except IndexError:
        raise CodeShapeError(["the module's sections are truncated or malformed"]) from None


def grow_sites(code: bytes) -> list[list[tuple[int, int]]]:
    """For each body of a code section's payload (of an admitted module: ``scan_code``
    accepted it), the offset within the body and the length of each ``memory.grow 0``."""
    count, i = _read_uleb(code, 0, len(code))
    sites: list[list[tuple[int, int]]] = []
    for index in range(count):
        size, start = _read_uleb(code, i, len(code))
        grows: list[tuple[int, int]] = []
        _scan_body(code, start, start + size, index, grows)
        sites.append([(offset - start, length) for offset, length in grows])
        i = start + size
    return sites


def scan_module(header: ModuleHeader, data: bytes) -> CodeShape:
    """:func:`scan_code` of a module whose ``header`` was read: functions numbered after its
    imported ones."""
    return scan_code(data, sum(1 for i in header.imports if i.kind == "func"))


def _scan_sections(data: bytes, imported_functions: int) -> CodeShape:
    if data[:4] != b"\x00asm":
        raise IndexError
    pos = 8
    functions = code_bytes = loops = indirect = 0
    # The worst function's body bytes, locals, depth, loops, product and branches.
    worst = [0, 0, 0, 0, 0, 0]
    while pos < len(data):
        section_id = data[pos]
        size, start = _read_uleb(data, pos + 1, len(data))
        pos = start + size
        if section_id == SECTION_FUNCTION:
            declared, _ = _read_uleb(data, start, pos)
            if declared > MAX_FUNCTIONS:
                raise CodeShapeError(
                    [f"module defines {declared} functions, over {MAX_FUNCTIONS} (MAX_FUNCTIONS)"]
                )
        if section_id != SECTION_CODE:
            continue
        if size > MAX_CODE_BYTES:
            raise CodeShapeError(
                [f"code section of {size} bytes, over {MAX_CODE_BYTES} (MAX_CODE_BYTES)"]
            )
        code_bytes = size
        count, i = _read_uleb(data, start, pos)
        if count > MAX_FUNCTIONS:
            raise CodeShapeError(
                [f"module defines {count} functions, over {MAX_FUNCTIONS} (MAX_FUNCTIONS)"]
            )
        functions = count
        for index in range(imported_functions, imported_functions + count):
            try:
                body, i = _read_uleb(data, i, pos)
                if body > MAX_FUNCTION_BODY_BYTES:
                    raise _refuse(
                        index,
                        f"body of {body} bytes, over {MAX_FUNCTION_BODY_BYTES} "
                        "(MAX_FUNCTION_BODY_BYTES)",
                    )
                if body > pos - i:
                    raise IndexError
                n_locals, depth, n_loops, product, n_branches, n_indirect = _scan_body(
                    data, i, i + body, index
                )
            except IndexError:
                raise _refuse(index, "body is truncated or malformed") from None
            i += body
            loops += n_loops
            indirect += n_indirect
            if loops > MAX_LOOPS:
                raise CodeShapeError([f"module has more than {MAX_LOOPS} loops in all (MAX_LOOPS)"])
            for k, value in enumerate((body, n_locals, depth, n_loops, product, n_branches)):
                worst[k] = max(worst[k], value)
    body_bytes, n_locals, depth, n_loops, product, branches = worst
    return CodeShape(
        functions, code_bytes, loops, body_bytes, n_locals, depth, n_loops, product,
        indirect=indirect, max_branches=branches,
    )  # fmt: skip
