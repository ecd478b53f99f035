/**
 * One prompt's POST, retried with the same key until the API answers for good.
 *
 * @module
 */
import { Backoff, sleep } from "./backoff.js";
import { OutboxError } from "./errors.js";
import { sessionPath, type Transport } from "./http.js";
import type { PendingPrompt } from "./store.js";
import type { Accepted, PromptBody } from "./types.js";

/** A prompt the outbox holds: accepted now (202) or earlier (200, a replay of its key). */
export interface SendResult {
  /** The entry's ID. */
  id: string;
  /** The idempotency key it was sent with. */
  key: string;
  /** True for a 200 replay: an earlier attempt (or an earlier page) had already delivered it to the outbox. */
  duplicate: boolean;
  /** 202 (accepted) or 200 (replay). */
  status: number;
  /** POSTs made, this one included. */
  attempts: number;
  /** The answer's body. */
  answer: Accepted;
}

/** The POST body of a pending prompt (its key as `clientMessageID`). */
export function promptBody(prompt: PendingPrompt): PromptBody {
  const body: PromptBody = { clientMessageID: prompt.key, text: prompt.text };
  if (prompt.model !== undefined) body.model = prompt.model;
  if (prompt.whileBusy !== undefined) body.whileBusy = prompt.whileBusy;
  return body;
}

/**
 * POST `prompt` until a 2xx (resolves) or a final refusal (rejects with that non-retryable
 * `OutboxError`). No answer, 408, 429 and 5xx are retried with the same key after
 * `backoff.delay` (at least the answer's `Retry-After`); after `backoff.maxAttempts` the last
 * (retryable) error is thrown. An abort rejects with the signal's reason at once.
 */
export async function postUntilAnswered(
  transport: Transport,
  backoff: Backoff,
  prompt: PendingPrompt,
  signal?: AbortSignal,
): Promise<SendResult> {
  const path = sessionPath(prompt.ws, prompt.ses, "/prompts");
  const body = promptBody(prompt);
  for (let attempt = 0; ; attempt++) {
    signal?.throwIfAborted();
    let failure: OutboxError;
    try {
      const res = await transport.request("POST", path, {
        body,
        headers: { "Idempotency-Key": prompt.key },
        signal,
      });
      if (res.ok) {
        let answer: Accepted;
        try {
          answer = (await res.json()) as Accepted;
        } catch (err) {
          if (signal?.aborted) throw signal.reason;
          throw OutboxError.network(err); // cut mid-body: the key makes the retry safe
        }
        return {
          id: answer.id,
          key: prompt.key,
          duplicate: res.status === 200,
          status: res.status,
          attempts: attempt + 1,
          answer,
        };
      }
      failure = await OutboxError.fromResponse(res);
    } catch (err) {
      if (!(err instanceof OutboxError)) throw err; // aborted
      failure = err;
    }
    if (!failure.retryable || attempt + 1 >= backoff.maxAttempts) throw failure;
    // A quota that clears in hours (workspace_bytes_full): the caller's to hear, not to sleep.
    if ((failure.retryAfterMs ?? 0) > backoff.maxRetryAfterMs) throw failure;
    await sleep(backoff.delay(attempt, failure.retryAfterMs), signal);
  }
}
