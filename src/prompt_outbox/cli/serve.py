"""``serve`` (the HTTP API and the delivery workers in one process) and ``worker`` (delivery
only, for extra replicas)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import uvicorn

from ..api import RateLimit, StreamLimits, TokenTable, create_app
from ..api.guard import is_loopback_host
from ..api.health import DEFAULT_COUNT_INTERVAL
from ..api.limits import DEFAULT_BURST, DEFAULT_RATE, DEFAULT_TOKEN_SHARE
from ..api.streams import DEFAULT_PER_PROCESS, DEFAULT_PER_TOKEN
from ..outbox import Outbox
from ..storage.connect import connect
from ..storage.feed import MIB, FeedLimits
from .delivery import Delivery, build_delivery, delivery_options
from .heads import (
    CONNECTIONS_BEYOND_STREAMS,
    HEAD_TIMEOUT,
    MAX_HEAD_BYTES,
    Edge,
    capped_protocol,
    raise_open_files,
)
from .runner import HTTP_PARSERS, LOOPS, Server, on_signals, run_on
from .stalls import Readers, reader_options
from .storage import Durability, durability_options, open_outbox, storage_options
from .tokens import exposure

log = logging.getLogger("prompt_outbox.cli")


_ORIGIN = re.compile(r"https?://[^/\s]+")  # what a browser sends as Origin: no path
F = TypeVar("F", bound=Callable[..., Any])


@contextlib.asynccontextmanager
async def delivering(outbox: Outbox, delivery: Delivery | None) -> AsyncIterator[None]:
    """Run the workers for the block; on the way out they finish what is in flight."""
    if delivery is None:
        log.warning("no deliverer configured: prompts are accepted and wait in the outbox")
        yield
        return
    outbox.set_verifier(delivery.verifier)
    try:
        async with outbox.running(delivery.deliverer):
            yield
    finally:
        await delivery.aclose()


async def run_api(
    outbox: Outbox,
    tokens: TokenTable,
    host: str,
    port: int,
    streams: StreamLimits,
    *,
    http: str = "auto",
    access_log: bool = False,
    cors_origins: tuple[str, ...] = (),
    accept_rate: RateLimit | None = None,
    token_budget_share: float = DEFAULT_TOKEN_SHARE,
    turn_end_rate: RateLimit | None = None,
    count_interval: float = DEFAULT_COUNT_INTERVAL,
    request_deadline: float | None = None,
    api_docs: bool = False,
    head_timeout: float = HEAD_TIMEOUT,
    max_connections: int | None = None,
    readers: Readers | None = None,
    webhook_secret: bytes | None = None,
) -> None:
    """Serve the API until SIGINT / SIGTERM. ``head_timeout`` bounds the seconds a request
    head may take, ``max_connections`` the connections held at once (``cli/heads.py``; None:
    ``streams.per_process`` + ``CONNECTIONS_BEYOND_STREAMS``), ``readers`` what clients that
    stop reading may hold, and how long (``cli/stalls.py``); ``webhook_secret``: create_app's."""
    readers = readers or Readers()
    try:
        app = create_app(
            outbox,
            tokens,
            streams=streams,
            answers=readers.answers,
            cors_origins=cors_origins,
            accept_rate=accept_rate,
            token_budget_share=token_budget_share,
            turn_end_rate=turn_end_rate,
            count_interval=count_interval,
            request_deadline=request_deadline,
            api_docs=api_docs,
            webhook_secret=webhook_secret,
        )
    except ValueError as exc:  # a --request-deadline at or under the durability timeout
        raise click.UsageError(str(exc)) from None
    if max_connections is None:
        max_connections = streams.per_process + CONNECTIONS_BEYOND_STREAMS
    raise_open_files(max_connections)
    stalled = outbox.metrics.connections_stalled.inc
    edge = Edge(head_timeout, max_connections, readers.send_timeout, stalled)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        # uvicorn's protocol for --http (auto: httptools), the request head capped and timed,
        # the connections counted (heads.py).
        http=capped_protocol(http, edge),
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        access_log=access_log,
        timeout_graceful_shutdown=5,  # for requests in flight: event streams end at once
        log_config=None,  # uvicorn's records go to our handler, in our format (cli/logs.py)
    )
    server = Server(config, on_exit=outbox.aclose)  # aclose ends the open event streams
    on_signals(server)
    # What is allocated by now (FastAPI, pydantic, the routes' models) lives as long as the
    # process: out of the collector's sight, full collections under load stay short (p99 of
    # an accept at 32 connections 55 -> 27 ms, bench/http.py).
    gc.freeze()
    await server.serve()  # returns once a signal asked it to


