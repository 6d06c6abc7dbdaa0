// Nodes: health (GPUs, cordons, drains), the job each serves, its GPUs held of those offered
// (each unit's model and holder in its title), its labels; read every 2 s.
import { get, q } from "./api.js";
import { el, poll, replace, seconds, table } from "./dom.js";

export function nodesPage(main) {
  const said = el("p", { class: "quiet" });
  const body = el("div", { id: "nodes" });
  replace(main, el("h1", {}, "Nodes"), said, body);
  return poll(async () => {
    const doc = await get("/v1/nodes");
    const rows = doc.nodes.map((n) =>
      el(
        "tr",
        { dataset: { node: n.name, health: n.health } },
        el("td", {}, n.name),
        el("td", { class: n.health === "ok" ? "" : "bad" }, n.health),
        el("td", {}, ...jobLinks(n)),
        gpuCell(n.gpus || []),
        el("td", {}, n.cordon === null ? "" : `${n.drained ? "drained" : "cordoned"}: ${n.cordon || "(no reason)"}`),
        el("td", {}, Object.entries(n.labels || {}).map(([k, v]) => el("span", { class: "label" }, `${k}=${v}`))),
        el("td", { class: "num" }, seconds(n.heartbeat_age_s)),
        el("td", {}, n.version ?? "–"),
      ),
    );
    replace(body, table(["node", "health", "job", "GPUs held", "cordon", "labels", "heartbeat", "agent"], rows, { class: "rows" }));
    said.textContent = `${doc.nodes.length} node(s)`;
  }, said);
}

function gpuCell(units) {
  if (!units.length) return el("td", { class: "num" }, "–");
  const held = units.filter((u) => u.job).length;
  const title = units.map((u) => `${u.uuid} ${u.model || ""}: ${u.job || "free"}`).join("\n");
  return el("td", { class: "num", title, dataset: { gpus: String(units.length), held: String(held) } }, `${held}/${units.length}`);
}

function jobLinks(n) {
  const jobs = n.job ? [n.job] : Object.keys(n.shares || {}).sort();
  if (!jobs.length) return ["–"];
  return jobs.flatMap((job, i) => [i ? ", " : "", el("a", { href: `#/jobs/${q(job)}` }, job)]);
}
