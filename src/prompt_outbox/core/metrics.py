"""Prometheus metrics of one process: counters and latency histograms fed by the Outbox, and
the entries-by-status gauge counted from Valkey (every replica sees the same), at most once
per interval (api/health.py), with the oldest pending entry and the sessions in turn; and the
process's own CPU, memory, file descriptors and Python version (prometheus_client's process and
platform collectors)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from .entry import Status

__all__ = ["CONTENT_TYPE", "FleetCounts", "Metrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_DELIVERY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_TURN_BUCKETS = (1.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0, 7200.0)


@dataclass(frozen=True, slots=True)
class FleetCounts:
    """What every replica reads alike from Valkey for the gauges: the entries by status, the
    oldest pending entry's ``acceptedAt`` (ms; None when nothing is pending), and the sessions
    in turn, whoever sent their prompt (``outboxinturn``, each lock checked)."""

    by_status: Mapping[str, int]
    oldest_pending_ms: int | None = None
    in_turn: int = 0


class Metrics:
    """One registry per Outbox (tests make many). Counters count this process's work."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # process_* (CPU, resident memory, open fds, start time) and python_info: "process
        # down" and memory alerts need them. The default registry has them; ours is our own.
        # Linux only (/proc): elsewhere the process collector yields nothing.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.accepted = Counter("prompt_outbox_accepted", "Prompts accepted.", registry=r)
        self.duplicates = Counter(
            "prompt_outbox_duplicates", "Accepts answered as duplicates.", registry=r
        )
        self.not_durable = Counter(
            "prompt_outbox_not_durable",
            "Accepts written but not confirmed at accept_durability in time (NotDurable).",
            registry=r,
        )
        self.refused_full = Counter(
            "prompt_outbox_refused_full", "Accepts refused: the session was full.", registry=r
        )
        self.refused_workspace_full = Counter(
            "prompt_outbox_refused_workspace_full",
            "Accepts refused: the workspace held workspace_cap entries.",
            registry=r,
        )
        self.refused_storage_full = Counter(
            "prompt_outbox_refused_storage_full",
            "Accepts refused: Valkey's memory was at accept_memory_ratio of its maxmemory.",
            registry=r,
        )
        self.refused_bytes_full = Counter(
            "prompt_outbox_refused_bytes_full",
            "Accepts, edits and retries refused: the workspace was at its byte budget "
            "(workspace_budget_share of Valkey's memory: queued entries, event logs, markers).",
            registry=r,
        )
        self.refused_busy = Counter(
            "prompt_outbox_refused_busy",
            "Accepts refused: whileBusy reject, and the session was busy.",
            registry=r,
        )
        self.aborts = Counter(
            "prompt_outbox_abort_requests",
            "whileBusy interrupt: aborts of a turn in flight asked of the deliverer, by outcome"
            " (asked; failed: the deliverer's abort raised; unsupported: it has no abort).",
            ["outcome"],
            registry=r,
        )
        self.refused_reused = Counter(
            "prompt_outbox_refused_key_reused",
            "Accepts refused: their clientMessageID was accepted for another text or model.",
            registry=r,
        )
        self.refused = {
            "full": self.refused_full,
            "workspace_full": self.refused_workspace_full,
            "storage_full": self.refused_storage_full,
            "bytes_full": self.refused_bytes_full,
            "rejected": self.refused_busy,
            "reused": self.refused_reused,
        }
        """The refusal counters by accept.lua's reply word (storage/replies.py Accept)."""
        self.attempts = Counter(
            "prompt_outbox_delivery_attempts",
            "Deliverer calls, by outcome class.",
            ["outcome"],
            registry=r,
        )
        self.delivered = Counter(
            "prompt_outbox_delivered",
            "Entries confirmed delivered (OnDelivered fired), by how.",
            ["via"],
            registry=r,
        )
        self.retried = Counter(
            "prompt_outbox_retried",
            "Entries scheduled for another send, by why.",
            ["reason"],
            registry=r,
        )
        self.verified = Counter(
            "prompt_outbox_verified", "Verifier verdicts.", ["verdict"], registry=r
        )
        self.edited = Counter(
            "prompt_outbox_edited",
            "Entries whose text or model was edited before dispatch.",
            registry=r,
        )
        self.parked = Counter("prompt_outbox_parked", "Entries parked.", registry=r)
        self.failed = Counter("prompt_outbox_failed", "Entries moved to error.", registry=r)
        self.hooks_refired = Counter(
            "prompt_outbox_hooks_refired",
            "OnDelivered calls made for a claim whose worker died before making them.",
            registry=r,
        )
        self.accept_seconds = Histogram(
            "prompt_outbox_accept_seconds",
            "Accept latency (the Valkey write included).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.delivery_seconds = Histogram(
            "prompt_outbox_delivery_seconds",
            "How long one deliverer call took.",
            buckets=_DELIVERY_BUCKETS,
            registry=r,
        )
        self.accept_to_delivered_seconds = Histogram(
            "prompt_outbox_accept_to_delivered_seconds",
            "From accept to confirmed delivery.",
            buckets=_DELIVERY_BUCKETS,
            registry=r,
        )
        # Turns (docs/design.md, "Turns"): held by no worker, so counted where they begin and end.
        self.turns_started = Counter(
            "prompt_outbox_turns_started", "Deliveries whose agent turn went on.", registry=r
        )
        self.turns_ended = Counter(
            "prompt_outbox_turns_ended",
            "Turns ended, by why: ended (the agent said so), ceiling, unreachable.",
            ["why"],
            registry=r,
        )
        self.turn_seconds = Histogram(
            "prompt_outbox_turn_seconds",
            "How long a turn lasted, from its send to its end.",
            buckets=_TURN_BUCKETS,
            registry=r,
        )
        self.turn_checks = Counter(
            "prompt_outbox_turn_checks",
            "Turns checked with the agent (nobody heard them end), by what it said.",
            ["state"],
            registry=r,
        )
        self.entries = Gauge(
            "prompt_outbox_entries",
            "Entries in the outbox, by status, as last counted (prompt_outbox_entries_counted).",
            ["status"],
            registry=r,
        )
        self.entries_counted = Gauge(
            "prompt_outbox_entries_counted",
            "When prompt_outbox_entries was counted (seconds since the epoch).",
            registry=r,
        )
        self.oldest_pending = Gauge(
            "prompt_outbox_oldest_pending_seconds",
            "How long the oldest pending entry of any workspace has waited since its accept "
            "(0: none pending), from the last count; the backlog alert's input.",
            registry=r,
        )
        self.in_turn = Gauge(
            "prompt_outbox_in_turn",
            "Sessions in turn (the agent working on a delivered prompt), whoever sent it "
            "(a worker, deliver_once, another process), as last counted.",
            registry=r,
        )
        # NaN until a count: "not known" (with --metrics-count-interval 0, never), not "none".
        self.oldest_pending.set(math.nan)
        self.in_turn.set(math.nan)
        self.streams_fell_behind = Counter(
            "prompt_outbox_streams_fell_behind",
            "Event streams (watches) ended because their reader fell behind, by the bound: "
            "events or bytes (its own, FeedLimits.max_behind / max_behind_bytes), process "
            "(all streams' buffers together, FeedLimits.max_buffered_bytes).",
            ["bound"],
            registry=r,
        )
        self.stream_buffer_bytes = Gauge(
            "prompt_outbox_stream_buffer_bytes",
            "Bytes the event streams' buffers hold, read but not yet taken by their readers.",
            registry=r,
        )
        self.answer_buffer_bytes = Gauge(
            "prompt_outbox_answer_buffer_bytes",
            "Bytes the answers in flight (lists, event-stream messages) hold for their clients, "
            "not yet taken by the server's transport.",
            registry=r,
        )
        self.answers_refused = Counter(
            "prompt_outbox_answers_refused",
            "Answers refused (answers_buffer_full) because the answers in flight hold their "
            "most, by the bound: token (429) or process (503).",
            ["bound"],
            registry=r,
        )
        self.connections_stalled = Counter(
            "prompt_outbox_connections_stalled",
            "Connections aborted because their client took nothing of what serve wrote for "
            "--send-timeout seconds.",
            registry=r,
        )

    def render(
        self, counts: FleetCounts | Mapping[str, int] | None, counted_at: float = 0.0
    ) -> bytes:
        """The text exposition, with the gauges set from a count taken at ``counted_at``
        (seconds since the epoch): a ``FleetCounts``, or the entries by status alone; None:
        no count yet, no gauge. The oldest pending entry's age is taken now, from its
        ``acceptedAt`` as counted: it grows between counts, as the backlog's does."""
        if counts is None:
            return generate_latest(self.registry)
        fleet = counts if isinstance(counts, FleetCounts) else FleetCounts(counts)
        for status in Status:
            self.entries.labels(status=str(status)).set(fleet.by_status.get(str(status), 0))
        self.entries_counted.set(counted_at)
        oldest = fleet.oldest_pending_ms
        age = 0.0 if oldest is None else max(0.0, time.time() - oldest / 1000)
        self.oldest_pending.set(age)
        self.in_turn.set(fleet.in_turn)
        return generate_latest(self.registry)
