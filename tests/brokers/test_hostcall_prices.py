"""Host work that grows with what the guest asks is paid per step, before the step: a path walk
per component (symlink targets included), a storage_list page per key, an embedder function
per item it charges. Counts, not timings: the timing ratios are
benchmarks/bench_hostcall_prices.py's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import bare
from tests.support.guests import build, guest_wat, host_import
from wasihost.brokers import files as files_broker
from wasihost.brokers import storage as storage_broker
from wasihost.brokers.files import FilesBroker
from wasihost.core.errors import CallError, FailureClass
from wasihost.engine.native import SETTLE_FUEL
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

RESP_AT = 12292


def passing_guest(embedder: bool = False) -> bytes:
    """``o`` passes its CBOR input to ``file_open``, ``ls`` to ``storage_list`` (or, for the
    ``embedder`` guest, ``fn`` to ``myapp_v1.items``); each answers what the import returned
    (the response's length, or a negated status) as a CBOR int."""
    call = "(i32.add (local.get $ptr) (local.get $cmd_len)) (local.get $in_len) " + (
        f"(i32.const {RESP_AT}) (i32.const 4096)"
    )
    calls = (
        f"(global.set $r (call $items {call}))"
        if embedder
        else f"""(if (i32.eq (i32.load8_u (local.get $ptr)) (i32.const 111))  ;; o
      (then (global.set $r (call $file_open {call}))))
    (if (i32.eq (i32.load8_u (local.get $ptr)) (i32.const 108))  ;; ls
      (then (global.set $r (call $storage_list {call}))))"""
    )
    body = f"""
    {calls}
    (i32.store (i32.const 8000) (i32.const 0))
    (i32.store8 (i32.const 8004) (i32.const 0x3a))  ;; a negative int, 4-byte argument
    (i32.store (i32.const 8005) (i32.const 0))
    (i32.store8 (i32.const 8008) (i32.sub (i32.const -1) (global.get $r)))
    (if (i32.ge_s (global.get $r) (i32.const 0))
      (then (i32.store8 (i32.const 8004) (i32.const 0x1a))
            (i32.store8 (i32.const 8008) (global.get $r))))
    (call $packed (i32.const 8000) (i32.const 9))"""
    imports = (
        '(import "myapp_v1" "items" (func $items (param i32 i32 i32 i32) (result i32)))'
        '(@custom "wasihost_abi.myapp" "1.0")'
        if embedder
        else host_import("file_open") + host_import("storage_list")
    )
    return build(
        guest_wat(body, marker="1.1", imports=imports, extra="(global $r (mut i32) (i32.const 0))")
    )


def chain(mount: Path, name: str, links: int, run: int, end: str) -> None:
    """``name`` -> a symlink chain of ``links`` links, each target ``run`` times ``d/../``
    then the next link (the last: ``end``): a walk of about 2 * run * links steps."""
    names = [name] + [f"{name}.{i}" for i in range(1, links)]
    for i, link in enumerate(names):
        target = "d/../" * run + (names[i + 1] if i + 1 < links else end)
        os.symlink(target, mount / link)


@pytest.fixture
def mount(tmp_path: Path) -> Path:
    root = tmp_path / "m"
    root.mkdir()
    (root / "d").mkdir()
    chain(root, "long", links=8, run=100, end="new.txt")  # 1,609 steps
    chain(root, "ten", links=1, run=5, end="t.txt")  # 12 steps
    chain(root, "twe", links=1, run=10, end="t.txt")  # 22 steps, a name of the same length
    (root / "t.txt").write_bytes(b"t")
    return root


def files_host(tmp_path: Path, mount: Path) -> tuple[Host, Any]:
    host = Host(
        Policy(allow={"files", "storage"}),
        cache_dir=None,
        brokers=[FilesBroker(temp_dir=tmp_path)],
    )
    ext = host.admit(bare(passing_guest()), grants=["files", "storage"])
    host.grant(ext.id, "files", {"mounts": {"m": {"host": str(mount), "mode": "rw"}}})
    return host, ext


def test_the_walks_price_grows_by_its_step_price_per_step(tmp_path: Path, mount: Path) -> None:
    """Two requests of the same length whose walks differ by 10 steps (a symlink's target of
    5 ``d/..`` pairs more): the longer costs exactly 10 steps' price more."""
    host, ext = files_host(tmp_path, mount)
    with host:
        ext.call("o", ["m", "ten", "r"])  # warm: the first call's fuel includes set-up
        fuel = {}
        for name in ("ten", "twe"):
            assert ext.call("o", ["m", name, "r"]) >= 1
            fuel[name] = ext.last_fuel_used
        assert fuel["twe"] - fuel["ten"] == 10 * files_broker.FUEL_PER_WALK_STEP


@pytest.mark.parametrize("kind", ["symlink-chain", "plain-path"])
def test_a_walk_the_budget_cannot_pay_stops_out_of_fuel_and_creates_nothing(
    tmp_path: Path, mount: Path, kind: str
) -> None:
    """Break: file_open walked every component for its flat price (5,000 units): a 4,096-step
    walk through a symlink chain cost the host ~7 ms of CPU, ~10,000x what the same fuel buys
    in guest code. Each step past the base price's now charges the call before it is walked:
    a budget just short of the walk's price ends ``out_of_fuel`` with the file not created and
    no handle taken; with the price it succeeds."""
    path = "long" if kind == "symlink-chain" else "d/../" * 200 + "new.txt"
    host, ext = files_host(tmp_path, mount)
    with host:
        # What the whole call costs: a one-step open's, plus the further steps' price.
        ext.call("o", ["m", "t.txt", "r"])
        base = ext.last_fuel_used
        steps = 1 + 8 * (2 * 100 + 1) if kind == "symlink-chain" else 2 * 200 + 1
        price = base + (steps - files_broker.WALK_STEPS_IN_BASE) * files_broker.FUEL_PER_WALK_STEP
        assert price > 4 * SETTLE_FUEL  # the walk dominates, well past the settling batch
        short = price - 2 * SETTLE_FUEL
        with pytest.raises(CallError) as info:
            ext.call("o", ["m", path, "w"], fuel=short)
        assert info.value.failure is FailureClass.OUT_OF_FUEL
        assert not (mount / "new.txt").exists()
        # A handle (one CBOR byte) this time.
        assert ext.call("o", ["m", path, "w"], fuel=price + 2 * SETTLE_FUEL) == 1
        assert (mount / "new.txt").exists()


def test_a_storage_list_page_is_paid_per_key_it_may_hold(tmp_path: Path, mount: Path) -> None:
    """storage_list's work grows with the page's limit (keys read, decoded, encoded): a page of
    99 costs 75 keys' price more than a page of 24 (the same request length), and a budget
    that cannot pay for the page ends the call before the scan."""
    host, ext = files_host(tmp_path, mount)
    with host:
        ext.call("ls", ["", None, 24])
        fuel = {}
        for limit in (24, 99):
            assert ext.call("ls", ["", None, limit]) >= 0
            fuel[limit] = ext.last_fuel_used
        assert fuel[99] - fuel[24] == 75 * storage_broker.FUEL_PER_LISTED_KEY


def test_an_embedder_function_charges_per_item_through_its_context(tmp_path: Path) -> None:
    """``CallContext.charge``: an embedder function paying per item before each ends its
    guest's call ``out_of_fuel`` part-way when the budget runs out, and the items done are
    the ones paid for (the settling batch aside)."""
    done: list[int] = []
    price = 50_000
    with Host(Policy(allow={"myapp.use"}), cache_dir=None) as host:

        @host.function(
            "myapp.items",
            capability="myapp.use",
            max_request_bytes=16,
            max_response_bytes=16,
            fuel_base=100,
            fuel_per_byte=1,
        )
        def items(ctx: Any, request: Any) -> int:
            for i in range(request):
                ctx.charge(price)
                done.append(i)
            return len(done)

        ext = host.admit(bare(passing_guest(embedder=True)), grants=["myapp.use"])
        assert ext.call("fn", 3) == 1  # one byte written: 3
        assert done == [0, 1, 2]
        done.clear()
        budget = 2_000_000
        with pytest.raises(CallError) as info:
            ext.call("fn", 1000, fuel=budget)
        assert info.value.failure is FailureClass.OUT_OF_FUEL
        assert len(done) * price <= budget + SETTLE_FUEL
        assert len(done) < 1000
        assert ext.call("fn", 0) > 0  # the next call runs
