"""Build the queue page (``clients/ui``) into ``src/prompt_outbox/ui/static/``, the files
``serve`` answers at ``/ui/``. The bundle is committed; ``tests/test_ui.py`` rebuilds it into
a temporary directory and holds the committed files equal to it, byte for byte.

    .venv/bin/python -m devtools.ui        # npm ci (once per lock), type check, bundle (make ui)

The page imports the TypeScript client from its sources (``clients/typescript/src``), and
esbuild resolves the client's one runtime dependency, eventsource-parser, from that project's
``node_modules``: both projects are installed from their locks first.
"""

from __future__ import annotations

from pathlib import Path

from devtools import npm
from devtools.client_types import CLIENT

UI = npm.ROOT / "clients" / "ui"
STATIC = npm.ROOT / "src" / "prompt_outbox" / "ui" / "static"
FILES = ("index.html", "app.js", "app.css")


def build(out: Path = STATIC) -> Path:
    """Type-check the page and bundle it into ``out``; the node binary. Raises
    npm.NpmUnavailable (node, npm or an install missing) or npm.NpmScriptFailed."""
    npm.ensure_installed(CLIENT)
    node = npm.ensure_installed(UI)
    npm.run_script(UI, "build", [str(out.resolve())])
    return node


def main() -> None:
    build()
    for name in FILES:
        path = STATIC / name
        print(f"wrote {path.relative_to(npm.ROOT)} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
