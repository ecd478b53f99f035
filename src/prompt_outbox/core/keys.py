"""The storage layout (docs/design.md, "Storage layout") and the ID checks that keep callers
inside it."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from .errors import InvalidId, InvalidInput

ID_PATTERN = r"^\.*[A-Za-z0-9_-][A-Za-z0-9._-]*$"
"""Workspace, session and entry IDs: 1 to ``MAX_ID_LENGTH`` characters of ``[A-Za-z0-9._-]``,
not only dots. Braces, colons and whitespace would break the key layout (or reach another
tenant's keys); ``.`` and ``..`` are path segments a URL normaliser removes (an agent server
would get ``/session/../message`` as ``/message``). The HTTP API declares this same pattern,
with ``maxLength``, in its OpenAPI (no look-ahead: neither pydantic's regex engine nor every
JSON Schema tool has one)."""

MAX_ID_LENGTH = 128

CLIENT_MESSAGE_ID_PATTERN = r"^[!-~]{1,256}$"
"""A clientMessageID is an opaque dedupe key: 1-256 visible ASCII characters (no spaces)."""

_ID = re.compile(ID_PATTERN)
_CLIENT_MESSAGE_ID = re.compile(CLIENT_MESSAGE_ID_PATTERN)

LEGACY_WORKSPACES = "outboxworkspaces"
"""The registry before the due index (a ZSET workspace -> last accept ms). Read once at start
(``Store.migrate_legacy_registry``) and folded into the buckets, then deleted."""

FORMAT_KEY = "outboxformat"
"""STRING: the newest storage format that has written to this Valkey (``STORAGE_FORMAT``)."""

STORAGE_FORMAT = 2
"""The shape of every key above, as this version writes and reads it. A change that older
code would misread raises it, and each start refuses a store of a newer format
(docs/design.md "Storage format"). 1: before the format was recorded (up to the security
release); 2: turns (``turn:`` lock values, ``outboxturns``, ``outboxturnend``, ``OWNERS``)."""

OWNERS = "outboxowners"
"""ZSET worker ID -> ms its heartbeat lapses: the workers that own turns (core/turns.py). One
key for the whole store, one write per worker per beat."""

WORKSPACE_KEY_PREFIXES: tuple[str, ...] = (
    "outboxq:",
    "outboxd:",
    "outboxlock:",
    "outboxev:",
    "outboxdedupe:",
    "outboxdedupefp:",
    "outboxclaim:",
    "outboxready:",
    "outboxsessions:",
    "outboxerrors:",
    "outboxnotify:",
    "outboxnotifydue:",
    "outboxcount:",
    "outboxoldest:",
    "outboxlogbytes:",
    "outboxturns:",
    "outboxturnend:",
    "outboxseries:",
    "outboxinturn:",
)
"""The prefix of every key that belongs to one workspace: each is ``<prefix>{<ws>}``, alone
or followed by ``:`` and the rest. Cleanup deletes exactly the keys under these
(``WorkspaceKeys.owns``); a test drives every script and checks each key written is under one.
The due index's bucket keys (``BucketKeys``) are shared by many workspaces and not listed."""

COUNT_TOTAL = ":total"
"""The field of ``WorkspaceKeys.count`` that holds the workspace's entries in all (a colon:
no session ID can take the name). ``storage/scripts.py`` hands it to the Lua prelude."""

BYTES_TOTAL = ":bytes"
"""The field of ``WorkspaceKeys.count`` that holds what the workspace's queues and staging
lists take in memory, in bytes (the sum of its ``bytes_field`` fields): the queued part of its
byte budget (``lua/lib.lua`` ``sized``)."""

COUNT_SEP = "|"
"""In the fields of ``WorkspaceKeys.count`` that the overview's tally keeps: ``<ses>|tally``, a
session's entries in each status and the send start of its staged entry, packed in one field
(``lua/lib.lua``, "the tally"). The workspace's entries by status are ``:<status>`` (a colon,
as ``COUNT_TOTAL``). No ID holds either sign."""


def tally_field(ses: str) -> str:
    """The count HASH's field of a session's tally (read by ``lua/tally.lua``)."""
    return f"{ses}{COUNT_SEP}tally"


def bytes_field(ses: str) -> str:
    """The count HASH's field of what a session's queue and staging take in memory (bytes)."""
    return f"{ses}{COUNT_SEP}bytes"


def status_total(status: str) -> str:
    """The count HASH's field of the workspace's entries in ``status``."""
    return f":{status}"


BUCKETS = 8
"""How many buckets the due index and the registry are split into. Part of the layout: every
process must agree on it. A run loop reads each bucket once per tick, whatever the number of
workspaces (docs/design.md, "Finding due work")."""


