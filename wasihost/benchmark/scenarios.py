"""The call-cost section: every scenario on every system, interleaved batch by batch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .names import ECHO_SIZES, FLOOR, SYSTEMS
from .runner import Budget, Op, interleave, median, spread
from .systems import (
    HOST_CALLS,
    Extism,
    RawSystems,
    Skip,
    Wasihost,
    extism_unavailable,
)

Log = Callable[[str], None]


def payload(size: int) -> bytes:
    return (bytes(range(256)) * (size // 256 + 1))[:size]


class Contenders:
    """The systems of one run, built once; a system that cannot be built is a Skip for every
    scenario, with the reason."""

    def __init__(self, fixtures: Path) -> None:
        self.fixtures = fixtures
        self.wasihost = Wasihost(fixtures)
        self.raw = RawSystems(fixtures)
        self.extism_missing = extism_unavailable()
        self.extism: Extism | Skip
        if self.extism_missing is not None:
            self.extism = Skip(self.extism_missing)
        else:
            try:
                self.extism = Extism()
            except Exception as exc:  # a peer that fails to start is reported, not fatal
                self.extism = Skip(f"extism failed to start: {type(exc).__name__}: {exc}")

    def ops(self, scenario: str, system: str) -> Any:
        """An Op, a (many, none) pair for host calls, or a Skip."""
        if system == "extism" and isinstance(self.extism, Skip):
            return self.extism
        if scenario == "noop":
            return self._pick(system, "noop")
        if scenario in ECHO_SIZES:
            data = payload(ECHO_SIZES[scenario])
            if system == "wasihost":
                return self.wasihost.echo_op(data)
            if system == "extism":
                assert isinstance(self.extism, Extism)
                return self.extism.echo_op(data)
            return self.raw.echo_op(system, data)
        if scenario == "host-call-64":
            return self._pick(system, "hostcall")
        if scenario == "host-call-native":
            return self._pick(system, "hostcall", native=True)
        if scenario == "instantiate-cached":
            return self._pick(system, "instantiate")
        raise ValueError(scenario)

    def _pick(self, system: str, what: str, **options: Any) -> Any:
        if system == "wasihost":
            return getattr(self.wasihost, what)(**options)
        if system == "extism":
            return getattr(self.extism, what)(**options)
        return getattr(self.raw, what)(system, **options)

    def close(self) -> None:
        self.wasihost.close()


def _row(
    scenario: str, system: str, samples: list[float] | None, skip: str | None
) -> dict[str, Any]:
    row: dict[str, Any] = {"scenario": scenario, "system": system}
    if samples is None:
        row.update(median_us=None, min_us=None, max_us=None, spread=None, runs=0, skipped=skip)
        return row
    row.update(
        median_us=round(median(samples), 3),
        min_us=round(min(samples), 3),
        max_us=round(max(samples), 3),
        spread=round(spread(samples), 3),
        runs=len(samples),
        skipped=None,
    )
    size = ECHO_SIZES.get(scenario)
    if size:
        row["mb_per_s"] = round(size / median(samples), 1)  # bytes per µs is MB/s
    return row


def call_cost(
    contenders: Contenders,
    scenarios: tuple[str, ...],
    budget: Budget,
    cold_batches: int,
    log: Log,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for scenario in scenarios:
        log(f"call cost: {scenario}")
        if scenario == "cold-start":
            rows += _cold_start(contenders, cold_batches)
            continue
        built = {system: contenders.ops(scenario, system) for system in SYSTEMS}
        ops: dict[str, Op] = {}
        for system, got in built.items():
            if isinstance(got, tuple):
                ops[f"{system}:many"], ops[f"{system}:none"] = got
            elif not isinstance(got, Skip):
                ops[system] = got
        samples = interleave(ops, budget) if ops else {}
        for system, got in built.items():
            if isinstance(got, Skip):
                rows.append(_row(scenario, system, None, got.reason))
            elif isinstance(got, tuple):
                per_call = [
                    (many - none) / HOST_CALLS
                    for many, none in zip(
                        samples[f"{system}:many"], samples[f"{system}:none"], strict=True
                    )
                ]
                rows.append(_row(scenario, system, per_call, None))
            else:
                rows.append(_row(scenario, system, samples[system], None))
    return _with_ratios(rows)


def _cold_start(contenders: Contenders, batches: int) -> list[dict[str, Any]]:
    from .coldstart import ColdStart

    cold = ColdStart(contenders.fixtures, contenders.extism_missing)
    try:
        built = {system: cold.op(system) for system in SYSTEMS}
        ops = {s: op for s, op in built.items() if not isinstance(op, Skip)}
        samples = interleave(ops, Budget(batches, 0.0), fixed_calls=1) if ops else {}
    finally:
        cold.close()
    return [
        _row("cold-start", system, None, got.reason)
        if isinstance(got, Skip)
        else _row("cold-start", system, samples[system], None)
        for system, got in built.items()
    ]


def _with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    floors = {
        r["scenario"]: r["median_us"] for r in rows if r["system"] == FLOOR and r["median_us"]
    }
    for row in rows:
        floor = floors.get(row["scenario"])
        row["ratio_to_floor"] = (
            round(row["median_us"] / floor, 3) if floor and row["median_us"] is not None else None
        )
    return rows
