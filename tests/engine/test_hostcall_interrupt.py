"""A host call of an interrupted instance runs no handler, on every path: the cbor convention
(core entries, brokers, embedder functions), async embedder functions and the native
convention. The interrupt is made deterministic: an embedder function closes the extension from
inside the call (``Extension.close`` interrupts every instance, as a revocation does, without
touching the grants), and the same guest call then makes one more host call."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.common import bare
from tests.support.guests import build, escape, guest_wat, host_import
from wasihost.core.lifecycle import ExtensionUnavailable
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

LOG_REQUEST = b"\x82\x02\x65after"  # [2, "after"]: an info record
NULL = b"\xf6"

# After the halting call, the command makes the host call named by its length.
NEXT_CALLS = {
    "log": f"(drop (call $log (i32.const 9000) (i32.const {len(LOG_REQUEST)}) "
    "(i32.const 9500) (i32.const 16)))",
    "sync": "(drop (call $sync (i32.const 9100) (i32.const 1) (i32.const 9500) (i32.const 16)))",
    "async": "(drop (call $async (i32.const 9100) (i32.const 1) (i32.const 9500) (i32.const 16)))",
    "native": "(call $native (i64.const 7))",
}


def halting_guest(then: str) -> bytes:
    """``run`` calls ``myapp_v1.halt`` (which interrupts the instance), then ``then``'s call."""
    body = f"""
    (drop (call $halt (i32.const 9100) (i32.const 1) (i32.const 9500) (i32.const 16)))
    {NEXT_CALLS[then]}
    (call $ok_null)"""
    cbor = "(param i32 i32 i32 i32) (result i32)"
    imports = (
        host_import("log")
        + f'(import "myapp_v1" "halt" (func $halt {cbor}))'
        + f'(import "myapp_v1" "sync" (func $sync {cbor}))'
        + f'(import "myapp_v1" "async" (func $async {cbor}))'
        + '(import "myapp_v1" "native" (func $native (param i64)))'
        + '(@custom "wasihost_abi.myapp" "1.0")'
    )
    data = (
        f'(data (i32.const 9000) "{escape(LOG_REQUEST)}")(data (i32.const 9100) "{escape(NULL)}")'
    )
    return build(guest_wat(body, imports=imports, extra=data))


@pytest.mark.parametrize("then", list(NEXT_CALLS))
def test_no_host_call_handler_runs_once_the_instance_is_interrupted(then: str) -> None:
    """Break: the cbor dispatch never looked at the instance's interrupt, so a host call made
    after a close (or a revocation, disable or cancel) on another thread, before the next
    epoch tick, still ran its handler: a log record committed after ``close()`` returned. Every
    host-call path now ends the call as the instance's interrupted failure before its handler,
    and an async function's coroutine is never started."""
    ran: list[str] = []
    with Host(Policy(allow={"log", "myapp.use"}), cache_dir=None) as host:
        exts: list[Any] = []
        options = {
            "capability": "myapp.use",
            "max_request_bytes": 16,
            "max_response_bytes": 16,
            "fuel_per_byte": 1,
        }

        @host.function("myapp.halt", fuel_base=100, **options)
        def halt(ctx: Any, request: Any) -> None:
            exts[0].close("closed from inside a host call")

        @host.function("myapp.sync", fuel_base=100, **options)
        def sync(ctx: Any, request: Any) -> None:
            ran.append("sync")

        @host.function("myapp.async", fuel_base=100, **options)
        async def run_async(ctx: Any, request: Any) -> None:
            ran.append("async")

        @host.function(
            "myapp.native",
            capability="myapp.use",
            convention="native",
            params=("i64",),
            results=(),
            fuel_base=100,
        )
        def native(ctx: Any, value: int) -> None:
            ran.append("native")

        ext = host.admit(bare(halting_guest(then)), grants=["log", "myapp.use"])
        exts.append(ext)
        ext.log.drain()
        with pytest.raises(ExtensionUnavailable, match="closed from inside a host call"):
            ext.call("run")
        assert [r for r in ext.log.drain() if "after" in str(r)] == []
        assert ran == []