def bucket_of(ws: str) -> int:
    """The bucket a workspace's due mark and registry entry live in (stable across processes)."""
    return zlib.crc32(ws.encode()) % BUCKETS


@dataclass(frozen=True, slots=True)
class BucketKeys:
    """One bucket of the due index; its keys and wake channel share the ``{outbox-b<N>}`` tag."""

    bucket: int

    @property
    def due(self) -> str:
        """ZSET workspace -> ms by which a run loop must visit it (a lower bound of its work)."""
        return f"outboxdue:{{outbox-b{self.bucket}}}"

    @property
    def registry(self) -> str:
        """HASH workspace -> server time (us) of the last mark: the workspace registry, and the
        generation a run loop compares before it raises or removes a mark."""
        return f"outboxregistry:{{outbox-b{self.bucket}}}"

    @property
    def pending(self) -> str:
        """HASH workspace -> "<n>:<us>": marks made BEFORE a transition whose AFTER mark has not
        come yet, and the server time (us) of the latest. A loop keeps the mark of a workspace
        with such a writer (one younger than the grace) instead of dropping it."""
        return f"outboxpending:{{outbox-b{self.bucket}}}"

    @property
    def wake(self) -> str:
        """Shard channel (SPUBLISH) a mark after a transition publishes its workspace on, so
        waiting run loops look at once. In the bucket's slot: mark.lua publishes it."""
        return f"outboxwake:{{outbox-b{self.bucket}}}"

    def script_keys(self) -> list[str]:
        return [self.due, self.registry, self.pending]


def buckets() -> list[BucketKeys]:
    return [BucketKeys(b) for b in range(BUCKETS)]


def check_id(kind: str, value: object) -> str:
    """Return ``value`` if it is a safe workspace / session / entry ID, else raise InvalidId."""
    if not isinstance(value, str) or len(value) > MAX_ID_LENGTH or not _ID.fullmatch(value):
        raise InvalidId(
            f"{kind} must be 1-{MAX_ID_LENGTH} characters of [A-Za-z0-9._-], not only dots, "
            f"got {value!r}"
        )
    return value


def check_client_message_id(value: object) -> str:
    """Return ``value`` if it is a valid clientMessageID, else raise InvalidInput."""
    if not isinstance(value, str) or not _CLIENT_MESSAGE_ID.fullmatch(value):
        raise InvalidInput(
            f"clientMessageID must be 1-256 visible ASCII characters (no spaces), got {value!r}"
        )
    return value


