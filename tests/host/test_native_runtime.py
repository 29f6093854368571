"""Native plugins (``runtime = "native-process"``, issue 30): a host executable built with the
guest SDK's ``native`` feature runs in a walled child started by the launcher, and its host
calls are served by the host's own registry. Every test runs the committed native fixtures
(fixtures/*-native) through a real Host, with the real launcher and walls."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import FIXTURES, proc_status_field
from wasihost.cli import main
from wasihost.core.errors import AdmissionError, CallError, FailureClass, ManifestError
from wasihost.core.serving import CallContext
from wasihost.engine import StoreLimits
from wasihost.engine.native_plugins import NativeBackend, NativeInstance, NativeProgram
from wasihost.engine.process import CPU_ALLOWANCE_NS, FUEL_PER_CPU_NS, ChildDidNotStart
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

HELLO = FIXTURES / "hello-native"
STORAGE = FIXTURES / "storage-native"
HOSTILE = FIXTURES / "hostile-native"
CAPS = frozenset({"log", "clock", "storage", "myapp.read"})
PROMPT_S = 10.0
WALLS = ("no_new_privs", "namespaces", "landlock", "rlimits", "seccomp")


def _app_functions(host: Host, lookups: list[Any]) -> None:
    """The application functions hostile-native imports (myapp_v1.lookup and .add)."""

    @host.function(
        "myapp.lookup",
        capability="myapp.read",
        fuel_base=5_000,
        fuel_per_byte=1,
        max_request_bytes=64,
        max_response_bytes=4096,
    )
    def lookup(ctx: CallContext, request: Any) -> Any:
        lookups.append(request)
        return {"found": request}

    @host.function(
        "myapp.add",
        capability="myapp.read",
        convention="native",
        params=("i64", "i64"),
        results=("i64",),
        fuel_base=100,
    )
    def add(ctx: CallContext, a: int, b: int) -> int:
        return a + b


@pytest.fixture
def lookups() -> list[Any]:
    return []


@pytest.fixture
def host(lookups: list[Any]) -> Iterator[Host]:
    with Host(Policy(allow=CAPS), cache_dir=None) as h:
        _app_functions(h, lookups)
        yield h


def only_instance(ext: Extension) -> NativeInstance:
    (instance,) = ext._instances()
    assert isinstance(instance, NativeInstance)
    return instance


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (reaped, or dead and not yet reaped)."""
    for _ in range(int(PROMPT_S / 0.01)):
        try:
            if proc_status_field(pid, "State").startswith(("Z", "X")):
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.01)
    return False


# -- it runs, walled ----------------------------------------------------------------------------


def test_a_native_plugin_runs_walled_and_its_host_calls_reach_the_hosts_brokers(
    host: Host,
) -> None:
    ext = host.load(HELLO)
    assert ext.runtime == "process-only"
    assert ext.call("greet", {"name": "ada"}) == {"greeting": "hello, ada"}
    assert ext.handshake is not None and ext.handshake.readiness == "ready"
    # The log record went through the host's log broker: the plugin has none.
    assert [r.message for r in ext.logs()] == ["greeting"]
    child = only_instance(ext)
    # The host's own view of the process: the plugin's executable (a memfd, never a path),
    # no new privileges, a seccomp filter, another network namespace.
    assert os.readlink(f"/proc/{child.pid}/exe").startswith("/memfd:wasihost-plugin-")
    assert proc_status_field(child.pid, "NoNewPrivs") == "1"
    assert proc_status_field(child.pid, "Seccomp") == "2"
    assert os.readlink(f"/proc/{child.pid}/ns/net") != os.readlink("/proc/self/ns/net")
    # And the launcher's report of each wall, checked from inside before the plugin started.
    assert {w.name: w.state for w in child.walls} == dict.fromkeys(WALLS, "enforced"), child.walls
    landlock = next(w for w in child.walls if w.name == "landlock")
    assert "executes only" in landlock.detail and "ld-linux" in landlock.detail
    assert any(step == "choose runtime" and "native plugin" in detail for step, detail in _steps(ext))
    ext.close()
    assert _gone(child.pid)


def _steps(ext: Extension) -> list[tuple[str, str]]:
    return list(ext.steps)


