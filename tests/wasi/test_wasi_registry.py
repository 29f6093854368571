"""The WASI profile's table: 46 preview1 functions, their capabilities, denied errnos and limits,
the committed registry JSON, and the config -> grant mapping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import wasmtime

from tests.support.wasi import ROOT
from wasihost.core.errors import ConfigError
from wasihost.core.registry import CORE_CAPABILITY
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.wasi import (
    CAPABILITIES,
    FUNCTIONS,
    MODULE,
    PROFILE,
    ClockProfile,
    Errno,
    Mount,
    WasiOptions,
    capabilities_for,
    wasi_profile,
)
from wasihost.wasi.binding import HANDLERS
from wasihost.wasi.registry import render_json

PREVIEW1_NAMES = [
    "args_get",
    "args_sizes_get",
    "environ_get",
    "environ_sizes_get",
    "clock_res_get",
    "clock_time_get",
    "fd_advise",
    "fd_allocate",
    "fd_close",
    "fd_datasync",
    "fd_fdstat_get",
    "fd_fdstat_set_flags",
    "fd_fdstat_set_rights",
    "fd_filestat_get",
    "fd_filestat_set_size",
    "fd_filestat_set_times",
    "fd_pread",
    "fd_prestat_get",
    "fd_prestat_dir_name",
    "fd_pwrite",
    "fd_read",
    "fd_readdir",
    "fd_renumber",
    "fd_seek",
    "fd_sync",
    "fd_tell",
    "fd_write",
    "path_create_directory",
    "path_filestat_get",
    "path_filestat_set_times",
    "path_link",
    "path_open",
    "path_readlink",
    "path_remove_directory",
    "path_rename",
    "path_symlink",
    "path_unlink_file",
    "poll_oneoff",
    "proc_exit",
    "proc_raise",
    "sched_yield",
    "random_get",
    "sock_accept",
    "sock_recv",
    "sock_send",
    "sock_shutdown",
]


def test_all_46_preview1_functions_are_entries_with_a_handler() -> None:
    assert len(PREVIEW1_NAMES) == 46
    assert sorted(f.name for f in FUNCTIONS) == sorted(PREVIEW1_NAMES)
    assert set(HANDLERS) == set(PREVIEW1_NAMES)
    for f in FUNCTIONS:
        assert f.module == MODULE == "wasi_snapshot_preview1"
        assert f.convention == "native"
        assert f.capability in {*CAPABILITIES, CORE_CAPABILITY}
        assert f.fuel_base > 0 and f.fuel_per_byte >= 1


def test_signatures_match_wasmtimes_own_preview1() -> None:
    """A module importing every entry with our signatures links against wasmtime's built-in
    WASI (the reference): a single wrong type would make instantiation fail."""
    imports = "\n".join(
        f'(import "{MODULE}" "{f.name}" (func (param {" ".join(f.params)}) '
        f"(result {' '.join(f.results)})))".replace("(result )", "")
        for f in FUNCTIONS
    )
    wasm = wasmtime.wat2wasm(f'(module {imports} (memory (export "memory") 1))')
    engine = wasmtime.Engine()
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    store = wasmtime.Store(engine)
    store.set_wasi(wasmtime.WasiConfig())
    linker.instantiate(store, wasmtime.Module(engine, wasm))


def test_every_import_stays_linkable_and_denies_with_an_errno() -> None:
    """Deny by default yet linkable: every entry but proc_exit (core, no result) answers a
    documented errno when its capability is not granted."""
    for f in FUNCTIONS:
        if f.name == "proc_exit":
            assert f.capability == CORE_CAPABILITY and f.denied_result is None
            continue
        assert f.denied_result is not None, f.name
        assert f.denied_result in {e.value for e in Errno}
    denied = {f.name: f.denied_result for f in FUNCTIONS}
    assert denied["args_get"] == denied["environ_get"] == Errno.SUCCESS  # sizes said 0/0
    assert denied["path_open"] == Errno.BADF
    assert denied["path_create_directory"] == Errno.ROFS
    assert denied["clock_time_get"] == denied["random_get"] == Errno.NOTCAPABLE


def test_capability_table() -> None:
    caps = {f.name: f.capability for f in FUNCTIONS}
    core = {n for n, c in caps.items() if c == CORE_CAPABILITY}
    assert {
        "proc_exit",
        "fd_prestat_get",
        "args_sizes_get",
        "environ_sizes_get",
        "fd_write",
    } <= core
    assert caps["args_get"] == "wasi.args" and caps["environ_get"] == "wasi.env"
    assert caps["clock_time_get"] == "wasi.clock" and caps["random_get"] == "wasi.random"
    assert caps["path_open"] == "wasi.fs.read" and caps["path_rename"] == "wasi.fs.write"
    # No socket descriptor exists in this profile: sock_* answer from the descriptor table.
    assert all(caps[n] == CORE_CAPABILITY for n in caps if n.startswith("sock_"))
    assert set(CAPABILITIES) == {
        "wasi.stdio", "wasi.args", "wasi.env", "wasi.clock", "wasi.random",
        "wasi.fs.read", "wasi.fs.write", "wasi.sockets",
    }  # fmt: skip


def test_committed_registry_json_is_the_python_table() -> None:
    path = ROOT / "abi" / "wasi" / "registry.json"
    assert path.read_text("utf-8") == render_json(), (
        "abi/wasi/registry.json is stale; regenerate it (see wasihost/wasi/registry.py)"
    )
    doc = json.loads(path.read_text("utf-8"))
    assert len(doc["functions"]) == 46
    assert doc["errno"]["2big"] == 1 and doc["errno"]["notcapable"] == 76


def test_host_serves_the_profile_and_its_capabilities() -> None:
    with Host(Policy(), cache_dir=None, profiles=[wasi_profile()]) as host:
        assert host.registry.profiles["wasi"] is PROFILE
        assert set(CAPABILITIES) <= host.registry.capabilities()
        assert CORE_CAPABILITY not in host.registry.capabilities()


def test_capabilities_for_gives_exactly_what_the_config_provides(tmp_path: Path) -> None:
    (tmp_path / "ro").mkdir()
    (tmp_path / "rw").mkdir()
    assert capabilities_for(WasiOptions()) == frozenset()
    full = WasiOptions(
        argv=["a"],
        env={"K": "V"},
        stdout=lambda b: None,
        clock="anonymous",
        random_seed=b"s" * 16,
        mounts=[Mount(tmp_path / "ro", "/ro"), Mount(tmp_path / "rw", "/rw", writable=True)],
    )
    assert capabilities_for(full) == {
        "wasi.args", "wasi.env", "wasi.stdio", "wasi.clock", "wasi.random",
        "wasi.fs.read", "wasi.fs.write",
    }  # fmt: skip
    assert capabilities_for(WasiOptions(mounts=[Mount(tmp_path, "/d")])) == {"wasi.fs.read"}
    assert capabilities_for(WasiOptions(stdin=b"x")) == {"wasi.stdio"}
    assert full.clock is ClockProfile.ANONYMOUS


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"env": ["NOEQUALS"]}, "not K=V"),
        ({"env": ["=v"]}, "empty or contains"),
        ({"env": [("A", "1"), ("A", "2")]}, "given twice"),
        ({"env": "A=1"}, "not one string"),
        ({"argv": "prog"}, "not one string"),
        ({"argv": ["a\0b"]}, "NUL"),
        ({"argv": ["x" * 70_000]}, "argv is over"),
        ({"random_seed": b"short"}, "random_seed"),
        ({"clock": "precise"}, "not one of"),
        ({"max_fds": 4}, "max_fds"),
        ({"max_fds": 100_000}, "max_fds"),
        ({"stdout": b"not callable"}, "callable"),
    ],
)
def test_config_refuses_bad_values(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        WasiOptions(**kwargs)  # type: ignore[arg-type]


def test_mount_parsing_and_nesting(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    m = Mount.parse(f"{tmp_path}::/data", writable=False)
    assert (m.host, m.guest, m.writable) == (tmp_path.resolve(), "/data", False)
    assert Mount.parse(str(tmp_path), writable=True).guest == str(tmp_path)  # as wasmtime
    with pytest.raises(ConfigError, match="not a directory"):
        Mount.parse(f"{tmp_path}/missing::/x", writable=False)
    with pytest.raises(ConfigError, match="HOST"):
        Mount.parse(f"{tmp_path}::", writable=False)
    with pytest.raises(ConfigError, match="absolute"):
        Mount(Path("relative"), "/x")
    with pytest.raises(ConfigError, match="through which it would be writable"):
        WasiOptions(mounts=[Mount(tmp_path, "/rw", True), Mount(tmp_path / "sub", "/ro")])
    with pytest.raises(ConfigError, match="share a guest path"):
        WasiOptions(mounts=[Mount(tmp_path, "/a"), Mount(tmp_path / "sub", "/a")])
