// A job: its state and spec, the timeline of its generations with each fault's recovery split,
// where its time went (goodput), its step time, its ranks and nodes, its events, a rank's log
// followed live, every rank's stacks taken on demand, and the actions the CLI has for its owner
// or an operator.
import { follow, get, mayAct, post, q } from "./api.js";
import { badge, el, replace, seconds, table } from "./dom.js";
import { goodputChart, stepChart } from "./charts.js";

const EVERY_MS = 2000;
const ENDED = new Set(["succeeded", "failed", "cancelled", "timeout"]);
const PHASES = [
  ["detection_s", "detect"],
  ["stopping_s", "stop"],
  ["rendezvous_s", "rendezvous"],
  ["startup_restore_s", "start-up"],
];

export function jobPage(main, name) {
  const base = `/v1/jobs/${q(name)}`;
  const parts = {
    head: el("div", { id: "job-head" }),
    said: el("p", { class: "quiet", id: "job-said" }),
    facts: el("div", { id: "job-facts" }),
    timeline: el("div", { id: "timeline" }),
    goodput: el("div", { id: "goodput" }),
    steps: el("div", { id: "step-time" }),
    nodes: el("div", { id: "job-nodes" }),
    events: el("div", { id: "job-events" }),
    log: el("div", { id: "job-log" }),
    stacks: el("div", { id: "job-stacks" }),
  };
  replace(
    main,
    parts.head,
    parts.said,
    el("section", {}, el("h2", {}, "Spec"), parts.facts),
    el("section", {}, el("h2", {}, "Timeline"), parts.timeline),
    el("div", { class: "two" },
      el("section", {}, el("h2", {}, "Where the time went"), parts.goodput),
      el("section", {}, el("h2", {}, "Step time"), parts.steps)),
    el("section", {}, el("h2", {}, "Ranks and nodes"), parts.nodes),
    el("section", {}, el("h2", {}, "Events"), parts.events),
    el("section", {}, el("h2", {}, "Log"), parts.log),
    el("section", {}, el("h2", {}, "Stacks"), parts.stacks),
  );
  stacksPanel(parts.stacks, base);
  const charts = { goodput: goodputChart(parts.goodput), steps: stepChart(parts.steps) };
  const log = logPanel(parts.log, base);
  let timer = null;
  let stopped = false;
  let actionsFor = null;

  async function refresh() {
    clearTimeout(timer);
    try {
      const [doc, status, events] = await Promise.all([
        get(base),
        get(`${base}/status`).catch(() => null),
        get(`${base}/events?last=50`).catch(() => ({ events: [] })),
      ]);
      if (stopped) return;
      const key = `${doc.state} ${doc.held_by}`;
      if (actionsFor !== key) {
        replace(parts.head, heading(doc, base, refresh));
        actionsFor = key;
      } else {
        parts.head.querySelector(".state").replaceWith(badge(doc.state));
      }
      replace(parts.facts, facts(doc));
      replace(parts.timeline, timeline(doc));
      charts.goodput.show(doc.goodput);
      charts.steps.show(doc.goodput);
      replace(parts.nodes, ranks(status));
      replace(parts.events, eventList(events.events));
      log.world(status?.world_size || 0, ENDED.has(doc.state));
      parts.said.textContent = `read ${new Date().toLocaleTimeString()}`;
      parts.said.className = "quiet";
    } catch (error) {
      parts.said.textContent = `Not read: ${error.message}`;
      parts.said.className = "error";
    }
    if (!stopped) timer = setTimeout(refresh, EVERY_MS);
  }
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
    log.stop();
    charts.goodput.destroy();
    charts.steps.destroy();
  };
}

function heading(doc, base, refresh) {
  const said = el("p", { class: "quiet", id: "action-said" });
  const act = (verb, body) => async () => {
    said.textContent = `${verb}…`;
    try {
      const done = await post(`${base}/${verb}`, body?.());
      said.textContent = done.message;
      said.className = "quiet";
    } catch (error) {
      said.textContent = error.message;
      said.className = "error";
    }
    refresh();
  };
  const actions = [];
  if (mayAct(doc) && !ENDED.has(doc.state)) {
    const target = el("input", { name: "target", size: 4, placeholder: "N" });
    actions.push(
      el("button", { type: "button", id: "cancel", onclick: act("cancel") }, "Cancel"),
      doc.state === "running"
        ? el("button", { type: "button", id: "requeue", onclick: act("requeue") }, "Requeue")
        : doc.held_by
          ? el("button", { type: "button", id: "release", onclick: act("release") }, "Release")
          : el("button", { type: "button", id: "hold", onclick: act("hold") }, "Hold"),
      el("span", { class: "scale" }, target,
        el("button", { type: "button", id: "scale",
          onclick: act("scale", () => ({ target: target.value.trim() })) }, "Scale")),
    );
  }
  return el(
    "div",
    { class: "job-head" },
    el("h1", {}, doc.job, " ", badge(doc.state)),
    el("div", { class: "actions" }, actions),
    said,
  );
}

