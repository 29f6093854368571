"""``extension.toml`` parsing: a full manifest, defaults, one test per error kind, fuzzing."""

from __future__ import annotations

import re
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.strategies import (
    KNOWN_CAPABILITIES,
    manifest_documents,
    near_valid_manifests,
    to_toml,
)
from wasihost.core import limits
from wasihost.core.errors import ConfigError, ManifestError
from wasihost.core.manifest import (
    MAX_COMMANDS,
    MAX_MANIFEST_CHARS,
    CommandSpec,
    Manifest,
    Resources,
    parse_manifest,
)

FULL = """\
[extension]
schema = "wasihost-manifest/1"
id = "org.example.hello"
version = "1.2.3-rc.1+build.7"
publisher = "Example Org"
abi = "1.0"
module = "bin/hello.wasm"
sha256 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
runtime = "wasm-process"

[capabilities]
required = ["log"]
optional = ["clock", "random"]

[resources]
fuel_per_call = 5_000_000
max_memory_bytes = 1_048_576
timeout_ms = 250
max_input_bytes = 4096
max_output_bytes = 2048
max_log_bytes = 0
max_table_elements = 100

[commands]
greet = { description = "Say hello" }
count-words = {}

[commands.shout_loud]
description = "Say it louder"
"""

MINIMAL = """\
[extension]
schema = "wasihost-manifest/1"
id = "org.example.hello"
version = "0.1.0"
abi = "1.0"
module = "hello.wasm"

[commands]
greet = {}
"""


def parse(text: str) -> Manifest:
    return parse_manifest(text, KNOWN_CAPABILITIES)


def document() -> dict[str, Any]:
    """FULL as a dict, for tests that change one field."""
    return {
        "extension": {
            "schema": "wasihost-manifest/1",
            "id": "org.example.hello",
            "version": "0.1.0",
            "abi": "1.0",
            "module": "hello.wasm",
        },
        "capabilities": {"required": ["log"], "optional": ["clock"]},
        "resources": {"timeout_ms": 100},
        "commands": {"greet": {"description": "hi"}},
    }


def error_key(doc: dict[str, Any] | str) -> str:
    text = doc if isinstance(doc, str) else to_toml(doc)
    with pytest.raises(ManifestError) as caught:
        parse(text)
    return caught.value.key


def with_field(table: str, key: str, value: object) -> dict[str, Any]:
    doc = document()
    doc.setdefault(table, {})[key] = value
    return doc


def without_field(table: str, key: str | None = None) -> dict[str, Any]:
    doc = document()
    if key is None:
        del doc[table]
    else:
        del doc[table][key]
    return doc


# -- valid manifests -----------------------------------------------------------------------------


def test_full_manifest() -> None:
    manifest = parse(FULL)
    assert manifest.schema == "wasihost-manifest/1"
    assert manifest.id == "org.example.hello"
    assert manifest.version == "1.2.3-rc.1+build.7"
    assert manifest.publisher == "Example Org"
    assert manifest.abi == "1.0"
    assert manifest.module == "bin/hello.wasm"
    assert manifest.sha256 == "0123456789abcdef" * 4
    assert manifest.runtime == "wasm-process"
    assert manifest.required == frozenset({"log"})
    assert manifest.optional == frozenset({"clock", "random"})
    assert manifest.resources == Resources(
        fuel_per_call=5_000_000,
        max_memory_bytes=1_048_576,
        timeout_ms=250,
        max_input_bytes=4096,
        max_output_bytes=2048,
        max_log_bytes=0,
        max_table_elements=100,
    )
    assert manifest.commands == (
        CommandSpec("greet", "Say hello"),
        CommandSpec("count-words", ""),
        CommandSpec("shout_loud", "Say it louder"),
    )
    assert manifest.command("count-words") == CommandSpec("count-words", "")
    assert manifest.command("missing") is None


def test_manifest_is_frozen_and_hashable() -> None:
    manifest = parse(FULL)
    assert hash(manifest) == hash(parse(FULL))
    assert {manifest: 1}[parse(FULL)] == 1
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        manifest.id = "org.example.other"  # type: ignore[misc]


def test_defaults() -> None:
    manifest = parse(MINIMAL)
    assert manifest.publisher is None
    assert manifest.sha256 is None
    assert manifest.runtime == "wasm"
    assert manifest.required == frozenset()
    assert manifest.optional == frozenset()
    assert manifest.resources == Resources.default()
    assert manifest.commands == (CommandSpec("greet", ""),)


