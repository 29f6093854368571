"""Start-up: a short CLI command imports only what it uses (benchmarks/bench_startup.py times
it). Each case runs the real CLI in a fresh interpreter and looks at what it loaded."""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import attrs
import pytest

from tests.support.common import FIXTURES, ROOT, run_child
from tests.support.guests import build, guest_wat
from wasihost import brokers, cli
from wasihost.core import registry
from wasihost.core.admission import admit
from wasihost.core.errors import AdmissionError, ConfigError
from wasihost.core.grants import Grant
from wasihost.engine.lowlevel import WASMTIME_VERSION, installed_version
from wasihost.host import defaults

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
    "wasihost.store.state",
    "wasihost.host.updates",
    "wasihost.store.presence",
    # The built-in brokers of ABI 1.1 are made on first use (brokers.DeferredBroker).
    "socket",
    "wasihost.brokers.events",
    "wasihost.brokers.files",
    "wasihost.brokers.http",
    "wasihost.brokers.jobs",
    "wasihost.brokers.secrets",
    "wasihost.brokers.storage",
    # Imported where they are used (issue 12 section 4, third pass): thread pools for a
    # shutdown flush, several closes or an async call's future; Python logging for the host's
    # own error records (wasihost.core.hostlog); the origin parser for a manifest with [http].
    "concurrent.futures",
    "logging",
    "wasihost.host.aio",  # asyncio's front end; the Host's call threads are wasihost.host.callworkers
    "wasihost.host.acall",  # what an acall runs, imported by its first
    "wasihost.core.event_classes",  # the manifest's [events] patterns
    "wasihost.core.netpolicy",
    # A host with no eviction policy, no scheduler, no state directory (published metrics).
    "wasihost.host.call_gate",
    "wasihost.supervisor.eviction",
    "wasihost.supervisor.opmetrics",
    "wasihost.supervisor.scheduling",
    # Records a plain run defines but never makes (issue 12 section 4, fourth pass): they live
    # where they are made: a crash, an operator's question, a restart policy an embedder sets,
    # a manifest's [events] or [jobs], a budget crossed.
    "wasihost.core.budget_crossing",
    "wasihost.core.manifest_tables",
    "wasihost.supervisor.reports",
    "wasihost.supervisor.restart_policies",
)
# What a module found in the cache never needs: the shape scan runs before a compile.
NOT_FOR_A_WARM_RUN = ("wasihost.core.codeshape",)
# The WASI profile's table, its errno and layout tables: made when a guest imports WASI or a
# listing needs every entry (registry.DeferredProfile), not for a guest importing no WASI.
WASI_PROFILE_TABLES = (
    "wasihost.wasi",
    "wasihost.wasi.abi",
    "wasihost.wasi.errno",
    "wasihost.wasi.registry",
)
# What only `wasihost wasi` (and a WASI grant's scope) needs: its options and their checks.
WASI_COMMAND_ONLY = ("wasihost.cli.wasi_command", "wasihost.wasi.config", "wasihost.wasi.scopes")
# What only `wasihost doctor` needs: the probe of the process walls.
DOCTOR_ONLY = ("wasihost.cli.doctor", "wasihost.engine.walls")
# What only a native plugin needs (issue 31): its ELF reader, the dataclasses module under it,
# and its backend; and what only the compile worker needs, its rlimits (a warm run compiles
# nothing).
NATIVE_PLUGINS_ONLY = ("wasihost.core.elfbin", "dataclasses", "wasihost.engine.native_plugins")
COMPILE_WORKER_ONLY = ("resource",)
# The other commands' modules, and the process runtime's (a run in this process starts no child).
OTHER_COMMANDS = (
    "wasihost.cli.bench_command",
    "wasihost.cli.packages",
    "wasihost.cli.state_commands",
    "wasihost.cli.remedies",
    "wasihost.host.inspect",
    "wasihost.engine.process",
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


@pytest.mark.in_process  # a process runtime run starts a child: its imports differ
def test_run_of_a_package_directory_imports_no_packaging_state_or_asyncio() -> None:
    report, _ = run_child(LOADED, "run", "fixtures/echo", "noop", "--no-cache")
    assert (report["code"], report["out"]) == (0, "null\n")
    loaded = set(report["modules"])
    assert loaded.isdisjoint(NOT_FOR_A_PLAIN_RUN), loaded & set(NOT_FOR_A_PLAIN_RUN)
    # The guest imports no WASI: the WASI handlers and the profile's table are not loaded.
    assert "wasihost.wasi.binding" not in loaded
    assert loaded.isdisjoint(WASI_PROFILE_TABLES), loaded & set(WASI_PROFILE_TABLES)
    assert loaded.isdisjoint(WASI_COMMAND_ONLY), loaded & set(WASI_COMMAND_ONLY)
    # The process walls' probe is for `wasihost doctor` only.
    assert loaded.isdisjoint(DOCTOR_ONLY), loaded & set(DOCTOR_ONLY)


@pytest.mark.in_process  # a process runtime run starts a child: its imports differ
def test_wasi_run_imports_the_wasi_handlers_and_no_packaging_or_state() -> None:
    report, _ = run_child(
        LOADED, "wasi", "--no-cache", "fixtures/wasi-libc/wasi-libc.wasm", "hello"
    )
    assert (report["code"], report["out"]) == (0, "hello: hello from wasi-libc\n")
    loaded = set(report["modules"])
    assert "wasihost.wasi.binding" in loaded
    assert loaded.isdisjoint(NOT_FOR_A_PLAIN_RUN), loaded & set(NOT_FOR_A_PLAIN_RUN)
    # A bare module has no manifest: no TOML parser (nor the datetime module it imports).
    assert loaded.isdisjoint({"tomllib", "datetime"}), loaded & {"tomllib", "datetime"}


def test_the_wasmtime_version_read_beside_the_package_is_the_installed_one() -> None:
    assert installed_version() == WASMTIME_VERSION == importlib.metadata.version("wasmtime")


@pytest.mark.in_process  # a process runtime run starts a child: its imports differ
def test_a_run_from_a_warm_cache_starts_no_subprocess_nor_loads_the_benchmark(
    tmp_path: Path,
) -> None:
    # The cold-start scenario of issue 12: a new process, the module already in the disk
    # cache. Closing the host once looked libc up with ctypes.util.find_library, which runs
    # ldconfig in a subprocess (10-30 ms of every run); the benchmark's code is for `bench`.
    cache = str(tmp_path / "modules")
    args = ("run", "fixtures/echo", "noop", "--cache-dir", cache)
    run_child(LOADED, *args)  # fills the cache (compiling may use a worker process)
    report, _ = run_child(LOADED, *args)
    assert (report["code"], report["out"]) == (0, "null\n")
    loaded = set(report["modules"])
    unwanted = {
        "subprocess",
        "ctypes.util",
        "wasihost.cli.bench_command",
        *NOT_FOR_A_PLAIN_RUN,
        *NOT_FOR_A_WARM_RUN,
        *WASI_PROFILE_TABLES,
        *DOCTOR_ONLY,
    }
    assert loaded.isdisjoint(unwanted), loaded & unwanted


# The wasihost process as the console script runs it (wasihost.cli.program), then what it loaded
# and whether its exit froze the collector's objects, on a last line of its own; an atexit
# handler registered before it must still run at its exit.
PROGRAM = """
import atexit, gc, json, sys
from wasihost.cli import program
atexit.register(lambda: print("atexit ran", file=sys.stderr))
code = program()
print(json.dumps({"code": code, "frozen": gc.get_freeze_count(), "modules": sorted(sys.modules)}))
"""


@pytest.mark.in_process  # a process runtime run starts a child: its imports differ
def test_the_wasihost_process_running_hello_from_a_warm_cache_loads_only_what_the_run_needs(
    tmp_path: Path,
) -> None:
    # Issue 31: the command of the issue, as a whole process started the way the console script
    # starts it, every cache warm. It must say what `main` says, and load no broker it was not
    # granted, no package, signature or state code, no benchmark, no other command's module,
    # nothing only a native plugin or a compile uses.
    argv = [sys.executable, "-c", PROGRAM, "run", "fixtures/hello", "greet"]
    argv += ["--input", '{"name":"ada"}', "--cache-dir", str(tmp_path / "modules")]
    env = {**os.environ, "RUST_BACKTRACE": "0"}

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
        )

    assert run().returncode == 0  # fills the module cache
    done = run()
    assert done.returncode == 0, done.stderr[-2000:]
    output, last = done.stdout.splitlines()
    assert output == '{"greeting": "hello, ada"}'
    assert done.stderr == "[org.wasihost.fixtures.hello] debug: greeting\natexit ran\n"
    report = json.loads(last)
    assert report["code"] == 0
    assert report["frozen"] > 0  # program's exit: the survivors left out of its collections
    loaded = set(report["modules"])
    assert {"wasihost.host.runtime", "wasihost.engine.cache", "wasmtime"} <= loaded  # it ran
    unwanted = {
        "subprocess",
        "ctypes.util",
        *NOT_FOR_A_PLAIN_RUN,
        *NOT_FOR_A_WARM_RUN,
        *WASI_PROFILE_TABLES,
        *WASI_COMMAND_ONLY,
        *DOCTOR_ONLY,
        *NATIVE_PLUGINS_ONLY,
        *COMPILE_WORKER_ONLY,
        *OTHER_COMMANDS,
    }
    assert loaded.isdisjoint(unwanted), loaded & unwanted
    benchmark = {name for name in loaded if name.split(".")[:2] == ["wasihost", "benchmark"]}
    assert not benchmark, benchmark


