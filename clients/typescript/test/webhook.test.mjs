// verifyWebhook / signWebhook: the v2 signature covers the timestamp, workspace, session, entry
// ID and body. The Python deliverer's real deliveries verify here (and a replay of one with a
// header changed does not); tests/test_ts_client.py checks the other way round.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import {
  DEFAULT_WEBHOOK_TOLERANCE,
  OutboxClient,
  TURN_END_DOMAIN,
  WEBHOOK_HEADERS,
  WebhookSignatureError,
  signTurnEnd,
  signWebhook,
  turnEndPath,
  verifyWebhook,
} from "../dist/index.js";
import { FAST, TOKEN, WS, delivered, stack } from "./harness.mjs";

const SECRET = "receiver-secret";
const T = 1_700_000_000;
const BODY = Buffer.from('{"id":"e1","text":"h\u00e9llo"}', "utf8");
/** The Python test's vector (tests/test_webhook_signature.py): the same string, the same MAC. */
const VECTOR = "v2=edfd1249c993b3660ae338ee41fd6c72396f332d223bf8d6130d9d0c1bf21290";

/** A delivery's headers as Node hands them over (lower case), for BODY at T. */
async function headers({ ws = "acme", ses = "chat-1", id = "e1" } = {}) {
  const signature = await signWebhook(SECRET, { timestamp: T, workspace: ws, session: ses, entryId: id, body: BODY });
  return {
    [WEBHOOK_HEADERS.signature]: signature,
    [WEBHOOK_HEADERS.timestamp]: String(T),
    [WEBHOOK_HEADERS.workspace]: ws,
    [WEBHOOK_HEADERS.session]: ses,
    [WEBHOOK_HEADERS.entryId]: id,
  };
}

/**
 * verifyWebhook rejects with a WebhookSignatureError of this code (and nothing else).
 * @param {string} code
 * @param {any} hdrs
 * @param {any} [body]
 * @param {{ now?: number, tolerance?: number }} [options]
 */
async function refused(code, hdrs, body = BODY, options = { now: T }) {
  await assert.rejects(verifyWebhook(SECRET, hdrs, body, options), (err) => {
    assert.ok(err instanceof WebhookSignatureError, `a WebhookSignatureError, got ${err}`);
    assert.equal(err.code, code, err.message);
    return true;
  });
}

test("the canonical string is the Python one: the same vector", async () => {
  const hdrs = await headers();
  assert.equal(hdrs[WEBHOOK_HEADERS.signature], VECTOR);
  const got = await verifyWebhook(SECRET, hdrs, BODY, { now: T });
  assert.deepEqual(got, { workspace: "acme", session: "chat-1", entryId: "e1", timestamp: T });
  // A Uint8Array secret, a string body, fetch's Headers and mixed-case names all work.
  const mixed = Object.fromEntries(Object.entries(hdrs).map(([k, v]) => [k.toUpperCase(), v]));
  const text = BODY.toString("utf8");
  assert.deepEqual(await verifyWebhook(new TextEncoder().encode(SECRET), mixed, text, { now: T }), got);
  const arrayBuffer = BODY.buffer.slice(BODY.byteOffset, BODY.byteOffset + BODY.length);
  assert.deepEqual(await verifyWebhook(SECRET, new Headers(hdrs), arrayBuffer, { now: T }), got);
});

test("a changed workspace, session, entry ID, timestamp or body is refused", async () => {
  const good = await headers();
  for (const [name, value] of [
    [WEBHOOK_HEADERS.workspace, "other-tenant"],
    [WEBHOOK_HEADERS.session, "chat-2"],
    [WEBHOOK_HEADERS.entryId, "e2"],
    [WEBHOOK_HEADERS.timestamp, String(T + 1)],
  ]) {
    await refused("bad_signature", { ...good, [name]: value });
  }
  await refused("bad_signature", good, Buffer.from(BODY.toString("utf8").replace("h", "H")));
  await assert.rejects(verifyWebhook("another-secret", good, BODY, { now: T }), WebhookSignatureError);
});

