"""Runs the examples of one documentation page, in order, in the current folder (a test's temp
dir, whose sqlite store $MLFLOW_TRACKING_URI names): ``python run_examples.py BLOCKS.json``.

Python blocks share one namespace, as a reader's session would; shell blocks run with bash
(``-e -o pipefail``) in the same folder and environment. Prints one ``DOC-EXAMPLE`` line per
block; the first block that fails prints its error and stops the page (exit 1).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

SETUP_DIR = Path(__file__).resolve().parent / "setup"


def _run_python(code: str, where: str, namespace: dict) -> None:
    exec(compile(code, where, "exec"), namespace)


def _run_bash(code: str, expected_exit: int) -> None:
    sys.stdout.flush()
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], stdin=subprocess.DEVNULL, timeout=600)
    if done.returncode != expected_exit:
        raise RuntimeError(f"the shell block exited {done.returncode}, expected {expected_exit}")


def main(blocks_file: str) -> int:
    blocks = json.loads(Path(blocks_file).read_text(encoding="utf-8"))
    namespace: dict = {"__name__": "__main__"}
    done_setups: set[str] = set()
    with contextlib.ExitStack() as stack:
        if any(b["options"].get("fake-judge") for b in blocks):
            from mlflow_rag_eval.testing import FakeJudgeServer

            server = stack.enter_context(FakeJudgeServer(model="gpt-4o-mini"))
            os.environ["OPENAI_BASE_URL"] = server.base_url  # this process and its children only
            os.environ["OPENAI_API_KEY"] = "placeholder-not-a-key"
        for block in blocks:
            where, started = block["where"], time.perf_counter()
            try:
                setup = block["options"].get("setup")
                if setup and setup not in done_setups:
                    path = SETUP_DIR / f"{setup}.py"
                    _run_python(path.read_text(encoding="utf-8"), str(path), namespace)
                    done_setups.add(setup)
                if block["lang"] == "file":
                    Path(block["options"]["file"]).write_text(block["code"], encoding="utf-8")
                    print(f"DOC-EXAMPLE {where} written to {block['options']['file']}", flush=True)
                    continue
                if block["lang"] == "python":
                    _run_python(block["code"], where, namespace)
                else:
                    _run_bash(block["code"], int(block["options"].get("exit", 0)))
            except BaseException:  # SystemExit from a block's code is a failure too
                sys.stdout.flush()
                traceback.print_exc()
                print(f"DOC-EXAMPLE {where} FAILED", flush=True)
                return 1
            print(f"DOC-EXAMPLE {where} ok {time.perf_counter() - started:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
