"""The HTTP API, assembled: the routers, the refusal handlers, and what the routes share.

Errors are JSON ``{"error": code, "detail": ...}``; nothing is half-written. The routes live
in ``prompts`` (a session's), ``workspaces`` (admin) and ``health``; ``errors`` maps every
exception to its status, ``auth`` checks tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from .. import __version__
from ..outbox import Outbox
from . import bulk, health, overview, prompts, tickets, turns, workspaces
from .answers import AnswerBuffers, AnswerLimits
from .auth import TokenTable
from .deadline import Deadline, request_deadline_for
from .errors import EXCEPTION_HANDLERS
from .fast import AcceptFastPath
from .guard import RequestGuard
from .health import DEFAULT_COUNT_INTERVAL, EntryCounts
from .limits import DEFAULT_TOKEN_SHARE, AcceptLimits, RateLimit, Rates, TokenBudgets
from .requestid import RequestID
from .streams import StreamGate, StreamLimits
from .ui import mount_ui


def create_app(
    outbox: Outbox,
    tokens: TokenTable,
    *,
    streams: StreamLimits | None = None,
    answers: AnswerLimits | None = None,
    cors_origins: Sequence[str] = (),
    accept_rate: RateLimit | None = None,
    token_budget_share: float = DEFAULT_TOKEN_SHARE,
    turn_end_rate: RateLimit | None = None,
    count_interval: float = DEFAULT_COUNT_INTERVAL,
    request_deadline: float | None = None,
    api_docs: bool = False,
    webhook_secret: bytes | None = None,
) -> FastAPI:
    """The API over ``outbox``; ``tokens`` decides who may touch which workspace;
    ``streams`` bounds the open event streams (per process, per token), ``answers`` the bytes
    answers hold for their clients (per process, per token: ``answers.py``); ``cors_origins``
    are the origins (``https://app.example``) whose pages may call it from a browser;
    ``accept_rate`` bounds the accepts per second of each token (``RateLimit()``'s defaults
    when None; ``RateLimit(0)`` for none); ``turn_end_rate`` the turn ends per second of each
    token, and of the webhook signer for all signed ends (a bucket apart; the same defaults);
    ``token_budget_share`` the share of Valkey's memory the workspaces of one token may hold
    together (``limits.TokenBudgets``); ``count_interval`` is how often, at most, ``/metrics``
    counts the entries by status (seconds; 0: never); ``request_deadline`` bounds the seconds
    until a request's answer starts, its body included (503 past it, 408 if the body is what
    is late; ``deadline.request_deadline_for``);
    ``api_docs`` serves Swagger UI and ReDoc at ``/docs`` and ``/redoc`` (off by default:
    they load their code from a CDN, onto this origin); ``webhook_secret`` (the webhook
    deliverer's) lets a receiver end its turns by signature (``turns``; None: by token only).
    With a disabled ``tokens`` (no auth), only loopback clients are served (``guard``)."""
    if webhook_secret is not None and not webhook_secret:
        raise ValueError("an empty webhook secret would check nothing")
    deadline = request_deadline_for(outbox.tunables, request_deadline)
    # No trailing-slash redirects: an empty ID ("/prompts/") is a plain 404, not a 307.
    app = FastAPI(
        title="prompt-outbox",
        version=__version__,
        redirect_slashes=False,
        exception_handlers=EXCEPTION_HANDLERS,
        docs_url="/docs" if api_docs else None,
        redoc_url="/redoc" if api_docs else None,
    )
    app.state.outbox = outbox  # the routes reach it through params.get_outbox
    app.state.tokens = tokens  # auth.principal reads it
    app.state.webhook_secret = webhook_secret  # turns.turn_ender checks signed ends with it
    app.state.streams = StreamGate(streams or StreamLimits())  # the events route takes a slot
    # The list and events routes charge what their answers hold.
    app.state.answers = AnswerBuffers(answers or AnswerLimits(), outbox.metrics)
    # Each accept, edit and client's retry: the token's rate and its byte budget.
    app.state.accept_limits = AcceptLimits(
        Rates(accept_rate or RateLimit(), "prompts"),
        TokenBudgets(
            token_budget_share,
            outbox.tunables.workspace_budget_share,
            outbox.tunables.memory_check_interval,
        ),
    )
    app.state.turn_end_rates = Rates(turn_end_rate or RateLimit(), "turn ends")  # an end takes one
    # /metrics: its gauges' counts
    app.state.entry_counts = EntryCounts(outbox.overview.fleet_counts, count_interval)
    routers = (
        prompts.router,
        turns.router,
        bulk.router,
        tickets.router,
        workspaces.router,
        overview.router,
    )
    for router in (*routers, health.router):
        app.include_router(router)
    mount_ui(app)  # the queue page, out of the OpenAPI
    app.add_middleware(AcceptFastPath)  # the hot route, answered before FastAPI routes it
    # Outside the fast path: a refused request reaches nothing; inside CORS, so refusals get
    # its headers.
    app.add_middleware(RequestGuard, loopback_only=tokens.disabled, origins=cors_origins)
    # Over the guard too, which reads a chunked body: a body that never ends is cut (408).
    app.add_middleware(Deadline, seconds=deadline)
    # Over everything but CORS: every answer, a refusal or a cut one too, names its request.
    app.add_middleware(RequestID)
    if cors_origins:  # added last, so outermost: the fast path's answers get the headers too
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            # Bearer tokens, never cookies: no credentials mode.
            allow_headers=[
                "Authorization",
                "Content-Type",
                "Idempotency-Key",
                "Last-Event-ID",
                "X-Request-ID",
            ],
            expose_headers=["Idempotent-Replayed", "Retry-After", "X-Request-ID"],
            max_age=600,
        )
    return app
