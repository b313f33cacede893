"""Packaging metadata: PEP 639 licence, one version, and an sdist that carries what a distribution packager needs.

The sdist is built offline from a copy of the tree with the installed setuptools' PEP 517 backend (about 2 s), the
way ``python -m build --sdist`` does it after installing ``[build-system] requires``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
from importlib import metadata
from pathlib import Path

import pytest

import profwatch
import rankhook
from rankhook.version import UNKNOWN_VERSION, distribution_version, tree_version
from tests.conftest import PYTHON, REPO_ROOT, python_env

CARRIED = ("systemd", "dashboards", "docs", "constraints", "tests", "bench")
"""Folders the sdist carries whole: units, sysusers/tmpfiles files, alert rules, dashboard, docs, pins, tests."""

_JUNK = shutil.ignore_patterns(".git", ".venv", "venv", "__pycache__", "*.pyc", "*.egg-info", "build", "dist", "out",
                               ".ruff_cache", ".mypy_cache", ".pytest_cache", "profwatch-demo", "profwatch-analysis")


def _tracked_files(folder: Path) -> set[str]:
    return {p.relative_to(REPO_ROOT).as_posix() for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
            and not p.relative_to(REPO_ROOT).as_posix().startswith("bench/out/")}


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> tuple[tarfile.TarFile, str]:
    tree = tmp_path_factory.mktemp("sdist") / "tree"
    shutil.copytree(REPO_ROOT, tree, ignore=_JUNK)
    out = tree.parent / "out"
    proc = subprocess.run([PYTHON, "-c", f"from setuptools import build_meta\nprint(build_meta.build_sdist({str(out)!r}))"],
                          cwd=tree, env=python_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    name = proc.stdout.strip().splitlines()[-1]
    return tarfile.open(out / name), proc.stdout + proc.stderr


def test_the_sdist_builds_without_a_deprecation(sdist: tuple[tarfile.TarFile, str]) -> None:
    _, log = sdist
    assert "deprecat" not in log.lower(), log[-3000:]


def test_the_sdist_carries_units_dashboards_docs_constraints_and_tests(sdist: tuple[tarfile.TarFile, str]) -> None:
    tar, _ = sdist
    top = tar.getnames()[0].split("/")[0]
    members = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for folder in CARRIED:
        missing = _tracked_files(REPO_ROOT / folder) - members
        assert not missing, f"{folder}/ files not in the sdist: {sorted(missing)[:10]}"
    for must in ("systemd/profwatch-node.service", "systemd/profwatch-coordinator.service",
                 "systemd/sysusers.d/profwatch.conf", "systemd/tmpfiles.d/profwatch.conf",
                 "dashboards/profwatch-grafana.json", "dashboards/profwatch-alerts.rules.yml",
                 "constraints/coordinator.txt", "LICENSE", "daemon/profwatch/__init__.py", "rankhook/version.py"):
        assert must in members
    assert not [n for n in members if "__pycache__" in n or n.endswith(".pyc")]
    pkg_info = tar.extractfile(f"{top}/PKG-INFO")
    assert pkg_info is not None
    meta = pkg_info.read().decode()
    assert "License-Expression: Apache-2.0" in meta
    assert "License-File: LICENSE" in meta
    assert "Classifier: License ::" not in meta
    assert f"Version: {tree_version(REPO_ROOT / 'pyproject.toml')}" in meta


def test_the_version_is_written_once_in_pyproject() -> None:
    version = tree_version(REPO_ROOT / "pyproject.toml")
    assert version is not None and re.fullmatch(r"\d+\.\d+\.\d+\S*", version)
    assert profwatch.__version__ == version
    assert rankhook.__version__ == version
    for init in (REPO_ROOT / "daemon/profwatch/__init__.py", REPO_ROOT / "rankhook/__init__.py"):
        assert not re.search(r"__version__\s*=\s*['\"]", init.read_text())


def test_a_file_outside_any_install_or_tree_has_an_unknown_version(tmp_path: Path) -> None:
    pkg = tmp_path / "a" / "b" / "profwatch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    # The metadata of an installed profwatch does not hold this file: with no tree either, it falls back to that
    # install's version (an editable install whose tree moved) or, with none installed, to UNKNOWN_VERSION.
    got = distribution_version(str(pkg / "__init__.py"), 2)
    try:
        expected = metadata.version("profwatch")
    except metadata.PackageNotFoundError:
        expected = UNKNOWN_VERSION
    assert got == expected
    (tmp_path / "a" / "pyproject.toml").write_text('[project]\nname = "profwatch"\nversion = "9.8.7"\n')
    assert distribution_version(str(pkg / "__init__.py"), 2) == "9.8.7"
    (tmp_path / "a" / "pyproject.toml").write_text('[project]\nname = "other"\nversion = "9.8.7"\n')
    assert distribution_version(str(pkg / "__init__.py"), 2) == expected


def test_a_tree_on_the_path_reports_its_own_version_not_an_installed_one(tmp_path: Path) -> None:
    """A copy of the rank hook put on a job's PYTHONPATH, beside a pyproject.toml of another version."""
    shutil.copytree(REPO_ROOT / "rankhook", tmp_path / "rankhook", ignore=_JUNK)
    text = (REPO_ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(re.sub(r'(?m)^version = "[^"]+"', 'version = "7.7.7"', text, count=1))
    proc = subprocess.run([PYTHON, "-c", "import rankhook; print(rankhook.__version__)"], cwd=tmp_path,
                          env={**python_env(), "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "7.7.7"
