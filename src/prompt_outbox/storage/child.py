"""How the embedded valkey-server lives beside the process that starts it.

A stop signal sent to a process group (Ctrl-C in a terminal, a shell's ``kill %1``) would
reach the server at the same moment as its owner, and the server would exit while the owner
still finishes the send in flight, whose outcome then could not be written (it would be
verified, or parked as unverifiable, after its lease lapsed). So the server leads a process
group of its own: the owner finishes its step, then stops the server itself (SIGTERM, a clean
shutdown).

Where the owner dies without stopping it (SIGKILL, a crash), the kernel SIGKILLs the server
too (Linux's parent-death signal), as when the two shared a group: every acknowledged write is
already on disk (``appendfsync always``), and no stray server is left holding the data dir.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def dies_with_this_process() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child SIGKILLed when this process dies, or None where
    the OS has no such signal (the child then outlives a killed owner, and the next start
    takes it over: embedded.EmbeddedValkey).

    The signal follows the *thread* that forks: call from one that lives as long as the
    child (the CLI starts its server from the main thread). The C function is looked up here,
    before the fork: the child only calls it, and allocates nothing."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    owner = os.getpid()

    def tie() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != owner:  # the owner died before the tie was made
            os._exit(1)

    return tie
