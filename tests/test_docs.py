"""The user-facing docs say what the code does: their code blocks run as written, and the
commands, flags, tests, files and limits they name exist with the values they give.

Every fenced block of README.md, docs/*.md (but security.md, whose claims are checked by the
tests it names) and examples/README.md is classified below: run (a shell block through the CLI
on a fresh state directory, a Python block with the setup a fragment assumes), or not run with
the reason. A new block fails ``test_every_block_is_classified`` until it is given one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.support.common import FIXTURES, ROOT
from wasihost.cli import _parser, main
from wasihost.core import limits, manifest

PAGES = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "security.md"),
    ROOT / "examples" / "README.md",
]


class Block(NamedTuple):
    page: str  # relative to ROOT
    line: int  # of the opening fence
    lang: str
    text: str

    @property
    def key(self) -> tuple[str, str]:
        """The page and the block's first line: stable under edits elsewhere on the page."""
        first = next((line.strip() for line in self.text.splitlines() if line.strip()), "")
        return self.page, first


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    opened: tuple[int, str, int, list[str]] | None = None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        fence = re.match(r"^(\s*)```(\S*)\s*$", line)
        if fence and opened is None:
            opened = (number, fence.group(2), len(fence.group(1)), [])
        elif fence and opened is not None:
            start, lang, _indent, body = opened
            found.append(Block(str(page.relative_to(ROOT)), start, lang, "\n".join(body) + "\n"))
            opened = None
        elif opened is not None:
            opened[3].append(line[opened[2] :])
    assert opened is None, f"{page}: a code block opened at line {opened[0]} is never closed"
    return found


ALL_BLOCKS = [b for page in PAGES for b in blocks(page)]

# Blocks not run, with the reason: by language (toml is parsed below, the mermaid diagram is
# checked by test_lifecycle, the rest are not programs), then one by one.
NOT_RUN_LANGS = {
    "rust": "guest code: test_rust_blocks_compile_as_guests builds each for wasm32 (a whole "
    "guest as it is, a fragment inside a function of one)",
    "toml": "manifests: test_the_manifest_reference_* and test_manifest_fragments_* parse them",
    "mermaid": "generated from lifecycle.TRANSITIONS; test_lifecycle checks it is current",
    "json": "a schema sketch with placeholders; test_bench_cli checks the real --json output",
    "": "a format or value shape with placeholders, not a program",
}
NOT_RUN = {
    ("docs/native-plugins.md", "wasihost run fixtures/hello-native greet --input '{\"name\": \"ada\"}'"):
        "needs a signing key and a trust file: test_native_runtime.py runs each of these "
        "commands (run, inspect, pack, sign, verify, install) on hello-native",
    ("docs/bench.md", "pip install -e '.[bench]'          # extism==1.1.1 (the peer) and matplotlib (for --plot)"):
        "installs packages; the synopsis line is checked by test_every_documented_flag_exists",
    ("docs/bench.md", "python - old.json new.json <<'EOF'"):
        "compares two bench --json files, which a bench run (minutes) would make",
    ("docs/packages.md", "ssh-keygen -Y sign -f ~/.ssh/id_ed25519 -n wasihost my-extension.whpkg   # my-extension.whpkg.sig"):
        "needs the user's SSH key; test_package_ssh runs the same commands with a made one",
    ("docs/packages.md", "from wasihost import Host"):
        "needs an SSH signature (above); test_package_ssh loads through the same API",
    ("docs/packages.md", "wasihost install hello-0.1.0.whpkg --state-dir /var/lib/app --trust trusted-publishers"):
        "needs two signed releases with a migration; test_updates runs install/update/rollback",
    ("docs/scheduling.md", "from wasihost.supervisor.scheduling import calls_as"):
        "a fragment inside a broker's handler; test_scheduling runs calls_as",
    ("docs/host-functions.md", "# myapp_functions.py, next to where you run the CLI"):
        "the module of the CLI example after it: test_the_cli_example_of_application_functions"
        "_runs writes it beside the package and runs that command with it",
}


def classified(block: Block) -> str:
    if block.key in NOT_RUN:
        return "not run"
    if block.lang in ("sh", "python"):
        return "run"
    return "not run" if block.lang in NOT_RUN_LANGS else "unclassified"


def test_every_block_is_classified() -> None:
    unknown = [f"{b.page}:{b.line} ({b.lang})" for b in ALL_BLOCKS if classified(b) == "unclassified"]
    assert not unknown, f"code blocks of an unknown language: {unknown}"
    stale = set(NOT_RUN) - {b.key for b in ALL_BLOCKS}
    assert not stale, f"NOT_RUN names blocks no page has any more: {stale}"


# -- shell blocks ------------------------------------------------------------------------------

# A line of a synopsis, not a command: placeholders in capitals or optional parts in brackets.
_SYNOPSIS = re.compile(r"\[|\b[A-Z][A-Z_.]{2,}\b|\.\.\.|\|")


def shell_commands(block: Block) -> list[str]:
    """The block's commands, continuation lines joined, comments kept for shlex to drop."""
    commands: list[str] = []
    pending = ""
    for line in block.text.splitlines():
        pending += line
        if pending.rstrip().endswith("\\"):
            pending = pending.rstrip()[:-1] + " "
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quoted argument (a JSON scope) goes on over the next line
            pending += "\n"
            continue
        if pending.strip():
            commands.append(pending.strip())
        pending = ""
    return commands


