// ../typescript/src/backoff.ts
var Backoff = class {
  initialMs;
  maxMs;
  multiplier;
  maxAttempts;
  maxRetryAfterMs;
  random;
  constructor(options = {}) {
    this.initialMs = options.initialMs ?? 250;
    this.maxMs = options.maxMs ?? 3e4;
    this.multiplier = options.multiplier ?? 2;
    this.maxAttempts = options.maxAttempts ?? Infinity;
    this.maxRetryAfterMs = options.maxRetryAfterMs ?? 3e5;
    this.random = options.random ?? Math.random;
  }
  /**
   * The wait before retry number `attempt` (0 for the first retry): a uniform draw in
   * [0, min(maxMs, initialMs * multiplier^attempt)) ("full jitter"), but never less than the
   * server's `Retry-After`.
   */
  delay(attempt, retryAfterMs) {
    const ceiling = Math.min(this.maxMs, this.initialMs * this.multiplier ** attempt);
    return Math.max(this.random() * ceiling, retryAfterMs ?? 0);
  }
};
function parseRetryAfter(value, now = Date.now()) {
  if (value === null || value.trim() === "") return void 0;
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed) * 1e3;
  const at = Date.parse(trimmed);
  return Number.isNaN(at) ? void 0 : Math.max(0, at - now);
}
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

// ../typescript/src/errors.ts
var OutboxError = class _OutboxError extends Error {
  /** The HTTP status, or 0 when no answer came (connection refused, cut, DNS, ...). */
  status;
  /** The API's stable code (`error` in the JSON body); `http_<status>` for a body that is not the API's. */
  code;
  /** The API's `detail`: a sentence, or for `invalid_request` the list of field errors. */
  detail;
  /**
   * The entry the refusal is about, when the API names one: for `idempotency_key_reused` the
   * entry the key was first accepted as; for `not_durable` the entry written but not yet
   * confirmed durable.
   */
  id;
  /** The answer's `Retry-After`, in milliseconds, when it had one. */
  retryAfterMs;
  constructor(status, code, detail, options = {}) {
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
  static async fromResponse(res) {
    const retryAfterMs = parseRetryAfter(res.headers.get("Retry-After"));
    let raw = "";
    try {
      raw = await res.text();
    } catch {
    }
    let body;
    try {
      const parsed = JSON.parse(raw);
      if (parsed !== null && typeof parsed === "object") body = parsed;
    } catch {
    }
    if (body !== void 0 && typeof body.error === "string") {
      const id = typeof body.id === "string" ? body.id : void 0;
      return new _OutboxError(res.status, body.error, body.detail, { id, retryAfterMs });
    }
    return new _OutboxError(res.status, `http_${res.status}`, raw || res.statusText, {
      retryAfterMs
    });
  }
  /** The error for a request that got no answer. */
  static network(cause) {
    const detail = cause instanceof Error ? cause.message : String(cause);
    return new _OutboxError(0, "network_error", detail, { cause });
  }
  /**
   * Whether sending the same request again may succeed: no answer, 408, 429 or any 5xx
   * (503 `not_durable` included). Every other 4xx is final.
   */
  get retryable() {
    return this.status === 0 || this.status === 408 || this.status === 429 || this.status >= 500;
  }
  /** 401 or 403: the token is missing, wrong, expired, or not for this workspace. */
  get isAuth() {
    return this.status === 401 || this.status === 403;
  }
  /** 404: no such entry (for retry: no error entry with that ID). */
  get isNotFound() {
    return this.status === 404;
  }
  /** 409 `busy`: a delivery holds the session right now; try again shortly. */
  get isBusy() {
    return this.status === 409 && this.code === "busy";
  }
  /** 422 `idempotency_key_reused`: the key was accepted for another text or model (`id`). */
  get isKeyReused() {
    return this.status === 422 && this.code === "idempotency_key_reused";
  }
};

// ../typescript/src/http.ts
function sessionPath(ws, ses, rest = "") {
  return `/v1/workspaces/${encodeURIComponent(ws)}/sessions/${encodeURIComponent(ses)}${rest}`;
}
var Transport = class {
  baseUrl;
  token;
  fetchImpl;
  constructor(baseUrl, token, fetchImpl) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.token = token;
    this.fetchImpl = fetchImpl ?? ((input, init) => globalThis.fetch(input, init));
  }
  /** The absolute URL of `path` with `query` (undefined values left out). */
  url(path, query = {}) {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(query)) {
      if (value !== void 0) params.set(name, value);
    }
    const search = params.toString();
    return `${this.baseUrl}${path}${search ? `?${search}` : ""}`;
  }
  /**
   * Send one request; the raw answer, whatever its status. Throws `OutboxError.network` when
   * no answer came, and the signal's reason when it was aborted.
   */
  async request(method, path, options = {}) {
    const headers = { ...options.headers };
    if (options.auth !== false && this.token !== void 0) {
      const token = typeof this.token === "string" ? this.token : await this.token();
      headers["Authorization"] = `Bearer ${token}`;
    }
    const init = { method, headers };
    if (options.body !== void 0) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    if (options.signal !== void 0) init.signal = options.signal;
    try {
      return await this.fetchImpl(this.url(path, options.query), init);
    } catch (err) {
      if (options.signal?.aborted) throw options.signal.reason;
      throw OutboxError.network(err);
    }
  }
  /** A request whose 2xx answer is JSON of type `T` (or nothing, for 204); else OutboxError. */
  async json(method, path, options = {}) {
    const res = await this.request(method, path, options);
    if (!res.ok) throw await OutboxError.fromResponse(res);
    if (res.status === 204) return void 0;
    try {
      return await res.json();
    } catch (err) {
      if (options.signal?.aborted) throw options.signal.reason;
      throw OutboxError.network(err);
    }
  }
};

// ../typescript/src/send.ts
function promptBody(prompt) {
  const body = { clientMessageID: prompt.key, text: prompt.text };
  if (prompt.model !== void 0) body.model = prompt.model;
  if (prompt.whileBusy !== void 0) body.whileBusy = prompt.whileBusy;
  return body;
}
async function postUntilAnswered(transport, backoff, prompt, signal) {
  const path = sessionPath(prompt.ws, prompt.ses, "/prompts");
  const body = promptBody(prompt);
  for (let attempt = 0; ; attempt++) {
    signal?.throwIfAborted();
    let failure;
    try {
      const res = await transport.request("POST", path, {
        body,
        headers: { "Idempotency-Key": prompt.key },
        signal
      });
      if (res.ok) {
        let answer;
        try {
          answer = await res.json();
        } catch (err) {
          if (signal?.aborted) throw signal.reason;
          throw OutboxError.network(err);
        }
        return {
          id: answer.id,
          key: prompt.key,
          duplicate: res.status === 200,
          status: res.status,
          attempts: attempt + 1,
          answer
        };
      }
      failure = await OutboxError.fromResponse(res);
    } catch (err) {
      if (!(err instanceof OutboxError)) throw err;
      failure = err;
    }
    if (!failure.retryable || attempt + 1 >= backoff.maxAttempts) throw failure;
    if ((failure.retryAfterMs ?? 0) > backoff.maxRetryAfterMs) throw failure;
    await sleep(backoff.delay(attempt, failure.retryAfterMs), signal);
  }
}

// ../typescript/src/store.ts
var MemoryStore = class {
  prompts = /* @__PURE__ */ new Map();
  save(prompt) {
    this.prompts.set(prompt.key, { ...prompt });
  }
  remove(key) {
    this.prompts.delete(key);
  }
  all() {
    return [...this.prompts.values()].map((p) => ({ ...p }));
  }
};

// ../typescript/node_modules/eventsource-parser/dist/errors.js
var ParseError = class extends Error {
  constructor(message, options) {
    super(message);
    this.name = "ParseError";
    this.type = options.type;
    this.field = options.field;
    this.value = options.value;
    this.line = options.line;
  }
};

