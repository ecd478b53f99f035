/**
 * A session's event stream: SSE read over `fetch` (so it can carry the `Authorization`
 * header), parsed with eventsource-parser, resumed by `Last-Event-ID` after every break.
 *
 * @module
 */
import { createParser, type EventSourceMessage } from "eventsource-parser";
import { Backoff, sleep } from "./backoff.js";
import { OutboxError } from "./errors.js";
import { sessionPath, type Transport } from "./http.js";
import type { Entry, EntryList, QueueEvent, QueueReset, QueueUpdate, TurnNews } from "./types.js";

/** Returns a fresh stream ticket for a workspace (see `OutboxClientOptions.streamAuth`). */
export type TicketProvider = (ws: string, signal: AbortSignal) => Promise<string>;

/** What `watch` calls. Every handler is optional. */
export interface WatchHandlers {
  /** The whole queue: on the first connection, and whenever a resume point was lost. */
  onReset?(event: QueueReset): void;
  /** One change. */
  onUpdate?(event: QueueUpdate): void;
  /** Either of the above, after its own handler. */
  onEvent?(event: QueueEvent): void;
  /** Each time a stream is open (its status was 200), before its first event. */
  onOpen?(): void;
  /**
   * Something went wrong. `willRetry` true: the stream broke (or a handler threw) and the
   * watch goes on, reconnecting with `Last-Event-ID` after a backoff. `willRetry` false: a
   * final refusal (401, 403, 400 ...) ended the watch.
   */
  onError?(error: unknown, willRetry: boolean): void;
}

/** Options of one `watch`. */
export interface WatchOptions {
  /** Aborting it closes the watch, as `close()` does. */
  signal?: AbortSignal;
  /** Resume after this event ID instead of starting with a reset. */
  lastEventId?: string;
}

/** A running watch. */
export interface WatchHandle {
  /** Stop: the stream is closed and no reconnect follows. */
  close(): void;
  /** The ID of the last event handed to the handlers (the resume point). */
  readonly lastEventId: string | undefined;
  /** Settles once the watch has stopped (closed, aborted, or ended by a final refusal). */
  readonly done: Promise<void>;
}

/** What `watchSession` needs from the client. */
export interface WatchDeps {
  transport: Transport;
  backoff: Backoff;
  /** When set, each connection opens with `?ticket=` from it instead of the bearer token. */
  ticket: TicketProvider | undefined;
}

/** Parse one SSE message into a typed event; undefined for events we do not know. */
export function parseEvent(message: EventSourceMessage): QueueEvent | undefined {
  const eventId = message.id ?? "";
  if (message.event === "queue.reset") {
    const data = JSON.parse(message.data) as EntryList;
    return { type: "reset", eventId, entries: data.entries };
  }
  if (message.event === "queue.update") {
    const data = JSON.parse(message.data) as {
      kind: string;
      id: string;
      entry: Entry | null;
      turn?: TurnNews | null;
    };
    const update = { type: "update", eventId, kind: data.kind, id: data.id, entry: data.entry } as const;
    // `turn` only where the server sent one (`turn`, `turn_ended`): other updates keep their shape.
    return typeof data.turn === "object" && data.turn !== null ? { ...update, turn: data.turn } : update;
  }
  return undefined;
}

/** Follow one session until closed; see `OutboxClient.watch`. */
export function watchSession(
  deps: WatchDeps,
  ws: string,
  ses: string,
  handlers: WatchHandlers,
  options: WatchOptions = {},
): WatchHandle {
  const controller = new AbortController();
  const outer = options.signal;
  if (outer?.aborted) controller.abort(outer.reason);
  else outer?.addEventListener("abort", () => controller.abort(outer.reason), { once: true });
  const signal = controller.signal;
  let lastEventId = options.lastEventId;

  const dispatch = (message: EventSourceMessage): void => {
    let event: QueueEvent | undefined;
    try {
      event = parseEvent(message);
    } catch (err) {
      handlers.onError?.(err, true);
      return;
    }
    if (event === undefined) return;
    if (message.id !== undefined) lastEventId = message.id;
    try {
      if (event.type === "reset") handlers.onReset?.(event);
      else handlers.onUpdate?.(event);
      handlers.onEvent?.(event);
    } catch (err) {
      handlers.onError?.(err, true); // a handler's bug does not end the stream
    }
  };

  let gotEvents = false; // the current connection delivered at least one event

  /** One connection: resolves when the server ends the stream. */
  const connect = async (): Promise<void> => {
    const query: Record<string, string | undefined> = {};
    if (deps.ticket !== undefined) query.ticket = await deps.ticket(ws, signal);
    const headers: Record<string, string> = { Accept: "text/event-stream" };
    if (lastEventId !== undefined) headers["Last-Event-ID"] = lastEventId;
    const res = await deps.transport.request("GET", sessionPath(ws, ses, "/events"), {
      headers,
      query,
      signal,
      auth: deps.ticket === undefined,
    });
    if (!res.ok) throw await OutboxError.fromResponse(res);
    if (res.body === null) throw OutboxError.network(new Error("the event stream has no body"));
    handlers.onOpen?.();
    const parser = createParser({
      onEvent: (message) => {
        gotEvents = true;
        dispatch(message);
      },
    });
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        parser.feed(value);
      }
    } catch (err) {
      if (signal.aborted) throw signal.reason;
      throw OutboxError.network(err);
    } finally {
      reader.releaseLock();
    }
  };

  const run = async (): Promise<void> => {
    let attempt = 0;
    while (!signal.aborted) {
      let retryAfterMs: number | undefined;
      gotEvents = false;
      try {
        await connect();
      } catch (err) {
        if (signal.aborted) return;
        const error = err instanceof OutboxError ? err : OutboxError.network(err);
        if (!error.retryable) {
          handlers.onError?.(error, false);
          return;
        }
        handlers.onError?.(error, true);
        retryAfterMs = error.retryAfterMs;
      }
      if (gotEvents) attempt = 0; // the stream was healthy before it ended: come back soon
      try {
        await sleep(deps.backoff.delay(attempt++, retryAfterMs), signal);
      } catch {
        return; // closed while waiting
      }
    }
  };

  const done = run();
  return {
    close: () => controller.abort(),
    get lastEventId() {
      return lastEventId;
    },
    done,
  };
}
