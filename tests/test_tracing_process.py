"""Traces in real processes (docs/observability.md, "Traces"): ``prompt-outbox serve`` with
``OTEL_TRACES_EXPORTER=console`` prints spans that join an accept and its delivery (what is tried
from outside); a library whose application sets the global tracer provider is traced; and without
OpenTelemetry's packages nothing of it is imported, and an accept and a delivery run as before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from prompt_outbox.cli.otel import traces_asked
from prompt_outbox.embedded import EmbeddedValkey, free_port
from tests.support.agent import SECRET, Agent
from tests.support.serve import BIN, wait_healthy

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def run(script: str, *args: str) -> str:
    """Run ``script`` in a Python process of its own, which prints ok when all it asserts
    held; what it wrote to stderr."""
    r = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    return r.stderr


def console_spans(out: str) -> list[dict[str, Any]]:
    """The spans the console exporter printed (indented JSON objects, one after another)."""
    decoder, spans, i = json.JSONDecoder(), [], out.find("{")
    while i != -1:
        try:
            value, end = decoder.raw_decode(out, i)
        except json.JSONDecodeError:
            i = out.find("\n{", i + 1)
            i = i + 1 if i != -1 else -1
            continue
        if isinstance(value, dict) and "context" in value:
            spans.append(value)
        i = out.find("{", end)
    return spans


def test_serve_prints_a_trace_joining_an_accept_and_its_delivery(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_SERVICE_NAME": "outbox-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: the batch goes out at once, not after 5 s
        "PROMPT_OUTBOX_WEBHOOK_SECRET": SECRET.decode(),
    }
    with Agent() as agent:
        args = ["serve", "--no-auth", "--port", str(port), "--data-dir", str(tmp_path)]
        args += ["--webhook-url", agent.url, "--webhook-verify-url", agent.verify_url]
        proc = subprocess.Popen(
            [BIN, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True, text=True,
        )  # fmt: skip
        try:
            wait_healthy(port)
            r = httpx.post(
                f"http://127.0.0.1:{port}/v1/workspaces/acme/sessions/chat-1/prompts",
                json={"clientMessageID": "m1", "text": "hi"},
                headers={"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"},
            )
            assert r.status_code == 202, r.text
            deadline = time.monotonic() + 30
            while not agent.received:
                assert time.monotonic() < deadline, "not delivered"
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)  # the provider flushes what is left at exit
            out, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    spans = console_spans(out)
    by_name = {s["name"]: s for s in spans if s["context"]["trace_id"] == f"0x{TRACE_ID}"}
    accept, send = by_name["prompt_outbox.accept"], by_name["prompt_outbox.send"]
    assert send["parent_id"] == accept["context"]["span_id"]  # the delivery continues the accept
    assert send["attributes"]["prompt_outbox.outcome"] == "delivered"
    assert accept["attributes"]["prompt_outbox.entry"] == r.json()["id"]
    assert accept["resource"]["attributes"]["service.name"] == "outbox-under-test"
    # The agent's request carries the send span's context (its own spans can join).
    sent = agent.received[0].headers
    assert sent["traceparent"].startswith(f"00-{TRACE_ID}-{send['context']['span_id'][2:]}-")
    assert b"traceparent" not in agent.received[0].body


# A process of its own: OpenTelemetry's packages (all of them first; then the extra's only, as
# an install without it has: FastAPI itself needs the API) cannot be imported.
WITHOUT = """
import asyncio, sys

class Block:
    prefixes = ["opentelemetry"]
    def find_spec(self, name, path=None, target=None):
        if any(name == p or name.startswith(p + ".") for p in self.prefixes):
            raise ModuleNotFoundError(f"blocked: {name}", name=name)
        return None

sys.meta_path.insert(0, Block())
from prompt_outbox import Outbox
from prompt_outbox.core.tracing import NOOP, tracing
from prompt_outbox.storage.connect import connect

async def main():
    outbox, sent = Outbox(connect(sys.argv[1])), []
    async def agent(ws, ses, entry):
        sent.append(entry.id)
    entry = await outbox.accept("untraced", sys.argv[2], "u", "m1", "hi")
    assert await outbox.deliver_once("untraced", sys.argv[2], agent) and sent == [entry.id]
    assert tracing() is NOOP

