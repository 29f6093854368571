"""What a start remembers: admission plans per sealed registry, and the checks of the
handshake's answers per distinct answer. Neither may let through anything the full work
would refuse."""

from __future__ import annotations

import hashlib

import pytest

from tests.support.common import ALL_CAPS, bare
from tests.support.guests import build, guest_wat, host_import
from wasihost import Host, Policy
from wasihost.core.errors import AdmissionError, CallError, FailureClass
from wasihost.core.registry import MEMO_ENTRIES, Registry

ECHO_HELLO = {"id": "org.test.wat", "version": "0.1.0", "abi": "1.0", "features": []}


def test_a_package_admitted_again_reuses_its_plan(host: Host) -> None:
    package = bare(build(guest_wat()))
    first = host.admit(package)
    plan = first.plan
    first.close()
    second = host.admit(package)
    assert second.plan is plan
    assert second.call("noop") is None


def test_a_plan_is_not_reused_under_other_caps(host: Host) -> None:
    package = bare(build(guest_wat()))
    ext = host.admit(package)
    plan = ext.plan
    ext.close()
    smaller = host.admit(package, fuel=1_000_000)  # fuel is not a key: same plan
    assert smaller.plan is plan
    smaller.close()
    other = Host(Policy(allow=ALL_CAPS), cache_dir=None)
    try:
        assert other.admit(package).plan is not plan  # another registry, its own memo
    finally:
        other.close()


def test_a_refused_admission_is_refused_every_time_and_never_remembered() -> None:
    wasm = build(guest_wat(imports=host_import("random_bytes")))
    with Host(Policy(allow=frozenset({"log"})), cache_dir=None) as host:
        host.admit(bare(build(guest_wat())))  # seals the registry
        messages = []
        for _ in range(2):
            with pytest.raises(AdmissionError) as refused:
                host.admit(bare(wasm, "random-guest.wasm"))
            messages.append(str(refused.value))
        assert messages[0] == messages[1]
        assert "needs capability 'random', which is not granted" in messages[0]
        digest = hashlib.sha256(wasm).hexdigest()
        assert not any(key[0] == "plan" and key[1] == digest for key in host.registry.memo)
        assert any(key[0] == "plan" for key in host.registry.memo)  # the sealing one's


def test_the_memo_is_bounded_and_empty_before_the_registry_is_sealed() -> None:
    registry = Registry()
    registry.remember("early", 1)
    assert registry.memo == {}
    registry.seal()
    for i in range(MEMO_ENTRIES + 10):
        registry.remember(i, i)
    assert len(registry.memo) == MEMO_ENTRIES
    assert 0 not in registry.memo and MEMO_ENTRIES + 9 in registry.memo


def test_a_malformed_hello_answer_is_refused_at_every_start(host: Host) -> None:
    ext = host.admit(bare(build(guest_wat(hello={"id": "org.test.wat", "version": 1}))))
    for _ in range(2):
        with pytest.raises(CallError) as refused:
            ext.call("noop")
        assert refused.value.failure is FailureClass.HANDSHAKE
        assert "field 'version' missing or mistyped" in refused.value.message
        if ext.lifecycle.state.name == "QUARANTINED":
            host.release(ext.id)


def test_the_same_answer_bytes_still_meet_each_extensions_own_checks(host: Host) -> None:
    """Two modules answer byte-identical hellos saying ABI 1.0: the one whose marker says 1.0
    starts, the one whose marker says 1.1 is refused, after the first answer's checks were
    remembered."""
    ok = host.admit(bare(build(guest_wat(hello=ECHO_HELLO))))
    assert ok.call("noop") is None
    liar = host.admit(bare(build(guest_wat(hello=ECHO_HELLO, marker="1.1"))))
    with pytest.raises(CallError) as refused:
        liar.call("noop")
    assert refused.value.failure is FailureClass.HANDSHAKE
    assert "guest says ABI '1.0', its marker says 1.1" in refused.value.message


def test_a_failed_readiness_is_refused_at_every_start(host: Host) -> None:
    ext = host.admit(bare(build(guest_wat(welcome={"status": "failed", "reason": "no disk"}))))
    for _ in range(2):
        with pytest.raises(CallError) as refused:
            ext.call("noop")
        assert "guest reported failed start-up: no disk" in refused.value.message
        if ext.lifecycle.state.name == "QUARANTINED":
            host.release(ext.id)


def test_a_remembered_plan_never_outlives_the_grant_it_was_made_under(host: Host) -> None:
    """A module importing ``log``, admitted with it granted, then admitted again once the
    policy no longer allows it: the remembered plan is not reused, the import refuses it."""
    package = bare(build(guest_wat(imports=host_import("log"))), "logs.wasm")
    first = host.admit(package, grants=["log"])
    assert first.call("noop") is None
    first.close()
    host.update_policy(Policy(allow=frozenset()))
    with pytest.raises(AdmissionError) as refused:
        host.admit(package)
    assert "needs capability 'log', which is not granted" in str(refused.value)
