"""The WASI profile's binding: the handlers of one instance, over one :class:`WasiState`.

The engine calls a handler as ``handler(mem, *args)`` with i32 arguments as unsigned ints and
stores the returned errno as the i32 result. Each handler is wrapped once, here, so that a
:class:`WasiError` or a host ``OSError`` becomes the guest's errno; a host exception text never
crosses. ``GuestFault`` (a wild pointer) and ``GuestExit`` pass through to the engine.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError
from ..core.registry import CORE_CAPABILITY, HostFunction, Profile

# What wasi_profile returns (its name here was the module's own alias of it).
from .clock_calls import HANDLERS as CLOCK_HANDLERS
from .config import WasiOptions
from .errno import Errno, WasiError, from_oserror
from .fd_attrs import HANDLERS as FD_ATTR_HANDLERS
from .fd_dirs import HANDLERS as FD_DIR_HANDLERS
from .fd_io import FAST_HANDLERS
from .fd_io import HANDLERS as FD_IO_HANDLERS
from .path_calls import HANDLERS as PATH_HANDLERS
from .proc_calls import HANDLERS as PROC_HANDLERS
from .registry import MODULE, PROFILE
from .scopes import apply_scopes
from .sock_calls import HANDLERS as SOCK_HANDLERS
from .state import WasiState

if TYPE_CHECKING:
    from ..core.serving import ExtensionView, ProfileBinding, ProfileFactory

Handler = Callable[..., Any]

HANDLERS: dict[str, Handler] = {
    **PROC_HANDLERS,
    **CLOCK_HANDLERS,
    **FD_IO_HANDLERS,
    **FD_ATTR_HANDLERS,
    **FD_DIR_HANDLERS,
    **PATH_HANDLERS,
    **SOCK_HANDLERS,
}


def guarded(fn: Handler, st: WasiState) -> Handler:
    """``fn`` bound to ``st``, answering errors as errnos."""

    def call(mem: Any, *args: int) -> Any:
        try:
            return fn(st, mem, *args)
        except WasiError as exc:
            return exc.errno
        except OSError as exc:
            return from_oserror(exc)

    call.__name__ = fn.__name__
    call.__qualname__ = f"wasi.{fn.__name__}"
    return call


# Calls that change the host's file system. Each commits through the grant table with the
# epoch its call started under (any grant change voids it), under the lock revocations take.
MUTATING = frozenset(
    {
        "fd_allocate",
        "fd_filestat_set_size",
        "fd_filestat_set_times",
        "fd_pwrite",
        "path_create_directory",
        "path_filestat_set_times",
        "path_link",
        "path_open",
        "path_remove_directory",
        "path_rename",
        "path_symlink",
        "path_unlink_file",
    }
)


def committed(fn: Handler, st: WasiState) -> Handler:
    """``fn`` run through the state's commit: refused with NOTCAPABLE once its epoch is stale."""

    def call(mem: Any, *args: int) -> Any:
        authorised, result = st.commit(lambda: fn(mem, *args))
        return result if authorised else Errno.NOTCAPABLE

    call.__name__ = fn.__name__
    call.__qualname__ = fn.__qualname__
    return call


class WasiBinding:
    """The :class:`~wasihost.core.serving.ProfileBinding` of one instance."""

    def __init__(self, state: WasiState) -> None:
        self.state = state
        self._handlers: dict[str, Handler] = {}

    @classmethod
    def for_extension(cls, config: WasiOptions, ext: ExtensionView) -> WasiBinding:
        host = ext.host
        config = apply_scopes(config, ext.grant_scopes())
        state = WasiState(
            config,
            ext.grant.allows,
            ext.log,
            host.clock,
            host.policy.clock_resolution_ns,
            policy_seed=host.policy.random_seed,
            commit=functools.partial(ext.commit, CORE_CAPABILITY),
            guards=ext.committer,
        )
        return cls(state)

    def handler(self, entry: HostFunction) -> Handler:
        if entry.module != MODULE or entry.name not in HANDLERS:
            raise ConfigError(f"{entry.qualified_name} is not a WASI preview1 function")
        bound = self._handlers.get(entry.name)
        if bound is None:
            fast = FAST_HANDLERS.get(entry.name)
            if fast is not None:
                bound = fast(self.state)
            elif entry.name in MUTATING:
                bound = committed(guarded(HANDLERS[entry.name], self.state), self.state)
            else:
                bound = guarded(HANDLERS[entry.name], self.state)
            self._handlers[entry.name] = bound
        return bound

    def close(self) -> None:
        self.state.close()


class WasiBindingFactory:
    """Makes each instance's :class:`WasiBinding` over one config; the host reads
    ``command_max_memory_bytes`` for the plain commands it admits (``extension.CommandMemory``)."""

    def __init__(self, config: WasiOptions) -> None:
        self.config = config
        self.command_max_memory_bytes = config.max_memory_bytes

    def __call__(self, ext: ExtensionView) -> ProfileBinding:
        return WasiBinding.for_extension(self.config, ext)


def wasi_profile(config: WasiOptions | None = None) -> tuple[Profile, ProfileFactory]:
    """The WASI profile and a binding factory serving ``config``, for ``Host(profiles=[...])``.

    Grant the extension :func:`~wasihost.wasi.config.capabilities_for` of the same config to
    give it exactly what the config provides.
    """
    return PROFILE, WasiBindingFactory(config if config is not None else WasiOptions())
