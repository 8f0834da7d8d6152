"""`python manage.py kveval`: the SQuAD accuracy-parity and speed suite, plus the erasure check.

The engine part is kvengine.kveval (the same as `python -m kvengine.kveval`). The erasure check goes
through the real services: it appends one SQuAD article's paragraphs to a fresh scope (one subject per
paragraph) and the same paragraphs minus one to a second scope that never stores it, compiles, gates and
activates the first, erases the one paragraph's subject (erasure_request_file / erasure_request_process,
which rebuilds the cartridge), and shows that the rebuilt blob is byte-identical to the never-stored
scope's and that the erased paragraph's questions are answered no better than without it.

It creates two scopes named ``kveval-<run>`` and ``kveval-<run>-never`` in the configured database (the
log is append-only: they stay, their subjects erased or not). The erasure check runs under the active KV
configuration (the one the server answers with); the engine part under the options given.
"""
from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from cartridges import conf, engine
from cartridges.selectors import active_configuration, active_version, version_state
from cartridges.services import GateFailed, cartridge_activate, cartridge_answer, cartridge_compile
from cartridges.storage import blob_exists, blob_read
from kvengine.kveval import cli
from kvengine.kveval.data import build_scopes, ensure_squad_file, load_squad
from kvengine.kveval.metrics import squad_scores
from kvengine.kveval.report import erasure_markdown, write_report
from kvengine.kveval.runner import BackendPool, machine_info, run_eval
from memories.services import erasure_request_file, erasure_request_process, memory_append, scope_create


class Command(BaseCommand):
    help = (
        "Accuracy-parity and speed suite on SQuAD v1.1 dev (cartridge vs text re-reading vs BM25/dense top-k "
        "retrieval, per memory budget) and the erasure check through the real services."
    )

    def add_arguments(self, parser) -> None:
        cli.add_arguments(parser)
        parser.add_argument("--skip-engine", action="store_true", help="run only the erasure check")
        parser.add_argument("--skip-erasure", action="store_true", help="run only the engine part")
        parser.add_argument("--erasure-budget", type=int, default=1024,
                            help="memory tokens of the erasure check's scope (default: 1024)")
        parser.add_argument("--erasure-questions", type=int, default=8,
                            help="questions of the erased paragraph asked before and after (default: 8)")

    def handle(self, *args, **options) -> None:
        if options["skip_engine"] and options["skip_erasure"]:
            raise CommandError("`--skip-engine` and `--skip-erasure` together leave nothing to run")
        if options["erasure_budget"] < 64 or options["erasure_questions"] < 1:
            raise CommandError("`--erasure-budget` has to be at least 64 and `--erasure-questions` at least 1")
        ns = _Namespace(options)
        command = "python manage.py kveval " + shlex.join(sys.argv[2:])
        if ns.dataset == "locomo":  # the engine part only: the erasure check stores SQuAD paragraphs
            try:
                cli.run_locomo_from_args(ns, command=command, log=self._log)
            except (ValueError, FileNotFoundError, RuntimeError) as exc:
                raise CommandError(str(exc)) from None
            return
        try:
            config = cli.config_from_args(ns)
            squad = ensure_squad_file(data_dir=ns.data_dir, squad_file=ns.squad_file, log=self._log)
        except (ValueError, FileNotFoundError, RuntimeError) as exc:
            raise CommandError(str(exc)) from None
        articles = load_squad(squad)
        pool = BackendPool(config)
        out = Path(ns.out)
        results: dict[str, Any] | None = None
        if not options["skip_engine"]:
            run = run_eval(config, articles, pool=pool, progress=not ns.no_progress, log=self._log)
            results = run.as_dict()
            results["data"] = {"squad_file": str(squad), "num_articles": len(articles)}
            # written now, so a failing erasure check never costs the (long) engine run its figures
            for kind, path in write_report(results, out, command=command).items():
                self._log(f"wrote {kind}: {path}")
        if options["skip_erasure"]:
            return
        erasure = erasure_check(articles=articles, pool=pool, budget=options["erasure_budget"],
                                num_questions=options["erasure_questions"], template=config.question_template,
                                log=self._log)
        out.mkdir(parents=True, exist_ok=True)
        if results is not None:
            results["erasure"] = erasure
            write_report(results, out, command=command)
        (out / "erasure.json").write_text(json.dumps({**erasure, "command": command}, indent=1, sort_keys=True) + "\n")
        (out / "erasure.md").write_text(erasure_markdown(erasure) + "\n")
        self._log(f"wrote erasure: {out / 'erasure.json'}, {out / 'erasure.md'}")
        if not erasure["checks"]["holds"]:
            raise CommandError(f"the erasure check failed: {erasure['checks']}")

    def _log(self, message: str) -> None:
        self.stdout.write(message)


class _Namespace:
    """argparse-style attribute access over Django's options dict (what kvengine.kveval.cli expects)."""

    def __init__(self, options: dict[str, Any]):
        self.__dict__.update(options)


def _share_model(pool: BackendPool) -> None:
    """Serve the erasure check with the engine part's loaded model when it is the active configuration."""
    config = active_configuration().config
    backend_name, model, dtype, quant = config.as_tuple()
    if backend_name != pool.config.backend or dtype != pool.config.dtype or quant != "none":
        return
    if (pool.config.model or model) != model:
        return
    engine.register_backend(config, pool.get(dtype, "none"))


