"""Every fenced Python and shell example of the docs and the README runs (tests/docs/doc_blocks.py
says how blocks are marked), one subprocess per page against a fresh sqlite store, so the docs
cannot drift from the code. A block that cannot run says why; a skip without a reason fails."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from doc_blocks import ROOT, SETUP_DIR, blocks, make_store, pages, run_page

#: page -> its blocks, for the pages that hold any
BLOCKS = {str(p.relative_to(ROOT)): found for p in pages() if (found := blocks(p))}
#: page -> examples that ran, for the session's summary (tests/docs/conftest.py prints it)
EXECUTED: dict[str, int] = {}


RUNNABLE = [p for p, found in BLOCKS.items() if any(b.skip is None for b in found)]
#: pages that run longest first (a JVM, most CLI processes), so the two lanes end together
SLOW_FIRST = ("docs/how-to/spark.md", "README.md", "docs/how-to/gate-ci.md", "docs/how-to/calibration-ppi.md")


@pytest.fixture(scope="module")
def page_runs(tmp_path_factory):
    """Every page's run, started at once, two at a time on two cores (a page is one process,
    mostly on one core): page -> a future of ``run_page``'s result. Each page has its own folder
    and store."""
    template = tmp_path_factory.mktemp("store_template") / "mlflow.db"
    make_store(template)
    order = sorted(RUNNABLE, key=lambda p: SLOW_FIRST.index(p) if p in SLOW_FIRST else len(SLOW_FIRST))
    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        yield {page: pool.submit(run_page, page, tmp_path_factory.mktemp("page"), template) for page in order}


def test_every_skip_says_why():
    counts = {"run": 0, "skipped": 0}
    bare = []
    for found in BLOCKS.values():
        for block in found:
            if block.lang == "file":
                pass
            elif block.skip is None:
                counts["run"] += 1
            else:
                counts["skipped"] += 1
                if not block.skip:
                    bare.append(block.where)
            if (setup := block.options.get("setup")) and not (SETUP_DIR / f"{setup}.py").is_file():
                bare.append(f"{block.where} (no setup {setup!r} in tests/docs/setup)")
    assert not bare, f"skipped without a reason (write <!-- skip: why -->): {bare}"
    assert counts["run"] >= 40, counts  # the docs' examples are found at all


@pytest.mark.parametrize("page", RUNNABLE)
def test_page_examples_run(page, page_runs):
    returncode, output, runnable = page_runs[page].result()
    ok = re.findall(r"^DOC-EXAMPLE (\S+) ok", output, re.MULTILINE)
    EXECUTED[page] = len(ok)
    examples = [b for b in runnable if b.lang != "file"]
    assert returncode == 0 and len(ok) == len(examples), \
        f"{page}: {len(ok)} of {len(examples)} examples ran\n{output[-8000:]}"