// ../typescript/node_modules/eventsource-parser/dist/parse.js
var LF = 10;
var CR = 13;
var SPACE = 32;
var MAX_FIELD_PREFIX_LENGTH = 6;
function createParser(config) {
  if (typeof config === "function") {
    throw new TypeError("`config` must be an object, got a function instead. Did you mean `createParser({onEvent: fn})`?");
  }
  const { maxBufferSize, onComment, onError, onEvent, onId, onRetry } = config;
  const pendingFragments = [];
  let pendingFragmentsLength = 0;
  let bomPrefix = "";
  let id;
  let data = "";
  let dataLines = 0;
  let eventType;
  let terminated = false;
  let skippingLine = false;
  let skipNextLineFeed = false;
  function feed(chunk) {
    if (terminated) {
      throw new Error("Cannot feed parser: it was terminated after exceeding the configured max buffer size. Call `reset()` to resume parsing.");
    }
    if (bomPrefix !== void 0) {
      chunk = bomPrefix + chunk;
      if (chunk === "" || chunk === "ï" || chunk === "ï»") {
        bomPrefix = chunk;
        return;
      }
      bomPrefix = void 0;
      chunk = chunk.replace(/^(?:\uFEFF|\xEF\xBB\xBF)/, "");
    }
    if (skippingLine || skipNextLineFeed) {
      chunk = resumeAfterSkip(chunk);
      if (!chunk) {
        return;
      }
    }
    if (!pendingFragments.length) {
      const trailing = processLines(chunk);
      if (trailing !== "") {
        storeTrailing(trailing);
      }
      checkForBufferOverflow();
      return;
    }
    if (chunk.indexOf("\n") === -1 && chunk.indexOf("\r") === -1) {
      if (pendingFragmentsLength < MAX_FIELD_PREFIX_LENGTH) {
        const head = pendingFragments.join("") + chunk.slice(0, MAX_FIELD_PREFIX_LENGTH - pendingFragmentsLength);
        if (!shouldBufferTrailing(head)) {
          pendingFragments.length = 0;
          pendingFragmentsLength = 0;
          skippingLine = true;
          return;
        }
      }
      pendingFragments.push(chunk);
      pendingFragmentsLength += chunk.length;
      checkForBufferOverflow();
      return;
    }
    pendingFragments.push(chunk);
    const input = pendingFragments.join("");
    pendingFragments.length = 0;
    pendingFragmentsLength = 0;
    storeTrailing(processLines(input));
    checkForBufferOverflow();
  }
  function resumeAfterSkip(chunk) {
    if (chunk.length === 0) {
      return chunk;
    }
    if (skipNextLineFeed) {
      skipNextLineFeed = false;
      return chunk.charCodeAt(0) === LF ? chunk.slice(1) : chunk;
    }
    const crIndex = chunk.indexOf("\r");
    const lfIndex = chunk.indexOf("\n");
    const lineEnd = crIndex === -1 ? lfIndex : lfIndex === -1 ? crIndex : crIndex < lfIndex ? crIndex : lfIndex;
    if (lineEnd === -1) {
      return "";
    }
    if (lineEnd === chunk.length - 1 && chunk.charCodeAt(lineEnd) === CR) {
      skippingLine = false;
      skipNextLineFeed = true;
      return "";
    }
    skippingLine = false;
    return chunk.slice(lineEnd + (chunk.charCodeAt(lineEnd) === CR && chunk.charCodeAt(lineEnd + 1) === LF ? 2 : 1));
  }
  function storeTrailing(trailing) {
    if (!trailing)
      return;
    if (trailing.charCodeAt(trailing.length - 1) === CR) {
      parseLine(trailing, 0, trailing.length - 1);
      if (checkForBufferOverflow())
        return;
      skipNextLineFeed = true;
      return;
    }
    if (shouldBufferTrailing(trailing)) {
      pendingFragments.push(trailing);
      pendingFragmentsLength = trailing.length;
      return;
    }
    skippingLine = true;
  }
  function shouldBufferTrailing(trailing) {
    const firstCharCode = trailing.charCodeAt(0);
    return firstCharCode === 58 && !!onComment || firstCharCode === 100 && isPotentialField(trailing, "data") || firstCharCode === 101 && isPotentialField(trailing, "event") || firstCharCode === 105 && isPotentialField(trailing, "id") || firstCharCode === 114 && isPotentialField(trailing, "retry");
  }
  function checkForBufferOverflow() {
    if (terminated)
      return true;
    if (maxBufferSize === void 0)
      return false;
    if (pendingFragmentsLength + data.length <= maxBufferSize)
      return false;
    terminated = true;
    pendingFragments.length = 0;
    pendingFragmentsLength = 0;
    id = void 0;
    data = "";
    dataLines = 0;
    eventType = void 0;
    skippingLine = false;
    skipNextLineFeed = false;
    onError === null || onError === void 0 ? void 0 : onError(new ParseError(`Buffered data exceeded max buffer size of ${maxBufferSize} characters`, {
      type: "max-buffer-size-exceeded"
    }));
    return true;
  }
  function processLines(chunk) {
    let searchIndex = 0;
    if (chunk.indexOf("\r") === -1) {
      let lfIndex2 = chunk.indexOf("\n", searchIndex);
      while (lfIndex2 !== -1) {
        if (searchIndex === lfIndex2) {
          if (id !== void 0) {
            onId === null || onId === void 0 ? void 0 : onId(id);
          }
          if (dataLines > 0) {
            onEvent === null || onEvent === void 0 ? void 0 : onEvent({ id, event: eventType, data });
          }
          id = void 0;
          data = "";
          dataLines = 0;
          eventType = void 0;
          searchIndex = lfIndex2 + 1;
          lfIndex2 = chunk.indexOf("\n", searchIndex);
          continue;
        }
        const firstCharCode = chunk.charCodeAt(searchIndex);
        if (isDataPrefix(chunk, searchIndex, firstCharCode)) {
          const valueStart = chunk.charCodeAt(searchIndex + 5) === SPACE ? searchIndex + 6 : searchIndex + 5;
          const value = chunk.slice(valueStart, lfIndex2);
          if (dataLines === 0 && chunk.charCodeAt(lfIndex2 + 1) === LF) {
            if (id !== void 0) {
              onId === null || onId === void 0 ? void 0 : onId(id);
            }
            onEvent === null || onEvent === void 0 ? void 0 : onEvent({ id, event: eventType, data: value });
            id = void 0;
            data = "";
            eventType = void 0;
            searchIndex = lfIndex2 + 2;
            lfIndex2 = chunk.indexOf("\n", searchIndex);
            continue;
          }
          data = dataLines === 0 ? value : `${data}
${value}`;
          dataLines++;
        } else if (isEventPrefix(chunk, searchIndex, firstCharCode)) {
          eventType = chunk.slice(chunk.charCodeAt(searchIndex + 6) === SPACE ? searchIndex + 7 : searchIndex + 6, lfIndex2) || void 0;
        } else {
          parseLine(chunk, searchIndex, lfIndex2);
        }
        if (checkForBufferOverflow())
          return "";
        searchIndex = lfIndex2 + 1;
        lfIndex2 = chunk.indexOf("\n", searchIndex);
      }
      return chunk.slice(searchIndex);
    }
    let crIndex = chunk.indexOf("\r", searchIndex);
    let lfIndex = chunk.indexOf("\n", searchIndex);
    while (searchIndex < chunk.length) {
      let lineEnd = -1;
      if (crIndex !== -1 && lfIndex !== -1) {
        lineEnd = crIndex < lfIndex ? crIndex : lfIndex;
      } else if (crIndex !== -1) {
        if (crIndex === chunk.length - 1) {
          lineEnd = -1;
        } else {
          lineEnd = crIndex;
        }
      } else if (lfIndex !== -1) {
        lineEnd = lfIndex;
      }
      if (lineEnd === -1) {
        break;
      }
      parseLine(chunk, searchIndex, lineEnd);
      if (checkForBufferOverflow())
        return "";
      searchIndex = lineEnd + 1;
      if (chunk.charCodeAt(searchIndex - 1) === CR && chunk.charCodeAt(searchIndex) === LF) {
        searchIndex++;
      }
      if (crIndex !== -1 && crIndex < searchIndex) {
        crIndex = chunk.indexOf("\r", searchIndex);
      }
      if (lfIndex !== -1 && lfIndex < searchIndex) {
        lfIndex = chunk.indexOf("\n", searchIndex);
      }
    }
    return chunk.slice(searchIndex);
  }
  function parseLine(chunk, start, end) {
    if (start === end) {
      dispatchEvent();
      return;
    }
    const firstCharCode = chunk.charCodeAt(start);
    if (isDataPrefix(chunk, start, firstCharCode)) {
      const valueStart = chunk.charCodeAt(start + 5) === SPACE ? start + 6 : start + 5;
      const value2 = chunk.slice(valueStart, end);
      data = dataLines === 0 ? value2 : `${data}
${value2}`;
      dataLines++;
      return;
    }
    if (isEventPrefix(chunk, start, firstCharCode)) {
      eventType = chunk.slice(chunk.charCodeAt(start + 6) === SPACE ? start + 7 : start + 6, end) || void 0;
      return;
    }
    if (firstCharCode === 105 && chunk.charCodeAt(start + 1) === 100 && chunk.charCodeAt(start + 2) === 58) {
      const value2 = chunk.slice(chunk.charCodeAt(start + 3) === SPACE ? start + 4 : start + 3, end);
      if (!value2.includes("\0"))
        id = value2;
      return;
    }
    if (firstCharCode === 58) {
      if (onComment) {
        const line2 = chunk.slice(start, end);
        onComment(line2.slice(chunk.charCodeAt(start + 1) === SPACE ? 2 : 1));
      }
      return;
    }
    const line = chunk.slice(start, end);
    const fieldSeparatorIndex = line.indexOf(":");
    if (fieldSeparatorIndex === -1) {
      processField(line, "", line);
      return;
    }
    const field = line.slice(0, fieldSeparatorIndex);
    const offset = line.charCodeAt(fieldSeparatorIndex + 1) === SPACE ? 2 : 1;
    const value = line.slice(fieldSeparatorIndex + offset);
    processField(field, value, line);
  }
  function processField(field, value, line) {
    switch (field) {
      case "event":
        eventType = value || void 0;
        break;
      case "data":
        data = dataLines === 0 ? value : `${data}
${value}`;
        dataLines++;
        break;
      case "id":
        if (!value.includes("\0"))
          id = value;
        break;
      case "retry":
        if (/^\d+$/.test(value)) {
          onRetry === null || onRetry === void 0 ? void 0 : onRetry(parseInt(value, 10));
        } else {
          onError === null || onError === void 0 ? void 0 : onError(new ParseError(`Invalid \`retry\` value: "${value}"`, {
            type: "invalid-retry",
            value,
            line
          }));
        }
        break;
      default:
        onError === null || onError === void 0 ? void 0 : onError(new ParseError(`Unknown field "${field.length > 20 ? `${field.slice(0, 20)}…` : field}"`, { type: "unknown-field", field, value, line }));
        break;
    }
  }
  function dispatchEvent() {
    if (id !== void 0) {
      onId === null || onId === void 0 ? void 0 : onId(id);
    }
    if (dataLines > 0) {
      onEvent === null || onEvent === void 0 ? void 0 : onEvent({
        id,
        event: eventType,
        data
      });
    }
    id = void 0;
    data = "";
    dataLines = 0;
    eventType = void 0;
  }
  function reset(options = {}) {
    if (options.consume && pendingFragments.length > 0) {
      const incompleteLine = pendingFragments.join("");
      parseLine(incompleteLine, 0, incompleteLine.length);
    }
    bomPrefix = "";
    id = void 0;
    data = "";
    dataLines = 0;
    eventType = void 0;
    pendingFragments.length = 0;
    pendingFragmentsLength = 0;
    terminated = false;
    skippingLine = false;
    skipNextLineFeed = false;
  }
  return { feed, reset };
}
function isDataPrefix(chunk, i, firstCharCode) {
  return firstCharCode === 100 && chunk.charCodeAt(i + 1) === 97 && chunk.charCodeAt(i + 2) === 116 && chunk.charCodeAt(i + 3) === 97 && chunk.charCodeAt(i + 4) === 58;
}
function isEventPrefix(chunk, i, firstCharCode) {
  return firstCharCode === 101 && chunk.charCodeAt(i + 1) === 118 && chunk.charCodeAt(i + 2) === 101 && chunk.charCodeAt(i + 3) === 110 && chunk.charCodeAt(i + 4) === 116 && chunk.charCodeAt(i + 5) === 58;
}
function isPotentialField(line, field) {
  let i = 1;
  while (i < line.length && i < field.length) {
    if (line.charCodeAt(i) !== field.charCodeAt(i)) {
      return false;
    }
    i++;
  }
  return line.length <= field.length || line.charCodeAt(field.length) === 58;
}