function facts(doc) {
  const rows = [
    ["user", doc.user],
    ["kind", doc.kind],
    ["submitted by", doc.submitted_by],
    ["queue", doc.queue],
    ["priority", doc.priority],
    ["reason", doc.reason],
    ["command", doc.command ? doc.command.join(" ") : null],
    ["working dir", doc.working_dir],
    ["nodes", doc.min_nodes === undefined ? null : `${doc.min_nodes}–${doc.max_nodes}`],
    ["time limit", doc.time_limit],
    ["submitted", doc.submitted],
    ["started", doc.started],
    ["ended", doc.ended],
    ["restarts", doc.restarts],
    ["held by", doc.held_by],
    ["dependency", doc.dependency],
    ["detail", doc.detail],
  ].filter(([, v]) => v !== null && v !== undefined && v !== "");
  return el("dl", { class: "facts" }, rows.map(([k, v]) => [el("dt", {}, k), el("dd", {}, `${v}`)]));
}

// Generations as spans of one bar from the first start to now (or the end), each fault a mark
// at the last step before it; below, each recovery split into its phases.
function timeline(doc) {
  const gens = doc.generations || [];
  const reforms = doc.goodput?.reforms || [];
  if (!gens.length) return el("p", { class: "quiet" }, "No generation yet.");
  const at = (g) => (g.started_ms ?? Date.parse(g.started)) / 1000;
  const begin = at(gens[0]);
  const end = doc.ended ? Date.parse(doc.ended) / 1000 : Date.now() / 1000;
  const span = Math.max(1e-3, end - begin);
  const pct = (t) => `${Math.min(100, Math.max(0, ((t - begin) / span) * 100)).toFixed(3)}%`;
  const bar = el("div", { class: "bar" });
  gens.forEach((g, i) => {
    const from = at(g);
    const to = i + 1 < gens.length ? at(gens[i + 1]) : end;
    const part = el("div", {
      class: `gen gen-${i % 2}`,
      title: `generation ${g.generation}: ${g.reason}, ${g.nodes.join(", ")}`,
      dataset: { generation: g.generation },
    }, `${g.generation}`);
    part.style.left = pct(from);
    part.style.width = `${Math.max(0.2, ((to - from) / span) * 100).toFixed(3)}%`;
    bar.append(part);
  });
  for (const r of reforms) {
    const mark = el("div", { class: "fault", title: `${r.reason} → generation ${r.generation}` });
    mark.style.left = pct(r.at_s);
    bar.append(mark);
  }
  // The last recovery, while its generation has not trained yet, is still under way: its
  // start-up and the steps it lost are measured once it does (not "0 s" and "–"). Only for a
  // job whose ranks say when they train (some generation did): one that never says would
  // show every recovery under way for ever.
  const trained = new Set((doc.goodput?.trained || []).map((t) => t.generation));
  const last = reforms.length ? reforms[reforms.length - 1] : null;
  const underWay = (r) =>
    r === last && !doc.ended && !doc.goodput?.ended && trained.size > 0 && !trained.has(r.generation);
  const rows = reforms.map((r) => {
    const total = PHASES.reduce((sum, [key]) => sum + (r[key] || 0), 0) || 1;
    const cell = (key, label) =>
      underWay(r) && key === "startup_restore_s"
        ? el("td", { class: "num quiet", dataset: { phase: label } }, "in progress")
        : el("td", { class: "num", dataset: { phase: label } }, seconds(r[key]));
    const split = el("div", { class: "split" }, PHASES.map(([key, label]) => {
      const piece = el("span", { class: `phase phase-${label}`, title: `${label} ${seconds(r[key])}` });
      piece.style.width = `${((r[key] || 0) / total) * 100}%`;
      return piece;
    }));
    return el(
      "tr",
      { dataset: { generation: r.generation, reason: r.reason } },
      el("td", { class: "num" }, `${r.generation}`),
      el("td", {}, r.reason || "–"),
      PHASES.map(([key, label]) => cell(key, label)),
      el("td", { class: "num", dataset: { lost: "" } }, underWay(r) ? "in progress" : r.steps_lost ?? "–"),
      el("td", { class: "wide" }, split),
    );
  });
  return el(
    "div",
    {},
    bar,
    el("div", { class: "axis" }, el("span", {}, gens[0].started), el("span", {}, doc.ended || "now")),
    rows.length
      ? table(["gen", "cause", ...PHASES.map(([, l]) => l), "steps lost", ""], rows, { class: "rows", id: "recoveries" })
      : el("p", { class: "quiet" }, "No fault so far."),
  );
}

function ranks(status) {
  if (!status) return el("p", { class: "quiet" }, "No status.");
  const rows = (status.nodes || []).map((n) =>
    el(
      "tr",
      { dataset: { node: n.name } },
      el("td", {}, n.name),
      el("td", { class: "num" }, n.group_rank ?? "–"),
      el("td", {}, (n.workers || []).map((w) => `${w.rank}:${w.state}`).join(" ")),
      el("td", { class: n.unfit ? "bad" : "" }, n.unfit || "ok"),
      el("td", {}, gpus(n.gpu)),
      el("td", {}, status.slow_nodes?.includes(n.name) ? "slow" : ""),
    ),
  );
  return el(
    "div",
    {},
    el("p", {}, `generation ${status.generation}, world ${status.world_size}, `,
      `target ${status.target_nodes ?? "–"} nodes, leader ${status.leader ?? "–"}`),
    table(["node", "group rank", "ranks", "health", "GPUs", ""], rows, { class: "rows" }),
  );
}

