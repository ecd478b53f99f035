/**
 * The queue page: the token, who it is (`GET /v1/me`), the header, and the hash router
 * that starts one view at a time (and stops the previous one: its timers, its stream).
 *
 * The token is typed once and kept in `sessionStorage` (this tab only; never localStorage,
 * never the URL). With `serve --no-auth` the page works without one: it asks `/v1/me` with
 * no token first.
 *
 * @module
 */
import { OutboxClient, OutboxError, type Me } from "./client.js";
import type { Ctx, View } from "./context.js";
import { button, byId, h, replace } from "./dom.js";
import { parseRoute, sessionHash, wsHash } from "./routes.js";
import { sessionView } from "./views/session.js";
import { workspaceView } from "./views/workspace.js";
import { workspacesView } from "./views/workspaces.js";
import { explain } from "./widgets.js";

const TOKEN_KEY = "prompt-outbox-ui:token";
/** The API's base: the page is `<base>/ui/`, so `..` (keeps a proxy's path prefix). */
const BASE_URL = new URL("..", location.href).href;

let current: View | undefined;
let ctx: Ctx | undefined;

function storedToken(): string | undefined {
  return sessionStorage.getItem(TOKEN_KEY) ?? undefined;
}

function makeClient(token: string | undefined): OutboxClient {
  return new OutboxClient({ baseUrl: BASE_URL, token, backoff: { initialMs: 250, maxMs: 5_000 } });
}

function stopView(): void {
  current?.stop();
  current = undefined;
}

function signIn(message?: string): void {
  stopView();
  ctx = undefined;
  replace(byId("crumbs"));
  replace(byId("who"));
  const input = h("input", {
    type: "password",
    id: "token",
    name: "token",
    autocomplete: "off",
    required: true,
    placeholder: "bearer token",
  });
  const form = h(
    "form",
    { class: "card token-form", id: "sign-in" },
    h("h1", {}, "Sign in"),
    message ? h("p", { class: "error-box" }, message) : null,
    h("p", { class: "muted" }, "Paste an API token. It is kept for this tab only, and forgotten when the tab closes."),
    h("label", {}, h("span", {}, "Token"), input),
    h("button", { type: "submit", class: "primary" }, "Sign in"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    void boot();
  });
  replace(byId("view"), form);
  input.focus();
}

function signOut(): void {
  sessionStorage.removeItem(TOKEN_KEY);
  signIn();
}

function header(me: Me, withToken: boolean): void {
  replace(
    byId("who"),
    h("span", { class: "user", id: "user" }, me.user),
    me.admin ? h("span", { class: "badge", id: "admin-badge" }, "admin") : null,
    withToken ? button("Sign out", signOut, { class: "sign-out" }) : null,
  );
}

function crumbs(parts: [string, string][]): void {
  const nav = byId("crumbs");
  replace(nav);
  parts.forEach(([label, href], i) => {
    if (i > 0) nav.append(h("span", { class: "sep", "aria-hidden": "true" }, "›"));
    nav.append(i === parts.length - 1 ? h("span", { class: "here" }, label) : h("a", { href }, label));
  });
}

function route(): void {
  if (ctx === undefined) return;
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

/** Ask who the token is (none first, for --no-auth), then show the route. */
async function boot(): Promise<void> {
  const token = storedToken();
  const client = makeClient(token);
  let me: Me;
  try {
    me = await client.me();
  } catch (err) {
    if (err instanceof OutboxError && err.status === 401) {
      if (token !== undefined) sessionStorage.removeItem(TOKEN_KEY);
      signIn(token === undefined ? undefined : "That token was refused.");
      return;
    }
    replace(
      byId("view"),
      h("p", { class: "error-box" }, explain(err)),
      button("Try again", boot),
    );
    return;
  }
  ctx = { client, me, authLost: () => signIn("The token was refused: sign in again.") };
  header(me, token !== undefined);
  route();
}

window.addEventListener("hashchange", route);
void boot().finally(() => {
  document.documentElement.dataset["booted"] = "1";
});
