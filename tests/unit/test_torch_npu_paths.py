"""The config paths torch_npu's dp.init refuses, by version (pure)."""

from __future__ import annotations

import pytest

from profwatch.core.capture.torch_npu_paths import check_config_path, path_problems, severity_of


@pytest.mark.parametrize(("version", "severity"), [
    ("2.1.0.post17", "raise"), ("2.1.0", "raise"), ("2.3.1.post7", "raise"), ("2.5.1", "raise"),
    ("2.6.0", "raise"), ("2.6.0.post6", "raise"), ("2.8.0.post5", "raise"),
    ("2.7.1.post6", "raise"), ("2.7.1.post7", "warn"),
    ("2.9.0.post4", "raise"), ("2.9.0.post5", "warn"),
    ("2.10.0.post2", "raise"), ("2.10.0.post3", "warn"),
    ("2.11.0", "raise"), ("2.11.0.post1", "warn"), ("2.12.0", "raise"), ("2.12.0.post1", "warn"),
    ("2.13.0", "warn"), ("2.14.0", "warn"), ("2.15.0+cpu", "warn"), ("3.0.0", "warn"),
    ("unknown", "raise"), ("", "raise"),
])
def test_each_version_raises_or_warns(version: str, severity: str) -> None:
    assert severity_of(version) == severity


@pytest.mark.parametrize(("path", "ok"), [
    ("/shared/pw/job_42/cfg", True), ("/shared/pw/job-42.v2/cfg", True), ("~/pw/cfg dir", True),
    ("/shared/数据/cfg", True),  # CJK unified ideographs are accepted
    ("/shared/pw/job@42/cfg", False), ("/shared/pw/job+42", False), ("/shared/pw/job:42", False),
    ("/shared/pw/ジョブ", False),  # katakana is outside U+4E00..U+9FA5
    ("/shared/" + "a" * 256, False), ("/" + "/".join(["a" * 200] * 21), False),  # a name > 255; path > 4096
])
def test_path_rules(path: str, ok: bool) -> None:
    assert (path_problems(path) == ()) is ok


def test_a_verdict_names_the_problem_the_version_and_the_fix() -> None:
    v = check_config_path("/shared/pw/job@42/cfg", "2.6.0")
    assert v is not None and v.severity == "raise" and "'@'" in v.problems[0]
    assert "dynamic_profile stays off" in v.detail() and "letters, digits" in v.detail()
    w = check_config_path("/shared/pw/job@42/cfg", "2.14.0")
    assert w is not None and w.severity == "warn" and "only warns" in w.detail()
    assert check_config_path("/shared/pw/job_42/cfg", "2.6.0") is None
    link = check_config_path("/shared/pw/cfg", "2.6.0", is_symlink=True)
    assert link is not None and link.problems == ("the path is a symbolic link",)
