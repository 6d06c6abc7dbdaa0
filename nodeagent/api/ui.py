"""The web UI (docs/ui.md): its pages and assets under /ui/, from the package itself (no CDN,
no build step at run time: Chart.js is vendored in api/static/vendor/), each answer with a
strict Content-Security-Policy: scripts, styles and connections from this origin only, no
inline script or style, no frames. The pages call the /v1 routes as any client does, with the
session cookie (api/session.py)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response

from nodeagent.api.problems import Problem

STATIC = Path(__file__).with_name("static")
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-cache",
}
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".md": "text/plain; charset=utf-8",
}
PAGES = {"": "index.html", "signin": "signin.html"}


def assets(root: Path = STATIC) -> dict[str, tuple[bytes, str]]:
    """Every file the UI serves: its path under /ui/ -> its bytes and type, read once (only
    these names are answered: no path from a request ever reaches the file system)."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in TYPES:
            found[path.relative_to(root).as_posix()] = (path.read_bytes(), TYPES[path.suffix])
    return found


def install(app: FastAPI) -> None:
    files = assets()
    for name, page in PAGES.items():
        files[name] = files[page]

    @app.get("/ui", include_in_schema=False)
    def ui_root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=308)

    @app.get("/ui/{path:path}", include_in_schema=False)
    def ui_file(path: str) -> Response:
        found = files.get(path)
        if found is None:
            raise Problem(404, f"no page or asset /ui/{path[:100]} (the UI starts at /ui/)")
        body, media_type = found
        return Response(body, media_type=media_type, headers=HEADERS)
