"""Plugins that use an application's own capabilities (issue 35 item 1), through the whole
package flow from the command line: pack, sign, verify, inspect and install read them as
"application capability, not checked here"; run, wasi and update explain that they need the
application's functions and take them with ``--functions MODULE:ATTR``; an operator grants
them to an installed extension that requests them; revoke disables it like any other."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.common import FIXTURES
from wasihost import Host, Policy
from wasihost.cli import main
from wasihost.core.errors import AdmissionError, ConfigError, ManifestError
from wasihost.core.registry import OpenCapabilities, is_application_capability, module_namespace
from wasihost.packaging.package import load_package

APP_ID = "org.wasihost.fixtures.appfns"
NOTE = "application capabilities, not checked here"
# The application's side of fixtures/appfns, as an embedding application declares it.
FUNCTIONS = """
from wasihost import CallContext, HostStatus, Status

CATALOGUE = {"sku-1": {"name": "lamp", "price": 30}}
REMEMBERED = []


def register(host):
    @host.function("myapp.lookup", capability="myapp.read", since="1.0",
                   max_request_bytes=64, max_response_bytes=1024, fuel_base=1000,
                   fuel_per_byte=1)
    def lookup(ctx: CallContext, request):
        if request not in CATALOGUE:
            raise HostStatus(Status.NOT_FOUND)
        return CATALOGUE[request]

    @host.function("myapp.remember", capability="myapp.write", since="1.0",
                   max_request_bytes=64, max_response_bytes=16, fuel_base=1000, fuel_per_byte=1)
    def remember(ctx: CallContext, request):
        REMEMBERED.append(request)
        return len(REMEMBERED)


def broken(host):
    raise RuntimeError("the catalogue is offline")