def _wasihost_lines() -> Iterator[tuple[Block, str]]:
    """Every documented `wasihost SUB ...` line, synopses included (several commands on a line
    separated by `;` each count)."""
    for block in ALL_BLOCKS:
        if block.lang != "sh":
            continue
        for command in shell_commands(block):
            for part in command.split(";"):
                words = part.split("  #", 1)[0].strip()
                if words.startswith("wasihost "):
                    yield block, words


def _subcommand_flags() -> dict[str, set[str]]:
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags: dict[str, set[str]] = {}
    for name, subparser in sub.choices.items():
        found: set[str] = set()
        for action in subparser._actions:
            found.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                for nested in action.choices.values():
                    for a in nested._actions:
                        found.update(a.option_strings)
        flags[name] = found - {"-h", "--help"}
    return flags


def test_every_documented_flag_exists() -> None:
    """A flag a page shows on a `wasihost SUB` line is one SUB takes."""
    flags = _subcommand_flags()
    wrong = []
    for block, line in _wasihost_lines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # a synopsis's quote left open by an ellipsis
            words = line.split()
        for sub in words[1].split("|"):  # `wasihost run|verify|inspect ...`
            if sub not in flags:
                wrong.append(f"{block.page}:{block.line}: no subcommand {sub!r} ({line})")
                continue
            # One shell word each: a flag-like text inside a quoted JSON scope is not a flag.
            for word in words[2:]:
                flag = word.strip("[]|")
                if re.fullmatch(r"--?[a-z][a-z0-9-]*", flag) and flag not in flags[sub]:
                    wrong.append(f"{block.page}:{block.line}: wasihost {sub} has no {flag}")
    assert not wrong, "\n".join(wrong)


def test_the_cli_reference_names_every_subcommand_and_flag() -> None:
    """docs/cli.md is the CLI's reference: every subcommand and every flag is on it."""
    text = (ROOT / "docs" / "cli.md").read_text()
    missing = []
    for sub, flags in _subcommand_flags().items():
        if f"wasihost {sub}" not in text:
            missing.append(f"wasihost {sub}")
        missing += [f"wasihost {sub} {f}" for f in sorted(flags) if f not in text]
    assert not missing, f"docs/cli.md does not mention: {missing}"


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A new user's machine: an empty home (so the default state and cache directories are
    new), a working directory holding a checkout's fixtures."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    for var in ("XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    (work / "fixtures").symlink_to(FIXTURES)
    monkeypatch.chdir(work)
    return work


def run_shell_block(
    block: Block, capsys: pytest.CaptureFixture[str], *, expect_failure: frozenset[int] = frozenset()
) -> list[tuple[str, int, str, str]]:
    """Each command of ``block`` in the current directory: `wasihost ...` through the CLI's
    main in this process (fast, and the worktree's code), anything else through bash. Returns
    (command, exit status, stdout, stderr); every command must succeed but those whose index is
    in ``expect_failure``."""
    results = []
    for index, command in enumerate(shell_commands(block)):
        argv = shlex.split(command, comments=True)
        if argv and argv[0] == "wasihost":
            capsys.readouterr()
            code = main(argv[1:])
            out, err = capsys.readouterr()
        else:
            proc = subprocess.run(
                ["bash", "-c", command], capture_output=True, text=True, timeout=30, check=False
            )
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        assert (code != 0) == (index in expect_failure), (
            f"{block.page}:{block.line}: `{command}` exited {code}\n{out}{err}"
        )
        results.append((command, code, out, err))
    return results


def block_at(page: str, first_line_start: str) -> Block:
    (found,) = [b for b in ALL_BLOCKS if b.page == page and b.key[1].startswith(first_line_start)]
    return found


