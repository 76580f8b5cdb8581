"""The web page: `GET /` serves a small single page that uses only the public HTTP API.

Everything it needs is in `api/static/`, the Flask app's own static folder (served at
`/static/`): HTML, CSS, JavaScript; no build step, nothing from a CDN. The page asks for
an API key once and keeps it in the browser's local storage; it sends it only as an
`Authorization` header, never in a URL. The content security policy lets the page load
nothing but its own files and images it fetched itself (blob: URLs) or presigned image URLs.
"""

from __future__ import annotations

from flask import Blueprint, current_app, send_from_directory

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' blob: data: https: http:; media-src 'self' blob: https: http:; "
    "form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
)

bp = Blueprint("web", __name__)


@bp.get("/")
def index():
    static_folder = current_app.static_folder
    assert static_folder is not None  # the app is made with its static folder (api.create_app)
    response = send_from_directory(static_folder, "index.html", max_age=0)
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response