@dataclass(frozen=True, slots=True)
class WorkspaceKeys:
    """Per-workspace index keys; all share the ``{ws}`` hash tag with the session keys."""

    ws: str

    @property
    def sessions(self) -> str:
        """SET of sessions holding any entry (queue or staging)."""
        return f"outboxsessions:{{{self.ws}}}"

    @property
    def ready(self) -> str:
        """ZSET session -> ms when it next needs a worker (head due time, or lease expiry)."""
        return f"outboxready:{{{self.ws}}}"

    @property
    def errors(self) -> str:
        """SET of sessions holding at least one error entry (the parked-error sweep's work)."""
        return f"outboxerrors:{{{self.ws}}}"

    @property
    def notices(self) -> str:
        """HASH ``ses:entry_id`` -> claimed entry JSON: OnDelivered calls owed (the journal)."""
        return f"outboxnotify:{{{self.ws}}}"

    @property
    def notices_due(self) -> str:
        """ZSET ``ses:entry_id`` -> ms after which another worker fires the owed call again."""
        return f"outboxnotifydue:{{{self.ws}}}"

    @property
    def count(self) -> str:
        """HASH session -> its entries (queue plus staging), and ``COUNT_TOTAL`` -> their sum:
        what the workspace quota (``Tunables.workspace_cap``) counts, kept exact by every
        session script (``lib.lua`` ``count``). Beside them, the overview's tally, kept by
        the same scripts (``lib.lua``, "the tally"): ``tally_field`` and ``status_total``;
        and the bytes its lists take (``bytes_field``, ``BYTES_TOTAL``: ``lib.lua`` ``sized``)."""
        return f"outboxcount:{{{self.ws}}}"

    @property
    def oldest(self) -> str:
        """ZSET session -> acceptedAt (ms) of its oldest pending entry (the first pending one
        in its queue): the overview's "oldest pending", per session and per workspace."""
        return f"outboxoldest:{{{self.ws}}}"

    @property
    def log_bytes(self) -> str:
        """HASH: what the workspace wrote that expires on its own, in bytes per window of
        the server's clock: its event logs (field ``<w>``, windows of ``event_log_ttl``,
        kept by ``lib.lua`` ``emit``), its dedupe and claim markers (``m<w>``, windows of
        their longest life), and each session log's bytes since it began (field: the log's
        key). The current and the previous windows hold every byte still held: with the
        queued bytes, what the workspace's byte budget counts (``lib.lua`` ``budget().over``)."""
        return f"outboxlogbytes:{{{self.ws}}}"

    @property
    def turns(self) -> str:
        """HASH session -> owner: the workspace's turns held by a running worker (core/turns.py),
        where another looks for them when that worker's heartbeat lapses (``OWNERS``)."""
        return f"outboxturns:{{{self.ws}}}"

    @property
    def in_turn(self) -> str:
        """ZSET session -> when its turn's lock lapses at the latest (server ms): every session
        a claim put in turn, owned or not (``complete.lua``), until its turn ends
        (``turn_end.lua``) or lapses (pruned at the next turn's start; the key expires with
        the last lock). A superset: its reader checks each lock (the metrics' in-turn count)."""
        return f"outboxinturn:{{{self.ws}}}"

    @property
    def series(self) -> str:
        """HASH, a ring of per-minute fields: the workspace's prompts accepted, delivered and
        failed each minute, and its oldest pending entry then (``lib.lua`` ``series``; read by
        ``storage/series.py``). Expires two hours after its last minute."""
        return f"outboxseries:{{{self.ws}}}"

    @property
    def bucket(self) -> BucketKeys:
        return BucketKeys(bucket_of(self.ws))

    @property
    def scan_pattern(self) -> str:
        """SCAN MATCH for this workspace's keys, as a prefilter only: its ``*`` also spans
        another workspace's name (``outboxq:{other}:{ws}``, a session named like this
        workspace). ``owns`` decides."""
        return f"outbox*:{{{self.ws}}}*"

    def owns(self, key: str) -> bool:
        """Whether ``key`` is this workspace's: ``<prefix>{ws}`` at its start, for a prefix
        of ``WORKSPACE_KEY_PREFIXES``. Exact, because an ID holds no brace: ``{acme}`` is
        not the start of ``{acme2}``, and ``outboxq:{other}:{acme}`` starts with ``{other}``."""
        return key.startswith(tuple(f"{p}{{{self.ws}}}" for p in WORKSPACE_KEY_PREFIXES))


@dataclass(frozen=True, slots=True)
class SessionKeys:
    ws: str
    ses: str

    @property
    def workspace(self) -> WorkspaceKeys:
        return WorkspaceKeys(self.ws)

    @property
    def queue(self) -> str:
        return f"outboxq:{{{self.ws}}}:{{{self.ses}}}"

    @property
    def staging(self) -> str:
        return f"outboxd:{{{self.ws}}}:{{{self.ses}}}"

    @property
    def lock(self) -> str:
        return f"outboxlock:{{{self.ws}}}:{{{self.ses}}}"

    @property
    def events(self) -> str:
        """STREAM: the session's capped event log (accepted, delivering, sent...), for SSE."""
        return f"outboxev:{{{self.ws}}}:{{{self.ses}}}"

    def dedupe(self, client_message_id: str) -> str:
        return f"outboxdedupe:{{{self.ws}}}:{{{self.ses}}}:{client_message_id}"

    def fingerprint(self, client_message_id: str) -> str:
        """STRING beside the dedupe marker, same TTL: the first accept's payload fingerprint
        (a key reused for another text or model is refused, not taken for a duplicate)."""
        return f"outboxdedupefp:{{{self.ws}}}:{{{self.ses}}}:{client_message_id}"

    @property
    def early_end(self) -> str:
        """STRING, a minute: the turn ID an end named before any turn of it was held (the
        agent's end can outrun the claim that holds its turn): the claim then holds none.
        Written only while the session has a send in flight (turn_end.lua)."""
        return f"outboxturnend:{{{self.ws}}}:{{{self.ses}}}"

    def claim(self, entry_id: str) -> str:
        """Who claimed this entry (complete.lua): lets a claimer whose reply was lost know."""
        return f"outboxclaim:{{{self.ws}}}:{{{self.ses}}}:{entry_id}"

    def script_keys(self) -> list[str]:
        """The KEYS every session transition script takes, in this order."""
        w = self.workspace
        return [
            self.queue,
            self.staging,
            self.lock,
            w.ready,
            w.sessions,
            w.errors,
            self.events,
            w.count,
            w.oldest,
            w.log_bytes,
        ]


def session_keys(ws: str, ses: str) -> SessionKeys:
    return SessionKeys(check_id("workspace ID", ws), check_id("session ID", ses))


def workspace_keys(ws: str) -> WorkspaceKeys:
    return WorkspaceKeys(check_id("workspace ID", ws))
