"""A wasihost ABI guest may import WASI entries too: the default host serves the profile."""

from __future__ import annotations

from tests.support.common import bare
from tests.support.guests import build, escape, guest_wat
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

FD_WRITE = (
    '(import "wasi_snapshot_preview1" "fd_write" '
    "(func $fd_write (param i32 i32 i32 i32) (result i32)))"
)
TEXT = b"hello from an ABI guest\n"


def test_abi_guest_prints_through_wasi_to_its_log() -> None:
    # iovec at 9000 -> 9100 (len), nwritten at 9200
    extra = (
        f'(data (i32.const 9100) "{escape(TEXT)}")'
        f'(data (i32.const 9000) "{escape((9100).to_bytes(4, "little") + len(TEXT).to_bytes(4, "little"))}")'
    )
    body = (
        "(if (i32.ne (call $fd_write (i32.const 1) (i32.const 9000) (i32.const 1) (i32.const 9200))"
        " (i32.const 0)) (then unreachable)) (call $ok_null)"
    )
    wasm = build(guest_wat(body, imports=FD_WRITE, extra=extra))
    with Host(Policy(), cache_dir=None) as host:
        ext = host.admit(bare(wasm))
        assert ext.call("run") is None
        assert [r.message for r in ext.logs()] == ["hello from an ABI guest"]


def test_abi_guest_without_wasi_grants_gets_errnos_not_files() -> None:
    path_open = (
        '(import "wasi_snapshot_preview1" "fd_prestat_get" '
        "(func $prestat (param i32 i32) (result i32)))"
    )
    body = "(if (i32.ne (call $prestat (i32.const 3) (i32.const 9000)) (i32.const 8)) (then unreachable)) (call $ok_null)"
    wasm = build(guest_wat(body, imports=path_open))
    with Host(Policy(), cache_dir=None) as host:
        assert host.admit(bare(wasm)).call("run") is None  # 8 = BADF: no preopens