test("the timestamp must be within the tolerance, either way", async () => {
  const good = await headers();
  assert.equal(DEFAULT_WEBHOOK_TOLERANCE, 300);
  assert.ok(await verifyWebhook(SECRET, good, BODY, { now: T + 300 }));
  assert.ok(await verifyWebhook(SECRET, good, BODY, { now: T - 300 }));
  await refused("stale_timestamp", good, BODY, { now: T + 301 });
  await refused("stale_timestamp", good, BODY, { now: T - 301 });
  await refused("stale_timestamp", good, BODY, { now: T + 11, tolerance: 10 });
  await refused("stale_timestamp", good, BODY, {}); // the real clock: 2023 is long past
  for (const options of [{ tolerance: -1 }, { tolerance: NaN }, { now: NaN }]) {
    await assert.rejects(verifyWebhook(SECRET, good, BODY, options), RangeError);
  }
  await assert.rejects(verifyWebhook("", good, BODY, { now: T }), RangeError);
});

test("missing, malformed and doubled headers are refused with their code", async () => {
  const good = await headers();
  for (const name of Object.values(WEBHOOK_HEADERS)) {
    const { [name]: _, ...rest } = good;
    await refused("missing_header", rest);
  }
  /** @type {Array<[string, string | string[]]>} */
  const cases = [
    [WEBHOOK_HEADERS.timestamp, "17e8"],
    [WEBHOOK_HEADERS.timestamp, "-1"],
    [WEBHOOK_HEADERS.timestamp, "9".repeat(5000)],
    [WEBHOOK_HEADERS.workspace, "acme\nchat-1"],
    [WEBHOOK_HEADERS.workspace, "{acme}"],
    [WEBHOOK_HEADERS.session, ""],
    [WEBHOOK_HEADERS.entryId, "e".repeat(129)],
    [WEBHOOK_HEADERS.workspace, ["acme", "other-tenant"]], // node keeps some doubled headers as arrays
    [WEBHOOK_HEADERS.workspace, "other-tenant, acme"], // ... and joins others with ", "
    [WEBHOOK_HEADERS.signature, `v2=${"0".repeat(64)}, ${good[WEBHOOK_HEADERS.signature]}`],
  ];
  for (const [name, value] of cases) {
    await refused("malformed_header", { ...good, [name]: value });
  }
  await refused("malformed_header", { ...good, "X-Prompt-Outbox-Session": "chat-2" }); // two spellings
  const doubled = new Headers(good);
  doubled.append(WEBHOOK_HEADERS.workspace, "other-tenant");
  await refused("malformed_header", doubled);
});

test("a bad signature value is refused cleanly, whatever it holds", async () => {
  const good = await headers();
  const sig = good[WEBHOOK_HEADERS.signature];
  for (const value of [
    "v2=",
    "v2=abc",
    `v2=${"0".repeat(66)}`,
    `v2=${"g".repeat(64)}`,
    `v2=${"\u00e9".repeat(64)}`,
    `v2=${"0".repeat(64)}`,
    `sha256=${"0".repeat(64)}`, // the old scheme is no signature at all now
    `V2=${sig.slice(3)}`,
    "",
    "v2",
    "=".repeat(10),
  ]) {
    await refused("bad_signature", { ...good, [WEBHOOK_HEADERS.signature]: value });
  }
  // Several items, one of them good (a rotation, another scheme): it verifies.
  const upper = `v2=${sig.slice(3).toUpperCase()}`;
  for (const value of [`sha256=00 ${sig}`, `v2=${"0".repeat(64)} ${sig}`, `${sig} v3=zz`, upper]) {
    assert.ok(await verifyWebhook(SECRET, { ...good, [WEBHOOK_HEADERS.signature]: value }, BODY, { now: T }));
  }
});

test("signWebhook refuses what would make the signed string ambiguous", async () => {
  const fields = { timestamp: T, workspace: "acme", session: "chat-1", entryId: "e1", body: BODY };
  for (const bad of [{ workspace: "a\nb" }, { entryId: "" }, { timestamp: 1.5 }, { timestamp: -1 }]) {
    await assert.rejects(signWebhook(SECRET, { ...fields, ...bad }), RangeError);
  }
});