// ../typescript/src/watch.ts
function parseEvent(message) {
  const eventId = message.id ?? "";
  if (message.event === "queue.reset") {
    const data = JSON.parse(message.data);
    return { type: "reset", eventId, entries: data.entries };
  }
  if (message.event === "queue.update") {
    const data = JSON.parse(message.data);
    const update = { type: "update", eventId, kind: data.kind, id: data.id, entry: data.entry };
    return typeof data.turn === "object" && data.turn !== null ? { ...update, turn: data.turn } : update;
  }
  return void 0;
}
function watchSession(deps, ws, ses, handlers, options = {}) {
  const controller = new AbortController();
  const outer = options.signal;
  if (outer?.aborted) controller.abort(outer.reason);
  else outer?.addEventListener("abort", () => controller.abort(outer.reason), { once: true });
  const signal = controller.signal;
  let lastEventId = options.lastEventId;
  const dispatch = (message) => {
    let event;
    try {
      event = parseEvent(message);
    } catch (err) {
      handlers.onError?.(err, true);
      return;
    }
    if (event === void 0) return;
    if (message.id !== void 0) lastEventId = message.id;
    try {
      if (event.type === "reset") handlers.onReset?.(event);
      else handlers.onUpdate?.(event);
      handlers.onEvent?.(event);
    } catch (err) {
      handlers.onError?.(err, true);
    }
  };
  let gotEvents = false;
  const connect = async () => {
    const query = {};
    if (deps.ticket !== void 0) query.ticket = await deps.ticket(ws, signal);
    const headers = { Accept: "text/event-stream" };
    if (lastEventId !== void 0) headers["Last-Event-ID"] = lastEventId;
    const res = await deps.transport.request("GET", sessionPath(ws, ses, "/events"), {
      headers,
      query,
      signal,
      auth: deps.ticket === void 0
    });
    if (!res.ok) throw await OutboxError.fromResponse(res);
    if (res.body === null) throw OutboxError.network(new Error("the event stream has no body"));
    handlers.onOpen?.();
    const parser = createParser({
      onEvent: (message) => {
        gotEvents = true;
        dispatch(message);
      }
    });
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    try {
      for (; ; ) {
        const { value, done: done2 } = await reader.read();
        if (done2) return;
        parser.feed(value);
      }
    } catch (err) {
      if (signal.aborted) throw signal.reason;
      throw OutboxError.network(err);
    } finally {
      reader.releaseLock();
    }
  };
  const run = async () => {
    let attempt = 0;
    while (!signal.aborted) {
      let retryAfterMs;
      gotEvents = false;
      try {
        await connect();
      } catch (err) {
        if (signal.aborted) return;
        const error = err instanceof OutboxError ? err : OutboxError.network(err);
        if (!error.retryable) {
          handlers.onError?.(error, false);
          return;
        }
        handlers.onError?.(error, true);
        retryAfterMs = error.retryAfterMs;
      }
      if (gotEvents) attempt = 0;
      try {
        await sleep(deps.backoff.delay(attempt++, retryAfterMs), signal);
      } catch {
        return;
      }
    }
  };
  const done = run();
  return {
    close: () => controller.abort(),
    get lastEventId() {
      return lastEventId;
    },
    done
  };
}

