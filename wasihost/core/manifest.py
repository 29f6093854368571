"""The ``extension.toml`` model and its validation.

Pure: :func:`parse_manifest` takes the manifest's text, never a path. A manifest is written by a
package author the host does not trust, so validation fails closed: an unknown table or key, a
wrong type or an out-of-range value is an error, never ignored. Every error is a
:class:`ManifestError` whose ``key`` is the dotted path of the offending field.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs

from wasihost.core import limits
from wasihost.core.errors import ConfigError, ManifestError
from wasihost.core.limits import DEFAULT_OVERFLOW, DEFAULT_QUEUE_DEPTH
from wasihost.core.registry import AbiVersion

if TYPE_CHECKING:
    from wasihost.core.manifest_tables import EventsSpec, JobsSpec
    from wasihost.core.netpolicy import Origin


def __getattr__(name: str) -> Any:
    # Defined where a manifest with the table needs them (issue 12 section 4), exported here.
    if name in ("EventsSpec", "JobsSpec"):
        from wasihost.core import manifest_tables

        return getattr(manifest_tables, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The one schema this parser understands; a new one gets a new parser branch, not a guess.
SCHEMA: Final = "wasihost-manifest/1"
# The runtimes a manifest may name: in-process wasm, wasm in a walled child process, or a
# native executable in a walled child process (its module is the executable; docs/native.md).
NATIVE_RUNTIME: Final = "native-process"
RUNTIMES: Final = frozenset({"wasm", "wasm-process", NATIVE_RUNTIME})
# In-process is the cheapest runtime and the one every host has.
DEFAULT_RUNTIME: Final = "wasm"

# Real manifests are a few hundred bytes; 64 Ki characters bounds what a hostile one makes us
# parse (the package loader bounds the file at 64 KiB before decoding it).
MAX_MANIFEST_CHARS: Final = 65536
# Reverse-DNS names longer than this are not names people type or read.
MAX_ID_CHARS: Final = 128
# SemVer sets no bound; this one keeps the pattern's work and our messages small.
MAX_VERSION_CHARS: Final = 128
# A display name, shown on one line.
MAX_PUBLISHER_CHARS: Final = 128
# The same bound as the module's ``wasihost_abi`` marker section.
MAX_ABI_CHARS: Final = 16
# The common file-name limit of POSIX file systems, applied to the whole relative path.
MAX_MODULE_CHARS: Final = 255
# Command names are typed on command lines and sent on every call.
MAX_COMMAND_NAME_CHARS: Final = 64
# A description is help text, a paragraph at most.
MAX_DESCRIPTION_CHARS: Final = 1024
# Far more commands than any extension needs; bounds what a hostile manifest makes us build.
MAX_COMMANDS: Final = 256
# An extension talks to a handful of services; 64 origins bounds what admission compares
# each request against.
MAX_HTTP_ORIGINS: Final = 64
# 16 MiB of http traffic (sent + received) per hour when the manifest names no figure: a few
# hundred API calls at the entry's 48 KiB response limit.
DEFAULT_HTTP_BYTES_PER_HOUR: Final = 16 * 1024 * 1024
# Zero forbids traffic outright (every request answers QUOTA_EXCEEDED).
MIN_HTTP_BYTES_PER_HOUR: Final = 0
# 1 GiB an hour: beyond that the extension is a data pipe, not a plugin.
MAX_HTTP_BYTES_PER_HOUR: Final = 1024 * 1024 * 1024
# Error messages quote at most this many characters of an author's value.
_QUOTE_CHARS: Final = 40
# A key path shows at most this many characters of one key: enough to find it, never a flood.
_KEY_CHARS: Final = 80

_UPDATE_KEYS: Final = ("health", "migrate", "reversible")
# The overflow policies of an event subscription's queue (docs/events.md defines each); the
# default one and the default depth are in limits (the parsed [events] table's defaults).
OVERFLOW_POLICIES: Final = ("coalesce", "drop", "pause")
MAX_QUEUE_DEPTH: Final = 1024
# Background jobs one extension may hold at once: each is a timer (or an event hook) the host
# keeps for it, and a run on the jobs broker's few threads; 32 covers any plugin's upkeep.
MAX_JOBS_PER_EXTENSION: Final = 32
DEFAULT_MAX_JOBS: Final = 8

_TABLES: Final = (
    "extension",
    "capabilities",
    "resources",
    "commands",
    "update",
    "events",
    "http",
    "jobs",
    "lifecycle",
    "scheduling",
    "budget",
)
_EXTENSION_KEYS: Final = (
    "schema",
    "id",
    "version",
    "publisher",
    "abi",
    "module",
    "sha256",
    "runtime",
)
_CAPABILITY_KEYS: Final = ("required", "optional")
_COMMAND_KEYS: Final = ("description", "input", "output")
# How a command's input and output cross (abi/README.md, "ABI 1.1: raw byte commands"): one
# CBOR value, or the caller's bytes as they are, with no encoding at all.
PAYLOAD_CBOR: Final = "cbor"
PAYLOAD_BYTES: Final = "bytes"
PAYLOAD_CONVENTIONS: Final = (PAYLOAD_CBOR, PAYLOAD_BYTES)
# Raw byte commands are an ABI 1.1 addition: a 1.0 guest's SDK decodes every input as CBOR.
BYTES_SINCE: Final = AbiVersion(1, 1)
_EVENTS_KEYS: Final = ("classes", "command", "on_overflow", "queue_depth")
_HTTP_KEYS: Final = ("allowed_origins", "bytes_per_hour")
_JOBS_KEYS: Final = (
    "commands",
    "max_jobs",
    "max_runtime_ms",
    "fuel",
    "max_memory_bytes",
    "max_network_bytes",
)
_LIFECYCLE_KEYS: Final = ("on_shutdown",)
# The ``[scheduling]`` table (docs/scheduling.md): the priority class the extension claims for
# its calls; the host's scheduler caps it. Silent manifests claim the highest class, as every
# call had before scheduling existed.
_SCHEDULING_KEYS: Final = ("priority",)
# The priority classes, highest first: the names of wasihost.supervisor.scheduling.Priority's
# members, in its order (the scheduler exports this too).
PRIORITY_NAMES: Final[tuple[str, ...]] = ("interactive", "background", "maintenance")
DEFAULT_PRIORITY: Final = "interactive"
# The ``[budget]`` table (docs/budgets.md): what the extension asks ``throttle`` to do to its
# calls. A silent manifest follows the host's policy; "refuse" asks for its calls to be
# refused at once even where the host would let them wait (the stricter of the two applies).
_BUDGET_KEYS: Final = ("throttle",)
THROTTLE_MODES: Final = ("refuse", "delay")

_ID = re.compile(r"[a-z][a-z0-9-]*(?:\.[a-z0-9-]+)+")
# Any extension id (a manifest's, or a bare module's file stem: check_extension_id) becomes a
# grant-table row and, with a state directory, a path component (data/<id>, checkpoints/<id>):
# at most one file name's bytes.
MAX_EXTENSION_ID_BYTES = 255
_NOT_IN_AN_ID = re.compile(r"[\x00-\x1f\x7f-\x9f/]")
# SemVer 2.0.0, built from the grammar of semver.org: numeric identifiers without leading
# zeros, alphanumeric pre-release identifiers, build identifiers of any [0-9A-Za-z-]+.
_NUMBER = r"(?:0|[1-9][0-9]*)"
_PRE_ID = rf"(?:{_NUMBER}|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_BUILD_ID = r"[0-9A-Za-z-]+"
_SEMVER = re.compile(
    rf"{_NUMBER}\.{_NUMBER}\.{_NUMBER}"
    rf"(?:-{_PRE_ID}(?:\.{_PRE_ID})*)?"
    rf"(?:\+{_BUILD_ID}(?:\.{_BUILD_ID})*)?"
)
_SHA256 = re.compile(r"[0-9a-f]{64}")


def is_extension_id(text: str) -> bool:
    """Whether ``text`` may be a manifest's ``extension.id``."""
    return len(text) <= MAX_ID_CHARS and _ID.fullmatch(text) is not None


