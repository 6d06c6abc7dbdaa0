// The sign-in page of a `nodeagentctl ui` link: its fragment carries a one-time code (never a
// token), posted to POST /v1/session, which sets the session cookie (HttpOnly). A browser
// signed in already is not switched to another user by a link some other page sent it to.
const said = document.getElementById("said");
const code = decodeURIComponent(location.hash.slice(1));
history.replaceState(null, "", location.pathname); // the code leaves the address bar

function fail(text) {
  said.textContent = text;
  said.className = "error";
}

async function signIn() {
  if (!/^[A-Za-z0-9_-]{16,128}$/.test(code)) {
    fail("This link carries no sign-in code: run `nodeagentctl ui` for a new one.");
    return;
  }
  const now = await fetch("/v1/session", { credentials: "same-origin" });
  if (now.ok) {
    const session = await now.json();
    fail(`This browser is signed in as ${session.user} already: sign out first to use this link.`);
    return;
  }
  const reply = await fetch("/v1/session", {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ code }),
  });
  if (reply.ok) {
    location.replace("/ui/#/jobs");
    return;
  }
  const problem = await reply.json().catch(() => ({}));
  fail(`Not signed in: ${problem.detail || reply.statusText}`);
}

signIn().catch((error) => fail(`Not signed in: ${error}`));
