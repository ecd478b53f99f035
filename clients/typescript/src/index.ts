/**
 * prompt-outbox-client: a typed client for prompt-outbox's HTTP API.
 *
 * ```ts
 * import { OutboxClient, LocalStorageStore } from "prompt-outbox-client";
 * const client = new OutboxClient({ baseUrl: location.origin, token, store: new LocalStorageStore("app:") });
 * await client.resumePending();                 // what a previous page left unsent
 * const { id } = await client.send("acme", "chat-1", "Hello, agent!");
 * const watch = client.watch("acme", "chat-1", { onReset: (r) => show(r.entries), onUpdate: apply });
 * ```
 *
 * @packageDocumentation
 */
export { OutboxClient } from "./client.js";
export type {
  CallOptions,
  OutboxClientOptions,
  PageOptions,
  ResumeResult,
  SendOptions,
} from "./client.js";
export { OutboxError, type ErrorCode } from "./errors.js";
export { Backoff, parseRetryAfter, type BackoffOptions } from "./backoff.js";
export { MemoryStore, LocalStorageStore } from "./store.js";
export type { PendingPrompt, PromptStore, StorageLike } from "./store.js";
export type { FetchLike, TokenSource } from "./http.js";
export type { SendResult } from "./send.js";
export { parseEvent } from "./watch.js";
export type { TicketProvider, WatchHandle, WatchHandlers, WatchOptions } from "./watch.js";
export type * from "./types.js";
export type { components, paths, operations } from "./schema.js";
export {
  DEFAULT_WEBHOOK_TOLERANCE,
  TURN_END_DOMAIN,
  WEBHOOK_HEADERS,
  WEBHOOK_SCHEME,
  WebhookSignatureError,
  signTurnEnd,
  signWebhook,
  turnEndPath,
  verifyWebhook,
} from "./webhook.js";
export type {
  SignedDelivery,
  TurnEndFields,
  TurnEndHeaders,
  VerifyWebhookOptions,
  WebhookBody,
  WebhookFailure,
  WebhookFields,
  WebhookHeaders,
} from "./webhook.js";
