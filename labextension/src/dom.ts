// Building DOM from values: every server string goes in as text, never as HTML.
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props: Record<string, string | boolean | ((event: Event) => void) | undefined> = {},
  children: (Node | string)[] = []
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === false) {
      continue;
    }
    if (key === 'text') {
      node.textContent = String(value);
    } else if (key === 'class') {
      node.className = String(value);
    } else if (typeof value === 'function') {
      node.addEventListener(key.replace(/^on/, ''), value);
    } else {
      node.setAttribute(key, value === true ? '' : value);
    }
  }
  node.append(...children);
  return node;
}
