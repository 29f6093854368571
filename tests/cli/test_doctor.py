"""`wasihost doctor`: one line per process wall, or a versioned JSON document; exit 0 whatever
the machine lacks. The probe runs in a real child process."""

from __future__ import annotations

import json

import pytest

from tests.support.common import run_child
from tests.test_startup import LOADED, NOT_FOR_A_PLAIN_RUN
from wasihost.cli import doctor, main
from wasihost.engine import fastcall
from wasihost.engine.walls import WALL_NAMES, Wall, failed_probe

STATES = ("enforced", "available", "unavailable")


def test_doctor_prints_one_line_per_wall(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    *lines, call_path = capsys.readouterr().out.splitlines()
    assert call_path == f"call path: {fastcall.PATH} (" + (
        "" if fastcall.PATH == "compiled" else "warning: slower calls; "
    ) + f"{fastcall.WHY})"
    assert [line.split()[0] for line in lines] == list(WALL_NAMES)
    for line in lines:
        assert line.split()[1] in STATES, line
    # The reason a wall is missing, or what an enforced one holds, follows in parentheses.
    assert all(line.endswith(")") for line in lines)


def test_doctor_json_is_a_versioned_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["schema", "walls", "call_path"] and doc["schema"] == 1
    assert doc["call_path"] == {"path": fastcall.PATH, "detail": fastcall.WHY}
    assert [w["name"] for w in doc["walls"]] == list(WALL_NAMES)
    assert all(list(w) == ["name", "state", "detail"] for w in doc["walls"])
    assert {w["state"] for w in doc["walls"]} <= set(STATES)
    # Every wall is applied in the probe now: none is merely "available".
    assert {w["state"] for w in doc["walls"]} <= {"enforced", "unavailable"}


def test_a_failed_probe_is_reported_and_still_exits_0(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(doctor, "probe_walls", lambda: failed_probe("no report within 10 s"))
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "no_new_privs  unavailable (probe failed: no report within 10 s)"
    assert len(out.splitlines()) == len(WALL_NAMES) + 1  # and the call path


def test_the_text_shows_each_state_as_its_word(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    walls = [
        Wall("no_new_privs", "enforced", "set and read back"),
        Wall("seccomp", "enforced", "libseccomp 2.5.4, allow-list of 65 calls, default EPERM"),
        Wall("landlock", "unavailable", "landlock_create_ruleset(VERSION): EOPNOTSUPP"),
        Wall("rlimits", "available", "a wall present but not applied"),  # no wall says so today
    ]
    monkeypatch.setattr(doctor, "probe_walls", lambda: walls)
    assert main(["doctor"]) == 0
    assert capsys.readouterr().out.split("call path: ")[0] == (
        "no_new_privs  enforced (set and read back)\n"
        "seccomp       enforced (libseccomp 2.5.4, allow-list of 65 calls, default EPERM)\n"
        "landlock      unavailable (landlock_create_ruleset(VERSION): EOPNOTSUPP)\n"
        "rlimits       available (a wall present but not applied)\n"
    )


def test_doctor_loads_no_packaging_state_or_asyncio() -> None:
    # The command needs the walls module. It does load wasmtime today, through
    # wasihost/engine/__init__.py's eager exports: the probe child does not (it runs walls.py
    # as a script under -I).
    report, _ = run_child(LOADED, "doctor", "--json")
    assert report["code"] == 0
    loaded = set(report["modules"])
    assert "wasihost.engine.walls" in loaded
    assert loaded.isdisjoint(NOT_FOR_A_PLAIN_RUN), loaded & set(NOT_FOR_A_PLAIN_RUN)
