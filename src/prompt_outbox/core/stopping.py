"""Whether this process has begun its own stop: ``serve`` or ``worker`` got SIGTERM or SIGINT.

A stop signal sent to the process group (Ctrl-C, a shell's ``kill %1``, systemd's stop)
reaches the embedded valkey-server too, which exits while the process is still closing: the
connections it drops then are part of the stop, not a fault, and are logged below WARNING.
"""

from __future__ import annotations

import logging
import threading

_STOPPING = threading.Event()  # set once, never cleared: a process does not un-stop


def begin_stop() -> None:
    """Mark the process as stopping (the CLI's signal handler calls it first)."""
    _STOPPING.set()


def stopping() -> bool:
    """Whether :func:`begin_stop` was called: a lost Valkey connection is then expected."""
    return _STOPPING.is_set()


def loss_level(closing: bool = False) -> int:
    """The level to log a lost Valkey connection at: INFO while its owner is ``closing`` or
    the process stops (expected), WARNING otherwise (a real loss)."""
    return logging.INFO if closing or stopping() else logging.WARNING