def is_version(text: str) -> bool:
    """Whether ``text`` may be a manifest's ``extension.version`` (SemVer 2.0.0)."""
    return len(text) <= MAX_VERSION_CHARS and _SEMVER.fullmatch(text) is not None


def check_extension_id(extension: object) -> str:
    """``extension`` if it can name an extension (a manifest's reverse-DNS id, or a bare
    module's file stem): a non-empty string of at most MAX_EXTENSION_ID_BYTES UTF-8 bytes, with
    no control character or ``/``, not ``.`` or ``..``; else a ``ConfigError``. Grants, revocations
    and reinstatements of an id nobody admitted yet are allowed (an operator grants before the
    first start), but not of something no extension could be called."""
    if not isinstance(extension, str):
        raise ConfigError(f"an extension id is a string, not {type(extension).__name__}")
    try:
        size = len(extension.encode("utf-8"))
    except UnicodeEncodeError:
        # A lone surrogate (a non-UTF-8 byte of a command line) cannot be stored in SQLite
        # nor named in a path the same way twice: it was a raw UnicodeEncodeError mid-grant.
        raise ConfigError(
            f"{extension!r} is not an extension id: it is not valid UTF-8"
        ) from None
    if (
        not 0 < size <= MAX_EXTENSION_ID_BYTES
        or extension in (".", "..")
        or _NOT_IN_AN_ID.search(extension)
    ):
        shown = extension if len(extension) <= 64 else extension[:64] + "..."
        raise ConfigError(
            f"{shown!r} is not an extension id (1 to {MAX_EXTENSION_ID_BYTES} bytes, no control "
            "character or '/')"
        )
    return extension


