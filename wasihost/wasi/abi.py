"""The binary vocabulary of wasi_snapshot_preview1: flag bits, enum values, record layouts.

Numbers are the spec's (witx of preview1); record layouts are little-endian with the C
alignment the spec gives each field, so each ``struct.Struct`` below spells its padding.
"""

from __future__ import annotations

import enum
import struct
from typing import Final


class Filetype(enum.IntEnum):
    UNKNOWN = 0
    BLOCK_DEVICE = 1
    CHARACTER_DEVICE = 2
    DIRECTORY = 3
    REGULAR_FILE = 4
    SOCKET_DGRAM = 5
    SOCKET_STREAM = 6
    SYMBOLIC_LINK = 7


class Clock(enum.IntEnum):
    REALTIME = 0
    MONOTONIC = 1
    PROCESS_CPUTIME = 2
    THREAD_CPUTIME = 3


class Whence(enum.IntEnum):
    SET = 0
    CUR = 1
    END = 2


class EventType(enum.IntEnum):
    CLOCK = 0
    FD_READ = 1
    FD_WRITE = 2


class Right(enum.IntFlag):
    FD_DATASYNC = 1 << 0
    FD_READ = 1 << 1
    FD_SEEK = 1 << 2
    FD_FDSTAT_SET_FLAGS = 1 << 3
    FD_SYNC = 1 << 4
    FD_TELL = 1 << 5
    FD_WRITE = 1 << 6
    FD_ADVISE = 1 << 7
    FD_ALLOCATE = 1 << 8
    PATH_CREATE_DIRECTORY = 1 << 9
    PATH_CREATE_FILE = 1 << 10
    PATH_LINK_SOURCE = 1 << 11
    PATH_LINK_TARGET = 1 << 12
    PATH_OPEN = 1 << 13
    FD_READDIR = 1 << 14
    PATH_READLINK = 1 << 15
    PATH_RENAME_SOURCE = 1 << 16
    PATH_RENAME_TARGET = 1 << 17
    PATH_FILESTAT_GET = 1 << 18
    PATH_FILESTAT_SET_SIZE = 1 << 19
    PATH_FILESTAT_SET_TIMES = 1 << 20
    FD_FILESTAT_GET = 1 << 21
    FD_FILESTAT_SET_SIZE = 1 << 22
    FD_FILESTAT_SET_TIMES = 1 << 23
    PATH_SYMLINK = 1 << 24
    PATH_REMOVE_DIRECTORY = 1 << 25
    PATH_UNLINK_FILE = 1 << 26
    POLL_FD_READWRITE = 1 << 27
    SOCK_SHUTDOWN = 1 << 28
    SOCK_ACCEPT = 1 << 29


ALL_RIGHTS: Final = (1 << 30) - 1

# Plain ints for the hot paths: IntFlag arithmetic allocates a new enum member per operation.
R_FD_READ: Final = int(Right.FD_READ)
R_FD_WRITE: Final = int(Right.FD_WRITE)

# What a descriptor of each kind can ever do; a descriptor's rights are always within these.
FILE_READ_RIGHTS: Final = int(
    Right.FD_READ
    | Right.FD_SYNC
    | Right.FD_DATASYNC
    | Right.FD_SEEK
    | Right.FD_TELL
    | Right.FD_FDSTAT_SET_FLAGS
    | Right.FD_ADVISE
    | Right.FD_FILESTAT_GET
    | Right.POLL_FD_READWRITE
)
FILE_WRITE_RIGHTS: Final = int(
    Right.FD_WRITE | Right.FD_ALLOCATE | Right.FD_FILESTAT_SET_SIZE | Right.FD_FILESTAT_SET_TIMES
)
# What a directory can do. The read half and the write half together are wasmtime's directory
# rights (129498624) plus PATH_FILESTAT_SET_SIZE, the right the spec names as the gate of
# path_open's O_TRUNC. Sync and flag rights are file rights: a directory only passes them on.
DIR_READ_RIGHTS: Final = int(
    Right.PATH_OPEN
    | Right.FD_READDIR
    | Right.PATH_READLINK
    | Right.PATH_FILESTAT_GET
    | Right.FD_FILESTAT_GET
)
DIR_WRITE_RIGHTS: Final = int(
    Right.PATH_CREATE_DIRECTORY
    | Right.PATH_CREATE_FILE
    | Right.PATH_LINK_SOURCE
    | Right.PATH_LINK_TARGET
    | Right.PATH_RENAME_SOURCE
    | Right.PATH_RENAME_TARGET
    | Right.PATH_FILESTAT_SET_SIZE
    | Right.PATH_FILESTAT_SET_TIMES
    | Right.FD_FILESTAT_SET_TIMES
    | Right.PATH_SYMLINK
    | Right.PATH_REMOVE_DIRECTORY
    | Right.PATH_UNLINK_FILE
)
# Rights whose presence in path_open's request means "open for writing": each gates a call that
# needs a host descriptor open for writing (write, ftruncate, fallocate). FD_DATASYNC is not
# one: fdatasync works on a read-only descriptor, and a directory (whose rights a guest may pass
# back to path_open unchanged) can never be opened for writing.
WRITE_ACCESS_RIGHTS: Final = int(Right.FD_WRITE | Right.FD_ALLOCATE | Right.FD_FILESTAT_SET_SIZE)
# Rights a descriptor opened without write access cannot have: the host descriptor refuses them.
NEEDS_WRITE_ACCESS: Final = WRITE_ACCESS_RIGHTS
STDIN_RIGHTS: Final = int(
    Right.FD_READ | Right.POLL_FD_READWRITE | Right.FD_FILESTAT_GET | Right.FD_FDSTAT_SET_FLAGS
)
STDOUT_RIGHTS: Final = int(
    Right.FD_WRITE | Right.POLL_FD_READWRITE | Right.FD_FILESTAT_GET | Right.FD_FDSTAT_SET_FLAGS
)

