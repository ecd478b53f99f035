/**
 * The URL hash: `#/` (workspaces), `#/ws/<id>` (a workspace's sessions) and
 * `#/ws/<id>/s/<id>` (a session's queue), so a reload keeps the view.
 *
 * @module
 */

export type Route =
  | { view: "workspaces" }
  | { view: "workspace"; ws: string }
  | { view: "session"; ws: string; ses: string };

/** The route a hash names; anything else is the workspace list. */
export function parseRoute(hash: string): Route {
  let parts: string[];
  try {
    parts = hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  } catch {
    return { view: "workspaces" }; // a malformed %-escape
  }
  if (parts[0] === "ws" && parts[1] !== undefined) {
    if (parts[2] === "s" && parts[3] !== undefined) {
      return { view: "session", ws: parts[1], ses: parts[3] };
    }
    return { view: "workspace", ws: parts[1] };
  }
  return { view: "workspaces" };
}

export function wsHash(ws: string): string {
  return `#/ws/${encodeURIComponent(ws)}`;
}

export function sessionHash(ws: string, ses: string): string {
  return `${wsHash(ws)}/s/${encodeURIComponent(ses)}`;
}
