"""The names a results file is keyed by (kept import-free: the CLI's parser lists them)."""

from __future__ import annotations

SYSTEMS = ("wasihost", "wasmtime-generic", "wasmtime-floor", "extism")
ECHO_SIZES = {
    "echo-0": 0,
    "echo-64": 64,
    "echo-4KiB": 4 * 1024,
    "echo-64KiB": 64 * 1024,
    "echo-1MiB": 1024 * 1024,
}
SCENARIOS = (
    "noop",
    *ECHO_SIZES,
    "host-call-64",
    "host-call-native",
    "instantiate-cached",
    "cold-start",
)
SECTIONS = ("call_cost", "compat", "overhead", "scaling", "process")
FLOOR = "wasmtime-floor"
