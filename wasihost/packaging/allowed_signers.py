"""OpenSSH ``allowed_signers`` files: which SSH key may sign as which publisher.

A line is ``PRINCIPALS [OPTIONS] KEYTYPE BASE64KEY [COMMENT]`` (``ssh-keygen(1)``, section
ALLOWED SIGNERS). PRINCIPALS is an OpenSSH pattern list: comma-separated patterns with ``*``
and ``?`` wildcards, each negated by a leading ``!``; a name matches the list if it matches a
pattern and no negated one (``match_pattern_list`` in OpenSSH's ``match.c``, which ``ssh-keygen
-Y verify`` applies to principals and namespaces alike). OPTIONS, comma-separated, may be
``namespaces="a,b"`` (a pattern list: the namespaces the key may sign for),
``valid-after="TIME"`` and ``valid-before="TIME"`` (TIME is ``YYYYMMDD[HHMM[SS]]``, UTC
with a trailing ``Z``, local time without); ``cert-authority`` lines are refused (certificates
are not supported). Lines of key types other than ``ssh-ed25519`` are read and kept, but never
verify anything.

The rule that maps an SSH signer to a package's publisher is ``ssh-keygen -Y verify -I``'s:
the manifest's ``publisher`` is the identity, and it must match one of the principal patterns
of a line holding the signing key. The file is the operator's configuration, so its errors
are :class:`~wasihost.core.errors.ConfigError` naming the line.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import fnmatch
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import attrs

from ..core.errors import (
    ConfigError,
    InvalidSignatureError,
    PublisherMismatchError,
    UntrustedKeyError,
)
from . import sshsig
from .regular_files import read_regular
from .sshsig import ED25519, NAMESPACE, ed25519_key
from .trust import _read_text, b64

# An operator's allowed_signers file lists a team's keys, a few KiB; 1 MiB bounds a wrong path.
MAX_FILE_BYTES: Final = 1024 * 1024
# As many keys as a trust file holds (trust.MAX_TRUSTED_KEYS).
MAX_LINES: Final = 4096
# The longest line: principals, options and a key of MAX_KEY_CHARS, with room to spare; bounds
# the per-character field splitter.
MAX_LINE_CHARS: Final = 16 * 1024
# A principal list longer than this is not a list of people or publishers.
MAX_PRINCIPALS: Final = 256
# Public keys of any type ssh-keygen makes (RSA-16384 included) are under 3 KiB of base64.
MAX_KEY_CHARS: Final = 4096
_TIME = re.compile(r"(\d{8})(\d{4}(\d{2})?)?(Z?)")
# The characters of a principal pattern: a publisher id's, plus the two wildcards, after an
# optional negation.
_PRINCIPAL = re.compile(r"!?[A-Za-z0-9._@+*?-]{1,128}")
# OpenSSH's match_pattern_list copies each pattern into a 1 KiB buffer and matches nothing at
# all, for the whole list, if one has 1,023 characters or more: such a namespace pattern is
# refused here rather than read as a pattern ssh-keygen -Y verify would never match.
MAX_PATTERN_CHARS: Final = 1022
_OPTION = re.compile(r'([a-z-]+)(?:="([^"]*)")?')


@attrs.frozen
class AllowedSigner:
    """One line: principal patterns, the key (raw Ed25519, or None for other types), limits."""

    line: int
    principals: tuple[str, ...]
    key_type: str
    key: bytes | None
    namespaces: tuple[str, ...] | None = None
    valid_after: float | None = None
    valid_before: float | None = None

    def names(self, publisher: str) -> bool:
        return pattern_list_matches(self.principals, publisher)

    def allows_namespace(self, namespace: str) -> bool:
        return self.namespaces is None or pattern_list_matches(self.namespaces, namespace)


def pattern_list_matches(patterns: tuple[str, ...], name: str) -> bool:
    """OpenSSH's pattern-list rule: ``name`` matches if some pattern without ``!`` matches it
    and no ``!``-negated one does, whatever their order (``!a,*`` and ``*,!a`` both refuse
    ``a``; a list of negations alone matches nothing). Each of them was a literal before, or
    refused: ``namespaces="wasihost,!wasihost"`` allowed the namespace it negates."""
    positive = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        if _matches(pattern[1:] if negated else pattern, name):
            if negated:
                return False
            positive = True
    return positive


def _matches(pattern: str, name: str) -> bool:
    # Only * and ? are special in OpenSSH's match_pattern: a "[" is escaped as fnmatch's
    # one-character class of itself. fnmatch compiles the stars into atomic groups: a naive
    # ".*" per star backtracks exponentially on a pattern like "*a*a*a...*b" against the
    # manifest's (attacker-chosen) publisher.
    return fnmatch.fnmatchcase(name, pattern.replace("[", "[[]"))


def _timestamp(text: str, where: str) -> float:
    match = _TIME.fullmatch(text)
    if match is None:
        raise ConfigError(f"{where}: time {text[:40]!r} is not YYYYMMDD[HHMM[SS]][Z]")
    digits = match.group(1) + (match.group(2) or "0000").ljust(6, "0")
    try:
        fields = time.strptime(digits, "%Y%m%d%H%M%S")
    except ValueError:
        raise ConfigError(f"{where}: time {text!r} is not a date") from None
    return float(calendar.timegm(fields) if match.group(4) else time.mktime(fields))


def _split_fields(line: str, where: str) -> list[str]:
    """Whitespace-separated fields, where a double-quoted run (an option value) may hold
    spaces."""
    fields: list[str] = []
    current = ""
    quoted = False
    for c in line:
        if c == '"':
            quoted = not quoted
        if c.isspace() and not quoted:
            if current:
                fields.append(current)
            current = ""
        else:
            current += c
    if quoted:
        raise ConfigError(f"{where}: an unterminated quote")
    if current:
        fields.append(current)
    return fields


def _options(text: str, where: str) -> dict[str, str | None]:
    options: dict[str, str | None] = {}
    rest = text
    while rest:
        match = _OPTION.match(rest)
        if match is None:
            raise ConfigError(f"{where}: cannot read options {rest[:40]!r}")
        name, value = match.group(1), match.group(2)
        if name in options:
            raise ConfigError(f"{where}: option {name} given twice")
        options[name] = value
        rest = rest[match.end() :]
        if rest and not rest.startswith(","):
            raise ConfigError(f"{where}: options must be separated by commas")
        rest = rest[1:]
    return options


def _key_type(text: str) -> bool:
    return text.startswith(("ssh-", "ecdsa-", "sk-")) or text.endswith("@openssh.com")


def parse_line(number: int, fields: list[str], origin: str) -> AllowedSigner:
    where = f"{origin} line {number}"
    if len(fields) < 3:
        raise ConfigError(f"{where}: expected 'PRINCIPALS [OPTIONS] KEYTYPE BASE64KEY'")
    principals = tuple(fields[0].split(","))
    if len(principals) > MAX_PRINCIPALS:
        raise ConfigError(f"{where}: more than {MAX_PRINCIPALS} principals")
    for pattern in principals:
        if not _PRINCIPAL.fullmatch(pattern):
            raise ConfigError(
                f"{where}: principal {pattern[:40]!r} is not 1 to 128 of letters, digits, "
                "._@+- and the wildcards * ?, after an optional ! (negation)"
            )
    options: dict[str, str | None] = {}
    rest = fields[1:]
    if not _key_type(rest[0]):
        options = _options(rest[0], where)
        rest = rest[1:]
    if len(rest) < 2:
        raise ConfigError(f"{where}: no key after the principals and options")
    key_type, key_text = rest[0], rest[1]
    if "cert-authority" in options:
        raise ConfigError(
            f"{where}: cert-authority lines are not supported (list the signing keys themselves)"
        )
    unknown = set(options) - {"namespaces", "valid-after", "valid-before"}
    if unknown:
        raise ConfigError(f"{where}: unknown option {sorted(unknown)[0]!r}")
    if len(key_text) > MAX_KEY_CHARS:
        raise ConfigError(f"{where}: a key longer than {MAX_KEY_CHARS} characters")
    try:
        blob = base64.b64decode(key_text, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{where}: the key is not base64") from None
    key = None
    if key_type == ED25519:
        try:
            key = ed25519_key(blob, where)
        except InvalidSignatureError as exc:
            raise ConfigError(str(exc)) from None
    namespaces = options.get("namespaces")
    after, before = options.get("valid-after"), options.get("valid-before")
    for name in ("namespaces", "valid-after", "valid-before"):
        if name in options and options[name] is None:
            raise ConfigError(f'{where}: option {name} needs a value ({name}="...")')
    namespace_patterns = tuple(namespaces.split(",")) if namespaces is not None else None
    for pattern in namespace_patterns or ():
        if len(pattern) > MAX_PATTERN_CHARS:
            raise ConfigError(
                f"{where}: a namespaces pattern of {len(pattern)} characters, more than "
                f"{MAX_PATTERN_CHARS}: ssh-keygen -Y verify matches no namespace against the "
                "list then (shorten it; 'wasihost' is the namespace packages are signed for)"
            )
    return AllowedSigner(
        number,
        principals,
        key_type,
        key,
        namespace_patterns,
        _timestamp(after, where) if after is not None else None,
        _timestamp(before, where) if before is not None else None,
    )


@attrs.frozen
class AllowedSigners:
    """An ``allowed_signers`` file, read."""

    origin: str
    signers: tuple[AllowedSigner, ...]

    @classmethod
    def parse(cls, text: str, origin: str = "allowed_signers") -> AllowedSigners:
        signers: list[AllowedSigner] = []
        for number, line in enumerate(text.splitlines(), start=1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            if len(signers) == MAX_LINES:
                raise ConfigError(f"{origin}: more than {MAX_LINES} keys")
            if len(stripped) > MAX_LINE_CHARS:
                raise ConfigError(f"{origin} line {number}: longer than {MAX_LINE_CHARS}")
            signers.append(parse_line(number, _split_fields(stripped, f"{origin}"), origin))
        return cls(origin, tuple(signers))

    @classmethod
    def from_file(cls, path: str | Path) -> AllowedSigners:
        return cls.parse(_read_text(Path(path), MAX_FILE_BYTES, "allowed_signers file"), str(path))

    def verify(
        self,
        message: bytes,
        signature_file: bytes,
        publisher: str | None,
        now: Callable[[], float] = time.time,
    ) -> AllowedSigner:
        """The line that lets the SSH signature ``signature_file`` of ``message`` stand for
        ``publisher`` now; raise the specific :class:`~wasihost.core.errors.SignatureError`
        otherwise (None is never returned)."""
        signature = sshsig.parse(signature_file)
        lines = [s for s in self.signers if s.key == signature.key]
        fingerprint = f"{ED25519} {b64(signature.key)[:16]}..."
        if not lines:
            raise UntrustedKeyError(f"key {fingerprint} is not in {self.origin}")
        signature.verify(message)
        if publisher is None:
            raise PublisherMismatchError(
                "the manifest names no publisher, so no principal of the SSH key can match it "
                "(set [extension] publisher in extension.toml)"
            )
        named = [s for s in lines if s.names(publisher)]
        if not named:
            principals = sorted({p for s in lines for p in s.principals})
            raise PublisherMismatchError(
                f"key {fingerprint} may sign as {', '.join(principals)} in {self.origin}; "
                f"the manifest names publisher {publisher!r}"
            )
        moment = now()
        why = ""
        for line in named:
            if not line.allows_namespace(NAMESPACE):
                shown = ",".join(line.namespaces or ())[:60]
                why = f"line {line.line} allows namespaces {shown}, which exclude {NAMESPACE}"
            elif line.valid_after is not None and moment < line.valid_after:
                why = f"line {line.line} is not valid yet (valid-after)"
            elif line.valid_before is not None and moment >= line.valid_before:
                why = f"line {line.line} has expired (valid-before)"
            else:
                return line
        raise UntrustedKeyError(
            f"key {fingerprint} may not sign wasihost packages as {publisher!r} now: {why} "
            f"of {self.origin}"
        )


@attrs.frozen
class SshSigned:
    """What verifies a ``.whpkg`` by OpenSSH signature: the operator's ``allowed_signers`` and
    the armored signature of the archive file (``ssh-keygen -Y sign -n wasihost FILE.whpkg``).
    ``now`` is the clock the ``valid-after``/``valid-before`` options are checked against."""

    allowed: AllowedSigners
    signature: bytes = attrs.field(repr=False)
    now: Callable[[], float] = time.time

    def verify(self, archive_file: bytes, publisher: str | None) -> AllowedSigner:
        return self.allowed.verify(archive_file, self.signature, publisher, self.now)


def read_ssh_signature(path: str | Path) -> bytes:
    """A signature file's bytes, at most one byte over the bound (the parser refuses that)."""
    try:
        return read_regular(path, sshsig.MAX_SIGNATURE_FILE_BYTES)
    except OSError as exc:
        raise ConfigError(f"SSH signature {path} cannot be read: {exc.strerror}") from None


__all__ = [
    "AllowedSigner",
    "AllowedSigners",
    "SshSigned",
    "parse_line",
    "pattern_list_matches",
    "read_ssh_signature",
]