def test_main_leaves_its_callers_collector_as_it_was(capsys: pytest.CaptureFixture[str]) -> None:
    # Only the process entry point (program) freezes at its end: an embedder or a test calling
    # main keeps collecting what it drops.
    frozen = gc.get_freeze_count()
    assert cli.main(["run", str(FIXTURES / "echo"), "noop", "--no-cache"]) == 0
    assert capsys.readouterr().out == "null\n"
    assert gc.get_freeze_count() == frozen


def _choices(parser: argparse.ArgumentParser) -> set[str]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "fixtures/echo", "noop", "--input", "[1]", "--grant", "log", "--fuel", "5"],
        ["wasi", "--dir", "/tmp::/data", "x.wasm", "a", "b"],
        ["grants", "grant", "ext", "cap", "--scope", "{}"],
        ["bench", "--quick", "--sections", "calls"],
        ["abi", "--version", "1.0", "--json"],
        ["doctor", "--json"],
    ],
)
def test_the_parser_of_one_command_parses_as_the_full_parser_does(argv: list[str]) -> None:
    # A short command builds only its own subcommand's parser (argparse's set-up was a tenth
    # of a cold run): the result must be the same, and every command must be known.
    assert cli._command_of(argv) == argv[0]
    assert vars(cli._parser(argv[0]).parse_args(argv)) == vars(cli._parser().parse_args(argv))
    assert _choices(cli._parser()) == cli.COMMANDS
    assert _choices(cli._parser(argv[0])) == {argv[0]}


