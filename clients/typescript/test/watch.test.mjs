// watch(): SSE over fetch, typed events, Last-Event-ID after a break, and stream tickets.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { OutboxClient, OutboxError } from "../dist/index.js";
import { FAST, OTHER_TOKEN, TOKEN, WS, delivered, stack, until } from "./harness.mjs";

let env;
before(async () => {
  env = await stack();
});
after(async () => {
  await env?.close();
});

/** Watch a session, collecting what the handlers get. */
function follow(client, ses, options) {
  const seen = { resets: [], updates: [], errors: [], opens: 0, events: [] };
  const handle = client.watch(
    WS,
    ses,
    {
      onReset: (e) => seen.resets.push(e),
      onUpdate: (e) => seen.updates.push(e),
      onEvent: (e) => seen.events.push(e),
      onOpen: () => seen.opens++,
      onError: (err, willRetry) => seen.errors.push({ err, willRetry }),
    },
    options,
  );
  return { seen, handle };
}

const kinds = (updates, id) => updates.filter((u) => u.id === id).map((u) => u.kind);

test("watch: a reset, then accepted, delivering, sent; after a break it resumes with Last-Event-ID: no reset, nothing missed", { timeout: 30_000 }, async () => {
  const ses = "s-watch";
  const client = new OutboxClient({ baseUrl: env.proxy.url, token: TOKEN, backoff: FAST });
  const { seen, handle } = follow(client, ses);
  await until(() => seen.resets.length === 1, "the reset");
  assert.deepEqual(seen.resets[0].entries, []);
  assert.match(seen.resets[0].eventId, /^\d+-\d+$/);
  const first = await client.send(WS, ses, "one");
  await until(() => kinds(seen.updates, first.id).includes("sent"), "first's sent");
  assert.deepEqual(kinds(seen.updates, first.id), ["accepted", "delivering", "sent"]);
  const accepted = seen.updates.find((u) => u.id === first.id && u.kind === "accepted");
  assert.equal(accepted.entry.text, "one");
  assert.equal(accepted.entry.status, "pending");
  assert.equal(seen.updates.at(-1).entry, null, "sent carries no entry");
  assert.equal(handle.lastEventId, seen.events.at(-1).eventId);

  // Break the stream and keep it down while a second prompt goes all the way through.
  const resumeFrom = handle.lastEventId;
  const opensBefore = env.proxy.streamOpens().length;
  env.proxy.refuseStreams = true;
  env.proxy.cutStreams();
  await until(() => env.proxy.streamOpens().length > opensBefore, "a reconnect attempt");
  const second = await client.send(WS, ses, "two");
  await delivered(env, ses, second.id);
  env.proxy.refuseStreams = false;
  await until(() => kinds(seen.updates, second.id).includes("sent"), "second's sent");

  assert.equal(seen.resets.length, 1, "no second reset");
  assert.deepEqual(kinds(seen.updates, second.id), ["accepted", "delivering", "sent"]);
  const reopens = env.proxy.streamOpens().slice(opensBefore);
  assert.ok(reopens.length >= 2, "refused at least once, then reopened");
  for (const r of reopens) assert.equal(r.headers["last-event-id"], resumeFrom);
  assert.ok(seen.errors.length >= 1 && seen.errors.every((e) => e.willRetry));
  assert.equal(seen.opens, 2);
  handle.close();
  await handle.done;
});

test("ticket mode: each (re)connect mints a fresh ticket and opens ?ticket= with no Authorization header", { timeout: 30_000 }, async () => {
  const ses = "s-ticket";
  const client = new OutboxClient({ baseUrl: env.proxy.url, token: TOKEN, backoff: FAST, streamAuth: "ticket" });
  const opensBefore = env.proxy.streamOpens().length;
  const { seen, handle } = follow(client, ses);
  await until(() => seen.resets.length === 1, "the reset");
  env.proxy.cutStreams();
  await until(() => env.proxy.streamOpens().length >= opensBefore + 2, "the reconnect");
  const sent = await client.send(WS, ses, "via ticket");
  await until(() => kinds(seen.updates, sent.id).includes("sent"), "sent");
  assert.equal(seen.resets.length, 1);
  const opens = env.proxy.streamOpens().slice(opensBefore);
  const tickets = opens.map((r) => new URL(r.url, "http://x").searchParams.get("ticket"));
  assert.ok(tickets.every((t) => t), "every open carried a ticket");
  assert.equal(new Set(tickets).size, tickets.length, "a fresh ticket per connect");
  assert.ok(opens.every((r) => r.headers.authorization === undefined), "no token on the stream");
  assert.equal(opens[1].headers["last-event-id"], seen.resets[0].eventId);
  handle.close();
  await handle.done;
});

test("a ticket for another workspace is a final 403: the watch ends and says so", { timeout: 30_000 }, async () => {
  const minted = await new OutboxClient({ baseUrl: env.serve.url, token: OTHER_TOKEN }).ticket("elsewhere");
  assert.ok(minted.ticket && minted.expiresIn > 0);
  const client = new OutboxClient({ baseUrl: env.serve.url, backoff: FAST, streamAuth: async () => minted.ticket });
  const { seen, handle } = follow(client, "s-forbidden");
  await handle.done;
  assert.equal(seen.errors.length, 1);
  const [{ err, willRetry }] = seen.errors;
  assert.equal(willRetry, false);
  assert.ok(err instanceof OutboxError);
  assert.equal(err.status, 403);
  assert.equal(seen.resets.length, 0);
});

test("with auth on, a watch without a token gets a final 401", { timeout: 30_000 }, async () => {
  const { seen, handle } = follow(new OutboxClient({ baseUrl: env.serve.url, backoff: FAST }), "s-noauth");
  await handle.done;
  assert.equal(seen.errors[0].err.status, 401);
  assert.equal(seen.errors[0].willRetry, false);
});
