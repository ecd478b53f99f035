/**
 * The API's bodies and answers, named. Every type here is derived from the generated
 * `schema.ts` (openapi-typescript over `openapi.json`), except where a comment says it is
 * hand-written because the OpenAPI document does not describe it.
 *
 * @module
 */
import type { components, paths } from "./schema.js";

type Schemas = components["schemas"];
type PromptsRoute = paths["/v1/workspaces/{ws}/sessions/{ses}/prompts"];

/** One queued prompt, as `list()` and the event stream give it (the API's `EntryOut`). */
export type Entry = Schemas["EntryOut"];
/** Where an entry stands: `pending`, `delivering`, `verifying`, `error` or `parked`. */
export type EntryStatus = Entry["status"];
/** The answer to an accept: 202 `{id, status}`, or 200 `{id, duplicate: true}` for a replay. */
export type Accepted = Schemas["Accepted"];
/** Every refusal's JSON: a stable `error` code, a `detail`, and for some codes an `id`. */
export type ErrorBody = Schemas["ErrorBody"];
/** A stream ticket: `{ticket, expiresIn}` (seconds). */
export type Ticket = Schemas["Ticket"];
/** The answer to `retry()`: `{id, status: "pending"}`. */
export type Retried = Schemas["Retried"];
/** The answer to `edit()`: `{id, edited: true}`. */
export type Edited = Schemas["EditedOut"];
/** The answer to `list()`: `{entries}`, in FIFO order (also a `queue.reset`'s data). */
export type EntryList = Schemas["EntryList"];
/** Entries by status: `{pending, delivering, verifying, error, parked}`. */
export type Counts = Schemas["CountsOut"];
/** A workspace in the overview: its sessions, entries, counts, and `oldestPendingFor` (ns). */
export type WorkspaceSummary = Schemas["WorkspaceOut"];
/** A page of workspaces, and the cursor of the next (`null` after the last). */
export type WorkspacePage = Schemas["WorkspacePage"];
/** A session in the overview: counts, `oldestPendingFor`, `deliveringFor`, `blockedFor` (ns). */
export type SessionSummary = Schemas["SessionOut"];
/** A page of a workspace's sessions, busiest first, and the cursor of the next. */
export type SessionPage = Schemas["SessionPage"];
/** One minute of a workspace's series: `{at, accepted, delivered, failed, oldestPendingFor}` (ns). */
export type SeriesMinute = Schemas["MinuteOut"];
/** The answer to `series()`: `{minutes}`, oldest first, the current minute last. */
export type WorkspaceSeries = Schemas["SeriesOut"];
/** A delivered prompt of a session's history: `{id, sentAt, turn, turnFor, turnEnded}`. */
export type DeliveredPrompt = Schemas["DeliveredOut"];
/** The answer to `history()`: `{delivered}`, newest first. */
export type SessionHistory = Schemas["HistoryOut"];
/** A bulk action's answer: `{done, busy}` (the sessions a delivery held: try again). */
export type BulkResult = Schemas["BulkOut"];
/** Who the token speaks for: `{user, admin, workspaces}`. */
export type Me = Schemas["MeOut"];
/**
 * The session's turn, while it is held in one (`turn()`): `{turn, entry, seconds, why}`: the
 * turn ID, the delivered entry it works on, how long it has lasted (seconds), and why it is
 * still held when the agent could not say whether it ended ("" otherwise).
 */
export type TurnInfo = Schemas["TurnOut"];

/** The accept's POST body: `{clientMessageID, text, model?, whileBusy?}`. */
export type PromptBody = PromptsRoute["post"]["requestBody"]["content"]["application/json"];
/** What an accept does when the session is busy: the API's `whileBusy` values (`enqueue`, the default, `reject`, ...). */
export type WhileBusy = NonNullable<PromptBody["whileBusy"]>;

/**
 * The PATCH body of `edit()`: a new `text`, a new `model` (`null` removes it), or both.
 *
 * Derived from the accept's body: the generated type of the PATCH body is `unknown`, because
 * openapi-typescript turns its `anyOf` (text or model required) into `... | unknown`. The
 * fields are the accept's, with the same rules.
 */
export type EditFields = Partial<Pick<PromptBody, "text" | "model">>;

/**
 * What a `queue.update` says happened (hand-written: the OpenAPI document does not describe
 * the event stream's messages). `sent` (delivered and gone) and `dismissed` carry no entry;
 * `turn` (the delivered entry `id`'s agent turn began: the session is held until it ends) and
 * `turn_ended` carry no entry but a `turn`; the others are the entry's new status, or
 * `accepted` / `edited`.
 */
export type UpdateKind =
  | "accepted"
  | "delivering"
  | "sent"
  | "pending"
  | "verifying"
  | "error"
  | "parked"
  | "edited"
  | "dismissed"
  | "turn"
  | "turn_ended"
  | (string & {});

/**
 * Why a turn ended (a `turn_ended` update's `turn.why`): `ended` (the agent said so),
 * `ceiling` (still running at the turn ceiling: aborted and let go), `unreachable` (the
 * agent never said, until the ceiling and its grace had passed: let go).
 */
export type TurnEndReason = "ended" | "ceiling" | "unreachable" | (string & {});

/**
 * The turn a `turn` / `turn_ended` update is about (hand-written, as `UpdateKind`).
 */
export interface TurnNews {
  /** The agent's turn ID (any printable characters, at most 200). */
  readonly id: string;
  /** How long the turn lasted, in seconds: 0 on `turn`. */
  readonly seconds: number;
  /** Why it ended, on `turn_ended`; "" on `turn`. */
  readonly why: TurnEndReason;
}

/**
 * `event: queue.reset`: the whole queue as of `eventId` (hand-written wrapper; `entries` are
 * the generated `Entry`). It is the first message of a stream, and comes again only when a
 * resume point is no longer in the server's capped log.
 */
export interface QueueReset {
  readonly type: "reset";
  /** The SSE `id:`: the resume point. */
  readonly eventId: string;
  readonly entries: Entry[];
}

/**
 * `event: queue.update`: one change (hand-written wrapper over the data `{kind, id, entry,
 * turn?}`). `entry` is the entry's new state (the stored form: an `Entry` without
 * `blockedByInFlight` / `inFlightFor` / `inTurnFor`), or `null` once it is gone (`sent`,
 * `dismissed`) and on `turn` / `turn_ended`, which carry `turn` instead.
 */
export interface QueueUpdate {
  readonly type: "update";
  /** The SSE `id:`: the resume point. */
  readonly eventId: string;
  readonly kind: UpdateKind;
  /** The entry's ID (on `turn` / `turn_ended`: the delivered entry the turn works on). */
  readonly id: string;
  readonly entry: Entry | null;
  /** On `turn` and `turn_ended` only: which turn, how long it lasted, why it ended. */
  readonly turn?: TurnNews;
}

/** A message of a session's event stream. */
export type QueueEvent = QueueReset | QueueUpdate;
