"""``abort`` never returns: whatever the guest hands it, the call ends as ``panic``."""

from __future__ import annotations

import cbor2
import pytest

from tests.support.common import bare
from tests.support.guests import build, escape, guest_wat, host_import
from wasihost.brokers.core import MAX_PANIC_MESSAGE_CHARS
from wasihost.core.errors import CallError, FailureClass
from wasihost.host.defaults import default_registry
from wasihost.host.runtime import Host

REQUEST_AT = 9000
MEMORY_BYTES = 2 * 65536  # the skeleton's memory
ABORT_MAX_REQUEST = next(
    f.max_request_bytes for f in default_registry().functions() if f.name == "abort"
)


def _aborting_guest(
    request: bytes, *, req_ptr: int = REQUEST_AT, req_len: int | None = None
) -> bytes:
    """A guest that calls ``abort`` and, should it return, answers null as if all went well."""
    length = len(request) if req_len is None else req_len
    body = (
        f"(drop (call $abort (i32.const {req_ptr}) (i32.const {length}) "
        "(i32.const 20000) (i32.const 0))) (call $ok_null)"
    )
    extra = f'(data (i32.const {REQUEST_AT}) "{escape(request)}")' if request else ""
    return build(guest_wat(body, imports=host_import("abort"), extra=extra))


def _panic_of(host: Host, wasm: bytes) -> CallError:
    ext = host.admit(bare(wasm), grants=())
    try:
        with pytest.raises(CallError) as info:
            ext.call("run")
        # The panic is in the extension's log, under the message the embedder saw.
        assert [r.message for r in ext.logs()] == [f"panic: {info.value.message}"]
        return info.value
    finally:
        ext.close()


def test_a_text_message_is_the_panic_message(host: Host) -> None:
    err = _panic_of(host, _aborting_guest(cbor2.dumps("it broke")))
    assert err.failure is FailureClass.PANIC
    assert err.message == "it broke"


def test_a_long_message_is_truncated(host: Host) -> None:
    err = _panic_of(host, _aborting_guest(cbor2.dumps("x" * 1000)))
    assert err.failure is FailureClass.PANIC
    assert err.message == "x" * MAX_PANIC_MESSAGE_CHARS


def test_an_oversized_request_still_panics(host: Host) -> None:
    request = cbor2.dumps("y" * 1997)
    assert len(request) == 2000 > ABORT_MAX_REQUEST
    err = _panic_of(host, _aborting_guest(request))
    assert err.failure is FailureClass.PANIC
    assert err.message == f"(unreadable abort message: 2000 bytes, over {ABORT_MAX_REQUEST})"


@pytest.mark.parametrize(
    "request_bytes",
    [b"\xff\xff", b"\x64ab", b"\x62\xc3\x28", b"\xf6\xf6"],
    ids=["break-codes", "short-text", "bad-utf8", "trailing-bytes"],
)
def test_a_malformed_request_still_panics(host: Host, request_bytes: bytes) -> None:
    err = _panic_of(host, _aborting_guest(request_bytes))
    assert err.failure is FailureClass.PANIC
    assert err.message == "(unreadable abort message: not well-formed CBOR)"


@pytest.mark.parametrize("value", [5, ["not", "text"], b"bytes", {"a": 1}])
def test_a_request_that_is_not_text_still_panics(host: Host, value: object) -> None:
    err = _panic_of(host, _aborting_guest(cbor2.dumps(value)))
    assert err.failure is FailureClass.PANIC
    assert err.message == "(malformed abort message)"


def test_a_request_outside_memory_still_panics(host: Host) -> None:
    err = _panic_of(host, _aborting_guest(b"", req_ptr=MEMORY_BYTES - 4, req_len=100))
    assert err.failure is FailureClass.PANIC
    assert err.message == "(unreadable abort message: outside memory)"


def test_no_request_is_a_plain_abort(host: Host) -> None:
    err = _panic_of(host, _aborting_guest(b""))
    assert err.failure is FailureClass.PANIC
    assert err.message == "guest aborted"
