"""Reading a policy file: what it must be (a regular file, small, read in time) and the strict
YAML reader that refuses what YAML accepts silently and a policy must not (duplicate keys,
merge keys, anchors and aliases). :func:`~mlflow_rag_eval.gate.policy.load_policy` reads a
policy file through :func:`read_policy_text`; the policy's model and its validation live in
:mod:`mlflow_rag_eval.gate.policy`.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

__all__ = ["MAX_POLICY_BYTES", "POLICY_READ_DEADLINE_S", "PolicyError", "dotted", "read_policy_text"]


class PolicyError(ValueError):
    """The policy cannot be used: the message names the key at fault."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"gate policy: {key}: {message}")


#: the largest policy file read (a policy is a few dozen lines; this is a thousand times more)
MAX_POLICY_BYTES = 1 << 20
#: how long reading a policy file may take (a slow network mount)
POLICY_READ_DEADLINE_S = 10.0


def _read_policy_file(path: Path) -> bytes:
    """The bytes of a policy file: a regular file after symlinks are resolved, of at most
    :data:`MAX_POLICY_BYTES`, read within :data:`POLICY_READ_DEADLINE_S`. Opened without
    blocking and checked on the open descriptor, so a FIFO or device swapped in after the
    check is refused too, never read until memory runs out or waited on forever.

    Raises:
        PolicyError: not a regular file, too large, or too slow to read (naming why).
        OSError: the file cannot be opened or read.
    """
    import os
    import stat
    import time

    resolved = path.resolve(strict=True)
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))

    def refuse_unless_regular(mode: int) -> None:
        if not stat.S_ISREG(mode):
            what = next((name for test, name in kinds if test(mode)), "not a regular file")
            shown = str(path) if resolved == path.absolute() else f"{path} (-> {resolved})"
            raise PolicyError(str(path), f"{shown} is {what}: a policy must be a regular file")

    refuse_unless_regular(os.stat(resolved).st_mode)
    fd = os.open(resolved, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        info = os.fstat(fd)
        refuse_unless_regular(info.st_mode)
        if info.st_size > MAX_POLICY_BYTES:
            raise PolicyError(str(path), f"the policy file is {info.st_size} bytes, over the {MAX_POLICY_BYTES} "
                                         "byte limit: a policy is a few dozen lines")
        deadline = time.monotonic() + POLICY_READ_DEADLINE_S
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_POLICY_BYTES:  # grew since it was checked
                raise PolicyError(str(path), f"the policy file is over the {MAX_POLICY_BYTES} byte limit")
            if time.monotonic() > deadline:
                raise PolicyError(str(path), f"reading the policy file took over {POLICY_READ_DEADLINE_S:g} s")
    finally:
        os.close(fd)


# -- the strict YAML reader: what YAML accepts silently and a policy must not ----------------------
def _read_yaml(text: str, path: Path) -> Any:
    """The document of a policy file, read by :func:`_strict_loader`'s rules.

    Raises:
        PolicyError: a duplicate key, a merge key, an anchor or an alias (naming key and line).
        yaml.YAMLError: text that is not YAML.
    """
    loader = _strict_loader()(text, path)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


@functools.cache
def _strict_loader() -> type:
    """A ``yaml.SafeLoader`` that refuses, while composing (before any value is built):

    * a key given twice in one mapping, at any depth. YAML keeps the last one silently, so a
      second ``faithfulness/mean: 0.1`` under ``floors`` would weaken the floor that a reviewer
      reads on the line above it. ``<<`` merge keys too: the keys they merge are overridden
      by the mapping's own, silently, in the same way;
    * an anchor (``&name``) or alias (``*name``). A policy has no use for them (it is a few
      dozen scalars), and a few lines of nested aliases (a "billion laughs") expand to
      billions of values once built or validated: gigabytes and minutes before the unknown
      key they sit under is reported. Refused at the first anchor's event, nothing expanded.

    Built on first use, so that importing the policy module does not import PyYAML.
    """
    import yaml

    class StrictPolicyLoader(yaml.SafeLoader):
        def __init__(self, stream: str, path: Path):
            super().__init__(stream)
            self.policy_file = str(path)
            self.keys: list[str | int | None] = []  # where the node being composed sits

        def _where(self, *more: str | int) -> str:
            return dotted(tuple(k for k in (*self.keys, *more) if k is not None))

        def compose_node(self, parent, index):
            self.keys.append(index.value if isinstance(index, yaml.ScalarNode) else
                             index if isinstance(index, int) else None)
            try:
                event = self.peek_event()
                if event.anchor is not None:  # an AliasEvent's anchor is the name it refers to
                    sign, what = ("*", "alias") if isinstance(event, yaml.AliasEvent) else ("&", "anchor")
                    raise PolicyError(self._where(), (
                        f"YAML {what} {sign}{event.anchor} at line {event.start_mark.line + 1} of "
                        f"{self.policy_file}: a policy has no use for anchors and aliases (&name, *name), "
                        "and expanding them can take gigabytes; write each value out"))
                return super().compose_node(parent, index)
            finally:
                self.keys.pop()

        def compose_mapping_node(self, anchor):
            node = super().compose_mapping_node(anchor)
            first: dict[Any, Any] = {}  # key -> its first mark
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise PolicyError(self._where("<<"), (
                        f"YAML merge key at line {key_node.start_mark.line + 1} of {self.policy_file}: the mapping's own keys "
                        "override the merged ones silently; write each key once"))
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # a list or mapping as a key: the constructor refuses it
                key = self.construct_object(key_node)
                if key in first:
                    here, there = _place(key_node.start_mark, first[key])
                    raise PolicyError(self._where(key_node.value), (
                        f"duplicate key {key_node.value!r} at {here} of {self.policy_file} (first at {there}): "
                        "YAML would keep the last value silently; write each key once"))
                first[key] = key_node.start_mark
            return node

    return StrictPolicyLoader


def _place(mark, first) -> tuple[str, str]:
    """Where a duplicate key and its first occurrence are: lines, with columns when they share
    one (a JSON policy on a single line)."""
    if mark.line != first.line:
        return f"line {mark.line + 1}", f"line {first.line + 1}"
    return f"line {mark.line + 1}, column {mark.column + 1}", f"column {first.column + 1}"



def dotted(loc: tuple) -> str:
    """A pydantic location as a policy key: ``floors.faithfulness/mean``, ``require_metrics[0]``."""
    key = ""
    for part in loc:
        if part == "[key]":
            continue
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key or "<policy>"




def read_policy_text(path: Path) -> Any:
    """The document of the policy file at ``path`` (None when it is empty).

    Raises:
        PolicyError: unreadable (naming why), not UTF-8, not YAML, or refused by the strict reader.
    """
    import yaml

    try:
        text = _read_policy_file(path).decode("utf-8")
    except OSError as exc:
        raise PolicyError(str(path), f"cannot read the policy file ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise PolicyError(str(path), f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                                     f"{exc.start}); save the policy as UTF-8") from None
    try:
        return _read_yaml(text, path)
    except yaml.YAMLError as exc:
        raise PolicyError(str(path), "not valid YAML: " + " ".join(str(exc).split())) from None