def test_every_command_has_a_handler_in_the_module_imported_for_it() -> None:
    # The dispatch table names modules and functions, imported when the command runs: a typo
    # would only show when that command ran.
    assert set(cli._HANDLERS) == cli.COMMANDS
    for command in cli.COMMANDS:
        handler = cli._handler(command)
        assert callable(handler)
        assert handler.__module__.startswith("wasihost.cli."), handler.__module__


def test_help_and_unknown_commands_still_see_every_command() -> None:
    assert cli._command_of(["-h"]) is None
    assert cli._command_of(["bogus"]) is None
    assert cli._command_of([]) is None
    with pytest.raises(cli.UsageError, match="invalid choice: 'bogus'.*'abi'"):
        cli._parser(cli._command_of(["bogus"])).parse_args(["bogus"])


def test_each_deferred_broker_says_what_its_class_says() -> None:
    # What the host reads before a deferred broker is made must be its class's own.
    for name, cls_name in brokers.DEFERRED:
        deferred = brokers.DeferredBroker(name, cls_name)
        cls = getattr(importlib.import_module(f"wasihost.brokers.{name}"), cls_name)
        assert (cls.name, tuple(cls.functions), frozenset(cls.capabilities)) == (
            deferred.name,
            deferred.functions,
            deferred.capabilities,
        )
        assert deferred.functions, name
        assert frozenset(getattr(cls, "conventions", ("cbor",))) == frozenset({"cbor"})


def test_a_deferred_broker_is_made_on_first_use_and_served_as_itself() -> None:
    from wasihost.brokers.storage import StorageBroker
    from wasihost.host.policy import Policy
    from wasihost.host.runtime import Host

    host = Host(Policy(allow={"storage"}), cache_dir=None)
    try:
        assert "storage" not in {b.name for b in host.functions.made_brokers()}
        made = host.broker("storage")
        assert isinstance(made, StorageBroker)
        assert host.broker("storage") is made
        assert made in host.functions.made_brokers()
        # Every broker, for what needs them all (an update's checkpoint), made on the way.
        assert {"events", "files", "http", "jobs", "secrets"} <= {
            b.name for b in host.functions.brokers()
        }
        assert all(not isinstance(b, brokers.DeferredBroker) for b in host.functions.brokers())
    finally:
        host.close()


