"""Guests the bench builds at run time (WAT): the Extism peer plugin, the host-call loop
guest, and small ABI guests for the compatibility matrix."""

from __future__ import annotations

# Extism's peer plugin: ``noop`` sets no output, ``echo`` copies its input to its output 8
# bytes at a time through Extism's kernel (the PDK is not needed to write one).
EXTISM_PLUGIN_WAT = """(module
  (import "extism:host/env" "input_length" (func $input_length (result i64)))
  (import "extism:host/env" "input_load_u64" (func $load64 (param i64) (result i64)))
  (import "extism:host/env" "input_load_u8" (func $load8 (param i64) (result i32)))
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u64" (func $store64 (param i64 i64)))
  (import "extism:host/env" "store_u8" (func $store8 (param i64 i32)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (memory (export "memory") 1)
  (func (export "noop") (result i32) (i32.const 0))
  (func (export "echo") (result i32)
    (local $n i64) (local $i i64) (local $out i64)
    (local.set $n (call $input_length))
    (local.set $out (call $alloc (local.get $n)))
    (block $done
      (loop $again
        (br_if $done (i64.gt_u (i64.add (local.get $i) (i64.const 8)) (local.get $n)))
        (call $store64 (i64.add (local.get $out) (local.get $i)) (call $load64 (local.get $i)))
        (local.set $i (i64.add (local.get $i) (i64.const 8)))
        (br $again)))
    (block $tail
      (loop $byte
        (br_if $tail (i64.ge_u (local.get $i) (local.get $n)))
        (call $store8 (i64.add (local.get $out) (local.get $i)) (call $load8 (local.get $i)))
        (local.set $i (i64.add (local.get $i) (i64.const 1)))
        (br $byte)))
    (call $output_set (local.get $out) (local.get $n))
    (i32.const 0)))"""


def escaped(blob: bytes) -> str:
    return "".join(f"\\{b:02x}" for b in blob)


def _hello(abi: str) -> bytes:
    import cbor2

    status = b"\0\0\0\0"
    return status + cbor2.dumps({"id": "bench", "version": "0.1.0", "abi": abi, "features": []})


# The signature of ABI 2.0's native ``log`` (level, msg_ptr, msg_len) -> status.
V2_LOG_SIGNATURE = "(param i32 i32 i32) (result i32)"
CBOR_SIGNATURE = "(param i32 i32 i32 i32) (result i32)"


def abi_guest_wat(
    abi: str,
    *,
    imports: tuple[tuple[str, str], ...] = (),
    namespace: str | None = None,
    signature: str = CBOR_SIGNATURE,
) -> str:
    """A minimal ABI guest declaring ``abi``: answers the handshake, and every other command
    (``noop``) with null. Each of ``imports`` is a (module, name) with ``signature`` (the
    cbor-entry one by default); ``namespace`` adds an embedder-namespace marker for it."""
    import cbor2

    hello = _hello(abi)
    welcome = b"\0\0\0\0" + cbor2.dumps({"status": "ready"})
    marker = f'(@custom "wasihost_abi.{namespace}" "{abi}")' if namespace else ""
    lines = [f'(import "{m}" "{n}" (func {signature}))' for m, n in imports]
    return f"""(module
  (@custom "wasihost_abi" "{abi}")
  {marker}
  {chr(10).join(lines)}
  (memory (export "memory") 2)
  (data (i32.const 1024) "{escaped(hello)}")
  (data (i32.const 2048) "{escaped(welcome)}")
  (data (i32.const 3072) "\\00\\00\\00\\00\\f6")
  (func (export "wasihost_alloc") (param i32) (result i32) (i32.const 32768))
  (func (export "wasihost_call") (param i32 i32 i32) (result i64)
    (if (i32.eq (local.get 1) (i32.const 14))
      (then (return (i64.or (i64.shl (i64.const 1024) (i64.const 32)) (i64.const {len(hello)})))))
    (if (i32.eq (local.get 1) (i32.const 16))
      (then (return (i64.or (i64.shl (i64.const 2048) (i64.const 32))
                            (i64.const {len(welcome)})))))
    (i64.or (i64.shl (i64.const 3072) (i64.const 32)) (i64.const 5))))"""