def rate_options(name: str, rate_help: str, burst_help: str) -> Callable[[F], F]:
    """``--NAME-rate`` and ``--NAME-burst`` (``PROMPT_OUTBOX_NAME_RATE`` / ``_BURST``): a
    token bucket per caller (``api/limits.py``), at the defaults of ``RateLimit``."""
    var = "PROMPT_OUTBOX_" + name.upper().replace("-", "_")

    def option(
        kind: str, default: float, kinds: click.ParamType[Any], words: str
    ) -> Callable[[F], F]:
        flag, env = f"--{name}-{kind}", f"{var}_{kind.upper()}"
        return click.option(
            flag, default=default, show_default=True, envvar=env, type=kinds, help=words
        )

    rate = option("rate", DEFAULT_RATE, click.FloatRange(min=0), rate_help)
    burst = option("burst", DEFAULT_BURST, click.IntRange(min=1), burst_help)
    return lambda command: rate(burst(command))


@click.command()
@storage_options
@durability_options
@click.option("--host", default="127.0.0.1", show_default=True, envvar="PROMPT_OUTBOX_HOST")
@click.option("--port", default=8080, show_default=True, type=int, envvar="PROMPT_OUTBOX_PORT")
@click.option(
    "--tokens",
    "tokens_file",
    envvar="PROMPT_OUTBOX_TOKENS_FILE",
    type=click.Path(exists=True, dir_okay=False),
    help="bearer-token file (JSON)",
)
@click.option("--no-auth", is_flag=True, help="let every request in (loopback development only)")
@click.option(
    "--max-streams",
    default=DEFAULT_PER_PROCESS,
    show_default=True,
    envvar="PROMPT_OUTBOX_MAX_STREAMS",
    type=click.IntRange(min=1),
    help="open event streams this process serves (503 past it)",
)
@click.option(
    "--max-streams-per-token",
    default=DEFAULT_PER_TOKEN,
    show_default=True,
    envvar="PROMPT_OUTBOX_MAX_STREAMS_PER_TOKEN",
    type=click.IntRange(min=1),
    help="open event streams one token may hold (429 past it)",
)
@click.option(
    "--stream-buffer-mib",
    default=FeedLimits().max_behind_bytes // MIB,
    show_default=True,
    envvar="PROMPT_OUTBOX_STREAM_BUFFER_MIB",
    type=click.IntRange(min=1),
    help="MiB of events one event stream's client may leave unread (its stream ends past it; "
    "the client resumes by its last ID)",
)
@click.option(
    "--streams-buffer-mib",
    default=FeedLimits().max_buffered_bytes // MIB,
    show_default=True,
    envvar="PROMPT_OUTBOX_STREAMS_BUFFER_MIB",
    type=click.IntRange(min=1),
    help="MiB of unread events all event streams of this process may hold (past it, those "
    "holding the most end)",
)
@rate_options(
    "accept",
    "accepts per second one token may sustain, in this process (429 past it; 0: no limit)",
    "accepts one token may send at once after a quiet spell",
)
@rate_options(
    "turn-end",
    "turn ends per second one token may sustain, in this process, in a bucket apart from its "
    "accepts; the signed ends share one such bucket, the webhook signer's (429 past it; 0: no "
    "limit)",
    "turn ends one token (or the webhook signer) may send at once after a quiet spell",
)
@click.option(
    "--token-budget-share",
    default=DEFAULT_TOKEN_SHARE,
    show_default=True,
    envvar="PROMPT_OUTBOX_TOKEN_BUDGET_SHARE",
    type=click.FloatRange(min=0, min_open=True, max=1),
    help="the share of Valkey's memory (its maxmemory, or the machine's) that the workspaces "
    "of one token may hold together (429 token_bytes_full past it); each workspace has its "
    "own, the workspace_budget_share tunable",
)
@click.option(
    "--metrics-count-interval",
    default=DEFAULT_COUNT_INTERVAL,
    show_default=True,
    envvar="PROMPT_OUTBOX_METRICS_COUNT_INTERVAL",
    type=click.FloatRange(min=0),
    help="seconds between two counts of the entries by status for /metrics (each reads a few "
    "fields a workspace; scrapes in between get the last count); 0: no entries gauge",
)
@click.option(
    "--access-log/--no-access-log",
    default=False,
    show_default=True,
    envvar="PROMPT_OUTBOX_ACCESS_LOG",
    help="one log record per request, uvicorn.access, with its request_id (off by default: each "
    "costs CPU on the request path; docs/performance.md has the figure)",
)
@click.option(
    "--cors-origin",
    "cors_origins",
    multiple=True,
    envvar="PROMPT_OUTBOX_CORS_ORIGINS",
    help="an origin (https://app.example) whose pages may call the API from a browser; "
    "repeat it, or give several in the variable, space-separated (none: same origin only)",
)
@click.option(
    "--request-deadline",
    envvar="PROMPT_OUTBOX_REQUEST_DEADLINE",
    type=click.FloatRange(min=0, min_open=True),
    help="seconds a request may wait for its answer to start (503 deadline_exceeded past it, "
    "e.g. while Valkey is away; an event stream only until its first bytes); must exceed "
    "the durability timeout  [default: durability timeout + 2, 7 s]",
)
@click.option(
    "--head-timeout",
    default=HEAD_TIMEOUT,
    show_default=True,
    envvar="PROMPT_OUTBOX_HEAD_TIMEOUT",
    type=click.FloatRange(min=0, min_open=True),
    help="seconds a client has for a whole request head, from its connection or the previous "
    "answer (then 408 request_timeout, or a silent close if nothing came, and the connection "
    "is closed); a total, not an idle timer",
)
@click.option(
    "--max-connections",
    envvar="PROMPT_OUTBOX_MAX_CONNECTIONS",
    type=click.IntRange(min=1),
    help="connections this process holds at once, event streams included (one past it: 503 "
    "too_many_connections with Retry-After, closed); must exceed --max-streams  "
    f"[default: --max-streams + {CONNECTIONS_BEYOND_STREAMS}]",
)
@click.option(
    "--api-docs/--no-api-docs",
    default=False,
    show_default=True,
    envvar="PROMPT_OUTBOX_API_DOCS",
    help="serve Swagger UI at /docs and ReDoc at /redoc: their code comes from a CDN "
    "(cdn.jsdelivr.net, no integrity check) and runs on the API's origin, beside /ui/; "
    "/openapi.json is served either way",
)
@click.option(
    "--loop",
    envvar="PROMPT_OUTBOX_LOOP",
    type=click.Choice(LOOPS),
    default="auto",
    show_default=True,
    help="event loop (auto: uvloop where installed)",
)
@click.option(
    "--http",
    "http_parser",
    envvar="PROMPT_OUTBOX_HTTP",
    type=click.Choice(HTTP_PARSERS),
    default="auto",
    show_default=True,
    help="HTTP/1.1 parser (auto: httptools where installed)",
)
@reader_options
@delivery_options
def serve(
    valkey_url: str | None,
    data_dir: Path,
    valkey_maxmemory: int | None,
    tunables_json: str | None,
    accept_durability: str | None,
    durability_timeout: float | None,
    strict_durability: bool,
    host: str,
    port: int,
    tokens_file: str | None,
    no_auth: bool,
    max_streams: int,
    max_streams_per_token: int,
    stream_buffer_mib: int,
    streams_buffer_mib: int,
    accept_rate: float,
    accept_burst: int,
    token_budget_share: float,
    turn_end_rate: float,
    turn_end_burst: int,
    metrics_count_interval: float,
    access_log: bool,
    cors_origins: tuple[str, ...],
    loop: str,
    http_parser: str,
    request_deadline: float | None,
    head_timeout: float,
    max_connections: int | None,
    api_docs: bool,
    readers: Readers,
    **delivery: str | float | None,
) -> None:
    """Run the HTTP API and the delivery workers in one process."""
    if max_connections is not None and max_connections <= max_streams:
        raise click.UsageError(
            f"--max-connections ({max_connections}) must exceed --max-streams ({max_streams}): "
            "every open event stream holds a connection"
        )
    for origin in cors_origins:
        if origin != "*" and not _ORIGIN.fullmatch(origin):
            raise click.UsageError(f"--cors-origin wants scheme://host[:port], got {origin!r}")
    if no_auth and not is_loopback_host(host):
        raise click.UsageError("--no-auth is only allowed on a loopback --host")
    if no_auth and "*" in cors_origins:
        raise click.UsageError(
            "--cors-origin '*' with --no-auth would let any web page call the API: name the "
            "origins (loopback ones need none)"
        )
    if not no_auth and tokens_file is None:
        raise click.UsageError("give --tokens FILE (or --no-auth for loopback development)")
    try:
        tokens = (
            TokenTable({}, disabled=True) if no_auth else TokenTable.from_file(str(tokens_file))
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if no_auth:
        log.warning("authentication is DISABLED (--no-auth); loopback only")
    elif exposed := exposure(Path(str(tokens_file))):
        # Not refused (a secret mounted by an orchestrator may come as it comes), but said.
        log.warning("the token file %s: %s", tokens_file, exposed)
    chosen = build_delivery(**delivery)  # type: ignore[arg-type]

    async def main() -> None:
        durability = Durability(accept_durability, durability_timeout, strict_durability)
        feed = FeedLimits(
            max_behind_bytes=stream_buffer_mib * MIB, max_buffered_bytes=streams_buffer_mib * MIB
        )
        # attach=False: a second serve on a data dir in use is refused (docs/cli.md, "Storage").
        opened = open_outbox(
            valkey_url, data_dir, tunables_json, durability, feed, valkey_maxmemory, attach=False
        )
        # aclosing: the event streams' shared connections close before the client does.
        async with opened as outbox, contextlib.aclosing(outbox), delivering(outbox, chosen):
            limits = StreamLimits(per_process=max_streams, per_token=max_streams_per_token)
            await run_api(
                outbox,
                tokens,
                host,
                port,
                limits,
                http=http_parser,
                access_log=access_log,
                cors_origins=cors_origins,
                accept_rate=RateLimit(accept_rate, accept_burst),
                token_budget_share=token_budget_share,
                turn_end_rate=RateLimit(turn_end_rate, turn_end_burst),
                count_interval=metrics_count_interval,
                request_deadline=request_deadline,
                api_docs=api_docs,
                head_timeout=head_timeout,
                max_connections=max_connections,
                readers=readers,
                webhook_secret=chosen.webhook_secret if chosen else None,
            )

    run_on(loop, main)


@click.command()
@storage_options
@durability_options
@delivery_options
def worker(
    valkey_url: str | None,
    data_dir: Path,
    valkey_maxmemory: int | None,
    tunables_json: str | None,
    accept_durability: str | None,
    durability_timeout: float | None,
    strict_durability: bool,
    **delivery: str | float | None,
) -> None:
    """Deliver only (no API): an extra replica beside serve, on the same Valkey.

    Without --valkey-url it joins the embedded Valkey a serve runs on --data-dir.
    """
    chosen = build_delivery(**delivery)  # type: ignore[arg-type]
    if chosen is None:
        raise click.UsageError("a worker needs a deliverer: --webhook-url or --opencode-url")

    async def main() -> None:
        durability = Durability(accept_durability, durability_timeout, strict_durability)
        opened = open_outbox(
            valkey_url, data_dir, tunables_json, durability, valkey_maxmemory=valkey_maxmemory
        )
        async with opened as outbox:
            stop = asyncio.Event()
            on_signals(stop)
            async with delivering(outbox, chosen):
                await stop.wait()

    asyncio.run(main())


@click.command()
def openapi() -> None:
    """Print the HTTP API's OpenAPI document (JSON), as serve answers /openapi.json.

    The TypeScript client's types are generated from it (clients/typescript)."""
    # The document depends on the routes only: an outbox whose client never connects will do.
    app = create_app(Outbox(connect("valkey://127.0.0.1:1")), TokenTable({}, disabled=True))
    click.echo(json.dumps(app.openapi(), indent=2, sort_keys=True))
