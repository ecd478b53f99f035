"""One logging setup for every command: ``--log-format text|json`` and ``--log-level``
(``PROMPT_OUTBOX_LOG_FORMAT`` / ``PROMPT_OUTBOX_LOG_LEVEL``), one handler on stderr that
uvicorn's records reach too (``serve`` starts uvicorn with ``log_config=None``).

Both formats print a record's context fields: what the call passed as ``extra=`` and what
is bound around it (``core/logctx.py``: the workspace and session of a delivery step, an
HTTP request's ID). text: ``time LEVEL logger message key=value ...``; json: one object a
line, ``time``, ``level``, ``logger``, ``message``, then every field. Hand-written rather
than python-json-logger or structlog: both formats need the same split of a record's
context from its own attributes, after which JSON is one ``json.dumps``; structlog would
change every call site and still need a bridge for uvicorn's stdlib records.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import click

from ..core.errors import InvalidInput
from ..core.logctx import log_fields
from ..core.validate import check_unicode
from .otel import setup_tracing

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")

# A record's own attributes: whatever else it holds came from extra= or the bound context.
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's copy of the message with terminal colours
}
# Logged at INFO once per HTTP call a deliverer makes: shown at --log-level debug only.
_CHATTY = ("httpx", "httpcore")


class ContextFilter(logging.Filter):
    """Copies the bound context (``log_context``) onto the record, under what ``extra=``
    already set. On the handler, so that every logger's records get it, uvicorn's too."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in log_fields().items():
            if key not in record.__dict__:
                setattr(record, key, value)
        return True


def context_of(record: logging.LogRecord) -> dict[str, Any]:
    """The record's context fields, by name."""
    return {k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRS}


