/**
 * A session's recent history, under its queue: the prompts delivered lately, newest first,
 * each with when it was sent and how long the agent's turn on it took (or that it still runs,
 * or that it started none), from `client.history()` (the session's event log).
 *
 * @module
 */
import type { DeliveredPrompt } from "../client.js";
import { h, replace } from "../dom.js";
import { age, duration, nsToSeconds } from "../format.js";

/** How a delivered prompt's turn went, for a person. */
function turnText(d: DeliveredPrompt): string {
  if (d.turn === null || d.turn === undefined) return "no turn";
  const took = nsToSeconds(d.turnFor);
  if (d.turnEnded === null || d.turnEnded === undefined) return `turn ${d.turn} running`;
  const why = d.turnEnded === "ended" ? "" : ` (${d.turnEnded})`;
  return took === null ? `turn ${d.turn} ended${why}` : `turn ${d.turn} took ${duration(took)}${why}`;
}

/** Fill `list` with the delivered prompts, newest first. */
export function showHistory(list: HTMLElement, delivered: readonly DeliveredPrompt[], now: number): void {
  if (delivered.length === 0) {
    replace(list, h("li", { class: "empty muted" }, "Nothing delivered lately."));
    return;
  }
  replace(
    list,
    ...delivered.map((d) =>
      h(
        "li",
        { class: "row", "data-entry": d.id, "data-turn-seconds": nsToSeconds(d.turnFor) ?? "" },
        h("code", { class: "name" }, d.id),
        h(
          "span",
          { class: "facts" },
          h("span", { class: "fact", title: d.sentAt }, `sent ${age(d.sentAt, now)} ago`),
          h("span", { class: "fact turn" }, turnText(d)),
        ),
      ),
    ),
  );
}