// Each GPU's verdict (gpu/: NVML's health, XIDs), its reason on hover.
function gpus(summary) {
  if (!summary) return "–";
  if (!summary.available) return `not watched: ${summary.reason}`;
  return summary.gpus.map((g) =>
    el("span", { class: `label ${g.health === "healthy" ? "" : "bad"}`, title: g.reason || g.action },
      `${g.index}: ${g.health}`));
}

function eventList(events) {
  const rows = [...events].reverse().map((e) =>
    el(
      "tr",
      { dataset: { type: e.type } },
      el("td", {}, e.at ? e.at.slice(11, 19) : "–"),
      el("td", { class: "num" }, e.generation ?? ""),
      el("td", {}, e.type),
      el("td", {}, e.node ?? ""),
      el("td", {}, e.message),
    ),
  );
  return table(["at", "gen", "event", "node", ""], rows, { class: "rows events" });
}

// A rank's log: its last lines, then new ones as they come (server-sent events). A stream
// refused or cut (the rank not started yet, a new generation on another node) is opened again
// after a moment, without the lines shown already, until the job has ended.
function logPanel(root, base) {
  const rank = el("select", { name: "rank", id: "log-rank" });
  const out = el("pre", { class: "log", id: "log-lines" });
  const said = el("p", { class: "quiet", id: "log-said" });
  let close = () => {};
  let retry = null;
  let shown = 0;
  let ended = false;
  const start = (fresh) => {
    close();
    clearTimeout(retry);
    if (fresh) {
      out.replaceChildren();
      shown = 0;
    }
    said.textContent = `following rank ${rank.value}…`;
    const tail = shown ? 0 : 50;
    close = follow(
      `${base}/logs/${q(rank.value)}?tail=${tail}&follow=true`,
      (doc) => {
        if (doc.line !== undefined) {
          out.append(`${doc.line}\n`);
          shown += 1;
          out.scrollTop = out.scrollHeight;
        } else if (doc.notice !== undefined) said.textContent = doc.notice;
      },
      () => {
        if (ended) {
          said.textContent = `rank ${rank.value}'s log: the job has ended`;
          return;
        }
        // An event stream does not say why it was refused: one plain read of no lines does.
        // Not this user's to read (401, 403) is said once; no retry changes it.
        const asked = rank.value;
        get(`${base}/logs/${q(asked)}?tail=0`).then(
          () => again(asked),
          (error) => {
            if (asked !== rank.value) return;
            if (error.status === 401 || error.status === 403) {
              said.textContent = `rank ${asked}'s log: not allowed (${error.message})`;
            } else again(asked);
          },
        );
      },
    );
  };
  const again = (asked) => {
    if (asked !== rank.value || ended) return;
    said.textContent = `rank ${asked}'s log: not reachable now, trying again`;
    retry = setTimeout(() => start(false), 2000);
  };
  rank.addEventListener("change", () => start(true));
  root.append(el("label", {}, "rank ", rank), said, out);
  let ranks = 0;
  return {
    world(size, jobEnded) {
      ended = jobEnded;
      if (size === ranks || size === 0) return;
      const first = ranks === 0;
      ranks = size;
      const chosen = rank.value || "0";
      rank.replaceChildren(...Array.from({ length: size }, (_, r) => el("option", { value: r }, `${r}`)));
      rank.value = Number(chosen) < size ? chosen : "0";
      if (first) start(true);
    },
    stop: () => {
      ended = true;
      clearTimeout(retry);
      close();
    },
  };
}

// Every rank's Python stacks now (py-spy on each node, GET .../stacks): what a user reads when
// the loss stops moving and the job is not declared hung. Taken when asked, never polled.
function stacksPanel(root, base) {
  const native = el("input", { type: "checkbox", id: "stacks-native" });
  const out = el("pre", { class: "log", id: "stacks-out" });
  const said = el("p", { class: "quiet", id: "stacks-said" });
  const take = async () => {
    said.textContent = "taking every rank's stacks…";
    said.className = "quiet";
    try {
      const doc = await get(`${base}/stacks?native=${native.checked}`);
      const text = doc.ranks.map((r) =>
        `=== rank ${r.rank} on ${r.node} (pid ${r.pid}) ===\n` +
        (r.error ? `(no stacks: ${r.error})` : r.stacks.trimEnd()));
      text.push(...doc.unreachable.map((why) => `(not asked: ${why})`));
      out.textContent = text.join("\n") || "no rank runs now";
      said.textContent = `taken ${new Date().toLocaleTimeString()}, generation ${doc.generation}`;
    } catch (error) {
      said.textContent = `Not taken: ${error.message}`;
      said.className = "error";
    }
  };
  root.append(
    el("button", { type: "button", id: "take-stacks", onclick: take }, "Take stacks"),
    el("label", {}, native, " native frames"),
    said,
    out,
  );
}
