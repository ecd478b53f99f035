/**
 * `#/ws/<id>/s/<id>`: a session's queue, live. The event stream (`client.watch`) gives the
 * whole queue (`queue.reset`), then each change (`queue.update`), applied in place with no
 * reload; after a break the client reconnects with `Last-Event-ID` and gets exactly what it
 * missed. Each entry: its status pill, attempts and verify attempts, last error, age and
 * next attempt, its text (expandable; always set as text, never as HTML), and its actions.
 *
 * A session in turn (the agent works on a delivered prompt; the session is held until the
 * turn ends) is a state of its own: a line over the queue, "agent working: 2 min 10 s", from
 * the `turn` update until the `turn_ended` one, which leaves "last turn ... ended after ..."
 * until the next turn begins. After a (re)load the reset carries no turn, only the pending
 * entries' `inTurnFor`: the line comes back from those (its ID is not known until the turn
 * ends). A reset with no pending entry cannot tell, so the page asks the turn route once
 * (`client.turn`: the turn with its ID and age, or none).
 *
 * Under the queue, the session's recent history (`history.ts`): its delivered prompts with
 * when and how long their turn took, asked again after each `sent` or `turn_ended` update.
 *
 * @module
 */
import { OutboxError, type Entry, type QueueUpdate, type TurnNews, type WatchHandle } from "../client.js";
import type { Ctx, View } from "../context.js";
import { button, h, replace, setText } from "../dom.js";
import { age, duration, nsToSeconds, until } from "../format.js";
import { act, ask, errorsToolbar, explain, pill } from "../widgets.js";
import { showHistory } from "./history.js";

const PREVIEW = 120;
/** How long the page waits for the turn route's answer after a reset (then it stays unknown). */
const TURN_ASK_MS = 10_000;

/** Why a turn ended, for a person (`turn_ended`'s `why`; an unknown word shows as it came). */
const TURN_ENDS = new Map([
  ["ended", "the agent said it ended"],
  ["ceiling", "still running at the turn ceiling: aborted and let go"],
  ["unreachable", "the agent never said, until the ceiling and its grace: let go"],
]);

/**
 * The session's turn as the page knows it: its ID (null when learned from a reset), since
 * when (ms, this page's clock), and why it is still held when the agent could not say
 * whether it ended (a reset's `turnWhy`; "" otherwise).
 */