"""


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with the plugin (given a publisher, to sign it) and the application's
    functions in a module of a name no other test imports; the current directory, as a user
    runs the CLI from their project."""
    package = tmp_path / "plugin"
    shutil.copytree(FIXTURES / "appfns", package)
    manifest = package / "extension.toml"
    manifest.write_text(
        manifest.read_text().replace(
            'version = "0.1.0"\n', 'version = "0.1.0"\npublisher = "org.example.bars"\n', 1
        )
    )
    module = f"appfns_functions_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(FUNCTIONS)
    (tmp_path / "module_name").write_text(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI adds the current directory
    return tmp_path


def _module(workdir: Path) -> str:
    return (workdir / "module_name").read_text()


def test_the_names_an_application_capability_may_have() -> None:
    assert is_application_capability("app.users") and is_application_capability("my_app.read.x")
    for name in ("app", "wasi.fs.read", "wasihost.x", "App.users", "app.", ".users", 7, "a" * 70):
        assert not is_application_capability(name), name
    assert module_namespace("myapp_v1") == "myapp" and module_namespace("wasihost_v1") is None
    known = OpenCapabilities({"log"})
    assert "log" in known and "app.users" in known and "stroage" not in known
    assert known.unchecked(["log", "app.users"]) == ["app.users"]


def test_pack_sign_verify_inspect_install_grant_run_and_revoke_an_application_plugin(
    capsys: pytest.CaptureFixture[str], workdir: Path
) -> None:
    state = ["--state-dir", str(workdir / "state")]
    code, out, _ = run_cli(capsys, "pack", "plugin", "-o", "app.whpkg")
    assert code == 0 and f"note: myapp.read, myapp.write: {NOTE}" in out
    assert run_cli(capsys, "keygen", "--publisher", "org.example.bars", "--out", "key")[0] == 0
    code, out, _ = run_cli(capsys, "sign", "app.whpkg", "--key", "key.key")
    assert code == 0 and NOTE in out
    trust = ["--trust", "key.pub"]
    code, out, _ = run_cli(capsys, "verify", "app.whpkg", *trust)
    assert code == 0 and out.startswith("verified: ") and NOTE in out
    code, out, _ = run_cli(capsys, "inspect", "app.whpkg", *trust)
    assert (
        code == 0 and "myapp_v1.lookup" in out and "application function: not checked here" in out
    )
    assert "not checked here: myapp.read, myapp.write" in out
    code, out, _ = run_cli(capsys, "inspect", "app.whpkg", *trust, "--json")
    assert json.loads(out)["admission"]["not_checked_here"] == ["myapp.read", "myapp.write"]
    code, out, _ = run_cli(capsys, "install", "app.whpkg", *trust, *state)
    assert code == 0 and out.startswith(f"installed {APP_ID} 0.1.0") and NOTE in out

    # The operator grants what the manifest requests; a name it does not request is a typo.
    for capability in ("myapp.read", "myapp.write"):
        assert run_cli(capsys, "grants", "grant", APP_ID, capability, *state)[0] == 0
    code, _, err = run_cli(capsys, "grants", "grant", APP_ID, "myapp.raed", *state)
    assert code == 1 and "unknown capability 'myapp.raed'" in err

    # Running it needs the application's functions, and says so.
    code, _, err = run_cli(capsys, "run", APP_ID, "lookup", "--input", '"sku-1"', *trust, *state)
    assert code == 1
    assert "'myapp.read', 'myapp.write': application capabilities this host does not serve" in err
    assert "hint: these are served by the application that embeds wasihost" in err
    assert "--functions MODULE:ATTR" in err
    functions = ["--functions", f"{_module(workdir)}:register"]
    code, out, err = run_cli(
        capsys, "run", APP_ID, "lookup", "--input", '"sku-1"', *trust, *state, *functions
    )
    assert (code, out) == (0, '{"name": "lamp", "price": 30}\n'), err
    # The package itself, not installed: its grants on the command line.
    code, out, err = run_cli(
        capsys, "run", "plugin", "remember", "--input", '"a note"', "--grant", "myapp.write",
        *functions,
    )  # fmt: skip
    assert (code, out) == (0, "1\n"), err

    code, out, _ = run_cli(
        capsys, "revoke", "--key", "key.key", "revoked.cbor", "--extension", APP_ID, "0.1.0",
        *trust, *state,
    )  # fmt: skip
    assert code == 0 and f"disabled installed {APP_ID}" in out
    code, _, err = run_cli(
        capsys, "run", APP_ID, "lookup", "--input", '"sku-1"', *trust, *state, *functions
    )
    assert code == 1 and "revoked" in err


def test_update_of_an_application_plugin_starts_it_with_the_applications_functions(
    capsys: pytest.CaptureFixture[str], workdir: Path
) -> None:
    state = ["--state-dir", str(workdir / "state")]
    assert run_cli(capsys, "install", "plugin", *state)[0] == 0
    for capability in ("myapp.read", "myapp.write"):
        assert run_cli(capsys, "grants", "grant", APP_ID, capability, *state)[0] == 0
    newer = workdir / "plugin2"
    shutil.copytree(workdir / "plugin", newer)
    manifest = newer / "extension.toml"
    manifest.write_text(manifest.read_text().replace('version = "0.1.0"', 'version = "0.2.0"'))
    code, _, err = run_cli(capsys, "update", "plugin2", *state)
    assert code == 1 and "--functions MODULE:ATTR" in err
    # With them, the new version is admitted and started: it answers the handshake (as
    # 0.1.0, the fixture's build, so the update is refused there and 0.1.0 kept).
    code, out, err = run_cli(
        capsys, "update", "plugin2", *state, "--functions", f"{_module(workdir)}:register"
    )
    assert code == 1 and out == ""
    assert "failed, 0.1.0 kept: wasihost.hello: guest says" in err and "0.2.0" in err


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("no_colon_here", "--functions takes MODULE:ATTR"),
        (":register", "--functions takes MODULE:ATTR"),
        ("no_such_module_anywhere:register", "cannot import 'no_such_module_anywhere'"),
        ("{module}:nothing_of_that_name", "has no function 'nothing_of_that_name'"),
        ("{module}:CATALOGUE", "has no function 'CATALOGUE'"),
        ("{module}:broken", "raised RuntimeError: the catalogue is offline"),
    ],
)
def test_a_bad_functions_flag_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], workdir: Path, given: str, says: str
) -> None:
    spec = given.format(module=_module(workdir))
    code, out, err = run_cli(capsys, "run", "plugin", "lookup", "--functions", spec)
    assert code in (1, 2) and out == ""
    assert says in err and err.startswith("error: ")


def test_the_python_api_installs_an_application_plugin_and_loads_it_only_with_its_functions(
    tmp_path: Path,
) -> None:
    """Install runs nothing of the guest; loading it to run needs the functions registered."""
    with Host(Policy(allow={"myapp.read", "myapp.write"}), state_dir=tmp_path) as host:
        installed = host.install(FIXTURES / "appfns")
        assert installed.id == APP_ID
        host.grant(APP_ID, "myapp.read")
        with pytest.raises(ConfigError, match="unknown capability 'myapp.other'"):
            host.grant(APP_ID, "myapp.other")  # not one its manifest requests
        with pytest.raises(AdmissionError) as refused:
            host.load_installed(APP_ID)
        assert refused.value.unserved == ("myapp.read", "myapp.write")
    # A stateless host still reads the manifest against what it serves.
    with pytest.raises(ManifestError, match="unknown capability 'myapp.read'"):
        load_package(FIXTURES / "appfns", Host(cache_dir=None).registry.capabilities())
