"""How a burst of questions is split into prefill passes: N threads released by one barrier ask at once.

A spy on the batcher's ``_prefill`` records each pass's size; a burst whose late questions land in a second pass
waits for the first pass (and, before prefill-first scheduling, a decoding step) before its first tokens. A small
cartridge (~300 tokens) keeps each try short.

    OMP_NUM_THREADS=1 .venv/bin/python bench/burst_passes.py --questions 16 --tries 3
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvengine import make_backend  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--tries", type=int, default=3)
    args = parser.parse_args(argv)
    backend = make_backend("transformers", dtype="f32", quant="none")
    cartridge = backend.compile(["Alice lives in Lisbon.", "Bob keeps the key under the pot.", "The meeting is on Friday."] * 20)
    batcher = backend.batcher()
    passes: list[tuple[float, int]] = []
    prefill = batcher._prefill
    started = [0.0]

    def spy(rows):
        passes.append((round(time.perf_counter() - started[0], 3), len(rows)))
        return prefill(rows)

    batcher._prefill = spy
    for attempt in range(args.tries):
        passes.clear()
        barrier = threading.Barrier(args.questions)

        def ask(i: int) -> None:
            barrier.wait()
            backend.answer(cartridge, f"Where does person {i} live?", max_new_tokens=4)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(args.questions)]
        started[0] = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print(f"try {attempt + 1}: prefill passes (seconds from the start, questions): {passes}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
