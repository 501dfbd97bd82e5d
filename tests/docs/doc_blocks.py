"""The fenced code examples of the documentation (docs/**/*.md and README.md), as the tests run them.

Every ``python`` and ``bash`` (``sh``, ``shell``) block is an example; other fences (output,
YAML, JSON, plain text) are not. An HTML comment on the line(s) right above a block, invisible on
the site and on GitHub, says how it runs:

- ``<!-- skip: why -->``: not run; the reason is required (a skip without one fails the tests);
- ``<!-- example: setup=NAME -->``: ``tests/docs/setup/NAME.py`` runs first, once per page, in
  the page's namespace and folder (the data and names the text says the reader has);
- ``<!-- example: fake-judge -->``: the page runs with the package's fake OpenAI-compatible
  server (``mlflow_rag_eval.testing.FakeJudgeServer``) as ``$OPENAI_BASE_URL``, so a paid judge's
  name (``openai:/gpt-4o-mini``) reaches it and no network;
- ``<!-- example: exit=N -->``: a shell block that must exit with N (``gate`` refusing: 1);
- ``<!-- example: file=NAME -->``: the block, whatever its language (a policy's YAML, a test
  module), is written to NAME in the page's folder for the blocks after it, not run.

Options combine: ``<!-- example: setup=northwind, fake-judge -->``. The blocks of one page run in
order in one process (Python blocks share one namespace; shell blocks run in the same folder and
environment), with a fresh sqlite tracking store per page.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUP_DIR = Path(__file__).resolve().parent / "setup"
RUNNER = Path(__file__).resolve().parent / "run_examples.py"
RUN_LANGS = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
KNOWN_OPTIONS = {"setup", "fake-judge", "exit", "file"}

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
_COMMENT = re.compile(r"^\s*<!--\s*(?P<body>.*?)\s*-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    lang: str  # python, bash, or file (written out, see ``file=``)
    code: str
    options: dict  # from <!-- example: ... -->
    skip: str | None  # the reason, "" when a skip gave none, None when the block runs

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """The Markdown files whose examples run: README.md and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _markers(lines: list[str], fence_index: int) -> tuple[dict, str | None]:
    """The options and skip reason of the comments directly above line ``fence_index``."""
    options: dict = {}
    skip = None
    i = fence_index - 1
    while i >= 0 and (match := _COMMENT.match(lines[i])):
        body = match.group("body")
        if body == "skip" or body.startswith("skip:"):
            skip = body[len("skip"):].lstrip(":").strip()
        elif body.startswith("example:"):
            for item in filter(None, (part.strip() for part in body[len("example:"):].split(","))):
                key, _, value = item.partition("=")
                if key.strip() not in KNOWN_OPTIONS:
                    raise ValueError(f"line {i + 1}: unknown example option {key.strip()!r}; known: "
                                     f"{sorted(KNOWN_OPTIONS)}")
                options[key.strip()] = value.strip() or True
        i -= 1
    return options, skip


def blocks(path: Path) -> list[Block]:
    """The runnable blocks of one Markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, ticks, lang = match.group("indent"), match.group("ticks"), match.group("lang").lower()
        close = re.compile(rf"^{re.escape(indent)}{re.escape(ticks[0])}{{{len(ticks)},}}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        options, skip = _markers(lines, i)
        if lang in RUN_LANGS or "file" in options:
            body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:j]]
            kind = "file" if "file" in options else RUN_LANGS[lang]
            found.append(Block(str(path.relative_to(ROOT)), i + 1, kind, "\n".join(body) + "\n", options, skip))
        i = j + 1
    return found


def page_env(tmp_path: Path) -> dict[str, str]:
    """A page's environment: this process's, with the page's own store and judge cache and the
    venv's commands first on PATH. This process's environment is left as it is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_EXPERIMENT", "MLFLOW_RUN_ID"))}
    env.update({
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "MLFLOW_RAG_EVAL_CACHE_DIR": str(tmp_path / "judge_cache"),
        "MLFLOW_RAG_EVAL_PROGRESS": "0",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "MLFLOW_GENAI_EVAL_MAX_WORKERS": "2",  # see docs/how-to/genai-scorers.md (sqlite and threads)
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        "DOCS_REPO_ROOT": str(ROOT),  # the setups' way to the example data
    })
    return env


def make_store(path: Path) -> None:
    """A migrated, empty sqlite tracking store at ``path``: made once, copied for every page
    (MLflow's migrations of a fresh store take about 9 s, more than most pages' examples)."""
    code = "import mlflow, sys; mlflow.MlflowClient(sys.argv[1]).search_experiments()"
    subprocess.run([sys.executable, "-c", code, f"sqlite:///{path}"], cwd=path.parent, check=True,
                   capture_output=True, timeout=300)


def copy_store(template: Path, tmp_path: Path, work: Path) -> None:
    """The template store as the page's ``mlflow.db``, its default experiment's artifacts in ``work``."""
    shutil.copy(template, tmp_path / "mlflow.db")
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                   ((work / "mlruns" / "0").as_uri(),))


def run_page(page: str, tmp_path: Path, template: Path | None = None) -> tuple[int, str, list[Block]]:
    """Run the page's blocks that are not skipped; returns the runner's exit code, its output and
    the blocks it was given."""
    runnable = [b for b in blocks(ROOT / page) if b.skip is None]
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps([{"where": b.where, "lang": b.lang, "code": b.code, "options": b.options}
                                for b in runnable]), encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    if template is not None:
        copy_store(template, tmp_path, work)
    done = subprocess.run([sys.executable, str(RUNNER), str(spec)], cwd=work, env=page_env(tmp_path),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    return done.returncode, done.stdout + done.stderr, runnable
