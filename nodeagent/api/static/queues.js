// Queues: quotas (nodes, GPUs), guarantee, the nodes and GPUs each holds, and its pending jobs in
// order, with why they wait.
import { get, q } from "./api.js";
import { el, poll, replace, seconds, table } from "./dom.js";

export function queuesPage(main) {
  const said = el("p", { class: "quiet" });
  const body = el("div", { id: "queues" });
  replace(main, el("h1", {}, "Queues"), said, body);
  return poll(async () => {
    const [queues, pending] = await Promise.all([get("/v1/queues"), get("/v1/jobs?state=pending")]);
    const rows = queues.queues.map((x) =>
      el(
        "tr",
        { dataset: { queue: x.queue } },
        el("td", {}, x.queue),
        el("td", { class: "num" }, x.quota ?? "no limit"),
        el("td", { class: "num" }, x.gpu_quota ?? "no limit"),
        el("td", { class: "num" }, x.guaranteed),
        el("td", { class: "num" }, x.gpu_guaranteed ?? 0),
        el("td", { class: "num" }, x.nodes),
        el("td", { class: "num", dataset: { gpus: String(x.gpus) } }, x.gpus),
        el("td", { class: "num" }, x.running),
        el("td", { class: "num" }, x.pending),
      ),
    );
    const waiting = pending.jobs.map((j) =>
      el(
        "tr",
        { dataset: { job: j.job } },
        el("td", { class: "num" }, j.position ?? "–"),
        el("td", {}, el("a", { href: `#/jobs/${q(j.job)}` }, j.job)),
        el("td", {}, j.queue ?? "–"),
        el("td", {}, j.user ?? "–"),
        el("td", { class: "num" }, j.priority ?? "–"),
        el("td", { class: "num" }, seconds(j.age_s)),
        el("td", {}, j.reason ?? ""),
      ),
    );
    replace(
      body,
      table(["queue", "quota (nodes)", "quota (GPUs)", "guaranteed (nodes)", "guaranteed (GPUs)", "nodes held", "GPUs held", "running", "pending"], rows, { class: "rows" }),
      el("h2", {}, "Pending, in the order they start"),
      waiting.length
        ? table(["#", "job", "queue", "user", "priority", "waiting", "why"], waiting, { class: "rows", id: "pending" })
        : el("p", { class: "quiet" }, "Nothing waits."),
    );
    said.textContent = `${queues.queues.length} queue(s), ${pending.jobs.length} pending`;
  }, said);
}
