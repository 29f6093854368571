"""The host's own Python logger, ``wasihost``, for what goes wrong on the host's side (a host
function that raised, a log sink that failed, metrics not published).

``logging`` (with ``traceback`` and ``string`` under it, about 5 ms) is imported when the
first such record is written, not with the modules that might write one: a short
``wasihost run`` writes none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging

LOGGER_NAME = "wasihost"


def host_logger() -> logging.Logger:
    """The ``wasihost`` logger (``logging.getLogger`` returns the same object every time)."""
    import logging

    return logging.getLogger(LOGGER_NAME)