def test_the_hostile_plugin_is_stopped_by_each_wall(host: Host) -> None:
    """Unwalled, each of these succeeds (tests/engine/test_native_sdk.py): no socket (seccomp),
    no shell (Landlock executes only the loader), no file outside the grant (Landlock), no
    new process (seccomp lets clone make threads only), and no secret in its environment."""
    ext = host.load(HOSTILE, grants=["myapp.read"])
    report = ext.call("run")
    assert report["socket"]["errno"] == errno.EPERM, report["socket"]
    assert report["listen"]["errno"] == errno.EPERM, report["listen"]
    assert not report["exec"]["ok"] and report["exec"]["errno"] in (errno.EPERM, errno.EACCES)
    assert report["read"]["errno"] == errno.EACCES, report["read"]
    assert not report["fork"]["ok"] and report["fork"]["detail"] == 0, report["fork"]
    assert "WASIHOST_CHILD_SECRET" not in report["env"]
    assert "PYTHONPATH" not in report["env"]
    assert ext.call("ping") == "pong"  # and it serves on


def test_a_native_plugin_never_runs_in_process(host: Host) -> None:
    with pytest.raises(AdmissionError, match="native plugin .* never in-process"):
        host.load(HELLO, runtime="in-process")
    # The policy's or the environment's default does not move it into the host either.
    with Host(Policy(allow=CAPS, runtime="in-process"), cache_dir=None) as other:
        assert other.load(HELLO).runtime == "process-only"


def _built_c(tmp_path: Path, name: str, *flags: str, source: str = "liar.c") -> bytes:
    """A test plugin of tests/support/native/, built with the system's C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the test plugin")
    out = tmp_path / name
    path = Path(__file__).resolve().parents[1] / "support" / "native" / source
    subprocess.run([compiler, "-O1", *flags, "-o", str(out), str(path)], check=True)
    return out.read_bytes()


def test_the_walls_are_the_launchers_word_never_the_plugins(host: Host, tmp_path: Path) -> None:
    """The plugin is untrusted code: its HELLO may claim any wall. The host keeps the walls of
    the launcher's own HELLO, sent before the plugin ran; the plugin's must still carry the
    secret."""
    backend = host.backend_for("native-process")
    assert isinstance(backend, NativeBackend)
    limits = StoreLimits(max_memory_bytes=16 << 20, max_table_elements=10, fuel=1, timeout_ms=1)
    liar = backend.compile(_built_c(tmp_path, "liar"))
    child = backend.start_child(limits, liar)
    try:
        assert [w.name for w in child.walls] == list(WALLS)
        assert not any("lies" in w.detail for w in child.walls), child.walls
    finally:
        child.end()
    wrong = backend.compile(_built_c(tmp_path, "wrong", "-DWRONG_SECRET"))
    with pytest.raises(ChildDidNotStart, match="failed its hello"):
        backend.start_child(limits, wrong)


# Each attempt of tests/support/native/escape.c and the refusal the walls give it.
ESCAPES = {
    "socket-inet": "EPERM",
    "socket-unix": "EPERM",
    "socketpair": "EPERM",
    "fork": "EPERM",
    "vfork": "EPERM",
    "execve-shell": "EACCES",
    "open-passwd": "EACCES",
    "open-proc-parent": "EACCES",
    "create-file": "EACCES",
    "memfd_create": "ENOSYS",
    "ptrace": "EPERM",
    "kill-parent": "EPERM",
    "setsid": "EPERM",
    "setpgid": "EPERM",
    "unshare-user": "EPERM",
    "mount": "EPERM",
    "chroot": "EPERM",
    "raise-rlimit": "EPERM",
    "process_vm_readv": "EPERM",
    "bpf": "EPERM",
    "io_uring_setup": "EPERM",
    "userfaultfd": "EPERM",
    "perf_event_open": "EPERM",
}


def test_every_way_out_the_docs_name_is_refused(host: Host, tmp_path: Path) -> None:
    """docs/native-plugins.md's table of what a plugin cannot do, tried by a plugin in C
    before its HELLO: each attempt is refused with the wall's errno."""
    backend = host.backend_for("native-process")
    assert isinstance(backend, NativeBackend)
    limits = StoreLimits(max_memory_bytes=16 << 20, max_table_elements=10, fuel=1, timeout_ms=1)
    escape = backend.compile(_built_c(tmp_path, "escape", source="escape.c"))
    child = backend.start_child(limits, escape)
    _, stderr = child.end()
    lines = stderr.decode().splitlines()
    assert lines[-1] == "done", lines
    assert dict(line.split(" ", 1) for line in lines[:-1]) == ESCAPES