def test_the_log_sinks_levels_are_pythons_logging_levels() -> None:
    # extlog writes logging's level numbers out so as not to import logging at start-up.
    import logging

    from wasihost.core.extlog import _LOGGING_LEVELS, TRACE_LOGGING_LEVEL, Level

    assert _LOGGING_LEVELS == {
        Level.TRACE: TRACE_LOGGING_LEVEL,
        Level.DEBUG: logging.DEBUG,
        Level.INFO: logging.INFO,
        Level.WARN: logging.WARNING,
        Level.ERROR: logging.ERROR,
    }


# (module, name, where it is defined now): each old import path still gives the same class.
MOVED = [
    ("wasihost.supervisor.supervision", "CrashRecord", "wasihost.supervisor.reports"),
    ("wasihost.supervisor.supervision", "Metrics", "wasihost.supervisor.reports"),
    ("wasihost.supervisor.supervision", "QuarantineReport", "wasihost.supervisor.reports"),
    ("wasihost.supervisor.supervision", "Never", "wasihost.supervisor.restart_policies"),
    ("wasihost.supervisor.supervision", "BoundedRetry", "wasihost.supervisor.restart_policies"),
    ("wasihost.supervisor.governor", "Usage", "wasihost.supervisor.reports"),
    ("wasihost.supervisor.hostcall_metrics", "HostCallErrors", "wasihost.supervisor.reports"),
    ("wasihost.core.manifest", "EventsSpec", "wasihost.core.manifest_tables"),
    ("wasihost.core.manifest", "JobsSpec", "wasihost.core.manifest_tables"),
    ("wasihost.core.budgets", "Crossing", "wasihost.core.budget_crossing"),
]


@pytest.mark.parametrize(("module", "name", "home"), MOVED)
def test_a_class_moved_off_the_start_up_path_is_still_exported_where_it_was(
    module: str, name: str, home: str
) -> None:
    old = importlib.import_module(module)
    assert getattr(old, name) is getattr(importlib.import_module(home), name)
    assert getattr(old, name).__module__ == home
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        old.NoSuchName  # the lookup is the test


def test_the_restart_policy_union_is_still_exported() -> None:
    from wasihost.supervisor.restart_policies import BoundedRetry, Never
    from wasihost.supervisor.supervision import OnCrash, RestartPolicy

    assert RestartPolicy == Never | OnCrash | BoundedRetry


def test_the_deferred_wasi_profile_says_what_the_table_says() -> None:
    from wasihost.wasi.registry import MODULE, PROFILE, PROFILE_NAME

    assert (defaults.WASI_PROFILE_NAME, defaults.WASI_IMPORT_MODULE) == (PROFILE_NAME, MODULE)
    assert registry.profile_capabilities(PROFILE) == defaults.WASI_CAPABILITIES


def _made_registry() -> registry.Registry:
    """The default registry as it was before the profile was deferred: made up front."""
    from wasihost.wasi.registry import PROFILE

    made = registry.Registry()
    for major in registry.SHIPPED_MAJORS:
        made.add_major(registry.shipped_major(major))
    made.add_profile(PROFILE)
    return made


_FD_WRITE = (
    '(import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))'
)
_OPEN = (
    '(import "wasi_snapshot_preview1" "path_open" '
    "(func (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))"
)
_COMMAND = '(memory (export "memory") 1) (func (export "_start"))'
ADMISSION_CASES = {
    "an ABI guest importing no WASI": guest_wat(),
    "an ABI guest importing fd_write": guest_wat(imports=_FD_WRITE),
    "an ABI guest importing path_open": guest_wat(imports=_OPEN),
    "an ABI guest importing a name WASI lacks": guest_wat(
        imports='(import "wasi_snapshot_preview1" "fd_nope" (func (param i32) (result i32)))'
    ),
    "an ABI guest importing fd_write with a wrong signature": guest_wat(
        imports='(import "wasi_snapshot_preview1" "fd_write" (func (param i32) (result i32)))'
    ),
    "an ABI guest importing an unknown module": guest_wat(
        imports='(import "wasi_unstable" "fd_write" (func (param i32 i32 i32 i32) (result i32)))'
    ),
    "a plain WASI command": f"(module {_FD_WRITE} {_COMMAND})",
    "a plain WASI command importing path_open": f"(module {_OPEN} {_COMMAND})",
    "a WASI module without _start": f'(module {_FD_WRITE} (memory (export "memory") 1))',
}