VersionOrder = tuple[tuple[int, int, int], int, tuple[tuple[int, int | str], ...]]


def version_order(version: str) -> VersionOrder:
    """A sort key giving SemVer 2.0.0 precedence to a version :func:`parse` accepted:
    numbers compare numerically, a pre-release sorts before its release, numeric
    pre-release identifiers before alphanumeric ones, and build metadata is ignored."""
    core, _, pre = version.split("+", 1)[0].partition("-")
    major, minor, patch = (int(part) for part in core.split("."))
    ids = tuple((0, int(i)) if i.isdigit() else (1, i) for i in pre.split(".")) if pre else ()
    return (major, minor, patch), 0 if pre else 1, ids


_COMMAND_NAME = re.compile(r"[a-z][a-z0-9_-]*")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
# Control characters (C0, DEL, C1) would let a description rewrite the terminal it is shown on;
# tab and newline are ordinary help-text layout.
_DESCRIPTION_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# In a path, NUL cuts the name short in C APIs and the other controls garble logs and terminals.
_MODULE_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _in_range(name: str) -> Callable[[object, attrs.Attribute[int], int], None]:
    bound = limits.RESOURCE_BOUNDS[name]

    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if type(value) is not int or not bound.minimum <= value <= bound.maximum:
            raise ConfigError(
                f"{attribute.name} must be an int in {bound.minimum}..{bound.maximum}, "
                f"got {value!r}"
            )

    return check


@attrs.frozen
class Resources:
    """What one extension may consume; every field has a default (see
    :mod:`wasihost.core.limits`)."""

    fuel_per_call: int = attrs.field(
        default=limits.DEFAULT_FUEL_PER_CALL, validator=_in_range("fuel_per_call")
    )
    max_memory_bytes: int = attrs.field(
        default=limits.DEFAULT_MAX_MEMORY_BYTES, validator=_in_range("max_memory_bytes")
    )
    timeout_ms: int = attrs.field(
        default=limits.DEFAULT_TIMEOUT_MS, validator=_in_range("timeout_ms")
    )
    max_input_bytes: int = attrs.field(
        default=limits.DEFAULT_MAX_INPUT_BYTES, validator=_in_range("max_input_bytes")
    )
    max_output_bytes: int = attrs.field(
        default=limits.DEFAULT_MAX_OUTPUT_BYTES, validator=_in_range("max_output_bytes")
    )
    max_log_bytes: int = attrs.field(
        default=limits.DEFAULT_MAX_LOG_BYTES, validator=_in_range("max_log_bytes")
    )
    max_table_elements: int = attrs.field(
        default=limits.DEFAULT_MAX_TABLE_ELEMENTS, validator=_in_range("max_table_elements")
    )
    storage_max_bytes: int = attrs.field(
        default=limits.DEFAULT_STORAGE_MAX_BYTES, validator=_in_range("storage_max_bytes")
    )
    storage_max_objects: int = attrs.field(
        default=limits.DEFAULT_STORAGE_MAX_OBJECTS, validator=_in_range("storage_max_objects")
    )
    # Calls that may run at once, each on its own instance (see docs/embedding.md).
    max_concurrency: int = attrs.field(
        default=limits.DEFAULT_MAX_CONCURRENCY, validator=_in_range("max_concurrency")
    )
    # budgets: fuel of all its calls within a sliding minute (see docs/budgets.md).
    cpu_fuel_per_minute: int = attrs.field(
        default=limits.DEFAULT_CPU_FUEL_PER_MINUTE, validator=_in_range("cpu_fuel_per_minute")
    )

    @classmethod
    def default(cls) -> Resources:
        """The resources of an extension whose manifest has no ``[resources]`` table."""
        return cls()


@attrs.frozen
class HttpSpec:
    """The ``[http]`` table: the origins the extension may ask (exact scheme, host and port)
    and its traffic budget. A manifest without the table allows no origin."""

    allowed_origins: tuple[Origin, ...] = ()
    bytes_per_hour: int = DEFAULT_HTTP_BYTES_PER_HOUR


@attrs.frozen
class CommandSpec:
    """One command the extension declares; ``description`` is empty when the manifest has none.

    ``input`` and ``output`` say how the payload crosses: ``"cbor"`` (one CBOR value, the
    default) or ``"bytes"`` (the bytes themselves, ABI 1.1)."""

    name: str
    description: str = ""
    input: str = PAYLOAD_CBOR
    output: str = PAYLOAD_CBOR


@attrs.frozen
class UpdateSpec:
    """How an update to this version is checked and its state carried over (``[update]``).

    ``health``: a command the host calls after the new version's handshake; the update
    activates only if it succeeds. ``migrate``: a command called with ``{"from", "to",
    "direction": "up"}`` to move the extension's state from the old version, after a checkpoint
    of that state; with ``reversible`` a rollback calls it with ``"direction": "down"`` instead
    of restoring the checkpoint."""

    health: str | None = None
    migrate: str | None = None
    reversible: bool = False


