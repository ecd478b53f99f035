/**
 * The receiving end of prompt-outbox's webhook deliverer: `verifyWebhook` checks a delivery's
 * signature (scheme `v2`), `signWebhook` makes one (for a receiver's own tests), and
 * `signTurnEnd` / `turnEndPath` end a turn the receiver handed back (a 202 with
 * `{"turn": id}`). Web Crypto only (`crypto.subtle`), so it runs in Node 20+, browsers, Deno
 * and edge runtimes.
 *
 * The signature is `v2=<hex HMAC-SHA256>` of the canonical string
 * `"v2\n<timestamp>\n<workspace>\n<session>\n<entry id>\n"` followed by the raw body bytes:
 * unambiguous, as the timestamp is digits and the IDs match `[A-Za-z0-9._-]{1,128}` (no
 * newline). It is the same string the Python package builds (`prompt_outbox.webhook`).
 *
 * @module
 */

/** The signature scheme this module signs and checks. */
export const WEBHOOK_SCHEME = "v2";

/** The headers a delivery carries (lower case, as Node hands them over). */
export const WEBHOOK_HEADERS = {
  signature: "x-prompt-outbox-signature",
  timestamp: "x-prompt-outbox-timestamp",
  workspace: "x-prompt-outbox-workspace",
  session: "x-prompt-outbox-session",
  entryId: "idempotency-key",
} as const;

/** Seconds a delivery's timestamp may be off the receiver's clock, either way. */
export const DEFAULT_WEBHOOK_TOLERANCE = 300;

/** What failed, stably (the Python helper's codes). */
export type WebhookFailure = "missing_header" | "malformed_header" | "stale_timestamp" | "bad_signature";

/** A delivery that does not verify: refuse it (HTTP 401). `code` says what failed. */
export class WebhookSignatureError extends Error {
  readonly code: WebhookFailure;

  constructor(code: WebhookFailure, message: string) {
    super(message);
    this.name = "WebhookSignatureError";
    this.code = code;
  }
}

/** What a verified delivery's signature vouches for: act on these values. */
export interface SignedDelivery {
  workspace: string;
  session: string;
  entryId: string;
  /** Unix seconds, when the deliverer signed it. */
  timestamp: number;
}

/** A fetch `Headers`, or a record such as Node's `IncomingMessage.headers` (any name case). */
export type WebhookHeaders = Headers | Record<string, string | readonly string[] | undefined>;

/** The raw request body: the bytes as received, not JSON parsed and encoded again. */
export type WebhookBody = Uint8Array | ArrayBuffer | string;

export interface VerifyWebhookOptions {
  /** Seconds the timestamp may be off `now`, either way (default 300). */
  tolerance?: number;
  /** The receiver's clock, in Unix seconds (default `Date.now() / 1000`). */
  now?: number;
}

export interface WebhookFields {
  /** Unix seconds. */
  timestamp: number;
  workspace: string;
  session: string;
  entryId: string;
  body: WebhookBody;
}

const ID = /^[A-Za-z0-9._-]{1,128}$/;
const TIMESTAMP = /^[0-9]{1,15}$/; // Unix seconds; 15 digits stay exact in a double
const HEX = /^[0-9a-fA-F]{64}$/; // a SHA-256 MAC
const encoder = new TextEncoder();

/**
 * Check a webhook delivery as received. Resolves to what the signature covers; rejects with a
 * `WebhookSignatureError` saying what failed (a `RangeError` for a bad `tolerance`, `now` or
 * an empty secret: the caller's bug). The MAC is compared by `crypto.subtle.verify`, in
 * constant time.
 *
 * ```ts
 * const body = await readRawBody(req); // bytes, before any JSON parsing
 * const { workspace, session, entryId } = await verifyWebhook(secret, req.headers, body);
 * ```
 */
