"""Red-team review of issue 28 (packages and state): extension ids that are paths, the state
directory's resolution and the paths its records keep, the digest of unsigned installs, and
damaged state directories.

Each test here was seen to fail against the code it guards (see the commit that added it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from wasihost import updates
from wasihost.cli import main
from wasihost.errors import ConfigError
from wasihost.policy import Policy
from wasihost.runtime import Host

# -- ids that are paths (issue 28 item 1) ---------------------------------------------------

PATH_IDS = ["..", ".", "../victim", "../../victim", "a/b", "../../../../tmp/x", "\udcff", ""]


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_remove_and_rollback_of_an_id_that_is_a_path_are_refused_and_change_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``remove .. --purge`` printed "removed .. and its data" and emptied the state
    directory (``data/..`` exists once ``data/`` does, so the id counted as kept);
    ``remove ../../victim --purge`` deleted a directory beside it; ``rollback
    ../../../../tmp/x`` made ``x.lock`` in /tmp before looking the id up; ``rollback a/b`` and
    a non-UTF-8 id were internal errors (exit 70). Each is now one ``config`` line, exit 1,
    and nothing on disk changes."""
    state = tmp_path / "base" / "state"
    state.mkdir(parents=True, mode=0o700)
    (state.parent / "victim").mkdir()
    (state.parent / "victim" / "keep").write_text("mine")
    flags = ["--state-dir", str(state)]
    assert main(["grants", "grant", "org.example.a", "log", *flags]) == 0
    (state / "data" / "org.example.a").mkdir(parents=True)
    capsys.readouterr()
    before = _listing(tmp_path)
    for bad in PATH_IDS:
        for argv in (["remove", bad, "--purge"], ["remove", bad], ["rollback", bad]):
            assert main([*argv, *flags]) == 1, argv
            err = capsys.readouterr().err
            assert err.startswith("error: config: ") and "not an extension id" in err, (argv, err)
    assert _listing(tmp_path) == before
    assert not Path("/tmp/x.lock").exists()
    assert main(["status", "org.example.a", *flags]) == 0


@pytest.mark.parametrize("bad", [*PATH_IDS, 5, None, "x\ny", "a" * 256], ids=repr)
def test_every_python_entry_point_naming_an_installed_id_checks_it_first(
    tmp_path: Path, bad: Any
) -> None:
    """``updates.remove``/``purge``, ``Host.rollback``, ``Host.load_installed`` and the
    state's own ``remove`` and path builders refuse what is no extension id before any path
    is made of it."""
    state = tmp_path / "state"
    with Host(Policy(allow={"log"}), cache_dir=None, state_dir=state) as host:
        host.grant("org.example.a", "log")
        (state / "data").mkdir()
        store = host.require_state()
        before = _listing(tmp_path)
        for action in (
            lambda: updates.remove(host, bad, purge=True),
            lambda: updates.remove(host, bad, purge=False),
            lambda: updates.purge(host, bad),
            lambda: updates.rollback(host, bad),
            lambda: host.rollback(bad),
            lambda: host.load_installed(bad),
            lambda: store.remove(bad, purge=True),
            lambda: store.data_dir(bad),
            lambda: store.package_dir(bad),
            lambda: store.checkpoint_dir(bad),
        ):
            with pytest.raises(ConfigError, match="extension id"):
                action()
        assert _listing(tmp_path) == before
        assert store.extensions() == ["org.example.a"]
