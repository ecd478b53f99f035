/**
 * `OutboxClient`: the whole API of one prompt-outbox service, for browsers and Node.
 *
 * @module
 */
import { Backoff, type BackoffOptions } from "./backoff.js";
import { OutboxError } from "./errors.js";
import { sessionPath, Transport, type FetchLike, type TokenSource } from "./http.js";
import { postUntilAnswered, type SendResult } from "./send.js";
import { MemoryStore, type PendingPrompt, type PromptStore } from "./store.js";
import type {
  BulkResult,
  Edited,
  EditFields,
  Entry,
  EntryList,
  Me,
  Retried,
  SessionHistory,
  SessionPage,
  Ticket,
  TurnInfo,
  WhileBusy,
  WorkspacePage,
  WorkspaceSeries,
} from "./types.js";
import {
  watchSession,
  type TicketProvider,
  type WatchHandle,
  type WatchHandlers,
  type WatchOptions,
} from "./watch.js";

/** How to reach the service. */
export interface OutboxClientOptions {
  /** The service's origin (and path prefix, if any), e.g. `http://127.0.0.1:8080`. */
  baseUrl: string;
  /** The bearer token, or a function giving the current one. Leave out with `--no-auth`. */
  token?: TokenSource;
  /** The fetch to use (default: the global `fetch`). */
  fetch?: FetchLike;
  /** Where unacknowledged prompts wait (default: a `MemoryStore`). */
  store?: PromptStore;
  /** The spacing of send retries and watch reconnects. */
  backoff?: BackoffOptions;
  /**
   * How `watch` authenticates its stream. `"header"` (the default): the bearer token in an
   * `Authorization` header. `"ticket"`: before each (re)connect, mint a stream ticket with the
   * token (`ticket(ws)`) and open the stream with `?ticket=`. A function: call it before each
   * (re)connect for a ticket (e.g. from your own backend) and send no token with the stream.
   */
  streamAuth?: "header" | "ticket" | TicketProvider;
}

/** Options of one `send`. */
export interface SendOptions {
  /** The agent's model selector: any JSON value, passed through byte for byte. */
  model?: unknown;
  /**
   * What to do if the session is busy: `enqueue` (the default), `reject` (409 `session_busy`,
   * a final refusal), or `interrupt` (accepted, and the agent's turn in flight is aborted
   * where the deliverer can; the type follows the schema).
   */
  whileBusy?: WhileBusy;
  /** Abort the send (the prompt stays in the store: `resumePending` finishes it). */
  signal?: AbortSignal;
}

/** Options of a thin call. */
export interface CallOptions {
  signal?: AbortSignal;
}

/** Options of a paged listing. */
export interface PageOptions extends CallOptions {
  /** The previous page's `next` (leave out for the first page). */
  cursor?: string;
  /** Items per page (1 to 200; the server's default is 20). */
  limit?: number;
}

/** What `resumePending` did with one stored prompt. */
export type ResumeResult =
  | { prompt: PendingPrompt; ok: true; result: SendResult }
  | { prompt: PendingPrompt; ok: false; error: unknown };

/**
 * A client of one prompt-outbox service.
 *
 * Sending is idempotent and survives reloads: `send` writes the prompt to the store under a
 * fresh key before the first POST, retries with that key until the service answers for
 * good, and only then removes it; `resumePending` re-sends what a previous page left there.
 */
export class OutboxClient {
  /** The store of unacknowledged prompts. */
  readonly store: PromptStore;
  private readonly transport: Transport;
  private readonly backoff: Backoff;
  private readonly streamAuth: OutboxClientOptions["streamAuth"];
  private readonly inFlight = new Set<string>();

  constructor(options: OutboxClientOptions) {
    this.transport = new Transport(options.baseUrl, options.token, options.fetch);
    this.store = options.store ?? new MemoryStore();
    this.backoff = new Backoff(options.backoff);
    this.streamAuth = options.streamAuth ?? "header";
  }

