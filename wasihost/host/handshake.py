"""The start-up handshake: the two reserved commands every guest answers before its first call
(``wasihost.hello``, then ``wasihost.welcome``), the checks on its answers, and the guest's
error body that a non-OK answer (of these or of any command) carries.

Everything a guest answers here is hostile until checked: bounded in size, decoded with the
bounded codec, and each field's type checked before it is used.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ..core.codec import CodecLimits, decode, encode
from ..core.errors import CallError, CodecError, FailureClass
from ..core.tokens import TOKEN_BYTES

if TYPE_CHECKING:
    from ..core.admission import AdmissionPlan
    from ..core.grants import Grant
    from ..core.manifest import Manifest
    from ..core.registry import Registry
    from ..core.tokens import TokenIssuer
    from ..engine import Budget
    from .backend import GuestInstance

# Handshake answers are a few short fields; anything bigger is a confused or hostile guest.
MAX_HANDSHAKE_BYTES = 4096
# The bounds of a reserved command's answer, made once (an attrs instance costs a few µs).
HANDSHAKE_LIMITS = CodecLimits(max_bytes=MAX_HANDSHAKE_BYTES)
# A guest's error map is for a human: class and message, bounded.
MAX_GUEST_ERROR_BYTES = 2048
MAX_GUEST_ERROR_TEXT = 512
MAX_GUEST_ERROR_CLASS = 64
GUEST_ERROR_LIMITS = CodecLimits(max_bytes=MAX_GUEST_ERROR_BYTES)
# 128 random bits: a runtime id names one start of one extension, and must not be guessable
# from another's (it is bound into the host-call token).
RUNTIME_ID_BYTES = 16
READINESS = ("ready", "degraded", "failed")
# A module's instances give the same handshake answers, byte for byte: the answers' checks
# are pure functions of those bytes, so each is worked out once per distinct answer (an
# answer that fails them is worked out, and refused, every time). Bounded by entries, each
# at most MAX_HANDSHAKE_BYTES.
HANDSHAKE_ANSWERS_KEPT = 64
# The welcome request's part that depends only on the granted capabilities, kept per distinct
# set (_welcome_template): grants change rarely, and each entry is a few hundred bytes at most.
WELCOME_TEMPLATES_KEPT = 64


@attrs.frozen
class Handshake:
    """What the guest said at start-up and what the host answered."""

    runtime_id: bytes
    guest_id: str
    guest_version: str
    abi: str
    requested: tuple[str, ...]
    granted: tuple[str, ...]
    epoch: int
    readiness: str
    reason: str | None
    # The feature flags the host offered in ``wasihost.hello``: those of the guest's view.
    features: tuple[str, ...] = ()


def run_handshake(
    instance: GuestInstance,
    budget: Budget,
    *,
    ext_id: str,
    plan: AdmissionPlan,
    manifest: Manifest | None,
    grant: Grant,
    registry: Registry,
    tokens: TokenIssuer,
) -> Handshake:
    """Say hello, check who the guest says it is against its marker and manifest, welcome it
    with a new runtime id, its grant and token, and check that it is ready."""
    guest_id, guest_version, abi, features = _hello_answer(
        _reserved(instance, "wasihost.hello", hello_request(registry, plan), budget)
    )
    if abi != str(plan.version):
        raise CallError(
            FailureClass.HANDSHAKE,
            f"wasihost.hello: guest says ABI {abi!r}, its marker says {plan.version}",
        )
    if manifest is not None and (guest_id, guest_version) != (manifest.id, manifest.version):
        raise CallError(
            FailureClass.HANDSHAKE,
            f"wasihost.hello: guest says {guest_id} {guest_version}, the manifest "
            f"says {manifest.id} {manifest.version}",
        )
    runtime_id = secrets.token_bytes(RUNTIME_ID_BYTES)
    token = tokens.issue(ext_id, runtime_id, grant.epoch)
    granted, welcome = welcome_request(grant.capabilities, runtime_id, grant.epoch, token)
    readiness, reason = _welcome_answer(_reserved(instance, "wasihost.welcome", welcome, budget))
    if readiness == "failed":
        raise CallError(
            FailureClass.HANDSHAKE, f"guest reported failed start-up: {reason or 'no reason'}"
        )
    return Handshake(
        runtime_id=runtime_id,
        guest_id=guest_id,
        guest_version=guest_version,
        abi=abi,
        requested=features,
        granted=granted,
        epoch=grant.epoch,
        readiness=readiness,
        reason=reason,
        features=plan.view.features,
    )


def hello_request(registry: Registry, plan: AdmissionPlan) -> bytes:
    """``wasihost.hello``'s request: the same for every guest of one view while the
    registry's majors stay as they are (a major is never removed or replaced, so their
    count says whether they changed), so worked out once per host.

    Feature flags travel in it (an additive field: guests ignore fields they do not know):
    those of the view the guest linked against, so what it may rely on."""
    key = ("hello", len(registry.majors), plan.view.features)
    request: bytes | None = registry.memo.get(key)
    if request is None:
        versions = [str(v) for v in registry.versions]
        features = list(plan.view.features)
        request = encode({"host": "wasihost", "abi": versions, "features": features})
        registry.remember(key, request)
    return request


@functools.lru_cache(maxsize=WELCOME_TEMPLATES_KEPT)
def _welcome_template(capabilities: frozenset[str]) -> tuple[tuple[str, ...], bytes, bytes, bytes]:
    """``wasihost.welcome``'s request for a set of granted capabilities, less what changes
    from one start to the next: (the capabilities, sorted; the bytes before the runtime id;
    those between it and the epoch; those between the epoch and the token).

    The request is ``encode({"runtime_id", "granted", "epoch", "token"})``, a definite map
    whose pairs are written in that order, so the rest is the same at every start with those
    capabilities: encoded once per set (a stateless host's epoch moves at each admission, so
    the set, not the grant, is the key). Made by encoding the whole map once, with stand-ins
    of the per-start values' sizes, and cut where their encodings sit; a map that would not
    cut so is refused (it would be a bug: each encoding is fixed by its value alone)."""
    granted = sorted(capabilities)
    runtime_id, token = bytes(RUNTIME_ID_BYTES), bytes(TOKEN_BYTES)
    whole = encode({"runtime_id": runtime_id, "granted": granted, "epoch": 0, "token": token})
    head, value, tail = b"\xa4" + encode("runtime_id"), encode(runtime_id), encode(token)
    epoch_key = encode("epoch") + encode(0)
    start, end = len(head) + len(value), len(whole) - len(tail) - len(encode("token"))
    if not (
        whole.startswith(head + value)
        and whole.endswith(encode("token") + tail)
        and whole[end - len(epoch_key) : end] == epoch_key
    ):
        raise AssertionError("the welcome request does not cut at its runtime id and token")
    before_epoch = whole[start : end - len(encode(0))]
    return tuple(granted), head, before_epoch, encode("token")


def welcome_request(
    capabilities: frozenset[str], runtime_id: bytes, epoch: int, token: bytes
) -> tuple[tuple[str, ...], bytes]:
    """(the granted capabilities, sorted; ``wasihost.welcome``'s request): the same bytes as
    ``encode({"runtime_id": ..., "granted": [...], "epoch": ..., "token": ...})``."""
    granted, head, before_epoch, before_token = _welcome_template(capabilities)
    parts = (head, encode(runtime_id), before_epoch, encode(epoch), before_token, encode(token))
    return granted, b"".join(parts)


def guest_error(body: bytes) -> tuple[str, str]:
    """The guest's ``{"class", "message"}``, bounded; never trusted to be well-formed."""
    try:
        value = decode(body, GUEST_ERROR_LIMITS)
    except CodecError:
        return "error", "guest error (malformed error body)"
    if not isinstance(value, dict):
        return "error", "guest error (malformed error body)"
    cls = value.get("class")
    msg = value.get("message")
    cls = cls[:MAX_GUEST_ERROR_CLASS] if isinstance(cls, str) and cls else "error"
    msg = msg[:MAX_GUEST_ERROR_TEXT] if isinstance(msg, str) else ""
    return cls, msg


def guest_error_line(cls: str, msg: str) -> str:
    return f"{cls}: {msg}" if msg else cls


def _reserved(instance: GuestInstance, command: str, request: bytes, budget: Budget) -> bytes:
    """The body of a reserved command's OK answer (any other status fails the handshake)."""
    try:
        with instance.lock:
            result = instance.call(command.encode(), request, MAX_HANDSHAKE_BYTES, budget)
    except CallError as exc:
        if exc.failure in (FailureClass.PROTOCOL, FailureClass.GUEST_ERROR):
            raise CallError(FailureClass.HANDSHAKE, f"{command}: {exc.message}") from None
        raise
    if result.status != 0:
        raise CallError(
            FailureClass.HANDSHAKE,
            f"{command}: guest answered status {result.status} "
            f"({guest_error_line(*guest_error(result.body))})",
        )
    return result.body


@functools.lru_cache(maxsize=HANDSHAKE_ANSWERS_KEPT)
def _hello_answer(body: bytes) -> tuple[str, str, str, tuple[str, ...]]:
    """``wasihost.hello``'s answer checked: (guest id, version, ABI, feature flags)."""
    fields = _require_fields(
        _decode_answer(body, "wasihost.hello"),
        "wasihost.hello",
        {"id": str, "version": str, "abi": str, "features": list},
    )
    features = fields["features"]
    if not all(isinstance(f, str) for f in features):
        raise CallError(FailureClass.HANDSHAKE, "wasihost.hello: features must be text")
    return fields["id"], fields["version"], fields["abi"], tuple(features)


@functools.lru_cache(maxsize=HANDSHAKE_ANSWERS_KEPT)
def _welcome_answer(body: bytes) -> tuple[str, str | None]:
    """``wasihost.welcome``'s answer checked: (readiness, reason)."""
    welcome = _require_fields(
        _decode_answer(body, "wasihost.welcome"), "wasihost.welcome", {"status": str}
    )
    readiness = welcome["status"]
    reason = welcome.get("reason")
    if readiness not in READINESS or (reason is not None and not isinstance(reason, str)):
        raise CallError(FailureClass.HANDSHAKE, f"wasihost.welcome: bad answer {welcome!r}")
    return readiness, reason


def _decode_answer(body: bytes, command: str) -> Any:
    try:
        return decode(body, HANDSHAKE_LIMITS)
    except CodecError as exc:
        raise CallError(FailureClass.HANDSHAKE, f"{command}: {exc.message}") from None


def _require_fields(value: Any, where: str, fields: Mapping[str, type]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CallError(FailureClass.HANDSHAKE, f"{where}: answer is not a map")
    for key, kind in fields.items():
        if not isinstance(value.get(key), kind):
            raise CallError(FailureClass.HANDSHAKE, f"{where}: field {key!r} missing or mistyped")
    return value
