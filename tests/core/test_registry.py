"""The registry the host serves is the normative one in abi/, entry by entry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wasihost.core.errors import ConfigError
from wasihost.core.registry import AbiVersion, Registry, major_from_json
from wasihost.core.status import Status
from wasihost.host.defaults import default_registry

ROOT = Path(__file__).resolve().parents[2]
NORMATIVE = ROOT / "abi" / "v1" / "registry.json"
SHIPPED = ROOT / "wasihost" / "core" / "abi_data" / "v1.json"


@pytest.mark.parametrize("major", [1, 2])
def test_shipped_registry_is_the_normative_file(major: int) -> None:
    normative = ROOT / "abi" / f"v{major}" / "registry.json"
    assert (ROOT / "wasihost" / "core" / "abi_data" / f"v{major}.json").read_bytes() == normative.read_bytes()


def test_python_registry_agrees_with_json_entry_by_entry() -> None:
    doc = json.loads(NORMATIVE.read_text())
    registry = default_registry()
    served = {
        f.name: f
        for f in registry.functions(AbiVersion(1, doc["latest_minor"]))
        if f.module == doc["import_module"]
    }
    assert set(served) == {f["name"] for f in doc["functions"]}
    for raw in doc["functions"]:
        entry = served[raw["name"]]
        assert entry.module == doc["import_module"]
        assert entry.to_json() | {"module": None} == raw | {"module": None}


def test_status_enum_matches_registry_codes() -> None:
    doc = json.loads(NORMATIVE.read_text())
    assert {s.name: s.value for s in Status} == doc["status_codes"]


def test_abi_version_parse_and_order() -> None:
    assert AbiVersion.parse("1.0") < AbiVersion.parse("1.2") < AbiVersion.parse("2.0")
    assert str(AbiVersion.parse("10.3")) == "10.3"
    for bad in ["1", "1.0.0", "01.0", "1.01", "a.b", "", " 1.0", "1.0\n", "1.0\r\n", "10000.0"]:
        with pytest.raises(ValueError, match="MAJOR.MINOR"):
            AbiVersion.parse(bad)


def _doc_with_minor_1() -> dict[str, object]:
    doc = json.loads(NORMATIVE.read_text())
    doc["latest_minor"] = 1
    newer = dict(doc["functions"][1], name="log_v11", since="1.1")
    doc["functions"].append(newer)
    return doc


def test_views_hide_entries_newer_than_the_declared_minor() -> None:
    registry = Registry()
    registry.add_major(major_from_json(_doc_with_minor_1()))
    old = registry.view(AbiVersion(1, 0))
    new = registry.view(AbiVersion(1, 1))
    assert old.lookup("wasihost_v1", "log_v11") is None
    assert new.lookup("wasihost_v1", "log_v11") is not None
    assert old.lookup("wasihost_v1", "log") is not None


def test_unserved_versions_are_refused() -> None:
    registry = default_registry()
    assert registry.supports(AbiVersion(2, 0))
    assert not registry.supports(AbiVersion(2, 5))
    assert not registry.supports(AbiVersion(3, 0))
    assert not registry.supports(AbiVersion(1, 99))
    for version in (AbiVersion(2, 5), AbiVersion(3, 0)):
        with pytest.raises(ConfigError, match=f"ABI {version} is not served .*serves 1.1, 2.0"):
            registry.view(version)


def test_malformed_registry_fails_loudly() -> None:
    doc = json.loads(NORMATIVE.read_text())
    doc["functions"][0]["params"] = ["i33"]
    with pytest.raises(ConfigError, match="value types"):
        major_from_json(doc)
    doc = json.loads(NORMATIVE.read_text())
    doc["functions"].append(doc["functions"][0])
    with pytest.raises(ConfigError, match="duplicate"):
        Registry().add_major(major_from_json(doc))
    for flag in ("never_returns", "commits"):
        doc = json.loads(NORMATIVE.read_text())
        doc["functions"][0][flag] = "yes"
        with pytest.raises(ConfigError, match=flag):
            major_from_json(doc)


def test_abort_never_returns_and_log_commits() -> None:
    """The entries' flags come from the normative JSON, which the conventions honour."""
    entries = {f.name: f for f in default_registry().functions(AbiVersion(1, 0))}
    assert [n for n, f in entries.items() if f.never_returns] == ["abort"]
    assert [n for n, f in entries.items() if f.commits] == ["log"]


def test_capabilities_exclude_core() -> None:
    from wasihost.wasi.registry import CAPABILITIES as WASI_CAPABILITIES

    caps = default_registry().capabilities()
    assert caps == {
        "log", "clock", "random", "storage", "secrets", "http", "files", "events", "jobs"
    } | set(WASI_CAPABILITIES)
    assert "core" not in caps


def test_default_registries_are_separate_but_share_the_shipped_specs() -> None:
    # A CLI run makes two registries; the shipped JSON is parsed once per process (a MajorSpec
    # is frozen), while each registry's own tables stay its own.
    first, second = default_registry(), default_registry()
    assert first is not second and first.majors is not second.majors
    assert all(first.majors[m] is second.majors[m] for m in first.majors)
    assert first.versions == second.versions
