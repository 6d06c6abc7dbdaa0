"""The HTTP API service (`nodeagent api`, docs/api.md): the pool from anywhere, a face over
views/ beside `nodeagentctl`, holding no power of its own (the pool judges every change).

app.py (the FastAPI application: `make_app`, its OpenAPI document), routes.py (one handler per
route of the verb table, views/table.py), bodies.py (the pydantic shapes of what it takes and
gives), service.py (reads, and changes asked of the pool leader signed as the caller),
answers.py (one thread following the pool leader's answers, waking each waiting caller),
cache.py (a read shared by every caller for limits.read_cache), kept.py (a kept read for a
caller known without I/O, answered before FastAPI's routing), quick.py (a known caller's
valid submission, handled before FastAPI's routing by the route's own body),
identity.py (who calls: an API token the pool vouched for, a browser's session cookie, or the
Unix socket's peer), session.py (a browser's session: a `nodeagentctl ui` link taken once, the
cookie, the CSRF value), ui.py (the web UI's pages and assets under /ui/), limits.py
(a rate per user, a bound on bodies), problems.py (every error as RFC 9457 problem details),
connections.py (uvicorn's protocol with the socket's SO_PEERCRED and a deadline for request
heads), server.py (uvicorn on the socket and on an HTTPS address).
"""
