// list / retry / dismiss / edit / ticket / turn: thin typed calls, refusals as OutboxError, and a
// 409 busy (a delivery holds the session) told apart from a 404.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { OutboxClient, OutboxError, turnEndPath } from "../dist/index.js";
import { ADMIN_TOKEN, FAST, OTHER_TOKEN, TOKEN, WS, delivered, stack, until } from "./harness.mjs";

let env;
let client;
before(async () => {
  // One failed delivery puts an entry in error at once; the agent rejects "reject..." texts
  // (400: a definitive failure) and holds "hang..." ones until released.
  env = await stack({
    tunables: { max_attempts: 1 },
    behave: (entry) =>
      entry.text.startsWith("reject")
        ? 400
        : entry.text.startsWith("hang")
          ? "hang"
          : entry.text.startsWith("turn")
            ? { turn: `t/${entry.id}` }
            : "ok",
  });
  client = new OutboxClient({ baseUrl: env.serve.url, token: TOKEN, backoff: FAST });
});
after(async () => {
  await env?.close();
});

async function refusal(promise) {
  const err = await promise.then(
    () => assert.fail("resolved"),
    (e) => e,
  );
  assert.ok(err instanceof OutboxError, String(err));
  return err;
}

const statusOf = async (ses, id) => (await client.list(WS, ses)).find((e) => e.id === id)?.status;

test("while a delivery holds the session: list shows it, and dismiss / edit / retry are 409 busy, not 404", { timeout: 30_000 }, async () => {
  const ses = "s-busy";
  const held = await client.send(WS, ses, "hang until released");
  await until(async () => (await statusOf(ses, held.id)) === "delivering", "the delivery to start");
  const queued = await client.send(WS, ses, "behind it");
  const entries = await client.list(WS, ses);
  assert.deepEqual(entries.map((e) => [e.id, e.status, e.text]), [
    [held.id, "delivering", "hang until released"],
    [queued.id, "pending", "behind it"],
  ]);
  assert.equal(entries[1].blockedByInFlight, true);
  assert.equal(entries[1].clientMessageID, queued.key);
  for (const call of [
    () => client.dismiss(WS, ses, queued.id),
    () => client.edit(WS, ses, queued.id, { text: "changed" }),
    () => client.retry(WS, ses, queued.id),
  ]) {
    const err = await refusal(call());
    assert.equal(err.status, 409);
    assert.equal(err.code, "busy");
    assert.equal(err.isBusy, true);
    assert.equal(err.isNotFound, false);
  }
  env.agent.release();
  await delivered(env, ses, queued.id);
  assert.deepEqual(env.agent.texts(ses), ["hang until released", "behind it"]);
});

test("absent entries are 404 not_found, not busy", { timeout: 30_000 }, async () => {
  const ses = "s-absent";
  for (const call of [
    () => client.dismiss(WS, ses, "no-such-entry"),
    () => client.edit(WS, ses, "no-such-entry", { model: null }),
    () => client.retry(WS, ses, "no-such-entry"),
  ]) {
    const err = await refusal(call());
    assert.equal(err.status, 404);
    assert.equal(err.code, "not_found");
    assert.equal(err.isNotFound, true);
    assert.equal(err.isBusy, false);
  }
});

test("an error entry: edit its text, retry it, and it is delivered edited; dismiss removes another", { timeout: 30_000 }, async () => {
  const ses = "s-error";
  const failed = await client.send(WS, ses, "reject this", { model: "p/m" });
  await until(async () => (await statusOf(ses, failed.id)) === "error", "the entry to fail");
  assert.deepEqual(await client.edit(WS, ses, failed.id, { text: "fixed text", model: null }), { id: failed.id, edited: true });
  const [edited] = await client.list(WS, ses);
  assert.equal(edited.text, "fixed text");
  assert.equal(edited.model, undefined);
  assert.deepEqual(await client.retry(WS, ses, failed.id), { id: failed.id, status: "pending" });
  await delivered(env, ses, failed.id);
  assert.deepEqual(env.agent.texts(ses), ["reject this", "fixed text"]);

  const other = await client.send(WS, ses, "reject me too");
  await until(async () => (await statusOf(ses, other.id)) === "error", "the second to fail");
  assert.equal(await client.dismiss(WS, ses, other.id), undefined);
  assert.deepEqual(await client.list(WS, ses), []);
  const err = await refusal(client.dismiss(WS, ses, other.id));
  assert.equal(err.status, 404);
});

test("ticket(): a stream ticket for the token's workspace; 403 for another", { timeout: 30_000 }, async () => {
  const t = await client.ticket(WS);
  assert.equal(typeof t.ticket, "string");
  assert.equal(t.expiresIn, 60);
  const err = await refusal(client.ticket("elsewhere"));
  assert.equal(err.status, 403);
});

test("turn: the session's turn while it is held in one, null once it ended or with none", { timeout: 30_000 }, async () => {
  const ses = "s-turn";
  assert.equal(await client.turn(WS, ses), null, "no turn yet");
  const sent = await client.send(WS, ses, "turn: a long one");
  const held = await until(() => client.turn(WS, ses), "the turn to be held");
  assert.equal(held.turn, `t/${sent.id}`); // a '/' in the ID: the route's answer, as it came
  assert.equal(held.entry, sent.id);
  assert.ok(held.seconds >= 0 && held.seconds < 60, String(held.seconds));
  assert.equal(held.why, "");
  const other = new OutboxClient({ baseUrl: env.serve.url, token: OTHER_TOKEN, backoff: FAST });
  assert.equal((await refusal(other.turn(WS, ses))).status, 403, "a refusal is no 'no turn'");
  const end = await fetch(env.serve.url + turnEndPath(WS, ses, held.turn), {
    method: "POST",
    headers: { Authorization: `Bearer ${TOKEN}` },
  });
  assert.equal(end.status, 200, await end.text());
  assert.equal(await client.turn(WS, ses), null, "ended");
});

