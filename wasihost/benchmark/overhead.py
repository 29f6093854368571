"""Fuel and limits overhead: fixtures/compute's ``run {"n": N}`` on four raw wasmtime engines
that differ only in metering (none, fuel, epoch deadlines, both), interleaved. wasihost always
runs with both; its own call of the same command is shown beside them for scale. The raw path
is wasmtime-py's generic API: at milliseconds per call its crossing cost is negligible."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from .hosts import bench_policy
from .runner import Budget, Op, interleave, median, spread
from .systems import handshake

# Enough for 1,000,000 rounds of the compute loop (about 10-30 fuel each), with room.
OVERHEAD_FUEL = 100_000_000

VARIANTS = {
    "none": (False, False),
    "fuel": (True, False),
    "epoch": (False, True),
    "fuel+epoch": (True, True),
}


def overhead(fixtures: Path, rounds: int, budget: Budget) -> list[dict[str, Any]]:
    import cbor2

    from ..engine.benchraw import RawModule
    from ..host.runtime import Host

    wasm = (fixtures / "compute" / "compute.wasm").read_bytes()
    request = cbor2.dumps({"n": rounds})
    ops: dict[str, Op] = {}
    answers = set()
    for name, (fuel, epoch) in VARIANTS.items():
        guest = RawModule(wasm, fuel=fuel, epoch=epoch).instantiate()
        handshake(guest)
        answers.add(guest.call(b"run", request))
        ops[f"raw {name}"] = functools.partial(guest.call, b"run", request)
    if len(answers) != 1:
        raise RuntimeError("the metering variants computed different results")
    host = Host(bench_policy(), cache_dir=None)
    try:
        # The manifest's 10M fuel covers about 300,000 rounds; the full run asks for more.
        ext = host.load(fixtures / "compute", fuel=OVERHEAD_FUEL)
        value = {"n": rounds}
        ext.call("run", value)
        ops["wasihost (fuel+epoch)"] = lambda: ext.call("run", value)
        samples = interleave(ops, budget)
    finally:
        host.close()
    base = median(samples["raw none"])
    return [
        {
            "variant": name,
            "n": rounds,
            "median_us": round(median(s), 3),
            "spread": round(spread(s), 3),
            "runs": len(s),
            "ratio_to_none": round(median(s) / base, 3),
        }
        for name, s in samples.items()
    ]
