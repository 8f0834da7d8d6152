"""SQuAD v1.1 dev: fetch it (from the bigbench==1.0.0 source archive), load it, and pack scopes by token budget."""
from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# SQuAD v1.1 dev (CC BY-SA 4.0) ships inside bigbench's source distribution; we extract only this member.
BIGBENCH_REQUIREMENT = "bigbench==1.0.0"
BIGBENCH_ARCHIVE = "bigbench-1.0.0.tar.gz"
SQUAD_MEMBER = "bigbench-1.0.0/bigbench/benchmark_tasks/squad_shifts/squaddev_v1.1.json"
SQUAD_FILENAME = "squaddev_v1.1.json"
DEFAULT_DATA_DIR = Path.home() / ".cache" / "mnesio" / "squad"


@dataclass(frozen=True)
class Question:
    """One SQuAD question and its accepted answers."""

    qid: str
    question: str
    answers: tuple[str, ...]
    paragraph_index: int  # index of the paragraph (within its article) that holds the answer


@dataclass(frozen=True)
class Article:
    """A SQuAD article: its paragraphs in order and the questions about them."""

    title: str
    paragraphs: tuple[str, ...]
    questions: tuple[Question, ...]


@dataclass(frozen=True)
class Scope:
    """A memory store for the eval: the first paragraphs of one article that fit a token budget."""

    article: str
    budget: int
    paragraphs: tuple[str, ...]
    num_tokens: int  # the backend's count of the packed memories (prompt scaffolding included)
    questions: tuple[Question, ...]  # the article's questions whose paragraph is in the scope


def ensure_squad_file(*, data_dir: Path | None = None, squad_file: Path | None = None,
                      log: Callable[[str], None] = print) -> Path:
    """Return the path of SQuAD v1.1 dev, downloading bigbench's sdist and extracting the file if needed."""
    if squad_file is not None:
        path = Path(squad_file)
        if not path.is_file():
            raise FileNotFoundError(f"`--squad-file` has to be an existing file but got {str(path)!r}")
        return path
    data_dir = Path(data_dir or DEFAULT_DATA_DIR).expanduser()
    target = data_dir / SQUAD_FILENAME
    if target.is_file():
        return target
    data_dir.mkdir(parents=True, exist_ok=True)
    archive = data_dir / BIGBENCH_ARCHIVE
    if not archive.is_file():
        log(f"downloading {BIGBENCH_REQUIREMENT} (source archive, ~360 MB; not installed) into {data_dir}")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               BIGBENCH_REQUIREMENT, "-d", str(data_dir)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0 or not archive.is_file():
            raise RuntimeError(
                f"could not download {BIGBENCH_REQUIREMENT} with `{' '.join(cmd)}` (exit {result.returncode}): "
                f"{result.stderr.strip()[-500:]}; download it by hand into {data_dir} or pass --squad-file"
            )
    log(f"extracting {SQUAD_MEMBER} from {archive}")
    extract_member(archive, SQUAD_MEMBER, target)
    archive.unlink()  # 360 MB we no longer need; the 8 MB JSON is what we keep
    return target


def extract_member(archive: Path, member: str, target: Path) -> None:
    """Copy one member of a .tar.gz archive to ``target`` (written atomically)."""
    partial = target.with_suffix(target.suffix + ".partial")
    with tarfile.open(archive, "r:gz") as tar:
        try:
            source = tar.extractfile(member)
        except KeyError as exc:
            raise RuntimeError(f"{archive} has no member {member!r}; is it {BIGBENCH_ARCHIVE}?") from exc
        if source is None:
            raise RuntimeError(f"{member!r} in {archive} is not a regular file")
        with source, open(partial, "wb") as out:
            while chunk := source.read(1 << 20):
                out.write(chunk)
    partial.replace(target)


def load_squad(path: Path) -> list[Article]:
    """Parse a SQuAD v1.1 JSON file into articles (file order)."""
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    if "data" not in raw:
        raise ValueError(f"{path} is not a SQuAD file: it has no top-level 'data' list")
    articles = []
    for article in raw["data"]:
        paragraphs = []
        questions = []
        for index, paragraph in enumerate(article["paragraphs"]):
            paragraphs.append(paragraph["context"])
            for qa in paragraph["qas"]:
                answers = tuple(dict.fromkeys(a["text"] for a in qa["answers"]))  # unique, order kept
                questions.append(Question(qid=qa["id"], question=qa["question"], answers=answers,
                                          paragraph_index=index))
        articles.append(Article(title=article["title"], paragraphs=tuple(paragraphs), questions=tuple(questions)))
    return articles


