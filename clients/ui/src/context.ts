/**
 * What a view gets: the client (with the tab's token), who that token is, and how to say
 * that the token stopped working. A view is started, shows itself in `el`, and is stopped
 * when the hash moves on (its timers and event stream end).
 *
 * @module
 */
import { OutboxError, type Me, type OutboxClient } from "./client.js";

export interface Ctx {
  readonly client: OutboxClient;
  readonly me: Me;
  /** A 401 came back: the token is no longer good (the page asks for one again). */
  readonly authLost: () => void;
}

export interface View {
  readonly el: HTMLElement;
  stop(): void;
}

/** How often the overview views ask again while shown. */
export const REFRESH_MS = 2_000;

/**
 * Call `fn` now and then `ms` after each call settles, while the tab is visible, until
 * the returned stop is called. A 401 ends it and calls `ctx.authLost`; any other failure
 * goes to `fail`, and the next call comes as usual.
 */
export function every(
  ctx: Ctx,
  ms: number,
  fn: (signal: AbortSignal) => Promise<void>,
  fail: (err: unknown) => void,
): () => void {
  const controller = new AbortController();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const tick = async (): Promise<void> => {
    if (document.visibilityState !== "hidden") {
      try {
        await fn(controller.signal);
      } catch (err) {
        if (controller.signal.aborted) return;
        if (err instanceof OutboxError && err.status === 401) {
          ctx.authLost();
          return;
        }
        fail(err);
      }
    }
    if (!controller.signal.aborted) timer = setTimeout(() => void tick(), ms);
  };
  void tick();
  return () => {
    controller.abort();
    if (timer !== undefined) clearTimeout(timer);
  };
}
