/**
 * `OutboxError`: every refusal of the API, and every failure to reach it, as one typed error.
 *
 * @module
 */
import type { ErrorBody } from "./types.js";
import { parseRetryAfter } from "./backoff.js";

/**
 * The API's stable error codes that a caller may want to tell apart (any other string may
 * come too: the union stays open).
 */
export type ErrorCode =
  | "network_error"
  | "unauthorized"
  | "forbidden"
  | "not_found"
  | "busy"
  | "not_editable"
  | "session_busy"
  | "idempotency_key_reused"
  | "idempotency_key_mismatch"
  | "invalid_idempotency_key"
  | "invalid_id"
  | "invalid_input"
  | "invalid_json"
  | "invalid_request"
  | "invalid_event_id"
  | "text_too_large"
  | "body_too_large"
  | "unsupported_media_type"
  | "duplicate_header"
  | "host_not_allowed"
  | "origin_not_allowed"
  | "outbox_full"
  | "workspace_full"
  | "workspace_bytes_full"
  | "token_bytes_full"
  | "rate_limited"
  | "too_many_streams"
  | "answers_buffer_full"
  | "storage_unavailable"
  | "storage_full"
  | "deadline_exceeded"
  | "request_timeout"
  | "not_durable"
  | (string & {});

/**
 * A refusal by the API (`status` is its HTTP status, `code` its JSON `error`), or the API
 * not reached at all (`status` 0, `code` `"network_error"`, the fetch failure as `cause`).
 */
export class OutboxError extends Error {
  /** The HTTP status, or 0 when no answer came (connection refused, cut, DNS, ...). */
  readonly status: number;
  /** The API's stable code (`error` in the JSON body); `http_<status>` for a body that is not the API's. */
  readonly code: ErrorCode;
  /** The API's `detail`: a sentence, or for `invalid_request` the list of field errors. */
  readonly detail: unknown;
  /**
   * The entry the refusal is about, when the API names one: for `idempotency_key_reused` the
   * entry the key was first accepted as; for `not_durable` the entry written but not yet
   * confirmed durable.
   */
  readonly id: string | undefined;
  /** The answer's `Retry-After`, in milliseconds, when it had one. */
  readonly retryAfterMs: number | undefined;

  constructor(
    status: number,
    code: ErrorCode,
    detail: unknown,
    options: { id?: string | undefined; retryAfterMs?: number | undefined; cause?: unknown } = {},
  ) {
    const text = typeof detail === "string" ? detail : JSON.stringify(detail);
    super(`${status || "network"} ${code}: ${text}`, { cause: options.cause });
    this.name = "OutboxError";
    this.status = status;
    this.code = code;
    this.detail = detail;
    this.id = options.id;
    this.retryAfterMs = options.retryAfterMs;
  }

  /** The error for an answer that is not 2xx (reads its body). */
  static async fromResponse(res: Response): Promise<OutboxError> {
    const retryAfterMs = parseRetryAfter(res.headers.get("Retry-After"));
    let raw = "";
    try {
      raw = await res.text();
    } catch {
      // the body was cut: the status says enough
    }
    let body: Partial<ErrorBody> | undefined;
    try {
      const parsed: unknown = JSON.parse(raw);
      if (parsed !== null && typeof parsed === "object") body = parsed as Partial<ErrorBody>;
    } catch {
      // not JSON (a proxy's page): keep the text as the detail
    }
    if (body !== undefined && typeof body.error === "string") {
      const id = typeof body.id === "string" ? body.id : undefined;
      return new OutboxError(res.status, body.error, body.detail, { id, retryAfterMs });
    }
    return new OutboxError(res.status, `http_${res.status}`, raw || res.statusText, {
      retryAfterMs,
    });
  }

  /** The error for a request that got no answer. */
  static network(cause: unknown): OutboxError {
    const detail = cause instanceof Error ? cause.message : String(cause);
    return new OutboxError(0, "network_error", detail, { cause });
  }

  /**
   * Whether sending the same request again may succeed: no answer, 408, 429 or any 5xx
   * (503 `not_durable` included). Every other 4xx is final.
   */
  get retryable(): boolean {
    return this.status === 0 || this.status === 408 || this.status === 429 || this.status >= 500;
  }

  /** 401 or 403: the token is missing, wrong, expired, or not for this workspace. */
  get isAuth(): boolean {
    return this.status === 401 || this.status === 403;
  }

  /** 404: no such entry (for retry: no error entry with that ID). */
  get isNotFound(): boolean {
    return this.status === 404;
  }

  /** 409 `busy`: a delivery holds the session right now; try again shortly. */
  get isBusy(): boolean {
    return this.status === 409 && this.code === "busy";
  }

  /** 422 `idempotency_key_reused`: the key was accepted for another text or model (`id`). */
  get isKeyReused(): boolean {
    return this.status === 422 && this.code === "idempotency_key_reused";
  }
}