// ../typescript/src/client.ts
var OutboxClient = class {
  /** The store of unacknowledged prompts. */
  store;
  transport;
  backoff;
  streamAuth;
  inFlight = /* @__PURE__ */ new Set();
  constructor(options) {
    this.transport = new Transport(options.baseUrl, options.token, options.fetch);
    this.store = options.store ?? new MemoryStore();
    this.backoff = new Backoff(options.backoff);
    this.streamAuth = options.streamAuth ?? "header";
  }
  /**
   * Hand a prompt to the outbox, exactly once.
   *
   * Mints a key (`crypto.randomUUID()`), saves the prompt in the store, then POSTs it with
   * the key as `Idempotency-Key` and `clientMessageID`. No answer, 408, 429 and 5xx (503
   * `not_durable` included) are retried with the same key, after exponential backoff with
   * full jitter (at least `Retry-After`). A 2xx resolves (202 accepted, or 200: a replay,
   * the prompt was already there) and removes the prompt from the store. A 401 or 403
   * (`isAuth`: the token, not the prompt) rejects and keeps it, for `resumePending` with a
   * new token. Any other 4xx removes it and rejects with that `OutboxError` (for 422
   * `idempotency_key_reused`, its `id` is the entry the key was first accepted as). An
   * abort, or running out of `backoff.maxAttempts`, rejects and leaves it in the store.
   */
  async send(ws, ses, text, options = {}) {
    const prompt = { key: crypto.randomUUID(), ws, ses, text, createdAt: Date.now() };
    if (options.model !== void 0) prompt.model = options.model;
    if (options.whileBusy !== void 0) prompt.whileBusy = options.whileBusy;
    this.inFlight.add(prompt.key);
    try {
      await this.store.save(prompt);
      return await this.deliver(prompt, options.signal);
    } finally {
      this.inFlight.delete(prompt.key);
    }
  }
  /**
   * Send again every prompt in the store that no `send` of this client is working on (what a
   * page that reloaded mid-send left behind), each with its own key, so each lands once.
   * Within a session they go one after the other, oldest first; sessions go in parallel.
   * Never rejects: each prompt's outcome is in the results (same rules as `send`).
   */
  async resumePending(options = {}) {
    const stored = (await this.store.all()).filter((p) => !this.inFlight.has(p.key)).sort((a, b) => a.createdAt - b.createdAt);
    const bySession = /* @__PURE__ */ new Map();
    for (const prompt of stored) {
      const name = JSON.stringify([prompt.ws, prompt.ses]);
      bySession.set(name, [...bySession.get(name) ?? [], prompt]);
    }
    const outcomes = /* @__PURE__ */ new Map();
    await Promise.all(
      [...bySession.values()].map(async (prompts) => {
        for (const prompt of prompts) {
          this.inFlight.add(prompt.key);
          try {
            const result = await this.deliver(prompt, options.signal);
            outcomes.set(prompt.key, { prompt, ok: true, result });
          } catch (error) {
            outcomes.set(prompt.key, { prompt, ok: false, error });
          } finally {
            this.inFlight.delete(prompt.key);
          }
        }
      })
    );
    return stored.flatMap((p) => {
      const outcome = outcomes.get(p.key);
      return outcome === void 0 ? [] : [outcome];
    });
  }
  /**
   * Follow a session: `onReset` with the whole queue, then `onUpdate` per change, over SSE
   * read with `fetch`. After a break it reconnects (exponential backoff) with `Last-Event-ID`,
   * and gets exactly the changes it missed (or a fresh reset if the server no longer has
   * them). See `OutboxClientOptions.streamAuth` for tickets. Returns at once; `close()` stops.
   */
  watch(ws, ses, handlers, options = {}) {
    let ticket;
    if (this.streamAuth === "ticket") {
      ticket = async (forWs, signal) => (await this.ticket(forWs, { signal })).ticket;
    } else if (typeof this.streamAuth === "function") {
      ticket = this.streamAuth;
    }
    return watchSession(
      { transport: this.transport, backoff: this.backoff, ticket },
      ws,
      ses,
      handlers,
      options
    );
  }
  /** The session's entries in FIFO order (staged first). */
  async list(ws, ses, options = {}) {
    const path = sessionPath(ws, ses, "/prompts");
    const answer = await this.transport.json("GET", path, { signal: options.signal });
    return answer.entries;
  }
  /**
   * Re-arm an `error` entry. `OutboxError` 404 (`isNotFound`) when there is no error entry
   * with that ID; 409 `busy` (`isBusy`) while a delivery holds the session.
   */
  async retry(ws, ses, id, options = {}) {
    const path = sessionPath(ws, ses, `/prompts/${encodeURIComponent(id)}/retry`);
    return this.transport.json("POST", path, { signal: options.signal });
  }
  /** Remove an entry. `OutboxError` 404 when absent; 409 `busy` while a delivery holds the session. */
  async dismiss(ws, ses, id, options = {}) {
    const path = sessionPath(ws, ses, `/prompts/${encodeURIComponent(id)}`);
    await this.transport.json("DELETE", path, { signal: options.signal });
  }
  /**
   * Replace the text or model (`model: null` removes it) of a `pending` or `error` entry
   * before it is sent. `OutboxError` 404 when absent; 409 `busy` while a delivery holds the
   * session, 409 `not_editable` once it is staged, verifying or parked.
   */
  async edit(ws, ses, id, changes, options = {}) {
    const path = sessionPath(ws, ses, `/prompts/${encodeURIComponent(id)}`);
    return this.transport.json("PATCH", path, { body: changes, signal: options.signal });
  }
  /**
   * The session's turn while it is held in one (the agent works on a delivered prompt, and
   * the next entry waits for the turn to end); `null` when it is not (404 `no_turn`). The
   * event stream says when a turn begins and ends; this reads it at any moment, e.g. after a
   * reload whose queue is empty.
   */
  async turn(ws, ses, options = {}) {
    try {
      const path = sessionPath(ws, ses, "/turn");
      return await this.transport.json("GET", path, { signal: options.signal });
    } catch (err) {
      if (err instanceof OutboxError && err.status === 404 && err.code === "no_turn") return null;
      throw err;
    }
  }
  /** Who the token speaks for: its user, whether it is an admin token, its workspaces. */
  async me(options = {}) {
    return this.transport.json("GET", "/v1/me", { signal: options.signal });
  }
  /**
   * A page of workspaces with their entries by status (every workspace holding work for an
   * admin token, the token's own otherwise). Pass the answer's `next` for the next page.
   */
  async workspaces(options = {}) {
    return this.transport.json("GET", "/v1/workspaces", {
      query: pageQuery(options),
      signal: options.signal
    });
  }
  /** A page of the workspace's sessions holding entries, busiest first, with their counts. */
  async sessions(ws, options = {}) {
    const path = `/v1/workspaces/${encodeURIComponent(ws)}/sessions`;
    return this.transport.json("GET", path, {
      query: pageQuery(options),
      signal: options.signal
    });
  }
  /**
   * The workspace's last minutes (`minutes`, 1 to 60, default 60), oldest first: prompts
   * accepted, delivered and failed each minute, and how long its oldest pending entry had
   * waited at the minute's end (`oldestPendingFor`, ns; null when not known).
   */
  async series(ws, options = {}) {
    const path = `/v1/workspaces/${encodeURIComponent(ws)}/series`;
    const minutes = options.minutes === void 0 ? void 0 : String(options.minutes);
    return this.transport.json("GET", path, { query: { minutes }, signal: options.signal });
  }
  /**
   * The session's recently delivered prompts, newest first: when each was sent and its turn
   * (ID, how long it took in ns, why it ended; null while it runs), from the newest `events`
   * (1 to 200, default 100) of its event log.
   */
  async history(ws, ses, options = {}) {
    const events = options.events === void 0 ? void 0 : String(options.events);
    return this.transport.json("GET", sessionPath(ws, ses, "/history"), {
      query: { events },
      signal: options.signal
    });
  }
  /**
   * Re-arm every error entry of the session, or of every session of the workspace when `ses`
   * is left out. Sessions a delivery holds are skipped and named in `busy` (try again).
   */
  async retryErrors(ws, ses, options = {}) {
    return this.transport.json("POST", errorsPath(ws, ses, "retry"), {
      signal: options.signal
    });
  }
  /** Remove every error entry of the session (or of the workspace), as `retryErrors`. */
  async dismissErrors(ws, ses, options = {}) {
    return this.transport.json("POST", errorsPath(ws, ses, "dismiss"), {
      signal: options.signal
    });
  }
  /** Park every pending and verifying entry of the workspace, with a reason (admin). */
  async park(ws, reason, options = {}) {
    const path = `/v1/workspaces/${encodeURIComponent(ws)}/park`;
    return this.transport.json("POST", path, { body: { reason }, signal: options.signal });
  }
  /** Re-arm the workspace's parked entries (admin). */
  async unpark(ws, options = {}) {
    const path = `/v1/workspaces/${encodeURIComponent(ws)}/unpark`;
    return this.transport.json("POST", path, { signal: options.signal });
  }
  /** Re-arm unverifiable errors, and settle error entries against the ledger probe (admin). */
  async sweep(ws, options = {}) {
    const path = `/v1/workspaces/${encodeURIComponent(ws)}/sweep`;
    return this.transport.json("POST", path, { signal: options.signal });
  }
  /** A stream ticket for the workspace's event streams (valid `expiresIn` seconds). */
  async ticket(ws, options = {}) {
    const path = `/v1/workspaces/${encodeURIComponent(ws)}/events/ticket`;
    return this.transport.json("POST", path, { signal: options.signal });
  }
  /** POST a stored prompt until answered; remove it from the store unless it may still land. */
  async deliver(prompt, signal) {
    let result;
    try {
      result = await postUntilAnswered(this.transport, this.backoff, prompt, signal);
    } catch (err) {
      if (err instanceof OutboxError && !err.retryable && !err.isAuth) {
        await this.store.remove(prompt.key);
      }
      throw err;
    }
    await this.store.remove(prompt.key);
    return result;
  }
};
function pageQuery(options) {
  return {
    cursor: options.cursor,
    limit: options.limit === void 0 ? void 0 : String(options.limit)
  };
}
function errorsPath(ws, ses, action) {
  const base = ses === void 0 ? `/v1/workspaces/${encodeURIComponent(ws)}` : sessionPath(ws, ses);
  return `${base}/errors/${action}`;
}

