"""Red-team review of the embedding API's arguments and of the CLI's text arguments: every
public entry point given something of the wrong kind, out of range or not valid text.

The rule: a ``ConfigError`` (or the package's ``PackageError``) naming the argument, raised
before anything changes; never a raw ``TypeError``/``AttributeError`` from deep inside, never a
silent accept, never a host left half-changed. Each test here was seen to fail against the
code before the commit that added it.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import FIXTURES
from wasihost.cli import main
from wasihost.core.budgets import BudgetPolicy
from wasihost.core.errors import ConfigError, PackageError, WasihostError
from wasihost.core.lifecycle import MAX_REASON_BYTES, ExtensionUnavailable, clip_reason
from wasihost.core.settings import EngineSettings
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

ECHO = FIXTURES / "echo"
ECHO_ID = "org.wasihost.fixtures.echo"
# Values of every wrong kind an embedder's code might pass by mistake.
WRONG = [None, "x", True, -1, 0, math.nan, 1.5, b"x", {"a"}, [1], {}, object()]


def test_a_policy_update_of_the_wrong_kind_changes_nothing() -> None:
    """``update_policy(None)`` stored None as the host's policy before failing, so every later
    ``load``, ``plan`` and ``update`` died with ``AttributeError: 'NoneType' object has no
    attribute 'trusted_publishers'``: one wrong argument broke the host for good."""
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        ext = host.load(ECHO)
        before = host.policy
        for bad in (None, "strict", {"allow": ["log"]}, Policy):
            with pytest.raises(ConfigError, match="update_policy takes a Policy"):
                host.update_policy(bad)  # type: ignore[arg-type]
        assert host.policy is before
        assert ext.call("echo", 7) == 7
        assert host.load(FIXTURES / "hello").id != ECHO_ID


@pytest.mark.parametrize(
    "option",
    [
        "policy",
        "settings",
        "registry",
        "clock",
        "log_sink",
        "supervisor",
        "governor",
        "eviction",
        "scheduler",
        "cache_dir",
        "state_dir",
        "brokers",
        "profiles",
    ],
)
def test_host_options_of_the_wrong_kind_are_refused_naming_them(
    option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most were accepted silently (``policy="x"``, ``clock=1``, ``log_sink=0``,
    ``supervisor=True``: each failed later, inside a load or a call) or failed with a raw
    ``AttributeError``/``TypeError``; ``cache_dir=True`` made a directory named ``True`` in the
    working directory, and ``state_dir=""`` would have put the state there."""
    monkeypatch.chdir(tmp_path)
    wrong: list[Any] = [1, True, object()]
    if option in ("cache_dir", "state_dir"):
        wrong += [b"dir", ""]
    elif option in ("brokers", "profiles"):
        wrong += ["x", None, [object()], [("a", "b")]]
    else:
        wrong += ["x"]
    for bad in wrong:
        with pytest.raises(ConfigError) as refused:
            Host(**{option: bad})
        assert option in str(refused.value) or "broker" in str(refused.value), (bad, refused)
    assert list(tmp_path.iterdir()) == [], "a refused Host left something behind"


def test_a_state_directory_given_as_text_is_a_path(tmp_path: Path) -> None:
    """``state_dir`` as a ``str`` died with ``'str' object has no attribute 'absolute'``; it
    is a path like ``cache_dir``, which always took text."""
    with Host(Policy(allow={"log"}), cache_dir=None, state_dir=str(tmp_path / "s")) as host:
        host.install(ECHO)
        assert host.load_installed(ECHO_ID).call("echo", 1) == 1


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("allow", None),
        ("allow", 1),
        ("allow", b"log"),  # was read byte by byte: frozenset({108, 111, 103})
        ("allow", [1]),  # a name that is no string was kept, granting nothing
        ("allow", {"log": True}),
        ("clock_resolution_ns", None),
        ("clock_resolution_ns", "1000"),
        ("clock_resolution_ns", True),
        ("clock_resolution_ns", math.nan),
        ("random_seed", "s" * 16),  # a str of 16 characters passed the length check
        ("random_seed", 0),
        ("ceilings", None),
        ("ceilings", [("fuel_per_call", 1)]),
        ("ceilings", {1: 1}),
        ("require_signed", "yes"),
        ("trusted_publishers", "keys.txt"),
        ("revocations", "list.json"),
        ("allowed_signers", object()),
        ("budgets", {"cpu_fuel_per_minute": 1}),
    ],
)
def test_policy_fields_of_the_wrong_kind_are_config_errors(field: str, bad: Any) -> None:
    with pytest.raises(ConfigError):
        Policy(**{field: bad})


