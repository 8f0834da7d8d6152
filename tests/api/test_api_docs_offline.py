"""The API docs (Swagger UI at /api/docs/, Redoc at /api/redoc/) work offline: every script, stylesheet and icon
they reference is served by this server from drf-spectacular-sidecar, none by a CDN (a real HTTP server)."""
from __future__ import annotations

import re
import urllib.request
from html.parser import HTMLParser

import pytest

pytestmark = pytest.mark.django_db(transaction=True)


class _Refs(HTMLParser):
    """Collect src/href attributes and the text of inline scripts."""

    def __init__(self):
        super().__init__()
        self.refs: list[str] = []
        self.inline: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self._in_script = tag == "script"
        self.refs += [value for name, value in attrs if name in ("src", "href") and value]

    def handle_data(self, data):
        if self._in_script:
            self.inline.append(data)

    def handle_endtag(self, tag):
        self._in_script = False


def _get(url: str, token: str | None = None) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Token {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, response.headers.get("Content-Type", ""), response.read()


@pytest.mark.parametrize("page", ["/api/docs/", "/api/redoc/"])
def test_the_docs_page_loads_every_asset_from_this_server(live_server, alice, page):
    from knox.models import AuthToken

    _, token = AuthToken.objects.create(user=alice)
    status, content_type, body = _get(live_server.url + page, token)
    assert status == 200 and content_type.startswith("text/html")
    html = body.decode()
    parser = _Refs()
    parser.feed(html)
    assets = [ref for ref in parser.refs if "/static/" in ref]
    assert any(ref.endswith(".js") for ref in assets), parser.refs
    # nothing from another host: no absolute or protocol-relative URL in an attribute or an inline script
    external = [ref for ref in parser.refs if re.match(r"^(https?:)?//", ref)]
    external += re.findall(r"""["'](?:https?:)?//[^"']+["']""", "".join(parser.inline))
    assert not external, external
    for cdn in ("jsdelivr", "unpkg", "cdnjs", "googleapis"):
        assert cdn not in html
    for ref in assets:
        asset_status, asset_type, asset = _get(live_server.url + ref)
        assert asset_status == 200 and len(asset) > 100, ref
        if ref.endswith(".js"):
            assert "javascript" in asset_type, (ref, asset_type)
