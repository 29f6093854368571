"""Signed ``.whpkg`` packages (``docs/packages.md``).

Pure: no engine. ``names`` says which archive paths are acceptable, ``contents`` holds the
content record, ``archive`` reads and writes the bounded zip, ``trust`` parses keys and the
trusted-publishers file, ``signing`` signs and verifies. ``files`` is the only module here
that touches the file system (packing a directory, writing key files).
"""
