// The real things the tests run against: a `prompt-outbox serve` subprocess (its binary from
// PROMPT_OUTBOX_BIN, which tests/test_ts_client.py sets; else the repo's .venv), a webhook
// agent that records every delivered prompt, and a proxy in front of serve that can answer
// 503 / 429 itself, drop a connection after forwarding, or cut event streams.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { WebhookSignatureError, verifyWebhook } from "../dist/index.js";

const here = path.dirname(fileURLToPath(import.meta.url));
export const SECRET = "ts-client-test-secret";
export const TOKEN = "t-user";
export const OTHER_TOKEN = "t-other"; // a token for another workspace only
export const ADMIN_TOKEN = "t-admin";
export const WS = "acme";
/** Fast retries, so a test of ten retries takes a fraction of a second. */
export const FAST = { initialMs: 20, maxMs: 200 };

function serveBin() {
  const fromEnv = process.env.PROMPT_OUTBOX_BIN;
  if (fromEnv) return fromEnv;
  const venv = path.resolve(here, "../../../.venv/bin/prompt-outbox");
  if (existsSync(venv)) return venv;
  throw new Error("set PROMPT_OUTBOX_BIN to the prompt-outbox command (tests/test_ts_client.py does)");
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The port a listening server is bound to. */
const portOf = (server) => /** @type {import("node:net").AddressInfo} */ (server.address()).port;

/** Listen on a free loopback port. */
const listen = (server) => new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));

/** Wait until `check()` is truthy (it may be async); fail with `what` after `ms`. */
export async function until(check, what, ms = 15_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const port = portOf(server);
      server.close(() => resolve(port));
    });
  });
}

const groups = new Set(); // process groups to SIGKILL if the test process exits early
function killGroups() {
  for (const pid of groups) {
    try {
      process.kill(-pid, "SIGKILL");
    } catch {}
  }
}
process.on("exit", killGroups);
for (const signal of ["SIGTERM", "SIGINT"]) {
  process.once(signal, () => {
    killGroups();
    process.exit(128 + (signal === "SIGTERM" ? 15 : 2));
  });
}

