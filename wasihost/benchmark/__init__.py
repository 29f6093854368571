"""``wasihost bench``: call cost, ABI compatibility, metering overhead and scaling, measured
side by side with raw wasmtime-py and Extism in one run, and the process runtime beside the
in-process one (see docs/bench.md).

Pure-core modules (runner, report) import nothing heavy; the contenders are built in
``systems`` and ``scenarios`` only when a run starts.
"""
