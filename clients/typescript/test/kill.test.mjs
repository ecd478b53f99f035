// The server dies mid-send: the accept is written, serve is SIGKILLed (Valkey too) before
// its answer reaches the client, the client's retries find nobody, serve comes back on the
// same data dir and port, and the retry with the same key lands: one entry, delivered once.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { MemoryStore, OutboxClient } from "../dist/index.js";
import { FAST, TOKEN, WS, delivered, sleep, stack } from "./harness.mjs";

let env;
after(async () => {
  await env?.close();
});

test("SIGKILL serve mid-send, restart it on the same data dir: the retry lands, delivered exactly once", { timeout: 60_000 }, async () => {
  // A delivery the kill interrupts is recovered once its lease lapses, then verified with the
  // agent (which recorded it): short lease and verify delay keep the test quick.
  env = await stack({ tunables: { lease_ttl: 1, verify_delay: 0.2 } });
  const ses = "s-kill";
  let killed;
  // Serve has accepted (and fsynced) the POST; kill it before the answer leaves the proxy.
  env.proxy.plan = [
    async () => {
      killed = env.serve.kill();
      await killed;
    },
  ];
  const store = new MemoryStore();
  const client = new OutboxClient({ baseUrl: env.proxy.url, token: TOKEN, store, backoff: FAST });
  const sending = client.send(WS, ses, "survive the kill");
  await until(() => killed !== undefined, "the kill");
  await killed;
  // Serve is down: the client keeps retrying (connections refused at the proxy).
  await until(() => env.proxy.posts().length >= 4, "retries while serve is down");
  assert.deepEqual(await store.all().map((p) => p.text), ["survive the kill"]);
  await env.serve.start(); // same port, same data dir
  const result = await sending;
  const posts = env.proxy.posts();
  assert.equal(posts[0].upstreamStatus, 202, "the first attempt was accepted before the kill");
  assert.equal(result.id, JSON.parse(posts[0].upstreamBody).id);
  assert.equal(result.status, 200, "the retry is a replay of the accepted key");
  assert.equal(result.duplicate, true);
  assert.deepEqual(new Set(posts.map((p) => p.headers["idempotency-key"])), new Set([result.key]));
  assert.deepEqual(await store.all(), []);
  await delivered(env, ses, result.id);
  await sleep(500);
  assert.equal(env.agent.count(result.id), 1);
  assert.deepEqual(env.agent.texts(ses), ["survive the kill"]);
});

async function until(check, what, ms = 15_000) {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}
