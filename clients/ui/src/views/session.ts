/**
 * `#/ws/<id>/s/<id>`: a session's queue, live. The event stream (`client.watch`) gives the
 * whole queue (`queue.reset`), then each change (`queue.update`), applied in place with no
 * reload; after a break the client reconnects with `Last-Event-ID` and gets exactly what it
 * missed. Each entry: its status pill, attempts and verify attempts, last error, age and
 * next attempt, its text (expandable; always set as text, never as HTML), and its actions.
 *
 * @module
 */
import { OutboxError, type Entry, type QueueUpdate, type WatchHandle } from "../client.js";
import type { Ctx, View } from "../context.js";
import { button, h, replace, setText } from "../dom.js";
import { age, duration, until } from "../format.js";
import { act, ask, errorsToolbar, explain, pill } from "../widgets.js";

const PREVIEW = 120;

/** The first line of a text, cut to PREVIEW characters. */
function preview(text: string): string {
  const line = text.split("\n", 1)[0] ?? "";
  const cut = line.length > PREVIEW ? `${line.slice(0, PREVIEW)}…` : line;
  return cut !== text ? `${cut} …` : cut;
}

/** One entry's card; `update` refreshes it from the entry's new state. */
class Card {
  readonly el: HTMLLIElement;
  entry: Entry;
  private readonly pillSlot = h("span", { class: "pill-slot" });
  private readonly facts = h("span", { class: "facts" });
  private readonly lastError = h("p", { class: "last-error" });
  private readonly summary = h("summary", { class: "preview" });
  private readonly full = h("pre", { class: "full-text" });
  private readonly retryButton: HTMLButtonElement;
  private readonly editButton: HTMLButtonElement;
  private readonly editForm: HTMLFormElement;
  private readonly editText = h("textarea", { rows: 4, class: "edit-text", "aria-label": "new text" });

  constructor(
    entry: Entry,
    private readonly session: SessionView,
  ) {
    this.entry = entry;
    const { client } = session.ctx;
    const { ws, ses } = session;
    this.retryButton = button("Retry", () =>
      act(async () => {
        await client.retry(ws, ses, this.entry.id);
        return "retried: it goes out again";
      }),
      { class: "retry" },
    );
    this.editButton = button("Edit", () => this.openEditor(), { class: "edit" });
    const dismiss = button(
      "Dismiss",
      async () => {
        const ok = await ask({
          message: `Dismiss this entry (${this.entry.status})? It is removed for good.`,
          ok: "Dismiss",
          danger: true,
        });
        if (ok === null) return;
        await act(async () => {
          await client.dismiss(ws, ses, this.entry.id);
          return "dismissed";
        });
      },
      { class: "dismiss danger-outline" },
    );
    this.editForm = h(
      "form",
      { class: "editor", hidden: true },
      this.editText,
      h(
        "div",
        { class: "buttons" },
        h("button", { type: "submit", class: "primary save" }, "Save text"),
        button("Cancel", () => this.closeEditor(), { class: "cancel" }),
      ),
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
        h("code", { class: "entry-id", title: entry.id }, entry.id),
      ),
      this.facts,
      this.lastError,
      h("details", { class: "text" }, this.summary, this.full),
      h("div", { class: "actions" }, this.retryButton, this.editButton, dismiss),
      this.editForm,
    );
    this.update(entry);
  }

  update(entry: Entry): void {
    this.entry = entry;
    this.el.dataset["id"] = entry.id;
    if (this.el.dataset["status"] !== entry.status) {
      this.el.dataset["status"] = entry.status;
      replace(this.pillSlot, pill(entry.status));
    }
    const error = entry.lastError ?? "";
    this.lastError.hidden = error === "";
    // A parked entry's last error is its reason, already worded "parked: <reason>".
    setText(this.lastError, entry.status === "parked" ? error : `last error: ${error}`);
    setText(this.summary, preview(entry.text));
    setText(this.full, entry.text);
    this.retryButton.hidden = entry.status !== "error";
    this.editButton.hidden = entry.status !== "pending" && entry.status !== "error";
    this.tick(Date.now());
  }

  /** The facts that move with the clock. */
  tick(now: number): void {
    const e = this.entry;
    const facts = [`attempts ${e.attempts}`, `verify attempts ${e.verifyAttempts ?? 0}`];
    if (e.transientFails) facts.push(`transient failures ${e.transientFails}`);
    facts.push(`age ${age(e.acceptedAt, now)}`);
    if (e.status === "delivering" && e.lastAttemptAt) {
      facts.push(`delivering for ${age(e.lastAttemptAt, now)}`);
    } else if (e.status === "pending" && this.session.inFlightSince() !== null) {
      const since = this.session.inFlightSince() ?? now;
      facts.push(`blocked behind an in-flight delivery for ${duration((now - since) / 1000)}`);
    } else if ((e.status === "pending" || e.status === "verifying") && e.nextAttemptAt) {
      facts.push(`next attempt ${until(e.nextAttemptAt, now)}`);
    }
    setText(this.facts, facts.join(" · "));
  }

  private openEditor(): void {
    this.editText.value = this.entry.text;
    this.editForm.hidden = false;
    this.editText.focus();
  }

  private closeEditor(): void {
    this.editForm.hidden = true;
  }
}