interface TurnShown {
  readonly id: string | null;
  readonly since: number;
  readonly why: string;
}

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
    const turn = this.session.turn();
    if (e.status === "delivering" && e.lastAttemptAt) {
      facts.push(`delivering for ${age(e.lastAttemptAt, now)}`);
    } else if (e.status === "pending" && turn !== null) {
      // Not "sending": the agent has the prompt before this one and works on it.
      facts.push(`waiting for the agent's turn to end (working for ${duration((now - turn.since) / 1000)})`);
    } else if (e.status === "pending" && this.session.inFlightSince() !== null) {
      const since = this.session.inFlightSince() ?? now;
      facts.push(`blocked behind an in-flight delivery for ${duration((now - since) / 1000)}`);
    } else if ((e.status === "pending" || e.status === "verifying") && e.nextAttemptAt) {
      facts.push(`next attempt ${until(e.nextAttemptAt, now)}`);
    }
    setText(this.facts, facts.join(" · "));
    this.el.dataset["waiting"] = e.status === "pending" && turn !== null ? "turn" : "";
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
  /** The turn line: "agent working ..." while in turn, then how the last turn ended. */
  private readonly turnLine = h("p", { class: "turn-line", id: "turn", role: "status", hidden: true });
  /** The delivered prompts, newest first (`history.ts`). */
  private readonly history = h("ul", { class: "rows", id: "history" });
  private historyAsk: AbortController | null = null;
  private current: TurnShown | null = null;
  private lastTurn: TurnNews | null = null;
  private entries: Entry[] = [];
  private readonly cards = new Map<string, Card>();
  private readonly watch: WatchHandle;
  private readonly clock: ReturnType<typeof setInterval>;
  private resets = 0;
  /** The turn route asked after a reset; a newer reset, a turn update or `stop` supersedes it. */
  private asking: AbortController | null = null;

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
      this.turnLine,
      this.list,
      h("h2", {}, "Recently delivered"),
      this.history,
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
        if (told !== undefined) this.current = told;
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
          ctx.authLost();
          return;
        }
        this.setLive("stopped", "stopped");
        this.problem.hidden = false;
        setText(this.problem, explain(err));
      },
    });
    this.clock = setInterval(() => this.tick(Date.now()), 1000);
  }

  stop(): void {
    this.watch.close();
    clearInterval(this.clock);
    this.supersedeAsk();
    this.historyAsk?.abort();
  }

  /** Ask for the history again (a newer ask supersedes one in flight); a failure shows there. */
  private loadHistory(): void {
    this.historyAsk?.abort();
    const asking = new AbortController();
    this.historyAsk = asking;
    this.ctx.client
      .history(this.ws, this.ses, { signal: asking.signal })
      .then(({ delivered }) => {
        if (!asking.signal.aborted) showHistory(this.history, delivered, Date.now());
      })
      .catch((err: unknown) => {
        if (!asking.signal.aborted) replace(this.history, h("li", { class: "error-box" }, explain(err)));
      });
  }

  /** The session's turn, while the agent works on a delivered prompt; null otherwise. */
  turn(): TurnShown | null {
    return this.current;
  }

  /** Since when the session's entry in flight has been with the agent (ms), or null. */
  inFlightSince(): number | null {
    const staged = this.entries.find((e) => e.status === "delivering");
    if (staged === undefined) return null;
    return staged.lastAttemptAt ? Date.parse(staged.lastAttemptAt) : Date.now();
  }

  /**
   * After a reset with no pending entry: is the session in turn? One request (GET
   * `.../turn`), cut after TURN_ASK_MS; its answer is dropped once superseded (the stream's
   * news is newer). A failure leaves what the page knew: the stream still brings the end.
   */
  private askTurn(): void {
    const ask = new AbortController();
    this.asking = ask;
    const timer = setTimeout(() => ask.abort(), TURN_ASK_MS);
    void this.ctx.client
      .turn(this.ws, this.ses, { signal: ask.signal })
      .then((found) => {
        if (this.asking !== ask) return;
        const now = Date.now();
        const lasted = found !== null && Number.isFinite(found.seconds) ? Math.max(0, found.seconds) : 0;
        this.current = found === null ? null : { id: found.turn, since: now - lasted * 1000, why: found.why };
        this.tick(now);
      })
      .catch(() => undefined) // not known: the line stays as it was
      .finally(() => {
        clearTimeout(timer);
        if (this.asking === ask) this.asking = null;
      });
  }

  private supersedeAsk(): void {
    this.asking?.abort();
    this.asking = null;
  }

  private setLive(state: string, label: string): void {
    this.live.dataset["state"] = state;
    setText(this.live, label);
  }

  /**
   * One `queue.update`: the entry's new state in place, a new one at the end, gone ones out;
   * a turn's begin or end changes the session's state, no entry (theirs is gone already).
   */
  private apply({ kind, id, entry, turn }: QueueUpdate): void {
    if (kind === "turn" || kind === "turn_ended") {
      // Since this page heard of it: the event carries no start, and a clock of another
      // machine would be worse than the few seconds a reconnect can add.
      if (turn === undefined) return;
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
    this.tick(Date.now()); // "blocked behind" follows the head, "waiting for" the turn
  }

  /** The facts that move with the clock: the turn line's and every card's. */
  private tick(now: number): void {
    const turn = this.current;
    const last = this.lastTurn;
    let state = "";
    let text = "";
    if (turn !== null) {
      state = "turn";
      const which = turn.id === null ? "its ID comes with its end" : `turn ${turn.id}`;
      text = `agent working: ${duration((now - turn.since) / 1000)} (${which}); the next entry waits for the turn to end`;
      if (turn.why !== "") text += `. Still held: ${turn.why}`;
    } else if (last !== null) {
      state = "ended";
      const why = TURN_ENDS.get(last.why) ?? last.why; // a Map: "constructor" is no key
      text = `last turn ${last.id} ended after ${duration(last.seconds)} (${why})`;
    }
    this.turnLine.hidden = state === "";
    this.turnLine.dataset["state"] = state;
    setText(this.turnLine, text);
    for (const card of this.cards.values()) card.tick(now);
  }
}

/**
 * The turn a reset shows: while the session is in turn, its pending entries carry `inTurnFor`
 * (nanoseconds, and `turnWhy` when the agent could not say whether it ended); pending entries
 * without it say it is not. Undefined when no entry is pending: the reset cannot tell (then
 * what the page knew stands).
 */
function turnFromEntries(entries: readonly Entry[], now: number): TurnShown | null | undefined {
  const pending = entries.filter((e) => e.status === "pending");
  if (pending.length === 0) return undefined;
  let longest: number | null = null;
  let why = "";
  for (const e of pending) {
    const s = nsToSeconds(e.inTurnFor);
    if (s !== null && s >= 0 && (longest === null || s > longest)) longest = s;
    why ||= e.turnWhy ?? "";
  }
  return longest === null ? null : { id: null, since: now - longest * 1000, why };
}

export function sessionView(ctx: Ctx, ws: string, ses: string): View {
  return new SessionView(ctx, ws, ses);
}
