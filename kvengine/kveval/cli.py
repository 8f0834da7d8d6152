"""Command-line options shared by `python -m kvengine.kveval` and `python manage.py kveval`."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from kvengine import DTYPES

from .data import DEFAULT_DATA_DIR, ensure_squad_file, load_squad
from .report import write_report
from .runner import DEFAULT_QUESTION_TEMPLATE, MODES, EvalConfig, run_eval

DEFAULT_OUT = Path("bench/results/kveval")


def _ints(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers but got {value!r}") from None


def _names(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the eval's options to ``parser``."""
    d = EvalConfig()
    parser.add_argument("--backend", default=d.backend, choices=["transformers", "fake"],
                        help="engine backend (fake: no model, for trying the pipeline)")
    parser.add_argument("--model", default=d.model,
                        help="model id, local directory or hub id (default: the backend's, SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default=d.dtype, choices=list(DTYPES), help="precision of every mode")
    parser.add_argument("--quants", type=_names, default=d.quants, metavar="Q[,Q]",
                        help="quantized cartridges compared token for token with the main one (default: q8,q4)")
    parser.add_argument("--compare-dtypes", type=_names, default=d.compare_dtypes, metavar="D[,D]",
                        help="other precisions compared the same way (default: bf16; '' for none)")
    parser.add_argument("--device", default=d.device, help="cpu, cuda or auto")
    parser.add_argument("--budgets", type=_ints, default=d.budgets, metavar="N[,N]",
                        help="memory token budgets per scope (default: 1024,2048,4096,8192)")
    parser.add_argument("--questions", type=_ints, default=d.questions, metavar="N[,N]",
                        help="questions per budget: one number, or one per budget (default: 12,8,6,6)")
    parser.add_argument("--articles", type=_ints, default=d.articles, metavar="N[,N]",
                        help="articles (scopes) per budget, one number or one per budget; questions are spread "
                             "over them (default: 2,1,1,1)")
    parser.add_argument("--top-k", type=int, default=d.top_k, help="paragraphs retrieved per question (default: 3)")
    parser.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens,
                        help="answer length limit, greedy decoding (default: 32)")
    parser.add_argument("--threads", type=int, default=d.threads,
                        help="torch threads (default: torch's own; 1 is far faster on a machine shared with "
                             "other busy processes)")
    parser.add_argument("--modes", type=_names, default=d.modes, metavar="M[,M]",
                        help=f"answer modes, from {','.join(MODES)} (default: all)")
    parser.add_argument("--seed", type=int, default=d.seed, help="question sampling seed (default: 0)")
    parser.add_argument("--question-template", default=DEFAULT_QUESTION_TEMPLATE,
                        help="how each question is put to the model in every mode; must contain {question}")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help=f"where SQuAD v1.1 dev is cached (default: {DEFAULT_DATA_DIR})")
    parser.add_argument("--squad-file", type=Path, default=None,
                        help="use this SQuAD v1.1 JSON file instead of downloading")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output directory for JSON, markdown and PNGs (default: {DEFAULT_OUT})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    """Build the (validated) EvalConfig from parsed options."""
    return EvalConfig(backend=args.backend, model=args.model, dtype=args.dtype, device=args.device,
                      quants=tuple(args.quants), compare_dtypes=tuple(args.compare_dtypes),
                      budgets=tuple(args.budgets), questions=tuple(args.questions), articles=tuple(args.articles), threads=args.threads,
                      top_k=args.top_k, max_new_tokens=args.max_new_tokens, seed=args.seed,
                      question_template=args.question_template, modes=tuple(args.modes))


def run_from_args(args: argparse.Namespace, *, command: str, log=print) -> dict:
    """Fetch the data if needed, run the eval, write the report; return the results dict."""
    config = config_from_args(args)
    squad = ensure_squad_file(data_dir=args.data_dir, squad_file=args.squad_file, log=log)
    articles = load_squad(squad)
    run = run_eval(config, articles, progress=not args.no_progress, log=log)
    results = run.as_dict()
    results["data"] = {"squad_file": str(squad), "num_articles": len(articles)}
    paths = write_report(results, args.out, command=command)
    for kind, path in paths.items():
        log(f"wrote {kind}: {path}")
    return results


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m kvengine.kveval`."""
    parser = argparse.ArgumentParser(
        prog="python -m kvengine.kveval",
        description="Accuracy-parity and speed suite on SQuAD v1.1 dev: cartridge vs text re-reading vs "
                    "BM25/dense top-k retrieval, per memory budget. Engine only (no database); the erasure "
                    "check is in `python manage.py kveval`.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    command = "python -m kvengine.kveval " + shlex.join(argv)
    try:
        run_from_args(args, command=command.strip())
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        parser.exit(2, f"kveval: error: {exc}\n")
    return 0