test("series and history: the workspace's last minutes, the session's delivered prompts with their turns; 403 for another workspace", { timeout: 30_000 }, async () => {
  const ses = "s-history";
  const first = await client.send(WS, ses, "turn: a short one");
  const held = await until(() => client.turn(WS, ses), "the turn to be held");
  const end = await fetch(env.serve.url + turnEndPath(WS, ses, held.turn), {
    method: "POST",
    headers: { Authorization: `Bearer ${TOKEN}` },
  });
  assert.equal(end.status, 200, await end.text());
  const second = await client.send(WS, ses, "plain");
  await delivered(env, ses, second.id);
  const { delivered: done } = await until(async () => {
    const h = await client.history(WS, ses, { events: 50 });
    return h.delivered.length === 2 ? h : null;
  }, "both in the history");
  assert.deepEqual(done.map((d) => [d.id, d.turn, d.turnEnded]), [
    [second.id, null, null],
    [first.id, `t/${first.id}`, "ended"],
  ]);
  assert.ok(done[1].turnFor >= 0 && Date.parse(done[1].sentAt) > 0);
  const { minutes } = await client.series(WS, { minutes: 5 });
  assert.equal(minutes.length, 5);
  assert.ok(minutes.reduce((n, m) => n + m.delivered, 0) >= 2, JSON.stringify(minutes));
  assert.ok(Date.parse(minutes[4].at) > Date.parse(minutes[0].at));
  const other = new OutboxClient({ baseUrl: env.serve.url, token: OTHER_TOKEN, backoff: FAST });
  assert.equal((await refusal(other.series(WS))).status, 403);
  assert.equal((await refusal(other.history(WS, ses))).status, 403);
});

test("no answer at all is an OutboxError too (status 0, network_error)", { timeout: 30_000 }, async () => {
  const down = new OutboxClient({ baseUrl: "http://127.0.0.1:1", token: TOKEN });
  const err = await refusal(down.list(WS, "s"));
  assert.equal(err.status, 0);
  assert.equal(err.code, "network_error");
  assert.equal(err.retryable, true);
});

test("the overview and the bulk and admin actions: me, workspaces, sessions busiest first, retryErrors / dismissErrors, park / unpark / sweep", { timeout: 30_000 }, async () => {
  const admin = new OutboxClient({ baseUrl: env.serve.url, token: ADMIN_TOKEN, backoff: FAST });
  assert.deepEqual(await client.me(), { user: "u1", admin: false, workspaces: [WS] });
  assert.equal((await admin.me()).admin, true);
  // Two error entries in one session, one in another (max_attempts 1: one failure is final).
  const failed = [];
  for (const ses of ["s-bulk-a", "s-bulk-a", "s-bulk-b"]) {
    failed.push([ses, (await client.send(WS, ses, `reject ${ses} ${failed.length}`)).id]);
  }
  for (const [ses, id] of failed) await until(async () => (await statusOf(ses, id)) === "error", `${id} in error`);
  const page = await client.sessions(WS, { limit: 1 });
  assert.equal(page.sessions.length, 1);
  assert.equal(page.sessions[0].id, "s-bulk-a", "busiest first");
  assert.equal(page.sessions[0].counts.error, 2);
  assert.ok(page.next, "a next page");
  const rest = await client.sessions(WS, { cursor: page.next, limit: 200 });
  assert.ok(rest.sessions.some((s) => s.id === "s-bulk-b"));
  const [mine] = (await client.workspaces()).workspaces;
  assert.equal(mine.id, WS);
  assert.ok(mine.counts.error >= 3);
  assert.ok((await admin.workspaces({ limit: 200 })).workspaces.some((w) => w.id === WS));
  // Bulk: the session's errors, then the workspace's; each "reject" fails again at once.
  assert.deepEqual(await client.retryErrors(WS, "s-bulk-a"), { done: 2, busy: [] });
  for (const [ses, id] of failed.slice(0, 2)) await until(async () => (await statusOf(ses, id)) === "error", `${id} in error again`);
  assert.deepEqual(await client.dismissErrors(WS, "s-bulk-a"), { done: 2, busy: [] });
  assert.equal((await client.list(WS, "s-bulk-a")).length, 0);
  const all = await client.dismissErrors(WS);
  assert.ok(all.done >= 1 && all.busy.length === 0);
  assert.equal((await client.list(WS, "s-bulk-b")).length, 0);
  // Admin actions: refused for a user token, done for the admin's.
  const forbidden = await refusal(client.park(WS, "maintenance"));
  assert.equal(forbidden.status, 403);
  assert.equal(forbidden.isAuth, true);
  assert.deepEqual(await admin.park(WS, "maintenance"), { parked: 0 });
  assert.deepEqual(await admin.unpark(WS), { unparked: 0 });
  const swept = await admin.sweep(WS);
  assert.equal(typeof swept.unverifiable, "number");
});