def test_empty_capability_and_resource_tables_mean_defaults() -> None:
    manifest = parse(MINIMAL + "[capabilities]\n[resources]\n")
    assert manifest.required == manifest.optional == frozenset()
    assert manifest.resources == Resources.default()


def test_resource_defaults_come_from_limits() -> None:
    resources = Resources.default()
    assert resources.fuel_per_call == limits.DEFAULT_FUEL_PER_CALL == 10_000_000
    assert resources.max_memory_bytes == limits.DEFAULT_MAX_MEMORY_BYTES == 16 * 1024 * 1024
    assert resources.timeout_ms == limits.DEFAULT_TIMEOUT_MS == 1000
    assert resources.max_input_bytes == limits.DEFAULT_MAX_INPUT_BYTES == 128 * 1024
    assert resources.max_output_bytes == limits.DEFAULT_MAX_OUTPUT_BYTES == 64 * 1024
    assert resources.max_log_bytes == limits.DEFAULT_MAX_LOG_BYTES == 64 * 1024
    assert resources.max_table_elements == limits.DEFAULT_MAX_TABLE_ELEMENTS == 10_000
    assert set(limits.RESOURCE_BOUNDS) == {field.name for field in attrs.fields(Resources)}
    for name, bound in limits.RESOURCE_BOUNDS.items():
        assert getattr(resources, name) == bound.default
        assert bound.minimum <= bound.default <= bound.maximum


@pytest.mark.parametrize("name", sorted(limits.RESOURCE_BOUNDS))
def test_resources_refuse_out_of_range_construction(name: str) -> None:
    bound = limits.RESOURCE_BOUNDS[name]
    bad_values: tuple[object, ...] = (bound.minimum - 1, bound.maximum + 1, True, 1.0)
    for bad in bad_values:
        arguments: dict[str, Any] = {name: bad}
        with pytest.raises(ConfigError, match=name):
            Resources(**arguments)
    with pytest.raises(ConfigError, match=name):
        attrs.evolve(Resources.default(), **{name: bound.maximum + 1})


@pytest.mark.parametrize("name", sorted(limits.RESOURCE_BOUNDS))
def test_resource_range_is_inclusive(name: str) -> None:
    bound = limits.RESOURCE_BOUNDS[name]
    for value in (bound.minimum, bound.maximum):
        manifest = parse(to_toml(with_field("resources", name, value)))
        assert getattr(manifest.resources, name) == value


@pytest.mark.parametrize(
    "version",
    ["0.0.0", "1.2.3", "10.20.30", "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-0.3.7", "1.0.0-x-y-z.--",
     "1.0.0+20130313144700", "1.0.0-beta+exp.sha.5114f85", "1.0.0+0017", "1.0.0-0a"],
)  # fmt: skip
def test_valid_versions(version: str) -> None:
    assert parse(to_toml(with_field("extension", "version", version))).version == version


@pytest.mark.parametrize("module", ["hello.wasm", "bin/hello.wasm", "a.b/c-d/e_f.wasm", "..x.wasm"])
def test_valid_module_paths(module: str) -> None:
    assert parse(to_toml(with_field("extension", "module", module))).module == module


@pytest.mark.parametrize("name", ["a", "x-y_z9", "a" * 64, "run"])
def test_valid_command_names(name: str) -> None:
    doc = document()
    doc["commands"] = {name: {}}
    assert parse(to_toml(doc)).commands == (CommandSpec(name, ""),)


# -- errors, each with the key it must name ------------------------------------------------------


def test_toml_syntax_error() -> None:
    with pytest.raises(ManifestError) as caught:
        parse("[extension]\nid = \n")
    assert caught.value.key == ""
    assert re.search(r"line 2, column \d+", caught.value.message)


@pytest.mark.parametrize(
    "text",
    ["a = " + "9" * 5000, "a = " + "[" * 5000 + "]" * 5000, "a = 2021-02-30", "\x00"],
)
def test_toml_errors_tomllib_does_not_wrap(text: str) -> None:
    assert error_key(text) == ""