# -- host calls ---------------------------------------------------------------------------------


def test_storage_lives_in_the_host_and_outlives_a_killed_plugin(tmp_path: Path) -> None:
    storage_id = "org.wasihost.fixtures.storage"
    with Host(Policy(allow=CAPS), cache_dir=None, state_dir=tmp_path / "state") as host:
        host.grant(storage_id, "storage")
        ext = host.load(STORAGE)
        assert ext.call("put", {"key": "notes/1", "value": b"hello"}) is None
        pid = only_instance(ext).pid
        os.kill(pid, signal.SIGKILL)
        assert _gone(pid)
        # The call that finds it dead fails, naming how it died; nothing is replayed.
        with pytest.raises(CallError) as info:
            ext.call("get", {"key": "notes/1"})
        assert info.value.failure is FailureClass.NATIVE_PROCESS_EXIT
        assert "SIGKILL" in info.value.message
        # A new process answers from the host's store: the plugin held no state.
        assert ext.call("get", {"key": "notes/1"}) == b"hello"
        assert ext.call("list", {"prefix": "notes/", "after": None, "limit": 10}) == {
            "keys": ["notes/1"],
            "next": None,
        }
    with Host(Policy(allow=CAPS), cache_dir=None, state_dir=tmp_path / "state") as host:
        assert host.load(STORAGE).call("get", {"key": "notes/1"}) == b"hello"


def test_application_functions_and_their_grants(host: Host, lookups: list[Any]) -> None:
    ext = host.load(HOSTILE, grants=["myapp.read"])
    assert ext.call("lookup", {"sku": 7}) == {"found": {"sku": 7}}
    assert ext.call("add", {"a": 2, "b": 40}) == 42
    assert lookups == [{"sku": 7}]
    # Priced by the host: the plugin meters nothing, so the call's fuel is the host calls'.
    assert ext.last_fuel_used >= 100
    host.revoke(ext.id, "myapp.read")
    # As in-process: a native-convention function without a denied result ends the call.
    with pytest.raises(CallError) as info:
        ext.call("add", {"a": 2, "b": 40})
    assert info.value.failure is FailureClass.DENIED
    with pytest.raises(CallError):
        ext.call("lookup", {"sku": 8})
    assert lookups == [{"sku": 7}]


def test_a_host_call_the_calls_fuel_cannot_pay_for_never_runs(host: Host, lookups: list[Any]) -> None:
    ext = host.load(HOSTILE, grants=["myapp.read"], fuel=1_000)
    with pytest.raises(CallError) as info:
        ext.call("lookup", {"sku": 1})
    assert info.value.failure is FailureClass.OUT_OF_FUEL
    assert lookups == []  # refused before its handler ran
    assert ext.call("ping") == "pong"


# -- faults: the host serves the next call -----------------------------------------------------


def test_a_panic_and_an_abort_fail_their_call_and_the_next_call_is_served(host: Host) -> None:
    ext = host.load(HOSTILE)
    for command in ("panic", "abort"):
        with pytest.raises(CallError) as info:
            ext.call(command)
        assert info.value.failure is FailureClass.PANIC
        assert ext.call("ping") == "pong"


def only_instance_after(ext: Extension, command: str) -> int:
    ext.call(command)
    return only_instance(ext).pid


def test_a_crash_is_native_process_exit_and_a_crash_record(host: Host) -> None:
    ext = host.load(HOSTILE)
    pid = only_instance_after(ext, "ping")
    with pytest.raises(CallError) as info:
        ext.call("crash")
    assert info.value.failure is FailureClass.NATIVE_PROCESS_EXIT
    assert "SIGSEGV" in info.value.message
    assert [c.crash_class.value for c in host.supervisor.crashes(ext.id)] == [
        "native_process_exit"
    ]
    assert ext.call("ping") == "pong"
    assert only_instance(ext).pid != pid


