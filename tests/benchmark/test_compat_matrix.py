"""The compatibility matrix of `wasihost bench`, pinned: every fixture guest (and the WAT guests
the bench builds) x every view the host serves (1.0, 1.1, 2.0) x runtime class gives exactly
this verdict and reason class, through the real admission and engine. Timings are not pinned.
Also: a v1.0 binary committed before ABI 1.1 and 2.0 existed still runs on this host."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from tests.support.common import FIXTURES, ROOT, bare
from wasihost.benchmark.compat import matrix
from wasihost.benchmark.runner import Budget
from wasihost.core.registry import AbiVersion
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

RAN = ("ran", None)
V1_ONLY = (RAN, RAN, ("refused", "other-major"))  # a 1.0 guest
V11_ONLY = (("refused", "newer-minor"), RAN, ("refused", "other-major"))  # a 1.1 guest
V2_ONLY = (("refused", "other-major"), ("refused", "other-major"), RAN)  # a 2.0 guest
WASI = (("linked", "wasi-command"),) * 3
PACKAGE = (("refused", "package"),) * 3

# guest -> (view 1.0, view 1.1, view 2.0), each (verdict, reason class).
EXPECTED: dict[str, tuple[tuple[str, str | None], ...]] = {
    # appfns needs an embedder's namespace (myapp.read), which the bench's host lacks.
    "appfns": PACKAGE,
    # nativefns likewise (myapp.math).
    "nativefns": PACKAGE,
    **dict.fromkeys(
        (
            "badptr",
            "clock-random",
            "compute",
            "echo",
            "hello",
            "hostflood",
            "logger",
            "memhog",
            "oversize",
            "panics",
            "recurse",
            "spin",
            "traps",
        ),
        V1_ONLY,
    ),
    **dict.fromkeys(
        ("events", "files", "httpget", "jobbudget", "jobs", "rawecho", "secrets", "storage"),
        V11_ONLY,
    ),
    "logger-v2": V2_ONLY,
    # Declares 1.0 and imports random_bytes without asking for it: refused by admission.
    "ungranted": (("refused", "admission"), ("refused", "admission"), ("refused", "other-major")),
    **dict.fromkeys(("wasi-bench", "wasi-libc", "wasi-probe", "wasi-std"), WASI),
    "wat-1.0-noop": V1_ONLY,
    "wat-1.1-imports-storage_get": V11_ONLY,
    # A 1.0 guest importing a 1.1 entry: refused by name on every view of its major.
    "wat-1.0-imports-storage_get": (
        ("refused", "admission"),
        ("refused", "admission"),
        ("refused", "other-major"),
    ),
    "wat-2.0-noop": V2_ONLY,
    "wat-2.0-imports-log": V2_ONLY,
    # A 2.0 guest importing from wasihost_v1: majors do not mix, even on its own view.
    "wat-2.0-imports-wasihost_v1": (
        ("refused", "other-major"),
        ("refused", "other-major"),
        ("refused", "admission"),
    ),
}


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    return matrix(FIXTURES, Budget(1, 0.001))


def test_the_matrix_is_exactly_the_pinned_one(rows: list[dict[str, Any]]) -> None:
    views = ("1.0", "1.1", "2.0")
    got = {
        guest: tuple(
            next(
                (r["verdict"], r["reason_class"])
                for r in rows
                if (r["guest"], r["view"], r["runtime"]) == (guest, view, "in-process")
            )
            for view in views
        )
        for guest in dict.fromkeys(r["guest"] for r in rows)
    }
    assert got == EXPECTED
    assert {r["view"] for r in rows} == set(views)
    # Every cell also has its out-of-process twin (the guest in a walled child), and the
    # process runtime gives every guest on every view the same verdict.
    outside = {
        (r["guest"], r["view"]): (r["verdict"], r["reason_class"])
        for r in rows
        if r["runtime"] == "out-of-process"
    }
    assert len(outside) == len(EXPECTED) * len(views)
    assert outside == {
        (guest, view): verdict
        for guest, verdicts in EXPECTED.items()
        for view, verdict in zip(views, verdicts, strict=True)
    }


def test_refusals_name_what_is_missing_and_runs_have_a_cost(rows: list[dict[str, Any]]) -> None:
    cell = {(r["guest"], r["view"]): r for r in rows if r["runtime"] == "in-process"}
    assert "import wasihost_v1.storage_get: not in ABI 1.0" in cell[("storage", "1.0")]["reason"]
    assert "the 2.0 view serves major 2" in cell[("echo", "2.0")]["reason"]
    assert "the 1.1 view serves major 1" in cell[("logger-v2", "1.1")]["reason"]
    assert (
        "unknown import module 'wasihost_v1'"
        in cell[("wat-2.0-imports-wasihost_v1", "2.0")]["reason"]
    )
    assert (
        "added in ABI 1.1, but the module declares 1.0"
        in (cell[("wat-1.0-imports-storage_get", "1.1")]["reason"])
    )
    # A guest with a noop command that ran has its per-call cost, on every view that ran it.
    for guest, view in [("echo", "1.0"), ("echo", "1.1"), ("logger-v2", "2.0"),
                        ("wat-2.0-imports-log", "2.0")]:  # fmt: skip
        assert cell[(guest, view)]["call_cost"]["median_us"] > 0


LEGACY = ROOT / "tests" / "data" / "legacy" / "echo-1.0-4c7fc77.wasm"
LEGACY_SHA256 = "9b509afcefd4f727d39cb9b624e8fcda1c8c3175d06f69ce6901f4e4a06b2c40"


def test_a_v1_0_binary_built_before_v1_1_still_runs() -> None:
    """fixtures/echo as committed at 4c7fc77, before ABI 1.1 (68d7b0b) and 2.0 existed: the
    same bytes run on a host serving 1.0, 1.1 and 2.0 at once, linked against the 1.0 view."""
    wasm = LEGACY.read_bytes()
    assert hashlib.sha256(wasm).hexdigest() == LEGACY_SHA256
    with Host(Policy(), cache_dir=None) as host:
        ext = host.admit(bare(wasm))
        assert ext.plan.version == AbiVersion(1, 0)
        assert ext.plan.view.lookup("wasihost_v1", "storage_get") is None
        assert ext.call("echo", {"k": [1, "two", b"3"]}) == {"k": [1, "two", b"3"]}
        assert ext.call("noop", 5) is None
        assert ext.handshake is not None and ext.handshake.abi == "1.0"
