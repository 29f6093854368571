"""Files an operator names where a regular file belongs (a package's manifest or module, a
module, a .whpkg, an input file, a trust file, an allowed_signers file, a signature, a
revocation list, a key) may be anything: a FIFO with no writer, a directory, a device. Each is
refused at once with a message naming what it is, never a hang and never an internal error.

The CLI runs in a child process with a timeout: before the fix a FIFO held it forever."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.common import FIXTURES
from wasihost.packaging.regular_files import NotARegularFile, read_regular

# Far above the few hundred milliseconds a refusal takes, far below a hang.
CHILD_TIMEOUT_S = 60

KINDS = ("fifo", "directory", "device")


def _make(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/null")  # followed where links are; refused as a link elsewhere


def _cli(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RUST_BACKTRACE": "0"}
    return subprocess.run(
        [sys.executable, "-m", "wasihost.cli", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env=env,
        check=False,
    )


def _refused(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr and "internal" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("part", ["extension.toml", "echo.wasm"])
def test_a_package_whose_manifest_or_module_is_not_a_file_is_refused(
    tmp_path: Path, part: str, kind: str
) -> None:
    package = tmp_path / "echo"
    shutil.copytree(FIXTURES / "echo", package, ignore=shutil.ignore_patterns("src", "target"))
    (package / part).unlink()
    _make(package / part, kind)
    # A link to a device is refused as a link (or as leaving the package) before its kind.
    expected = {"fifo": ("a FIFO",), "directory": ("a directory",), "device": ()}[kind]
    _refused(_cli("run", package, "noop", "--no-cache"), *expected)


def test_a_module_or_archive_that_is_not_a_file_is_refused(tmp_path: Path) -> None:
    for name in ("guest.wasm", "guest.whpkg"):
        path = tmp_path / name
        os.mkfifo(path)
        _refused(_cli("run", path, "noop", "--no-cache"))


def test_an_input_is_read_from_a_pipe_or_device_and_refused_as_a_directory(
    tmp_path: Path,
) -> None:
    """Inputs are streams: a pipe with a writer (a shell's process substitution) is read, a
    device is read up to the input bound, and only a directory is refused by kind."""
    fifo = tmp_path / "input.json"
    os.mkfifo(fifo)
    writer = subprocess.Popen(  # the other end, as `<(echo ...)` would be
        ["sh", "-c", f"printf '{{\"a\": 1}}' > {fifo}"]
    )
    try:
        result = _cli("run", FIXTURES / "echo", "echo", "--input-file", fifo, "--no-cache")
    finally:
        writer.wait(timeout=CHILD_TIMEOUT_S)
    assert (result.returncode, result.stdout) == (0, '{"a": 1}\n'), result.stderr
    endless = _cli("run", FIXTURES / "echo", "echo", "--input-bytes", "/dev/zero", "--no-cache")
    _refused(endless, "over")
    directory = _cli("run", FIXTURES / "echo", "echo", "--input-file", tmp_path, "--no-cache")
    _refused(directory, "not a regular file but a directory")


@pytest.mark.parametrize("kind", KINDS)
def test_trust_signature_list_and_key_files_that_are_not_files_are_refused(
    tmp_path: Path, kind: str
) -> None:
    bad = tmp_path / "bad"
    _make(bad, kind)
    package = tmp_path / "echo.whpkg"
    assert _cli("pack", FIXTURES / "echo", "-o", package).returncode == 0
    for argv in (
        ("verify", package, "--trust", bad),
        ("verify", package, "--allowed-signers", bad, "--ssh-sig", package),
        ("verify", package, "--allowed-signers", package, "--ssh-sig", bad),
        ("sign", package, "--key", bad),
    ):
        _refused(_cli(*argv))


def test_the_reader_names_the_kind_and_reads_regular_files(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(NotARegularFile, match="a FIFO"):
        read_regular(fifo, 10)
    with pytest.raises(NotARegularFile, match="a directory"):
        read_regular(tmp_path, 10)
    with pytest.raises(NotARegularFile, match="a character device"):
        read_regular("/dev/null", 10, follow=True)
    link = tmp_path / "link"
    link.symlink_to(fifo)
    with pytest.raises(OSError, match="symbolic links"):
        read_regular(link, 10)  # a final link is refused unless followed (ELOOP)
    plain = tmp_path / "plain"
    plain.write_bytes(b"x" * 20)
    assert read_regular(plain, 10) == b"x" * 11  # one byte over: the caller sees it is too big
    assert read_regular(plain, 64) == b"x" * 20
