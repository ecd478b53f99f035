"""What an operator alerts on: the /metrics gauges of the backlog's age and the sessions in turn,
the process metrics, and deploy/prometheus/alerts.yml and deploy/grafana/dashboard.json, every
metric they name checked against a real serve's /metrics.

promtool is not at hand (and no well-kept PyPI validator of rule files is), so the rules'
structure is checked here against Prometheus' rule-file format: groups with unique names,
rules with exactly one of alert / record, an expr, a ``for`` duration, string labels and
annotations, nothing else."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import httpx
import yaml

from prompt_outbox import Entry, Outbox, Turn
from prompt_outbox.core.keys import SessionKeys, WorkspaceKeys
from prompt_outbox.core.metrics import Metrics
from prompt_outbox.embedded import free_port
from prompt_outbox.storage.client import Client
from tests.support.api import samples
from tests.support.clock import ManualClock
from tests.support.serve import service, wait_healthy
from tests.support.tunables import FAST
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboard.json"

# Our metric families and the process collector's; "up" and the like are Prometheus' own.
_NAME = re.compile(r"(?<![A-Za-z0-9_:])((?:prompt_outbox|process|python)_[A-Za-z0-9_]+)")
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
_RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count")}


def exposed(text: str) -> set[str]:
    """Every series name an exposition can hold: its samples', and those its ``# TYPE`` lines
    promise (a labelled counter with no child yet shows no sample, but will)."""
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1].isalpha()}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            names.add(name)
            names.update(name + s for s in _SUFFIXES.get(kind, ()))
    return names


def named(expr: str) -> set[str]:
    """The metric names a PromQL expression uses (ours and the process collector's)."""
    return set(_NAME.findall(expr))


def rule_problems(doc: Any) -> list[str]:
    """What makes ``doc`` not a Prometheus rule file (empty: nothing)."""
    out: list[str] = []
    if not isinstance(doc, dict) or set(doc) != {"groups"} or not isinstance(doc["groups"], list):
        return ["the file must be a mapping with one key, groups: a list"]
    groups = [g.get("name") for g in doc["groups"] if isinstance(g, dict)]
    if len(groups) != len(doc["groups"]) or len(set(groups)) != len(groups) or None in groups:
        out.append("every group needs a unique name")
    alerts: list[str] = []
    for g in doc["groups"]:
        if not set(g) <= {"name", "interval", "rules", "limit"}:
            out.append(f"group {g.get('name')}: unknown keys {set(g) - {'name', 'rules'}}")
        for r in g.get("rules") or []:
            what = r.get("alert") or r.get("record")
            if not isinstance(r, dict) or ("alert" in r) == ("record" in r):
                out.append(f"rule {what}: needs exactly one of alert, record")
                continue
            if not set(r) <= _RULE_KEYS:
                out.append(f"rule {what}: unknown keys {set(r) - _RULE_KEYS}")
            expr = r.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                out.append(f"rule {what}: no expr")
            elif expr.count("(") != expr.count(")") or expr.count("{") != expr.count("}"):
                out.append(f"rule {what}: unbalanced brackets in expr")
            for key in ("for", "keep_firing_for"):
                if key in r and not _DURATION.fullmatch(str(r[key])):
                    out.append(f"rule {what}: {key} is not a duration: {r[key]!r}")
            for key in ("labels", "annotations"):
                got = r.get(key, {})
                if not isinstance(got, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in got.items()
                ):
                    out.append(f"rule {what}: {key} must map strings to strings")
            if "alert" in r:
                alerts.append(r["alert"])
                notes = r.get("annotations", {})
                if not (notes.get("summary") and notes.get("runbook")):
                    out.append(f"alert {what}: needs a summary and a runbook annotation")
                if r.get("labels", {}).get("severity") not in {"critical", "warning", "info"}:
                    out.append(f"alert {what}: severity must be critical, warning or info")
    if len(set(alerts)) != len(alerts):
        out.append("alert names must be unique")
    return out


def dashboard_problems(doc: Any) -> list[str]:
    """What makes ``doc`` not an importable Grafana dashboard of Prometheus panels."""
    out: list[str] = []
    for key in ("title", "uid", "schemaVersion", "panels"):
        if key not in doc:
            out.append(f"no {key}")
    variables = {v.get("name") for v in doc.get("templating", {}).get("list", [])}
    ids = [p.get("id") for p in doc.get("panels", [])]
    if len(set(ids)) != len(ids) or None in ids:
        out.append("panel ids must be unique")
    for p in doc.get("panels", []):
        title = p.get("title")
        grid = p.get("gridPos", {})
        if not title or not p.get("type") or not all(k in grid for k in "hwxy"):
            out.append(f"panel {p.get('id')}: needs a title, a type and a gridPos")
        if grid.get("x", 0) + grid.get("w", 0) > 24:
            out.append(f"panel {title}: wider than Grafana's 24 columns")
        uid = str(p.get("datasource", {}).get("uid", ""))
        if uid.startswith("$") and uid.strip("${}") not in variables:
            out.append(f"panel {title}: datasource variable {uid} is not defined")
        refs = [t.get("refId") for t in p.get("targets", [])]
        if not refs or len(set(refs)) != len(refs):
            out.append(f"panel {title}: needs targets with unique refIds")
        for t in p.get("targets", []):
            if not named(t.get("expr", "")):
                out.append(f"panel {title}: target {t.get('refId')} names no metric")
    return out


def rule_exprs(doc: Any) -> dict[str, str]:
    return {r.get("alert") or r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"]}


def panel_exprs(doc: Any) -> dict[str, str]:
    return {f"{p['title']} {t['refId']}": t["expr"] for p in doc["panels"] for t in p["targets"]}


def unknown(exprs: dict[str, str], names: set[str]) -> dict[str, set[str]]:
    return {k: named(e) - names for k, e in exprs.items() if named(e) - names}


def test_every_metric_the_alerts_and_the_dashboard_name_is_on_a_real_serve(
    tmp_path: Path,
) -> None:
    port = free_port()
    with service(["--no-auth", "--port", str(port), "--data-dir", str(tmp_path / "data")]):
        wait_healthy(port)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    names = exposed(text)
    # Process metrics (what "process down" and memory alerts read) and the new gauges.
    for name in (
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "process_open_fds",
        "python_info",
        "prompt_outbox_oldest_pending_seconds",
        "prompt_outbox_in_turn",
    ):
        assert name in names, name
    rules = yaml.safe_load(ALERTS.read_text())
    dashboard = json.loads(DASHBOARD.read_text())
    assert unknown(rule_exprs(rules), names) == {}
    assert unknown(panel_exprs(dashboard), names) == {}
    # The checker can fail: a misspelled name and a dropped suffix are both caught.
    bad = {"x": "rate(prompt_outbox_acepted_total[5m]) + prompt_outbox_failed"}
    assert unknown(bad, names) == {"x": {"prompt_outbox_acepted_total", "prompt_outbox_failed"}}


def test_the_alert_rules_are_a_prometheus_rule_file() -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    assert rule_problems(doc) == []
    alerts = set(rule_exprs(doc))
    for wanted in (  # what the issue asks an operator can alert on
        "PromptOutboxDown",
        "PromptOutboxBacklogOld",
        "PromptOutboxFailureRate",
        "PromptOutboxNoDeliveryWhilePending",
        "PromptOutboxTurnPastCeiling",
        "PromptOutboxStorageFull",
    ):
        assert wanted in alerts
    broken = {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up(", "for": "5 min"}]}]}
    assert len(rule_problems(broken)) == 4  # brackets, duration, severity, annotations


def test_the_dashboard_is_grafana_json_with_a_metric_in_every_target() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert dashboard_problems(doc) == []
    shown = set().union(*(named(e) for e in panel_exprs(doc).values()))
    for wanted in (
        "prompt_outbox_accepted_total",
        "prompt_outbox_delivered_total",
        "prompt_outbox_failed_total",
        "prompt_outbox_oldest_pending_seconds",
        "prompt_outbox_in_turn",
        "prompt_outbox_turn_seconds_bucket",
        "prompt_outbox_delivery_attempts_total",
        "prompt_outbox_accept_seconds_bucket",
        "process_resident_memory_bytes",
    ):
        assert wanted in shown
    doc["panels"][0]["targets"][0]["expr"] = "vector(1)"
    doc["panels"][1]["gridPos"]["x"] = 20
    assert len(dashboard_problems(doc)) == 2


async def test_the_gauges_count_the_oldest_pending_and_the_sessions_in_turn(
    client: Client,
) -> None:
    # The accept's clock is days behind the wall clock: the age is read against the latter.
    outbox = Outbox(client, FAST, clock=ManualClock())
    await outbox.accept("acme", "waits", "u", "c1", "oldest")
    fleet = await outbox.overview.fleet_counts()
    assert fleet.by_status == {"pending": 1} and fleet.in_turn == 0
    got = samples(outbox.metrics.render(fleet, 1.0).decode())
    assert got[("prompt_outbox_oldest_pending_seconds", ())] > 2 * 86400
    assert got[("prompt_outbox_in_turn", ())] == 0

    worker = Outbox(client, FAST)
    turns: list[str] = []

    async def turned(ws: str, ses: str, entry: Entry) -> Turn:
        turns.append(ses)
        return Turn(f"t-{ses}")

    await worker.accept("acme", "a", "u", "c1", "x")
    await worker.accept("beta", "b", "u", "c1", "y")
    async with worker.running(turned, tick=0.05):
        await eventually(lambda: _held(client, "acme", "beta"))  # owned by this worker
        assert sorted(turns) == ["a", "b", "waits"]
        fleet = await worker.overview.fleet_counts()
        assert fleet.in_turn == 3 and fleet.oldest_pending_ms is None
        got = samples(worker.metrics.render(fleet, 1.0).decode())
        assert got[("prompt_outbox_in_turn", ())] == 3
        assert got[("prompt_outbox_oldest_pending_seconds", ())] == 0
        assert (await worker.end_turn("acme", "a", "t-a")).ended
        assert (await worker.overview.fleet_counts()).in_turn == 2


async def test_the_in_turn_gauge_counts_turns_no_worker_owns(client: Client) -> None:
    # deliver_once runs no worker: its turn has no owner (outboxturns names none), yet the
    # session is in turn, and another process's count sees it.
    sender, counter = Outbox(client, FAST), Outbox(client, FAST)
    index = WorkspaceKeys("acme").in_turn
    await client.zadd(index, {"lapsed": 1})  # a member whose lock lapsed long ago

    async def turned(ws: str, ses: str, entry: Entry) -> Turn:
        return Turn(f"t-{ses}")

    for ses in ("a", "b"):
        await sender.accept("acme", ses, "u", "c1", "x")
        assert await sender.deliver_once("acme", ses, turned)
    assert await client.hlen(WorkspaceKeys("acme").turns) == 0  # type: ignore[misc]
    # The turns' start pruned the lapsed member, and the index expires with the last lock.
    assert await client.zscore(index, "lapsed") is None and await client.pttl(index) > 0
    fleet = await counter.overview.fleet_counts()
    assert fleet.in_turn == 2
    assert samples(counter.metrics.render(fleet, 1.0).decode())[("prompt_outbox_in_turn", ())] == 2
    assert (await sender.end_turn("acme", "a", "t-a")).ended
    assert (await counter.overview.fleet_counts()).in_turn == 1
    assert await client.zcard(index) == 1  # its end took "a" off
    # A turn whose lock lapsed (deleted here) is not counted, though the index still names it.
    await client.delete(SessionKeys("acme", "b").lock)
    assert (await counter.overview.fleet_counts()).in_turn == 0


async def _held(client: Client, *workspaces: str) -> bool:
    held = [await client.hlen(WorkspaceKeys(ws).turns) for ws in workspaces]  # type: ignore[misc]
    return sum(held) == 3


def test_the_gauges_say_not_counted_until_a_count() -> None:
    # With --metrics-count-interval 0 nothing is ever counted: NaN, not a reassuring 0.
    got = samples(Metrics().render(None).decode())
    assert math.isnan(got[("prompt_outbox_oldest_pending_seconds", ())])
    assert math.isnan(got[("prompt_outbox_in_turn", ())])


def test_the_example_scrape_config_loads_the_rules_under_their_job() -> None:
    config = yaml.safe_load((ALERTS.parent / "prometheus.yml").read_text())
    assert [ALERTS.parent / f for f in config["rule_files"]] == [ALERTS]
    [job] = config["scrape_configs"]
    assert job["job_name"] == "prompt-outbox" and job["metrics_path"] == "/metrics"
    rules = rule_exprs(yaml.safe_load(ALERTS.read_text()))
    # Every rule on a series of ours names that job (the counters are summed over it).
    assert all('job="prompt-outbox"' in e for e in rules.values()), rules
