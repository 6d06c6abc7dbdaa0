// Jobs: every job of the pool, filtered by user, state and queue, read again each second.
import { get, q } from "./api.js";
import { badge, el, poll, replace, seconds, table } from "./dom.js";

const STATES = ["", "pending", "running", "succeeded", "failed", "cancelled", "timeout"];
const EVERY_MS = 1000;

export function jobsPage(main) {
  const filters = { user: "", state: "", queue: "" };
  const said = el("p", { class: "quiet", id: "jobs-said" });
  const body = el("div", { id: "jobs" });
  const input = (key, placeholder) =>
    el("input", {
      name: key,
      placeholder,
      oninput: (e) => {
        filters[key] = e.target.value.trim();
        stop.now();
      },
    });
  const state = el(
    "select",
    {
      name: "state",
      onchange: (e) => {
        filters.state = e.target.value;
        stop.now();
      },
    },
    STATES.map((s) => el("option", { value: s }, s || "every state")),
  );
  replace(
    main,
    el("h1", {}, "Jobs"),
    el("form", { class: "filters", onsubmit: (e) => e.preventDefault() },
      input("user", "user"), state, input("queue", "queue")),
    said,
    body,
  );

  const stop = poll(async () => {
    const query = Object.entries(filters)
      .filter(([, v]) => v)
      .map(([k, v]) => `${k}=${q(v)}`)
      .join("&");
    const doc = await get(`/v1/jobs${query ? `?${query}` : ""}`);
    replace(body, render(doc.jobs));
    said.textContent = `${doc.jobs.length} job(s), read ${new Date().toLocaleTimeString()}`;
    said.className = "quiet";
  }, said, EVERY_MS);
  return stop;
}

function render(jobs) {
  if (!jobs.length) return el("p", { class: "quiet" }, "No jobs.");
  const rows = jobs.map((job) =>
    el(
      "tr",
      { dataset: { job: job.job, state: job.state } },
      el(
        "td",
        {},
        el("a", { href: `#/jobs/${q(job.job)}` }, job.job),
        job.kind === "allocation" ? el("span", { class: "quiet" }, " allocation") : "",
      ),
      el("td", {}, badge(job.state), job.position ? ` #${job.position}` : ""),
      el("td", {}, job.user ?? "–"),
      el("td", {}, job.queue ?? "–"),
      el("td", { class: "num" }, `${job.world_size || 0}`),
      el("td", { class: "num" }, `${job.nodes}/${job.target_nodes ?? "–"}`),
      el("td", { class: "num" }, seconds(job.age_s)),
      el("td", {}, job.reason ?? ""),
    ),
  );
  const headings = ["job", "state", "user", "queue", "world", "nodes/target", "age", "reason"];
  return table(headings, rows, { class: "rows" });
}
