"""The outcome classes a deliverer raises, and the errors Accept (and every input check) raises."""

from __future__ import annotations

import math


class InvalidInput(ValueError):
    """Bad input, refused before anything is written. ``code`` names the kind, stably: the
    HTTP API answers with it (and picks the status by it), callers may branch on it. A
    ValueError, as the library has always documented."""

    code: str = "invalid_input"


class InvalidId(InvalidInput):
    """A workspace, session or entry ID outside ``keys.ID_PATTERN``."""

    code = "invalid_id"


class TextTooLarge(InvalidInput):
    """A prompt text over ``validate.MAX_TEXT_BYTES`` of UTF-8 (HTTP 413, not 400)."""

    code = "text_too_large"


class InvalidEventId(InvalidInput):
    """A resume point (``Last-Event-ID``) that is not an event ID ``<ms>-<seq>``."""

    code = "invalid_event_id"


class Duplicate(Exception):
    """The clientMessageID was already accepted; ``accepted_id`` is the original entry's ID.

    Not a failure: callers answer with the original ID (HTTP 200).
    """

    def __init__(self, accepted_id: str) -> None:
        super().__init__(f"clientMessageID already accepted as {accepted_id}")
        self.accepted_id = accepted_id


class IdempotencyKeyReused(Exception):
    """The clientMessageID (idempotency key) was accepted within ``dedupe_ttl`` for another
    payload (text or model): a client bug, refused with nothing written, never taken for a
    duplicate (which would drop this prompt silently). ``accepted_id`` is the first entry's."""

    def __init__(self, accepted_id: str) -> None:
        super().__init__(
            f"clientMessageID already accepted as {accepted_id} for another text or model"
        )
        self.accepted_id = accepted_id


class SessionBusy(Exception):
    """An accept with ``while_busy="reject"`` found the session busy: it holds an entry that is
    pending, being delivered or being verified. Nothing was written."""

    def __init__(self) -> None:
        super().__init__("the session is busy: a prompt is waiting or being delivered")


class OutboxFull(Exception):
    """The session's outbox holds ``cap`` entries already: accept refuses it (docs/contract.md)."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"session outbox is full ({cap} entries)")
        self.cap = cap


class WorkspaceFull(OutboxFull):
    """The workspace holds ``workspace_cap`` entries already, over all its sessions (queued
    and staged): nothing was written. Deliveries, dismissals and cleanup make room. An
    ``OutboxFull`` too, so a caller that waits for room on a full session does the same here;
    ``cap`` is the workspace's."""

    def __init__(self, cap: int) -> None:
        Exception.__init__(self, f"workspace outbox is full ({cap} entries over its sessions)")
        self.cap = cap


class WorkspaceBytesFull(Exception):
    """The workspace is at its byte budget (``Tunables.workspace_budget_share`` of Valkey's
    ``maxmemory``): what it holds, counted in ``used`` bytes, would pass ``limit`` with this
    write. An accept, an edit or a client's retry (each logs a whole entry, and a retry re-arms
    one for more moves) is refused with nothing written; deliveries and every other move of
    what is already accepted go on. ``queued``: what its entries take (deliveries free it);
    ``logs``: its event logs' bytes, ``markers``: its dedupe and claim markers' (both counted
    in windows of the server's clock: time frees them). ``retry_after``: seconds until the
    windows passing alone bring it under the budget, or None when only deliveries can. Not an
    ``OutboxFull``, whose room deliveries always make."""

    def __init__(
        self,
        used: int,
        limit: int,
        retry_after: float | None,
        *,
        queued: int = 0,
        logs: int = 0,
        markers: int = 0,
    ) -> None:
        super().__init__(
            f"this workspace holds {used} bytes (queued entries {queued}, event logs {logs}, "
            f"dedupe and claim markers {markers}), and this write would take it past its "
            f"budget of {limit}: accepts, edits and retries are refused "
            + (
                f"for {math.ceil(retry_after)} s"
                if retry_after is not None
                else "until deliveries free room"
            )
        )
        self.used, self.limit, self.retry_after = used, limit, retry_after
        self.queued, self.logs, self.markers = queued, logs, markers


class StorageFull(Exception):
    """Valkey's memory is at ``Tunables.accept_memory_ratio`` of its ``maxmemory`` (on the node
    that holds the workspace): nothing was written. Accepts stop there so that deliveries,
    which free room, still have the rest (a Valkey past its maxmemory refuses them too). Send
    again later; ``used`` and ``limit`` are the node's bytes as read."""

    def __init__(self, used: int, limit: int) -> None:
        super().__init__(
            f"storage is nearly full ({used} of {limit} bytes of Valkey's maxmemory in use): "
            "accepts are refused until deliveries free room"
        )
        self.used, self.limit = used, limit


class NotDurable(Exception):
    """The entry IS written, but the wait for ``accept_durability`` did not confirm it within
    ``durability_timeout`` (a replica down or slow, a failover, AOF turned off since start).

    It may still be delivered; a failover before it reached the disk or replica may lose it.
    Send it again with the same clientMessageID: the retry finds the entry (``Duplicate`` with
    this ``entry_id``) once it is durable, or accepts it anew if it was lost. ``detail`` says
    what the wait saw.
    """

    def __init__(self, entry_id: str, level: str, detail: str) -> None:
        super().__init__(f"entry {entry_id} is written but not confirmed {level}: {detail}")
        self.entry_id, self.level, self.detail = entry_id, level, detail


class StorageFormatError(Exception):
    """Valkey holds data in a storage format newer than this prompt-outbox knows (a newer
    version has written there): nothing is read or written. Upgrade prompt-outbox on this
    machine, or point it at another Valkey (docs/design.md "Storage format")."""

    def __init__(self, found: str, known: int) -> None:
        super().__init__(
            f"Valkey holds prompt-outbox storage format {found}, newer than this version "
            f"knows ({known}): upgrade prompt-outbox before running it against this Valkey"
        )
        self.found, self.known = found, known


class _WrappedDeliveryError(Exception):
    """Base of the deliverer outcome wrappers: carries the underlying error as ``err``."""

    def __init__(self, err: BaseException | str) -> None:
        self.err: BaseException = err if isinstance(err, BaseException) else Exception(err)
        super().__init__(str(self.err))
        self.__cause__ = self.err


class AmbiguousError(_WrappedDeliveryError):
    """The send's outcome is UNKNOWN (timeout mid-turn, transport cut): verify, never re-send."""


class TransientDeliveryError(_WrappedDeliveryError):
    """No attempt was driven (endpoint resolve failed...): retry without minting an attempt."""


class PriorAttemptPendingError(_WrappedDeliveryError):
    """The prior attempt's ledger row is still pending: retry without minting an attempt."""


def ambiguous(err: BaseException | str) -> AmbiguousError:
    """Wrap ``err`` as an unknown-outcome failure: ``raise ambiguous(exc) from exc``."""
    return AmbiguousError(err)


def transient(err: BaseException | str) -> TransientDeliveryError:
    """Wrap ``err`` as a failure in which no attempt was driven."""
    return TransientDeliveryError(err)


def prior_attempt_pending(err: BaseException | str) -> PriorAttemptPendingError:
    """Wrap ``err`` as the agent still owning the prior attempt."""
    return PriorAttemptPendingError(err)
