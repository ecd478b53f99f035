/**
 * The transport: URLs, the bearer token, and turning answers into JSON or an `OutboxError`.
 *
 * @module
 */
import { OutboxError } from "./errors.js";

/** A `fetch` (the global one by default; pass your own to add headers, proxies, mocks). */
export type FetchLike = (input: string, init?: RequestInit) => Promise<Response>;

/** A bearer token, or a function that returns the current one (called for every request). */
export type TokenSource = string | (() => string | Promise<string>);

/** One request's options. */
export interface RequestOptions {
  body?: unknown;
  headers?: Record<string, string>;
  query?: Record<string, string | undefined>;
  signal?: AbortSignal | undefined;
  /** Send the bearer token (default true). */
  auth?: boolean;
}

/** The path of a session's route: `/v1/workspaces/{ws}/sessions/{ses}` plus `rest`. */
export function sessionPath(ws: string, ses: string, rest = ""): string {
  return `/v1/workspaces/${encodeURIComponent(ws)}/sessions/${encodeURIComponent(ses)}${rest}`;
}

/** Requests against one API base URL. */
export class Transport {
  readonly baseUrl: string;
  private readonly token: TokenSource | undefined;
  private readonly fetchImpl: FetchLike;

  constructor(baseUrl: string, token: TokenSource | undefined, fetchImpl: FetchLike | undefined) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.token = token;
    // Called through a closure: a browser's fetch throws "Illegal invocation" off `window`.
    this.fetchImpl = fetchImpl ?? ((input, init) => globalThis.fetch(input, init));
  }

  /** The absolute URL of `path` with `query` (undefined values left out). */
  url(path: string, query: Record<string, string | undefined> = {}): string {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(query)) {
      if (value !== undefined) params.set(name, value);
    }
    const search = params.toString();
    return `${this.baseUrl}${path}${search ? `?${search}` : ""}`;
  }

  /**
   * Send one request; the raw answer, whatever its status. Throws `OutboxError.network` when
   * no answer came, and the signal's reason when it was aborted.
   */
  async request(method: string, path: string, options: RequestOptions = {}): Promise<Response> {
    const headers: Record<string, string> = { ...options.headers };
    if (options.auth !== false && this.token !== undefined) {
      const token = typeof this.token === "string" ? this.token : await this.token();
      headers["Authorization"] = `Bearer ${token}`;
    }
    const init: RequestInit = { method, headers };
    if (options.body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    if (options.signal !== undefined) init.signal = options.signal;
    try {
      return await this.fetchImpl(this.url(path, options.query), init);
    } catch (err) {
      if (options.signal?.aborted) throw options.signal.reason;
      throw OutboxError.network(err);
    }
  }

  /** A request whose 2xx answer is JSON of type `T` (or nothing, for 204); else OutboxError. */
  async json<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    const res = await this.request(method, path, options);
    if (!res.ok) throw await OutboxError.fromResponse(res);
    if (res.status === 204) return undefined as T;
    try {
      return (await res.json()) as T;
    } catch (err) {
      if (options.signal?.aborted) throw options.signal.reason;
      throw OutboxError.network(err); // the body was cut
    }
  }
}
