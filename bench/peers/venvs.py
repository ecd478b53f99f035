"""A venv of its own for each peer, under ``.cache/bench-peers/<peer>-<version>/``.

The peers cannot share one: arq 0.28 asks for ``redis<6``, BullMQ's package for
``redis>=6.2``, SAQ for ``redis<8``, and streaq runs on coredis. Each venv holds exactly its
pinned requirements (``bench/peers/requirements/<peer>.txt``) and is rebuilt only when that
file changes (a stamp inside the venv keeps its hash). Where pip cannot install (no package
registry), the peer is skipped with the reason; on CI (``CI`` set) that fails instead, as the
opencode integration test does (tests/opencode_server.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.peers.systems import System

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "bench-peers"
STAMP = ".installed"


class PeerUnavailable(RuntimeError):
    """The peer's venv could not be built here (the message says why): skip the peer."""


def venv_dir(system: System) -> Path:
    return CACHE / f"{system.name}-{system.version}"


def _wanted_stamp(system: System) -> str:
    # The interpreter too: a venv built by another Python would not run.
    assert system.requirements is not None
    text = system.requirements.read_bytes() + sys.version.encode()
    return hashlib.sha256(text).hexdigest()


def ready(system: System) -> Path | None:
    """The venv's python if the venv is built for the current pins, else None (no install)."""
    folder = venv_dir(system)
    stamp = folder / STAMP
    if stamp.exists() and stamp.read_text().strip() == _wanted_stamp(system):
        return folder / "bin" / "python"
    return None


def ensure(system: System) -> Path:
    """The python of the system's venv, built first if it is missing or its pins changed.

    Ours runs in the project's own .venv (this interpreter). Raises PeerUnavailable when pip
    cannot install the pins (RuntimeError on CI, where every peer must run)."""
    if system.requirements is None:
        return Path(sys.executable)
    python = ready(system)
    if python is not None:
        return python
    folder = venv_dir(system)
    shutil.rmtree(folder, ignore_errors=True)  # stale pins: start from an empty venv
    print(f"installing {system.name} into {folder} ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=300)
    python = folder / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    done = subprocess.run(
        [*pip, "-r", str(system.requirements)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        message = f"pip could not install {system.requirements.name}: {tail}"
        if os.environ.get("CI"):
            raise RuntimeError(f"{message} (on CI every peer must install)")
        raise PeerUnavailable(message)
    (folder / STAMP).write_text(_wanted_stamp(system) + "\n")
    return python