def _outcome(wasm: bytes, reg: registry.Registry, caps: frozenset[str]) -> object:
    from wasihost.core.wasmbin import read_header

    try:
        plan = admit(
            read_header(wasm),
            reg,
            Grant(caps),
            max_memory_bytes=1 << 24,
            max_table_elements=1000,
        )
    except AdmissionError as exc:
        return ("refused", exc.problems, exc.ungranted)
    return ("admitted", plan.version, plan.view.label, plan.imports, plan.view.profile)


@pytest.mark.parametrize("case", sorted(ADMISSION_CASES))
@pytest.mark.parametrize("caps", [frozenset(), frozenset({"wasi.fs.read", "wasi.stdio"})])
def test_a_deferred_wasi_profile_admits_and_refuses_as_the_made_one(
    case: str, caps: frozenset[str]
) -> None:
    wasm = build(ADMISSION_CASES[case])
    deferred = defaults.default_registry()
    assert deferred.deferred  # not made yet
    assert _outcome(wasm, deferred, caps) == _outcome(wasm, _made_registry(), caps)


def test_a_deferred_profile_is_listed_without_being_made_and_made_on_first_need() -> None:
    from wasihost.wasi.registry import PROFILE

    echo = (FIXTURES / "echo" / "echo.wasm").read_bytes()
    made = _made_registry()
    deferred = defaults.default_registry()
    # What a run reads of the registry before admission needs no entry of the profile.
    assert deferred.capabilities() == made.capabilities()
    assert deferred.serves_profile("wasi_snapshot_preview1")
    assert _outcome(echo, deferred, frozenset()) == _outcome(echo, made, frozenset())
    assert set(deferred.deferred) == {"wasi"}
    # Sealed (a host admitted an extension): nothing may be added, the profile is still made
    # when a guest imports it, and a listing has every entry.
    deferred.seal()
    with pytest.raises(ConfigError, match="cannot add profile"):
        deferred.add_profile(PROFILE)
    wasm = build(ADMISSION_CASES["an ABI guest importing fd_write"])
    assert _outcome(wasm, deferred, frozenset())[0] == "admitted"
    assert not deferred.deferred
    assert deferred.profiles == made.profiles
    assert list(deferred.functions()) == list(made.functions())
    assert (
        defaults.default_registry().lookup("wasi_snapshot_preview1", "fd_write")
        is (PROFILE.functions[[f.name for f in PROFILE.functions].index("fd_write")])
    )


def test_a_deferred_profile_that_makes_another_is_refused() -> None:
    from wasihost.wasi.registry import PROFILE

    reg = registry.Registry()
    reg.add_profile(
        registry.DeferredProfile("wasi", PROFILE.module, frozenset({"wasi.stdio"}), lambda: PROFILE)
    )
    assert reg.capabilities() == {"wasi.stdio"}
    with pytest.raises(ConfigError, match="made a different profile"):
        reg.profile_for_module(PROFILE.module)
    with pytest.raises(
        ConfigError, match="import module wasi_snapshot_preview1 is registered twice"
    ):
        reg.add_profile(PROFILE)
    with pytest.raises(ConfigError, match="profile wasi is registered twice"):
        reg.add_profile(attrs.evolve(PROFILE, module="wasi_other"))


def test_a_deferred_profile_is_made_once_whatever_the_threads_asking() -> None:
    from wasihost.wasi.registry import PROFILE

    made: list[int] = []
    start = threading.Barrier(8)
    # A second maker, if one got in beside the first, would meet it here; the first alone waits
    # out the timeout (the lock keeps the others out).
    inside = threading.Barrier(2, timeout=0.1)

    def make() -> registry.Profile:
        made.append(1)
        with contextlib.suppress(threading.BrokenBarrierError):
            inside.wait()
        return PROFILE

    capabilities = registry.profile_capabilities(PROFILE)
    reg = registry.Registry()
    reg.add_profile(registry.DeferredProfile("wasi", PROFILE.module, capabilities, make))
    reg.seal()
    fd_write = PROFILE.functions[[f.name for f in PROFILE.functions].index("fd_write")]
    found: list[object] = []

    def ask() -> None:
        start.wait()
        found.append(reg.profile_for_module(PROFILE.module))
        found.append(reg.lookup(PROFILE.module, "fd_write"))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert made == [1]
    assert (found.count(PROFILE), found.count(fd_write)) == (8, 8)
    assert defaults.default_registry() == defaults.default_registry()
