"""The example application runs end to end, as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.common import ROOT


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


def test_the_documented_layout_does_not_shadow_the_package(tmp_path: Path) -> None:
    """The SDK guide puts the checkout beside the user's app as ``wasihost-src``: an app there
    imports the installed package. A checkout named ``wasihost`` would shadow it, which is why
    the guide says not to."""
    app = tmp_path / "app.py"
    app.write_text("import wasihost\nprint(wasihost.Host.__name__)\n")
    (tmp_path / "wasihost-src").symlink_to(ROOT)
    # As a user runs it: the installed package (pip install -e), no PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = [sys.executable, str(app)]
    ok = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert (ok.returncode, ok.stdout) == (0, "Host\n"), ok.stderr
    (tmp_path / "wasihost").symlink_to(ROOT)  # the layout the guide warns against
    bad = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert bad.returncode != 0 and "Host" in bad.stderr
    guide = (ROOT / "guest-sdk" / "README.md").read_text()
    assert "../wasihost-src/guest-sdk" in guide and "../wasihost/guest-sdk" not in guide
