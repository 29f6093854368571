"""WASI options from grant scopes: mounts, argv, env and clocks held in the grant table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.common import bare
from tests.support.guests import build
from wasihost.core.errors import ConfigError
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.wasi import Mount, WasiOptions
from wasihost.wasi.config import ClockProfile
from wasihost.wasi.scopes import apply_scopes, check_scope

WRITE_ONCE = """(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "out.txt")
  (data (i32.const 200) "scoped")
  (data (i32.const 300) "\\c8\\00\\00\\00\\06\\00\\00\\00")
  (func (export "_start")
    (local $err i32)
    (local.set $err (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 7)
                  (i32.const 9) (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 400)))
    (if (local.get $err) (then (call $exit (local.get $err))))
    (call $exit (call $write (i32.load (i32.const 400)) (i32.const 300) (i32.const 1) (i32.const 500)))))"""


def test_scopes_add_to_the_embedders_options(tmp_path: Path) -> None:
    base = WasiOptions(env={"A": "1"}, mounts=[Mount(tmp_path / "a", "/a")])
    out = apply_scopes(
        base,
        {
            "wasi.fs.read": {
                "mounts": [{"host": str(tmp_path / "b"), "guest": "/b", "writable": True}]
            },
            "wasi.env": {"env": {"B": "2"}},
            "wasi.args": {"argv": ["tool", "-v"]},
            "wasi.clock": {"profile": "anonymous"},
            "log": {},
        },
    )
    assert [m.guest for m in out.mounts] == ["/a", "/b"] and out.mounts[1].writable
    assert dict(out.env) == {"A": "1", "B": "2"}
    assert out.argv == ("tool", "-v")
    assert out.clock is ClockProfile.ANONYMOUS


@pytest.mark.parametrize(
    ("capability", "scope", "message"),
    [
        ("wasi.fs.read", {"mounts": [{"host": "relative", "guest": "/d"}]}, "must be absolute"),
        ("wasi.fs.read", {"mounts": [{"host": "/srv"}]}, "a mount in a grant scope"),
        ("wasi.fs.read", {"paths": []}, "unknown keys paths"),
        ("wasi.env", {"env": {"K": 1}}, "map text to text"),
        ("wasi.random", {"seed": "00"}, "takes no keys"),
        ("wasi.clock", {"profile": "fast"}, "not one of"),
    ],
)
def test_malformed_scopes_are_refused(
    capability: str, scope: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        check_scope(capability, scope)


def test_env_conflict_with_the_host_is_an_error() -> None:
    with pytest.raises(ConfigError, match="conflicts"):
        apply_scopes(WasiOptions(env={"K": "host"}), {"wasi.env": {"env": {"K": "grant"}}})


def test_a_mount_granted_by_scope_is_served(tmp_path: Path) -> None:
    with Host(Policy(allow={"wasi.fs.read", "wasi.fs.write"}), cache_dir=None) as host:
        ext = host.admit(bare(build(WRITE_ONCE)), grants=["wasi.fs.read", "wasi.fs.write"])
        assert ext.run_command() == 8  # no mount yet: fd 3 is not a preopen (BADF)
        host.grant(
            ext.id,
            "wasi.fs.read",
            {"mounts": [{"host": str(tmp_path), "guest": "/data", "writable": True}]},
        )
        assert ext.run_command() == 0
        assert (tmp_path / "out.txt").read_bytes() == b"scoped"
        with pytest.raises(ConfigError, match="must be absolute"):
            host.grant(ext.id, "wasi.fs.read", {"mounts": [{"host": "x", "guest": "/x"}]})
