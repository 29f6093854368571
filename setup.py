"""The one C extension of wasihost, built when a C compiler is there: pyproject.toml holds
everything else. ``optional=True``: without a compiler (or Python's headers) the install still
succeeds, and the engine runs its ctypes call path (engine/fastcall.py, ``wasihost doctor``)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "wasihost.engine._fastcall",
            sources=["wasihost/engine/_fastcall.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ]
)