class SessionView implements View {
  readonly el: HTMLElement;
  private readonly list = h("ul", { class: "entries", id: "entries" });
  private readonly live = h("span", { class: "live", "data-state": "connecting" }, "connecting…");
  private readonly problem = h("p", { class: "error-box", hidden: true });
  private entries: Entry[] = [];
  private readonly cards = new Map<string, Card>();
  private readonly watch: WatchHandle;
  private readonly clock: ReturnType<typeof setInterval>;
  private resets = 0;

  constructor(
    readonly ctx: Ctx,
    readonly ws: string,
    readonly ses: string,
  ) {
    const { client } = ctx;
    const bulk = errorsToolbar(client, ws, ses);
    this.el = h(
      "section",
      { class: "view" },
      h("h1", {}, h("span", { class: "muted" }, "Session "), ses, " ", this.live),
      bulk,
      this.problem,
      this.list,
    );
    this.render();
    this.watch = client.watch(ws, ses, {
      onOpen: () => this.setLive("live", "live"),
      onReset: ({ entries, eventId }) => {
        this.resets += 1;
        this.list.dataset["resets"] = String(this.resets);
        this.list.dataset["eventId"] = eventId;
        this.entries = [...entries];
        this.render();
      },
      onUpdate: (update) => {
        this.list.dataset["eventId"] = update.eventId;
        this.apply(update);
        this.render();
      },
      onError: (err, willRetry) => {
        if (willRetry) {
          this.setLive("reconnecting", "reconnecting…");
          return;
        }
        if (err instanceof OutboxError && err.status === 401) {
          ctx.authLost();
          return;
        }
        this.setLive("stopped", "stopped");
        this.problem.hidden = false;
        setText(this.problem, explain(err));
      },
    });
    this.clock = setInterval(() => {
      const now = Date.now();
      for (const card of this.cards.values()) card.tick(now);
    }, 1000);
  }

  stop(): void {
    this.watch.close();
    clearInterval(this.clock);
  }

  /** Since when the session's entry in flight has been with the agent (ms), or null. */
  inFlightSince(): number | null {
    const staged = this.entries.find((e) => e.status === "delivering");
    if (staged === undefined) return null;
    return staged.lastAttemptAt ? Date.parse(staged.lastAttemptAt) : Date.now();
  }

  private setLive(state: string, label: string): void {
    this.live.dataset["state"] = state;
    setText(this.live, label);
  }

  /** One `queue.update`: the entry's new state in place, a new one at the end, gone ones out. */
  private apply({ id, entry }: QueueUpdate): void {
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
  private render(): void {
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
      if (card === undefined) {
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
    const now = Date.now();
    for (const card of this.cards.values()) card.tick(now); // "blocked behind" follows the head
  }
}

export function sessionView(ctx: Ctx, ws: string, ses: string): View {
  return new SessionView(ctx, ws, ses);
}
