"""A WAT guest importing every files entry, for hostile and cross-extension requests.

Command ``o``, ``t``, ``r``, ``w`` or ``c`` passes its input (CBOR, exactly as encoded) as the
request of ``file_open``, ``file_temp``, ``file_read``, ``file_write`` or ``file_close``; the
same letter followed by ``!`` passes the content of an input byte string instead (any bytes at
all). The guest answers a byte string: the i32 the import returned (little-endian), then the
response bytes the host wrote.
"""

from __future__ import annotations

from typing import Any

import cbor2

from tests.support.guests import build, guest_wat, host_import
from wasihost.core.status import Status
from wasihost.host.extension import Extension

OUT = 16384
RESPONSE = OUT + 13
RESPONSE_CAP = 40000
ENTRIES = {
    "o": "file_open",
    "t": "file_temp",
    "r": "file_read",
    "w": "file_write",
    "c": "file_close",
}


def _dispatch() -> str:
    chain = "(i32.const -9)"  # an unknown letter: UNSUPPORTED, as a stand-in would answer
    for letter, entry in ENTRIES.items():
        call = (
            f"(call ${entry} (local.get $req) (local.get $len) "
            f"(i32.const {RESPONSE}) (i32.const {RESPONSE_CAP}))"
        )
        chain = (
            f"(if (result i32) (i32.eq (local.get $which) (i32.const {ord(letter)})) "
            f"(then {call}) (else {chain}))"
        )
    return chain


EXTRA = f"""
  (func $head_len (param $p i32) (result i32)
    (local $low i32)
    (local.set $low (i32.and (i32.load8_u (local.get $p)) (i32.const 31)))
    (if (result i32) (i32.lt_u (local.get $low) (i32.const 24)) (then (i32.const 1))
      (else (if (result i32) (i32.eq (local.get $low) (i32.const 24)) (then (i32.const 2))
        (else (if (result i32) (i32.eq (local.get $low) (i32.const 25)) (then (i32.const 3))
          (else (if (result i32) (i32.eq (local.get $low) (i32.const 26)) (then (i32.const 5))
            (else (i32.const 9))))))))))
  (func $skip (param $ptr i32) (param $cmd_len i32) (result i32)
    (if (result i32) (i32.eq (local.get $cmd_len) (i32.const 2))
      (then (call $head_len (i32.add (local.get $ptr) (local.get $cmd_len))))
      (else (i32.const 0))))
  (func $dispatch (param $which i32) (param $req i32) (param $len i32) (result i32)
    {_dispatch()})
  (func $answer (param $r i32) (result i64)
    (local $n i32) (local $len i32)
    (local.set $n (select (local.get $r) (i32.const 0) (i32.ge_s (local.get $r) (i32.const 0))))
    (local.set $len (i32.add (local.get $n) (i32.const 4)))
    (i32.store (i32.const {OUT}) (i32.const 0))
    (i32.store8 (i32.const {OUT + 4}) (i32.const 0x5a))
    (i32.store8 (i32.const {OUT + 5}) (i32.shr_u (local.get $len) (i32.const 24)))
    (i32.store8 (i32.const {OUT + 6}) (i32.shr_u (local.get $len) (i32.const 16)))
    (i32.store8 (i32.const {OUT + 7}) (i32.shr_u (local.get $len) (i32.const 8)))
    (i32.store8 (i32.const {OUT + 8}) (local.get $len))
    (i32.store (i32.const {OUT + 9}) (local.get $r))
    (call $packed (i32.const {OUT}) (i32.add (local.get $n) (i32.const 13))))"""

BODY = """(call $answer (call $dispatch (i32.load8_u (local.get $ptr))
      (i32.add (i32.add (local.get $ptr) (local.get $cmd_len)) (call $skip (local.get $ptr) (local.get $cmd_len)))
      (i32.sub (local.get $in_len) (call $skip (local.get $ptr) (local.get $cmd_len)))))"""


def proxy_wasm(marker: str = "1.1") -> bytes:
    """The proxy guest, declaring ABI ``marker`` (a 1.0 one must be refused at admission)."""
    hello = {"id": "org.test.files", "version": "0.1.0", "abi": marker, "features": ["files"]}
    imports = "\n".join(host_import(entry) for entry in ENTRIES.values())
    return build(guest_wat(BODY, imports=imports, marker=marker, extra=EXTRA, hello=hello))


PROXY = proxy_wasm()


def raw_call(ext: Extension, op: str, request: bytes) -> tuple[int, bytes]:
    """``op`` with the request bytes as given: (what the import returned, response bytes)."""
    out = ext.call(op + "!", request)
    return int.from_bytes(out[:4], "little", signed=True), out[4:]


def call(ext: Extension, op: str, request: Any) -> Any:
    """``op`` with ``request`` encoded as CBOR: the decoded response, or the Status answered."""
    out = ext.call(op, request)
    ret = int.from_bytes(out[:4], "little", signed=True)
    if ret < 0:
        return Status(-ret)
    return cbor2.loads(out[4:])
