"""A process the tests start in a process group of its own, so that what it starts in turn
(an agent) goes with it, and the wait for a process or a group to be gone. (An embedded
Valkey leads a group of its own, and dies with the process that started it.)"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from tests.support import waiting


@contextmanager
def process_group(
    argv: list[str],
    env: dict[str, str],
    stdout: IO[Any] | int | None = None,
    stderr: IO[Any] | int | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` leading a new process group; on the way out the whole group is killed
    (SIGKILL) if the leader still runs, and the leader waited for."""
    proc = subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def gone(pid: int, *, group: bool = False, within: float = 20.0) -> bool:
    """Whether process ``pid`` (with ``group``: every process of the group it leads) has
    exited, waiting up to ``within`` seconds."""
    probe = os.killpg if group else os.kill

    def exited() -> bool:
        try:
            probe(pid, 0)
        except ProcessLookupError:
            return True
        return False

    return waiting.within(exited, within, interval=0.02)
