"""The queue page: the static files bundled from ``clients/ui`` into the package,
served at ``/ui/`` under a CSP that allows nothing but this origin's own files, and ``/``
sent there. None of it is in the OpenAPI (it is no API), and it needs no token (the page asks
for one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.responses import RedirectResponse, Response
from starlette.staticfiles import StaticFiles

UI_STATIC = Path(__file__).resolve().parent.parent / "ui" / "static"
UI_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class _UiFiles(StaticFiles):
    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(UI_HEADERS)
        return response


def _to_ui() -> RedirectResponse:
    return RedirectResponse("ui/", status_code=307)  # relative: keeps a proxy's path prefix


def mount_ui(app: FastAPI) -> None:
    """Serve the page at ``/ui/``, and send ``/`` and ``/ui`` there."""
    app.add_api_route("/", _to_ui, methods=["GET"], include_in_schema=False)
    app.add_api_route("/ui", _to_ui, methods=["GET"], include_in_schema=False)
    app.mount("/ui", _UiFiles(directory=UI_STATIC, html=True, check_dir=False), name="ui")