def test_readme_quick_start_prints_the_documented_greeting(
    fresh: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """README.md's quick start: the install is the test environment's; the run is checked."""
    (install_and_run, tests) = shell_commands(block_at("README.md", "python3 -m venv"))
    assert tests == "python3 -m pytest -n auto"
    # .ci/run runs the same test command (README.md says so), then again with the compiled
    # call path off, and on one worker with the process runtime as the default, then the soak
    # tests under both runtimes (README.md says all of it).
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    one_worker = tests.removesuffix(" -n auto")
    assert [line for line in ci if "pytest" in line and not line.startswith("#")] == [
        tests,
        f"WASIHOST_FASTCALL=0 {tests}",
        f"{one_worker} --runtime=process",
        f"{tests} --soak -m soak",
        f"{one_worker} --soak -m soak --runtime=process",
    ]
    readme_text = " ".join((ROOT / "README.md").read_text().split())
    assert f"`WASIHOST_FASTCALL=0 {tests}`" in readme_text
    run = install_and_run.split(" && ")[-1]
    assert run.startswith("wasihost run ")
    code = main(shlex.split(run)[1:])
    out, err = capsys.readouterr()
    assert (code, out) == (0, '{"greeting": "hello, ada"}\n'), err
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert 'printing `{"greeting": "hello, ada"}`' in readme


def test_the_quick_starts_virtual_environment_is_ignored_by_git() -> None:
    """The quick start makes .venv/ in the checkout: git must not offer it for a commit."""
    (install_and_run, _) = shell_commands(block_at("README.md", "python3 -m venv"))
    venv = install_and_run.split()[3]
    assert venv == ".venv"
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert f"{venv}/" in ignored or venv in ignored


def test_the_cli_example_of_application_functions_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/host-functions.md: the module that registers the application's functions, and the
    `run --functions` line that uses it, from a directory holding both."""
    import sys

    module = block_at("docs/host-functions.md", "# myapp_functions.py")
    (command,) = shell_commands(block_at("docs/host-functions.md", "wasihost run fixtures/appfns"))
    (tmp_path / "myapp_functions.py").write_text(module.text)
    shutil.copytree(FIXTURES / "appfns", tmp_path / "fixtures" / "appfns")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "myapp_functions", raising=False)
    code = main(shlex.split(command)[1:])
    out, err = capsys.readouterr()
    assert (code, out) == (0, '{"name": "lamp"}\n'), err


def test_lifecycle_state_commands_run_as_documented(
    fresh: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = run_shell_block(block_at("docs/lifecycle.md", "wasihost install fixtures/hello"), capsys)
    outputs = {command.split()[1] + " " + command.split()[2]: out for command, _, out, _ in results}
    assert outputs["run org.wasihost.fixtures.hello"] == '{"greeting": "hello, ada"}\n'
    assert "log  scope={}  since epoch 1" in outputs["grants list"]
    assert "revoked" in outputs["status org.wasihost.fixtures.hello"]


def _package(directory: Path, fixture: str, publisher: str) -> None:
    """A fixture as a publisher's package: the guest names its own id and version in the
    handshake, so only the publisher is added."""
    shutil.copytree(FIXTURES / fixture, directory, ignore=shutil.ignore_patterns("src", "Cargo.toml"))
    toml = directory / "extension.toml"
    toml.write_text(toml.read_text().replace('version = "0.1.0"', f'version = "0.1.0"\npublisher = "{publisher}"'))


def test_signed_package_workflow_runs_as_documented(
    fresh: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/packages.md's workflow, its revocation list and its two Python snippets, in one
    directory as a reader would run them in order."""
    _package(fresh / "my-extension", "hello", "acme.example")
    workflow = block_at("docs/packages.md", "wasihost keygen --publisher acme.example")
    commands = shell_commands(workflow)
    # The page says the trust file holds the publisher's .pub line ("append the publisher's
    # .pub line to the trust file"); a reader makes it after keygen.
    first = Block(workflow.page, workflow.line, "sh", "\n".join(commands[:3]))
    rest = Block(workflow.page, workflow.line, "sh", "\n".join(commands[3:]))
    run_shell_block(first, capsys)
    assert (fresh / "acme.key").stat().st_mode & 0o777 == 0o600
    shutil.copy(fresh / "acme.pub", fresh / "trusted-publishers")
    results = run_shell_block(rest, capsys)
    hello = "org.wasihost.fixtures.hello"
    assert results[0][2].startswith(f"verified: {hello} 0.1.0 published by acme.example")
    assert results[1][2] == '{"greeting": "hello, ada"}\n'
    assert "signed:  by acme.example (verified" in results[2][2]

    # The revocation list: bad.whpkg is another package of the publisher, x.whpkg a copy.
    _package(fresh / "bad", "echo", "acme.example")
    assert main(["pack", "bad", "-o", "bad.whpkg"]) == 0
    assert main(["sign", "bad.whpkg", "--key", "acme.key"]) == 0
    shutil.copy(fresh / "my-extension.whpkg", fresh / "x.whpkg")
    revoking = block_at("docs/packages.md", "wasihost keygen --publisher ops.example")
    results = run_shell_block(revoking, capsys)
    assert results[-1][2] == '{"greeting": "hello, ada"}\n'  # x.whpkg is not revoked
    listed = (fresh / "revocations").read_text()
    assert listed.startswith("wasihost-revocations/1\nversion 2\n")
    assert "extension org.example.hello 0.1.0\n" in listed
    argv = ["verify", "bad.whpkg", "--trust", "trusted-publishers", "--revocations", "revocations"]
    assert main(argv) == 1
    assert capsys.readouterr().err.startswith(
        "error: revocation: org.wasihost.fixtures.echo is refused: package digest"
    )

    run_python_block(block_at("docs/packages.md", "from wasihost.packaging.revocation import Revocations"),
                     prelude="from wasihost import Policy, TrustStore\ntrust = TrustStore.from_file('trusted-publishers')\n")
    namespace = run_python_block(
        block_at("docs/packages.md", "from wasihost import Host, Policy, TrustStore"),
        replace={"hello.whpkg": "my-extension.whpkg"},
        suffix="signer = ext.package.signer\n",
    )
    assert namespace["signer"] == "acme.example"


GRANT_BLOCKS = [
    ("docs/files.md", "wasihost grants grant org.example.reports files"),
    ("docs/http.md", "wasihost grants grant org.example.weather http"),
    ("docs/secrets.md", "wasihost grants grant org.example.signer secrets"),
    ("docs/storage.md", "wasihost grants grant org.example.notes storage"),
    ("docs/wasi.md", "wasihost grants grant EXT wasi.fs.read"),
]


@pytest.mark.parametrize(("page", "start"), GRANT_BLOCKS)
def test_documented_grant_scopes_are_accepted(
    fresh: Path, capsys: pytest.CaptureFixture[str], page: str, start: str
) -> None:
    """Each page's `grants grant ... --scope` example is a scope its broker accepts, on a
    fresh state directory (the id is not installed yet: the grant waits for it)."""
    block = block_at(page, start)
    text = block.text.replace(" EXT ", " org.example.tool ")
    for path in ("/srv/reports", "/srv/reference"):  # the files broker checks its mounts exist
        (fresh / path.strip("/")).mkdir(parents=True)
        text = text.replace(f'"{path}"', f'"{fresh / path.strip("/")}"')
    results = run_shell_block(Block(block.page, block.line, "sh", text), capsys)
    for command, _, out, err in results:
        assert out.startswith("granted "), command
        assert "is not installed" in err


def test_every_wasihost_command_line_of_the_docs_is_run_or_a_synopsis() -> None:
    """A concrete `wasihost` line (no placeholder) sits in a block one of the tests above runs."""
    run_here = {
        block_at("README.md", "python3 -m venv").key,
        block_at("docs/lifecycle.md", "wasihost install fixtures/hello").key,
        block_at("docs/packages.md", "wasihost keygen --publisher acme.example").key,
        block_at("docs/packages.md", "wasihost keygen --publisher ops.example").key,
        *(block_at(page, start).key for page, start in GRANT_BLOCKS),
        block_at("docs/host-functions.md", "wasihost run fixtures/appfns").key,
    }
    unrun = [
        f"{block.page}:{block.line}: {line}"
        for block, line in _wasihost_lines()
        if block.key not in run_here and block.key not in NOT_RUN and not _SYNOPSIS.search(line)
    ]
    assert not unrun, "concrete commands no test runs:\n" + "\n".join(unrun)


# -- Python blocks -----------------------------------------------------------------------------


def run_python_block(
    block: Block, *, prelude: str = "", replace: dict[str, str] | None = None, suffix: str = ""
) -> dict[str, object]:
    """Execute ``block`` as written but for ``replace`` (a placeholder path to a real one),
    after ``prelude`` (what a fragment assumes defined); returns its namespace."""
    source = block.text
    for old, new in (replace or {}).items():
        assert old in source, f"{block.page}:{block.line} no longer says {old!r}"
        source = source.replace(old, new)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    code = compile(prelude + source + suffix, f"{block.page}:{block.line}", "exec")
    exec(code, namespace)
    host = namespace.get("host")
    if host is not None and hasattr(host, "close"):
        host.close()
    return namespace


POLICY = "from wasihost import Policy\npolicy = Policy(allow={'log', 'files'})\n"


def _raw_echo_mib(tmp: Path) -> Path:
    """The package embedding.md's raw-bytes fragment describes: abi 1.1, 1 MiB each way, an
    `echo-bytes` command (the rawecho fixture, with the limits the fragment's comment sets)."""
    package = tmp / "rawecho"
    shutil.copytree(FIXTURES / "rawecho", package, ignore=shutil.ignore_patterns("src", "Cargo.toml"))
    toml = package / "extension.toml"
    toml.write_text(
        toml.read_text().replace(
            "[commands]", "[resources]\nmax_input_bytes = 1_048_576\nmax_output_bytes = 1_048_576\n\n[commands]"
        )
    )
    return package


def _python_cases(tmp: Path) -> dict[tuple[str, str], dict[str, object]]:
    """How each Python block runs: its setup (prelude), placeholder paths, and a suffix that
    reads a result the test checks."""
    (tmp / "in").mkdir()
    (tmp / "out").mkdir()
    secrets = tmp / "secrets"
    secrets.mkdir(mode=0o700)
    return {
        ("README.md", "from wasihost import Host, Policy"): {},
        ("README.md", 'ext = host.load("fixtures/hello", runtime="process-only")  # or the manifest\'s runtime = "wasm-process"'): {
            "prelude": "from wasihost import Host, Policy\nhost = Host(Policy(allow={'log'}))\n",
            "suffix": "assert ext.call('greet', {'name': 'ada'}) == {'greeting': 'hello, ada'}\n"
            "assert ext.runtime == 'process-only'\nhost.close()\n",
        },
        ("docs/native-plugins.md", 'ext = host.load("fixtures/hello-native")          # runtime "process-only", always'): {
            "prelude": "from wasihost import Host, Policy\nhost = Host(Policy(allow={'log'}))\n",
            "suffix": "assert ext.call('greet', {'name': 'ada'}) == {'greeting': 'hello, ada'}\n"
            "assert ext.runtime == 'process-only'\nhost.close()\n",
        },
        ("docs/embedding.md", "from wasihost import Host, Policy, CallError, AdmissionError"): {
            "replace": {"path/to/package": "fixtures/hello"},
        },
        ("docs/embedding.md", "# extension.toml: abi = \"1.1\"; [resources] max_input_bytes = max_output_bytes = 1_048_576;"): {
            "prelude": "from wasihost import Host, Policy\nhost = Host(Policy(allow={'log'}))\n",
            "replace": {"path/to/package": str(_raw_echo_mib(tmp))},
        },
        ("docs/embedding.md", "from wasihost import AsyncHost, Policy"): {"async": True},
        ("docs/budgets.md", "from wasihost import Host"): {},
        ("docs/grants.md", "from wasihost import Host, Policy"): {},
        ("docs/packages.md", "import shutil"): {
            "suffix": "assert verified.publisher == 'acme.example'\n"
            "assert installed.signer == 'acme.example'\nshutil.rmtree(work)\n",
        },
        ("docs/density.md", "from wasihost import Host"): {"prelude": POLICY},
        ("docs/events.md", "host.publish(\"orders.created\", {\"id\": 42}, key=\"order-42\")       # or"): {
            "prelude": "from wasihost import Host, Policy\nhost = Host(Policy(allow={'events', 'log'}))\n"
            "ext = host.load('fixtures/events')\n",
            "replace": {"org.example.ext": "org.wasihost.fixtures.events"},
        },
        ("docs/files.md", "from wasihost import Host"): {
            "prelude": POLICY,
            "replace": {"/srv/shared": str(tmp / "in"), "/var/lib/myapp/tmp": str(tmp / "out")},
        },
        ("docs/host-functions.md", "import asyncio"): {},
        ("docs/host-functions.md", "@host.function(\"myapp.add\", capability=\"myapp.math\", since=\"1.0\","): {
            "prelude": "from wasihost import CallContext, Host, Policy\n"
            "host = Host(Policy(allow={'myapp.math', 'myapp.write'}))\n",
        },
        ("docs/http.md", "host.grant(\"org.example.weather\", \"http\", {\"origins\": [\"https://api.example.com\"]})"): {
            "prelude": "from wasihost import Host, Policy\nhost = Host(Policy(allow={'http'}))\n",
        },
        ("docs/scheduling.md", "import os"): {"prelude": POLICY},
        ("docs/secrets.md", "from wasihost import Host, Policy"): {
            "replace": {"/etc/myapp/secrets": str(secrets)},
        },
        ("docs/storage.md", "host.grant(\"org.example.notes\", \"storage\", {\"tenant\": \"acme\", \"max_objects\": 500})"): {
            "prelude": "from wasihost import Host, Policy\nhost = Host(Policy(allow={'storage'}))\n",
        },
        ("docs/supervision.md", "from wasihost import Host"): {"prelude": POLICY},
        ("docs/wasi.md", "import sys"): {
            "replace": {
                "/srv/in": str(tmp / "in"),
                "/srv/out": str(tmp / "out"),
                "tool.wasm": "fixtures/wasi-std/wasi-std.wasm",
                "stdout=sys.stdout.buffer.write,": "stdout=None,",  # pytest captures stdout
            },
            "suffix": "host.close()\n",
        },
        # run by test_signed_package_workflow_runs_as_documented, in its directory
        ("docs/packages.md", "from wasihost.packaging.revocation import Revocations"): {"elsewhere": True},
        ("docs/packages.md", "from wasihost import Host, Policy, TrustStore"): {"elsewhere": True},
    }


PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "python" and b.key not in NOT_RUN]


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[f"{b.page}:{b.line}" for b in PYTHON_BLOCKS])
def test_python_blocks_run(block: Block, fresh: Path) -> None:
    cases = _python_cases(fresh.parent)
    assert block.key in cases, f"{block.page}:{block.line}: give this block a case (or a NOT_RUN reason)"
    case = cases[block.key]
    if case.get("elsewhere"):
        return
    if case.get("async"):
        import asyncio

        text = block.text.replace("path/to/package", "fixtures/hello")
        body = "".join(f"    {line}\n" for line in text.splitlines())
        source = (
            "import asyncio\nnames = [{'name': 'ada'}, {'name': 'grace'}]\n"
            f"async def main():\n{body}    return out, results\n"
        )
        namespace: dict[str, object] = {}
        exec(compile(source, f"{block.page}:{block.line}", "exec"), namespace)
        out, results = asyncio.run(namespace["main"]())  # type: ignore[operator]
        assert out == {"greeting": "hello, ada"}
        assert results == [{"greeting": "hello, ada"}, {"greeting": "hello, grace"}]
        return
    replace = dict(case.get("replace", {}))  # type: ignore[call-overload]
    namespace = run_python_block(
        block, prelude=str(case.get("prelude", "")), replace=replace, suffix=str(case.get("suffix", ""))
    )
    if block.key[0] == "README.md":
        assert namespace["ext"] is not None