def pack_scope(article: Article, budget: int, count_tokens: Callable[[Sequence[str]], int]) -> Scope:
    """Take the article's paragraphs in order while the memories still fit ``budget`` tokens."""
    chosen: list[str] = []
    num_tokens = 0
    for paragraph in article.paragraphs:
        n = count_tokens([*chosen, paragraph])
        if n > budget:
            break
        chosen.append(paragraph)
        num_tokens = n
    in_scope = len(chosen)
    questions = tuple(q for q in article.questions if q.paragraph_index < in_scope)
    return Scope(article=article.title, budget=budget, paragraphs=tuple(chosen), num_tokens=num_tokens,
                 questions=questions)


def build_scopes(articles: Sequence[Article], budget: int, count_tokens: Callable[[Sequence[str]], int], *,
                 num_articles: int, min_fill: float = 0.7) -> list[Scope]:
    """Pack ``num_articles`` scopes for ``budget``, from the articles (in order) long enough to fill it.

    An article fills the budget when its packed scope reaches ``min_fill`` of it; shorter articles are
    skipped so that a "4k" scope really holds about 4k tokens.
    """
    scopes = []
    for article in articles:
        scope = pack_scope(article, budget, count_tokens)
        if scope.paragraphs and scope.num_tokens >= min_fill * budget and scope.questions:
            scopes.append(scope)
            if len(scopes) == num_articles:
                break
    if not scopes:
        raise ValueError(f"no article is long enough to fill a {budget}-token scope; lower `--budgets`")
    return scopes


def sample_questions(scopes: Sequence[Scope], num_questions: int, *, seed: int) -> list[tuple[Scope, Question]]:
    """Pick ``num_questions`` questions spread evenly over the scopes (seeded, so reruns ask the same ones)."""
    rng = random.Random(seed)
    pools = [rng.sample(list(s.questions), len(s.questions)) for s in scopes]
    picked: list[tuple[Scope, Question]] = []
    while len(picked) < num_questions and any(pools):
        for scope, pool in zip(scopes, pools, strict=True):
            if pool and len(picked) < num_questions:
                picked.append((scope, pool.pop()))
    return picked


def build_packed_scopes(articles: Sequence[Article], budget: int, count_tokens: Callable[[Sequence[str]], int], *,
                        num_scopes: int, min_fill: float = 0.7) -> list[Scope]:
    """``num_scopes`` scopes for ``budget``, each from its own articles, several packed into one when one is short.

    Articles are taken in file order, each used by one scope at most: a scope takes the next article's
    paragraphs in order while they fit, then (if it is not yet ``min_fill`` full) the next article's, and
    so on. So every budget really is filled and a run's scopes span many articles (a variant measured on
    one article's scopes can look better than it is). A question's ``paragraph_index`` is renumbered to
    the scope's paragraph list; the scope's ``article`` names its articles joined by " + ".
    """
    scopes: list[Scope] = []
    pending = list(articles)
    while pending and len(scopes) < num_scopes:
        chosen: list[str] = []
        titles: list[str] = []
        questions: list[Question] = []
        num_tokens = 0
        while pending and num_tokens < min_fill * budget:
            article = pending.pop(0)
            offset = len(chosen)
            taken = 0
            for paragraph in article.paragraphs:
                n = count_tokens([*chosen, paragraph])
                if n > budget:
                    break
                chosen.append(paragraph)
                num_tokens = n
                taken += 1
            if not taken:
                continue  # its first paragraph does not fit what is left: try the next article
            titles.append(article.title)
            questions += [dataclasses.replace(q, paragraph_index=q.paragraph_index + offset)
                          for q in article.questions if q.paragraph_index < taken]
        if chosen and num_tokens >= min_fill * budget and questions:
            scopes.append(Scope(article=" + ".join(titles), budget=budget, paragraphs=tuple(chosen),
                                num_tokens=num_tokens, questions=tuple(questions)))
    if not scopes:
        raise ValueError(f"the articles cannot fill a {budget}-token scope; lower `--budgets`")
    return scopes


def scope_articles(scopes: Sequence[Scope]) -> list[str]:
    """The distinct articles the scopes were packed from."""
    return sorted({title for s in scopes for title in s.article.split(" + ")})
