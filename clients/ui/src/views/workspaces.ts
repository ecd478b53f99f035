/**
 * `#/`: the workspaces holding work (every one for an admin token, the token's own
 * otherwise), paged, with their entries by status and the oldest pending entry's wait.
 *
 * @module
 */
import type { WorkspaceSummary } from "../client.js";
import { every, REFRESH_MS, type Ctx, type View } from "../context.js";
import { h, replace } from "../dom.js";
import { wsHash } from "../routes.js";
import { countPills, Pager, showError, waited } from "../widgets.js";

function row(ws: WorkspaceSummary): HTMLElement {
  return h(
    "li",
    { class: "row", "data-ws": ws.id },
    h("a", { class: "name", href: wsHash(ws.id) }, ws.id),
    h(
      "span",
      { class: "facts" },
      h("span", { class: "fact" }, `${ws.sessions} session${ws.sessions === 1 ? "" : "s"}`),
      h("span", { class: "fact" }, `${ws.entries} entr${ws.entries === 1 ? "y" : "ies"}`),
      waited("oldest pending", ws.oldestPendingFor),
    ),
    countPills(ws.counts),
  );
}

export function workspacesView(ctx: Ctx): View {
  const list = h("ul", { class: "rows", id: "workspaces" });
  const body = h("div", {}, list);
  const pager = new Pager(() => void load().catch((err: unknown) => showError(body, err)));
  const el = h(
    "section",
    { class: "view" },
    h("h1", {}, "Workspaces"),
    h(
      "p",
      { class: "muted" },
      ctx.me.admin ? "Every workspace holding work." : "The workspaces of this token that hold work.",
    ),
    body,
    pager.el,
  );

  async function load(signal?: AbortSignal): Promise<void> {
    const page = await ctx.client.workspaces({ cursor: pager.cursor, limit: 50, signal });
    pager.update(page.next);
    if (page.workspaces.length === 0) {
      replace(list, h("li", { class: "empty muted" }, "No workspace holds work."));
    } else {
      replace(list, ...page.workspaces.map(row));
    }
    if (body.firstChild !== list) replace(body, list);
  }

  const stop = every(ctx, REFRESH_MS, load, (err) => showError(body, err));
  return { el, stop };
}
