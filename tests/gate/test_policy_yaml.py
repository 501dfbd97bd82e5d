"""Policy files are read strictly (``gate/policy.py``): a key given twice, and YAML anchors and
aliases, are refused naming the key and its line, before anything is built or validated."""

from __future__ import annotations

import time
import tracemalloc

import mlflow
import pytest
from click.testing import CliRunner

from mlflow_rag_eval.cli import main
from mlflow_rag_eval.gate import PolicyError, load_policy

pytest_plugins = ["gate_support"]  # its fixture: registry, a fresh sqlite registry per test

WEAKENED = """\
require_metrics: [faithfulness]
floors:
  faithfulness/mean: 0.85
  faithfulness/p10: 0.5
  faithfulness/mean: 0.1
"""


def _refused(tmp_path, text: str) -> PolicyError:
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    return info.value


def test_a_floor_given_twice_is_refused_naming_the_key_and_both_lines(tmp_path):
    """Today's bug: YAML keeps the last value, so the second, lower floor replaced the first and a
    0.40 candidate passed a policy whose reviewer read 0.85."""
    error = _refused(tmp_path, WEAKENED)
    assert error.key == "floors.faithfulness/mean"
    assert str(error) == (f"gate policy: floors.faithfulness/mean: duplicate key 'faithfulness/mean' at line 5 of "
                          f"{tmp_path / 'gate.yaml'} (first at line 3): YAML would keep the last value silently; "
                          "write each key once")
    once = tmp_path / "once.yaml"
    once.write_text(WEAKENED.rsplit("  faithfulness/mean: 0.1\n", 1)[0])
    assert load_policy(once).floors == {"faithfulness/mean": 0.85, "faithfulness/p10": 0.5}


@pytest.mark.parametrize("text, key, where", [
    ("require_metrics: [faithfulness]\nmin_scored_rows: 30\nmin_scored_rows: 1\n", "min_scored_rows",
     "at line 3 of {path} (first at line 2)"),
    ("calibration:\n  required: true\n  min_labels: 50\n  required: false\n", "calibration.required",
     "at line 4 of {path} (first at line 2)"),
    ("slice_floors:\n  difficulty:\n    hard: {faithfulness/mean: 0.6, faithfulness/mean: 0.2}\n",
     "slice_floors.difficulty.hard.faithfulness/mean", "at line 3, column 36 of {path} (first at column 12)"),
    # JSON is YAML and is read by the same loader: a duplicate key is refused there too
    ('{"require_metrics": ["faithfulness"], "floors": {"faithfulness/mean": 0.9, "faithfulness/mean": 0.1}}',
     "floors.faithfulness/mean", "at line 1, column 76 of {path} (first at column 50)"),
    # the same key spelt two ways (0x1 is the integer 1)
    ("slice_floors:\n  turns:\n    1: {faithfulness/mean: 0.6}\n    0x1: {faithfulness/mean: 0.2}\n",
     "slice_floors.turns.0x1", "at line 4 of {path} (first at line 3)"),
])
def test_a_key_given_twice_is_refused_at_any_depth(tmp_path, text, key, where):
    error = _refused(tmp_path, text)
    assert error.key == key
    assert f"duplicate key {key.rsplit('.', 1)[-1]!r} {where.format(path=tmp_path / 'gate.yaml')}" in str(error)


def test_a_merge_key_is_refused(tmp_path):
    """``<<`` merges a mapping whose keys the mapping's own override, silently: a duplicate by
    another name."""
    error = _refused(tmp_path, "require_metrics: [faithfulness]\n"
                               "floors: {<<: {faithfulness/mean: 0.9}, faithfulness/mean: 0.1}\n")
    assert error.key == "floors.<<" and "YAML merge key at line 2" in str(error)


def _bomb(levels: int = 6, width: int = 10) -> str:
    """A billion-laughs list: ``levels`` anchors, each ``width`` aliases of the one before,
    ``width ** levels`` strings once expanded. A million, not a billion: were the anchors read
    again, the test would fail in seconds (about 3 s, 17 MB) instead of taking the machine down."""
    items = ["&l0 [" + ", ".join(["lol"] * width) + "]"]
    items += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


BOMBS = {
    "calibration.extra[0]": f"require_metrics: [faithfulness]\ncalibration:\n  required: false\n  extra: {_bomb()}\n",
    "slice_floors.tags.*.faithfulness/mean[0]": f'slice_floors:\n  tags:\n    "*": {{faithfulness/mean: {_bomb()}}}\n',
}


