// The API, as the page calls it: same origin, the session cookie (HttpOnly) sent by the
// browser, and each change carrying the session's X-Nodeagent-CSRF (docs/ui.md).

let session = null;

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

async function call(method, path, body) {
  const headers = {};
  if (method !== "GET") {
    headers["x-nodeagent-csrf"] = session?.csrf ?? "";
    if (body !== undefined) headers["content-type"] = "application/json";
  }
  const reply = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await reply.text();
  const data = text ? JSON.parse(text) : null;
  if (!reply.ok) throw new ApiError(reply.status, data?.detail || reply.statusText);
  return data;
}

export const get = (path) => call("GET", path);
export const post = (path, body) => call("POST", path, body);
export const remove = (path) => call("DELETE", path);

export async function signedIn() {
  session = await get("/v1/session");
  return session;
}

export function me() {
  return session;
}

// May the session's user act on this job? (What the page offers; the pool judges anyway.)
export function mayAct(job) {
  return Boolean(session && (session.operator || job.user === session.user));
}

// Server-sent events of `path` (follow=true), each `data:` line parsed; returns a stop().
export function follow(path, onData, onEnd) {
  const source = new EventSource(path, { withCredentials: true });
  source.onmessage = (message) => onData(JSON.parse(message.data));
  source.onerror = () => {
    source.close();
    onEnd?.();
  };
  return () => source.close();
}

export const q = encodeURIComponent;
