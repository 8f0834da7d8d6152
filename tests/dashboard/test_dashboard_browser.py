"""The dashboard in real headless Chromium (Debian's, driven by Playwright): log in through the admin,
see every panel, watch it refresh itself after new memories and answers, and keep a screenshot."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.dashboard import scenario

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


@pytest.fixture
def browser_page(monkeypatch):
    """A Chromium page; skipped with the reason when Debian's chromium is not installed."""
    if not CHROMIUM.exists() and not shutil.which("chromium"):
        pytest.skip("Debian's chromium is not installed (bin/setup installs it, or `apt-get install chromium`)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop on this thread; the test's own ORM calls are still synchronous.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM if CHROMIUM.exists() else shutil.which("chromium")),
                                    args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        yield page
        browser.close()
        # ORM calls made inside Playwright's sync context get their own connection (asgiref locals are
        # context-bound); close it here, or it outlives the test and blocks dropping the test database.
        from django.db import connections

        connections.close_all()


def test_the_dashboard_shows_every_panel_and_refreshes_itself(
    live_server, browser_page, artifacts_dir, alice, charlie, operator, scope_a, scope_c, append
):
    from playwright.sync_api import expect

    from cartridges.services import cartridge_answer

    scenario.build(alice=alice, charlie=charlie, operator=operator, scope_a=scope_a, scope_c=scope_c, append=append)
    page = browser_page
    errors: list[str] = []
    foreign: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda req: None if req.url.startswith(live_server.url) else foreign.append(req.url))

    page.goto(f"{live_server.url}/dashboard/?refresh=1")
    assert "/admin/login/" in page.url  # operators only: log in through the admin's own form
    page.fill("#id_username", "olga")
    page.fill("#id_password", "x-olga-operator")
    page.click("input[type=submit]")
    page.wait_for_url("**/dashboard/?refresh=1")
    errors.clear()  # only the dashboard's own console counts (the admin login page asks for /favicon.ico)

    expect(page.locator('#configuration [data-field="backend"]')).to_have_text("fake")
    expect(page.locator('#configuration [data-field="quant"]')).to_have_text("q8")
    expect(page.locator('tr[data-scope="scope-a"] [data-field="lag"]')).to_have_text("1")
    expect(page.locator('tr[data-scope="scope-c"] [data-field="lag"]')).to_have_text("0")
    expect(page.locator('#latency-chart polyline[data-mode="cartridge"]')).to_have_count(1)
    expect(page.locator("#size-chart rect.bar")).to_have_count(2)
    expect(page.locator("#gate .pill.bad")).to_have_count(1)
    assert page.locator("#latency-chart").bounding_box()["width"] > 300  # drawn, not collapsed

    # new memories and answers arrive; the page picks them up on its own (refresh every second here)
    append(scope_c, "Miso's vet appointment is on Tuesday.")
    for _ in range(3):
        cartridge_answer(scope=scope_c, question="Where does Miso sleep?", mode="text", actor=charlie)
    expect(page.locator('tr[data-scope="scope-c"] [data-field="lag"]')).to_have_text("1", timeout=15_000)
    expect(page.locator('#latency tr[data-mode="text"] td').nth(1)).to_have_text("6", timeout=15_000)
    assert int(page.locator("#dashboard-body").get_attribute("data-refresh-count")) >= 1

    path = artifacts_dir / "dashboard.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 20_000
    assert errors == [] and foreign == []
