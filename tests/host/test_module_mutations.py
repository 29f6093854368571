"""Damaged modules through the whole start path: a real guest's bytes with a few bytes flipped,
set, cut or inserted go through the header reader, the code-shape pre-check, compilation,
admission, the start function, the handshake and a call. Whatever the damage, the host answers
with one of its own errors (or runs the module, if the damage left a valid one), never another
exception, and stays usable for the next module."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.common import ALL_CAPS, FIXTURES, bare
from tests.support.guests import build, guest_wat, host_import
from tests.support.wasi import LIBC
from wasihost.core.errors import WasihostError
from wasihost.host.policy import Policy
from wasihost.host.runtime import Extension, Host
from wasihost.wasi import WasiOptions, capabilities_for, wasi_profile

ECHO = (FIXTURES / "echo" / "echo.wasm").read_bytes()
# A small guest that imports a host function, so damage also lands in the import section.
LOGGER = build(guest_wat(imports=host_import("log")))

# A damaged module that still validates may now loop: keep each call short.
CALL_FUEL = 2_000_000
CALL_TIMEOUT_MS = 200

HOST = Host(Policy(allow=ALL_CAPS), cache_dir=None)
# A WASI command (C on wasi-libc) run with its output captured and nothing mounted.
WASI_PROGRAM = LIBC.read_bytes()
WASI_OUTPUT = bytearray()
WASI_OPTIONS = WasiOptions(
    argv=["wasi-libc.wasm", "hello"], stdout=WASI_OUTPUT.extend, stderr=WASI_OUTPUT.extend
)
WASI_CAPS = capabilities_for(WASI_OPTIONS)
WASI_HOST = Host(Policy(allow=WASI_CAPS), cache_dir=None, profiles=[wasi_profile(WASI_OPTIONS)])
MUTANTS = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_EDIT = st.tuples(
    # Mostly xor: it keeps every size, so the damage gets past the header reader to the
    # compiler and the guest's own code more often than the other edits do.
    st.sampled_from(["xor", "xor", "xor", "set", "cut", "insert", "drop"]),
    st.integers(min_value=8, max_value=2**20),  # the position, taken modulo the length
    st.integers(min_value=1, max_value=255),
)


def _damage(wasm: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    data = bytearray(wasm)
    for op, where, value in edits:
        if len(data) <= 8:
            break
        at = 8 + where % (len(data) - 8)  # keep the magic and version: damage past the header
        if op == "xor":
            data[at] ^= value
        elif op == "set":
            data[at] = 0xFF if value % 2 else 0x80  # the LEB128 continuation bytes
        elif op == "cut":
            del data[at:]
        elif op == "insert":
            data[at:at] = bytes([value]) * (1 + value % 5)
        else:
            del data[at : at + 1 + value % 16]
    return bytes(data)


def _outcome(
    host: Host, wasm: bytes, grants: Iterable[str], run: Callable[[Extension], object]
) -> str:
    """Admit ``wasm`` on ``host`` and ``run`` it; the outcome's name. Anything but a wasihost
    error fails the test."""
    try:
        ext = host.admit(bare(wasm), grants=grants)
    except WasihostError:
        return "refused"
    try:
        run(ext)
    except WasihostError:
        return "failed"
    finally:
        ext.close()
    return "ran"


def _try(wasm: bytes) -> str:
    """Load, start and call ``wasm``."""
    return _outcome(
        HOST,
        wasm,
        sorted(ALL_CAPS),
        lambda ext: ext.call("noop", fuel=CALL_FUEL, timeout_ms=CALL_TIMEOUT_MS),
    )


@MUTANTS
@given(st.sampled_from(["echo", "logger"]), st.lists(_EDIT, min_size=1, max_size=6))
def test_a_damaged_module_is_refused_or_runs_and_nothing_else(
    which: str, edits: list[tuple[str, int, int]]
) -> None:
    wasm = _damage(ECHO if which == "echo" else LOGGER, edits)
    _try(wasm)


def _try_command(wasm: bytes) -> str:
    """Admit and run ``wasm`` as a WASI command, on the default fuel per call."""
    return _outcome(
        WASI_HOST, wasm, WASI_CAPS, lambda ext: ext.run_command(timeout_ms=CALL_TIMEOUT_MS)
    )


@MUTANTS
@given(st.lists(_EDIT, min_size=1, max_size=6))
def test_a_damaged_wasi_command_is_refused_or_runs_and_nothing_else(
    edits: list[tuple[str, int, int]],
) -> None:
    _try_command(_damage(WASI_PROGRAM, edits))


def test_the_host_still_serves_intact_modules_after_the_damaged_ones() -> None:
    # Runs after the properties above in file order, on the same hosts.
    assert _try(ECHO) == "ran"
    assert _try(LOGGER) == "ran"
    WASI_OUTPUT.clear()
    assert _try_command(WASI_PROGRAM) == "ran"
    assert b"hello" in WASI_OUTPUT


def test_the_damage_reaches_every_outcome() -> None:
    """The edits are not all caught at the header: some modules are refused by admission or
    compilation, and some damaged ones still run (the property above sees both)."""
    outcomes = set()
    for seed in range(40):
        edits = [("xor", seed * 7919 + 13, 1 + seed % 255)]
        outcomes.add(_try(_damage(ECHO, edits)))
    assert {"refused", "ran"} <= outcomes
