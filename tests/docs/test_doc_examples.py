"""Every fenced Python and shell example of the docs and the README runs (tests/docs/doc_blocks.py
says how blocks are marked), one subprocess per page against a fresh sqlite store, so the docs
cannot drift from the code. A block that cannot run says why; a skip without a reason fails."""

from __future__ import annotations

import re

import pytest
from doc_blocks import ROOT, SETUP_DIR, blocks, make_store, pages, run_page

#: page -> its blocks, for the pages that hold any
BLOCKS = {str(p.relative_to(ROOT)): found for p in pages() if (found := blocks(p))}
#: page -> examples that ran, for the session's summary (tests/docs/conftest.py prints it)
EXECUTED: dict[str, int] = {}


@pytest.fixture(scope="module")
def store_template(tmp_path_factory):
    path = tmp_path_factory.mktemp("store_template") / "mlflow.db"
    make_store(path)
    return path


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


@pytest.mark.parametrize("page", [p for p, found in BLOCKS.items() if any(b.skip is None for b in found)])
def test_page_examples_run(page, tmp_path, store_template):
    returncode, output, runnable = run_page(page, tmp_path, store_template)
    ok = re.findall(r"^DOC-EXAMPLE (\S+) ok", output, re.MULTILINE)
    EXECUTED[page] = len(ok)
    examples = [b for b in runnable if b.lang != "file"]
    assert returncode == 0 and len(ok) == len(examples), \
        f"{page}: {len(ok)} of {len(examples)} examples ran\n{output[-8000:]}"
