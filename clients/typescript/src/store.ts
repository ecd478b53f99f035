/**
 * Where unacknowledged prompts wait: written before the first POST, removed once the API has
 * answered for good, so a page that reloads mid-send can send them again (`resumePending`).
 *
 * @module
 */
import type { WhileBusy } from "./types.js";

/** A prompt handed to `send` that the API has not acknowledged yet. */
export interface PendingPrompt {
  /** The idempotency key (`Idempotency-Key` and `clientMessageID`), minted once per prompt. */
  key: string;
  ws: string;
  ses: string;
  text: string;
  /** The model selector (any JSON); absent for none. */
  model?: unknown;
  whileBusy?: WhileBusy;
  /** When `send` was called (ms since the epoch): `resumePending` re-sends in this order. */
  createdAt: number;
}

/**
 * A store of pending prompts. Methods may be synchronous or return promises (an IndexedDB
 * store would); the client awaits them either way. `save` must be durable enough for your
 * purpose by the time it returns: the POST goes out right after it.
 */
export interface PromptStore {
  save(prompt: PendingPrompt): void | Promise<void>;
  remove(key: string): void | Promise<void>;
  all(): PendingPrompt[] | Promise<PendingPrompt[]>;
}

/** The default store: in memory, so it survives retries but not a reload. */
export class MemoryStore implements PromptStore {
  private readonly prompts = new Map<string, PendingPrompt>();

  save(prompt: PendingPrompt): void {
    this.prompts.set(prompt.key, { ...prompt });
  }

  remove(key: string): void {
    this.prompts.delete(key);
  }

  all(): PendingPrompt[] {
    return [...this.prompts.values()].map((p) => ({ ...p }));
  }
}

/** The part of the Web Storage API that `LocalStorageStore` uses (any `Storage` fits). */
export interface StorageLike {
  readonly length: number;
  key(index: number): string | null;
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

function isPending(value: unknown): value is PendingPrompt {
  if (value === null || typeof value !== "object") return false;
  const p = value as Record<string, unknown>;
  return (
    typeof p.key === "string" &&
    typeof p.ws === "string" &&
    typeof p.ses === "string" &&
    typeof p.text === "string" &&
    typeof p.createdAt === "number"
  );
}

/**
 * A browser store: one `localStorage` item per pending prompt, named `prefix + key`, holding
 * its JSON. It survives a reload (and a crash of the tab) on the same origin. Items under the
 * prefix that are not pending prompts are ignored.
 */
export class LocalStorageStore implements PromptStore {
  private readonly storage: StorageLike;

  /**
   * @param prefix - the item names' prefix: use one per app (and per user, if several share
   *   a browser profile).
   * @param storage - defaults to `globalThis.localStorage`.
   */
  constructor(
    readonly prefix: string = "prompt-outbox:",
    storage?: StorageLike,
  ) {
    const found = storage ?? (globalThis as { localStorage?: StorageLike }).localStorage;
    if (found === undefined) throw new TypeError("LocalStorageStore: no localStorage here");
    this.storage = found;
  }

  save(prompt: PendingPrompt): void {
    this.storage.setItem(this.prefix + prompt.key, JSON.stringify(prompt));
  }

  remove(key: string): void {
    this.storage.removeItem(this.prefix + key);
  }

  all(): PendingPrompt[] {
    const found: PendingPrompt[] = [];
    for (let i = 0; i < this.storage.length; i++) {
      const name = this.storage.key(i);
      if (name === null || !name.startsWith(this.prefix)) continue;
      try {
        const value: unknown = JSON.parse(this.storage.getItem(name) ?? "null");
        if (isPending(value)) found.push(value);
      } catch {
        // not ours
      }
    }
    return found;
  }
}