def test_python_cases_name_blocks_that_exist(tmp_path: Path) -> None:
    keys = {b.key for b in ALL_BLOCKS}
    assert not set(_python_cases(tmp_path)) - keys


# -- names the docs cite -----------------------------------------------------------------------


def _doc_lines() -> Iterator[tuple[Path, int, str]]:
    for page in [*PAGES, ROOT / "docs" / "security.md"]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            yield page, number, line


def test_cited_tests_exist() -> None:
    """`test_x.py::test_y` and bare `test_y` names on the pages are tests of the suite."""
    sources = {p.name: p.read_text() for p in (ROOT / "tests").rglob("*.py")}
    defined = set(re.findall(r"def (test_\w+)", "\n".join(sources.values())))
    wrong = []
    for page, number, line in _doc_lines():
        for match in re.finditer(r"\b(test_\w+\.py)?(?:::)?(test_\w+)\b(?!\.py)", line):
            module, name = match.groups()
            if module is not None and module not in sources:
                wrong.append(f"{page.name}:{number}: no {module}")
            elif module is not None and f"def {name}(" not in sources[module]:
                wrong.append(f"{page.name}:{number}: {module} has no {name}")
            elif name not in defined:
                wrong.append(f"{page.name}:{number}: no test {name}")
    assert not wrong, "\n".join(wrong)