// src/dom.ts
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (/^on/i.test(name)) throw new Error(`h(): event-handler attribute ${name} refused`);
    if (value === null || value === void 0 || value === false) continue;
    el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, ...children);
  return el;
}
function append(parent, ...children) {
  for (const child of children) {
    if (child === null || child === void 0 || child === false) continue;
    parent.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}
function replace(parent, ...children) {
  while (parent.firstChild) parent.removeChild(parent.firstChild);
  append(parent, ...children);
}
function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
}
function button(label, action, attrs = {}) {
  const el = h("button", { type: "button", ...attrs }, label);
  el.addEventListener("click", () => {
    el.disabled = true;
    void Promise.resolve().then(action).finally(() => {
      el.disabled = false;
    });
  });
  return el;
}
function byId(id) {
  const el = document.getElementById(id);
  if (el === null) throw new Error(`#${id} missing from index.html`);
  return el;
}

// src/routes.ts
function parseRoute(hash) {
  let parts;
  try {
    parts = hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  } catch {
    return { view: "workspaces" };
  }
  if (parts[0] === "ws" && parts[1] !== void 0) {
    if (parts[2] === "s" && parts[3] !== void 0) {
      return { view: "session", ws: parts[1], ses: parts[3] };
    }
    return { view: "workspace", ws: parts[1] };
  }
  return { view: "workspaces" };
}
function wsHash(ws) {
  return `#/ws/${encodeURIComponent(ws)}`;
}
function sessionHash(ws, ses) {
  return `${wsHash(ws)}/s/${encodeURIComponent(ses)}`;
}

// src/format.ts
function nsToSeconds(ns) {
  return ns === null || ns === void 0 ? null : ns / 1e9;
}
function duration(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return s % 60 ? `${m} min ${s % 60} s` : `${m} min`;
  const hours = Math.floor(m / 60);
  if (hours < 24) return m % 60 ? `${hours} h ${m % 60} min` : `${hours} h`;
  const d = Math.floor(hours / 24);
  return hours % 24 ? `${d} d ${hours % 24} h` : `${d} d`;
}
function age(iso, now) {
  const t = Date.parse(iso);
  return Number.isNaN(t) ? "?" : duration((now - t) / 1e3);
}
function until(iso, now) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return "?";
  return t <= now ? "now" : `in ${duration((t - now) / 1e3)}`;
}

// src/widgets.ts
var STATUSES = [
  "pending",
  "delivering",
  "verifying",
  "error",
  "parked"
];
function pill(status, count) {
  const label = count === void 0 ? status : `${count} ${status}`;
  return h("span", { class: `pill pill-${STATUSES.includes(status) ? status : "other"}`, "data-status": status }, label);
}
function countPills(counts) {
  const pills = STATUSES.filter((s) => counts[s] > 0).map((s) => pill(s, counts[s]));
  return h("span", { class: "pills" }, ...pills.length ? pills : [h("span", { class: "muted" }, "no entries")]);
}
function waited(label, ns) {
  const s = nsToSeconds(ns);
  return s === null ? null : h("span", { class: "fact" }, `${label} ${duration(s)}`);
}
var noticeTimer;
function notice(text, kind = "ok") {
  const el = byId("notice");
  el.className = `notice notice-${kind}`;
  setText(el, text);
  el.hidden = false;
  if (noticeTimer !== void 0) clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => {
    el.hidden = true;
  }, 1e4);
}
function explain(err) {
  if (err instanceof OutboxError) {
    if (err.isBusy) return "busy, try again: a delivery or the agent's turn holds this session right now";
    if (err.code === "not_editable") return "not editable now: it is being sent, verified or is parked";
    if (err.isNotFound) return "gone: it was delivered or removed already";
    if (err.status === 401) return "the token was refused: sign in again";
    if (err.status === 403) return "this token may not do that here";
    if (err.status === 0) return "the service did not answer; try again";
    const detail = typeof err.detail === "string" ? err.detail : JSON.stringify(err.detail);
    return `${err.status} ${err.code}: ${detail}`;
  }
  return err instanceof Error ? err.message : String(err);
}
async function act(run) {
  try {
    notice(await run(), "ok");
    return true;
  } catch (err) {
    const busy = err instanceof OutboxError && err.isBusy;
    notice(explain(err), busy ? "warn" : "error");
    return false;
  }
}
function bulkSummary(verb, result) {
  const done = `${verb} ${result.done} error ${result.done === 1 ? "entry" : "entries"}`;
  if (result.busy.length === 0) return done;
  return `${done}; busy, try again: ${result.busy.length} session(s) were held by a delivery or an agent's turn (${result.busy.join(", ")})`;
}
function errorsToolbar(client, ws, ses, after = async () => {
}) {
  const one = ses !== void 0;
  const all = one ? "" : " all";
  return h(
    "div",
    { class: "toolbar", id: one ? "session-bulk" : "ws-bulk" },
    h("span", { class: "label" }, `Error entries of ${one ? "this" : "every"} session:`),
    button(`Retry${all} errors`, async () => {
      await act(async () => bulkSummary("retried", await client.retryErrors(ws, ses)));
      await after();
    }),
    button(
      `Dismiss${all} errors`,
      async () => {
        const ok = await ask({
          message: `Dismiss every error entry of ${one ? `session ${ses}` : `workspace ${ws}`}? They are removed for good.`,
          ok: `Dismiss${all} errors`,
          danger: true
        });
        if (ok === null) return;
        await act(async () => bulkSummary("dismissed", await client.dismissErrors(ws, ses)));
        await after();
      },
      { class: "danger-outline" }
    )
  );
}
function ask(options) {
  const dialog = byId("ask");
  const input = byId("ask-input");
  const field = byId("ask-field");
  const ok = byId("ask-ok");
  setText(byId("ask-message"), options.message);
  setText(ok, options.ok);
  ok.className = options.danger ? "danger" : "primary";
  field.hidden = options.input === void 0;
  input.required = options.input !== void 0;
  input.maxLength = 500;
  input.value = options.value ?? "";
  setText(byId("ask-label"), options.input ?? "");
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => resolve(dialog.returnValue === "ok" ? options.input === void 0 ? "" : input.value.trim() : null),
      { once: true }
    );
    dialog.showModal();
    if (options.input !== void 0) input.focus();
    else byId("ask-cancel").focus();
  });
}
var Pager = class {
  constructor(onMove) {
    this.onMove = onMove;
    this.prevButton = h("button", { type: "button", class: "prev" }, "← Previous");
    this.nextButton = h("button", { type: "button", class: "next" }, "Next →");
    this.prevButton.addEventListener("click", () => {
      this.stack.pop();
      this.onMove();
    });
    this.nextButton.addEventListener("click", () => {
      if (this.next !== null) this.stack.push(this.next);
      this.onMove();
    });
    this.el = h("div", { class: "pager" }, this.prevButton, this.nextButton);
    this.update(null);
  }
  onMove;
  stack = [];
  next = null;
  el;
  prevButton;
  nextButton;
  /** The cursor of the page shown (undefined: the first). */
  get cursor() {
    return this.stack[this.stack.length - 1];
  }
  /** The shown page's answer said `next`. */
  update(next) {
    this.next = next;
    this.prevButton.hidden = this.stack.length === 0;
    this.nextButton.hidden = next === null;
    this.el.hidden = this.prevButton.hidden && this.nextButton.hidden;
  }
};
function showError(parent, err) {
  replace(parent, h("p", { class: "error-box" }, explain(err)));
}

// src/views/history.ts
function turnText(d) {
  if (d.turn === null || d.turn === void 0) return "no turn";
  const took = nsToSeconds(d.turnFor);
  if (d.turnEnded === null || d.turnEnded === void 0) return `turn ${d.turn} running`;
  const why = d.turnEnded === "ended" ? "" : ` (${d.turnEnded})`;
  return took === null ? `turn ${d.turn} ended${why}` : `turn ${d.turn} took ${duration(took)}${why}`;
}
function showHistory(list, delivered, now) {
  if (delivered.length === 0) {
    replace(list, h("li", { class: "empty muted" }, "Nothing delivered lately."));
    return;
  }
  replace(
    list,
    ...delivered.map(
      (d) => h(
        "li",
        { class: "row", "data-entry": d.id, "data-turn-seconds": nsToSeconds(d.turnFor) ?? "" },
        h("code", { class: "name" }, d.id),
        h(
          "span",
          { class: "facts" },
          h("span", { class: "fact", title: d.sentAt }, `sent ${age(d.sentAt, now)} ago`),
          h("span", { class: "fact turn" }, turnText(d))
        )
      )
    )
  );
}

