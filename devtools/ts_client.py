"""Build and test the TypeScript client (``clients/typescript``), for the tests and by hand.

    .venv/bin/python -m devtools.ts_client        # npm ci (once), build, node --test

``ensure_built()`` runs ``npm run build`` (tsc to ``dist/``, a type check of the tests against
the emitted ``.d.ts``, then the esbuild browser bundle ``dist/browser.js``) unless ``dist/`` was
built from exactly the current sources: a stamp in ``dist/`` holds the hash of ``src/``, the
tests, the configs and the lock, so a test run that changed nothing costs no build.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from devtools import npm
from devtools.client_types import CLIENT, prompt_outbox_bin

DIST = CLIENT / "dist"
BUNDLE = DIST / "browser.js"
BUILD_STAMP = DIST / ".built-from"
TEST_TIMEOUT = 180.0


def sources_hash() -> str:
    """The hash of everything the build reads."""
    digest = hashlib.sha256()
    files = sorted((CLIENT / "src").rglob("*.ts")) + sorted((CLIENT / "test").glob("*.mjs"))
    configs = ("tsconfig.json", "tsconfig.test.json", "package.json", "package-lock.json")
    files += [CLIENT / name for name in configs]
    for path in files:
        digest.update(str(path.relative_to(CLIENT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def ensure_built() -> Path:
    """The node binary, with ``dist/`` (the ESM modules, their .d.ts, and the browser bundle)
    built from the current sources. Raises npm.NpmUnavailable or npm.NpmScriptFailed."""
    node = npm.ensure_installed(CLIENT)
    want = sources_hash()
    if (
        BUILD_STAMP.exists()
        and BUILD_STAMP.read_text().strip() == want
        and BUNDLE.exists()
        and (DIST / "index.js").exists()
    ):
        return node
    npm.run_script(CLIENT, "build")
    BUILD_STAMP.write_text(want + "\n")
    return node


@dataclass(frozen=True)
class TestRun:
    returncode: int
    output: str  # node's TAP output, stdout and stderr

    def count(self, name: str) -> int:
        """The summary line ``# <name> N`` (tests, pass, fail, ...), or -1 if absent."""
        for line in self.output.splitlines():
            if line.startswith(f"# {name} "):
                return int(line.split()[-1])
        return -1


def run_tests(node: Path, *, timeout: float = TEST_TIMEOUT) -> TestRun:
    """``node --test`` over ``test/*.test.mjs`` against the built ``dist/``, one file at a
    time, each starting its own ``prompt-outbox serve`` (this venv's, via PROMPT_OUTBOX_BIN)."""
    files = sorted(str(p) for p in (CLIENT / "test").glob("*.test.mjs"))
    done = subprocess.run(
        [str(node), "--test", "--test-concurrency=1", "--test-force-exit", *files],
        cwd=CLIENT,
        env={**os.environ, "PROMPT_OUTBOX_BIN": str(prompt_outbox_bin())},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return TestRun(done.returncode, done.stdout)


def main() -> None:
    run = run_tests(ensure_built())
    print(run.output)
    sys.exit(run.returncode)


if __name__ == "__main__":
    main()
