"""Hand-written WAT guests for tests: a minimal ABI v1 skeleton plus hostile variations.

The skeleton answers the handshake from data segments and dispatches on the command name's
length (the two reserved names differ in length), so each test only writes the body of its
one command. Modules are assembled with wasmtime's ``wat2wasm`` at test time, so no binary
can drift from its source.
"""

from __future__ import annotations

import cbor2
import wasmtime

HELLO_AT = 1024
WELCOME_AT = 2048
SCRATCH_AT = 4096
HEAP_START = 65536


def _data(value: object) -> tuple[bytes, int]:
    blob = b"\x00\x00\x00\x00" + cbor2.dumps(value)
    return blob, len(blob)


def escape(blob: bytes) -> str:
    return "".join(f"\\{b:02x}" for b in blob)


def guest_wat(
    body: str = "(call $ok_null)",
    *,
    imports: str = "",
    memory: str = '(memory (export "memory") 2)',
    marker: str | None = "1.0",
    extra: str = "",
    hello: object = None,
    welcome: object = None,
    alloc: str | None = None,
) -> str:
    """A guest whose every non-reserved command runs ``body`` (which must leave an i64)."""
    hello_blob, hello_len = _data(
        hello
        if hello is not None
        else {"id": "org.test.wat", "version": "0.1.0", "abi": marker or "1.0", "features": []}
    )
    welcome_blob, welcome_len = _data(welcome if welcome is not None else {"status": "ready"})
    null_blob = b"\x00\x00\x00\x00\xf6"
    marker_section = f'(@custom "wasihost_abi" "{marker}")' if marker is not None else ""
    alloc_fn = (
        alloc
        or """
  (func (export "wasihost_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (i32.and (i32.add (local.get $n) (i32.const 7)) (i32.const -8))))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (global.set $heap (local.get $p)) (return (i32.const 0))))
    (local.get $p))"""
    )
    return f"""
(module
  {marker_section}
  {imports}
  {memory}
  (global $heap (mut i32) (i32.const {HEAP_START}))
  (data (i32.const {HELLO_AT}) "{escape(hello_blob)}")
  (data (i32.const {WELCOME_AT}) "{escape(welcome_blob)}")
  (data (i32.const {SCRATCH_AT}) "{escape(null_blob)}")
  (func $packed (param $ptr i32) (param $len i32) (result i64)
    (i64.or (i64.shl (i64.extend_i32_u (local.get $ptr)) (i64.const 32))
            (i64.extend_i32_u (local.get $len))))
  (func $ok_null (result i64) (call $packed (i32.const {SCRATCH_AT}) (i32.const 5)))
  {alloc_fn}
  (func (export "wasihost_call") (param $ptr i32) (param $cmd_len i32) (param $in_len i32) (result i64)
    ;; free everything from the previous call: a bump allocator reset per entry
    (global.set $heap (i32.const {HEAP_START}))
    (if (i32.eq (local.get $cmd_len) (i32.const 14))
      (then (return (call $packed (i32.const {HELLO_AT}) (i32.const {hello_len})))))
    (if (i32.eq (local.get $cmd_len) (i32.const 16))
      (then (return (call $packed (i32.const {WELCOME_AT}) (i32.const {welcome_len})))))
    {body})
  {extra}
)
"""


def build(wat: str) -> bytes:
    return bytes(wasmtime.wat2wasm(wat))


def host_import(name: str, func: str | None = None) -> str:
    """Import a v1 host function under ``$<name>`` (or ``func``)."""
    return (
        f'(import "wasihost_v1" "{name}" (func ${func or name} '
        "(param i32 i32 i32 i32) (result i32)))"
    )
