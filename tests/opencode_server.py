"""Run a real ``opencode serve`` offline for tests: installed from npm once into ``.cache/``,
isolated in its own HOME / XDG dirs, talking to the fake model server on loopback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from prompt_outbox.embedded import free_port
from tests.fake_model import FakeModel
from tests.support.tools import unavailable

VERSION = "1.18.33"
_ROOT = Path(__file__).resolve().parent.parent
_PREFIX = _ROOT / ".cache" / f"opencode-{VERSION}"
_BIN = _PREFIX / "node_modules" / ".bin" / "opencode"
_READY = "opencode server listening on"


def opencode_binary() -> Path:
    """The opencode binary, npm-installed on first use. Skips only where npm is absent
    (never on CI, where this test must run)."""
    if _BIN.exists():
        return _BIN
    npm = shutil.which("npm")
    if npm is None:
        unavailable("npm is not installed: cannot install opencode for its integration test")
    _PREFIX.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            npm,
            "install",
            "--prefix",
            str(_PREFIX),
            "--no-audit",
            "--no-fund",
            "--silent",
            f"opencode-ai@{VERSION}",
        ],
        check=True,
        timeout=600,
    )
    if not _BIN.exists():
        pytest.fail(f"npm install of opencode-ai@{VERSION} left no binary at {_BIN}")
    return _BIN


class OpencodeServer:
    """``opencode serve`` on a fixed loopback port and home, so it can be stopped and started
    again on the same sessions (its SQLite store lives under ``home``)."""

    def __init__(self, home: Path, model_base_url: str) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[str] | None = None
        self._log: list[str] = []
        config = {
            "autoupdate": False,
            "share": "disabled",
            "model": "fake/fake-model",
            "small_model": "fake/fake-model",
            "enabled_providers": ["fake"],
            "lsp": False,
            "formatter": False,
            "provider": {
                "fake": {
                    "npm": "@ai-sdk/openai-compatible",
                    "options": {"baseURL": model_base_url, "apiKey": "dummy"},
                    "models": {
                        "fake-model": {
                            "name": "Fake Model",
                            "limit": {"context": 32000, "output": 4000},
                        }
                    },
                }
            },
        }
        home.mkdir(parents=True, exist_ok=True)
        (home / "opencode.json").write_text(json.dumps(config))

    def _env(self) -> dict[str, str]:
        h = self.home
        env = dict(os.environ)
        env.update(
            HOME=str(h),
            XDG_CONFIG_HOME=str(h / "config"),
            XDG_DATA_HOME=str(h / "data"),
            XDG_CACHE_HOME=str(h / "cache"),
            XDG_STATE_HOME=str(h / "state"),
            OPENCODE_CONFIG=str(h / "opencode.json"),
        )
        for flag in (
            "AUTOUPDATE",
            "MODELS_FETCH",
            "SHARE",
            "LSP_DOWNLOAD",
            "DEFAULT_PLUGINS",
            "CLAUDE_CODE",
            "EXTERNAL_SKILLS",
        ):
            env[f"OPENCODE_DISABLE_{flag}"] = "1"
        env["OPENCODE_PURE"] = "1"
        return env

    def start(self, timeout: float = 120.0) -> None:
        """Start and wait for the listening line (a request sent before it can hang)."""
        proc = subprocess.Popen(
            [str(opencode_binary()), "serve", "--hostname", "127.0.0.1", "--port", str(self.port)],
            env=self._env(),
            cwd=self.home,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._proc = proc
        ready = threading.Event()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self._log.append(line.rstrip())
                if _READY in line:
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout):
            self.stop()
            raise RuntimeError("opencode did not start:\n" + "\n".join(self._log[-30:]))

    def stop(self) -> None:
        """Kill it (opencode may ignore SIGTERM) and wait."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=30)
            self._proc = None

    def new_session(self) -> str:
        # A title up front spares the extra title-generation turn.
        r = httpx.post(f"{self.url}/session", json={"title": "outbox test"}, timeout=30)
        r.raise_for_status()
        return str(r.json()["id"])

    def transcript(self, session_id: str) -> list[dict[str, object]]:
        r = httpx.get(f"{self.url}/session/{session_id}/message", timeout=30)
        r.raise_for_status()
        return list(r.json())


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModel]:
    """The fake model server, one per test module."""
    model = FakeModel()
    yield model
    model.close()


@pytest.fixture(scope="module")
def opencode(
    tmp_path_factory: pytest.TempPathFactory, fake_model: FakeModel
) -> Iterator[OpencodeServer]:
    """A real ``opencode serve`` on the fake model, one per test module (conftest imports both
    fixtures, so every test module can ask for them)."""
    server = OpencodeServer(tmp_path_factory.mktemp("opencode"), fake_model.base_url)
    server.start()
    yield server
    server.stop()
