"""The public namespace: what `import wasihost` offers, and that the error tree holds."""

from __future__ import annotations

import subprocess
import sys

import pytest

import wasihost
from wasihost.core import errors


def test_public_names_resolve() -> None:
    for name in wasihost.__all__:
        assert getattr(wasihost, name) is not None
    with pytest.raises(AttributeError):
        wasihost.NoSuchThing


def test_root_error_cannot_be_raised_directly() -> None:
    with pytest.raises(TypeError, match="abstract"):
        errors.WasihostError("x")
    for cls in (errors.ConfigError, errors.ManifestError, errors.CodecError):
        assert issubclass(cls, ValueError)


def test_pure_core_imports_without_the_engine() -> None:
    code = (
        "import sys; import wasihost.core.registry, wasihost.core.admission, wasihost.core.codec, "
        "wasihost.core.manifest, wasihost.host.policy, wasihost.core.grants, wasihost.core.lifecycle, "
        "wasihost.core.wasmbin, wasihost.core.tokens, wasihost.host.planning, wasihost.host.inspect, "
        "wasihost.packaging.package, wasihost.packaging.archive, wasihost.packaging.signing, "
        "wasihost.core.budgets, wasihost.supervisor.scheduling, wasihost.supervisor.supervision; "
        "assert 'wasmtime' not in sys.modules, 'the pure core imported wasmtime'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_only_the_adapter_imports_wasmtime() -> None:
    """The engine adapter is one subpackage, wasihost/engine/; nothing else imports wasmtime."""
    from pathlib import Path

    root = Path(wasihost.__file__).parent
    importers = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if any(
            line.strip().startswith(("import wasmtime", "from wasmtime"))
            for line in p.read_text().splitlines()
        )
    )
    assert importers and all(name.startswith("engine/") for name in importers), importers