def loop_guest_wat(
    module: str, name: str, request: bytes, namespace: str | None, *, native: bool = False
) -> str:
    """A guest whose command calls ``module.name`` with ``request`` as many times as its input
    (a CBOR uint below 65,536) says, and answers null. With ``native``, the import is a
    native-convention ``(i64) -> (i64)`` called with the loop counter instead (no request)."""
    import cbor2

    if native:
        signature = "(param i64) (result i64)"
        call = "(drop (call $f (i64.extend_i32_u (local.get $n))))"
    else:
        signature = "(param i32 i32 i32 i32) (result i32)"
        call = (
            f"(drop (call $f (i32.const 4096) (i32.const {len(request)}) (i32.const 8192) "
            "(i32.const 16)))"
        )

    hello = _hello("1.0")
    welcome = b"\0\0\0\0" + cbor2.dumps({"status": "ready"})
    marker = f'(@custom "wasihost_abi.{namespace}" "1.0")' if namespace else ""
    return f"""(module
  (@custom "wasihost_abi" "1.0")
  {marker}
  (import "{module}" "{name}" (func $f {signature}))
  (memory (export "memory") 2)
  (data (i32.const 1024) "{escaped(hello)}")
  (data (i32.const 2048) "{escaped(welcome)}")
  (data (i32.const 3072) "\\00\\00\\00\\00\\f6")
  (data (i32.const 4096) "{escaped(request)}")
  (func (export "wasihost_alloc") (param i32) (result i32) (i32.const 32768))
  (func $count (param $p i32) (param $n i32) (result i32)
    (local $b i32)
    (if (i32.eqz (local.get $n)) (then (return (i32.const 0))))
    (local.set $b (i32.load8_u (local.get $p)))
    (if (i32.lt_u (local.get $b) (i32.const 24)) (then (return (local.get $b))))
    (if (i32.eq (local.get $b) (i32.const 24))
      (then (return (i32.load8_u offset=1 (local.get $p)))))
    (i32.or (i32.shl (i32.load8_u offset=1 (local.get $p)) (i32.const 8))
            (i32.load8_u offset=2 (local.get $p))))
  (func (export "wasihost_call")
    (param $ptr i32) (param $cmd_len i32) (param $in_len i32) (result i64)
    (local $n i32)
    (if (i32.eq (local.get $cmd_len) (i32.const 14))
      (then (return (i64.or (i64.shl (i64.const 1024) (i64.const 32))
                            (i64.const {len(hello)})))))
    (if (i32.eq (local.get $cmd_len) (i32.const 16))
      (then (return (i64.or (i64.shl (i64.const 2048) (i64.const 32))
                            (i64.const {len(welcome)})))))
    (local.set $n (call $count (i32.add (local.get $ptr) (local.get $cmd_len)) (local.get $in_len)))
    (block $done
      (loop $again
        (br_if $done (i32.eqz (local.get $n)))
        {call}
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $again)))
    (i64.or (i64.shl (i64.const 3072) (i64.const 32)) (i64.const 5))))"""


# Extism's side of ``host-call-64``: ``many`` passes a 64-byte block of Extism memory to the
# host function ``noop64`` HOST_CALLS times, ``none`` allocates the block and calls nothing.
def extism_hostcall_wat(calls: int) -> str:
    return f"""(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/user" "noop64" (func $noop64 (param i64) (result i64)))
  (memory (export "memory") 1)
  (func $loop (param $n i32) (result i32)
    (local $block i64)
    (local.set $block (call $alloc (i64.const 64)))
    (block $done
      (loop $again
        (br_if $done (i32.eqz (local.get $n)))
        (drop (call $noop64 (local.get $block)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $again)))
    (i32.const 0))
  (func (export "many") (result i32) (call $loop (i32.const {calls})))
  (func (export "none") (result i32) (call $loop (i32.const 0))))"""


# Extism's side of ``host-call-native``: ``many`` passes the loop counter to the host function
# ``native64`` (one i64 in, one out) HOST_CALLS times, ``none`` calls nothing.
def extism_native_wat(calls: int) -> str:
    return f"""(module
  (import "extism:host/user" "native64" (func $native64 (param i64) (result i64)))
  (memory (export "memory") 1)
  (func $loop (param $n i32) (result i32)
    (block $done
      (loop $again
        (br_if $done (i32.eqz (local.get $n)))
        (drop (call $native64 (i64.extend_i32_u (local.get $n))))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $again)))
    (i32.const 0))
  (func (export "many") (result i32) (call $loop (i32.const {calls})))
  (func (export "none") (result i32) (call $loop (i32.const 0))))"""
