"""Serving figures: a web process's memory with and without the model, and how soon the first streamed
token reaches an OpenAI client compared with the server's own time to first token.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/mnesio_bench REDIS_URL=redis://127.0.0.1:6379/0 \\
      MNESIO_ANSWER_MAX_NEW_TOKENS=16 .venv/bin/python bench/serving_bench.py --asks 20 \\
      --out bench/results/serving.json

It builds a scope of a few memories under the real default model (SmolLM2-135M-Instruct, f32, CPU), then
starts web processes of the project (uvicorn running Django's ASGI application, tests/serving/webproc.py):
1. model-free (MNESIO_WEB_LOADS_MODEL=false) with a gpu worker (``celery ... -Q gpu -P threads``) answering
   its asks: RSS after one answered ask, and whether libtorch is mapped;
2. loading the model (the default): RSS after one answered ask; then ``--asks`` streamed asks with the
   official ``openai`` client, each timing the first content chunk at the client against the server-side
   ttft the final chunk reports (``mnesio.ttft_s``). The target: client first chunk <= 1.5 x ttft + 50 ms.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ask(url: str, token: str, scope: str) -> dict:
    import http.client

    conn = http.client.HTTPConnection(url.removeprefix("http://").split(":")[0], int(url.rsplit(":", 1)[1]), timeout=600)
    conn.request("POST", f"/api/scopes/{scope}/ask/", body=json.dumps({"question": "Where is the spare key?"}),
                 headers={"Authorization": f"Token {token}", "Content-Type": "application/json"})
    response = conn.getresponse()
    body = json.loads(response.read())
    if response.status != 200:
        raise RuntimeError(f"ask failed: {response.status} {body}")
    return body


def first_chunk_figures(url: str, token: str, scope: str, questions: list[str], num_asks: int) -> dict:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0, timeout=600)
    rows = []
    for i in range(num_asks):
        question = questions[i % len(questions)]
        started = time.perf_counter()
        first = None
        ttft = None
        for chunk in client.chat.completions.create(model=scope, messages=[{"role": "user", "content": question}],
                                                    stream=True):
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - started
            extra = getattr(chunk, "model_extra", None) or {}
            if "mnesio" in extra:
                ttft = extra["mnesio"]["ttft_s"]
        rows.append({"client_first_chunk_s": round(first, 4), "server_ttft_s": round(ttft, 4),
                     "within_target": first <= 1.5 * ttft + 0.05})
    ratios = [r["client_first_chunk_s"] - r["server_ttft_s"] for r in rows]
    return {
        "num_asks": num_asks,
        "client_first_chunk_s_p50": round(statistics.median(r["client_first_chunk_s"] for r in rows), 4),
        "server_ttft_s_p50": round(statistics.median(r["server_ttft_s"] for r in rows), 4),
        "overhead_s_p50": round(statistics.median(ratios), 4),
        "overhead_s_max": round(max(ratios), 4),
        "num_within_1_5x_ttft_plus_50ms": sum(r["within_target"] for r in rows),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--asks", type=int, default=20, help="streamed asks timed with the openai client")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/serving.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if not os.environ.get("REDIS_URL"):
        sys.exit("needs REDIS_URL (the broker the gpu worker reads)")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mnesio_site.settings")
    os.environ.setdefault("MNESIO_ANSWER_MAX_NEW_TOKENS", "16")
    os.environ.setdefault("MNESIO_LOG_LEVEL", "WARNING")
    os.environ.setdefault("SECURE_SSL_REDIRECT", "false")  # plain http on 127.0.0.1
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from knox.models import AuthToken

    from bench.reliability.answer_load import QUESTIONS, serving_scope
    from memories.services import scope_grant
    from mnesio_site.celery import app
    from tests.serving.webproc import WebProcess

    app.conf.task_always_eager = True  # the setup's compile and gate run here
    call_command("migrate", interactive=False, verbosity=0)
    scope = serving_scope(backend_config=("transformers", "smollm2-135m-instruct", "f32", "none"))
    user = get_user_model().objects.create_user(username=f"bench-{scope.name}")
    scope_grant(scope=scope, user=user)
    token = AuthToken.objects.create(user=user)[1]
    figures: dict = {"model": "smollm2-135m-instruct", "dtype": "f32",
                     "max_new_tokens": int(os.environ["MNESIO_ANSWER_MAX_NEW_TOKENS"]), "cpu_count": os.cpu_count()}
    workdir = Path(tempfile.mkdtemp(prefix="mnesio-serving-"))

    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "mnesio_site", "worker", "-Q", "gpu", "-P", "threads", "-c", "4",
         "--without-gossip", "--without-mingle", "--loglevel", "WARNING"], cwd=ROOT, env=dict(os.environ))
    web = WebProcess(env={"MNESIO_WEB_LOADS_MODEL": "false"}, workdir=workdir)
    try:
        rss_before = web.rss_kb()
        answer = _ask(web.url, token, scope.name)
        figures["model_free_web"] = {"rss_kb_started": rss_before, "rss_kb_after_an_ask": web.rss_kb(),
                                     "libtorch_mapped": web.maps_torch(), "answer": answer["answer"]}
    finally:
        figures["model_free_web"]["imported"] = web.stop()
        worker.terminate()
        worker.wait(timeout=60)

    web = WebProcess(env={"MNESIO_WEB_LOADS_MODEL": "true"}, workdir=workdir)
    try:
        rss_before = web.rss_kb()
        answer = _ask(web.url, token, scope.name)
        figures["model_loading_web"] = {"rss_kb_started": rss_before, "rss_kb_after_an_ask": web.rss_kb(),
                                        "libtorch_mapped": web.maps_torch(), "answer": answer["answer"]}
        figures["openai_first_chunk"] = first_chunk_figures(web.url, token, scope.name, QUESTIONS, args.asks)
    finally:
        figures["model_loading_web"]["imported"] = web.stop()
    figures["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if k != "openai_first_chunk"} |
                     {"openai_first_chunk": {k: v for k, v in figures["openai_first_chunk"].items() if k != "rows"}},
                     indent=2))


if __name__ == "__main__":
    main()
