"""The dashboard page, server-rendered: operators only; configuration, scopes and lag, latency chart,
sizes by quant and recent gate results; a body fragment for the self-refresh."""
from __future__ import annotations

import re

import pytest

from cartridges.pages import latency_chart, size_chart
from tests.dashboard import scenario

pytestmark = pytest.mark.django_db


def test_it_sends_anonymous_and_non_staff_users_to_the_admin_login(client, alice):
    response = client.get("/dashboard/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    client.force_login(alice)
    assert client.get("/dashboard/").status_code == 302


def test_the_root_redirects_to_the_dashboard(client):
    response = client.get("/")
    assert response.status_code == 302 and response["Location"] == "/dashboard/"


def test_it_renders_every_panel_for_an_operator(client, alice, charlie, operator, scope_a, scope_c, append):
    state = scenario.build(alice=alice, charlie=charlie, operator=operator, scope_a=scope_a, scope_c=scope_c, append=append)
    client.force_login(operator)
    html = client.get("/dashboard/").content.decode()
    assert re.search(r'data-field="quant">q8<', html) and re.search(r'data-field="dtype">bf16<', html)
    assert re.search(r'<tr data-scope="scope-a">.*?data-field="lag">1<', html, re.S)
    assert re.search(r'<tr data-scope="scope-c">.*?data-field="lag">0<', html, re.S)
    # three answers per mode in scope A and one cartridge answer in C: 4 cartridge points, 3 text points
    cartridge_points = re.search(r'<polyline class="series" data-mode="cartridge"[^>]*points="([^"]+)"', html).group(1)
    text_points = re.search(r'<polyline class="series" data-mode="text"[^>]*points="([^"]+)"', html).group(1)
    assert len(cartridge_points.split()) == 4 and len(text_points.split()) == 3
    assert 'data-quant="none"' in html and 'data-quant="q8"' in html
    assert f'<tr data-version="{state["broken"].pk}">' in html and "failed" in html and "sha256" in html
    assert 'http-equiv="refresh"' in html and "setTimeout(refresh" in html
    assert "flowerpot" not in html and "Miso" not in html  # metrics only, never memory text
    assert not re.search(r'(src|href)="(https?:)?//', html)  # nothing fetched from elsewhere (offline machines)


def test_the_fragment_is_the_body_only(client, operator):
    client.force_login(operator)
    html = client.get("/dashboard/?fragment=1").content.decode()
    assert 'id="configuration"' in html and "<html" not in html and "data-generated-at" in html


def test_the_latency_chart_scales_to_the_slowest_answer():
    chart = latency_chart({"cartridge": [0.1, 0.2], "text": [0.3, 1.5, 0.9]}, width=200, height=100)
    assert chart["ticks"][-1]["label"] == "2 s"  # 1.5 rounded up to a 1-2-5 step
    text = next(line for line in chart["lines"] if line["mode"] == "text")
    assert [p["x"] for p in text["points"]] == [64.0, 126.0, 188.0]
    top, bottom = chart["top"], chart["bottom"]
    assert all(top <= p["y"] <= bottom for line in chart["lines"] for p in line["points"])
    assert latency_chart({"cartridge": [], "text": []})["empty"] is True


def test_durations_and_ages_read_well():
    from cartridges.templatetags.kv_admin import age, seconds, when

    assert [seconds(None), seconds(8.5e-5), seconds(0.0123), seconds(1.4242)] == ["–", "85 µs", "12.3 ms", "1.42 s"]
    assert [age(42), age(300), age(10800), age(259200)] == ["42 s", "5 min", "3 h", "3 d"]
    assert when("2026-11-29T17:28:26.155426+00:00") == "2026-11-29 17:28:26 UTC"


def test_the_size_chart_is_proportional_to_the_mean_size():
    chart = size_chart([{"quant": "none", "count": 1, "total_bytes": 800, "mean_bytes": 800},
                        {"quant": "q8", "count": 2, "total_bytes": 800, "mean_bytes": 400}])
    none, q8 = chart["bars"]
    assert none["w"] == pytest.approx(2 * q8["w"]) and none["y"] < q8["y"]