asyncio.run(main())
assert not [m for m in sys.modules if m.startswith("opentelemetry")], "imported"
Block.prefixes = ["opentelemetry.sdk", "opentelemetry.distro", "opentelemetry.exporter"]
from prompt_outbox.cli.otel import setup_tracing
assert setup_tracing({"OTEL_TRACES_EXPORTER": "console"}) is False
assert "opentelemetry.sdk" not in sys.modules
print("ok")
"""


def test_without_opentelemetry_nothing_is_imported_and_delivery_goes_on(
    valkey_server: EmbeddedValkey,
) -> None:
    said = run(WITHOUT, valkey_server.url, f"s{time.time_ns()}")
    assert "pip install 'prompt-outbox[otel]'" in said  # asked for: says why there are none


# A command run without OpenTelemetry's extra, asked for traces, in JSON logs.
WITHOUT_EXTRA = """
import os, sys

class Block:
    prefixes = ["opentelemetry.sdk", "opentelemetry.distro", "opentelemetry.exporter"]
    def find_spec(self, name, path=None, target=None):
        if any(name == p or name.startswith(p + ".") for p in self.prefixes):
            raise ModuleNotFoundError(f"blocked: {name}", name=name)
        return None

sys.meta_path.insert(0, Block())
os.environ["OTEL_TRACES_EXPORTER"] = "console"
from prompt_outbox.cli import main
main(["openapi", "--log-format", "json"])
"""


def test_the_missing_extra_is_a_log_record_in_the_chosen_format() -> None:
    # It was a plain line written before any command set its logging up.
    r = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRA], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stderr.splitlines()]
    [warned] = [x for x in lines if "pip install 'prompt-outbox[otel]'" in x["message"]]
    assert warned["level"] == "WARNING"
    assert json.loads(r.stdout)["openapi"]  # the command ran, without traces


# A library whose application sets the global tracer provider after building its Outbox, and
# accepts outside any span: the prompt's trace begins at the accept and its delivery joins it.
LIBRARY = """
import asyncio, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prompt_outbox import Outbox
from prompt_outbox.storage.connect import connect

async def main():
    outbox = Outbox(connect(sys.argv[1]))
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    async def agent(ws, ses, entry):
        return None
    await outbox.accept("library", sys.argv[2], "u", "m1", "hi")
    assert await outbox.deliver_once("library", sys.argv[2], agent)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    accept, send = spans["prompt_outbox.accept"], spans["prompt_outbox.send"]
    assert send.context.trace_id == accept.context.trace_id
    assert send.parent.span_id == accept.context.span_id
    print("ok")

asyncio.run(main())
"""


def test_a_library_is_traced_once_its_application_sets_the_global_provider(
    valkey_server: EmbeddedValkey,
) -> None:
    run(LIBRARY, valkey_server.url, f"s{time.time_ns()}")


NOT_A_PROVIDER = """
from opentelemetry import trace
trace.set_tracer_provider(object())  # the API checks nothing
from prompt_outbox.core.entry import decode_entry
from prompt_outbox.core.tracing import NOOP, tracing
assert tracing() is NOOP
entry = decode_entry('{"id":"e1","acceptedAt":"2026-01-01T00:00:00Z"}')
assert entry.traced() is entry
print("ok")
"""


def test_a_global_provider_that_is_not_one_leaves_tracing_off() -> None:
    run(NOT_A_PROVIDER)


SERVICE_NAME = """
import os
os.environ.pop("OTEL_SERVICE_NAME", None)
os.environ["OTEL_TRACES_EXPORTER"] = "console"
from opentelemetry import trace
from prompt_outbox.cli.otel import setup_tracing
assert setup_tracing()
assert trace.get_tracer_provider().resource.attributes["service.name"] == "prompt-outbox"
print("ok")
"""


def test_the_service_is_named_prompt_outbox_unless_otel_service_name_says() -> None:
    run(SERVICE_NAME)  # the SDK's own default is unknown_service


def test_an_exporter_nobody_provides_is_one_clear_error() -> None:
    r = subprocess.run(
        [BIN, "openapi"], env={**os.environ, "OTEL_TRACES_EXPORTER": "bogus"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1 and r.stderr.startswith("Error: OTEL_TRACES_EXPORTER=bogus: "), (
        r.stderr
    )
    assert "Traceback" not in r.stderr


def test_the_rule_traces_on_only_when_an_exporter_is_asked_for() -> None:
    assert traces_asked({}) == ""  # no OTEL_* at all: off, nothing imported
    assert traces_asked({"OTEL_TRACES_EXPORTER": "none"}) == ""
    assert traces_asked({"OTEL_TRACES_EXPORTER": " console "}) == "console"
    on = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}
    assert traces_asked(on) == ""
    assert traces_asked({**on, "OTEL_SDK_DISABLED": "false"}) == "otlp"
