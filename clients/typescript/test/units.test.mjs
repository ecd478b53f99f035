// The pieces with no server: backoff, Retry-After, the stores, event parsing.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Backoff, LocalStorageStore, MemoryStore, OutboxError, parseEvent, parseRetryAfter } from "../dist/index.js";

test("full jitter: a draw below min(max, initial * 2^n), never below Retry-After", () => {
  const top = new Backoff({ initialMs: 100, maxMs: 1000, random: () => 0.5 });
  assert.deepEqual([0, 1, 3, 4, 10].map((n) => top.delay(n)), [50, 100, 400, 500, 500]);
  const bottom = new Backoff({ initialMs: 100, maxMs: 1000, random: () => 0 });
  assert.equal(bottom.delay(5), 0);
  assert.equal(bottom.delay(5, 1500), 1500);
});

test("Retry-After: seconds or an HTTP date", () => {
  assert.equal(parseRetryAfter("2"), 2000);
  assert.equal(parseRetryAfter(null), undefined);
  assert.equal(parseRetryAfter("soon"), undefined);
  const now = Date.parse("2030-01-01T00:00:00Z");
  assert.equal(parseRetryAfter("Tue, 01 Jan 2030 00:00:05 GMT", now), 5000);
});

test("LocalStorageStore keeps one item per prompt under its prefix and ignores the rest", () => {
  const items = new Map();
  const storage = {
    get length() {
      return items.size;
    },
    key: (i) => [...items.keys()][i] ?? null,
    getItem: (k) => items.get(k) ?? null,
    setItem: (k, v) => items.set(k, String(v)),
    removeItem: (k) => items.delete(k),
  };
  storage.setItem("app:junk", "not json");
  storage.setItem("other:x", JSON.stringify({ key: "x" }));
  const store = new LocalStorageStore("app:", storage);
  const p = { key: "k1", ws: "w", ses: "s", text: "t", model: { a: 1 }, createdAt: 5 };
  store.save(p);
  assert.deepEqual(JSON.parse(storage.getItem("app:k1")), p);
  assert.deepEqual(store.all(), [p]);
  store.remove("k1");
  assert.deepEqual(store.all(), []);
  assert.equal(storage.length, 2, "foreign items untouched");
  assert.throws(() => new LocalStorageStore("p:"), /no localStorage/);
});

test("MemoryStore hands out copies", () => {
  const store = new MemoryStore();
  const p = { key: "k", ws: "w", ses: "s", text: "t", createdAt: 1 };
  store.save(p);
  store.all()[0].text = "changed";
  assert.equal(store.all()[0].text, "t");
});

test("parseEvent types queue.reset and queue.update, and skips other events", () => {
  assert.deepEqual(parseEvent({ id: "1-0", event: "queue.reset", data: '{"entries":[]}' }), {
    type: "reset",
    eventId: "1-0",
    entries: [],
  });
  assert.deepEqual(parseEvent({ id: "2-0", event: "queue.update", data: '{"kind":"sent","id":"e1","entry":null}' }), {
    type: "update",
    eventId: "2-0",
    kind: "sent",
    id: "e1",
    entry: null,
  });
  assert.equal(parseEvent({ event: "other", data: "{}" }), undefined);
});

test("OutboxError: retryable is no answer, 408, 429 and 5xx only", () => {
  const retryable = (status) => new OutboxError(status, "x", "").retryable;
  assert.deepEqual([0, 408, 429, 500, 503].map(retryable), [true, true, true, true, true]);
  assert.deepEqual([400, 401, 403, 404, 409, 413, 422].map(retryable), [false, false, false, false, false, false, false]);
});