def test_a_plugin_computing_past_its_deadline_is_killed_and_charged(host: Host) -> None:
    ext = host.load(HOSTILE, timeout_ms=300)
    pid = only_instance_after(ext, "ping")
    charged: list[int] = []
    only_instance(ext).charge_unclaimed(charged.append)
    started = time.monotonic()
    with pytest.raises(CallError) as info:
        ext.call("spin")
    took = time.monotonic() - started
    assert info.value.failure is FailureClass.DEADLINE
    assert took < PROMPT_S
    assert _gone(pid)
    # The CPU it burnt until the kill is charged: about 0.3-0.55 s of CPU on a quiet machine.
    assert charged and charged[0] > (100_000_000 - CPU_ALLOWANCE_NS) * FUEL_PER_CPU_NS
    assert ext.call("ping") == "pong"


def test_memory_past_the_address_space_limit_ends_the_process(host: Host) -> None:
    ext = host.load(HOSTILE)  # max_memory_bytes 64 MiB: RLIMIT_AS 64 + 256 MiB
    assert ext.call("hog", {"mib": 16}) == 16
    with pytest.raises(CallError) as info:
        ext.call("hog", {"mib": 512})
    assert info.value.failure is FailureClass.NATIVE_PROCESS_EXIT
    assert "memory allocation" in info.value.message
    assert ext.call("ping") == "pong"


# -- admission ----------------------------------------------------------------------------------


def _native_package(tmp_path: Path, executable: bytes, abi: str = "1.0") -> Path:
    """hello-native with ``executable`` in place of its own and ABI ``abi``."""
    root = tmp_path / "pkg"
    shutil.copytree(HELLO, root)
    (root / "hello-native").write_bytes(executable)
    manifest = root / "extension.toml"
    manifest.write_text(manifest.read_text().replace('abi = "1.0"', f'abi = "{abi}"'))
    return root


def test_admission_refuses_what_cannot_run_here_before_anything_runs(
    host: Host, tmp_path: Path
) -> None:
    wasm = (FIXTURES / "hello" / "hello.wasm").read_bytes()
    with pytest.raises(AdmissionError, match="WebAssembly module, not a native executable"):
        host.load(_native_package(tmp_path / "a", wasm))
    elf = bytearray((HELLO / "hello-native").read_bytes())
    elf[18:20] = (183).to_bytes(2, "little")  # e_machine: aarch64
    with pytest.raises(AdmissionError, match="built for aarch64, and this host is x86_64"):
        host.load(_native_package(tmp_path / "b", bytes(elf)))
    with pytest.raises(AdmissionError, match="not an ELF executable"):
        host.load(_native_package(tmp_path / "c", b"#!/bin/sh\nexit 0\n"))
    with pytest.raises(AdmissionError, match="this host serves"):
        host.load(_native_package(tmp_path / "d", (HELLO / "hello-native").read_bytes(), abi="9.0"))


def test_a_native_manifest_names_an_executable_and_no_wasi(host: Host, tmp_path: Path) -> None:
    root = _native_package(tmp_path / "a", (HELLO / "hello-native").read_bytes())
    manifest = root / "extension.toml"
    text = manifest.read_text()
    manifest.write_text(text.replace('module = "hello-native"', 'module = "hello.wasm"'))
    with pytest.raises(ManifestError, match="names a .wasm file, but runtime 'native-process'"):
        host.load(root)
    manifest.write_text(text.replace('runtime = "native-process"\n', ""))
    with pytest.raises(ManifestError, match='needs runtime = "native-process"'):
        host.load(root)
    manifest.write_text(text.replace('optional = ["clock"]', 'optional = ["clock", "wasi.fs.read"]'))
    with pytest.raises(AdmissionError, match="a native plugin has no WASI"):
        host.load(root)


def test_only_the_entries_of_its_capabilities_are_offered(host: Host) -> None:
    plan, _, _ = host.plan(host.load_package(HELLO))
    names = {(e.module, e.name) for e in plan.imports}
    assert ("wasihost_v1", "log") in names
    # log (required) and clock (optional, within the policy); no WASI, no other capability.
    assert {e.capability for e in plan.imports} == {"core", "log", "clock"}
    assert not any(e.module.startswith("wasi_") for e in plan.imports)