export async function verifyWebhook(
  secret: string | Uint8Array,
  headers: WebhookHeaders,
  body: WebhookBody,
  options: VerifyWebhookOptions = {},
): Promise<SignedDelivery> {
  const tolerance = options.tolerance ?? DEFAULT_WEBHOOK_TOLERANCE;
  if (!(tolerance >= 0)) throw new RangeError(`tolerance must be seconds >= 0, got ${tolerance}`);
  const now = options.now ?? Date.now() / 1000;
  if (!Number.isFinite(now)) throw new RangeError(`now must be finite Unix seconds, got ${now}`);
  const key = await hmacKey(secret, "verify");
  const read = headerReader(headers);
  const values = {
    signature: read(WEBHOOK_HEADERS.signature),
    timestamp: read(WEBHOOK_HEADERS.timestamp),
    workspace: read(WEBHOOK_HEADERS.workspace),
    session: read(WEBHOOK_HEADERS.session),
    entryId: read(WEBHOOK_HEADERS.entryId),
  };
  const missing = Object.entries(values).filter(([, v]) => v === undefined);
  if (missing.length) {
    const names = missing.map(([k]) => WEBHOOK_HEADERS[k as keyof typeof WEBHOOK_HEADERS]);
    throw new WebhookSignatureError("missing_header", `missing ${names.join(", ")}`);
  }
  const { signature, timestamp, workspace, session, entryId } = values as Record<keyof typeof values, string>;
  if (!TIMESTAMP.test(timestamp)) {
    throw new WebhookSignatureError("malformed_header", `${WEBHOOK_HEADERS.timestamp} is not Unix seconds`);
  }
  const skew = now - Number(timestamp);
  if (Math.abs(skew) > tolerance) {
    throw new WebhookSignatureError(
      "stale_timestamp",
      `${WEBHOOK_HEADERS.timestamp} is ${Math.round(skew)} s off, over ${tolerance} s`,
    );
  }
  const fields = { timestamp: Number(timestamp), workspace, session, entryId, body };
  const bad = badId(fields);
  if (bad) {
    throw new WebhookSignatureError("malformed_header", `${WEBHOOK_HEADERS[bad]} is not an ID ([A-Za-z0-9._-]{1,128})`);
  }
  const message = signedBytes(fields, timestamp);
  if (signature.includes(",")) {
    // No scheme writes a comma: the header was sent twice and joined by the framework.
    throw new WebhookSignatureError("malformed_header", `${WEBHOOK_HEADERS.signature} is sent twice`);
  }
  // Space-separated <scheme>=<hex> items; a scheme this check does not know is skipped.
  const prefix = `${WEBHOOK_SCHEME}=`;
  const offered = signature
    .split(/\s+/)
    .filter((item) => item.startsWith(prefix))
    .map((item) => item.slice(prefix.length));
  if (!offered.length) {
    const what = `${WEBHOOK_HEADERS.signature} holds no ${WEBHOOK_SCHEME}= signature`;
    throw new WebhookSignatureError("bad_signature", what);
  }
  let matched = false;
  for (const hex of offered) {
    // Every candidate is checked, so the time taken says nothing about which one came close.
    if (HEX.test(hex) && (await crypto.subtle.verify("HMAC", key, fromHex(hex), message))) matched = true;
  }
  if (!matched) throw new WebhookSignatureError("bad_signature", `${WEBHOOK_HEADERS.signature} does not match`);
  return { workspace, session, entryId, timestamp: Number(timestamp) };
}

/**
 * The signature header's value, `v2=<hex>`, for a delivery: what the deliverer sends. For a
 * receiver's tests (and any sender of its own). Rejects with a `RangeError` for a timestamp or
 * an ID off its form, which would make the signed string ambiguous.
 */
export async function signWebhook(secret: string | Uint8Array, fields: WebhookFields): Promise<string> {
  if (!Number.isSafeInteger(fields.timestamp) || fields.timestamp < 0) {
    throw new RangeError(`timestamp must be whole Unix seconds, got ${fields.timestamp}`);
  }
  const bad = badId(fields);
  if (bad) throw new RangeError(`${bad} must match [A-Za-z0-9._-]{1,128}, got ${JSON.stringify(fields[bad])}`);
  const key = await hmacKey(secret, "sign");
  const mac = await crypto.subtle.sign("HMAC", key, signedBytes(fields, String(fields.timestamp)));
  return `${WEBHOOK_SCHEME}=${toHex(new Uint8Array(mac))}`;
}

/** What `signTurnEnd` signs: the turn a receiver handed back (a 202 with `{"turn": id}`). */
export interface TurnEndFields {
  workspace: string;
  session: string;
  /** The turn ID: 1-200 printable characters. */
  turnId: string;
  /** Unix seconds (default: the clock). */
  timestamp?: number;
}

/** The headers that end a turn by signature, lower case (POST them, no body, to `turnEndPath`). */
export interface TurnEndHeaders {
  "x-prompt-outbox-timestamp": string;
  "x-prompt-outbox-signature": string;
}

/** The first line of a turn end's signed string (a delivery's is `v2`): one never verifies as the other. */
export const TURN_END_DOMAIN = "v2-turn-end";

// Python's str.isprintable: no control, format, surrogate, private-use, unassigned or separator
// character but the space. The server (that Python) has the last word.
const PRINTABLE = /^(?:[^\p{C}\p{Z}]| )+$/u;
const TURN_ID_MAX = 200;

/**
 * The headers that end a turn a receiver handed back, signed with the webhook secret: the HMAC
 * of `"v2-turn-end\n<timestamp>\n<workspace>\n<session>\n<turn id>"` (the Python
 * `turn_end_headers`' string). POST them to the service at `turnEndPath(...)`; 200 `{ended,
 * seconds}`, 404 `turn_not_found` once it is over. Rejects with a `RangeError` for an ID off its
 * rule.
 *
 * ```ts
 * const headers = await signTurnEnd(secret, { workspace, session, turnId });
 * await fetch(base + turnEndPath(workspace, session, turnId), { method: "POST", headers });
 * ```
 */