  /**
   * Hand a prompt to the outbox, exactly once.
   *
   * Mints a key (`crypto.randomUUID()`), saves the prompt in the store, then POSTs it with
   * the key as `Idempotency-Key` and `clientMessageID`. No answer, 408, 429 and 5xx (503
   * `not_durable` included) are retried with the same key, after exponential backoff with
   * full jitter (at least `Retry-After`). A 2xx resolves (202 accepted, or 200: a replay,
   * the prompt was already there) and removes the prompt from the store. A 401 or 403
   * (`isAuth`: the token, not the prompt) rejects and keeps it, for `resumePending` with a
   * new token. Any other 4xx removes it and rejects with that `OutboxError` (for 422
   * `idempotency_key_reused`, its `id` is the entry the key was first accepted as). An
   * abort, or running out of `backoff.maxAttempts`, rejects and leaves it in the store.
   */
  async send(ws: string, ses: string, text: string, options: SendOptions = {}): Promise<SendResult> {
    const prompt: PendingPrompt = { key: crypto.randomUUID(), ws, ses, text, createdAt: Date.now() };
    if (options.model !== undefined) prompt.model = options.model;
    if (options.whileBusy !== undefined) prompt.whileBusy = options.whileBusy;
    this.inFlight.add(prompt.key);
    try {
      await this.store.save(prompt);
      return await this.deliver(prompt, options.signal);
    } finally {
      this.inFlight.delete(prompt.key);
    }
  }

  /**
   * Send again every prompt in the store that no `send` of this client is working on (what a
   * page that reloaded mid-send left behind), each with its own key, so each lands once.
   * Within a session they go one after the other, oldest first; sessions go in parallel.
   * Never rejects: each prompt's outcome is in the results (same rules as `send`).
   */
  async resumePending(options: CallOptions = {}): Promise<ResumeResult[]> {
    const stored = (await this.store.all())
      .filter((p) => !this.inFlight.has(p.key))
      .sort((a, b) => a.createdAt - b.createdAt);
    const bySession = new Map<string, PendingPrompt[]>();
    for (const prompt of stored) {
      const name = JSON.stringify([prompt.ws, prompt.ses]);
      bySession.set(name, [...(bySession.get(name) ?? []), prompt]);
    }
    const outcomes = new Map<string, ResumeResult>();
    await Promise.all(
      [...bySession.values()].map(async (prompts) => {
        for (const prompt of prompts) {
          this.inFlight.add(prompt.key);
          try {
            const result = await this.deliver(prompt, options.signal);
            outcomes.set(prompt.key, { prompt, ok: true, result });
          } catch (error) {
            outcomes.set(prompt.key, { prompt, ok: false, error });
          } finally {
            this.inFlight.delete(prompt.key);
          }
        }
      }),
    );
    return stored.flatMap((p) => {
      const outcome = outcomes.get(p.key);
      return outcome === undefined ? [] : [outcome];
    });
  }

  /**
   * Follow a session: `onReset` with the whole queue, then `onUpdate` per change, over SSE
   * read with `fetch`. After a break it reconnects (exponential backoff) with `Last-Event-ID`,
   * and gets exactly the changes it missed (or a fresh reset if the server no longer has
   * them). See `OutboxClientOptions.streamAuth` for tickets. Returns at once; `close()` stops.
   */
  watch(ws: string, ses: string, handlers: WatchHandlers, options: WatchOptions = {}): WatchHandle {
    let ticket: TicketProvider | undefined;
    if (this.streamAuth === "ticket") {
      ticket = async (forWs, signal) => (await this.ticket(forWs, { signal })).ticket;
    } else if (typeof this.streamAuth === "function") {
      ticket = this.streamAuth;
    }
    return watchSession(
      { transport: this.transport, backoff: this.backoff, ticket },
      ws,
      ses,
      handlers,
      options,
    );
  }

