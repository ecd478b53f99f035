// send(): the key, the store, retries with the same key, final refusals, and resumePending.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { MemoryStore, OutboxClient, OutboxError } from "../dist/index.js";
import { FAST, TOKEN, WS, delivered, sleep, stack } from "./harness.mjs";

let env;
before(async () => {
  env = await stack();
});
after(async () => {
  await env?.close();
});

function client(store = new MemoryStore(), backoff = FAST) {
  return new OutboxClient({ baseUrl: env.proxy.url, token: TOKEN, store, backoff });
}

test("send: 202, delivered once, with the key as header and clientMessageID; the store ends empty", { timeout: 30_000 }, async () => {
  // A store whose save takes a while: the POST must wait for it.
  const store = new MemoryStore();
  const save = store.save.bind(store);
  store.save = async (p) => {
    await sleep(100);
    save(p);
  };
  let storedAtPost;
  env.proxy.onRequest = async (r) => {
    if (r.method === "POST") storedAtPost = (await store.all()).map((p) => p.key);
  };
  const result = await client(store).send(WS, "s-send", "Hello, agent!", { model: { providerID: "p", modelID: "m" } });
  env.proxy.onRequest = undefined;
  assert.equal(result.status, 202);
  assert.equal(result.duplicate, false);
  assert.equal(result.attempts, 1);
  assert.match(result.key, /^[0-9a-f-]{36}$/);
  assert.deepEqual(storedAtPost, [result.key], "the prompt was in the store before the POST");
  const [post] = env.proxy.posts().filter((r) => r.headers["idempotency-key"] === result.key);
  assert.equal(JSON.parse(post.body).clientMessageID, result.key);
  assert.deepEqual(await store.all(), []);
  await delivered(env, "s-send", result.id);
  await sleep(300); // a second delivery would come now
  assert.equal(env.agent.count(result.id), 1);
  const [got] = env.agent.received.filter((r) => r.entry.id === result.id);
  assert.equal(got.signed.workspace, WS, "verifyWebhook vouched for the delivery");
  assert.equal(got.signed.session, "s-send");
  assert.equal(got.signed.entryId, result.id);
  assert.equal(got.entry.text, "Hello, agent!");
  assert.deepEqual(got.entry.model, { providerID: "p", modelID: "m" });
});

test("send retries 503, 429 (after its Retry-After) and a dropped answer with the same key: one entry, delivered once, a 200 replay is success", { timeout: 30_000 }, async () => {
  env.proxy.plan = ["503", "429", "drop"];
  const store = new MemoryStore();
  const before = env.proxy.posts().length;
  const result = await client(store).send(WS, "s-retry", "retry me");
  const posts = env.proxy.posts().slice(before);
  assert.deepEqual(posts.map((p) => p.action), ["503", "429", "drop", "pass"]);
  assert.deepEqual(new Set(posts.map((p) => p.headers["idempotency-key"])), new Set([result.key]));
  assert.ok(posts[2].at - posts[1].at >= 950, "waited out the 429's Retry-After: 1");
  assert.equal(posts[2].upstreamStatus, 202, "the dropped attempt was accepted");
  assert.equal(result.status, 200);
  assert.equal(result.duplicate, true);
  assert.equal(result.attempts, 4);
  assert.equal(result.id, JSON.parse(posts[2].upstreamBody).id);
  assert.deepEqual(await store.all(), []);
  await delivered(env, "s-retry", result.id);
  await sleep(300);
  assert.deepEqual(env.agent.texts("s-retry"), ["retry me"]);
});

test("a Retry-After past maxRetryAfterMs rejects at once and keeps the prompt for resumePending", { timeout: 30_000 }, async () => {
  env.proxy.plan = ["429-hours"];
  const store = new MemoryStore();
  const before = env.proxy.posts().length;
  const started = Date.now();
  const err = await client(store).send(WS, "s-hours", "later").then(
    () => assert.fail("resolved"),
    (e) => e,
  );
  assert.ok(Date.now() - started < 5_000, "it did not sleep out the two hours");
  assert.ok(err instanceof OutboxError);
  assert.equal(err.status, 429);
  assert.equal(err.code, "workspace_bytes_full");
  assert.equal(err.retryAfterMs, 7_200_000);
  assert.equal(env.proxy.posts().length - before, 1, "one POST");
  assert.deepEqual((await store.all()).map((p) => p.text), ["later"], "kept for resumePending");
});

