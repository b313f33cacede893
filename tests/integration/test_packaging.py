"""Packaging: declared dependencies cover what the code imports, package data exists and ships, the console script
explains a missing extra, ``python -m rankhook.autoinstall`` installs its .pth into a fresh virtual env, the sdist
carries what a distribution packager needs (units, dashboards, docs, constraints, tests) and builds without a
deprecation, and the version is written once (pyproject.toml)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import profwatch
import rankhook
from rankhook.version import UNKNOWN_VERSION, distribution_version, tree_version
from tests.conftest import PYTHON, REPO_ROOT, python_env

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _req_names(reqs: list[str]) -> set[str]:
    names = set()
    for r in reqs:
        name = re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]
        names.add(re.sub(r"[-_.]+", "-", name).lower())
    return names


def _extra(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """Distribution names of an extra, following ``profwatch[...]`` self-references, plus the base deps."""
    project = PYPROJECT["project"]
    out = _req_names(project["dependencies"])
    for req in project["optional-dependencies"][name]:
        m = re.match(r"profwatch\[([\w,]+)\]", req)
        if m:
            for sub in m.group(1).split(","):
                if sub not in seen:
                    out |= _extra(sub, seen | {name})
        else:
            out |= _req_names([req])
    return out - {"profwatch"}


def _third_party_imports(files: list[Path]) -> dict[str, list[str]]:
    """Top-level module -> files importing it, for modules that are not stdlib and not ours."""
    found: dict[str, list[str]] = {}
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for n in names:
                top = n.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("profwatch", "rankhook", "tests", "torch_npu"):
                    found.setdefault(top, []).append(str(f.relative_to(REPO_ROOT)))
    return found


def _dists_of(module: str) -> set[str]:
    """Installed distributions providing ``module``; its own name when none is installed here (e.g. tomli, a
    Python < 3.11 fallback imported under a version guard)."""
    dists = importlib.metadata.packages_distributions().get(module) or [module]
    return {re.sub(r"[-_.]+", "-", d).lower() for d in dists}


@pytest.mark.parametrize(("extra", "where", "exclude"), [
    # the daemons and the CLI, without the demo/simulation commands (they need torch: the `torch` extra)
    ("daemon", "daemon", ("daemon/profwatch/simulate/", "daemon/profwatch/commands/demo.py", "daemon/profwatch/commands/simulate.py")),
    # the rank hook: base install (pyzmq); torch / torch_npu are imported lazily from the job's own environment
    ("hook", "rankhook", ()),
    # the benchmarks run from a test install (psutil: bench_ingest)
    ("test", "bench", ()),
])
def test_every_imported_package_is_declared(extra: str, where: str, exclude: tuple[str, ...]) -> None:
    files = [f for f in sorted((REPO_ROOT / where).rglob("*.py"))
             if not str(f.relative_to(REPO_ROOT)).startswith(exclude)]
    declared = _extra(extra)
    missing = {}
    for module, users in _third_party_imports(files).items():
        if module == "torch" and where in ("rankhook", "bench"):
            continue
        if (REPO_ROOT / where / f"{module}.py").exists():
            continue  # a sibling script (bench_alert_latency imports scan_tree_bench)  # the training job's own torch, imported lazily inside the torch backends
        dists = _dists_of(module)
        if not dists & declared:
            missing[module] = (sorted(dists), users[:3])
    assert not missing, f"imported but not declared in the {extra!r} extra: {missing}"


def test_license_file_matches_the_declared_license() -> None:
    """PEP 639: an SPDX expression and the files it names; no License classifier (deprecated beside it). The sdist
    carries the HTA test traces (MIT) in tests/data/real_traces/: the expression and the licence files say so."""
    assert PYPROJECT["project"]["license"] == "Apache-2.0 AND MIT"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE", "tests/data/real_traces/LICENSE.HolisticTraceAnalysis"]
    hta = (REPO_ROOT / "tests/data/real_traces/LICENSE.HolisticTraceAnalysis").read_text(encoding="utf-8")
    assert hta.startswith("MIT License")
    assert not [c for c in PYPROJECT["project"]["classifiers"] if c.startswith("License ::")]
    assert any(re.fullmatch(r"setuptools>=(\d+)", r) and int(r.split(">=")[1]) >= 77
               for r in PYPROJECT["build-system"]["requires"])
    text = (REPO_ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text


def test_the_constraints_file_pins_the_coordinator_ranges_within_them() -> None:
    """constraints/coordinator.txt (README's install) pins a version of each ranged coordinator library inside
    the range pyproject.toml declares."""
    from packaging.requirements import Requirement

    pins = {}
    for line in (REPO_ROOT / "constraints" / "coordinator.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    for req in PYPROJECT["project"]["optional-dependencies"]["coordinator"]:
        r = Requirement(req)
        if r.name == "profwatch":
            continue
        name = re.sub(r"[-_.]+", "-", r.name).lower()
        assert name in pins and r.specifier.contains(pins[name]), (req, pins.get(name))
    readme = (REPO_ROOT / "README.md").read_text()
    assert "-c constraints/coordinator.txt" in readme


def test_declared_package_data_exists() -> None:
    roots = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"]
    for package, patterns in PYPROJECT["tool"]["setuptools"]["package-data"].items():
        folder = next(REPO_ROOT / r / package for r in roots if (REPO_ROOT / r / package).is_dir())
        for pattern in patterns:
            assert list(folder.glob(pattern)), f"package data {package}/{pattern} matches nothing"


@pytest.mark.slow
def test_wheel_ships_the_package_data(tmp_path: Path) -> None:
    pytest.importorskip("setuptools")
    out = subprocess.run([PYTHON, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                          str(tmp_path), str(REPO_ROOT)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    wheel = next(tmp_path.glob("profwatch-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for want in ("profwatch/py.typed", "rankhook/py.typed", "profwatch/console.py",
                 "profwatch/simulate/fake_torch_npu/torch_npu/profiler/dynamic_profile.py"):
        assert want in names, f"{want} missing from {wheel.name}"
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "profwatch = profwatch.console:main" in zipfile.ZipFile(wheel).read(entry).decode()


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual env without pip and without any of our dependencies (the 'base install' worst case)."""
    root = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    return root


def _bare(venv: Path, args: list[str], extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = python_env()
    env.pop("PROFWATCH", None)
    env.update(extra_env or {})
    return subprocess.run([str(venv / "bin" / "python"), *args], env=env, capture_output=True, text=True, timeout=120)


def test_console_script_without_the_node_extra_says_what_to_install(bare_venv: Path) -> None:
    res = _bare(bare_venv, ["-c", "import sys; sys.argv = ['profwatch', 'status']; from profwatch.console import main; "
                                  "main()"])
    assert res.returncode == 2, res.stderr
    assert "pip install 'profwatch[node]'" in res.stderr and "Traceback" not in res.stderr


def test_autoinstall_installs_into_a_fresh_venv_and_uninstalls(bare_venv: Path) -> None:
    site_dir = Path(_bare(bare_venv, ["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
                    .stdout.strip())
    assert site_dir.is_relative_to(bare_venv)
    res = _bare(bare_venv, ["-m", "rankhook.autoinstall", "--install"])
    assert res.returncode == 0, res.stderr
    pth = site_dir / "profwatch.pth"
    from rankhook.autoinstall import PTH_LINE

    assert f"wrote {pth}" in res.stdout and pth.read_text() == PTH_LINE and PTH_LINE.startswith("import os;")
    probe = ("import sys, rankhook.autoinstall as a; "
             "print(a._INSTALLER is not None, any(type(f).__name__ == '_TorchOptimFinder' for f in sys.meta_path))")
    assert _bare(bare_venv, ["-c", probe], {"PROFWATCH": "1"}).stdout.split() == ["True", "True"]  # ran at start-up
    assert _bare(bare_venv, ["-c", probe]).stdout.split() == ["False", "False"]  # inert without PROFWATCH=1
    # without PROFWATCH=1 the .pth imports nothing of ours (no start-up cost), so running the module's CLI does not
    # warn that it found itself imported already (before: RuntimeWarning on every --help/--uninstall)
    loaded = "import sys; print('rankhook.autoinstall' in sys.modules)"
    assert _bare(bare_venv, ["-c", loaded]).stdout.split() == ["False"]
    res = _bare(bare_venv, ["-W", "error::RuntimeWarning", "-m", "rankhook.autoinstall", "--help"])
    assert res.returncode == 0 and "RuntimeWarning" not in res.stderr, res.stderr
    res = _bare(bare_venv, ["-m", "rankhook.autoinstall", "--uninstall"])
    assert res.returncode == 0 and f"removed {pth}" in res.stdout and not pth.exists()
    res = _bare(bare_venv, ["-m", "rankhook.autoinstall", "--uninstall"])
    assert res.returncode == 0 and "nothing to remove" in res.stdout


def test_autoinstall_reports_an_unwritable_target(tmp_path: Path) -> None:
    res = subprocess.run([PYTHON, "-m", "rankhook.autoinstall", "--install", "--site-dir", str(tmp_path / "nope")],
                         env=python_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "cannot write profwatch.pth" in res.stderr and not res.stdout
    res = subprocess.run([PYTHON, "-m", "rankhook.autoinstall"], env=python_env(), capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "one of the arguments --install --uninstall is required" in res.stderr


# -- the sdist and the version (issue 30) ----------------------------------------------------------------------------
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
    assert "License-Expression: Apache-2.0 AND MIT" in meta
    assert "License-File: LICENSE" in meta
    assert "License-File: tests/data/real_traces/LICENSE.HolisticTraceAnalysis" in meta
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
