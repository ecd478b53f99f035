/**
 * Building the page's DOM. The XSS rule of this page: text that came from the API (prompt
 * texts, errors, IDs, user names) only ever reaches the DOM as a `Text` node or through
 * `textContent`; nothing here (or anywhere in `src/`) sets `innerHTML`, `outerHTML`,
 * `insertAdjacentHTML`, `document.write`, or an `on*` attribute from a string. `h()` turns
 * every string child into a text node, and sets attributes with `setAttribute` (never an
 * event-handler attribute: those are refused).
 *
 * @module
 */

/** A child of `h()`: a node, a string (a text node), or nothing. */
export type Child = Node | string | number | null | undefined | false;

/** Attributes of `h()`: strings set with `setAttribute`, booleans toggle, `null` leaves out. */
export type Attrs = Record<string, string | number | boolean | null | undefined>;

/** An element with attributes and children; string children become text nodes. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (/^on/i.test(name)) throw new Error(`h(): event-handler attribute ${name} refused`);
    if (value === null || value === undefined || value === false) continue;
    el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, ...children);
  return el;
}

/** Append children (strings as text nodes). */
export function append(parent: Node, ...children: Child[]): void {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    parent.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replace every child of `parent`. */
export function replace(parent: Node, ...children: Child[]): void {
  while (parent.firstChild) parent.removeChild(parent.firstChild);
  append(parent, ...children);
}

/** Set an element's text (through `textContent`) only when it changed (keeps selections). */
export function setText(el: Element, text: string): void {
  if (el.textContent !== text) el.textContent = text;
}

/** A button that runs `action` on click; disabled while the promise it returns runs. */
export function button(
  label: string,
  action: () => unknown,
  attrs: Attrs = {},
): HTMLButtonElement {
  const el = h("button", { type: "button", ...attrs }, label);
  el.addEventListener("click", () => {
    el.disabled = true;
    void Promise.resolve()
      .then(action)
      .finally(() => {
        el.disabled = false;
      });
  });
  return el;
}

/** The element with this ID (the page's fixed skeleton, index.html). */
export function byId<T extends HTMLElement = HTMLElement>(id: string): T {
  const el = document.getElementById(id);
  if (el === null) throw new Error(`#${id} missing from index.html`);
  return el as T;
}