# Words in backticks on ARCHITECTURE.md that are not names of the code.
_NOT_CODE_NAMES = frozenset(
    {"backticks", "extension.toml", "pyproject.toml", "__main__", "TYPE_CHECKING", "wasmtime",
     "_bindings", "_ffi", "wasi_snapshot_preview1", "None", "bench",
     "wasmtime_func_call_unchecked"}
)


def test_architecture_names_only_what_exists() -> None:
    """ARCHITECTURE.md tells a reader to search for the names in backticks: each file it names
    exists, and each name is defined (a def, a class, an assignment or a module)."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    code = [*(ROOT / "wasihost").rglob("*.py"), *(ROOT / "tests" / "support").glob("*.py")]
    source = "\n".join(path.read_text() for path in code)
    modules = {path.stem for path in code}
    # Every name the code defines, in one pass (a search per name took 15 s): a def or a
    # class, an assignment at the start of a line, or an attribute of self assigned.
    defined = set(re.findall(r"\b(?:def|class) ([A-Za-z_]\w*)", source))
    defined.update(re.findall(r"^\s*([A-Za-z_]\w*)\s*[:=]", source, re.M))
    defined.update(re.findall(r"\bself\.([A-Za-z_]\w*)\s*[:=]", source))
    wrong = []
    for path in re.findall(r"`((?:[a-z_]+/)+[a-z_]+\.py)", text):
        if not any((base / path).exists() for base in (ROOT, ROOT / "wasihost")):
            wrong.append(path)
    for token in re.findall(r"`([^`\s]+)`", text):
        name = re.fullmatch(r"(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)(?:\(\))?", token)
        if name is None or token in _NOT_CODE_NAMES or name.group(1) in modules:
            continue
        if name.group(1) not in defined:
            wrong.append(token)
    assert not wrong, wrong


def test_cited_repository_paths_exist() -> None:
    wrong = []
    for page, number, line in _doc_lines():
        for match in re.finditer(r"`((?:wasihost|tests|benchmarks|abi|fixtures|guest-sdk|examples|docs)/[\w./-]*\w)", line):
            path = match.group(1)
            if not (ROOT / path).exists() and not path.startswith("wasihost/modules"):
                wrong.append(f"{page.name}:{number}: {path}")
        # A module named from its subpackage (`host/extension.py`), as the pages mostly do.
        for match in re.finditer(rf"`((?:{'|'.join(_SUBPACKAGES)})/[\w/]*\.py)`", line):
            if not (ROOT / "wasihost" / match.group(1)).exists():
                wrong.append(f"{page.name}:{number}: {match.group(1)}")
    assert not wrong, "\n".join(wrong)


_SUBPACKAGES = sorted(p.parent.name for p in (ROOT / "wasihost").glob("*/__init__.py"))


# -- the manifest reference --------------------------------------------------------------------


def _manifest_reference() -> tuple[dict[str, dict[str, object]], list[str]]:
    block = block_at("docs/manifest.md", "[extension]")
    return tomllib.loads(block.text.replace('sha256 = "..."', 'sha256 = "x"')), block.text.splitlines()


def test_the_manifest_reference_shows_every_table_and_key_the_parser_takes() -> None:
    reference, _ = _manifest_reference()
    keys = {
        "extension": manifest._EXTENSION_KEYS,
        "capabilities": manifest._CAPABILITY_KEYS,
        "resources": tuple(limits.RESOURCE_BOUNDS),
        "update": manifest._UPDATE_KEYS,
        "events": manifest._EVENTS_KEYS,
        "http": manifest._HTTP_KEYS,
        "jobs": manifest._JOBS_KEYS,
        "lifecycle": manifest._LIFECYCLE_KEYS,
        "scheduling": manifest._SCHEDULING_KEYS,
        "budget": manifest._BUDGET_KEYS,
    }
    assert list(reference) == list(manifest._TABLES)
    for table, expected in keys.items():
        assert sorted(reference[table]) == sorted(expected), table


def test_the_manifest_reference_gives_each_resource_its_default_and_range() -> None:
    """`name = DEFAULT   # MIN .. MAX` for every [resources] field, as limits.py has them."""
    reference, lines = _manifest_reference()
    # The [resources] table's lines alone: [jobs] has a max_memory_bytes of its own.
    start = lines.index(next(line for line in lines if line.startswith("[resources]")))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("["))
    lines = lines[start:end]
    for name, bound in limits.RESOURCE_BOUNDS.items():
        assert reference["resources"][name] == bound.default, name
        (line,) = [line for line in lines if line.startswith(f"{name} =")]
        low, high = re.search(r"#\s*([\d_]+)\s*\.\.\s*([\d_]+)", line).groups()  # type: ignore[union-attr]
        assert (int(low), int(high)) == (bound.minimum, bound.maximum), name
    assert reference["http"]["bytes_per_hour"] == manifest.DEFAULT_HTTP_BYTES_PER_HOUR
    assert reference["events"]["queue_depth"] == limits.DEFAULT_QUEUE_DEPTH
    assert reference["jobs"]["max_jobs"] == manifest.DEFAULT_MAX_JOBS


def test_the_documented_bad_manifest_message_is_the_cli_s(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """manifest.md: a bad field is `error: manifest: <key>: <message>` on the command line."""
    package = tmp_path / "p"
    shutil.copytree(FIXTURES / "hello", package, ignore=shutil.ignore_patterns("src", "Cargo.toml"))
    toml = package / "extension.toml"
    toml.write_text(toml.read_text().replace("timeout_ms = 1000", "timeout_ms = true"))
    assert main(["run", str(package), "greet"]) == 1
    assert capsys.readouterr().err == "error: manifest: resources.timeout_ms: expected an integer, got boolean\n"


def test_the_examples_readme_runs_its_example_from_the_root() -> None:
    """examples/README.md: `python3 examples/greeter_app/app.py` from the repository root
    (test_examples runs it; this checks the page names that file and command)."""
    text = (ROOT / "examples" / "README.md").read_text()
    assert "`python3 examples/greeter_app/app.py`" in text
    assert (ROOT / "examples" / "greeter_app" / "app.py").is_file()


def test_status_json_is_documented_key_by_key(fresh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """supervision.md lists what `status --json` prints: every key of the output is on it."""
    assert main(["install", "fixtures/hello"]) == 0
    capsys.readouterr()
    assert main(["status", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(doc) == ["extensions", "metrics"]
    page = (ROOT / "docs" / "supervision.md").read_text()
    section = page[page.index("`status --json` prints") :]
    missing = [key for key in doc["metrics"] if f"`{key}`" not in section]
    assert not missing, f"supervision.md does not list status --json metrics {missing}"


def test_the_cli_json_shapes_are_those_cli_md_gives(capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    assert main(["abi", "--json"]) == 0
    keys = sorted(json.loads(capsys.readouterr().out))
    assert '`{"versions", "features", "namespaces",\n"functions"}`' in text
    assert keys == sorted(["versions", "features", "namespaces", "functions"])
    argv = ["run", str(FIXTURES / "hello"), "greet", "--input", '{"name": "a"}', "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert '`{"output": ..., "fuel_used": N, "logs": [...]}`' in text
    assert list(doc) == ["output", "fuel_used", "logs"] and doc["output"] == {"greeting": "hello, a"}


_UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def _amount(text: str) -> int:
    """``512 KiB``, ``100,000``, ``0 (off)`` as an int."""
    number, _, unit = text.split("(", maxsplit=1)[0].strip().partition(" ")
    return int(number.replace(",", "")) * _UNITS.get(unit.strip(), 1)


def test_the_engine_settings_table_is_what_engine_settings_accepts() -> None:
    """engine.md's table: each setting's default is EngineSettings' and its range's ends are
    accepted while one past each is refused."""
    from wasihost.core.errors import ConfigError
    from wasihost.core.settings import EngineSettings

    text = (ROOT / "docs" / "engine.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \|", text[text.index("## Settings") :], re.M)
    assert len(rows) >= 11
    defaults = EngineSettings()
    for name, default, bounds in rows:
        if bounds.strip() == "bool":
            assert getattr(defaults, name) is (default.strip() == "True"), name
            continue
        assert getattr(defaults, name) == _amount(default), name
        low, high = (_amount(end) for end in bounds.split(".."))
        EngineSettings(**{name: low})
        EngineSettings(**{name: high})
        for wrong in (low - 1, high + 1):
            with pytest.raises(ConfigError):
                EngineSettings(**{name: wrong})


def _toml(value: object) -> str:
    """A TOML value of the simple kinds a manifest holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    assert isinstance(value, dict)
    return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"


