/**
 * Exponential backoff with full jitter, `Retry-After`, and an abortable sleep.
 *
 * @module
 */

/** How retries are spaced. Every field is optional. */
export interface BackoffOptions {
  /** The first delay's ceiling, in ms (default 250). */
  initialMs?: number;
  /** The largest delay, in ms (default 30 000). */
  maxMs?: number;
  /** How much the ceiling grows per attempt (default 2). */
  multiplier?: number;
  /**
   * Attempts before `send` gives up with the last error and leaves the prompt in the store
   * (default `Infinity`: it retries until it is answered, or aborted).
   */
  maxAttempts?: number;
  /**
   * The longest `Retry-After` `send` waits out, in ms (default 300 000: five minutes). A
   * refusal that asks for longer (a quota that clears in hours) rejects at once, with the
   * prompt left in the store for `resumePending`: a page must not sleep through it silently.
   */
  maxRetryAfterMs?: number;
  /** A source of numbers in [0, 1) (default `Math.random`), for tests. */
  random?: () => number;
}

/** The delays of one retry policy. */
export class Backoff {
  readonly initialMs: number;
  readonly maxMs: number;
  readonly multiplier: number;
  readonly maxAttempts: number;
  readonly maxRetryAfterMs: number;
  private readonly random: () => number;

  constructor(options: BackoffOptions = {}) {
    this.initialMs = options.initialMs ?? 250;
    this.maxMs = options.maxMs ?? 30_000;
    this.multiplier = options.multiplier ?? 2;
    this.maxAttempts = options.maxAttempts ?? Infinity;
    this.maxRetryAfterMs = options.maxRetryAfterMs ?? 300_000;
    this.random = options.random ?? Math.random;
  }

  /**
   * The wait before retry number `attempt` (0 for the first retry): a uniform draw in
   * [0, min(maxMs, initialMs * multiplier^attempt)) ("full jitter"), but never less than the
   * server's `Retry-After`.
   */
  delay(attempt: number, retryAfterMs?: number): number {
    // (`send` never asks for a wait past maxRetryAfterMs: it gives up first.)
    const ceiling = Math.min(this.maxMs, this.initialMs * this.multiplier ** attempt);
    return Math.max(this.random() * ceiling, retryAfterMs ?? 0);
  }
}

/** A `Retry-After` header (delay-seconds or an HTTP date) in ms; undefined if absent or bad. */
export function parseRetryAfter(value: string | null, now: number = Date.now()): number | undefined {
  if (value === null || value.trim() === "") return undefined;
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed) * 1000;
  const at = Date.parse(trimmed);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

/** Wait `ms`; rejects with the signal's reason as soon as it aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