@attrs.frozen
class Manifest:
    """A validated ``extension.toml``."""

    schema: str
    id: str
    version: str
    publisher: str | None
    abi: str
    module: str
    sha256: str | None
    runtime: str
    required: frozenset[str]
    optional: frozenset[str]
    resources: Resources
    commands: tuple[CommandSpec, ...]
    http: HttpSpec = HttpSpec()
    update: UpdateSpec = UpdateSpec()
    events: EventsSpec | None = None
    jobs: JobsSpec | None = None
    # The ``[lifecycle] on_shutdown`` hook: a command the host calls once when it shuts down,
    # under what remains of the shutdown deadline.
    on_shutdown: str | None = None
    # The ``[scheduling] priority`` claimed: interactive, background or maintenance.
    priority: str = DEFAULT_PRIORITY
    # The ``[budget] throttle`` mode asked for ("refuse" or "delay"), None when silent.
    throttle: str | None = None

    def command(self, name: str) -> CommandSpec | None:
        """The declared command called ``name``, or None."""
        for spec in self.commands:
            if spec.name == name:
                return spec
        return None


@attrs.frozen
class _Extension:
    """The validated ``[extension]`` table, on its way into a :class:`Manifest`."""

    schema: str
    id: str
    version: str
    publisher: str | None
    abi: str
    module: str
    sha256: str | None
    runtime: str


def _key_path(parent: str, key: str) -> str:
    # TOML's own spelling, so the path can be searched for in the file.
    if len(key) <= _KEY_CHARS and _BARE_KEY.fullmatch(key):
        part = key
    else:
        escaped = "".join(_escape(ch) for ch in key[:_KEY_CHARS])
        part = f'"{escaped}"' if len(key) <= _KEY_CHARS else f'"{escaped}..."'
    return f"{parent}.{part}" if parent else part


def _escape(ch: str) -> str:
    if ch in '"\\':
        return "\\" + ch
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"\\u{ord(ch):04x}"
    return ch