def _named_commands(table: dict[str, object]) -> set[str]:
    """The command names a manifest fragment's tables refer to."""
    names: set[str] = set()
    for name, section in table.items():
        if not isinstance(section, dict) or name == "commands":
            continue
        for key, value in section.items():
            if key in ("command", "health", "migrate", "on_shutdown") and isinstance(value, str):
                names.add(value)
            if key == "commands" and isinstance(value, list):
                names.update(value)
    return names


FRAGMENTS = [b for b in ALL_BLOCKS if b.lang == "toml" and b.page != "docs/manifest.md"]


@pytest.mark.parametrize("block", FRAGMENTS, ids=[f"{b.page}:{b.line}" for b in FRAGMENTS])
def test_manifest_fragments_are_valid_in_a_manifest(block: Block) -> None:
    """Each page's manifest fragment, completed with the tables it does not show (the
    [extension] table, the commands it names, the capabilities its tables need), parses: a
    reader who copies it gets a manifest the host accepts."""
    fragment = tomllib.loads(block.text)
    commands = {name: {"description": "..."} for name in sorted(_named_commands(fragment))}
    commands.update(fragment.get("commands", {}) or {"greet": {"description": "..."}})
    capabilities = fragment.get("capabilities", {"required": []})
    required = set(capabilities.get("required", []))
    for table, capability in (("events", "events"), ("jobs", "jobs"), ("http", "http")):
        if table in fragment and capability not in required | set(capabilities.get("optional", [])):
            required.add(capability)
    capabilities["required"] = sorted(required)
    doc: dict[str, object] = {
        "extension": {
            "schema": "wasihost-manifest/1",
            "id": "org.example.hello",
            "version": "0.1.0",
            "abi": "1.1",
            "module": "hello.wasm",
        },
        **fragment,
        "capabilities": capabilities,
        "commands": commands,
    }
    text = "".join(
        f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in table.items()) + "\n"
        for name, table in doc.items()
        if isinstance(table, dict)
    )
    known = frozenset(
        {"log", "clock", "random", "events", "jobs", "http", "secrets", "storage", "files"}
        | {"myapp.read", "myapp.write"}
    )
    manifest.parse_manifest(text, known)


