"""The old import paths keep working for one release, as the same objects as the new homes."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import wasihost

# Old path -> new home, for each module the docs named before the layer packages (issue 29).
OLD_PATHS = {
    "aio": "host.aio",
    "budget_crossing": "core.budget_crossing",
    "budgets": "core.budgets",
    "call_gate": "host.call_gate",
    "callworkers": "host.callworkers",
    "codec": "core.codec",
    "codeshape": "core.codeshape",
    "errors": "core.errors",
    "eviction": "supervisor.eviction",
    "extension": "host.extension",
    "governor": "supervisor.governor",
    "hostfn": "host.functions",
    "hostlog": "core.hostlog",
    "inspect": "host.inspect",
    "lifecycle": "core.lifecycle",
    "manifest_tables": "core.manifest_tables",
    "package": "packaging.package",
    "policy": "host.policy",
    "reports": "supervisor.reports",
    "restart_policies": "supervisor.restart_policies",
    "runtime": "host.runtime",
    "scheduling": "supervisor.scheduling",
    "secrets": "store.secrets",
    "status": "core.status",
    "supervision": "supervisor.supervision",
    "updates": "host.updates",
}


@pytest.mark.parametrize(("old", "new"), sorted(OLD_PATHS.items()))
def test_an_old_path_gives_the_same_objects_as_its_new_home(old: str, new: str) -> None:
    shim = importlib.import_module(f"wasihost.{old}")
    home = importlib.import_module(f"wasihost.{new}")
    public = [name for name in vars(home) if not name.startswith("_")]
    assert public
    for name in public:
        assert getattr(shim, name) is getattr(home, name), name
    # Private and lazily made names are forwarded too (tests and docs reached some of them).
    private = [name for name in vars(home) if name.startswith("_") and not name.startswith("__")]
    for name in private:
        assert getattr(shim, name) is getattr(home, name), name
    with pytest.raises(AttributeError):
        shim.no_such_name_here


def test_the_documented_lazy_names_still_resolve_through_old_paths() -> None:
    from wasihost import budgets, supervision

    assert budgets.Crossing is importlib.import_module("wasihost.core.budget_crossing").Crossing
    assert supervision.CrashRecord is importlib.import_module("wasihost.supervisor.reports").CrashRecord


def test_the_public_namespace_keeps_its_32_names_from_their_new_homes() -> None:
    assert len(wasihost.__all__) == 32
    assert wasihost.Host is importlib.import_module("wasihost.host.runtime").Host
    assert wasihost.CallError is importlib.import_module("wasihost.core.errors").CallError
    assert wasihost.Broker is importlib.import_module("wasihost.host.functions").Broker


def test_no_module_of_the_package_imports_an_old_path() -> None:
    # A shim is for users: were the package to import one, a start-up list would hide it.
    code = (
        "import sys, wasihost, wasihost.host.runtime, wasihost.cli.run, wasihost.brokers.storage; "
        f"old = {sorted(OLD_PATHS)!r}; "
        "loaded = [m for m in old if 'wasihost.' + m in sys.modules]; "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