// src/views/session.ts
var PREVIEW = 120;
var TURN_ASK_MS = 1e4;
var TURN_ENDS = /* @__PURE__ */ new Map([
  ["ended", "the agent said it ended"],
  ["ceiling", "still running at the turn ceiling: aborted and let go"],
  ["unreachable", "the agent never said, until the ceiling and its grace: let go"]
]);
function preview(text) {
  const line = text.split("\n", 1)[0] ?? "";
  const cut = line.length > PREVIEW ? `${line.slice(0, PREVIEW)}…` : line;
  return cut !== text ? `${cut} …` : cut;
}
var Card = class {
  constructor(entry, session) {
    this.session = session;
    this.entry = entry;
    const { client } = session.ctx;
    const { ws, ses } = session;
    this.retryButton = button(
      "Retry",
      () => act(async () => {
        await client.retry(ws, ses, this.entry.id);
        return "retried: it goes out again";
      }),
      { class: "retry" }
    );
    this.editButton = button("Edit", () => this.openEditor(), { class: "edit" });
    const dismiss = button(
      "Dismiss",
      async () => {
        const ok = await ask({
          message: `Dismiss this entry (${this.entry.status})? It is removed for good.`,
          ok: "Dismiss",
          danger: true
        });
        if (ok === null) return;
        await act(async () => {
          await client.dismiss(ws, ses, this.entry.id);
          return "dismissed";
        });
      },
      { class: "dismiss danger-outline" }
    );
    this.editForm = h(
      "form",
      { class: "editor", hidden: true },
      this.editText,
      h(
        "div",
        { class: "buttons" },
        h("button", { type: "submit", class: "primary save" }, "Save text"),
        button("Cancel", () => this.closeEditor(), { class: "cancel" })
      )
    );
    this.editForm.addEventListener("submit", (event) => {
      event.preventDefault();
      const text = this.editText.value;
      void act(async () => {
        await client.edit(ws, ses, this.entry.id, { text });
        this.closeEditor();
        return "edited: the new text goes out";
      });
    });
    this.el = h(
      "li",
      { class: "entry" },
      h(
        "div",
        { class: "entry-head" },
        this.pillSlot,
        h("code", { class: "entry-id", title: entry.id }, entry.id)
      ),
      this.facts,
      this.lastError,
      h("details", { class: "text" }, this.summary, this.full),
      h("div", { class: "actions" }, this.retryButton, this.editButton, dismiss),
      this.editForm
    );
    this.update(entry);
  }
  session;
  el;
  entry;
  pillSlot = h("span", { class: "pill-slot" });
  facts = h("span", { class: "facts" });
  lastError = h("p", { class: "last-error" });
  summary = h("summary", { class: "preview" });
  full = h("pre", { class: "full-text" });
  retryButton;
  editButton;
  editForm;
  editText = h("textarea", { rows: 4, class: "edit-text", "aria-label": "new text" });
  update(entry) {
    this.entry = entry;
    this.el.dataset["id"] = entry.id;
    if (this.el.dataset["status"] !== entry.status) {
      this.el.dataset["status"] = entry.status;
      replace(this.pillSlot, pill(entry.status));
    }
    const error = entry.lastError ?? "";
    this.lastError.hidden = error === "";
    setText(this.lastError, entry.status === "parked" ? error : `last error: ${error}`);
    setText(this.summary, preview(entry.text));
    setText(this.full, entry.text);
    this.retryButton.hidden = entry.status !== "error";
    this.editButton.hidden = entry.status !== "pending" && entry.status !== "error";
    this.tick(Date.now());
  }
  /** The facts that move with the clock. */
  tick(now) {
    const e = this.entry;
    const facts = [`attempts ${e.attempts}`, `verify attempts ${e.verifyAttempts ?? 0}`];
    if (e.transientFails) facts.push(`transient failures ${e.transientFails}`);
    facts.push(`age ${age(e.acceptedAt, now)}`);
    const turn = this.session.turn();
    if (e.status === "delivering" && e.lastAttemptAt) {
      facts.push(`delivering for ${age(e.lastAttemptAt, now)}`);
    } else if (e.status === "pending" && turn !== null) {
      facts.push(`waiting for the agent's turn to end (working for ${duration((now - turn.since) / 1e3)})`);
    } else if (e.status === "pending" && this.session.inFlightSince() !== null) {
      const since = this.session.inFlightSince() ?? now;
      facts.push(`blocked behind an in-flight delivery for ${duration((now - since) / 1e3)}`);
    } else if ((e.status === "pending" || e.status === "verifying") && e.nextAttemptAt) {
      facts.push(`next attempt ${until(e.nextAttemptAt, now)}`);
    }
    setText(this.facts, facts.join(" · "));
    this.el.dataset["waiting"] = e.status === "pending" && turn !== null ? "turn" : "";
  }
  openEditor() {
    this.editText.value = this.entry.text;
    this.editForm.hidden = false;
    this.editText.focus();
  }
  closeEditor() {
    this.editForm.hidden = true;
  }
};
var SessionView = class {
  constructor(ctx2, ws, ses) {
    this.ctx = ctx2;
    this.ws = ws;
    this.ses = ses;
    const { client } = ctx2;
    const bulk = errorsToolbar(client, ws, ses);
    this.el = h(
      "section",
      { class: "view" },
      h("h1", {}, h("span", { class: "muted" }, "Session "), ses, " ", this.live),
      bulk,
      this.problem,
      this.turnLine,
      this.list,
      h("h2", {}, "Recently delivered"),
      this.history
    );
    this.render();
    this.loadHistory();
    this.watch = client.watch(ws, ses, {
      onOpen: () => this.setLive("live", "live"),
      onReset: ({ entries, eventId }) => {
        this.resets += 1;
        this.list.dataset["resets"] = String(this.resets);
        this.list.dataset["eventId"] = eventId;
        this.entries = [...entries];
        const told = turnFromEntries(entries, Date.now());
        this.supersedeAsk();
        if (told !== void 0) this.current = told;
        else this.askTurn();
        this.render();
      },
      onUpdate: (update) => {
        this.list.dataset["eventId"] = update.eventId;
        this.apply(update);
        this.render();
        if (update.kind === "sent" || update.kind === "turn_ended") this.loadHistory();
      },
      onError: (err, willRetry) => {
        if (willRetry) {
          this.setLive("reconnecting", "reconnecting…");
          return;
        }
        if (err instanceof OutboxError && err.status === 401) {
          ctx2.authLost();
          return;
        }
        this.setLive("stopped", "stopped");
        this.problem.hidden = false;
        setText(this.problem, explain(err));
      }
    });
    this.clock = setInterval(() => this.tick(Date.now()), 1e3);
  }
  ctx;
  ws;
  ses;
  el;
  list = h("ul", { class: "entries", id: "entries" });
  live = h("span", { class: "live", "data-state": "connecting" }, "connecting…");
  problem = h("p", { class: "error-box", hidden: true });
  /** The turn line: "agent working ..." while in turn, then how the last turn ended. */
  turnLine = h("p", { class: "turn-line", id: "turn", role: "status", hidden: true });
  /** The delivered prompts, newest first (`history.ts`). */
  history = h("ul", { class: "rows", id: "history" });
  historyAsk = null;
  current = null;
  lastTurn = null;
  entries = [];
  cards = /* @__PURE__ */ new Map();
  watch;
  clock;
  resets = 0;
  /** The turn route asked after a reset; a newer reset, a turn update or `stop` supersedes it. */
  asking = null;
  stop() {
    this.watch.close();
    clearInterval(this.clock);
    this.supersedeAsk();
    this.historyAsk?.abort();
  }
  /** Ask for the history again (a newer ask supersedes one in flight); a failure shows there. */
  loadHistory() {
    this.historyAsk?.abort();
    const asking = new AbortController();
    this.historyAsk = asking;
    this.ctx.client.history(this.ws, this.ses, { signal: asking.signal }).then(({ delivered }) => {
      if (!asking.signal.aborted) showHistory(this.history, delivered, Date.now());
    }).catch((err) => {
      if (!asking.signal.aborted) replace(this.history, h("li", { class: "error-box" }, explain(err)));
    });
  }
  /** The session's turn, while the agent works on a delivered prompt; null otherwise. */
  turn() {
    return this.current;
  }
  /** Since when the session's entry in flight has been with the agent (ms), or null. */
  inFlightSince() {
    const staged = this.entries.find((e) => e.status === "delivering");
    if (staged === void 0) return null;
    return staged.lastAttemptAt ? Date.parse(staged.lastAttemptAt) : Date.now();
  }
  /**
   * After a reset with no pending entry: is the session in turn? One request (GET
   * `.../turn`), cut after TURN_ASK_MS; its answer is dropped once superseded (the stream's
   * news is newer). A failure leaves what the page knew: the stream still brings the end.
   */
  askTurn() {
    const ask2 = new AbortController();
    this.asking = ask2;
    const timer = setTimeout(() => ask2.abort(), TURN_ASK_MS);
    void this.ctx.client.turn(this.ws, this.ses, { signal: ask2.signal }).then((found) => {
      if (this.asking !== ask2) return;
      const now = Date.now();
      const lasted = found !== null && Number.isFinite(found.seconds) ? Math.max(0, found.seconds) : 0;
      this.current = found === null ? null : { id: found.turn, since: now - lasted * 1e3, why: found.why };
      this.tick(now);
    }).catch(() => void 0).finally(() => {
      clearTimeout(timer);
      if (this.asking === ask2) this.asking = null;
    });
  }
  supersedeAsk() {
    this.asking?.abort();
    this.asking = null;
  }
  setLive(state, label) {
    this.live.dataset["state"] = state;
    setText(this.live, label);
  }
  /**
   * One `queue.update`: the entry's new state in place, a new one at the end, gone ones out;
   * a turn's begin or end changes the session's state, no entry (theirs is gone already).
   */
  apply({ kind, id, entry, turn }) {
    if (kind === "turn" || kind === "turn_ended") {
      if (turn === void 0) return;
      this.supersedeAsk();
      this.current = kind === "turn" ? { id: turn.id, since: Date.now(), why: "" } : null;
      this.lastTurn = kind === "turn" ? null : turn;
      return;
    }
    const at = this.entries.findIndex((e) => e.id === id);
    if (entry === null) {
      if (at >= 0) this.entries.splice(at, 1);
    } else if (at >= 0) {
      this.entries[at] = entry;
    } else {
      this.entries.push(entry);
    }
  }
  /** The cards in queue order: kept ones updated and moved only where needed. */
  render() {
    if (this.entries.length > 0) this.list.querySelector(":scope > .empty")?.remove();
    const keep = new Set(this.entries.map((e) => e.id));
    for (const [id, card] of this.cards) {
      if (!keep.has(id)) {
        card.el.remove();
        this.cards.delete(id);
      }
    }
    this.entries.forEach((entry, i) => {
      let card = this.cards.get(entry.id);
      if (card === void 0) {
        card = new Card(entry, this);
        this.cards.set(entry.id, card);
      } else if (card.entry !== entry) {
        card.update(entry);
      }
      const here = this.list.children[i];
      if (here !== card.el) this.list.insertBefore(card.el, here ?? null);
    });
    if (this.entries.length === 0 && this.list.querySelector(":scope > .empty") === null) {
      this.list.append(h("li", { class: "empty muted" }, "The queue is empty."));
    }
    this.tick(Date.now());
  }
  /** The facts that move with the clock: the turn line's and every card's. */
  tick(now) {
    const turn = this.current;
    const last = this.lastTurn;
    let state = "";
    let text = "";
    if (turn !== null) {
      state = "turn";
      const which = turn.id === null ? "its ID comes with its end" : `turn ${turn.id}`;
      text = `agent working: ${duration((now - turn.since) / 1e3)} (${which}); the next entry waits for the turn to end`;
      if (turn.why !== "") text += `. Still held: ${turn.why}`;
    } else if (last !== null) {
      state = "ended";
      const why = TURN_ENDS.get(last.why) ?? last.why;
      text = `last turn ${last.id} ended after ${duration(last.seconds)} (${why})`;
    }
    this.turnLine.hidden = state === "";
    this.turnLine.dataset["state"] = state;
    setText(this.turnLine, text);
    for (const card of this.cards.values()) card.tick(now);
  }
};
function turnFromEntries(entries, now) {
  const pending = entries.filter((e) => e.status === "pending");
  if (pending.length === 0) return void 0;
  let longest = null;
  let why = "";
  for (const e of pending) {
    const s = nsToSeconds(e.inTurnFor);
    if (s !== null && s >= 0 && (longest === null || s > longest)) longest = s;
    why ||= e.turnWhy ?? "";
  }
  return longest === null ? null : { id: null, since: now - longest * 1e3, why };
}
function sessionView(ctx2, ws, ses) {
  return new SessionView(ctx2, ws, ses);
}

