/**
 * The workspace's last hour as small charts: prompts accepted, delivered and failed per
 * minute (bars) and the oldest pending entry's age (a line), from `client.series()`.
 *
 * Plain SVG, no chart library: four charts of 60 points each need bars, a polyline and a
 * caption, about what a library's setup would take. The page stays one small bundle with no
 * dependency of its own, the charts are DOM a test can read (each bar and point carries its
 * value), and they follow the page's one stylesheet.
 *
 * @module
 */
import type { SeriesMinute } from "./client.js";
import { h, replace } from "./dom.js";
import { duration, nsToSeconds } from "./format.js";

const SVG = "http://www.w3.org/2000/svg";
const W = 240;
const H = 48;

/** The chart's floor, so an empty minute still reads as a minute. */
function floor(): SVGLineElement {
  return svg("line", { x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5, class: "floor" });
}

function svg<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number>,
): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  return el;
}

/** The minute an RFC 3339 time names, as "12:03" in the viewer's zone. */
function clock(iso: string): string {
  const t = new Date(iso);
  return `${String(t.getHours()).padStart(2, "0")}:${String(t.getMinutes()).padStart(2, "0")}`;
}

/** A bar chart of counts per minute, with its total and peak in the caption. */
function bars(name: string, label: string, minutes: readonly SeriesMinute[], pick: (m: SeriesMinute) => number): HTMLElement {
  const values = minutes.map(pick);
  const total = values.reduce((a, b) => a + b, 0);
  const peak = Math.max(0, ...values);
  const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot", role: "img", "aria-label": `${label} per minute` });
  const step = W / Math.max(1, values.length);
  plot.append(floor());
  values.forEach((v, i) => {
    const height = v > 0 ? Math.max(1, (v / peak) * (H - 2)) : 0;
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
    h("figcaption", {}, h("b", {}, label), ` ${total} in the hour, peak ${peak}/min`),
  );
}

/** A line of the oldest pending entry's age at each minute's end (gaps where not known). */
function ages(minutes: readonly SeriesMinute[]): HTMLElement {
  const seconds = minutes.map((m) => nsToSeconds(m.oldestPendingFor));
  const known = seconds.filter((s): s is number => s !== null);
  const top = Math.max(1, ...known);
  const step = W / Math.max(1, seconds.length - 1);
  const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot", role: "img", "aria-label": "oldest pending age" });
  const points: string[] = [];
  seconds.forEach((s, i) => {
    if (s === null) return;
    const x = i * step;
    const y = H - 1 - (s / top) * (H - 2);
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
      known.length > 0 ? `, at most ${duration(Math.max(...known))}` : "",
    ),
  );
}

/** Fill `el` with the four charts of `minutes` (oldest first). */
export function showSeries(el: HTMLElement, minutes: readonly SeriesMinute[]): void {
  replace(
    el,
    bars("accepted", "Accepted", minutes, (m) => m.accepted),
    bars("delivered", "Delivered", minutes, (m) => m.delivered),
    bars("failed", "Failed", minutes, (m) => m.failed),
    ages(minutes),
  );
}
