"""The measuring method: contenders interleaved batch by batch, GC off inside a batch,
median and spread over batches."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable

import attrs

Op = Callable[[], object]

# Calibration stops doubling a batch once one batch of the op takes this fraction of the
# batch target: enough calls that the clock's resolution and loop overhead vanish.
_CALIBRATION_FRACTION = 0.5
# A batch never runs an op more than this often, whatever the calibration says (a no-op op
# would otherwise run for millions of calls in a long batch).
MAX_CALLS_PER_BATCH = 1_000_000


@attrs.frozen
class Budget:
    """How long to measure: ``batches`` interleaved batches of about ``batch_s`` each per
    contender."""

    batches: int
    batch_s: float


def calibrate(op: Op, batch_s: float) -> int:
    """Calls of ``op`` that take about ``batch_s``; also warms it up."""
    calls = 1
    while calls < MAX_CALLS_PER_BATCH:
        start = time.perf_counter()
        for _ in range(calls):
            op()
        took = time.perf_counter() - start
        if took >= batch_s * _CALIBRATION_FRACTION:
            return max(1, min(MAX_CALLS_PER_BATCH, int(calls * batch_s / took)))
        calls *= 2
    return MAX_CALLS_PER_BATCH


def interleave(
    ops: dict[str, Op], budget: Budget, *, fixed_calls: int | None = None
) -> dict[str, list[float]]:
    """Per-call µs of each op, one sample per batch. Every batch runs each op once in an
    order rotated by one each batch, so drift of the machine hits all of them alike."""
    names = list(ops)
    calls = {
        name: fixed_calls if fixed_calls is not None else calibrate(op, budget.batch_s)
        for name, op in ops.items()
    }
    samples: dict[str, list[float]] = {name: [] for name in names}
    for batch in range(budget.batches):
        shift = batch % len(names)
        for name in names[shift:] + names[:shift]:
            op, n = ops[name], calls[name]
            was_enabled = gc.isenabled()
            gc.disable()  # a collection would land in whichever batch crossed its threshold
            try:
                start = time.perf_counter()
                for _ in range(n):
                    op()
                took = time.perf_counter() - start
            finally:
                if was_enabled:
                    gc.enable()
            samples[name].append(took / n * 1e6)
    return samples


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float]) -> float:
    """(max - min) / median over the batches: 0.1 means the batches spanned 10% of the
    median."""
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else 0.0
