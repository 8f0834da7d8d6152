"""Command-line options shared by `python -m kvengine.kveval` and `python manage.py kveval`."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from kvengine import DTYPES

from .data import DEFAULT_DATA_DIR, ensure_squad_file, load_squad
from .locomo import load_locomo
from .locomo_runner import LOCOMO_MODES, LocomoConfig, run_locomo
from .report import write_report
from .runner import DEFAULT_QUESTION_TEMPLATE, MODES, EvalConfig, run_eval

DEFAULT_OUT = Path("bench/results/kveval")
# the development split laid beside the checkout (CC BY-NC: read in place, never copied into the repository)
DEFAULT_LOCOMO_FILE = Path("../shared/data/locomo/locomo_dev.json")


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
    lc = LocomoConfig()
    parser.add_argument("--dataset", default="squad", choices=["squad", "locomo"],
                        help="squad: scopes packed per token budget; locomo: whole conversations, recall@k and F1 "
                             "per category (default: squad)")
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
    parser.add_argument("--modes", type=_names, default=None, metavar="M[,M]",
                        help=f"answer modes, from {','.join(MODES)} (default: all); on locomo from "
                             f"{','.join(LOCOMO_MODES)} (default: {','.join(lc.modes)}; '' measures recall only)")
    parser.add_argument("--seed", type=int, default=d.seed, help="question sampling seed (default: 0)")
    parser.add_argument("--question-template", default=None,
                        help="how each question is put to the model in every mode; must contain {question} "
                             f"(default: {DEFAULT_QUESTION_TEMPLATE!r}; on locomo the paper's own instructions)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help=f"where SQuAD v1.1 dev is cached (default: {DEFAULT_DATA_DIR})")
    parser.add_argument("--squad-file", type=Path, default=None,
                        help="use this SQuAD v1.1 JSON file instead of downloading")
    parser.add_argument("--locomo-file", type=Path, default=DEFAULT_LOCOMO_FILE,
                        help=f"LoCoMo JSON file (default: {DEFAULT_LOCOMO_FILE})")
    parser.add_argument("--conversations", type=_names, default=(), metavar="ID[,ID]",
                        help="locomo: sample_ids to use (default: every conversation in the file)")
    parser.add_argument("--categories", type=_ints, default=lc.categories, metavar="C[,C]",
                        help="locomo: question categories, 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, "
                             "5 adversarial (default: all)")
    parser.add_argument("--questions-per-conversation", type=int, default=None, metavar="N",
                        help="locomo: questions answered per conversation, a seeded draw (default: all)")
    parser.add_argument("--recall-ks", type=_ints, default=lc.recall_ks, metavar="K[,K]",
                        help="locomo: k of the evidence recall@k (default: 3,5,10)")
    parser.add_argument("--retrievers", type=_names, default=lc.retrievers, metavar="R[,R]",
                        help="locomo: retrievers whose evidence recall is measured (default: bm25,dense,hybrid)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output directory for JSON, markdown and PNGs (default: {DEFAULT_OUT})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    """Build the (validated) EvalConfig from parsed options."""
    return EvalConfig(backend=args.backend, model=args.model, dtype=args.dtype, device=args.device,
                      quants=tuple(args.quants), compare_dtypes=tuple(args.compare_dtypes),
                      budgets=tuple(args.budgets), questions=tuple(args.questions), articles=tuple(args.articles), threads=args.threads,
                      top_k=args.top_k, max_new_tokens=args.max_new_tokens, seed=args.seed,
                      question_template=args.question_template or DEFAULT_QUESTION_TEMPLATE,
                      modes=EvalConfig().modes if args.modes is None else tuple(args.modes))


def locomo_config_from_args(args: argparse.Namespace) -> LocomoConfig:
    """Build the (validated) LocomoConfig from parsed options."""
    return LocomoConfig(backend=args.backend, model=args.model, dtype=args.dtype, device=args.device,
                        modes=LocomoConfig().modes if args.modes is None else tuple(args.modes),
                        retrievers=tuple(args.retrievers), recall_ks=tuple(args.recall_ks), top_k=args.top_k,
                        questions_per_conversation=args.questions_per_conversation,
                        conversations=tuple(args.conversations), categories=tuple(args.categories),
                        max_new_tokens=args.max_new_tokens, threads=args.threads, seed=args.seed,
                        question_template=args.question_template)


def run_locomo_from_args(args: argparse.Namespace, *, command: str, log=print) -> dict:
    """Load LoCoMo, measure recall and answers, write the report; return the results dict."""
    config = locomo_config_from_args(args)
    path = Path(args.locomo_file)
    if not path.is_file():
        raise FileNotFoundError(f"`--locomo-file` has to be an existing file but got {str(path)!r}")
    data = load_locomo(path, conversations=config.conversations or None, categories=config.categories)
    results = run_locomo(config, data, progress=not args.no_progress, log=log)
    results["data"]["file"] = str(path)
    for kind, out in write_report(results, args.out, command=command).items():
        log(f"wrote {kind}: {out}")
    return results


def run_from_args(args: argparse.Namespace, *, command: str, log=print) -> dict:
    """Fetch the data if needed, run the eval, write the report; return the results dict."""
    if getattr(args, "dataset", "squad") == "locomo":
        return run_locomo_from_args(args, command=command, log=log)
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
                    "BM25/dense top-k retrieval, per memory budget; with --dataset locomo, evidence recall@k and "
                    "per-category F1 on LoCoMo conversations. Engine only (no database); the erasure "
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
