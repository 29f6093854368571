"""The example application runs end to end, as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_greeter_app_runs_as_documented(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "greeter_app" / "app.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "loaded org.wasihost.fixtures.hello, granted ['clock', 'log']"
    assert lines[1:3] == ["hello, ada", "hello, grace"]
    assert "plugin refused bad input: invalid_input" in lines
    assert "tiny budget: out_of_fuel" in lines
    assert "plugin log [org.wasihost.fixtures.hello] greeting" in proc.stderr