def test_manifest_too_long() -> None:
    with pytest.raises(ManifestError, match="exceeds") as caught:
        parse(MINIMAL + "#" * MAX_MANIFEST_CHARS)
    assert caught.value.key == ""


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        (with_field("extension", "homepage", "x"), "extension.homepage"),
        (with_field("capabilities", "wanted", []), "capabilities.wanted"),
        (with_field("resources", "max_threads", 1), "resources.max_threads"),
        (with_field("commands", "greet", {"description": "x", "args": []}), "commands.greet.args"),
        ({**document(), "hooks": {}}, "hooks"),
        ({**document(), "name": "x"}, "name"),
        (with_field("extension", "odd key", 1), 'extension."odd key"'),
    ],
)
def test_unknown_tables_and_keys(doc: dict[str, Any], key: str) -> None:
    assert error_key(doc) == key


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        (without_field("extension"), "extension"),
        (without_field("commands"), "commands"),
        (without_field("extension", "schema"), "extension.schema"),
        (without_field("extension", "id"), "extension.id"),
        (without_field("extension", "version"), "extension.version"),
        (without_field("extension", "abi"), "extension.abi"),
        (without_field("extension", "module"), "extension.module"),
    ],
)
def test_missing_required(doc: dict[str, Any], key: str) -> None:
    assert error_key(doc) == key


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({**document(), "extension": "x"}, "extension"),
        ({**document(), "commands": ["greet"]}, "commands"),
        ({**document(), "resources": 5}, "resources"),
        ({**document(), "capabilities": ["log"]}, "capabilities"),
        (with_field("extension", "id", 5), "extension.id"),
        (with_field("extension", "version", 1.0), "extension.version"),
        (with_field("extension", "abi", 1.0), "extension.abi"),
        (with_field("extension", "publisher", ["x"]), "extension.publisher"),
        (with_field("extension", "sha256", True), "extension.sha256"),
        (with_field("extension", "runtime", {}), "extension.runtime"),
        (with_field("resources", "timeout_ms", True), "resources.timeout_ms"),
        (with_field("resources", "timeout_ms", 1.0), "resources.timeout_ms"),
        (with_field("resources", "timeout_ms", "1000"), "resources.timeout_ms"),
        (with_field("capabilities", "required", "log"), "capabilities.required"),
        (with_field("capabilities", "optional", ["clock", 3]), "capabilities.optional[1]"),
        (with_field("commands", "greet", "hello"), "commands.greet"),
        (with_field("commands", "greet", {"description": 5}), "commands.greet.description"),
    ],
)
def test_wrong_types(doc: dict[str, Any], key: str) -> None:
    assert error_key(doc) == key


def test_datetime_has_a_toml_type_name() -> None:
    with pytest.raises(ManifestError, match="got datetime") as caught:
        parse(MINIMAL.replace('version = "0.1.0"', "version = 1979-05-27T07:32:00Z"))
    assert caught.value.key == "extension.version"


@pytest.mark.parametrize("name", sorted(limits.RESOURCE_BOUNDS))
def test_resources_out_of_range(name: str) -> None:
    bound = limits.RESOURCE_BOUNDS[name]
    for value in (bound.minimum - 1, bound.maximum + 1, -(2**63), 2**63 - 1):
        assert error_key(with_field("resources", name, value)) == f"resources.{name}"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("schema", "wasihost-manifest/2"),
        ("schema", "wasihost-manifest/1 "),
        ("id", "hello"),
        ("id", "Org.example"),
        ("id", "1org.example"),
        ("id", "org..example"),
        ("id", "org.example."),
        ("id", "org.exa_mple"),
        ("id", "org.example\n"),
        ("id", "o." + "a" * 127),
        ("version", "1.0"),
        ("version", "01.0.0"),
        ("version", "1.0.0-01"),
        ("version", "1.0.0-"),
        ("version", "1.0.0+"),
        ("version", "1.0.0-a..b"),
        ("version", "v1.0.0"),
        ("version", "1.0.0\n"),
        ("version", "1.0.0-" + "a" * 200),
        ("publisher", ""),
        ("publisher", "Tab\there"),
        ("publisher", "x" * 129),
        ("abi", "1"),
        ("abi", "01.0"),
        ("abi", "1.00"),
        ("abi", "1.0.0"),
        ("abi", "one.zero"),
        ("abi", "1" * 20 + ".0"),
        ("abi", "1.0\n"),
        ("abi", "10000.0"),  # valid shape, but over the 4 digits a module's marker may carry
        ("abi", "1.99999"),
        ("module", ""),
        ("module", "/abs/hello.wasm"),
        ("module", "../hello.wasm"),
        ("module", "bin/../hello.wasm"),
        ("module", "bin\\hello.wasm"),
        ("module", "bin//hello.wasm"),
        ("module", "./hello.wasm"),
        ("module", "bin/"),
        ("module", "hello.wat"),
        ("module", "hello\x00.wasm"),
        ("module", "a" * 251 + ".wasm"),
        ("sha256", "0123456789ABCDEF" * 4),
        ("sha256", "0" * 63),
        ("sha256", "0" * 65),
        ("runtime", "native"),
    ],
)
def test_invalid_extension_values(key: str, value: str) -> None:
    assert error_key(with_field("extension", key, value)) == f"extension.{key}"


