/**
 * What every view shares: status pills, the notice line, the in-page confirm / ask dialog,
 * a pager, and how a refusal is told to a person.
 *
 * @module
 */
import {
  OutboxError,
  type BulkResult,
  type Counts,
  type EntryStatus,
  type OutboxClient,
} from "./client.js";
import { button, byId, h, replace, setText, type Child } from "./dom.js";
import { duration, nsToSeconds } from "./format.js";

export const STATUSES: readonly EntryStatus[] = [
  "pending",
  "delivering",
  "verifying",
  "error",
  "parked",
];

/** A status pill: `<span class="pill pill-error">error</span>`. */
export function pill(status: string, count?: number): HTMLElement {
  const label = count === undefined ? status : `${count} ${status}`;
  return h("span", { class: `pill pill-${STATUSES.includes(status as EntryStatus) ? status : "other"}`, "data-status": status }, label);
}

/** The non-zero counts as pills ("empty" when all are zero). */
export function countPills(counts: Counts): HTMLElement {
  const pills = STATUSES.filter((s) => counts[s] > 0).map((s) => pill(s, counts[s]));
  return h("span", { class: "pills" }, ...(pills.length ? pills : [h("span", { class: "muted" }, "no entries")]));
}

/** "oldest pending 12 s" (nanoseconds in), or nothing. */
export function waited(label: string, ns: number | null | undefined): Child {
  const s = nsToSeconds(ns);
  return s === null ? null : h("span", { class: "fact" }, `${label} ${duration(s)}`);
}

let noticeTimer: ReturnType<typeof setTimeout> | undefined;

/** Say something in the notice line (role=status) for a while. */
export function notice(text: string, kind: "ok" | "warn" | "error" = "ok"): void {
  const el = byId("notice");
  el.className = `notice notice-${kind}`;
  setText(el, text);
  el.hidden = false;
  if (noticeTimer !== undefined) clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => {
    el.hidden = true;
  }, 10_000);
}

/** A refusal, for a person. Busy (409) is "busy, try again", never "gone". */
export function explain(err: unknown): string {
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

/** Run an action; say how it went. Returns whether it succeeded. */
export async function act(run: () => Promise<string>): Promise<boolean> {
  try {
    notice(await run(), "ok");
    return true;
  } catch (err) {
    const busy = err instanceof OutboxError && err.isBusy;
    notice(explain(err), busy ? "warn" : "error");
    return false;
  }
}

/** A bulk action's answer, for a person. */
export function bulkSummary(verb: string, result: BulkResult): string {
  const done = `${verb} ${result.done} error ${result.done === 1 ? "entry" : "entries"}`;
  if (result.busy.length === 0) return done;
  return `${done}; busy, try again: ${result.busy.length} session(s) were held by a delivery or an agent's turn (${result.busy.join(", ")})`;
}

/**
 * Retry / dismiss every error entry of a session, or (no `ses`) of every session of the
 * workspace; dismissing asks first. `after` runs once either action has answered.
 */
export function errorsToolbar(
  client: OutboxClient,
  ws: string,
  ses?: string,
  after: () => Promise<void> = async () => {},
): HTMLElement {
  const one = ses !== undefined;
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
          danger: true,
        });
        if (ok === null) return;
        await act(async () => bulkSummary("dismissed", await client.dismissErrors(ws, ses)));
        await after();
      },
      { class: "danger-outline" },
    ),
  );
}

interface AskOptions {
  /** The question. */
  message: string;
  /** The confirming button's label. */
  ok: string;
  /** A destructive action: the button is red. */
  danger?: boolean;
  /** Ask for a line of text too (e.g. a reason): its label. */
  input?: string;
  /** That text's initial value. */
  value?: string;
}

/**
 * The in-page confirmation (a `<dialog>`): resolves to the typed text (or "" with no input)
 * when confirmed, null when cancelled.
 */
export function ask(options: AskOptions): Promise<string | null> {
  const dialog = byId<HTMLDialogElement>("ask");
  const input = byId<HTMLInputElement>("ask-input");
  const field = byId("ask-field");
  const ok = byId<HTMLButtonElement>("ask-ok");
  setText(byId("ask-message"), options.message);
  setText(ok, options.ok);
  ok.className = options.danger ? "danger" : "primary";
  field.hidden = options.input === undefined;
  input.required = options.input !== undefined;
  input.maxLength = 500;
  input.value = options.value ?? "";
  setText(byId("ask-label"), options.input ?? "");
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => resolve(dialog.returnValue === "ok" ? (options.input === undefined ? "" : input.value.trim()) : null),
      { once: true },
    );
    dialog.showModal();
    if (options.input !== undefined) input.focus();
    else byId("ask-cancel").focus();
  });
}

/** A pager over cursors: "Previous" pops, "Next" pushes the answer's `next`. */
export class Pager {
  private readonly stack: string[] = [];
  private next: string | null = null;
  readonly el: HTMLElement;
  private readonly prevButton: HTMLButtonElement;
  private readonly nextButton: HTMLButtonElement;

  constructor(private readonly onMove: () => void) {
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

  /** The cursor of the page shown (undefined: the first). */
  get cursor(): string | undefined {
    return this.stack[this.stack.length - 1];
  }

  /** The shown page's answer said `next`. */
  update(next: string | null): void {
    this.next = next;
    this.prevButton.hidden = this.stack.length === 0;
    this.nextButton.hidden = next === null;
    this.el.hidden = this.prevButton.hidden && this.nextButton.hidden;
  }
}

/** A view's error box (a refusal or no answer), replacing `parent`'s content. */
export function showError(parent: HTMLElement, err: unknown): void {
  replace(parent, h("p", { class: "error-box" }, explain(err)));
}