def test_the_executable_is_held_sealed_and_its_digest_checked(host: Host) -> None:
    backend = host.backend_for("native-process")
    assert isinstance(backend, NativeBackend)
    data = (HELLO / "hello-native").read_bytes()
    program = backend.compile(data)
    assert isinstance(program, NativeProgram)
    with pytest.raises(PermissionError):
        os.write(program.fd, b"x")  # F_SEAL_WRITE: EPERM
    assert backend.compile(data) is program
    with pytest.raises(CallError, match="sha256 does not match"):
        backend.compile(data, "0" * 64)


# -- packages and the command line --------------------------------------------------------------


def _signed_package(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """hello-native, with a publisher, packed and signed by a new acme.example key."""
    source = tmp_path / "source"
    shutil.copytree(HELLO, source)
    manifest = source / "extension.toml"
    text = manifest.read_text().replace('version = "0.1.0"\n', 'version = "0.1.0"\npublisher = "acme.example"\n', 1)
    manifest.write_text(text)
    assert _cli(capsys, "keygen", "--publisher", "acme.example", "--out", tmp_path / "acme")[0] == 0
    pkg = tmp_path / "hello-native.whpkg"
    assert _cli(capsys, "pack", source, "-o", pkg)[0] == 0
    assert _cli(capsys, "sign", pkg, "--key", tmp_path / "acme.key")[0] == 0
    return pkg


def _cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_pack_sign_verify_install_and_run_a_native_plugin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pkg = _signed_package(tmp_path, capsys)
    pub = tmp_path / "acme.pub"
    code, out, _ = _cli(capsys, "verify", pkg, "--trust", pub)
    assert code == 0 and out.startswith("verified: org.wasihost.fixtures.hello 0.1.0")
    state = tmp_path / "state"
    code, _, err = _cli(capsys, "install", pkg, "--trust", pub, "--state-dir", state)
    assert code == 0, err
    grant = ("grants", "grant", "org.wasihost.fixtures.hello", "log", "--state-dir", state)
    assert _cli(capsys, *grant)[0] == 0
    code, out, err = _cli(
        capsys, "run", "org.wasihost.fixtures.hello", "greet", "--input", '{"name": "ada"}',
        "--state-dir", state, "--trust", pub,
    )
    assert (code, out) == (0, '{"greeting": "hello, ada"}\n'), err
    code, out, _ = _cli(capsys, "inspect", pkg, "--trust", pub, "--json")
    report = json.loads(out)
    assert report["native"] == {
        "machine": "x86_64",
        "kind": "position-independent executable",
        "interpreter": "/lib64/ld-linux-x86-64.so.2",
    }
    assert report["admission"]["admitted"]
    assert any("no fuel metering" in row for row in report["declared"])


def test_a_tampered_executable_fails_verification(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from wasihost.packaging.archive import read_archive, write_archive

    pkg = _signed_package(tmp_path, capsys)
    archive = read_archive(pkg.read_bytes())
    files = dict(archive.files)
    files["hello-native"] = files["hello-native"] + b"\0"
    pkg.write_bytes(write_archive(files, archive.signature))
    code, _, err = _cli(capsys, "verify", pkg, "--trust", tmp_path / "acme.pub")
    assert code == 1 and "signature" in err


def test_the_cli_runs_a_native_plugin_and_refuses_it_in_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = _cli(capsys, "run", HELLO, "greet", "--input", '{"name": "ada"}', "--no-cache")
    assert (code, out) == (0, '{"greeting": "hello, ada"}\n')
    code, _, err = _cli(capsys, "run", "--runtime", "in-process", HELLO, "greet", "--no-cache")
    assert code == 1 and "never in-process" in err
    code, out, _ = _cli(capsys, "inspect", "--runtime", "in-process", HELLO)
    assert code == 1 and "never in-process" in out
    # Not a WASI command: the wasi subcommand says which command runs it.
    code, _, err = _cli(capsys, "wasi", HELLO)
    assert code == 2 and f"wasihost run {HELLO} COMMAND" in err