# fdflags
FDFLAG_APPEND: Final = 1 << 0
FDFLAG_DSYNC: Final = 1 << 1
FDFLAG_NONBLOCK: Final = 1 << 2
FDFLAG_RSYNC: Final = 1 << 3
FDFLAG_SYNC: Final = 1 << 4
ALL_FDFLAGS: Final = (1 << 5) - 1

# oflags
OFLAG_CREAT: Final = 1 << 0
OFLAG_DIRECTORY: Final = 1 << 1
OFLAG_EXCL: Final = 1 << 2
OFLAG_TRUNC: Final = 1 << 3
ALL_OFLAGS: Final = (1 << 4) - 1

# lookupflags
LOOKUP_SYMLINK_FOLLOW: Final = 1 << 0

# fstflags
FST_ATIM: Final = 1 << 0
FST_ATIM_NOW: Final = 1 << 1
FST_MTIM: Final = 1 << 2
FST_MTIM_NOW: Final = 1 << 3
ALL_FSTFLAGS: Final = (1 << 4) - 1

# subclockflags
SUBCLOCK_ABSTIME: Final = 1 << 0

# advice: NORMAL .. NOREUSE
MAX_ADVICE: Final = 5

PREOPENTYPE_DIR: Final = 0

# Records. "<" is little-endian without implicit padding; "x" spells each pad byte.
IOVEC: Final = struct.Struct("<II")  # buf, buf_len
# fs_filetype u8, pad, fs_flags u16, pad to 8, fs_rights_base u64, fs_rights_inheriting u64
FDSTAT: Final = struct.Struct("<BxHxxxxQQ")
# dev, ino, filetype u8 + 7 pad, nlink, size, atim, mtim, ctim
FILESTAT: Final = struct.Struct("<QQB7xQQQQQ")
# tag u8 + 3 pad, pr_name_len u32
PRESTAT: Final = struct.Struct("<BxxxI")
# d_next u64, d_ino u64, d_namlen u32, d_type u8 + 3 pad
DIRENT: Final = struct.Struct("<QQIB3x")
# Subscription: userdata u64, tag u8 + 7 pad, then the union (32 bytes) at offset 16.
SUBSCRIPTION_SIZE: Final = 48
SUB_HEAD: Final = struct.Struct("<QB7x")
# subscription_clock: id u32 + 4 pad, timeout u64, precision u64, flags u16 (+ 6 pad)
SUB_CLOCK: Final = struct.Struct("<I4xQQH")
SUB_FD: Final = struct.Struct("<I")
# Event: userdata u64, error u16, type u8 + 5 pad, fd_readwrite { nbytes u64, flags u16 + 6 pad }
EVENT: Final = struct.Struct("<QHB5xQH6x")

assert FDSTAT.size == 24
assert FILESTAT.size == 64
assert PRESTAT.size == 8
assert DIRENT.size == 24
assert EVENT.size == 32
assert SUB_HEAD.size + SUB_CLOCK.size <= SUBSCRIPTION_SIZE
