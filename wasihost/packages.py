"""Packaging from Python: ``keygen``, ``pack``, ``sign``, ``verify``, ``install``, ``update``,
``rollback`` and ``remove``, the code the ``wasihost`` commands of the same names run
(defined in :mod:`wasihost.host.packages`; docs/packages.md, "From Python")::

    from wasihost import packages

    packages.keygen("org.example.bars", "release/bars")
    packages.pack("my-extension", "my-extension.whpkg")
    packages.sign("my-extension.whpkg", "release/bars.key")
    packages.verify("my-extension.whpkg", trust="release/bars.pub")
    packages.install("my-extension.whpkg", state_dir="/var/lib/app", trust="release/bars.pub")
"""

from wasihost.host import packages as _home
from wasihost.host.packages import *  # noqa: F403

__all__ = _home.__all__
