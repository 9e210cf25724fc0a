"""The web dashboard: static HTML, CSS and JavaScript from ``gateway_http/ui``, no build step.

These routes carry no data and need no API key; the page's script calls the REST/SSE API
with the key the person typed (kept in the tab's sessionStorage, sent as the bearer header).
Every answer has a strict Content-Security-Policy (no inline script or style, nothing from
another origin), so an injected string can never run as script. Not in /openapi.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, Request, Response

from gateway_http.errors import ApiError

UI_DIR = Path(__file__).resolve().parent.parent / "ui"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    # Small files that change with the package: always revalidate, never keep a stale script.
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str


def load_assets(folder: Path = UI_DIR) -> dict[str, Asset]:
    """Every file of the dashboard, read once when the app is built (never per request)."""
    return {
        path.name: Asset(path.read_bytes(), CONTENT_TYPES[path.suffix])
        for path in sorted(folder.iterdir())
        if path.is_file() and path.suffix in CONTENT_TYPES
    }


router = APIRouter(include_in_schema=False)


def _serve(request: Request, name: str) -> Response:
    assets: dict[str, Asset] = request.app.state.ui_assets
    asset = assets.get(name)
    if asset is None:
        raise ApiError(404, "NOT_FOUND", "no such dashboard file")
    return Response(asset.body, media_type=asset.content_type, headers=SECURITY_HEADERS)


@router.get("/")
async def index(request: Request) -> Response:
    return _serve(request, "index.html")


@router.get("/ui/{name}")
async def asset(request: Request, name: str) -> Response:
    # Only the names loaded from the folder: a path with "/" or ".." matches none of them.
    return _serve(request, name)