test("a 400 is final: one POST, an OutboxError, and the prompt leaves the store", { timeout: 30_000 }, async () => {
  const store = new MemoryStore();
  const before = env.proxy.posts().length;
  const err = await client(store).send(WS, "not a session id!", "x").then(
    () => assert.fail("resolved"),
    (e) => e,
  );
  assert.ok(err instanceof OutboxError);
  assert.equal(err.status, 400);
  assert.equal(err.code, "invalid_id");
  assert.equal(err.retryable, false);
  assert.equal(env.proxy.log.filter((r) => r.method === "POST").length - before, 1);
  assert.deepEqual(await store.all(), []);
});

test("a 401 (a bad or expired token) rejects and KEEPS the prompt: resumePending with a good token delivers it once", { timeout: 30_000 }, async () => {
  const store = new MemoryStore();
  const expired = new OutboxClient({ baseUrl: env.proxy.url, token: "expired", store, backoff: FAST });
  const err = await expired.send(WS, "s-auth", "keep my words").then(
    () => assert.fail("resolved"),
    (e) => e,
  );
  assert.ok(err instanceof OutboxError);
  assert.equal(err.status, 401);
  assert.equal(err.isAuth, true);
  assert.deepEqual((await store.all()).map((p) => p.text), ["keep my words"]);
  const [outcome] = await client(store).resumePending();
  assert.equal(outcome.ok, true);
  assert.equal(outcome.result.status, 202);
  assert.deepEqual(await store.all(), []);
  await delivered(env, "s-auth", outcome.result.id);
  assert.equal(env.agent.count(outcome.result.id), 1);
});

test("a key reused for another text: 422 idempotency_key_reused as an OutboxError with the first id", { timeout: 30_000 }, async () => {
  const first = await client().send(WS, "s-reuse", "the first text");
  const store = new MemoryStore();
  store.save({ key: first.key, ws: WS, ses: "s-reuse", text: "another text", createdAt: Date.now() });
  const [outcome] = await client(store).resumePending();
  assert.equal(outcome.ok, false);
  assert.ok(outcome.error instanceof OutboxError);
  assert.equal(outcome.error.status, 422);
  assert.equal(outcome.error.isKeyReused, true);
  assert.equal(outcome.error.id, first.id);
  assert.deepEqual(await store.all(), []);
  await delivered(env, "s-reuse", first.id);
  assert.deepEqual(env.agent.texts("s-reuse"), ["the first text"]);
});

test("resumePending after a page died before the answer: each stored prompt lands once, in order, and the store ends empty", { timeout: 30_000 }, async () => {
  const ses = "s-resume";
  const store = new MemoryStore();
  const reached = { key: crypto.randomUUID(), ws: WS, ses, text: "reached the server", createdAt: 1 };
  const neverSent = { key: crypto.randomUUID(), ws: WS, ses, text: "never left the page", createdAt: 2 };
  store.save(neverSent);
  store.save(reached);
  // The dead page's POST of the first one got through; its answer never came back.
  const res = await fetch(`${env.serve.url}/v1/workspaces/${WS}/sessions/${ses}/prompts`, {
    method: "POST",
    headers: { Authorization: `Bearer ${TOKEN}`, "Idempotency-Key": reached.key, "Content-Type": "application/json" },
    body: JSON.stringify({ clientMessageID: reached.key, text: reached.text }),
  });
  assert.equal(res.status, 202);
  const firstId = (await res.json()).id;
  const outcomes = await client(store).resumePending();
  assert.deepEqual(outcomes.map((o) => [o.prompt.key, o.ok, o.ok && o.result.status]), [
    [reached.key, true, 200],
    [neverSent.key, true, 202],
  ]);
  const [first, second] = outcomes;
  assert.ok(first?.ok && second?.ok);
  assert.equal(first.result.id, firstId);
  assert.deepEqual(await store.all(), []);
  await delivered(env, ses, second.result.id);
  await sleep(300);
  assert.deepEqual(env.agent.texts(ses), ["reached the server", "never left the page"]);
});

test("an aborted send rejects with the abort and leaves the prompt in the store for resumePending", { timeout: 30_000 }, async () => {
  env.proxy.plan = Array(1000).fill("503");
  const store = new MemoryStore();
  const abort = new AbortController();
  const sending = client(store).send(WS, "s-abort", "abort me", { signal: abort.signal });
  await sleep(150);
  abort.abort(new Error("user left"));
  await assert.rejects(sending, /user left/);
  env.proxy.plan = [];
  const [kept] = await store.all();
  assert.equal(kept.text, "abort me");
  const [outcome] = await client(store).resumePending();
  assert.equal(outcome.ok, true);
  assert.equal(outcome.result.key, kept.key);
  await delivered(env, "s-abort", outcome.result.id);
  assert.deepEqual(env.agent.texts("s-abort"), ["abort me"]);
});
