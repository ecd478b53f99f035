"""A process the tests start in a process group of its own, so that what it starts in turn
(an embedded Valkey) goes with it."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any


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
