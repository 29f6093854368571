"""Start-up: a short CLI command imports only what it uses (benchmarks/bench_startup.py times
it). Each case runs the real CLI in a fresh interpreter and looks at what it loaded."""

from __future__ import annotations

import importlib.metadata

from conftest import run_child

from wasihost.engine.lowlevel import WASMTIME_VERSION, installed_version

# What a plain run never needs: package archives, signatures and their crypto, revocation lists,
# the durable state (sqlite3), installs and updates, asyncio (async host functions only), and an
# HTTP client. Every Host makes the built-in brokers (builtin_brokers()), so a broker module must
# import such a dependency when first used, not at its top.
NOT_FOR_A_PLAIN_RUN = (
    "asyncio",
    "cryptography",
    "http.client",
    "sqlite3",
    "ssl",
    "urllib3",
    "wasihost.packaging.archive",
    "wasihost.packaging.revocation",
    "wasihost.packaging.signing",
    "wasihost.packaging.trust",
    "wasihost.state",
    "wasihost.updates",
)

LOADED = """
import contextlib, io, json, sys
from wasihost.cli import main
out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")  # wasi writes bytes to its .buffer
with contextlib.redirect_stdout(out):
    code = main(sys.argv[1:])
out.flush()
text = out.buffer.getvalue().decode()
print(json.dumps({"code": code, "out": text, "modules": sorted(sys.modules)}))
"""


def test_run_of_a_package_directory_imports_no_packaging_state_or_asyncio() -> None:
    report, _ = run_child(LOADED, "run", "fixtures/echo", "noop", "--no-cache")
    assert (report["code"], report["out"]) == (0, "null\n")
    loaded = set(report["modules"])
    assert loaded.isdisjoint(NOT_FOR_A_PLAIN_RUN), loaded & set(NOT_FOR_A_PLAIN_RUN)
    # The guest imports no WASI: the WASI handlers are not loaded either.
    assert "wasihost.wasi.binding" not in loaded


def test_wasi_run_imports_the_wasi_handlers_and_no_packaging_or_state() -> None:
    report, _ = run_child(
        LOADED, "wasi", "--no-cache", "fixtures/wasi-libc/wasi-libc.wasm", "hello"
    )
    assert (report["code"], report["out"]) == (0, "hello: hello from wasi-libc\n")
    loaded = set(report["modules"])
    assert "wasihost.wasi.binding" in loaded
    assert loaded.isdisjoint(NOT_FOR_A_PLAIN_RUN), loaded & set(NOT_FOR_A_PLAIN_RUN)


def test_the_wasmtime_version_read_beside_the_package_is_the_installed_one() -> None:
    assert installed_version() == WASMTIME_VERSION == importlib.metadata.version("wasmtime")
