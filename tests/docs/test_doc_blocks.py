"""How the doc-example collector reads a page: which fences are examples, and what the comment
above a block says (tests/docs/doc_blocks.py)."""

from __future__ import annotations

import pytest
from doc_blocks import blocks

PAGE = '''# A page

```python
print("runs")
```

<!-- skip: needs a paid judge -->
```bash
mlflow-rag-eval evaluate --judge openai:/gpt-4o
```

<!-- skip -->
```python
print("skipped, no reason")
```

<!-- example: setup=northwind, fake-judge -->
```sh
echo shell
```

<!-- example: file=gate.yaml -->
```yaml
floors: {faithfulness/mean: 0.8}
```

```yaml
not: an example
```

```
output, not an example
```

!!! note
    ```python
    print("indented in an admonition")
    ```
'''


@pytest.fixture
def page(tmp_path, monkeypatch):  # blocks() names pages relative to ROOT
    monkeypatch.setattr("doc_blocks.ROOT", tmp_path)
    path = tmp_path / "page.md"
    path.write_text(PAGE, encoding="utf-8")
    return path


def test_examples_and_their_markers(page):
    found = blocks(page)
    assert [(b.line, b.lang, b.skip) for b in found] == [
        (3, "python", None), (8, "bash", "needs a paid judge"), (13, "python", ""), (18, "bash", None),
        (23, "file", None), (36, "python", None),
    ]
    assert found[3].options == {"setup": "northwind", "fake-judge": True}
    assert found[4].options == {"file": "gate.yaml"} and found[4].code == "floors: {faithfulness/mean: 0.8}\n"
    assert found[5].code == 'print("indented in an admonition")\n'
    assert found[0].where == "page.md:3"


def test_an_unknown_option_is_refused(page):
    page.write_text("<!-- example: fake_judge -->\n```python\npass\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match="unknown example option 'fake_judge'"):
        blocks(page)
