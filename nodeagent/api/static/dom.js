// Small DOM helpers: every text the pool gives goes in as text, never as markup.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

export function table(headings, rows, attrs = {}) {
  return el(
    "table",
    attrs,
    el("thead", {}, el("tr", {}, headings.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows),
  );
}

export function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value < 1) return `${(value * 1000).toFixed(0)} ms`;
  if (value < 120) return `${value.toFixed(value < 10 ? 2 : 1)} s`;
  if (value < 7200) return `${(value / 60).toFixed(1)} min`;
  return `${(value / 3600).toFixed(1)} h`;
}

export function since(rfc3339) {
  if (!rfc3339) return "–";
  return seconds(Math.max(0, (Date.now() - Date.parse(rfc3339)) / 1000));
}

export function badge(state) {
  return el("span", { class: `state state-${state}` }, state);
}

export function replace(target, ...children) {
  target.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined));
}

// Read again every `everyMs` until stopped: returns stop(), with stop.now() to read at once.
export function poll(read, said, everyMs = 2000) {
  let timer = null;
  let stopped = false;
  async function again() {
    clearTimeout(timer);
    try {
      await read();
    } catch (error) {
      said.textContent = `Not read: ${error.message}`;
      said.className = "error";
    }
    if (!stopped) timer = setTimeout(again, everyMs);
  }
  again();
  const stop = () => {
    stopped = true;
    clearTimeout(timer);
  };
  stop.now = again;
  return stop;
}