def _measured(call):
    """``call()``'s result, seconds and peak traced memory (bytes)."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        result = call()
    finally:
        seconds = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return result, seconds, peak


@pytest.mark.parametrize("key", BOMBS)
def test_an_alias_bomb_is_refused_before_it_expands(tmp_path, key):
    """Today's bug: the aliases were expanded before validation (6.4 GB and 39 s under
    calibration.extra; killed at 23.8 GB under slice_floors). Refused at the first anchor."""
    path = tmp_path / "gate.yaml"
    path.write_text(BOMBS[key])
    load_policy({"require_metrics": ["faithfulness"]})  # the policy model's first use, outside the count

    def load():
        with pytest.raises(PolicyError) as info:
            load_policy(path)
        return info.value

    error, seconds, peak = _measured(load)
    assert peak < 1_000_000, f"{peak} bytes traced while refusing the policy"
    assert seconds < 2.0
    assert error.key == key
    assert str(error) == (f"gate policy: {key}: YAML anchor &l0 at line {BOMBS[key].count(chr(10))} of {path}: "
                          "a policy has no use for anchors and aliases (&name, *name), and expanding them can "
                          "take gigabytes; write each value out")


def test_an_alias_alone_is_refused_too(tmp_path):
    """An alias of an anchor: the anchor is refused first, where it is defined; an alias of
    nothing is refused as an alias (YAML would call it undefined)."""
    error = _refused(tmp_path, "require_metrics: [faithfulness]\nfloors:\n  faithfulness/mean: *low\n")
    assert error.key == "floors.faithfulness/mean" and "YAML alias *low at line 3" in str(error)


def _gate_cli(policy) -> tuple[object, float, int]:
    return _measured(lambda: CliRunner().invoke(main, [
        "gate", "--model", "m", "--candidate", "1", "--policy", str(policy),
        "--tracking-uri", mlflow.get_tracking_uri()]))


def test_the_cli_refuses_a_duplicate_key_and_an_alias_bomb_in_one_line(registry, tmp_path):
    """Exit 2, one line, nothing recorded: the policy is refused before the registry is read
    (no model ``m`` exists; its absence is not what is reported)."""
    duplicated = tmp_path / "duplicated.yaml"
    duplicated.write_text(WEAKENED)
    result, _, _ = _gate_cli(duplicated)  # also the first call, which imports the gate
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.endswith(f"m v1: unusable input: gate policy: floors.faithfulness/mean: duplicate key "
                         f"'faithfulness/mean' at line 5 of {duplicated} (first at line 3): YAML would "
                         "keep the last value silently; write each key once")
    as_json = tmp_path / "duplicated.json"  # a JSON policy: the same refusal
    as_json.write_text('{"require_metrics": ["faithfulness"],\n "require_metrics": []}')
    result, _, _ = _gate_cli(as_json)
    assert result.exit_code == 2 and "duplicate key 'require_metrics' at line 2" in result.output
    for key, text in BOMBS.items():
        bomb = tmp_path / "bomb.yaml"
        bomb.write_text(text)
        result, seconds, peak = _gate_cli(bomb)
        assert result.exit_code == 2, result.output
        (line,) = result.output.strip().splitlines()
        assert f"m v1: unusable input: gate policy: {key}: YAML anchor &l0 at line" in line
        assert "a policy has no use for anchors and aliases" in line
        assert seconds < 2.0 and peak < 2_000_000, (seconds, peak)
    assert not registry.search_registered_models()  # nothing recorded


# -- what a policy path may be: a regular file, at most 1 MB ----------------------------------------
def _load_refused(path) -> str:
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    return str(info.value)


def test_a_policy_path_to_a_device_is_refused_without_reading_it(tmp_path):
    """A symlink to /dev/zero read until memory ran out (exit 3 after 13 s under a 4 GB limit)."""
    link = tmp_path / "gate.yaml"
    link.symlink_to("/dev/zero")
    start = time.monotonic()
    message = _load_refused(link)
    assert time.monotonic() - start < 1.0
    assert message == (f"gate policy: {link}: {link} (-> /dev/zero) is a character device: a policy must be a "
                       "regular file")


def test_a_policy_path_to_a_fifo_is_refused_not_waited_on(tmp_path):
    import os

    fifo = tmp_path / "gate.yaml"
    os.mkfifo(fifo)
    start = time.monotonic()
    assert _load_refused(fifo) == f"gate policy: {fifo}: {fifo} is a FIFO (named pipe): a policy must be a regular file"
    assert time.monotonic() - start < 1.0


def test_a_policy_file_over_one_megabyte_is_refused_unread(tmp_path):
    big = tmp_path / "gate.yaml"
    with open(big, "wb") as f:
        f.write(b"require_metrics: [faithfulness]\n")
        f.truncate(300 * 2**20)  # 300 MB, sparse
    assert _load_refused(big) == (f"gate policy: {big}: the policy file is {300 * 2**20} bytes, over the 1048576 byte "
                                  "limit: a policy is a few dozen lines")
    folder = tmp_path / "policies"
    folder.mkdir()
    assert _load_refused(folder).endswith(f"{folder} is a folder: a policy must be a regular file")


def test_a_policy_behind_a_symlink_to_a_regular_file_is_read(tmp_path):
    real = tmp_path / "real.yaml"
    real.write_text("require_metrics: [faithfulness]\n")
    link = tmp_path / "gate.yaml"
    link.symlink_to(real)
    assert load_policy(link).require_metrics == ("faithfulness",)
