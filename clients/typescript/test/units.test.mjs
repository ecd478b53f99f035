// The pieces with no server: backoff, Retry-After, the stores, event parsing.
import assert from "node:assert/strict";
import { test } from "node:test";
import { createParser } from "eventsource-parser";
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

test("parseEvent hands on a turn update's turn, and adds none where the server sent none", () => {
  const began = '{"kind":"turn","id":"e1","entry":null,"turn":{"id":"t/1","seconds":0,"why":""}}';
  assert.deepEqual(parseEvent({ id: "3-0", event: "queue.update", data: began }), {
    type: "update",
    eventId: "3-0",
    kind: "turn",
    id: "e1",
    entry: null,
    turn: { id: "t/1", seconds: 0, why: "" },
  });
  const ended = '{"kind":"turn_ended","id":"e1","entry":null,"turn":{"id":"t/1","seconds":130.5,"why":"ceiling"}}';
  const end = /** @type {import("../dist/index.js").QueueUpdate} */ (parseEvent({ id: "4-0", event: "queue.update", data: ended }));
  assert.deepEqual(end.turn, {
    id: "t/1",
    seconds: 130.5,
    why: "ceiling",
  });
  const sent = parseEvent({ id: "5-0", event: "queue.update", data: '{"kind":"sent","id":"e1","entry":null,"turn":null}' });
  assert.equal("turn" in sent, false);
});

test("OutboxError: retryable is no answer, 408, 429 and 5xx only", () => {
  const retryable = (status) => new OutboxError(status, "x", "").retryable;
  assert.deepEqual([0, 408, 429, 500, 503].map(retryable), [true, true, true, true, true]);
  assert.deepEqual([400, 401, 403, 404, 409, 413, 422].map(retryable), [false, false, false, false, false, false, false]);
});

test("an event whose data spans several data: lines (a model with line breaks) parses as the JSON sent", () => {
  // What the server writes for a model holding LF, CRLF and CR in its whitespace (api/sse.py
  // splits the data at each line break, one data: line each): eventsource-parser joins them
  // with LF, so JSON.parse reads the same JSON. Fed in awkward pieces, as a network would (and
  // with CRLF line ends, which SSE allows as well as the server's LF).
  const wire =
    'id: 7-0\r\nevent: queue.update\r\ndata: {"kind":"accepted","id":"e1","entry":{"id":"e1","model":{"a":\r\n' +
    'data: 1,\r\ndata: "b":[2,\r\ndata: 3]}}}\r\n\r\n';
  const got = [];
  const parser = createParser({ onEvent: (message) => got.push(parseEvent(message)) });
  for (const piece of [wire.slice(0, 90), wire.slice(90, 91), wire.slice(91, 130), wire.slice(130)]) parser.feed(piece);
  assert.equal(got.length, 1);
  assert.equal(got[0].eventId, "7-0");
  assert.deepEqual(got[0].entry.model, { a: 1, b: [2, 3] });
});
