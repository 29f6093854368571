"""Hostile guest bytes at the boundary: whatever a guest hands the host, the host answers with
a status code or fails the call with a CallError of a defined class; nothing else escapes."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.common import ALL_CAPS, bare
from tests.support.guests import build, escape, guest_wat, host_import
from wasihost.core.errors import CallError, FailureClass
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

HOST = Host(Policy(allow=ALL_CAPS), cache_dir=None)
SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _response_guest(status: int, body: bytes) -> bytes:
    blob = status.to_bytes(4, "little") + body
    return build(
        guest_wat(
            f"(call $packed (i32.const 9000) (i32.const {len(blob)}))",
            extra=f'(data (i32.const 9000) "{escape(blob)}")',
        )
    )


@SLOW
@given(st.integers(min_value=0, max_value=2**32 - 1), st.binary(max_size=300))
def test_any_response_body_is_a_value_or_a_defined_failure(status: int, body: bytes) -> None:
    ext = HOST.admit(bare(_response_guest(status, body)))
    try:
        value: Any = ext.call("run")
    except CallError as exc:
        assert exc.failure in (FailureClass.PROTOCOL, FailureClass.GUEST_ERROR)
        assert len(exc.message) <= 1024
    else:
        assert status == 0
        assert value is None or isinstance(value, (bool, int, float, str, bytes, list, dict))
    finally:
        ext.close()


@SLOW
@given(st.binary(max_size=200), st.sampled_from(["log", "clock_now", "random_bytes"]))
def test_any_request_bytes_get_a_status(request: bytes, entry: str) -> None:
    body = (
        f"(drop (call ${entry} (i32.const 9000) (i32.const {len(request)}) "
        "(i32.const 20000) (i32.const 8192))) (call $ok_null)"
    )
    extra = f'(data (i32.const 9000) "{escape(request)}")' if request else ""
    wasm = build(guest_wat(body, imports=host_import(entry), extra=extra))
    ext = HOST.admit(bare(wasm), grants=["log", "clock", "random"])
    try:
        assert ext.call("run") is None
    finally:
        ext.close()
        ext.log.drain()


@SLOW
@given(
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=0, max_value=2**32 - 1),
)
def test_any_pointers_are_served_or_trapped_as_protocol(
    req_ptr: int, req_len: int, resp_ptr: int, resp_cap: int
) -> None:
    def i32(v: int) -> int:
        return v - (1 << 32) if v >= 1 << 31 else v

    call = (
        f"(drop (call $log (i32.const {i32(req_ptr)}) (i32.const {i32(req_len)}) "
        f"(i32.const {i32(resp_ptr)}) (i32.const {i32(resp_cap)}))) (call $ok_null)"
    )
    ext = HOST.admit(bare(build(guest_wat(call, imports=host_import("log")))), grants=["log"])
    memory = 2 * 65536  # the skeleton's memory
    in_bounds = req_ptr + req_len <= memory and resp_ptr + resp_cap <= memory
    try:
        ext.call("run")
        assert in_bounds
    except CallError as exc:
        assert exc.failure is FailureClass.PROTOCOL
    finally:
        ext.close()
        ext.log.drain()
