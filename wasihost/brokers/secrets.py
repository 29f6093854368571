"""The secrets broker: guests use secrets by reference and never read them.

A guest holds a secret's name. It may ask the host to HMAC-sign data under it
(``secret_hmac``), or to attach it to an outbound request as a header (the http broker calls
:func:`use_secret` with the request's origin). The plaintext is read from the operator's
:class:`~wasihost.store.secrets.SecretStore` at each use and never written to guest memory, a log,
storage or an error text.

What an extension may use is its ``secrets`` grant's scope, set by the operator::

    {"names": ["signing-key"],                           # for secret_hmac
     "headers": {"api-token": ["https://api.example.com"]}}  # attachable, to these origins only

A secret bound to origins can only travel to them: an extension allowed to reach a server of
its own cannot have the host send the token there. :meth:`SecretsBroker.revoke` withdraws a
secret from every extension at once.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..core.errors import ConfigError
from ..core.status import HostStatus, Status
from ..store.secrets import MemorySecretStore, SecretStore, SecretUnavailable, check_secret_name

if TYPE_CHECKING:
    from ..core.registry import HostFunction
    from ..core.serving import ExtensionView

LOG = logging.getLogger("wasihost")

CAPABILITY = "secrets"
SCOPE_KEYS = frozenset({"names", "headers"})
# Both lists are written by an operator; a hundred secrets or origins per extension is far more
# than a plugin needs and keeps a scope well under the grant table's 4 KiB.
MAX_SCOPE_NAMES = 100
MAX_SCOPE_ORIGINS = 16
# The data signed in one call: the registry entry's request bound (16 KiB) less its framing.
MAX_HMAC_DATA_BYTES = 16 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalize_origin(text: object) -> str:
    """``scheme://host:port`` with the scheme and host lowercased and the port explicit, or a
    ValueError: an origin is nothing more (no user, path, query or fragment)."""
    if not isinstance(text, str) or len(text) > 300:
        raise ValueError(f"origin {text!r} is not text of at most 300 characters")
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ValueError(f"origin {text!r}: the scheme must be http or https")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"origin {text!r}: bad port") from None
    if (
        not parts.hostname
        or parts.username is not None
        or parts.password is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise ValueError(f"origin {text!r} must be scheme://host[:port] and nothing more")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port if port is not None else _DEFAULT_PORTS[scheme]}"


def _scope_names(scope: Mapping[str, Any]) -> frozenset[str]:
    names = scope.get("names", [])
    if not isinstance(names, list) or len(names) > MAX_SCOPE_NAMES:
        raise ConfigError(f"secrets scope names must be a list of at most {MAX_SCOPE_NAMES}")
    return frozenset(check_secret_name(n) for n in names)


def _scope_headers(scope: Mapping[str, Any]) -> dict[str, frozenset[str]]:
    headers = scope.get("headers", {})
    if not isinstance(headers, Mapping) or len(headers) > MAX_SCOPE_NAMES:
        raise ConfigError(
            f"secrets scope headers must map at most {MAX_SCOPE_NAMES} secret names to origins"
        )
    out = {}
    for name, origins in headers.items():
        check_secret_name(name)
        if not isinstance(origins, list) or not 0 < len(origins) <= MAX_SCOPE_ORIGINS:
            raise ConfigError(
                f"secrets scope headers[{name!r}] must list 1..{MAX_SCOPE_ORIGINS} origins"
            )
        try:
            out[name] = frozenset(normalize_origin(o) for o in origins)
        except ValueError as exc:
            raise ConfigError(f"secrets scope headers[{name!r}]: {exc}") from None
    return out


class SecretsBroker:
    """Serves ``secret_hmac`` and lends secrets to the http broker, from ``store`` (by default
    an empty :class:`~wasihost.store.secrets.MemorySecretStore`: no secrets until the embedder gives
    a store)."""

    name = "secrets"
    functions = ("wasihost_v1.secret_hmac",)
    capabilities = frozenset({CAPABILITY})

    def __init__(self, store: SecretStore | None = None) -> None:
        self.store: SecretStore = store if store is not None else MemorySecretStore()
        self._lock = threading.Lock()
        self._revoked: set[str] = set()

    # -- operator ---------------------------------------------------------------------------

    def revoke(self, name: str) -> None:
        """No extension may use ``name`` from now on: a use that starts after this returns is
        refused (``DENIED``), whatever the grants say."""
        check_secret_name(name)
        with self._lock:
            self._revoked.add(name)

    def reinstate(self, name: str) -> None:
        with self._lock:
            self._revoked.discard(name)

    def check_scope(self, capability: str, scope: Mapping[str, Any]) -> None:
        unknown = sorted(set(scope) - SCOPE_KEYS)
        if unknown:
            raise ConfigError(f"grant scope of secrets: unknown keys {', '.join(unknown)}")
        _scope_names(scope)
        _scope_headers(scope)

    # -- use ----------------------------------------------------------------------------------

    def use(self, ext: ExtensionView, name: object, origin: str | None = None) -> bytes:
        """The bytes of secret ``name`` for ``ext``: for signing when ``origin`` is None,
        else to attach to a request to ``origin``. Raises ``HostStatus``: INVALID_ARGUMENT
        for a malformed name, DENIED if not granted for this use or revoked, NOT_FOUND if the
        store lacks it, UNAVAILABLE if the store holds it unsafely."""
        if not isinstance(name, str) or not 0 < len(name) <= 64:
            raise HostStatus(Status.INVALID_ARGUMENT)
        try:
            check_secret_name(name)
        except ConfigError:
            raise HostStatus(Status.INVALID_ARGUMENT) from None
        if not ext.grant.allows(CAPABILITY):
            raise HostStatus(Status.DENIED)
        scope = ext.grant_scopes().get(CAPABILITY, {})
        if origin is None:
            granted = name in _scope_names(scope)
        else:
            granted = origin in _scope_headers(scope).get(name, frozenset())
        if not granted:
            raise HostStatus(Status.DENIED)
        with self._lock:
            if name in self._revoked:
                raise HostStatus(Status.DENIED)
            try:
                value = self.store.read(name)
            except SecretUnavailable as exc:
                LOG.warning("extension %s: secret unusable: %s", ext.id, exc)
                raise HostStatus(Status.UNAVAILABLE) from None
        if value is None:
            raise HostStatus(Status.NOT_FOUND)
        return value

    # -- broker protocol ----------------------------------------------------------------------

    def open(self, ext: ExtensionView) -> ExtensionView:
        return ext

    def handler(self, entry: HostFunction, state: ExtensionView) -> Callable[[Any, Any], Any]:
        ext = state

        def hmac_sha256(call: Any, request: Any) -> bytes:
            if (
                not isinstance(request, list)
                or len(request) != 2
                or not isinstance(request[1], bytes)
                or len(request[1]) > MAX_HMAC_DATA_BYTES
            ):
                raise HostStatus(Status.INVALID_ARGUMENT)
            key = self.use(ext, request[0])
            return hmac.new(key, request[1], hashlib.sha256).digest()

        return hmac_sha256

    def close(self, state: ExtensionView) -> None:
        pass


def use_secret(ext: ExtensionView, name: object, origin: str | None = None) -> bytes:
    """The secret ``name`` for ``ext`` from the secrets broker serving its host (see
    :meth:`SecretsBroker.use`); the http broker's way to attach one to a request."""
    broker = ext.host.broker(SecretsBroker.name)
    if not isinstance(broker, SecretsBroker):
        raise HostStatus(Status.UNSUPPORTED)
    return broker.use(ext, name, origin)