  /** The session's entries in FIFO order (staged first). */
  async list(ws: string, ses: string, options: CallOptions = {}): Promise<Entry[]> {
    const path = sessionPath(ws, ses, "/prompts");
    const answer = await this.transport.json<EntryList>("GET", path, { signal: options.signal });
    return answer.entries;
  }

  /**
   * Re-arm an `error` entry. `OutboxError` 404 (`isNotFound`) when there is no error entry
   * with that ID; 409 `busy` (`isBusy`) while a delivery holds the session.
   */
  async retry(ws: string, ses: string, id: string, options: CallOptions = {}): Promise<Retried> {
    const path = sessionPath(ws, ses, `/prompts/${encodeURIComponent(id)}/retry`);
    return this.transport.json<Retried>("POST", path, { signal: options.signal });
  }

  /** Remove an entry. `OutboxError` 404 when absent; 409 `busy` while a delivery holds the session. */
  async dismiss(ws: string, ses: string, id: string, options: CallOptions = {}): Promise<void> {
    const path = sessionPath(ws, ses, `/prompts/${encodeURIComponent(id)}`);
    await this.transport.json<undefined>("DELETE", path, { signal: options.signal });
  }

  /**
   * Replace the text or model (`model: null` removes it) of a `pending` or `error` entry
   * before it is sent. `OutboxError` 404 when absent; 409 `busy` while a delivery holds the
   * session, 409 `not_editable` once it is staged, verifying or parked.
   */
  async edit(
    ws: string,
    ses: string,
    id: string,
    changes: EditFields,
    options: CallOptions = {},
  ): Promise<Edited> {
    const path = sessionPath(ws, ses, `/prompts/${encodeURIComponent(id)}`);
    return this.transport.json<Edited>("PATCH", path, { body: changes, signal: options.signal });
  }

  /**
   * The session's turn while it is held in one (the agent works on a delivered prompt, and
   * the next entry waits for the turn to end); `null` when it is not (404 `no_turn`). The
   * event stream says when a turn begins and ends; this reads it at any moment, e.g. after a
   * reload whose queue is empty.
   */
  async turn(ws: string, ses: string, options: CallOptions = {}): Promise<TurnInfo | null> {
    try {
      const path = sessionPath(ws, ses, "/turn");
      return await this.transport.json<TurnInfo>("GET", path, { signal: options.signal });
    } catch (err) {
      if (err instanceof OutboxError && err.status === 404 && err.code === "no_turn") return null;
      throw err;
    }
  }

  /** Who the token speaks for: its user, whether it is an admin token, its workspaces. */
  async me(options: CallOptions = {}): Promise<Me> {
    return this.transport.json<Me>("GET", "/v1/me", { signal: options.signal });
  }

  /**
   * A page of workspaces with their entries by status (every workspace holding work for an
   * admin token, the token's own otherwise). Pass the answer's `next` for the next page.
   */
  async workspaces(options: PageOptions = {}): Promise<WorkspacePage> {
    return this.transport.json<WorkspacePage>("GET", "/v1/workspaces", {
      query: pageQuery(options),
      signal: options.signal,
    });
  }

  /** A page of the workspace's sessions holding entries, busiest first, with their counts. */
  async sessions(ws: string, options: PageOptions = {}): Promise<SessionPage> {
    const path = `/v1/workspaces/${encodeURIComponent(ws)}/sessions`;
    return this.transport.json<SessionPage>("GET", path, {
      query: pageQuery(options),
      signal: options.signal,
    });
  }

  /**
   * The workspace's last minutes (`minutes`, 1 to 60, default 60), oldest first: prompts
   * accepted, delivered and failed each minute, and how long its oldest pending entry had
   * waited at the minute's end (`oldestPendingFor`, ns; null when not known).
   */
  async series(ws: string, options: CallOptions & { minutes?: number } = {}): Promise<WorkspaceSeries> {
    const path = `/v1/workspaces/${encodeURIComponent(ws)}/series`;
    const minutes = options.minutes === undefined ? undefined : String(options.minutes);
    return this.transport.json<WorkspaceSeries>("GET", path, { query: { minutes }, signal: options.signal });
  }