def _show(value: object) -> str:
    """A short rendering of an author's value for a message."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "a huge integer"
    text = repr(value)
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 3] + "..."


def _type_name(value: object) -> str:
    # TOML's names for its types, since that is the language the author wrote.
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "table"
    import datetime  # loaded already: only tomllib, which imports it, makes such values

    if isinstance(value, datetime.datetime):
        return "datetime"
    if isinstance(value, datetime.date):
        return "date"
    if isinstance(value, datetime.time):
        return "time"
    return type(value).__name__


def _check_keys(table: Mapping[str, object], parent: str, allowed: tuple[str, ...]) -> None:
    for key, value in table.items():
        if key not in allowed:
            what = "table" if isinstance(value, dict) else "key"
            raise ManifestError(_key_path(parent, key), f"unknown {what}")


def _optional_table(parent: Mapping[str, object], key: str) -> dict[str, object] | None:
    value = parent.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ManifestError(key, f"expected a table, got {_type_name(value)}")
    return value


def _required_table(parent: Mapping[str, object], key: str) -> dict[str, object]:
    value = _optional_table(parent, key)
    if value is None:
        raise ManifestError(key, "missing required table")
    return value


def _optional_string(table: Mapping[str, object], key: str, parent: str) -> str | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ManifestError(_key_path(parent, key), f"expected a string, got {_type_name(value)}")
    return value


def _required_string(table: Mapping[str, object], key: str, parent: str) -> str:
    value = _optional_string(table, key, parent)
    if value is None:
        raise ManifestError(_key_path(parent, key), "missing required key")
    return value


def _check_length(value: str, maximum: int, path: str) -> None:
    if len(value) > maximum:
        raise ManifestError(path, f"{len(value)} characters, at most {maximum} allowed")


def _parse_extension(table: Mapping[str, object]) -> _Extension:
    _check_keys(table, "extension", _EXTENSION_KEYS)

    schema = _required_string(table, "schema", "extension")
    if schema != SCHEMA:
        raise ManifestError(
            "extension.schema", f"unsupported schema {_show(schema)}, expected {SCHEMA!r}"
        )

    ext_id = _required_string(table, "id", "extension")
    _check_length(ext_id, MAX_ID_CHARS, "extension.id")
    if not _ID.fullmatch(ext_id):
        raise ManifestError(
            "extension.id",
            f"{_show(ext_id)} is not a reverse-DNS name (lowercase labels of a-z, 0-9 and '-', "
            "the first starting with a letter, at least two labels)",
        )

    version = _required_string(table, "version", "extension")
    _check_length(version, MAX_VERSION_CHARS, "extension.version")
    if not _SEMVER.fullmatch(version):
        raise ManifestError("extension.version", f"{_show(version)} is not a SemVer 2.0.0 version")

    publisher = _optional_string(table, "publisher", "extension")
    if publisher is not None:
        _check_length(publisher, MAX_PUBLISHER_CHARS, "extension.publisher")
        if not publisher or not publisher.isprintable():
            raise ManifestError(
                "extension.publisher", "must be 1 or more printable characters on one line"
            )

    abi = _required_string(table, "abi", "extension")
    _check_length(abi, MAX_ABI_CHARS, "extension.abi")
    # The same parser as the module's marker, so every manifest that validates also loads.
    try:
        AbiVersion.parse(abi)
    except ValueError:
        raise ManifestError(
            "extension.abi",
            f"{_show(abi)} is not MAJOR.MINOR (decimal, no leading zeros, at most 4 digits each)",
        ) from None

    runtime = _optional_string(table, "runtime", "extension")
    if runtime is None:
        runtime = DEFAULT_RUNTIME
    elif runtime not in RUNTIMES:
        raise ManifestError(
            "extension.runtime",
            f"unknown runtime {_show(runtime)}, expected one of {', '.join(sorted(RUNTIMES))}",
        )

    module = _required_string(table, "module", "extension")
    problem = _module_problem(module, native=runtime == NATIVE_RUNTIME)
    if problem is not None:
        raise ManifestError("extension.module", problem)

    sha256 = _optional_string(table, "sha256", "extension")
    if sha256 is not None and not _SHA256.fullmatch(sha256):
        raise ManifestError("extension.sha256", "must be 64 lowercase hexadecimal characters")

    return _Extension(schema, ext_id, version, publisher, abi, module, sha256, runtime)


def _module_problem(module: str, native: bool = False) -> str | None:
    # The loader joins this path to the package directory: anything that could climb out of it
    # or mean different files on different systems is refused here, before any file is opened.
    if not module:
        return "must not be empty"
    if len(module) > MAX_MODULE_CHARS:
        return f"{len(module)} characters, at most {MAX_MODULE_CHARS} allowed"
    if _MODULE_CONTROL.search(module):
        return "must not contain control characters"
    if "\\" in module:
        return "must use '/' as separator, not '\\'"
    if module.startswith("/"):
        return "must be a relative path inside the package"
    segments = module.split("/")
    if any(segment == ".." for segment in segments):
        return "must not contain '..'"
    if any(segment in ("", ".") for segment in segments):
        return "must not contain empty or '.' path segments"
    if native:
        if module.endswith(".wasm"):
            return (
                "names a .wasm file, but runtime 'native-process' runs an executable: name the "
                "plugin's executable, or use runtime 'wasm-process' for a module"
            )
        return None
    if not module.endswith(".wasm"):
        return (
            "must name a .wasm file (a native plugin's executable needs runtime = "
            '"native-process")'
        )
    return None


def _parse_capabilities(
    table: Mapping[str, object] | None, known: frozenset[str]
) -> tuple[frozenset[str], frozenset[str]]:
    if table is None:
        return frozenset(), frozenset()
    _check_keys(table, "capabilities", _CAPABILITY_KEYS)
    required = _capability_list(table, "required", known)
    optional = _capability_list(table, "optional", known)
    for index, name in enumerate(optional):
        if name in required:
            raise ManifestError(
                f"capabilities.optional[{index}]", f"capability {_show(name)} is also required"
            )
    return frozenset(required), frozenset(optional)


def _capability_list(table: Mapping[str, object], key: str, known: frozenset[str]) -> list[str]:
    value = table.get(key)
    path = f"capabilities.{key}"
    if value is None:
        return []
    if not isinstance(value, list):
        raise ManifestError(path, f"expected an array of strings, got {_type_name(value)}")
    seen: list[str] = []
    for index, name in enumerate(value):
        item_path = f"{path}[{index}]"
        if not isinstance(name, str):
            raise ManifestError(item_path, f"expected a string, got {_type_name(name)}")
        if name not in known:
            raise ManifestError(item_path, f"unknown capability {_show(name)}")
        if name in seen:
            raise ManifestError(item_path, f"duplicate capability {_show(name)}")
        seen.append(name)
    return seen


def _parse_resources(table: Mapping[str, object] | None) -> Resources:
    if table is None:
        return Resources.default()
    _check_keys(table, "resources", tuple(limits.RESOURCE_BOUNDS))
    values: dict[str, int] = {}
    for name, bound in limits.RESOURCE_BOUNDS.items():
        value = table.get(name)
        if value is None:
            continue
        path = f"resources.{name}"
        # bool is an int in Python, but ``timeout_ms = true`` is a mistake, not 1 ms.
        if not isinstance(value, int) or isinstance(value, bool):
            raise ManifestError(path, f"expected an integer, got {_type_name(value)}")
        if not bound.minimum <= value <= bound.maximum:
            raise ManifestError(path, f"{_show(value)} is outside {bound.minimum}..{bound.maximum}")
        values[name] = value
    return Resources(**values)


def _parse_commands(table: Mapping[str, object], abi: str) -> tuple[CommandSpec, ...]:
    if not table:
        raise ManifestError("commands", "at least one command is required")
    if len(table) > MAX_COMMANDS:
        raise ManifestError("commands", f"{len(table)} commands, at most {MAX_COMMANDS} allowed")
    specs: list[CommandSpec] = []
    for name, value in table.items():
        path = _key_path("commands", name)
        if len(name) > MAX_COMMAND_NAME_CHARS:
            raise ManifestError(
                path, f"command name of {len(name)} characters, at most {MAX_COMMAND_NAME_CHARS}"
            )
        if not _COMMAND_NAME.fullmatch(name):
            raise ManifestError(
                path,
                "command names start with a lowercase letter and use only a-z, 0-9, '_' and '-'",
            )
        if not isinstance(value, dict):
            raise ManifestError(path, f"expected a table, got {_type_name(value)}")
        _check_keys(value, path, _COMMAND_KEYS)
        description = _optional_string(value, "description", path)
        if description is None:
            description = ""
        else:
            description_path = _key_path(path, "description")
            _check_length(description, MAX_DESCRIPTION_CHARS, description_path)
            if _DESCRIPTION_CONTROL.search(description):
                raise ManifestError(
                    description_path, "must not contain control characters (tab and newline aside)"
                )
        conventions = [_payload_convention(value, key, path, abi) for key in ("input", "output")]
        specs.append(CommandSpec(name, description, *conventions))
    return tuple(specs)


def _payload_convention(command: Mapping[str, object], key: str, parent: str, abi: str) -> str:
    value = _optional_string(command, key, parent)
    if value is None:
        return PAYLOAD_CBOR
    path = _key_path(parent, key)
    if value not in PAYLOAD_CONVENTIONS:
        expected = ", ".join(PAYLOAD_CONVENTIONS)
        raise ManifestError(path, f"unknown payload {_show(value)}, expected one of {expected}")
    if value == PAYLOAD_BYTES and AbiVersion.parse(abi) < BYTES_SINCE:
        raise ManifestError(
            path, f"raw byte commands need extension.abi >= {BYTES_SINCE}, this one says {abi}"
        )
    return value


def _parse_http(table: Mapping[str, object] | None) -> HttpSpec:
    if table is None:
        return HttpSpec()
    _check_keys(table, "http", _HTTP_KEYS)
    # Here: the origin parser (3 attrs classes, 4 patterns) is for a manifest with [http].
    from wasihost.core.netpolicy import NetPolicyError, parse_origin

    origins: list[Origin] = []
    value = table.get("allowed_origins")
    if value is not None:
        path = "http.allowed_origins"
        if not isinstance(value, list):
            raise ManifestError(path, f"expected an array of strings, got {_type_name(value)}")
        if len(value) > MAX_HTTP_ORIGINS:
            raise ManifestError(path, f"{len(value)} origins, at most {MAX_HTTP_ORIGINS} allowed")
        for index, text in enumerate(value):
            item_path = f"{path}[{index}]"
            if not isinstance(text, str):
                raise ManifestError(item_path, f"expected a string, got {_type_name(text)}")
            try:
                origin = parse_origin(text)
            except NetPolicyError as exc:
                raise ManifestError(item_path, f"{_show(text)}: {exc}") from None
            if origin in origins:
                raise ManifestError(item_path, f"duplicate origin {_show(text)}")
            origins.append(origin)
    budget = table.get("bytes_per_hour", DEFAULT_HTTP_BYTES_PER_HOUR)
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise ManifestError("http.bytes_per_hour", f"expected an integer, got {_type_name(budget)}")
    if not MIN_HTTP_BYTES_PER_HOUR <= budget <= MAX_HTTP_BYTES_PER_HOUR:
        raise ManifestError(
            "http.bytes_per_hour",
            f"{_show(budget)} is outside {MIN_HTTP_BYTES_PER_HOUR}..{MAX_HTTP_BYTES_PER_HOUR}",
        )
    return HttpSpec(tuple(origins), budget)


def _parse_update(
    table: Mapping[str, object] | None, commands: tuple[CommandSpec, ...]
) -> UpdateSpec:
    if table is None:
        return UpdateSpec()
    _check_keys(table, "update", _UPDATE_KEYS)
    names = {c.name for c in commands}
    found: dict[str, str | None] = {}
    for key in ("health", "migrate"):
        value = _optional_string(table, key, "update")
        if value is not None and value not in names:
            raise ManifestError(
                _key_path("update", key), f"names command {_show(value)}, which [commands] lacks"
            )
        found[key] = value
    reversible = table.get("reversible", False)
    if not isinstance(reversible, bool):
        raise ManifestError(
            "update.reversible", f"expected a boolean, got {_type_name(reversible)}"
        )
    if reversible and found["migrate"] is None:
        raise ManifestError("update.reversible", "only a migration can be reversible: set migrate")
    return UpdateSpec(found["health"], found["migrate"], reversible)


def _parse_events(
    table: Mapping[str, object] | None,
    commands: tuple[CommandSpec, ...],
    requested: frozenset[str],
) -> EventsSpec | None:
    if table is None:
        return None
    from wasihost.core import event_classes  # here: its patterns are for a manifest with [events]
    from wasihost.core.manifest_tables import EventsSpec

    _check_keys(table, "events", _EVENTS_KEYS)
    if "events" not in requested:
        raise ManifestError(
            "events", "the events capability must be listed in capabilities.required or optional"
        )
    value = table.get("classes")
    if value is None:
        raise ManifestError("events.classes", "missing required key")
    if not isinstance(value, list):
        raise ManifestError(
            "events.classes", f"expected an array of strings, got {_type_name(value)}"
        )
    if not value:
        raise ManifestError("events.classes", "at least one event class is required")
    if len(value) > event_classes.MAX_SELECTORS:
        raise ManifestError(
            "events.classes",
            f"{len(value)} classes, at most {event_classes.MAX_SELECTORS} allowed",
        )
    classes: list[str] = []
    for index, item in enumerate(value):
        path = f"events.classes[{index}]"
        if not isinstance(item, str):
            raise ManifestError(path, f"expected a string, got {_type_name(item)}")
        if not event_classes.is_selector(item):
            raise ManifestError(
                path,
                f"{_show(item)} is not an event class ([a-z][a-z0-9_.-]*, at most "
                f"{event_classes.MAX_CLASS_CHARS} characters) or a prefix pattern ending in '.*'",
            )
        if item in classes:
            raise ManifestError(path, f"duplicate event class {_show(item)}")
        classes.append(item)
    command = _required_string(table, "command", "events")
    if command not in {spec.name for spec in commands}:
        raise ManifestError(
            "events.command", f"{_show(command)} is not one of the manifest's [commands]"
        )
    on_overflow = _optional_string(table, "on_overflow", "events")
    if on_overflow is None:
        on_overflow = DEFAULT_OVERFLOW
    elif on_overflow not in OVERFLOW_POLICIES:
        raise ManifestError(
            "events.on_overflow",
            f"unknown policy {_show(on_overflow)}, expected one of {', '.join(OVERFLOW_POLICIES)}",
        )
    depth = table.get("queue_depth", DEFAULT_QUEUE_DEPTH)
    if not isinstance(depth, int) or isinstance(depth, bool):
        raise ManifestError("events.queue_depth", f"expected an integer, got {_type_name(depth)}")
    if not 1 <= depth <= MAX_QUEUE_DEPTH:
        raise ManifestError("events.queue_depth", f"{_show(depth)} is outside 1..{MAX_QUEUE_DEPTH}")
    return EventsSpec(tuple(classes), command, on_overflow, depth)


def _bounded_int(
    table: Mapping[str, object], key: str, default: int, top: int, low: int = 1
) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ManifestError(f"jobs.{key}", f"expected an integer, got {_type_name(value)}")
    if not low <= value <= top:
        raise ManifestError(f"jobs.{key}", f"{_show(value)} is outside {low}..{top}")
    return value


def _parse_jobs(
    table: Mapping[str, object] | None,
    commands: tuple[CommandSpec, ...],
    requested: frozenset[str],
    resources: Resources,
) -> JobsSpec | None:
    if table is None:
        return None
    from wasihost.core.manifest_tables import JobsSpec

    _check_keys(table, "jobs", _JOBS_KEYS)
    if "jobs" not in requested:
        raise ManifestError(
            "jobs", "the jobs capability must be listed in capabilities.required or optional"
        )
    value = table.get("commands")
    if not isinstance(value, list) or not value:
        raise ManifestError("jobs.commands", "expected a non-empty array of command names")
    declared = {spec.name for spec in commands}
    names: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or item not in declared:
            raise ManifestError(
                f"jobs.commands[{index}]", f"{_show(item)} is not one of the manifest's [commands]"
            )
        if item in names:
            raise ManifestError(f"jobs.commands[{index}]", f"duplicate command {_show(item)}")
        names.append(item)
    return JobsSpec(
        tuple(names),
        _bounded_int(table, "max_jobs", DEFAULT_MAX_JOBS, MAX_JOBS_PER_EXTENSION),
        _bounded_int(table, "max_runtime_ms", resources.timeout_ms, resources.timeout_ms),
        _bounded_int(table, "fuel", resources.fuel_per_call, resources.fuel_per_call),
        _bounded_int(
            table, "max_memory_bytes", resources.max_memory_bytes, resources.max_memory_bytes
        ),
        # Zero forbids a run any http traffic, as a zero hourly quota does.
        None
        if "max_network_bytes" not in table
        else _bounded_int(
            table,
            "max_network_bytes",
            0,
            MAX_HTTP_BYTES_PER_HOUR,
            low=MIN_HTTP_BYTES_PER_HOUR,
        ),
    )


def _parse_lifecycle(
    table: Mapping[str, object] | None, commands: tuple[CommandSpec, ...]
) -> str | None:
    if table is None:
        return None
    _check_keys(table, "lifecycle", _LIFECYCLE_KEYS)
    hook = _optional_string(table, "on_shutdown", "lifecycle")
    if hook is not None and hook not in {spec.name for spec in commands}:
        raise ManifestError(
            "lifecycle.on_shutdown", f"{_show(hook)} is not one of the manifest's [commands]"
        )
    return hook


def _parse_scheduling(table: Mapping[str, object] | None) -> str:
    if table is None:
        return DEFAULT_PRIORITY
    _check_keys(table, "scheduling", _SCHEDULING_KEYS)
    priority = _optional_string(table, "priority", "scheduling")
    if priority is None:
        return DEFAULT_PRIORITY
    if priority not in PRIORITY_NAMES:
        raise ManifestError(
            "scheduling.priority",
            f"unknown class {_show(priority)}, expected one of {', '.join(PRIORITY_NAMES)}",
        )
    return priority


def _parse_budget(table: Mapping[str, object] | None) -> str | None:
    if table is None:
        return None
    _check_keys(table, "budget", _BUDGET_KEYS)
    mode = _optional_string(table, "throttle", "budget")
    if mode is not None and mode not in THROTTLE_MODES:
        raise ManifestError(
            "budget.throttle",
            f"unknown mode {_show(mode)}, expected one of {', '.join(THROTTLE_MODES)}",
        )
    return mode


def _load_toml(text: str) -> dict[str, Any]:
    if len(text) > MAX_MANIFEST_CHARS:
        raise ManifestError("", f"manifest of {len(text)} characters exceeds {MAX_MANIFEST_CHARS}")
    # Here: a bare module (`wasihost wasi x.wasm`) has no manifest, and tomllib with the
    # datetime module it imports is a few milliseconds of start-up.
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The message ends with "(at line L, column C)", which is what the author needs.
        raise ManifestError("", f"invalid TOML: {exc}") from None
    except ValueError:
        # tomllib lets int() refuse literals of thousands of digits without wrapping the error.
        raise ManifestError("", "invalid TOML: a number literal is too long") from None
    except RecursionError:
        raise ManifestError("", "invalid TOML: arrays or tables nested too deeply") from None


def declared_publisher(text: str) -> str | None:
    """The ``publisher`` of a manifest's ``[extension]`` table, read without the rest of the
    manifest (its capabilities need no registry here): a claim, for matching a revocation
    list against an installed package. Raises :class:`ManifestError` as :func:`parse_manifest`
    does for that table."""
    return _parse_extension(_required_table(_load_toml(text), "extension")).publisher


def parse_manifest(text: str, known_capabilities: frozenset[str]) -> Manifest:
    """Parse and validate the text of an ``extension.toml``.

    ``known_capabilities`` are the names a manifest may request. Raises :class:`ManifestError`,
    and nothing else, for any ``text``; its ``key`` is the dotted path of the offending field, or
    ``""`` when the text is not TOML at all.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_manifest() takes the manifest's text, not {type(text).__name__}")
    document = _load_toml(text)
    _check_keys(document, "", _TABLES)
    extension = _parse_extension(_required_table(document, "extension"))
    required, optional = _parse_capabilities(
        _optional_table(document, "capabilities"), known_capabilities
    )
    resources = _parse_resources(_optional_table(document, "resources"))
    commands = _parse_commands(_required_table(document, "commands"), extension.abi)
    http = _parse_http(_optional_table(document, "http"))
    update = _parse_update(_optional_table(document, "update"), commands)
    events = _parse_events(_optional_table(document, "events"), commands, required | optional)
    jobs = _parse_jobs(_optional_table(document, "jobs"), commands, required | optional, resources)
    on_shutdown = _parse_lifecycle(_optional_table(document, "lifecycle"), commands)
    priority = _parse_scheduling(_optional_table(document, "scheduling"))
    throttle = _parse_budget(_optional_table(document, "budget"))
    return Manifest(
        schema=extension.schema,
        id=extension.id,
        version=extension.version,
        publisher=extension.publisher,
        abi=extension.abi,
        module=extension.module,
        sha256=extension.sha256,
        runtime=extension.runtime,
        required=required,
        optional=optional,
        resources=resources,
        commands=commands,
        http=http,
        update=update,
        events=events,
        jobs=jobs,
        on_shutdown=on_shutdown,
        priority=priority,
        throttle=throttle,
    )
