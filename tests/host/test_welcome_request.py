"""``wasihost.welcome``'s request, made from a template per set of granted capabilities (issue
31): the same bytes as encoding the whole map at every start, and every start's own runtime id,
epoch and token, through grants that change between instances."""

from __future__ import annotations

import os
from typing import Any

import cbor2
import pytest

from tests.support.common import ALL_CAPS, bare
from tests.support.guests import build, guest_wat
from wasihost import Host, Policy
from wasihost.core.codec import encode
from wasihost.core.tokens import TOKEN_BYTES
from wasihost.host import handshake
from wasihost.host.handshake import RUNTIME_ID_BYTES, welcome_request


@pytest.mark.parametrize(
    "capabilities",
    [frozenset(), frozenset({"log"}), frozenset({"log", "clock", "random"}), frozenset(ALL_CAPS)],
)
@pytest.mark.parametrize("epoch", [0, 1, 23, 24, 255, 256, 65_536, 2**32, 2**64 - 1])
def test_the_request_is_the_maps_encoding(capabilities: frozenset[str], epoch: int) -> None:
    runtime_id, token = os.urandom(RUNTIME_ID_BYTES), os.urandom(TOKEN_BYTES)
    granted, request = welcome_request(capabilities, runtime_id, epoch, token)
    whole = {"runtime_id": runtime_id, "granted": sorted(capabilities), "epoch": epoch}
    whole["token"] = token
    assert request == encode(whole) == cbor2.dumps(whole)
    assert granted == tuple(sorted(capabilities))


@pytest.fixture
def welcomes(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every welcome request a host sends from now on, decoded."""
    seen: list[dict[str, Any]] = []
    reserved = handshake._reserved

    def spy(instance: Any, command: str, request: bytes, budget: Any) -> bytes:
        if command == "wasihost.welcome":
            seen.append(cbor2.loads(request))
        return reserved(instance, command, request, budget)

    monkeypatch.setattr(handshake, "_reserved", spy)
    return seen


def _check(host: Host, ext: Any, welcome: dict[str, Any], granted: list[str]) -> None:
    shake = ext.handshake
    assert shake is not None
    assert welcome["runtime_id"] == shake.runtime_id
    assert welcome["granted"] == granted == list(shake.granted)
    assert welcome["epoch"] == shake.epoch == ext.grant.epoch
    host.tokens.verify(welcome["token"], ext.id, shake.runtime_id, shake.epoch)


def test_each_start_is_welcomed_under_the_grant_it_starts_with(
    welcomes: list[dict[str, Any]],
) -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        ext = host.admit(bare(build(guest_wat())), grants=["log"])
        ext.call("run")
        _check(host, ext, welcomes[-1], ["log"])
        ext.stop()
        ext.call("run")  # a second instance: same grant, its own runtime id and token
        assert len(welcomes) == 2
        _check(host, ext, welcomes[-1], ["log"])
        assert welcomes[0]["runtime_id"] != welcomes[1]["runtime_id"]
        assert welcomes[0]["token"] != welcomes[1]["token"]
        epoch = welcomes[-1]["epoch"]
        host.grant(ext.id, "random")
        ext.call("run")  # the grant changed: a new instance, welcomed with it
        assert len(welcomes) == 3
        _check(host, ext, welcomes[-1], ["log", "random"])
        assert welcomes[-1]["epoch"] > epoch
        host.revoke(ext.id, "log")  # the running instance keeps going, refused at its use
        ext.stop()
        ext.call("run")
        _check(host, ext, welcomes[-1], ["random"])
        host.grant(ext.id, "log")  # back to a set seen before, at a later epoch
        ext.call("run")
        _check(host, ext, welcomes[-1], ["log", "random"])
        assert welcomes[-1]["epoch"] > welcomes[2]["epoch"]


def test_extensions_granted_alike_get_their_own_epoch_and_token(
    welcomes: list[dict[str, Any]],
) -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        package = bare(build(guest_wat()))
        first = host.admit(package, grants=["log", "clock"])
        first.call("run")
        _check(host, first, welcomes[-1], ["clock", "log"])
        first.close()
        again = host.admit(package, grants=["log", "clock"])  # the id admitted anew
        again.call("run")
        _check(host, again, welcomes[-1], ["clock", "log"])
        other = host.admit(bare(build(guest_wat())), grants=["clock", "log"])
        other.call("run")
        _check(host, other, welcomes[-1], ["clock", "log"])
        assert len({w["token"] for w in welcomes}) == 3
