// The sign-in page of a `nodeagentctl ui` link: its fragment carries a token, posted once to
// POST /v1/session, which sets the session cookie (HttpOnly: this script never holds it after).
const said = document.getElementById("said");
const token = decodeURIComponent(location.hash.slice(1));
history.replaceState(null, "", location.pathname); // the token leaves the address bar

async function signIn() {
  if (!token.startsWith("nat1.")) {
    said.textContent = "This link carries no token: run `nodeagentctl ui` for a new one.";
    return;
  }
  const reply = await fetch("/v1/session", {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ token }),
  });
  if (reply.ok) {
    location.replace("/ui/#/jobs");
    return;
  }
  const problem = await reply.json().catch(() => ({}));
  said.textContent = `Not signed in: ${problem.detail || reply.statusText}`;
  said.className = "error";
}

signIn().catch((error) => {
  said.textContent = `Not signed in: ${error}`;
  said.className = "error";
});
