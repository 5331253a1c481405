"""Kernel notification of writes to a SQLite database's WAL file: how a
waiting ``SQLiteTransport`` learns of another process's commit without
polling (its watcher, ``waiting.Watcher``, is the only user).

In WAL mode every commit appends frames to ``<database>-wal`` with
``write()`` (a checkpoint that resets the WAL rewrites it from its start; a
``wal_checkpoint(TRUNCATE)`` truncates it: both are writes too).  So "the
WAL file was written" is a superset of "another connection committed": the
watcher sleeps in the kernel until the WAL is written (or a kick, or its own
timeout), then asks SQLite (``PRAGMA data_version``) whether anything was
committed.

* **Linux: inotify**, through ``ctypes`` on the C library (three calls:
  ``inotify_init1``, ``inotify_add_watch``, ``inotify_rm_watch``).  Not a
  package: the maintained ones (``inotify_simple``, ``pyinotify``,
  ``watchdog``) are wrappers of the same three calls or far more than this
  needs; a dependency of a dependency-free package for 60 lines is not worth
  it, and ``ctypes`` is in the standard library.  The WAL file is watched
  for ``IN_MODIFY`` (and for being removed, renamed or re-linked); while it
  does not exist (a new database no connection has read yet, or a WAL
  deleted when the last connection closed), its directory is watched for the
  WAL's creation (``IN_CREATE``/``IN_MOVED_TO`` of that one name), and the
  WAL is watched as soon as it exists.
* **macOS and the BSDs: kqueue**, ``KQ_FILTER_VNODE`` on a descriptor of
  the WAL file (``NOTE_WRITE``/``NOTE_EXTEND``/``NOTE_ATTRIB``, and
  ``NOTE_DELETE``/``NOTE_RENAME``/``NOTE_REVOKE``: the WAL is gone and is
  looked for again), and ``NOTE_WRITE`` on the directory while the WAL does
  not exist.  The descriptor is opened read-only (``O_EVTONLY`` on macOS):
  closing it cannot drop SQLite's POSIX locks, which are on the database
  file and the ``-shm`` file, never on the WAL.

``open_watch(path, mechanism)`` raises ``OSError`` when the mechanism is
unavailable or fails; the watcher then falls back to its bounded poll (and
says so, once).  ``LEASEQUEUE_SQLITE_WATCH`` chooses: ``auto`` (the
default: inotify on Linux, kqueue where ``select.kqueue`` exists, else the
poll), ``poll`` (force the fallback: for tests, or a filesystem whose writes
the kernel does not report), ``inotify`` or ``kqueue``.

Every arming is done *before* the caller's next ``PRAGMA data_version``:
a commit after the arming is reported, one before it is seen by that read.
A watch belongs to the process that opened it: in a child after ``fork()``
``wait`` returns at once and ``forget()`` closes the inherited descriptors.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import math
import os
import select
import struct
import sys
import threading
from typing import Any, List, Optional

__all__ = ["ENV", "FileWatch", "choose_mechanism", "open_watch"]

#: The environment variable that chooses the mechanism (see the module docstring).
ENV = "LEASEQUEUE_SQLITE_WATCH"
MECHANISMS = ("auto", "poll", "inotify", "kqueue")


def choose_mechanism() -> str:
    """``inotify``, ``kqueue`` or ``poll``: what ``LEASEQUEUE_SQLITE_WATCH``
    asks for, or (``auto``) what this platform has.  ValueError on an unknown name."""
    wanted = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if wanted not in MECHANISMS:
        raise ValueError(f"{ENV}={wanted!r}: expected one of {', '.join(MECHANISMS)}")
    if wanted != "auto":
        return wanted
    if sys.platform.startswith("linux"):
        return "inotify"
    if hasattr(select, "kqueue"):
        return "kqueue"
    return "poll"


class FileWatch:
    """One armed watch on one database's WAL file (and a way to interrupt it)."""

    mechanism = "?"

    def __init__(self, db_path: str) -> None:
        self._pid = os.getpid()
        # SQLite names the WAL after the database's real path (symlinks
        # resolved; older versions: the path as given): the one that exists.
        real, given = os.path.realpath(db_path) + "-wal", os.path.abspath(db_path) + "-wal"
        self.wal = given if given != real and not os.path.exists(real) and os.path.exists(given) else real
        self.directory, name = os.path.split(self.wal)
        self._name = os.fsencode(name)
        self._lock = threading.Lock()  # kick() against close(): never write to a reused fd
        self._closed = False
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def wait(self, timeout: Optional[float]) -> bool:
        """Sleep until the WAL may have been written (True), or a kick or the
        timeout (seconds; None: none) (False).  Keeps itself armed."""
        raise NotImplementedError

    def kick(self) -> None:
        """Make the current (or next) ``wait`` return at once.  Any thread."""
        with self._lock:
            if self._closed or os.getpid() != self._pid:
                return
            try:
                os.write(self._w, b"k")
            except (BlockingIOError, OSError):  # full: a kick is pending anyway
                pass

    def close(self) -> None:
        """Remove the watch and close its descriptors (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in self._fds():
                try:
                    os.close(fd)
                except OSError:
                    pass

    def forget(self) -> None:
        """In a child after fork(): close the inherited descriptors, take no lock."""
        self._closed = True
        for fd in self._fds():
            try:
                os.close(fd)
            except OSError:
                pass

    def _fds(self) -> List[int]:
        return [self._r, self._w]

    def _drain_kicks(self) -> None:
        try:
            while os.read(self._r, 512):
                pass
        except (BlockingIOError, OSError):
            pass


# ------------------------------------------------------------------ inotify

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
_WAL_MASK = IN_MODIFY | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF
_DIR_MASK = IN_CREATE | IN_MOVED_TO | IN_ONLYDIR
_GONE = IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)

_libc: Any = None


def _load_libc() -> Any:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        for name, args in (("inotify_init1", [ctypes.c_int]),
                           ("inotify_add_watch", [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]),
                           ("inotify_rm_watch", [ctypes.c_int, ctypes.c_int])):
            fn = getattr(libc, name)  # AttributeError: no inotify in this C library
            fn.argtypes = args
            fn.restype = ctypes.c_int
        _libc = libc
    return _libc


def _errno_error(what: str, path: str = "") -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}", path or None)


class InotifyWatch(FileWatch):
    """inotify (Linux): see the module docstring."""

    mechanism = "inotify"

    def __init__(self, db_path: str) -> None:
        try:
            libc = _load_libc()
        except (OSError, AttributeError) as exc:
            raise OSError(errno.ENOSYS, f"no inotify in the C library ({exc})") from exc
        super().__init__(db_path)
        self._libc = libc
        self._fd = -1
        try:
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                raise _errno_error("inotify_init1")
            self._fd = fd
            self._poll = select.poll()
            self._poll.register(fd, select.POLLIN)
            self._poll.register(self._r, select.POLLIN)
            self._wal_wd: Optional[int] = None
            self._dir_wd: Optional[int] = None
            self._arm()
        except BaseException:
            self.close()
            raise

    def _fds(self) -> List[int]:
        return super()._fds() + ([self._fd] if self._fd >= 0 else [])

    def _add(self, path: str, mask: int) -> int:
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), mask)
        if wd < 0:
            raise _errno_error("inotify_add_watch", path)
        return wd

    def _arm(self) -> None:
        """The WAL is not watched: watch the directory for its creation, then
        the WAL itself if it exists (and then no longer the directory)."""
        if self._dir_wd is None:
            self._dir_wd = self._add(self.directory, _DIR_MASK)
        try:
            self._wal_wd = self._add(self.wal, _WAL_MASK)
        except FileNotFoundError:
            return
        self._libc.inotify_rm_watch(self._fd, self._dir_wd)  # its IN_IGNORED is skipped by wd
        self._dir_wd = None

    def wait(self, timeout: Optional[float]) -> bool:
        if self._closed or os.getpid() != self._pid:
            return False
        ms = None if timeout is None else max(0, math.ceil(timeout * 1000.0))
        try:
            ready = self._poll.poll(ms)
        except InterruptedError:  # pragma: no cover - PEP 475 retries; a handler that raised propagates
            return False
        written = False
        for fd, _ in ready:
            if fd == self._fd:
                written = self._read() or written
            else:
                self._drain_kicks()
        return written

    def _read(self) -> bool:
        written = False
        while True:
            try:
                buf = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return written
            if not buf:
                return written
            offset = 0
            rearm = False
            while offset + _EVENT.size <= len(buf):
                wd, mask, _cookie, length = _EVENT.unpack_from(buf, offset)
                name = buf[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    written = True  # events were lost: look
                elif wd == self._wal_wd:
                    written = True
                    if mask & _GONE:
                        # Deleted, renamed or re-linked: the name may be a new file.
                        if not mask & IN_IGNORED:
                            self._libc.inotify_rm_watch(self._fd, wd)
                        self._wal_wd = None
                        rearm = True
                elif wd == self._dir_wd and name == self._name:
                    written = True  # the WAL was created: watch it
                    rearm = True
            if rearm and self._wal_wd is None:
                self._arm()


# ------------------------------------------------------------------- kqueue

_sel: Any = select  # its kqueue names exist on macOS and the BSDs only (typeshed knows)


class KqueueWatch(FileWatch):
    """kqueue (macOS, the BSDs): see the module docstring."""

    mechanism = "kqueue"

    def __init__(self, db_path: str) -> None:
        if not hasattr(select, "kqueue"):
            raise OSError(errno.ENOSYS, "no _sel.kqueue on this platform")
        super().__init__(db_path)
        self._kq: Any = None
        self._wal_fd = -1
        self._dir_fd = -1
        try:
            self._kq = _sel.kqueue()
            self._kq.control([_sel.kevent(self._r, _sel.KQ_FILTER_READ, _sel.KQ_EV_ADD)], 0)
            self._arm()
        except BaseException:
            self.close()
            raise

    def _fds(self) -> List[int]:
        # The descriptors a child inherits (forget()); a kqueue is not inherited.
        return super()._fds() + [fd for fd in (self._wal_fd, self._dir_fd) if fd >= 0]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            kq, self._kq = self._kq, None
            for fd in [self._r, self._w, self._wal_fd, self._dir_fd]:
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            if kq is not None:
                kq.close()

    def _open(self, path: str) -> int:
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        flags |= getattr(os, "O_EVTONLY", 0x8000 if sys.platform == "darwin" else 0)
        return os.open(path, flags)

    def _arm(self) -> None:
        """As InotifyWatch._arm: the directory while the WAL does not exist."""
        vnode, add = _sel.KQ_FILTER_VNODE, _sel.KQ_EV_ADD | _sel.KQ_EV_CLEAR
        if self._dir_fd < 0:
            self._dir_fd = self._open(self.directory)
            self._kq.control([_sel.kevent(self._dir_fd, vnode, add, _sel.KQ_NOTE_WRITE)], 0)
        try:
            fd = self._open(self.wal)
        except FileNotFoundError:
            return
        self._wal_fd = fd
        fflags = (_sel.KQ_NOTE_WRITE | _sel.KQ_NOTE_EXTEND | _sel.KQ_NOTE_ATTRIB | _sel.KQ_NOTE_DELETE
                  | _sel.KQ_NOTE_RENAME | _sel.KQ_NOTE_REVOKE)
        self._kq.control([_sel.kevent(fd, vnode, add, fflags)], 0)
        os.close(self._dir_fd)  # closing a descriptor removes its kevents
        self._dir_fd = -1

    def wait(self, timeout: Optional[float]) -> bool:
        if self._closed or os.getpid() != self._pid:
            return False
        events = self._kq.control(None, 8, timeout)
        written = False
        rearm = False
        gone = _sel.KQ_NOTE_DELETE | _sel.KQ_NOTE_RENAME | _sel.KQ_NOTE_REVOKE
        for ev in events:
            if ev.ident == self._r:
                self._drain_kicks()
            elif ev.ident == self._wal_fd:
                written = True
                if ev.fflags & gone:
                    os.close(self._wal_fd)
                    self._wal_fd = -1
                    rearm = True
            elif ev.ident == self._dir_fd:
                written = rearm = True  # an entry changed: maybe the WAL appeared
        if rearm and self._wal_fd < 0:
            self._arm()
        return written


def open_watch(db_path: str, mechanism: str) -> FileWatch:
    """An armed watch on ``db_path``'s WAL (``inotify`` or ``kqueue``); OSError if unavailable."""
    if mechanism == "inotify":
        return InotifyWatch(db_path)
    if mechanism == "kqueue":
        return KqueueWatch(db_path)
    raise OSError(errno.ENOSYS, f"no file watch mechanism {mechanism!r}")
