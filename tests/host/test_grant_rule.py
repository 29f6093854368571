"""The grant rule (issue 35 item 3, docs/grants.md): an extension holds requested ∩ granted ∩
allowed, whatever changed last, with a state directory or without one, and ``ext.grants``
says where each capability it holds came from.

Before: a load's ``grants`` did not narrow a package's grant on a host without a state
directory (``grants=[]`` still gave every optional capability) and were ignored outright on a
host with one; a policy allowing more after a load widened nothing; and ``Host.grant`` of a
capability the admitted manifest does not request was taken and gave nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.common import FIXTURES
from wasihost.core.errors import AdmissionError, ConfigError
from wasihost.core.grants import GrantOrigin
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

HELLO = FIXTURES / "hello"  # requests log (required) and clock (optional)
HELLO_ID = "org.wasihost.fixtures.hello"
ECHO_WASM = FIXTURES / "echo" / "echo.wasm"
BOTH = Policy(allow={"log", "clock"})


def origins(ext: Extension) -> dict[str, GrantOrigin]:
    """Each capability ``ext`` holds now, after a call applied any change, and its origin."""
    ext.call("greet", {"name": "ada"})
    return {c: info.origin for c, info in ext.grants.items()}


def test_a_load_naming_no_grants_gives_what_the_manifest_requests_and_the_policy_allows() -> None:
    with Host(BOTH, cache_dir=None) as host:
        ext = host.load(HELLO)
        assert origins(ext) == {"log": GrantOrigin.MANIFEST, "clock": GrantOrigin.MANIFEST}
        assert ext.grants["log"].required and not ext.grants["clock"].required
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        assert origins(host.load(HELLO)) == {"log": GrantOrigin.MANIFEST}


def test_a_loads_grants_narrow_the_optional_capabilities_without_a_state_directory() -> None:
    with Host(BOTH, cache_dir=None) as host:
        ext = host.load(HELLO, grants=[])  # before: clock too
        assert origins(ext) == {"log": GrantOrigin.MANIFEST}
        ext.close()
        ext = host.load(HELLO, grants=["clock"])
        assert origins(ext) == {"log": GrantOrigin.MANIFEST, "clock": GrantOrigin.LOAD}


def test_a_grant_after_the_load_is_the_grant_tables_and_a_revocation_takes_it() -> None:
    with Host(BOTH, cache_dir=None) as host:
        ext = host.load(HELLO, grants=[])
        before = host.grants.epoch(HELLO_ID)
        host.grant(HELLO_ID, "clock")
        assert origins(ext) == {"log": GrantOrigin.MANIFEST, "clock": GrantOrigin.GRANT}
        assert ext.grants["clock"].since_epoch > before and ext.grants["clock"].scope == {}
        host.revoke(HELLO_ID, "clock")
        assert origins(ext) == {"log": GrantOrigin.MANIFEST}


def test_a_policy_allowing_more_widens_the_grant_before_the_next_call() -> None:
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        ext = host.load(HELLO)
        assert origins(ext) == {"log": GrantOrigin.MANIFEST}
        host.update_policy(BOTH)  # before: clock stayed out until a reload
        assert origins(ext) == {"log": GrantOrigin.MANIFEST, "clock": GrantOrigin.MANIFEST}
        host.update_policy(Policy(allow={"log"}))
        assert origins(ext) == {"log": GrantOrigin.MANIFEST}


def test_a_grant_the_admitted_manifest_does_not_request_is_refused_without_a_state_directory() -> (
    None
):
    with Host(Policy(allow={"log", "clock", "random"}), cache_dir=None) as host:
        ext = host.load(HELLO)
        epoch = host.grants.epoch(HELLO_ID)
        with pytest.raises(ConfigError, match=r"does not request 'random'.*\[capabilities\]"):
            host.grant(HELLO_ID, "random")
        assert host.grants.epoch(HELLO_ID) == epoch  # nothing written
        assert "random" not in origins(ext)


def test_a_loads_grants_are_checked_against_the_manifest_and_the_policy() -> None:
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        with pytest.raises(AdmissionError, match="'random' was not requested by the manifest"):
            host.load(HELLO, grants=["random"])
        with pytest.raises(AdmissionError, match=r"'clock' is requested .* not allowed by"):
            host.load(HELLO, grants=["clock"])


def test_with_a_state_directory_a_loads_grants_are_written_to_the_grant_table(
    tmp_path: Path,
) -> None:
    with Host(BOTH, state_dir=tmp_path, cache_dir=None) as host:
        with pytest.raises(AdmissionError, match="required capability 'log' is not granted"):
            host.load(HELLO)  # a new id: nothing is granted yet
        ext = host.load(HELLO, grants=["log"])  # before: ignored, and refused as above
        assert origins(ext) == {"log": GrantOrigin.LOAD}
        assert any(e.kind == "grant" and e.detail.startswith("log ") for e in host.require_state().events(HELLO_ID))
    # Durable: the next host's load without grants holds what the table holds.
    with Host(BOTH, state_dir=tmp_path, cache_dir=None) as host:
        ext = host.load(HELLO)
        assert origins(ext) == {"log": GrantOrigin.GRANT}
        ext.close()
        ext = host.load(HELLO, grants=["clock"])  # joins what is held; removes nothing
        assert origins(ext) == {"log": GrantOrigin.GRANT, "clock": GrantOrigin.LOAD}


def test_with_a_state_directory_a_refused_loads_grants_write_nothing(tmp_path: Path) -> None:
    with Host(Policy(allow={"log"}), state_dir=tmp_path, cache_dir=None) as host:
        for grants in (["log", "random"], ["log", "clock"]):
            with pytest.raises(AdmissionError):
                host.load(HELLO, grants=grants)
        assert host.grants.state(HELLO_ID).entries == {}
        assert [e for e in host.require_state().events(HELLO_ID) if e.kind == "grant"] == []


def test_with_a_state_directory_a_grant_for_a_later_version_is_kept_and_journalled(
    tmp_path: Path,
) -> None:
    with Host(Policy(allow={"log", "random"}), state_dir=tmp_path, cache_dir=None) as host:
        ext = host.load(HELLO, grants=["log"])
        host.grant(HELLO_ID, "random")  # a later version may request it: kept
        assert "random" in host.grants.state(HELLO_ID).entries
        assert "random" not in origins(ext)
        (line,) = [e for e in host.require_state().events(HELLO_ID) if e.detail.startswith("random ")]
        assert "not requested by the running version's manifest" in line.detail


@pytest.mark.parametrize("state", [False, True], ids=["no state directory", "state directory"])
def test_a_bare_modules_grants_are_its_request(tmp_path: Path, state: bool) -> None:
    with Host(BOTH, state_dir=tmp_path if state else None, cache_dir=None) as host:
        ext = host.load(ECHO_WASM, grants=["clock"])
        ext.call("echo", 1)
        assert {c: i.origin for c, i in ext.grants.items()} == {"clock": GrantOrigin.LOAD}


@pytest.mark.parametrize("state", [False, True], ids=["no state directory", "state directory"])
def test_a_loads_grants_given_as_an_iterator_are_read_once_and_mean_the_same(
    tmp_path: Path, state: bool
) -> None:
    """Before: the plan read the iterator and the grant table's record read it again, empty,
    so the extension's grant named clock and its record did not (its calls were refused)."""
    with Host(BOTH, state_dir=tmp_path if state else None, cache_dir=None) as host:
        ext = host.load(HELLO, grants=iter(["log", "clock"]) if state else iter(["clock"]))
        assert set(origins(ext)) == {"log", "clock"}
        assert {"log", "clock"} <= set(host.grants.state(HELLO_ID).entries)
        assert ext.grants["clock"].origin is GrantOrigin.LOAD


@pytest.mark.parametrize(
    ("grants", "says"),
    [
        (5, "not int"),
        ([["clock"]], "not list"),
        ([1], "not int 1"),
        ([b"clock"], "not bytes b'clock'"),
        ("clock", "not 'clock'"),
    ],
)
def test_a_loads_grants_of_the_wrong_kind_are_a_config_error(grants: object, says: str) -> None:
    with Host(BOTH, cache_dir=None) as host:
        with pytest.raises(ConfigError, match=f"grants must be .*{re.escape(says)}"):
            host.load(HELLO, grants=grants)  # type: ignore[arg-type]
        assert host.extension(HELLO_ID) is None
