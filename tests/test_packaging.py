"""The package's own metadata, as pip builds it on every install (issue 45: setuptools printed
"`project.license` as a TOML table is deprecated" three times in `make demo`)."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT  # noqa: E402

BUILD_METADATA = "from setuptools import build_meta; import sys; build_meta.prepare_metadata_for_build_wheel(sys.argv[1])"


def test_the_metadata_builds_without_a_deprecation_warning_and_names_the_licence_by_spdx(tmp_path):
    done = subprocess.run([sys.executable, "-c", BUILD_METADATA, str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "deprecat" not in (done.stdout + done.stderr).lower(), done.stderr
    (metadata,) = tmp_path.glob("*.dist-info/METADATA")
    assert "License-Expression: Apache-2.0" in metadata.read_text().splitlines()