@pytest.mark.parametrize("bad", [None, "throttle", ["cpu_fuel_per_minute"], 1])
def test_budget_actions_that_are_no_mapping_are_config_errors(bad: Any) -> None:
    """``BudgetPolicy(actions=...)`` fed anything to ``dict()``: a raw ``TypeError`` or
    ``ValueError: dictionary update sequence element #0 has length 1``."""
    with pytest.raises(ConfigError, match="budget actions must be a mapping"):
        BudgetPolicy(actions=bad)


def test_a_reason_that_cannot_be_stored_is_refused_before_anything_changes(
    tmp_path: Path,
) -> None:
    """A revocation's reason went into SQLite unchecked: a list or a dict failed the write
    with a raw ``sqlite3.ProgrammingError``, a lone surrogate (a non-UTF-8 byte of a command
    line) with a raw ``UnicodeEncodeError``, and a 50 MB string was written twice (100 MB of
    state database). Each is now a ConfigError and the grant table, lifecycle and journal are
    as they were."""
    state = tmp_path / "state"
    with Host(Policy(allow={"log"}), cache_dir=None, state_dir=state) as host:
        ext = host.load(ECHO)
        epoch = host.grants.epoch(ECHO_ID)
        journal = host.require_state().remaining_data(ECHO_ID)["journal_events"]
        for bad in (["x"], {"why": 1}, 3, None, "x\udcff", "r" * (MAX_REASON_BYTES + 1)):
            for action in (
                lambda bad=bad: host.revoke(ECHO_ID, None, bad),
                lambda bad=bad: host.disable(ECHO_ID, bad),
                lambda bad=bad: host.revoke("org.example.other", None, bad),
                lambda bad=bad: ext.pause(bad),
                lambda bad=bad: ext.quarantine(bad),
                lambda bad=bad: ext.close(bad),
            ):
                with pytest.raises(ConfigError, match="reason"):
                    action()
        assert host.grants.epoch(ECHO_ID) == epoch
        assert host.grants.state("org.example.other").revoked is None
        assert host.require_state().remaining_data(ECHO_ID)["journal_events"] == journal
        assert ext.call("echo", "still running") == "still running"
        # A reason of the largest size is kept whole.
        host.disable(ECHO_ID, "é" * (MAX_REASON_BYTES // 2))
        assert host.grants.state(ECHO_ID).revoked == "é" * (MAX_REASON_BYTES // 2)
    assert (state / "state.sqlite3").stat().st_size < 1024 * 1024


def test_text_the_host_makes_a_reason_of_is_made_storable_not_refused() -> None:
    """A revocation list's verdict or a reason read back from the state is the host's to
    store, not the operator's to fix: it is clipped and cleaned rather than refused (a refusal
    would leave the revocation it explains undone)."""
    clipped = clip_reason("é" * 5000)
    assert len(clipped.encode()) <= MAX_REASON_BYTES and clipped.endswith("...")
    assert clip_reason("bad \udcff byte").encode("utf-8")
    assert clip_reason("short") == "short"


def test_ids_that_are_no_text_are_config_errors(tmp_path: Path) -> None:
    """``Host.extension``, ``release``, ``usage`` and ``quarantine_report`` took any object:
    an unhashable one was a raw ``TypeError``, others were accepted (a report about ``None``);
    an id with a lone surrogate passed the id check and then failed the grant table's write
    with a raw ``UnicodeEncodeError``."""
    with Host(Policy(allow={"log"}), cache_dir=None, state_dir=tmp_path / "state") as host:
        for bad in ([1], {}, {"a"}, None, 3, b"org.x"):
            for action in (
                lambda bad=bad: host.extension(bad),
                lambda bad=bad: host.release(bad),
                lambda bad=bad: host.usage(bad),
                lambda bad=bad: host.quarantine_report(bad),
            ):
                with pytest.raises(ConfigError, match="extension id"):
                    action()
        for action in (
            lambda: host.grant("org.x\udcff", "log"),
            lambda: host.revoke("org.x\udcff"),
            lambda: host.reinstate("org.x\udcff"),
            lambda: host.quarantine_report("org.x\udcff"),
        ):
            with pytest.raises(ConfigError, match="not valid UTF-8"):
                action()
        with pytest.raises(ConfigError, match="capability must be a string"):
            host.revoke("org.x", ["log"])  # type: ignore[arg-type]
        assert host.require_state().extensions() == []


def test_a_bare_module_whose_file_name_is_not_utf8_is_refused_at_load(tmp_path: Path) -> None:
    """A bare module's id is its file's stem; a stem holding a byte that is not UTF-8 was
    admitted, and its first call died in the handshake (signing the extension's token) with a
    raw ``UnicodeEncodeError`` out of ``Extension.call``."""
    name = os.fsdecode(b"e\xffcho.wasm")
    shutil.copy(ECHO / "echo.wasm", tmp_path / name)
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        with pytest.raises(PackageError, match="not valid UTF-8; rename the file"):
            host.load(tmp_path / name, grants=[])
        shutil.copy(ECHO / "echo.wasm", tmp_path / "echo.wasm")
        assert host.load(tmp_path / "echo.wasm", grants=[]).call("echo", 3) == 3


@pytest.mark.parametrize("bad", [None, 3, True, b"fixtures/echo", "", "fix\x00tures", ["a"]])
def test_a_package_source_of_the_wrong_kind_is_a_config_error(bad: Any) -> None:
    """``Host.load(None)`` and friends were raw ``TypeError``s from pathlib, and ``""`` loaded
    the working directory as a package."""
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        for action in (
            lambda: host.load(bad),
            lambda: host.update(bad),
            lambda: host.load_package(bad),
        ):
            with pytest.raises(ConfigError, match="package"):
                action()


@pytest.mark.parametrize("bad", [None, "fixtures/echo", ECHO, object()])
def test_plan_and_admit_take_a_package_and_say_so(bad: Any) -> None:
    """``plan`` and ``admit`` read ``.manifest`` off whatever they got: a raw
    ``AttributeError``, even for a path (which ``load`` takes)."""
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        for action in (lambda: host.plan(bad), lambda: host.admit(bad)):
            with pytest.raises(ConfigError, match="Package"):
                action()


@pytest.mark.parametrize("bad", [math.nan, -1, math.inf, None, "1", True])
def test_wait_idle_refuses_a_wait_that_is_no_number_of_seconds(bad: Any) -> None:
    """``wait_idle(nan)`` returned True (idle) at once whatever ran: NaN compares false with
    every deadline; ``None`` and ``"1"`` were raw ``TypeError``s."""
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        ext = host.load(ECHO)
        with pytest.raises(ConfigError, match="timeout_s"):
            ext.wait_idle(bad)
        assert ext.wait_idle(0.5)


@pytest.mark.parametrize("bad", [None, "storage", object(), 3])
def test_add_broker_refuses_what_is_no_broker(bad: Any) -> None:
    with (
        Host(Policy(allow={"log"}), cache_dir=None) as host,
        pytest.raises(ConfigError, match="is not a broker"),
    ):
        host.add_broker(bad)


def test_every_public_method_answers_a_wrong_argument_with_a_wasihost_error() -> None:
    """A sweep over the operator and calling methods with values of every wrong kind: each
    answer is a wasihost error (or an accepted value), never a raw Python error, and the host
    still serves calls afterwards."""
    with Host(Policy(allow={"log", "clock", "random"}), cache_dir=None) as host:
        ext = host.load(ECHO)
        other = host.load(FIXTURES / "hello")
        for bad in WRONG:
            for action in (
                lambda bad=bad: ext.call(bad, 1),
                lambda bad=bad: ext.call("echo", 1, fuel=bad),
                lambda bad=bad: ext.call("echo", 1, timeout_ms=bad),
                lambda bad=bad: ext.run_command(fuel=bad),
                lambda bad=bad: host.grant(bad, "log"),
                lambda bad=bad: host.grant(ECHO_ID, bad),
                lambda bad=bad: host.grant(other.id, "log", bad),
                lambda bad=bad: host.revoke(bad, "log"),
                lambda bad=bad: host.reinstate(bad),
                lambda bad=bad: host.extension(bad),
                lambda bad=bad: host.quarantine_report(bad),
                lambda bad=bad: host.usage(bad),
                lambda bad=bad: host.release(bad),
                lambda bad=bad: host.update_policy(bad),
                lambda bad=bad: host.broker(bad),
                lambda bad=bad: host.add_broker(bad),
                lambda bad=bad: host.plan(bad),
                lambda bad=bad: host.load(bad),
                lambda bad=bad: host.load(ECHO, grants=bad),
                lambda bad=bad: host.load(ECHO, fuel=bad),
                lambda bad=bad: host.load(ECHO, timeout_ms=bad),
                lambda bad=bad: ext.wait_idle(bad),
                lambda bad=bad: other.pause(bad),
                lambda bad=bad: Host(cache_dir=None).close(bad),
            ):
                with contextlib.suppress(WasihostError):
                    action()
                if other.lifecycle.state.value == "paused":
                    other.resume()
        assert ext.call("echo", "after") == "after"
        host.grant(other.id, "log")
        assert ext.call("echo", 2) == 2


def test_the_cli_says_in_its_own_words_that_an_id_or_reason_is_not_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A non-UTF-8 byte in an id or a ``--reason`` on the command line (a lone surrogate once
    decoded) ended ``wasihost grants`` with ``error: internal: UnicodeEncodeError`` (exit 70),
    and a bare module named so failed its run the same way."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    bad_id = os.fsdecode(b"org.x\xff")
    bad_reason = os.fsdecode(b"because \xff")
    module = tmp_path / os.fsdecode(b"e\xffcho.wasm")
    shutil.copy(ECHO / "echo.wasm", module)
    for argv, expected in (
        (["grants", "list", bad_id, "--state-dir", str(state)], "not valid UTF-8"),
        (["grants", "grant", bad_id, "log", "--state-dir", str(state)], "not valid UTF-8"),
        (
            ["grants", "revoke", "org.x", "--reason", bad_reason, "--state-dir", str(state)],
            "reason is not valid UTF-8",
        ),
        (
            ["grants", "revoke", "org.x", "--reason", "x" * 5000, "--state-dir", str(state)],
            f"at most {MAX_REASON_BYTES}",
        ),
        (["run", str(module), "echo", "--no-cache"], "rename the file"),
    ):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert "internal" not in err and "Traceback" not in err, err
        assert expected in err, err
    db = sqlite3.connect(state / "state.sqlite3")
    try:  # nothing of the refused actions was written
        assert db.execute("SELECT count(*) FROM events").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM grants").fetchone() == (0,)
    finally:
        db.close()


def test_a_closed_extension_still_refuses_a_bad_reason_and_stays_closed() -> None:
    """``close`` checks its reason before it acts, and a closed extension is still
    ``unavailable`` (never a half-closed one) after a refused close."""
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        ext = host.load(ECHO)
        with pytest.raises(ConfigError):
            ext.close(["x"])  # type: ignore[arg-type]
        assert ext.call("echo", 1) == 1
        ext.close("done")
        with pytest.raises(ExtensionUnavailable):
            ext.call("echo", 1)


def test_engine_settings_refuse_wrong_kinds() -> None:
    """Held before this review: recorded so that it keeps holding."""
    for field in ("max_wasm_stack", "epoch_tick_ms", "memory_reservation", "pooling_instances"):
        for bad in (None, "1", True, 1.5, math.nan, 2**70):
            with pytest.raises(ConfigError, match=field):
                EngineSettings(**{field: bad})
