"""Every bound the WASI profile enforces, one named constant each, with the reason for it.

Per-call limits keep one host call's memory and time bounded: the engine charges fuel for the
bytes a call moved only after the call returns, so a call must not be able to do unbounded work
first.
"""

from __future__ import annotations

from typing import Final

KiB: Final = 1024
MiB: Final = 1024 * KiB
GiB: Final = 1024 * MiB

# Linux's IOV_MAX; POSIX readv/writev refuse more with EINVAL, and so do we.
MAX_IOVECS: Final = 1024
# One fd_read/fd_write/fd_pread/fd_pwrite moves at most this much; POSIX allows short reads and
# writes and every libc loops, so a bigger request just takes more calls.
MAX_IO_BYTES_PER_CALL: Final = 1 * MiB
# random_get has no short-read semantics; keys and seeds are bytes, 1 MiB is far beyond them.
MAX_RANDOM_BYTES_PER_CALL: Final = 1 * MiB
# Linux's PATH_MAX: no real program needs a longer path, and we copy paths into the host.
MAX_PATH_BYTES: Final = 4096
# Linux's NAME_MAX for one path component.
MAX_NAME_BYTES: Final = 255
# Linux's MAXSYMLINKS: chained symlinks beyond this answer LOOP, as on the host.
MAX_SYMLINK_FOLLOWS: Final = 40
# Components one resolution may walk, symlink targets included (LOOP beyond): without it 40 long
# targets could make one cheap call walk ~80,000 components.
MAX_WALK_STEPS: Final = 4096
# Subscriptions per poll_oneoff; each is 48 bytes read from the guest and one entry to wait on.
MAX_POLL_SUBSCRIPTIONS: Final = 1024
# Entries fd_readdir snapshots from one directory: bounds the host memory of one listing.
MAX_DIR_ENTRIES: Final = 100_000
# Entries of every snapshot one instance holds at once (each open directory descriptor keeps its
# own): two whole directories of the size above, at most ~80 MB with the longest names. Without
# it 250 descriptors on one big directory held 250 snapshots (gigabytes).
MAX_LISTED_ENTRIES: Final = 2 * MAX_DIR_ENTRIES
# A file in a read-write mount cannot grow past this through the guest (writes, set_size,
# allocate answer FBIG): a guest must not fill the host's disk within its time budget.
MAX_FILE_BYTES: Final = 1 * GiB
# What one instance may add to its writable mounts (WasiOptions.max_write_bytes): growth of
# files past their end (holes of sparse writes and of set_size/allocate included) and
# NEW_ENTRY_BYTES for each file, directory or link it makes; DQUOT beyond. The per-file limit
# alone let a guest make any number of files of 1 GiB (sparse ones for a few hundred fuel each).
DEFAULT_MAX_WRITE_BYTES: Final = 1 * GiB
# A budget beyond a pebibyte is a typo, not a policy (as the files broker's quota).
MAX_MAX_WRITE_BYTES: Final = 1 << 50
# What making a file, directory or link counts against it: a block and an inode, so a flood of
# empty files is bounded too (262,144 of them by default).
NEW_ENTRY_BYTES: Final = 4 * KiB

# Descriptors of one instance (stdio and preopens included): every open file or directory is a
# host file descriptor. An embedder's process shares its RLIMIT_NOFILE (1024 soft by default on
# Linux) among all its instances and its own files, so an instance gets a quarter of it: 64 let
# a program open 59 files where wasmtime's built-in WASI opened 200.
DEFAULT_MAX_FDS: Final = 256
# `wasihost wasi` runs one program in its own process: it gets what a native program gets, the
# default soft RLIMIT_NOFILE (the CLI raises the process's soft limit to fit, see cli.py).
DEFAULT_COMMAND_MAX_FDS: Final = 1024
# Stdio (3) plus at least one preopen and one open file.
MIN_MAX_FDS: Final = 5
# A common hard RLIMIT_NOFILE (systemd's default is 524,288; 65,536 is usual for servers):
# more is a typo, not a need. Numbers are handed out lowest-free from a heap, so a full table
# costs no scan.
MAX_MAX_FDS: Final = 65_536
# Descriptors the CLI keeps for the host beside the guest's (the interpreter, the module cache,
# its compile worker): the process's soft limit is raised to the guest's budget plus these.
HOST_RESERVED_FDS: Final = 64
# Mounts of one config: each is a preopen descriptor counted against the budget above.
MAX_MOUNTS: Final = 32

# argv and the environment are copied into the guest at every start; Linux's ARG_MAX-ish
# budget for both together would be 2 MiB, a sandboxed guest needs far less.
MAX_ARGS_BYTES: Final = 64 * KiB
MAX_ENV_BYTES: Final = 64 * KiB
# Stdin is served from a host buffer held for the instance's lifetime.
MAX_STDIN_BYTES: Final = 16 * MiB
# A stdout/stderr line longer than this is split into several log records, so one record never
# holds more than a screenful and a newline-free flood is still bounded per record.
MAX_LOG_LINE_BYTES: Final = 4 * KiB

# Resolution of the "anonymous" clock profile: one second says what time it is and is useless
# for timing side channels.
ANONYMOUS_CLOCK_RESOLUTION_NS: Final = 1_000_000_000
# File timestamps the guest set itself (fd/path_filestat_set_times) that one instance remembers,
# to report them exactly while the kernel's own stamps are coarsened to the clock profile: a
# record is ~200 bytes, and a guest setting the times of more files only loses their precision.
MAX_GUEST_SET_TIMES: Final = 4096
