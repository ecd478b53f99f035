/**
 * Durations and times, for people.
 *
 * @module
 */

/** Nanoseconds (the API's durations) to seconds. */
export function nsToSeconds(ns: number | null | undefined): number | null {
  return ns === null || ns === undefined ? null : ns / 1e9;
}

/** A duration in seconds as "4 s", "2 min 5 s", "3 h 10 min", "2 d 4 h". */
export function duration(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return s % 60 ? `${m} min ${s % 60} s` : `${m} min`;
  const hours = Math.floor(m / 60);
  if (hours < 24) return m % 60 ? `${hours} h ${m % 60} min` : `${hours} h`;
  const d = Math.floor(hours / 24);
  return hours % 24 ? `${d} d ${hours % 24} h` : `${d} d`;
}

/** How long ago an RFC 3339 time was ("12 s"), from `now` (ms). */
export function age(iso: string, now: number): string {
  const t = Date.parse(iso);
  return Number.isNaN(t) ? "?" : duration((now - t) / 1000);
}

/** When an RFC 3339 time comes: "in 12 s", or "now" once it passed. */
export function until(iso: string, now: number): string {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return "?";
  return t <= now ? "now" : `in ${duration((t - now) / 1000)}`;
}