  /**
   * The session's recently delivered prompts, newest first: when each was sent and its turn
   * (ID, how long it took in ns, why it ended; null while it runs), from the newest `events`
   * (1 to 200, default 100) of its event log.
   */
  async history(
    ws: string,
    ses: string,
    options: CallOptions & { events?: number } = {},
  ): Promise<SessionHistory> {
    const events = options.events === undefined ? undefined : String(options.events);
    return this.transport.json<SessionHistory>("GET", sessionPath(ws, ses, "/history"), {
      query: { events },
      signal: options.signal,
    });
  }

  /**
   * Re-arm every error entry of the session, or of every session of the workspace when `ses`
   * is left out. Sessions a delivery holds are skipped and named in `busy` (try again).
   */
  async retryErrors(ws: string, ses?: string, options: CallOptions = {}): Promise<BulkResult> {
    return this.transport.json<BulkResult>("POST", errorsPath(ws, ses, "retry"), {
      signal: options.signal,
    });
  }

  /** Remove every error entry of the session (or of the workspace), as `retryErrors`. */
  async dismissErrors(ws: string, ses?: string, options: CallOptions = {}): Promise<BulkResult> {
    return this.transport.json<BulkResult>("POST", errorsPath(ws, ses, "dismiss"), {
      signal: options.signal,
    });
  }

  /** Park every pending and verifying entry of the workspace, with a reason (admin). */
  async park(ws: string, reason: string, options: CallOptions = {}): Promise<{ parked: number }> {
    const path = `/v1/workspaces/${encodeURIComponent(ws)}/park`;
    return this.transport.json("POST", path, { body: { reason }, signal: options.signal });
  }

  /** Re-arm the workspace's parked entries (admin). */
  async unpark(ws: string, options: CallOptions = {}): Promise<{ unparked: number }> {
    const path = `/v1/workspaces/${encodeURIComponent(ws)}/unpark`;
    return this.transport.json("POST", path, { signal: options.signal });
  }

  /** Re-arm unverifiable errors, and settle error entries against the ledger probe (admin). */
  async sweep(
    ws: string,
    options: CallOptions = {},
  ): Promise<{ unverifiable: number; parkedErrors: number }> {
    const path = `/v1/workspaces/${encodeURIComponent(ws)}/sweep`;
    return this.transport.json("POST", path, { signal: options.signal });
  }

  /** A stream ticket for the workspace's event streams (valid `expiresIn` seconds). */
  async ticket(ws: string, options: CallOptions = {}): Promise<Ticket> {
    const path = `/v1/workspaces/${encodeURIComponent(ws)}/events/ticket`;
    return this.transport.json<Ticket>("POST", path, { signal: options.signal });
  }

  /** POST a stored prompt until answered; remove it from the store unless it may still land. */
  private async deliver(prompt: PendingPrompt, signal?: AbortSignal): Promise<SendResult> {
    let result: SendResult;
    try {
      result = await postUntilAnswered(this.transport, this.backoff, prompt, signal);
    } catch (err) {
      // Refused for its token (401, 403): kept, so that resumePending sends it with a new one.
      if (err instanceof OutboxError && !err.retryable && !err.isAuth) {
        await this.store.remove(prompt.key);
      }
      throw err;
    }
    await this.store.remove(prompt.key);
    return result;
  }
}

function pageQuery(options: PageOptions): Record<string, string | undefined> {
  return {
    cursor: options.cursor,
    limit: options.limit === undefined ? undefined : String(options.limit),
  };
}

function errorsPath(ws: string, ses: string | undefined, action: "retry" | "dismiss"): string {
  const base = ses === undefined ? `/v1/workspaces/${encodeURIComponent(ws)}` : sessionPath(ws, ses);
  return `${base}/errors/${action}`;
}
