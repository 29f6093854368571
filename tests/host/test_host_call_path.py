"""The cheap host-call path (issue 12, section 2): statuses answered without an exception, the
log broker's commit through a bound committer, the per-extension gate, and records built
without attrs' frozen ``__init__``. Each keeps the guarantee of the path it replaced."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.common import bare
from tests.support.guests import build, guest_wat
from wasihost.brokers.log import LogBroker
from wasihost.core.extlog import RECORD_OVERHEAD_BYTES, Level, LogRecord
from wasihost.core.grants import GrantTable
from wasihost.core.serving import CallContext
from wasihost.core.status import HostStatus, Status, StatusAnswer
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

RESP_AT = 8192
RESP_CAP = 64


def passing_guest(module: str, name: str, section: str = "") -> bytes:
    """Each command passes its CBOR input to ``module.name`` as the request and answers the
    response, or the negative status as a CBOR integer."""
    body = f"""
    (global.set $r (call $fn (i32.add (local.get $ptr) (local.get $cmd_len)) (local.get $in_len)
                             (i32.const {RESP_AT + 4}) (i32.const {RESP_CAP})))
    (i32.store (i32.const {RESP_AT}) (i32.const 0))
    (if (i32.lt_s (global.get $r) (i32.const 0))
      (then
        (i32.store8 (i32.const {RESP_AT + 4}) (i32.sub (i32.const 0x1f) (global.get $r)))
        (return (call $packed (i32.const {RESP_AT}) (i32.const 5)))))
    (call $packed (i32.const {RESP_AT}) (i32.add (global.get $r) (i32.const 4)))"""
    return build(
        guest_wat(
            body,
            imports=f'(import "{module}" "{name}" (func $fn (param i32 i32 i32 i32) (result i32)))'
            + section,
            extra="(global $r (mut i32) (i32.const 0))",
        )
    )


LOG_GUEST = passing_guest("wasihost_v1", "log")
LOOKUP_GUEST = passing_guest("myapp_v1", "lookup", '(@custom "wasihost_abi.myapp" "1.0")')


@pytest.fixture
def host() -> Iterator[Host]:
    with Host(Policy(allow={"log", "myapp.read"}), cache_dir=None) as h:
        yield h


def test_a_returned_status_answer_reaches_the_guest_as_a_raised_one_does(host: Host) -> None:
    @host.function(
        "myapp.lookup",
        capability="myapp.read",
        max_request_bytes=64,
        max_response_bytes=32,
        fuel_base=500,
        fuel_per_byte=2,
    )
    def lookup(ctx: CallContext, request: Any) -> Any:
        if request == "answered":
            return StatusAnswer.of(Status.NOT_FOUND)
        if request == "raised":
            raise HostStatus(Status.NOT_FOUND)
        return None if request == "null" else {"echo": request}

    ext = host.admit(bare(LOOKUP_GUEST), grants=["myapp.read"])
    assert ext.call("run", "answered") == -Status.NOT_FOUND
    assert ext.call("run", "raised") == -Status.NOT_FOUND
    assert ext.call("run", "null") is None
    assert ext.call("run", 7) == {"echo": 7}
    assert StatusAnswer.of(Status.QUOTA_EXCEEDED) is StatusAnswer.of(Status.QUOTA_EXCEEDED)
    with pytest.raises(ValueError, match="other than OK"):
        StatusAnswer.of(Status.OK)
    with pytest.raises(ValueError, match="other than OK"):
        StatusAnswer(Status.OK)


def test_the_log_checks_the_request_shape_and_a_full_log_answers_quota(host: Host) -> None:
    ext = host.admit(bare(LOG_GUEST), grants=["log"])
    # Room for two records of 60 bytes (and their overhead each), not for a third of one byte.
    ext.log.max_bytes = 2 * (60 + RECORD_OVERHEAD_BYTES) + RECORD_OVERHEAD_BYTES // 2
    for bad in ([5, "x"], [-1, "x"], [True, "x"], ["2", "x"], [2, b"x"], [2], [2, "x", 3], {}):
        assert ext.call("run", bad) == -Status.INVALID_ARGUMENT, bad
    assert ext.log.records == ()
    assert ext.call("run", [4, "é" * 30]) is None  # 60 bytes of UTF-8: counted as such
    assert ext.call("run", [0, "x" * 60]) is None
    assert ext.call("run", [2, "x"]) == -Status.QUOTA_EXCEEDED
    assert ext.call("run", [2, "x"]) == -Status.QUOTA_EXCEEDED
    assert [(r.level, r.message) for r in ext.log.records] == [
        (Level.ERROR, "é" * 30),
        (Level.TRACE, "x" * 60),
    ]
    assert ext.log.dropped == 2
    ext.log.drain()
    assert ext.call("run", [3, "again"]) is None


def test_a_record_is_a_frozen_log_record_equal_to_one_built_by_its_constructor(
    host: Host,
) -> None:
    ext = host.admit(bare(LOG_GUEST), grants=["log"])
    assert ext.call("run", [3, "hello"]) is None
    (record,) = ext.log.records
    assert type(record) is LogRecord
    assert record == LogRecord(Level.WARN, "hello", record.time_ns, "guest")
    assert hash(record) == hash(LogRecord(Level.WARN, "hello", record.time_ns, "guest"))
    with pytest.raises(AttributeError):
        record.message = "changed"  # type: ignore[misc]


def test_the_log_commit_is_refused_once_a_revocation_returned(host: Host) -> None:
    """The log broker's bound committer checks the call's epoch under the grant lock, as
    ``Extension.commit`` does: a record authorised before a revocation never lands after."""
    ext = host.admit(bare(LOG_GUEST), grants=["log"])
    assert ext.call("run", [2, "before"]) is None  # the instance and its broker state exist
    entry = host.registry.lookup("wasihost_v1", "log")
    assert entry is not None
    handle = LogBroker().handler(entry, ext)
    assert handle(None, [2, "authorised"]) is None  # the call's epoch is still current
    host.revoke(ext.id, "log")  # the call in flight keeps its old epoch
    assert handle(None, [2, "late"]) is StatusAnswer.of(Status.DENIED)
    assert [r.message for r in ext.log.records] == ["before", "authorised"]


def test_a_committer_never_commits_after_a_racing_revocation_returns() -> None:
    table = GrantTable()
    epoch = table.grant("x", "log")
    commit = table.committer("x", "log")
    landed: list[int] = []
    revoked_at: list[int] = []
    start = threading.Barrier(2)

    def committing() -> None:
        start.wait()
        for i in range(20_000):
            if not commit(epoch, landed.append, i)[0]:
                break

    thread = threading.Thread(target=committing)
    thread.start()
    start.wait()
    table.revoke("x", "log")
    revoked_at.append(len(landed))  # read after revoke returned: nothing may land from now
    thread.join()
    assert len(landed) == revoked_at[0]
    assert commit(epoch, landed.append, -1) == (False, None)
    assert table.committer("x", "core")(table.epoch("x"), lambda: "core") == (True, "core")


def test_the_bound_gate_agrees_with_the_grant_table() -> None:
    table = GrantTable()
    gate = table.authorizer("x")
    assert gate(0, "core") == table.authorizes("x", 0, "core")  # loaded on first use
    epoch = table.grant("x", "log")
    cases = [(epoch, "log"), (epoch, "core"), (epoch, "http"), (epoch - 1, "log")]
    for args in cases:
        assert gate(*args) == table.authorizes("x", *args), args
    assert [gate(*args) for args in cases] == [True, True, False, False]
    table.revoke("x", None, "test")
    assert [gate(*args) for args in cases] == [False] * 4
    assert table.authorizer("unseen")(0, "core") is True


def test_an_extension_gate_refuses_an_ungranted_capability_and_remembers_it(host: Host) -> None:
    ext: Extension = host.admit(bare(LOG_GUEST), grants=["log"])
    assert ext.call("run", [2, "x"]) is None
    host.revoke(ext.id, "log")
    assert ext.call("run", [2, "x"]) == -Status.DENIED
    assert "log" in ext.denied_capabilities


def test_a_host_status_still_reads_as_its_name() -> None:
    with pytest.raises(HostStatus, match="^NOT_FOUND$") as info:
        raise HostStatus(Status.NOT_FOUND)
    assert info.value.status is Status.NOT_FOUND
    assert repr(StatusAnswer.of(Status.NOT_FOUND)) == "StatusAnswer(NOT_FOUND)"
