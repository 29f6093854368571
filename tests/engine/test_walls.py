"""The process walls (issue 30, step 1): each applied and checked in a real probe child, and
the parent's reading of that child's report, which treats it as hostile."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from wasihost.engine import walls
from wasihost.engine.walls import MAX_REPORT_BYTES, WALL_NAMES, Wall, parse_report, probe_walls

# A broken child must be told apart quickly; the real probe takes ~0.1 s.
SHORT_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def probed() -> dict[str, Wall]:
    return {w.name: w for w in probe_walls()}


def _enforced_or_refused(wall: Wall) -> None:
    """The wall is enforced; or the kernel refused it (a container without user namespaces, a
    kernel without Landlock), and the test is skipped saying so. Never a failed probe, nor a
    wall applied but not holding."""
    if wall.state == "unavailable" and not wall.detail.startswith(
        ("probe failed", "applied but not holding")
    ):
        pytest.skip(f"the kernel refuses {wall.name} here: {wall.detail}")
    assert wall.state == "enforced", wall


@pytest.mark.parametrize("name", ["no_new_privs", "namespaces", "landlock", "rlimits"])
def test_each_wall_is_enforced_in_the_probe_child(probed: dict[str, Wall], name: str) -> None:
    _enforced_or_refused(probed[name])


def test_the_report_names_every_wall_in_order_with_landlocks_abi() -> None:
    report = probe_walls()
    assert [w.name for w in report] == list(WALL_NAMES)
    landlock = report[WALL_NAMES.index("landlock")]
    if landlock.state == "enforced":
        assert landlock.detail.startswith("ABI "), landlock


def test_seccomp_is_reported_as_available_not_applied_never_enforced(
    probed: dict[str, Wall],
) -> None:
    # No filter is built in this step: claiming "enforced" would be a lie.
    seccomp = probed["seccomp"]
    assert seccomp.state in {"available", "unavailable"}, seccomp
    if seccomp.state == "available":
        assert seccomp.detail.startswith("libseccomp ") and "not applied yet" in seccomp.detail


def test_the_probe_leaves_the_calling_process_unwalled() -> None:
    before = walls.net_namespace()
    nnp = walls.no_new_privs()
    probe_walls()
    # unshare and Landlock cannot be undone: they must only ever happen in the child.
    assert walls.net_namespace() == before
    assert walls.no_new_privs() == nnp
    assert walls.net_isolation_problem(before) == "still in the parent's network namespace"


def test_each_check_sees_a_wall_that_is_not_there() -> None:
    # The checks are what make "enforced" mean something: in this unwalled process they fail.
    assert walls.read_restriction_problem(__file__, sys.executable) == (
        "a file outside the allowed directory was still readable"
    )
    assert walls.rlimit_problem({"RLIMIT_CORE": -1}) is not None


def test_the_child_shortens_its_own_details_to_what_the_parent_accepts() -> None:
    for text in ("é\x1b[2J" + "x" * 1000, "ok", ""):
        shown = walls.short_detail(text)
        entries = [{"name": n, "state": "unavailable", "detail": shown} for n in WALL_NAMES]
        line = json.dumps({"schema": 1, "walls": entries}).encode() + b"\n"
        assert [w.detail for w in parse_report(line)] == [shown] * len(WALL_NAMES)
    assert walls.short_detail("ok") == "ok"


def _child(source: str) -> list[str]:
    return [sys.executable, "-I", "-c", source]


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("print('garbage')", "output is not JSON"),
        (f"print('x' * {4 * MAX_REPORT_BYTES})", f"output over {MAX_REPORT_BYTES} bytes"),
        ("import sys; sys.stdout.write('{' * 100000)", f"output over {MAX_REPORT_BYTES} bytes"),
        ("print('[' * 5000 + ']' * 5000)", "output is not JSON"),  # json's recursion limit
        ("import time; time.sleep(30)", "no report within 1 s"),
        ("pass", "0 lines of output, not one"),
        ("print('{}'); print('{}')", "2 lines of output, not one"),
        ("import sys; sys.exit(3)", "child exit status 3"),
        (
            "import os; os.close(1); import time; time.sleep(30)",
            "the child did not exit within 1 s",
        ),
    ],
)
def test_a_broken_or_hostile_child_is_a_failed_probe_not_a_traceback(
    source: str, reason: str
) -> None:
    report = probe_walls(timeout_s=SHORT_TIMEOUT_S, program=_child(source))
    assert [w.name for w in report] == list(WALL_NAMES)
    assert {(w.state, w.detail) for w in report} == {("unavailable", f"probe failed: {reason}")}


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie not yet reaped by init counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_child_that_forks_and_exits_takes_its_group_with_it(tmp_path: Path) -> None:
    # The grandchild holds stdout open: the probe waits out its deadline, then kills the group.
    pid_file = tmp_path / "pid"
    source = (
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0: time.sleep(30)\n"
        f"open({str(pid_file)!r}, 'w').write(str(pid))\n"
    )
    report = probe_walls(timeout_s=SHORT_TIMEOUT_S, program=_child(source))
    assert report[0].detail == "probe failed: no report within 1 s"
    grandchild = int(pid_file.read_text())
    for _ in range(100):
        if _gone(grandchild):
            break
        time.sleep(0.01)
    assert _gone(grandchild)


def _entries() -> list[dict[str, object]]:
    return [{"name": n, "state": "enforced", "detail": "ok"} for n in WALL_NAMES]


def _report(**changes: object) -> bytes:
    doc: dict[str, object] = {"schema": 1, "walls": _entries()}
    doc.update(changes)
    return json.dumps(doc).encode() + b"\n"


def _one(**fields: object) -> list[dict[str, object]]:
    """Every wall's record, the first one changed."""
    entries = _entries()
    entries[0].update(fields)
    return entries


def test_a_well_formed_report_is_read_as_it_is() -> None:
    assert parse_report(_report()) == [Wall(n, "enforced", "ok") for n in WALL_NAMES]


@pytest.mark.parametrize(
    "raw",
    [
        _report(schema=2),
        _report(schema=True),  # True == 1 in Python; not in a report
        _report(schema="1"),
        _report(extra=1),
        _report(walls={}),
        _report(walls=_one()[:-1]),
        _report(walls=list(reversed(_one()))),
        _report(walls=_one(state="ENFORCED")),
        _report(walls=_one(state=1)),
        _report(walls=_one(detail=None)),
        _report(walls=_one(detail="\x1b[2Jcleared")),
        _report(walls=_one(detail="é")),
        _report(walls=_one(detail="x" * 301)),
        _report(walls=_one(extra="")),
        _report(walls=[*_one()[:-1], "seccomp"]),
        _report(walls=_one(name="landlock")),
        b"[]\n",
        b"\xff\xfe\n",
    ],
)
def test_a_malformed_report_is_a_failed_probe(raw: bytes) -> None:
    report = parse_report(raw)
    assert [w.name for w in report] == list(WALL_NAMES)
    assert all(w.state == "unavailable" and w.detail.startswith("probe failed: ") for w in report)