def _when(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


ACCESS_LOGGER = "uvicorn.access"
REDACTED = "***"


# A request target's query in a line: from its "?" to the space or quote that ends the target.
_QUERY = re.compile(r"\?[^\s\"]*")


class QueryRedaction(logging.Filter):
    """On uvicorn's access logger: the request's target loses every query value (``***``),
    its names kept. A stream ticket (``?ticket=``: it opens the workspace's streams for a
    minute) is the API's one secret in a query, but a client may put any there (a token
    where a header belongs): no value is judged safe, so none leaks into a log. On the
    logger, not a handler: every handler (ours, OpenTelemetry's) gets the redacted line. It
    reads the line as rendered, not uvicorn's arguments, so no change of their shape lets a
    query through."""

    def filter(self, record: logging.LogRecord) -> bool:
        line = record.getMessage()
        if "?" in line:
            record.msg, record.args = _QUERY.sub(lambda m: redacted_query(m.group()), line), ()
        return True


def redacted_query(query: str) -> str:
    """``?a=1&b`` as ``?a=***&***``: every value replaced, and a bare part (which may be the
    secret itself) as a whole."""
    parts = []
    for part in query[1:].split("&"):
        name, eq, _ = part.partition("=")
        parts.append(f"{name}={REDACTED}" if eq else REDACTED if part else "")
    return "?" + "&".join(parts)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger message key=value ...``; a value with a space, quote or ``=`` in
    it is quoted (JSON string rules), so that a line splits back into its fields."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_when(record)} {record.levelname} {record.name} {record.getMessage()}"
        pairs = [f"{k}={_text_value(v)}" for k, v in context_of(record).items()]
        if pairs:
            line += " " + " ".join(pairs)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text_value(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n\t') or not text.isprintable():
        return json.dumps(text)
    return text


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, every context field, and the
    traceback (``exception``) if any. A value JSON cannot carry is written as its str()."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": _when(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in context_of(record).items():
            doc.setdefault(key, value)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


@contextlib.contextmanager
def logging_to_stderr(fmt: str = "text", level: str = "info") -> Iterator[None]:
    """For the block: one handler on the root logger, on stderr, in ``fmt``, and the root
    at ``level``. Other handlers stay (OpenTelemetry's, when ``OTEL_LOGS_EXPORTER`` asks for
    one; a test's capture); on the way out the handler and the levels are taken back (a
    command run in-process, as the tests do, leaves no handler on a closed stream)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    chatty = [logging.getLogger(name) for name in _CHATTY]
    before = [root.level, *(c.level for c in chatty)]
    number = logging.getLevelName(level.upper())
    access, redaction = logging.getLogger(ACCESS_LOGGER), QueryRedaction()
    root.addHandler(handler)
    root.setLevel(number)
    for logger in chatty:
        logger.setLevel(max(number, logging.WARNING))
    access.addFilter(redaction)
    logging.captureWarnings(True)  # a library's warnings.warn: a record, not a bare line
    try:
        yield
    finally:
        logging.captureWarnings(False)
        access.removeFilter(redaction)
        root.removeHandler(handler)
        for logger, was in zip([root, *chatty], before, strict=True):
            logger.setLevel(was)


_FORMAT_META = "prompt_outbox.log_format"


def said_as_json(ctx: click.Context, failure: click.ClickException) -> bool:
    """Under ``--log-format json``, a command's failure (a usage error its callback found,
    Valkey unusable) is one more JSON record on stderr (ERROR, with its ``exit_code``), as
    every line before it; True when written so (the caller exits with its code). Options
    click could not parse fail before the format is known: click's own words then."""
    if ctx.meta.get(_FORMAT_META) != "json":
        return False
    record = logging.LogRecord(
        "prompt_outbox.cli", logging.ERROR, "", 0, failure.format_message(), None, None
    )
    record.exit_code = failure.exit_code
    click.echo(JsonFormatter().format(record), err=True)
    return True


def _check_unicode(command: click.Command, params: dict[str, Any]) -> None:
    """Every text an operator handed the command (an argument, an option, its variable) is
    Unicode: a byte that is not UTF-8 in argv or the environment comes as a lone surrogate
    (Python's surrogateescape), which no Valkey write, URL or log line can carry. A usage
    error (exit 2) naming the parameter, before anything runs. File paths are the file
    system's bytes, any of them: not text."""
    for param in command.params:
        if param.name not in params or isinstance(param.type, click.Path):
            continue
        value = params[param.name]
        texts = [value] if isinstance(value, str) else value if isinstance(value, tuple) else []
        try:
            check_unicode(param.name, [t for t in texts if isinstance(t, str)])
        except InvalidInput as exc:
            raise click.BadParameter(str(exc), param=param) from None


def with_logging(command: click.Command) -> click.Command:
    """``command`` with --log-format and --log-level, logging set up before it runs (then
    traces, ``cli/otel.py``), its text parameters checked as Unicode first; and every option
    with an environment variable shows it in ``--help``. A group: each of its commands."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            with_logging(sub)
        return command
    command.params += [
        click.Option(
            ["--log-format"],
            type=click.Choice(FORMATS),
            default="text",
            show_default=True,
            envvar="PROMPT_OUTBOX_LOG_FORMAT",
            help="text: one line a record, its context as key=value; json: one object a line",
        ),
        click.Option(
            ["--log-level"],
            type=click.Choice(LEVELS, case_sensitive=False),
            default="info",
            show_default=True,
            envvar="PROMPT_OUTBOX_LOG_LEVEL",
            help="the least severe records written (on stderr)",
        ),
    ]
    for param in command.params:
        if isinstance(param, click.Option) and param.envvar:
            param.show_envvar = True
    run = command.callback
    assert run is not None  # every command of ours has one

    @functools.wraps(run)
    def logged(*args: Any, log_format: str, log_level: str, **kwargs: Any) -> Any:
        click.get_current_context().meta[_FORMAT_META] = log_format
        _check_unicode(command, kwargs)
        with logging_to_stderr(log_format, log_level):
            # Traces once logging is up: their one warning is a record in the chosen format.
            setup_tracing()
            return run(*args, **kwargs)

    command.callback = logged
    return command