// src/charts.ts
var SVG = "http://www.w3.org/2000/svg";
var W = 240;
var H = 48;
function floor() {
  return svg("line", { x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5, class: "floor" });
}
function svg(tag, attrs) {
  const el = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  return el;
}
function clock(iso) {
  const t = new Date(iso);
  return `${String(t.getHours()).padStart(2, "0")}:${String(t.getMinutes()).padStart(2, "0")}`;
}
function bars(name, label, minutes, pick) {
  const values = minutes.map(pick);
  const total = values.reduce((a, b) => a + b, 0);
  const peak = Math.max(0, ...values);
  const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot", role: "img", "aria-label": `${label} per minute` });
  const step = W / Math.max(1, values.length);
  plot.append(floor());
  values.forEach((v, i) => {
    const height = v > 0 ? Math.max(1, v / peak * (H - 2)) : 0;
    const bar = svg("rect", { x: i * step, y: H - height, width: Math.max(1, step - 1), height, "data-value": v });
    const tip = svg("title", {});
    tip.textContent = `${clock(minutes[i]?.at ?? "")}: ${v}`;
    bar.append(tip);
    plot.append(bar);
  });
  return h(
    "figure",
    { class: `chart chart-${name}`, "data-chart": name, "data-total": total, "data-peak": peak },
    plot,
    h("figcaption", {}, h("b", {}, label), ` ${total} in the hour, peak ${peak}/min`)
  );
}
function ages(minutes) {
  const seconds = minutes.map((m) => nsToSeconds(m.oldestPendingFor));
  const known = seconds.filter((s) => s !== null);
  const top = Math.max(1, ...known);
  const step = W / Math.max(1, seconds.length - 1);
  const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot", role: "img", "aria-label": "oldest pending age" });
  const points = [];
  seconds.forEach((s, i) => {
    if (s === null) return;
    const x = i * step;
    const y = H - 1 - s / top * (H - 2);
    points.push(`${x.toFixed(1)},${y.toFixed(1)}`);
    const dot = svg("circle", { cx: x.toFixed(1), cy: y.toFixed(1), r: 1.2, "data-value": Math.round(s) });
    const tip = svg("title", {});
    tip.textContent = `${clock(minutes[i]?.at ?? "")}: ${duration(s)}`;
    dot.append(tip);
    plot.append(dot);
  });
  plot.prepend(floor(), svg("polyline", { points: points.join(" "), fill: "none" }));
  const now = seconds[seconds.length - 1] ?? null;
  return h(
    "figure",
    { class: "chart chart-oldest", "data-chart": "oldest", "data-now": now === null ? "" : Math.round(now), "data-peak": Math.round(Math.max(0, ...known)) },
    plot,
    h(
      "figcaption",
      {},
      h("b", {}, "Oldest pending"),
      now === null ? " not known" : now === 0 ? " none pending now" : ` ${duration(now)} now`,
      known.length > 0 ? `, at most ${duration(Math.max(...known))}` : ""
    )
  );
}
function showSeries(el, minutes) {
  replace(
    el,
    bars("accepted", "Accepted", minutes, (m) => m.accepted),
    bars("delivered", "Delivered", minutes, (m) => m.delivered),
    bars("failed", "Failed", minutes, (m) => m.failed),
    ages(minutes)
  );
}

// src/context.ts
var REFRESH_MS = 2e3;
function every(ctx2, ms, fn, fail) {
  const controller = new AbortController();
  let timer;
  const tick = async () => {
    if (document.visibilityState !== "hidden") {
      try {
        await fn(controller.signal);
      } catch (err) {
        if (controller.signal.aborted) return;
        if (err instanceof OutboxError && err.status === 401) {
          ctx2.authLost();
          return;
        }
        fail(err);
      }
    }
    if (!controller.signal.aborted) timer = setTimeout(() => void tick(), ms);
  };
  void tick();
  return () => {
    controller.abort();
    if (timer !== void 0) clearTimeout(timer);
  };
}