test("signTurnEnd signs the Python turn-end string: the same vector; turnEndPath encodes the ID", async () => {
  const turnId = "turn/1 \u00e9";
  // The Python test's vector (tests/test_webhook_signature.py, TURN_VECTOR).
  const want = "v2=79270cb04fb7628a590286dd29a357b6b9336a233a516bc146a397cef1d91c12";
  const signed = await signTurnEnd(SECRET, { workspace: "acme", session: "chat-1", turnId, timestamp: T });
  assert.deepEqual(signed, { [WEBHOOK_HEADERS.timestamp]: String(T), [WEBHOOK_HEADERS.signature]: want });
  assert.equal(TURN_END_DOMAIN, "v2-turn-end");
  // Its own domain: never a delivery's signature for an entry of that name with an empty body.
  const delivery = await signWebhook(SECRET, { timestamp: T, workspace: "acme", session: "chat-1", entryId: "e1", body: "" });
  const asEnd = await signTurnEnd(SECRET, { workspace: "acme", session: "chat-1", turnId: "e1", timestamp: T });
  assert.notEqual(asEnd[WEBHOOK_HEADERS.signature], delivery);
  const now = await signTurnEnd(SECRET, { workspace: "acme", session: "chat-1", turnId });
  assert.ok(Math.abs(Number(now[WEBHOOK_HEADERS.timestamp]) - Date.now() / 1000) < 60);
  assert.equal(
    turnEndPath("acme", "chat-1", "a/b?c=d%e f#\u00e9"),
    "/v1/workspaces/acme/sessions/chat-1/turns/a%2Fb%3Fc%3Dd%25e%20f%23%C3%A9/end",
  );
  for (const bad of ["", "t".repeat(201), "a\nb", "a\u0000", "\ud800"]) {
    assert.throws(() => turnEndPath("acme", "chat-1", bad), RangeError);
    await assert.rejects(signTurnEnd(SECRET, { workspace: "acme", session: "chat-1", turnId: bad }), RangeError);
  }
  assert.throws(() => turnEndPath("ac/me", "chat-1", "t"), RangeError);
  await assert.rejects(signTurnEnd(SECRET, { workspace: "acme", session: "chat-1", turnId: "t", timestamp: 1.5 }), RangeError);
});

// ---------------------------------------------------------------- a real serve's deliveries

let env;
before(async () => {
  env = await stack();
});
after(async () => {
  await env?.close();
});

test("a real delivery from the Python deliverer verifies; replayed with a header changed it does not", { timeout: 30_000 }, async () => {
  const client = new OutboxClient({ baseUrl: env.serve.url, token: TOKEN, backoff: FAST });
  const { id } = await client.send(WS, "s-hook", "run the tests");
  await delivered(env, "s-hook", id);
  const [got] = env.agent.received.filter((r) => r.entry.id === id);
  assert.deepEqual(
    { ...got.signed, timestamp: undefined },
    { workspace: WS, session: "s-hook", entryId: id, timestamp: undefined },
    "the agent's verifyWebhook vouched for it",
  );
  assert.match(got.headers[WEBHOOK_HEADERS.signature], /^v2=[0-9a-f]{64}$/);
  assert.deepEqual(env.agent.refused, []);

  // An eavesdropper's replays: the captured request with one thing changed.
  const captured = Object.fromEntries(
    Object.entries(got.headers).filter(([k]) => k.startsWith("x-prompt-outbox-") || k === "idempotency-key"),
  );
  const replay = (headers, body = got.body) =>
    fetch(env.agent.url, { method: "POST", headers: { ...headers, "content-type": "application/json" }, body });
  for (const change of [
    { [WEBHOOK_HEADERS.workspace]: "elsewhere" },
    { [WEBHOOK_HEADERS.session]: "s-other" },
    { [WEBHOOK_HEADERS.entryId]: `${id}x` },
  ]) {
    assert.equal((await replay({ ...captured, ...change })).status, 401);
  }
  const otherBody = Buffer.from(got.body.toString("utf8").replace("run the tests", "drop the tests"));
  assert.equal((await replay(captured, otherBody)).status, 401);
  assert.deepEqual(env.agent.refused.map((e) => e.code), Array(4).fill("bad_signature"));
  // The untouched replay verifies: inside the window, the receiver dedupes it by the entry ID.
  assert.equal((await replay(captured)).status, 200);
});
