"""An entry that commits an effect checks the response buffer first: a guest that retries
after ``BUFFER_TOO_SMALL`` (as ABI section 7 invites) does the effect once."""

from __future__ import annotations

import cbor2

from tests.support.common import bare
from tests.support.guests import build, escape, guest_wat, host_import
from wasihost.core.status import Status
from wasihost.host.runtime import Host

REQUEST = cbor2.dumps([2, "once"])


def _retrying_log_guest(first_cap: int) -> bytes:
    """Logs with ``first_cap`` bytes of response buffer; on BUFFER_TOO_SMALL, retries with 8.
    Any other answer to the first call traps, so the test sees it."""
    log = f"(call $log (i32.const 9000) (i32.const {len(REQUEST)}) (i32.const 20000) (i32.const"
    body = f"""
    (global.set $ret {log} {first_cap})))
    (if (i32.eq (global.get $ret) (i32.const -{int(Status.BUFFER_TOO_SMALL)}))
      (then (global.set $ret {log} 8)))))
    (if (i32.ne (global.get $ret) (i32.const 1)) (then unreachable))
    (call $ok_null)"""
    extra = f"""(data (i32.const 9000) "{escape(REQUEST)}")
  (global $ret (mut i32) (i32.const 0))"""
    return build(guest_wat(body, imports=host_import("log"), extra=extra))


def test_log_with_no_response_room_logs_once_after_the_retry(host: Host) -> None:
    ext = host.admit(bare(_retrying_log_guest(0)), grants=["log"])
    try:
        assert ext.call("run") is None
        assert [r.message for r in ext.logs()] == ["once"]
    finally:
        ext.close()


def test_log_with_room_logs_at_the_first_try(host: Host) -> None:
    ext = host.admit(bare(_retrying_log_guest(1)), grants=["log"])
    try:
        assert ext.call("run") is None
        assert [r.message for r in ext.logs()] == ["once"]
    finally:
        ext.close()