/** A temp dir removed when the process exits. */
export function tempDir(prefix = "ts-client-") {
  const dir = mkdtempSync(path.join(tmpdir(), prefix));
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** `prompt-outbox serve` on a data dir and port, auth on, delivering to `webhook`. */
export class Serve {
  constructor({ port, dataDir, webhook, tunables, auth = true }) {
    this.port = port;
    this.dataDir = dataDir;
    this.webhook = webhook;
    this.tunables = tunables;
    this.auth = auth;
    /** @type {import("node:child_process").ChildProcess | undefined} */
    this.proc = undefined;
    /** @type {Promise<unknown> | undefined} */
    this.exited = undefined;
    this.output = "";
  }

  get url() {
    return `http://127.0.0.1:${this.port}`;
  }

  args() {
    const args = ["serve", "--port", String(this.port), "--data-dir", path.join(this.dataDir, "data")];
    if (this.auth) {
      const tokens = path.join(this.dataDir, "tokens.json");
      writeFileSync(
        tokens,
        JSON.stringify({
          tokens: [
            { token: TOKEN, user: "u1", workspaces: [WS] },
            { token: OTHER_TOKEN, user: "u2", workspaces: ["elsewhere"] },
            { token: ADMIN_TOKEN, user: "ops", admin: true },
          ],
        }),
      );
      args.push("--tokens", tokens);
    } else {
      args.push("--no-auth");
    }
    if (this.webhook) args.push("--webhook-url", this.webhook.url, "--webhook-verify-url", this.webhook.verifyUrl);
    if (this.tunables) args.push("--tunables", JSON.stringify(this.tunables));
    return args;
  }

  /** Start it and wait for /readyz. A restart right after a SIGKILL may find the data dir
   * still locked by the dying Valkey: it is tried again. */
  async start() {
    for (let tries = 0; ; tries++) {
      const proc = spawn(serveBin(), this.args(), {
        detached: true, // its own process group: serve and its embedded Valkey
        stdio: ["ignore", "pipe", "pipe"],
        env: { ...process.env, PROMPT_OUTBOX_WEBHOOK_SECRET: SECRET },
      });
      groups.add(proc.pid);
      this.proc = proc;
      const exited = new Promise((resolve) => proc.once("exit", resolve));
      this.exited = exited;
      for (const stream of [proc.stdout, proc.stderr]) {
        stream.on("data", (chunk) => {
          this.output = (this.output + chunk).slice(-20_000);
        });
      }
      const ready = until(async () => {
        try {
          return (await fetch(`${this.url}/readyz`)).status === 200;
        } catch {
          return false;
        }
      }, "serve to be ready", 30_000);
      const first = await Promise.race([ready.then(() => "ready"), exited.then(() => "exited")]);
      if (first === "ready") return;
      groups.delete(proc.pid);
      if (tries >= 20) throw new Error(`serve exited at start:\n${this.output}`);
      await sleep(100);
    }
  }

  /** SIGKILL serve and its embedded Valkey (the whole process group); wait for serve's exit. */
  async kill() {
    const proc = this.proc;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    try {
      process.kill(-proc.pid, "SIGKILL");
    } catch {}
    await this.exited;
    groups.delete(proc.pid);
  }
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

/**
 * The agent: a webhook receiver that checks each delivery's signature with `verifyWebhook`
 * (the client's helper, as a user's receiver would) and records it before it answers; one
 * that fails is answered 401 and kept in `refused`. `behave(entry)` says what to do: "ok"
 * (200, the default), a status code, "hang" (answer 200 only once `release()` is called), or
 * `{turn: id}` (202 `{"turn": id}`: the session is held in that turn until it is ended).
 */
export class Agent {
  constructor() {
    this.received = []; // {key, ws, ses, entry, signed (what verifyWebhook vouched for), headers, body}
    /** @type {WebhookSignatureError[]} */
    this.refused = [];
    /** @type {(entry: any) => "ok" | "hang" | number | { turn: string }} */
    this.behave = () => "ok";
    /** @type {Array<(value?: unknown) => void>} */
    this.releases = [];
    this.server = http.createServer(async (req, res) => {
      const url = new URL(req.url, "http://x");
      if (req.method === "GET" && url.pathname === "/verify") {
        const id = url.searchParams.get("id");
        const status = this.received.some((r) => r.key === id) ? "delivered" : "absent";
        res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify({ status }));
        return;
      }
      const body = await readBody(req);
      let signed;
      try {
        signed = await verifyWebhook(SECRET, req.headers, body);
      } catch (err) {
        if (!(err instanceof WebhookSignatureError)) throw err;
        this.refused.push(err);
        res.writeHead(401, { "Content-Type": "application/json" }).end(JSON.stringify({ error: err.code }));
        return;
      }
      const entry = JSON.parse(body.toString("utf8"));
      this.received.push({
        key: req.headers["idempotency-key"],
        ws: req.headers["x-prompt-outbox-workspace"],
        ses: req.headers["x-prompt-outbox-session"],
        entry,
        signed,
        headers: req.headers,
        body,
      });
      const action = this.behave(entry);
      if (action === "hang") await new Promise((resolve) => this.releases.push(resolve));
      if (typeof action === "object") {
        res.writeHead(202, { "Content-Type": "application/json" }).end(JSON.stringify(action));
        return;
      }
      const status = typeof action === "number" ? action : 200;
      res.writeHead(status, { "Content-Type": "application/json" }).end("{}");
    });
  }

  async start() {
    await listen(this.server);
    return this;
  }

  get url() {
    return `http://127.0.0.1:${portOf(this.server)}/hook`;
  }

  get verifyUrl() {
    return `http://127.0.0.1:${portOf(this.server)}/verify`;
  }

  /** Deliveries of the entry with this ID. */
  count(id) {
    return this.received.filter((r) => r.entry.id === id).length;
  }

  texts(ses) {
    return this.received.filter((r) => r.ses === ses).map((r) => r.entry.text);
  }

  release() {
    for (const resolve of this.releases.splice(0)) resolve();
  }

  close() {
    this.release();
    this.server.closeAllConnections?.();
    return new Promise((resolve) => this.server.close(resolve));
  }
}

/**
 * A proxy in front of serve (on its own port). Every request is logged
 * ({method, url, headers, at}). `plan` is a queue of actions for the next accept POSTs:
 * "503" / "429" (answered here, not forwarded), "drop" (forwarded; the client's connection is
 * destroyed once serve has answered, so the client never sees the answer), a function
 * (async, called with serve's answer before dropping), or "pass". `refuseStreams` answers
 * event streams 503 here; `cutStreams()` destroys the open ones. With serve down, requests
 * get their connection destroyed (the client sees a network error).
 */
export class Proxy {
  constructor(targetPort) {
    this.targetPort = targetPort;
    this.log = [];
    this.plan = [];
    this.refuseStreams = false;
    this.onRequest = undefined;
    this.streams = new Set();
    this.server = http.createServer((req, res) => this.handle(req, res));
  }

  async start() {
    await listen(this.server);
    return this;
  }

  get url() {
    return `http://127.0.0.1:${portOf(this.server)}`;
  }

  posts() {
    return this.log.filter((r) => r.method === "POST" && r.url.endsWith("/prompts"));
  }

  streamOpens() {
    return this.log.filter((r) => r.method === "GET" && r.url.includes("/events"));
  }

  cutStreams() {
    for (const socket of this.streams) socket.destroy();
    this.streams.clear();
  }

  async handle(req, res) {
    const body = await readBody(req);
    const record = { method: req.method, url: req.url, headers: req.headers, at: Date.now(), body };
    this.log.push(record);
    if (this.onRequest) await this.onRequest(record);
    const isAccept = req.method === "POST" && req.url.endsWith("/prompts");
    const isStream = req.method === "GET" && req.url.includes("/events");
    const action = isAccept ? (this.plan.shift() ?? "pass") : "pass";
    record.action = action;
    if (action === "503") {
      const answer = { error: "not_durable", detail: "not confirmed in time (proxy)", id: "x" };
      res.writeHead(503, { "Content-Type": "application/json", "Retry-After": "0" });
      res.end(JSON.stringify(answer));
      return;
    }
    if (action === "429") {
      res.writeHead(429, { "Content-Type": "application/json", "Retry-After": "1" });
      res.end(JSON.stringify({ error: "outbox_full", detail: "full (proxy)" }));
      return;
    }
    if (action === "429-hours") {
      res.writeHead(429, { "Content-Type": "application/json", "Retry-After": "7200" });
      res.end(JSON.stringify({ error: "workspace_bytes_full", detail: "full for hours (proxy)" }));
      return;
    }
    if (isStream && this.refuseStreams) {
      res.writeHead(503, { "Content-Type": "application/json", "Retry-After": "0" });
      res.end(JSON.stringify({ error: "too_many_streams", detail: "refused (proxy)" }));
      return;
    }
    const upstream = http.request(
      {
        host: "127.0.0.1",
        port: this.targetPort,
        method: req.method,
        path: req.url,
        headers: req.headers,
      },
      async (up) => {
        if (action === "drop" || typeof action === "function") {
          const answer = await readBody(up);
          record.upstreamStatus = up.statusCode;
          record.upstreamBody = answer.toString("utf8");
          if (typeof action === "function") await action(record);
          req.socket.destroy();
          return;
        }
        res.writeHead(up.statusCode, up.headers);
        if (isStream) {
          this.streams.add(req.socket);
          req.socket.once("close", () => this.streams.delete(req.socket));
          res.flushHeaders();
        }
        up.pipe(res);
      },
    );
    upstream.on("error", () => req.socket.destroy()); // serve is down: the client sees no answer
    upstream.end(body);
  }

  close() {
    this.cutStreams();
    this.server.closeAllConnections?.();
    return new Promise((resolve) => this.server.close(resolve));
  }
}

/**
 * A serve (auth on) behind a proxy, delivering to a recording agent: what most tests need.
 * @param {{ tunables?: object, behave?: (entry: any) => "ok" | "hang" | number | { turn: string } }} [options]
 */
export async function stack({ tunables, behave } = {}) {
  const dir = tempDir();
  const agent = await new Agent().start();
  if (behave) agent.behave = behave;
  const serve = new Serve({ port: await freePort(), dataDir: dir, webhook: agent, tunables });
  await serve.start();
  const proxy = await new Proxy(serve.port).start();
  return {
    dir,
    agent,
    serve,
    proxy,
    async close() {
      await proxy.close();
      await serve.kill();
      await agent.close();
    },
  };
}

/** The list of a session, straight from serve (no client code involved). */
export async function rawList(serve, ws, ses) {
  const res = await fetch(`${serve.url}/v1/workspaces/${ws}/sessions/${ses}/prompts`, {
    headers: { Authorization: `Bearer ${TOKEN}` },
  });
  if (res.status !== 200) throw new Error(`list answered ${res.status}: ${await res.text()}`);
  return (await res.json()).entries;
}

/** Wait until the agent got `id` and the session no longer holds it (delivered and gone). */
export async function delivered(env, ses, id) {
  await until(() => env.agent.count(id) > 0, `delivery of ${id}`);
  await until(async () => !(await rawList(env.serve, WS, ses)).some((e) => e.id === id), `${id} to leave the queue`);
}
