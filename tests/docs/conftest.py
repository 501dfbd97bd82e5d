"""The documentation tests' summary: how many doc examples ran, and every skipped one with its
reason, printed at the end of the session."""

from __future__ import annotations

import sys


def pytest_terminal_summary(terminalreporter):
    module = sys.modules.get("test_doc_examples")
    if module is None or not module.EXECUTED:
        return
    skipped = [b for found in module.BLOCKS.values() for b in found if b.skip is not None]
    terminalreporter.write_line(
        f"doc examples: {sum(module.EXECUTED.values())} executed on {len(module.EXECUTED)} pages, "
        f"{len(skipped)} skipped with a reason, {sum(1 for b in skipped if not b.skip)} without")
    for block in skipped:
        terminalreporter.write_line(f"  skipped {block.where}: {block.skip or '(no reason!)'}")