def test_module_path_of_255_characters_is_allowed() -> None:
    module = "a" * 250 + ".wasm"
    assert parse(to_toml(with_field("extension", "module", module))).module == module


@pytest.mark.parametrize(
    ("capabilities", "key"),
    [
        ({"required": ["log", "network"]}, "capabilities.required[1]"),
        ({"optional": ["core"]}, "capabilities.optional[0]"),
        ({"required": ["log", "clock", "log"]}, "capabilities.required[2]"),
        ({"optional": ["clock", "clock"]}, "capabilities.optional[1]"),
        ({"required": ["log"], "optional": ["clock", "log"]}, "capabilities.optional[1]"),
    ],
)
def test_capability_errors(capabilities: dict[str, Any], key: str) -> None:
    doc = document()
    doc["capabilities"] = capabilities
    assert error_key(doc) == key


def test_unknown_capability_message() -> None:
    doc = document()
    doc["capabilities"] = {"required": ["network"]}
    with pytest.raises(ManifestError, match="unknown capability 'network'"):
        parse(to_toml(doc))


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("Greet", "commands.Greet"),
        ("1greet", "commands.1greet"),
        ("_greet", "commands._greet"),
        ("-greet", "commands.-greet"),
        ("wasihost.hello", 'commands."wasihost.hello"'),
        ("gr eet", 'commands."gr eet"'),
        ("a" * 65, "commands." + "a" * 65),
    ],
)
def test_invalid_command_names(name: str, key: str) -> None:
    doc = document()
    doc["commands"] = {name: {}}
    assert error_key(doc) == key


def test_no_commands() -> None:
    doc = document()
    doc["commands"] = {}
    assert error_key(doc) == "commands"


def test_too_many_commands() -> None:
    doc = document()
    doc["commands"] = {f"c{i}": {} for i in range(MAX_COMMANDS + 1)}
    assert error_key(doc) == "commands"


@pytest.mark.parametrize("description", ["x" * 1025, "\x1b[2J", "bell\x07", "c1\x9b"])
def test_invalid_descriptions(description: str) -> None:
    doc = with_field("commands", "greet", {"description": description})
    assert error_key(doc) == "commands.greet.description"


def test_description_may_use_tabs_and_newlines() -> None:
    doc = with_field("commands", "greet", {"description": "line one\n\tline two"})
    assert parse(to_toml(doc)).commands[0].description == "line one\n\tline two"


def test_long_values_are_quoted_briefly() -> None:
    with pytest.raises(ManifestError) as caught:
        parse(to_toml(with_field("extension", "runtime", "r" * 10_000)))
    assert len(caught.value.message) < 200


def test_wrong_argument_type_is_a_programming_error() -> None:
    with pytest.raises(TypeError):
        parse_manifest(b"[extension]", KNOWN_CAPABILITIES)  # type: ignore[arg-type]


# -- properties ----------------------------------------------------------------------------------


@given(manifest_documents())
def test_valid_documents_parse(doc: dict[str, Any]) -> None:
    manifest = parse(to_toml(doc))
    extension = doc["extension"]
    assert manifest.id == extension["id"]
    assert manifest.version == extension["version"]
    assert manifest.module == extension["module"]
    assert manifest.publisher == extension.get("publisher")
    assert manifest.runtime == extension.get("runtime", "wasm")
    assert manifest.required == frozenset(doc.get("capabilities", {}).get("required", []))
    assert manifest.optional == frozenset(doc.get("capabilities", {}).get("optional", []))
    for name, value in doc.get("resources", {}).items():
        assert getattr(manifest.resources, name) == value
    assert [spec.name for spec in manifest.commands] == list(doc["commands"])


def _parses_or_refuses(text: str) -> None:
    try:
        manifest = parse(text)
    except ManifestError as exc:
        assert isinstance(exc.key, str)
        assert len(exc.message) < 400
    else:
        assert isinstance(manifest, Manifest)


@settings(max_examples=300)
@given(near_valid_manifests())
def test_near_valid_documents_parse_or_raise_manifest_error(text: str) -> None:
    _parses_or_refuses(text)


@settings(max_examples=500)
@given(
    st.one_of(
        st.text(),
        st.text(st.characters(codec=None, categories=None)),
        st.lists(st.sampled_from(["[extension]", "[commands]", "a = ", "[", "]", '"', "=",
                                  "{", "}", "\n", "1", "x", ".", ","]),
                 max_size=30).map("".join),
    )
)  # fmt: skip
def test_any_text_parses_or_raises_manifest_error(text: str) -> None:
    _parses_or_refuses(text)