def erasure_check(*, articles, pool: BackendPool, budget: int, num_questions: int, template: str,
                  log=print) -> dict[str, Any]:
    """Erase one paragraph's subject from a compiled scope and compare with a scope that never held it."""
    _share_model(pool)
    config = active_configuration()
    backend = engine.backend_for(config)
    started = time.time()
    (scope_data,) = build_scopes(articles, budget, backend.count_tokens, num_articles=1)
    if len(scope_data.paragraphs) < 2:
        raise CommandError(f"`--erasure-budget` {budget} holds one paragraph only; raise it so one can be erased")
    # erase the paragraph with the most questions (the first such): the sharpest before/after contrast
    counts = [sum(q.paragraph_index == i for q in scope_data.questions) for i in range(len(scope_data.paragraphs))]
    target = max(range(len(counts)), key=lambda i: (counts[i], -i))
    questions = [q for q in scope_data.questions if q.paragraph_index == target][:num_questions]
    run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime(started)) + f"-{int(started * 1000) % 1000:03d}"
    scope = scope_create(name=f"kveval-{run_id}", description=f"kveval erasure check: {scope_data.article}")
    never_scope = scope_create(name=f"kveval-{run_id}-never",
                               description=f"kveval erasure check: {scope_data.article} without paragraph {target}")
    subjects = [f"kveval-{run_id}-p{i}" for i in range(len(scope_data.paragraphs))]
    target_seq = None
    # the same other memories in a scope that never held the target, appended first so that they lie below
    # the erased scope's head, which the rebuilt version is compiled at (compiles default to the scope's head)
    for i, text in enumerate(scope_data.paragraphs):
        if i != target:
            memory_append(scope=never_scope, subject=subjects[i], content=text)
    for i, text in enumerate(scope_data.paragraphs):
        memory = memory_append(scope=scope, subject=subjects[i], content=text)
        if i == target:
            target_seq = memory.seq
    log(f"erasure check: {scope_data.article}, {len(scope_data.paragraphs)} paragraphs ({scope_data.num_tokens} "
        f"tokens) in scope {scope.name}; erasing paragraph {target} ({len(questions)} question(s))")

    start = time.perf_counter()
    before_version = cartridge_compile(scope=scope)
    timings = {"compile_before_s": time.perf_counter() - start}
    start = time.perf_counter()
    try:
        cartridge_activate(version=before_version)
    except GateFailed as exc:
        raise CommandError(f"the gate refused the eval scope's cartridge: {exc.extra.get('reasons')}") from None
    timings["gate_and_activate_s"] = time.perf_counter() - start
    prompts = [template.format(question=q.question) for q in questions]
    before = [cartridge_answer(scope=scope, question=p).answer for p in prompts]

    start = time.perf_counter()
    request = erasure_request_file(subject=subjects[target], requested_by=None, reason="kveval erasure check")
    request = erasure_request_process(erasure_request=request)
    timings["erasure_process_s"] = time.perf_counter() - start
    rebuilt = active_version(scope=scope)
    if rebuilt is None:
        raise CommandError("the erased scope has no active cartridge after the erasure was processed")
    after = [cartridge_answer(scope=scope, question=p).answer for p in prompts]

    start = time.perf_counter()
    never_version = cartridge_compile(scope=never_scope, log_head=rebuilt.log_head)
    timings["compile_never_s"] = time.perf_counter() - start
    never_cartridge, never_backend = engine.cartridge_load(version=never_version, config=config)
    max_new = conf.answer_max_new_tokens()  # what cartridge_answer uses: the same decode for all three
    never = [never_backend.answer(never_cartridge, p, max_new_tokens=max_new).text for p in prompts]

    def scores(answers: list[str]) -> dict[str, float]:
        pairs = [squad_scores(a, q.answers) for a, q in zip(answers, questions, strict=True)]
        return {"em": 100 * sum(p[0] for p in pairs) / len(pairs), "f1": 100 * sum(p[1] for p in pairs) / len(pairs)}

    figures = {"before": scores(before), "after": scores(after), "never_stored": scores(never)}
    blob_equal = blob_read(version=rebuilt) == blob_read(version=never_version)
    checks = {
        "old_version_destroyed": version_state(version=before_version) == "destroyed"
        and not blob_exists(storage_name=before_version.storage_name),
        "erased_memory_left_out": rebuilt.manifest.get("left_out") == [target_seq],
        "rebuilt_blob_equals_never_stored": blob_equal and rebuilt.sha256 == never_version.sha256,
        "answers_equal_never_stored": after == never,
        "no_better_than_never_stored": figures["after"]["f1"] <= figures["never_stored"]["f1"]
        and figures["after"]["em"] <= figures["never_stored"]["em"],
    }
    checks["holds"] = all(checks.values())
    return {
        "article": scope_data.article,
        "budget": budget,
        "num_paragraphs": len(scope_data.paragraphs),
        "num_tokens": scope_data.num_tokens,
        "erased_paragraph": target,
        "num_questions": len(questions),
        "scope": scope.name,
        "never_stored_scope": never_scope.name,
        "configuration": config.key(),
        "erasure_request_id": request.pk,
        "versions": {"before": before_version.pk, "rebuilt": rebuilt.pk, "never_stored": never_version.pk},
        "blob_sha256": {"before": before_version.sha256, "rebuilt": rebuilt.sha256, "never_stored": never_version.sha256},
        "blob_size_bytes": {"before": before_version.size_bytes, "rebuilt": rebuilt.size_bytes},
        "max_new_tokens": max_new,
        "figures": figures,
        "checks": checks,
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "questions": [{"qid": q.qid, "question": q.question, "answers": list(q.answers), "before": b, "after": a,
                       "never_stored": n} for q, b, a, n in zip(questions, before, after, never, strict=True)],
        "machine": machine_info(),
        "wall_s": round(time.time() - started, 1),
    }
