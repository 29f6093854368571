"""Extension.call's inlined availability check (nothing changed since the last call) against
the whole check, through the real engine: after every operator action each path refuses or
serves the same way, with the same error."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.common import ALL_CAPS, FIXTURES
from wasihost.host.policy import Policy
from wasihost.host.runtime import Extension, Host

ECHO = "org.wasihost.fixtures.echo"

# Each step acts on (host, extension) between two calls.
Step = Callable[[Host, Extension], Any]
STEPS: list[tuple[str, Step]] = [
    ("nothing", lambda host, ext: None),
    ("grant log", lambda host, ext: host.grant(ECHO, "log")),
    ("revoke log", lambda host, ext: host.revoke(ECHO, "log")),
    ("pause", lambda host, ext: ext.pause("operator")),
    ("resume", lambda host, ext: ext.resume()),
    ("quarantine", lambda host, ext: ext.quarantine("tests")),
    ("release", lambda host, ext: host.release(ECHO)),
    ("stop", lambda host, ext: ext.stop()),
    ("disable", lambda host, ext: host.disable(ECHO, "emergency")),
    ("reinstate", lambda host, ext: host.reinstate(ECHO)),
    ("close", lambda host, ext: ext.close()),
]


def outcome(ext: Extension, *, whole_check: bool) -> tuple[str, str]:
    if whole_check:
        ext._seen_grants = None  # what the inlined check trusts: gone, so the whole one runs
    try:
        return "ok", repr(ext.call("echo", b"x" * 64))
    except Exception as exc:  # compared by type and text
        return type(exc).__name__, str(exc)


@pytest.fixture
def pair() -> Iterator[tuple[Host, Extension, Host, Extension]]:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as fast_host, Host(
        Policy(allow=ALL_CAPS), cache_dir=None
    ) as whole_host:
        yield (
            fast_host,
            fast_host.load(FIXTURES / "echo"),
            whole_host,
            whole_host.load(FIXTURES / "echo"),
        )


def test_every_operator_action_meets_the_same_answer_on_both_paths(
    pair: tuple[Host, Extension, Host, Extension],
) -> None:
    fast_host, fast, whole_host, whole = pair
    seen = []
    for name, step in STEPS:
        for host, ext in ((fast_host, fast), (whole_host, whole)):
            try:
                step(host, ext)
            except Exception as exc:  # an action refused in this state: on both alike
                seen.append((name, "action", type(exc).__name__))
        for _ in range(2):  # the first call after the action, then the one after it
            got = outcome(fast, whole_check=False)
            assert got == outcome(whole, whole_check=True), name
            seen.append((name, *got))
    # The steps did reach refusals and served calls alike (the comparison is not vacuous).
    kinds = {kind for _, kind, *_ in seen}
    assert "ok" in kinds and {"ExtensionRevoked", "ExtensionUnavailable"} <= kinds, seen