# -- Rust blocks -------------------------------------------------------------------------------

# A crate of the docs' Rust: its manifest (the SDK from this checkout, the fixtures' release
# profile) and, for the fragments, the guest they are compiled inside.
_RUST_CRATE = """[package]
name = "{name}"
version = "0.1.0"
edition = "2021"

[lib]
crate-type = ["cdylib"]

[dependencies]
wasihost-guest = {{ path = "{sdk}" }}

[profile.release]
opt-level = "z"
panic = "abort"
"""
_FRAGMENT_HOST = """#![allow(dead_code, unused_imports, unused_variables, unused_mut)]
wasihost_guest::guest! {{
    id: "org.example.docs",
    version: "0.1.0",
    abi: "1.1",
    features: [],
    commands: {{ "noop" => noop }}
}}

fn noop(_input: wasihost_guest::Value) -> Result<wasihost_guest::Value, wasihost_guest::Error> {{
    Ok(wasihost_guest::Value::Null)
}}
{fragments}
"""


SDK_README = ROOT / "guest-sdk" / "README.md"
# The SDK README's synopsis of the guest! macro has placeholders for a reader to fill in
# ("<extension id>"): it is not a program, so it is not compiled.
SDK_PLACEHOLDER = '"<extension id>"'


def test_rust_blocks_compile_as_guests(tmp_path: Path) -> None:
    """Every Rust block of the docs builds for wasm32 against this checkout's SDK: a whole
    guest (one with ``guest!``) as it is, a fragment inside a function of a guest, with the
    SDK's names in scope (issue 35 item 6: docs/http.md's example did not compile). The SDK's
    own README too, its blocks marked ``ignore`` included, but for the guest! synopsis: its
    doctests (tests/test_fixtures.py) build the others for the host target only."""
    from tests.support.common import rust_toolchain_missing

    missing = rust_toolchain_missing()
    if missing is not None:
        pytest.skip(missing)
    rust = [b for b in ALL_BLOCKS if b.lang == "rust"]
    assert rust, "no Rust block found: the parser changed"
    # The SDK's README too: its doctests build its blocks for the host only, and not those
    # marked `ignore` (the raw byte commands' guest among them).
    sdk = [b for b in blocks(SDK_README) if b.lang.split(",")[0] == "rust"]
    synopses = [b for b in sdk if SDK_PLACEHOLDER in b.text]
    assert len(synopses) == 1, "the SDK README's guest! synopsis is the one block of placeholders"
    rust += [b for b in sdk if b not in synopses]
    crates: dict[str, str] = {}
    fragments = []
    for n, block in enumerate(rust):
        where = f"{block.page}:{block.line}"
        if "guest!" in block.text:
            crates[f"guest{n}"] = f"// {where}\n{block.text}"
        else:
            # rustdoc's hidden lines ("# let ..."), which its doctests compile too, shown.
            lines = [re.sub(r"^(\s*)#(?: |$)", r"\1", line) for line in block.text.splitlines()]
            body = "".join(f"    {line}\n" for line in lines)
            # A doctest that ends on its own Ok(..) returns it; any other fragment, Ok(()).
            ends = [line for line in lines if line.strip()][-1].strip().startswith("Ok")
            fragments.append(
                f"// {where}\nfn fragment{n}() -> Result<(), wasihost_guest::Error> {{\n"
                f"    use wasihost_guest::*;\n{body}{'' if ends else '    Ok(())'}\n}}\n"
            )
    crates["fragments"] = _FRAGMENT_HOST.format(fragments="\n".join(fragments))
    shutil.copytree(ROOT / ".cargo", tmp_path / ".cargo")
    env = {**os.environ, "CARGO_TARGET_DIR": str(tmp_path / "target"), "RUST_BACKTRACE": "0"}
    failed = []
    for name, source in crates.items():
        crate = tmp_path / name
        (crate / "src").mkdir(parents=True)
        (crate / "Cargo.toml").write_text(_RUST_CRATE.format(name=name, sdk=ROOT / "guest-sdk"))
        (crate / "src" / "lib.rs").write_text(source)
        proc = subprocess.run(
            ["/usr/bin/cargo", "build", "--release", "--offline", "--quiet",
             "--target", "wasm32-unknown-unknown"],
            cwd=crate, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            failed.append(f"{name} ({source.splitlines()[0]}):\n{proc.stderr[-3000:]}")
    assert not failed, "\n\n".join(failed)


def sdk_capability_rows() -> list[str]:
    """guest-sdk/README.md's capability table, from the registry: each capability of ABI 1.x
    a guest can request, the minor that brought it, and the host functions it serves."""
    from wasihost.host.defaults import default_registry

    served: dict[str, list[tuple[str, str]]] = {}
    for entry in default_registry().majors[1].functions:
        served.setdefault(entry.capability, []).append((str(entry.since), entry.name))
    rows = []
    for capability, entries in sorted(served.items()):
        if capability == "core":
            continue  # always granted, never requested
        since = min(version for version, _ in entries)
        names = ", ".join(f"`{name}`" for _, name in entries)
        rows.append(f"| `{capability}` | {since} | {names} |")
    return rows


def test_the_sdk_readme_lists_the_registrys_capabilities() -> None:
    """Generated, so it cannot go stale (issue 35 item 6: it named log, clock and random
    only, two ABI minors after storage, http and the rest)."""
    readme = (ROOT / "guest-sdk" / "README.md").read_text()
    start = "<!-- capabilities: generated from the registry; do not edit by hand -->\n"
    end = "<!-- end of capabilities -->"
    table = readme[readme.index(start) + len(start) : readme.index(end)].splitlines()
    expected = ["| capability | since ABI | host functions |", "| --- | --- | --- |"]
    expected += sdk_capability_rows()
    assert table == expected, "guest-sdk/README.md's table should read:\n" + "\n".join(expected)

