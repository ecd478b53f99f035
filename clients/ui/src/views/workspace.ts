/**
 * `#/ws/<id>`: a workspace's sessions, busiest first, with their counts, how long the entry
 * in flight has been with the agent and how long pending entries have waited behind it, or,
 * for a session in turn, how long the agent has been working (a session in turn with no
 * entry left is not listed: the overview lists sessions that hold entries);
 * bulk retry / dismiss of the workspace's error entries; for an admin token, park (with a
 * reason), unpark and sweep. Over them, the last hour as small charts (`charts.ts`):
 * prompts accepted, delivered and failed per minute and the oldest pending entry's age.
 *
 * @module
 */
import { showSeries } from "../charts.js";
import type { SessionSummary } from "../client.js";
import { every, REFRESH_MS, type Ctx, type View } from "../context.js";
import { button, h, replace } from "../dom.js";
import { sessionHash } from "../routes.js";
import { act, ask, countPills, errorsToolbar, Pager, showError, waited } from "../widgets.js";

/** How often the charts ask again: the series moves by the minute. */
const SERIES_MS = 10_000;

function row(ws: string, s: SessionSummary): HTMLElement {
  const inTurn = s.inTurnFor !== null && s.inTurnFor !== undefined;
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
      waited("oldest pending", s.oldestPendingFor),
    ),
    countPills(s.counts),
  );
}

export function workspaceView(ctx: Ctx, ws: string): View {
  const list = h("ul", { class: "rows", id: "sessions" });
  const body = h("div", {}, list);
  const pager = new Pager(() => void refresh());
  const { client } = ctx;
  /** Ask again now (after an action, or a page move); a failure shows in the body. */
  const refresh = (): Promise<void> => load().catch((err: unknown) => showError(body, err));

  const bulk = errorsToolbar(client, ws, undefined, refresh);

  // Not in the DOM at all without an admin token (the server refuses them anyway).
  const admin = !ctx.me.admin
    ? null
    : h(
    "div",
    { class: "toolbar admin", id: "ws-admin" },
    h("span", { class: "label" }, "Admin:"),
    button("Park…", async () => {
      const reason = await ask({
        message: `Park workspace ${ws}? Its pending and verifying entries stop until unparked.`,
        ok: "Park",
        danger: true,
        input: "Reason",
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
        danger: true,
      });
      if (ok === null) return;
      await act(async () => {
        const swept = await client.sweep(ws);
        return `swept: ${swept.unverifiable} unverifiable re-armed, ${swept.parkedErrors} settled by the ledger`;
      });
      await refresh();
    }),
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
    pager.el,
  );

  async function load(signal?: AbortSignal): Promise<void> {
    const page = await client.sessions(ws, { cursor: pager.cursor, limit: 50, signal });
    pager.update(page.next);
    if (page.sessions.length === 0) {
      replace(list, h("li", { class: "empty muted" }, "No session holds entries."));
    } else {
      replace(list, ...page.sessions.map((s) => row(ws, s)));
    }
    if (body.firstChild !== list) replace(body, list);
  }

  async function loadSeries(signal: AbortSignal): Promise<void> {
    showSeries(charts, (await client.series(ws, { signal })).minutes);
  }

  const stops = [
    every(ctx, REFRESH_MS, load, (err) => showError(body, err)),
    every(ctx, SERIES_MS, loadSeries, (err) => showError(charts, err)),
  ];
  return { el, stop: () => stops.forEach((stop) => stop()) };
}
