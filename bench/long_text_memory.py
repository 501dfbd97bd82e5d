"""Peak memory of embedding one long text with the local judge's encoder: flat in its length.

    python3 bench/long_text_memory.py                    # 1k, 100k, 1M, 4M characters, English and CJK
    python3 bench/long_text_memory.py --sizes 1000,100000 --scripts cjk

Each size runs in a fresh subprocess (peak RSS, ``ru_maxrss``, only grows in a process), which
loads the default model and encodes one text of that many characters; the table prints that
process's peak RSS and the time the encoding took, beside a baseline process that loads the
model and encodes a one-word text. The model reads at most ``max_seq_length`` tokens (256), and
``BertEncoder.tokenize`` cuts each text to ``CHARS_PER_TOKEN x max_seq_length`` characters
before the tokenizer sees it; before that cut the tokenizer built the whole text's encoding
first (measured at issue 38: 1M CJK characters peaked at 913 MiB, 4M at 2,764 MiB).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

SCRIPTS = {
    "english": "The bike ticket costs five euros on every regional train of the network. ",
    "cjk": "自行车票在所有地区列车上的价格为五欧元。",
}


def _child(size: int, script: str) -> None:
    from mlflow_rag_eval.judges.local_model.embedding import Embedder, load_model

    embedder = Embedder()
    load_model(embedder.path)  # the model's own memory is in the baseline, not the figure
    unit = SCRIPTS[script]
    text = (unit * (size // len(unit) + 1))[:size] if size else "ticket"
    started = time.perf_counter()
    embedder.encode([text])
    elapsed = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"peak_mib": peak_mib, "seconds": elapsed}))


def _run(size: int, script: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(size), script],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,100000,1000000,4000000", help="characters, comma-separated")
    parser.add_argument("--scripts", default="english,cjk", help=f"among {sorted(SCRIPTS)}")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(int(args.child[0]), args.child[1])
        return
    base = _run(0, "english")
    print(f"baseline (model loaded, one word): peak RSS {base['peak_mib']:.0f} MiB")
    print(f"{'script':<8} {'characters':>11} {'peak RSS MiB':>13} {'over baseline':>14} {'encode s':>9}")
    for script in args.scripts.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            r = _run(size, script)
            print(f"{script:<8} {size:>11,} {r['peak_mib']:>13.0f} {r['peak_mib'] - base['peak_mib']:>14.0f} "
                  f"{r['seconds']:>9.3f}")


if __name__ == "__main__":
    main()
