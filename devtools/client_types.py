"""The TypeScript client's generated types: ``clients/typescript/openapi.json`` (what
``prompt-outbox openapi`` prints) and ``clients/typescript/src/schema.ts`` (openapi-typescript
over it). Both are committed; ``tests/test_ts_client.py`` holds them equal to what the code
generates now.

    .venv/bin/python -m devtools.client_types     # regenerate both (``make client-types``)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from devtools import npm

CLIENT = npm.ROOT / "clients" / "typescript"
OPENAPI = CLIENT / "openapi.json"
SCHEMA = CLIENT / "src" / "schema.ts"


def prompt_outbox_bin() -> Path:
    """The ``prompt-outbox`` command of the running interpreter's venv."""
    return Path(sys.executable).parent / "prompt-outbox"


def current_openapi() -> str:
    """The OpenAPI document of the code as it is now (``prompt-outbox openapi``)."""
    done = subprocess.run(
        [str(prompt_outbox_bin()), "openapi"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout


def schema_for(openapi: Path) -> str:
    """What openapi-typescript (the client's pinned version) generates for ``openapi``."""
    with tempfile.TemporaryDirectory(prefix="client-types-") as tmp:
        out = Path(tmp, "schema.ts")
        npm.run_bin(CLIENT, "openapi-typescript", [str(openapi), "-o", str(out)])
        return out.read_text()


def regenerate() -> None:
    """Write openapi.json from the code, then src/schema.ts from it (``npm run types``)."""
    OPENAPI.write_text(current_openapi())
    npm.run_script(CLIENT, "types")


def main() -> None:
    regenerate()
    root = npm.ROOT
    print(f"wrote {OPENAPI.relative_to(root)} and {SCHEMA.relative_to(root)}")


if __name__ == "__main__":
    main()
