"""npm projects of this repository (``bench/load``, ``clients/typescript``): install each from
its committed ``package-lock.json`` with ``npm ci``, once per lock, and run its scripts.

Used by the benchmarks and the tests alike, so there is one way to find node and npm, one
stamp rule and one error for "node is missing" (which the tests turn into a skip, or into a
failure on CI). Nothing here is part of the ``prompt_outbox`` package.

    ensure_installed(project) -> Path     # the node binary; npm ci when the lock changed
    run_script(project, "build")          # npm run build, with the output kept on failure

A stamp file inside ``node_modules`` holds the lock's hash: a new lock (or a deleted
``node_modules``) installs again, an unchanged one costs a file read. Every step takes an
``flock`` per project, so two test runs on one checkout never run ``npm ci`` over each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAMP = ".prompt-outbox-installed"
INSTALL_TIMEOUT = 300.0


class NpmUnavailable(RuntimeError):
    """node or npm is missing, or an install failed (the message says which, and why)."""


class NpmScriptFailed(RuntimeError):
    """An npm script exited non-zero; ``output`` holds what it printed."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(f"{message}\n{output}")
        self.output = output


def tools() -> tuple[Path, Path]:
    """The node and npm binaries on PATH; NpmUnavailable when either is absent."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing = " and ".join(n for n, p in (("node", node), ("npm", npm)) if p is None)
        raise NpmUnavailable(f"{missing} not found on PATH (install Node.js 20+ with npm)")
    return Path(node), Path(npm)


def lock_hash(project: Path) -> str:
    """The SHA-256 of the project's package-lock.json."""
    return hashlib.sha256((project / "package-lock.json").read_bytes()).hexdigest()


@contextlib.contextmanager
def project_lock(project: Path) -> Iterator[None]:
    """An exclusive flock for one project's node_modules and build output (outside the tree)."""
    digest = hashlib.sha256(str(project.resolve()).encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"prompt-outbox-npm-{digest}.lock"
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _relative(project: Path) -> str:
    try:
        return str(project.resolve().relative_to(ROOT))
    except ValueError:
        return str(project)


def ensure_installed(project: Path, *, quiet: bool = False) -> Path:
    """The node binary, with ``project``'s dependencies installed from its lock (``npm ci``,
    once per lock hash). Raises NpmUnavailable when node or npm is absent or npm ci fails."""
    node, npm = tools()
    stamp = project / "node_modules" / STAMP
    with project_lock(project):
        want = lock_hash(project)
        if stamp.exists() and stamp.read_text().strip() == want:
            return node
        if not quiet:
            print(f"npm ci in {_relative(project)} ...", flush=True)
        done = subprocess.run(
            [str(npm), "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
        )
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-5:])
            raise NpmUnavailable(f"npm ci in {_relative(project)} failed: {tail}")
        stamp.write_text(want + "\n")
    return node


def run_script(
    project: Path, script: str, args: Sequence[str] = (), *, timeout: float = 300.0
) -> str:
    """``npm run <script> -- <args>`` in ``project`` (installed first); its output. Raises
    NpmScriptFailed, with the output, when it exits non-zero."""
    ensure_installed(project)
    _, npm = tools()
    command = [str(npm), "run", "--silent", script]
    if args:
        command += ["--", *args]
    with project_lock(project):
        return _output(command, project, f"npm run {script}", timeout)


def run_bin(project: Path, name: str, args: Sequence[str], *, timeout: float = 300.0) -> str:
    """Run ``node_modules/.bin/<name> <args>`` of ``project`` (installed first); its output.
    Raises NpmScriptFailed, with the output, when it exits non-zero."""
    ensure_installed(project)
    return _output([str(project / "node_modules" / ".bin" / name), *args], project, name, timeout)


def _output(command: list[str], project: Path, what: str, timeout: float) -> str:
    """Run ``command`` in ``project``; its output (stderr too), or NpmScriptFailed with it."""
    done = subprocess.run(
        command,
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise NpmScriptFailed(
            f"{what} in {_relative(project)} exited {done.returncode}", done.stdout
        )
    return done.stdout
