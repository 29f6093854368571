"""WASI file writes commit through the grant table: a revocation stops them mid-run."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.common import bare
from tests.support.guests import build
from tests.support.wasi import revoke_mid_run
from wasihost.core.errors import CallError, FailureClass
from wasihost.core.lifecycle import ExtensionRevoked
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.wasi import Mount, WasiOptions, capabilities_for, wasi_profile

WRITER = """(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "out.txt")
  (data (i32.const 200) "x")
  (data (i32.const 300) "\\c8\\00\\00\\00\\01\\00\\00\\00")
  (func (export "_start")
    ;; open /data/out.txt (preopen fd 3) with CREAT|TRUNC and the FD_WRITE right
    (if (i32.ne (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 7)
                  (i32.const 9) (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 400))
                (i32.const 0))
      (then unreachable))
    (loop $l
      (drop (call $write (i32.load (i32.const 400)) (i32.const 300) (i32.const 1) (i32.const 500)))
      (br $l))))"""


def _run_and_revoke(
    tmp_path: Path, capability: str | None
) -> tuple[int, int, BaseException, float]:
    config = WasiOptions(mounts=[Mount(tmp_path, "/data", writable=True)])
    caps = capabilities_for(config)
    with Host(Policy(allow=caps), cache_dir=None, profiles=[wasi_profile(config)]) as host:
        ext = host.admit(bare(build(WRITER)), grants=caps, fuel=10_000_000_000, timeout_ms=1500)
        target = tmp_path / "out.txt"
        sizes: list[int] = []

        def ready() -> bool:
            return target.exists() and target.stat().st_size >= 100

        run = revoke_mid_run(
            host, ext, ready, capability, lambda: sizes.append(target.stat().st_size)
        )
        ended_after = time.monotonic() - run.revoked_at
        assert run.outcome is not None
        return sizes[0], target.stat().st_size, run.outcome, ended_after


def test_no_write_lands_after_revoking_fs_write(tmp_path: Path) -> None:
    before, after, outcome, _ = _run_and_revoke(tmp_path, "wasi.fs.write")
    assert before >= 100
    assert after == before, "a file write committed after revoke returned"
    # the guest kept looping on refused writes until its deadline ended the run
    assert isinstance(outcome, CallError) and outcome.failure is FailureClass.DEADLINE


def test_disable_interrupts_a_running_wasi_command(tmp_path: Path) -> None:
    before, after, outcome, ended_after = _run_and_revoke(tmp_path, None)
    assert after == before
    assert isinstance(outcome, ExtensionRevoked)
    assert ended_after < 1.0  # interrupted within a few ticks, not at the 1.5 s deadline
