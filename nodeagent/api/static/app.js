// The web UI's shell: who is signed in, and which page the address's fragment names
// (#/jobs, #/jobs/NAME, #/nodes, #/queues). Each page returns a stop() for its timers.
import { ApiError, remove, signedIn } from "./api.js";
import { el, replace } from "./dom.js";
import { jobPage } from "./job.js";
import { jobsPage } from "./jobs.js";
import { nodesPage } from "./nodes.js";
import { queuesPage } from "./queues.js";

const main = document.getElementById("main");
let stop = () => {};

function route() {
  stop();
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const [page, name] = parts;
  for (const link of document.querySelectorAll("[data-nav]")) {
    link.classList.toggle("here", link.dataset.nav === (page || "jobs"));
  }
  if (page === "jobs" && name) stop = jobPage(main, name);
  else if (page === "nodes") stop = nodesPage(main);
  else if (page === "queues") stop = queuesPage(main);
  else stop = jobsPage(main);
}

function signedOut(detail) {
  replace(
    main,
    el("h1", {}, "Not signed in"),
    el("p", {}, detail),
    el("p", {}, "Run ", el("code", {}, "nodeagentctl ui"), " and open the link it prints."),
  );
}

async function start() {
  let session;
  try {
    session = await signedIn();
  } catch (error) {
    signedOut(error instanceof ApiError ? error.message : String(error));
    return;
  }
  document.getElementById("who").textContent =
    `${session.user}${session.operator ? " (operator)" : ""}`;
  const out = document.getElementById("sign-out");
  out.hidden = false;
  out.addEventListener("click", async () => {
    await remove("/v1/session").catch(() => {});
    stop();
    signedOut("You signed out: your session's token is revoked.");
  });
  window.addEventListener("hashchange", route);
  route();
}

start();