export async function signTurnEnd(secret: string | Uint8Array, fields: TurnEndFields): Promise<TurnEndHeaders> {
  const timestamp = fields.timestamp ?? Math.floor(Date.now() / 1000);
  if (!Number.isSafeInteger(timestamp) || timestamp < 0) {
    throw new RangeError(`timestamp must be whole Unix seconds, got ${timestamp}`);
  }
  const { workspace, session, turnId } = checkTurn(fields.workspace, fields.session, fields.turnId);
  const key = await hmacKey(secret, "sign");
  const message = encoder.encode(`${TURN_END_DOMAIN}\n${timestamp}\n${workspace}\n${session}\n${turnId}`);
  const mac = await crypto.subtle.sign("HMAC", key, message);
  return {
    [WEBHOOK_HEADERS.timestamp]: String(timestamp),
    [WEBHOOK_HEADERS.signature]: `${WEBHOOK_SCHEME}=${toHex(new Uint8Array(mac))}`,
  } as TurnEndHeaders;
}

/** The path that ends a turn, `/v1/workspaces/{ws}/sessions/{ses}/turns/{turn}/end`, the turn ID percent-encoded. */
export function turnEndPath(workspace: string, session: string, turnId: string): string {
  const ids = checkTurn(workspace, session, turnId);
  return `/v1/workspaces/${ids.workspace}/sessions/${ids.session}/turns/${encodeURIComponent(ids.turnId)}/end`;
}

function checkTurn(workspace: string, session: string, turnId: string): Required<Omit<TurnEndFields, "timestamp">> {
  for (const [name, id] of [["workspace", workspace], ["session", session]] as const) {
    if (!ID.test(id)) throw new RangeError(`${name} must match [A-Za-z0-9._-]{1,128}, got ${JSON.stringify(id)}`);
  }
  if ([...turnId].length > TURN_ID_MAX || !PRINTABLE.test(turnId)) {
    throw new RangeError(`a turn ID is 1-${TURN_ID_MAX} printable characters, got ${JSON.stringify(turnId.slice(0, 80))}`);
  }
  return { workspace, session, turnId };
}

/** The first of the three IDs off its pattern: a newline in one would make the string ambiguous. */
function badId(fields: WebhookFields): "workspace" | "session" | "entryId" | undefined {
  return (["workspace", "session", "entryId"] as const).find((name) => !ID.test(fields[name]));
}

/** The canonical string (the module's doc) as bytes, for fields whose IDs were checked. */
function signedBytes(fields: WebhookFields, timestamp: string): Uint8Array<ArrayBuffer> {
  const head = encoder.encode(
    `${WEBHOOK_SCHEME}\n${timestamp}\n${fields.workspace}\n${fields.session}\n${fields.entryId}\n`,
  );
  const body = bytesOf(fields.body);
  const out = new Uint8Array(head.length + body.length);
  out.set(head);
  out.set(body, head.length);
  return out;
}

async function hmacKey(secret: string | Uint8Array, use: "sign" | "verify"): Promise<CryptoKey> {
  const raw = copy(typeof secret === "string" ? encoder.encode(secret) : secret);
  if (!raw.length) throw new RangeError("an empty secret verifies nothing");
  return crypto.subtle.importKey("raw", raw, { name: "HMAC", hash: "SHA-256" }, false, [use]);
}

/**
 * Reads one header by its lower-case name; `undefined` when absent. A header present twice
 * (an array of two, or two spellings of its name in a record) is refused: the receiver's own
 * code might read the other copy than the one checked.
 */
function headerReader(headers: WebhookHeaders): (name: string) => string | undefined {
  if (typeof Headers !== "undefined" && headers instanceof Headers) {
    return (name) => headers.get(name) ?? undefined;
  }
  const record = headers as Record<string, string | readonly string[] | undefined>;
  return (name) => {
    const found = Object.keys(record).filter((k) => record[k] !== undefined && k.toLowerCase() === name);
    if (!found.length) return undefined;
    const value = record[found[0] as string];
    if (found.length > 1 || (typeof value !== "string" && value?.length !== 1)) {
      throw new WebhookSignatureError("malformed_header", `${name} is sent more than once`);
    }
    return typeof value === "string" ? value : (value?.[0] as string);
  };
}

function bytesOf(body: WebhookBody): Uint8Array {
  if (typeof body === "string") return encoder.encode(body);
  return body instanceof Uint8Array ? body : new Uint8Array(body);
}

/** A copy on a plain ArrayBuffer, as Web Crypto's types want it. */
function copy(bytes: Uint8Array): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(bytes.length);
  out.set(bytes);
  return out;
}

function toHex(bytes: Uint8Array): string {
  return [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}

function fromHex(hex: string): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
}