// src/views/workspace.ts
var SERIES_MS = 1e4;
function row(ws, s) {
  const inTurn = s.inTurnFor !== null && s.inTurnFor !== void 0;
  return h(
    "li",
    { class: "row", "data-session": s.id, "data-turn": inTurn },
    h("a", { class: "name", href: sessionHash(ws, s.id) }, s.id),
    h(
      "span",
      { class: "facts" },
      h("span", { class: "fact" }, `${s.entries} entr${s.entries === 1 ? "y" : "ies"}`),
      waited("delivering for", s.deliveringFor),
      // In turn the hold is the agent's turn, not a send: its own words, and the wait behind it
      // is the turn's age, so it is not said twice.
      inTurn ? waited("agent working for", s.inTurnFor) : waited("blocked behind an in-flight delivery for", s.blockedFor),
      inTurn && s.counts.pending > 0 ? h("span", { class: "fact" }, "next entry waits for the turn") : null,
      waited("oldest pending", s.oldestPendingFor)
    ),
    countPills(s.counts)
  );
}
function workspaceView(ctx2, ws) {
  const list = h("ul", { class: "rows", id: "sessions" });
  const body = h("div", {}, list);
  const pager = new Pager(() => void refresh());
  const { client } = ctx2;
  const refresh = () => load().catch((err) => showError(body, err));
  const bulk = errorsToolbar(client, ws, void 0, refresh);
  const admin = !ctx2.me.admin ? null : h(
    "div",
    { class: "toolbar admin", id: "ws-admin" },
    h("span", { class: "label" }, "Admin:"),
    button("Park…", async () => {
      const reason = await ask({
        message: `Park workspace ${ws}? Its pending and verifying entries stop until unparked.`,
        ok: "Park",
        danger: true,
        input: "Reason"
      });
      if (reason === null) return;
      await act(async () => `parked ${(await client.park(ws, reason)).parked} entries`);
      await refresh();
    }),
    button("Unpark", async () => {
      await act(async () => `unparked ${(await client.unpark(ws)).unparked} entries`);
      await refresh();
    }),
    button("Sweep…", async () => {
      const ok = await ask({
        message: `Sweep workspace ${ws}? Unverifiable error entries are checked again, and error entries are settled against the ledger.`,
        ok: "Sweep",
        danger: true
      });
      if (ok === null) return;
      await act(async () => {
        const swept = await client.sweep(ws);
        return `swept: ${swept.unverifiable} unverifiable re-armed, ${swept.parkedErrors} settled by the ledger`;
      });
      await refresh();
    })
  );
  const charts = h("div", { class: "charts", id: "charts" });
  const el = h(
    "section",
    { class: "view" },
    h("h1", {}, h("span", { class: "muted" }, "Workspace "), ws),
    bulk,
    admin,
    h("h2", {}, "Last hour"),
    charts,
    h("h2", {}, "Sessions, busiest first"),
    body,
    pager.el
  );
  async function load(signal) {
    const page = await client.sessions(ws, { cursor: pager.cursor, limit: 50, signal });
    pager.update(page.next);
    if (page.sessions.length === 0) {
      replace(list, h("li", { class: "empty muted" }, "No session holds entries."));
    } else {
      replace(list, ...page.sessions.map((s) => row(ws, s)));
    }
    if (body.firstChild !== list) replace(body, list);
  }
  async function loadSeries(signal) {
    showSeries(charts, (await client.series(ws, { signal })).minutes);
  }
  const stops = [
    every(ctx2, REFRESH_MS, load, (err) => showError(body, err)),
    every(ctx2, SERIES_MS, loadSeries, (err) => showError(charts, err))
  ];
  return { el, stop: () => stops.forEach((stop) => stop()) };
}

// src/views/workspaces.ts
function row2(ws) {
  return h(
    "li",
    { class: "row", "data-ws": ws.id },
    h("a", { class: "name", href: wsHash(ws.id) }, ws.id),
    h(
      "span",
      { class: "facts" },
      h("span", { class: "fact" }, `${ws.sessions} session${ws.sessions === 1 ? "" : "s"}`),
      h("span", { class: "fact" }, `${ws.entries} entr${ws.entries === 1 ? "y" : "ies"}`),
      waited("oldest pending", ws.oldestPendingFor)
    ),
    countPills(ws.counts)
  );
}
function workspacesView(ctx2) {
  const list = h("ul", { class: "rows", id: "workspaces" });
  const body = h("div", {}, list);
  const pager = new Pager(() => void load().catch((err) => showError(body, err)));
  const el = h(
    "section",
    { class: "view" },
    h("h1", {}, "Workspaces"),
    h(
      "p",
      { class: "muted" },
      ctx2.me.admin ? "Every workspace holding work." : "The workspaces of this token that hold work."
    ),
    body,
    pager.el
  );
  async function load(signal) {
    const page = await ctx2.client.workspaces({ cursor: pager.cursor, limit: 50, signal });
    pager.update(page.next);
    if (page.workspaces.length === 0) {
      replace(list, h("li", { class: "empty muted" }, "No workspace holds work."));
    } else {
      replace(list, ...page.workspaces.map(row2));
    }
    if (body.firstChild !== list) replace(body, list);
  }
  const stop = every(ctx2, REFRESH_MS, load, (err) => showError(body, err));
  return { el, stop };
}

// src/main.ts
var TOKEN_KEY = "prompt-outbox-ui:token";
var BASE_URL = new URL("..", location.href).href;
var current;
var ctx;
function storedToken() {
  return sessionStorage.getItem(TOKEN_KEY) ?? void 0;
}
function makeClient(token) {
  return new OutboxClient({ baseUrl: BASE_URL, token, backoff: { initialMs: 250, maxMs: 5e3 } });
}
function stopView() {
  current?.stop();
  current = void 0;
}
function signIn(message) {
  stopView();
  ctx = void 0;
  replace(byId("crumbs"));
  replace(byId("who"));
  const input = h("input", {
    type: "password",
    id: "token",
    name: "token",
    autocomplete: "off",
    required: true,
    placeholder: "bearer token"
  });
  const form = h(
    "form",
    { class: "card token-form", id: "sign-in" },
    h("h1", {}, "Sign in"),
    message ? h("p", { class: "error-box" }, message) : null,
    h("p", { class: "muted" }, "Paste an API token. It is kept for this tab only, and forgotten when the tab closes."),
    h("label", {}, h("span", {}, "Token"), input),
    h("button", { type: "submit", class: "primary" }, "Sign in")
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    void boot();
  });
  replace(byId("view"), form);
  input.focus();
}
function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  signIn();
}
function header(me, withToken) {
  replace(
    byId("who"),
    h("span", { class: "user", id: "user" }, me.user),
    me.admin ? h("span", { class: "badge", id: "admin-badge" }, "admin") : null,
    withToken ? button("Sign out", signOut, { class: "sign-out" }) : null
  );
}
function crumbs(parts) {
  const nav = byId("crumbs");
  replace(nav);
  parts.forEach(([label, href], i) => {
    if (i > 0) nav.append(h("span", { class: "sep", "aria-hidden": "true" }, "›"));
    nav.append(i === parts.length - 1 ? h("span", { class: "here" }, label) : h("a", { href }, label));
  });
}
function route() {
  if (ctx === void 0) return;
  stopView();
  const r = parseRoute(location.hash);
  if (r.view === "session") {
    crumbs([["Workspaces", "#/"], [r.ws, wsHash(r.ws)], [r.ses, sessionHash(r.ws, r.ses)]]);
    current = sessionView(ctx, r.ws, r.ses);
  } else if (r.view === "workspace") {
    crumbs([["Workspaces", "#/"], [r.ws, wsHash(r.ws)]]);
    current = workspaceView(ctx, r.ws);
  } else {
    crumbs([["Workspaces", "#/"]]);
    current = workspacesView(ctx);
  }
  replace(byId("view"), current.el);
}
async function boot() {
  const token = storedToken();
  const client = makeClient(token);
  let me;
  try {
    me = await client.me();
  } catch (err) {
    if (err instanceof OutboxError && err.status === 401) {
      if (token !== void 0) sessionStorage.removeItem(TOKEN_KEY);
      signIn(token === void 0 ? void 0 : "That token was refused.");
      return;
    }
    replace(
      byId("view"),
      h("p", { class: "error-box" }, explain(err)),
      button("Try again", boot)
    );
    return;
  }
  ctx = { client, me, authLost: () => signIn("The token was refused: sign in again.") };
  header(me, token !== void 0);
  route();
}
window.addEventListener("hashchange", route);
void boot().finally(() => {
  document.documentElement.dataset["booted"] = "1";
});
