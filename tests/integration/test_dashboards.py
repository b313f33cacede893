"""The shipped Grafana dashboard and Prometheus rules: the JSON is an importable dashboard, every query parses
(promtool, wrapped in a rules file), the rules pass `promtool check rules` and their own `promtool test rules`,
and every metric they name is exported by a live node daemon or coordinator (real processes, scraped)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO_ROOT, python_env, require_tool, scrape_metrics, wait_for
from tests.integration.sink_support import free_port

DASH = REPO_ROOT / "dashboards" / "profwatch-grafana.json"
RULES = REPO_ROOT / "dashboards" / "profwatch-alerts.rules.yml"
RULE_TESTS = REPO_ROOT / "dashboards" / "profwatch-alerts.test.yml"
WORKER = str(REPO_ROOT / "tests" / "fakes" / "rank_worker.py")
PROMETHEUS_BUILTINS = {"up"}  # series Prometheus makes itself for every scrape target
WHY = "dashboard queries and rules are checked by Prometheus' own promtool (.ci/run installs Debian's prometheus)"


def _dashboard() -> dict:
    return json.loads(DASH.read_text())


def _queries() -> list[str]:
    out = []
    for p in _dashboard()["panels"]:
        out.extend(t["expr"] for t in p.get("targets", []))
    return out


def _rule_exprs() -> list[str]:
    return re.findall(r"^\s+expr: (.+)$", RULES.read_text(), flags=re.M)


def _metric_names(exprs: list[str]) -> set[str]:
    names = set()
    for e in exprs:
        e = re.sub(r'"[^"]*"', '""', e)  # label values are not metric names
        names.update(n for n in re.findall(r"\b(profwatch_[a-z0-9_]+)\b", e))
        names.update(n for n in re.findall(r"\b([a-z_]+)\{", e) if n in PROMETHEUS_BUILTINS)
    return names


def test_dashboard_is_an_importable_grafana_dashboard() -> None:
    d = _dashboard()
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int)
    assert [i["name"] for i in d["__inputs"]] == ["DS_PROMETHEUS"] and d["__inputs"][0]["pluginId"] == "prometheus"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in d["panels"]:
        g = p["gridPos"]
        assert {"h", "w", "x", "y"} <= set(g) and 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)), p["title"]
    titles = " ".join(p["title"].lower() for p in d["panels"])
    for topic in ("jobs", "ranks", "step time", "drop", "captures by state", "analysis duration", "alert"):
        assert topic in titles, topic


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    promtool = require_tool("promtool", WHY)
    rules = {"groups": [{"name": "dashboard_queries", "rules": [
        {"record": f"profwatch_dashboard:query_{i}", "expr": q} for i, q in enumerate(_queries())]}]}
    f = tmp_path / "dashboard-queries.rules.yml"
    f.write_text(json.dumps(rules))  # JSON is YAML
    res = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(_queries())} rules found" in res.stdout


def test_alert_rules_check_and_their_unit_tests_pass() -> None:
    promtool = require_tool("promtool", WHY)
    res = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    names = set(re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), flags=re.M))
    assert {"ProfwatchNodeDaemonDown", "ProfwatchTelemetryDrops", "ProfwatchCaptureStuck",
            "ProfwatchAnalysisFailing"} <= names
    res = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def _exported(text: str) -> set[str]:
    return {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}


@pytest.mark.slow
def test_every_metric_named_is_exported_by_the_live_daemons(short_tmp: Path) -> None:
    ports = {k: free_port() for k in ("ingest", "control", "pub", "coord_metrics", "node_metrics", "dead")}
    cfg = short_tmp / "pw.toml"
    cfg.write_text(f"""
[coordinator]
ingest_bind = "tcp://127.0.0.1:{ports['ingest']}"
control_bind = "tcp://127.0.0.1:{ports['control']}"
pub_bind = "tcp://127.0.0.1:{ports['pub']}"
state_db = "{short_tmp / 'state.db'}"
work_dir = "{short_tmp / 'work'}"
metrics_port = {ports['coord_metrics']}
[node]
node_id = "nodeM"
bind = "ipc://{short_tmp}/node.sock"
coordinator = "tcp://127.0.0.1:{ports['ingest']}"
heartbeat_interval_s = 0.5
metrics_port = {ports['node_metrics']}
[alertmanager]
url = "http://127.0.0.1:{ports['dead']}"
resend_interval_s = 1.0
[logging]
format = "console"
""")
    procs = []
    logs = []

    def start(name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        log = open(short_tmp / f"{name}.log", "wb")  # noqa: SIM115
        logs.append(log)
        procs.append(subprocess.Popen(args, env=python_env(env), stdout=log, stderr=subprocess.STDOUT))

    try:
        start("coordinator", [PYTHON, "-m", "profwatch.cli", "coordinator", "--config", str(cfg)])
        start("node", [PYTHON, "-m", "profwatch.cli", "node", "--config", str(cfg)])
        start("rank0", [PYTHON, WORKER, str(short_tmp / "rank0.json"), "0", "0.05"],
              {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "PROFWATCH_JOB_ID": "jobM",
               "PROFWATCH_NODE_ENDPOINT": f"ipc://{short_tmp}/node.sock"})
        wanted = _metric_names(_queries() + _rule_exprs()) - PROMETHEUS_BUILTINS
        assert len(wanted) >= 15, wanted

        last: dict[str, set[str]] = {}

        def all_there() -> bool:
            have = _exported(scrape_metrics(ports["coord_metrics"])) | _exported(scrape_metrics(ports["node_metrics"]))
            last["missing"] = {n for n in wanted if n not in have}
            return not last["missing"]

        try:
            wait_for(all_there, 90, 0.5, "every dashboard/rule metric in a live scrape")
        except AssertionError:
            raise AssertionError(f"not exported by either daemon: {sorted(last['missing'])}") from None
        coord = scrape_metrics(ports["coord_metrics"])
        assert 'profwatch_job_step_time_seconds{job_id="jobM"}' in coord
        assert 'profwatch_daemon_info{daemon="node"' in scrape_metrics(ports["node_metrics"])
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        for log in logs:
            log.close()


#: The first Grafana release of each dashboard schemaVersion (Grafana's DashboardMigrator,
#: public/app/features/dashboard/state/DashboardMigrator.ts: 36 in 9.0, 37 in 9.1, 38 in 10.0, 39 in 10.4).
SCHEMA_SINCE = {36: (9, 0), 37: (9, 1), 38: (10, 0), 39: (10, 4)}
SUBSTITUTED = {"$job": "profwatch", "$instance": "node1:9101"}
"""What the job and instance variables stand for in the promtool check (one scrape job, one instance)."""


def test_the_schema_version_is_one_the_declared_grafana_reads() -> None:
    d = _dashboard()
    declared = next(r["version"] for r in d["__requires"] if r["id"] == "grafana")
    major_minor = tuple(int(x) for x in declared.split(".")[:2])
    assert d["schemaVersion"] in SCHEMA_SINCE and major_minor >= SCHEMA_SINCE[d["schemaVersion"]], (
        declared, d["schemaVersion"])


def test_datasource_job_and_instance_variables_filter_every_panel_query() -> None:
    d = _dashboard()
    var = {v["name"]: v for v in d["templating"]["list"]}
    assert var["datasource"]["type"] == "datasource" and var["datasource"]["query"] == "prometheus"
    for name in ("job", "instance"):
        assert var[name]["type"] == "query" and var[name]["multi"] and var[name]["includeAll"], name
        assert var[name]["datasource"]["uid"] == "${datasource}" and "profwatch_daemon_info" in var[name]["definition"]
    assert '{job=~"$job"}' in var["instance"]["definition"]  # instances of the chosen jobs
    for q in _queries():
        selectors = re.findall(r"\b(profwatch_[a-z0-9_]+)(\{[^}]*\})?", q)
        assert selectors, q
        for name, braces in selectors:
            assert 'job=~"$job"' in braces and 'instance=~"$instance"' in braces, (name, q)


def test_every_panel_query_returns_series_with_the_variables_substituted(tmp_path: Path) -> None:
    """promtool evaluates each query (variables substituted) over input series carrying the scrape labels, and a
    query that returns nothing raises an alert the test does not expect: a filter that matches nothing, or a
    metric or label a query names and the series lack, fails here."""
    promtool = require_tool("promtool", WHY)
    queries = []
    for q in _queries():
        for k, v in SUBSTITUTED.items():
            q = q.replace(k, v)
        queries.append(q)
    series: dict[str, str] = {}
    for q in queries:
        for name, braces in re.findall(r"\b(profwatch_[a-z0-9_]+)(\{[^}]*\})?", q):
            labels = dict(re.findall(r'(\w+)=~?"([^"]*)"', braces))
            for le in (["0.5", "+Inf"] if name.endswith("_bucket") else [None]):
                lab = {**labels, **({"le": le} if le else {})}
                key = name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(lab.items())) + "}"
                series[key] = "0+1x120"
    rules = {"groups": [{"name": "dashboard", "interval": "1m", "rules":
                         [{"record": f"dashboard:query_{i}", "expr": q} for i, q in enumerate(queries)]
                         + [{"alert": f"QueryEmpty{i}", "expr": f"absent(dashboard:query_{i})"}
                            for i in range(len(queries))]}]}
    (tmp_path / "dash.rules.yml").write_text(json.dumps(rules))
    test = {"rule_files": ["dash.rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": [{"series": k, "values": v} for k, v in series.items()],
        "alert_rule_test": [{"eval_time": "90m", "alertname": f"QueryEmpty{i}", "exp_alerts": []}
                            for i in range(len(queries))]}]}
    (tmp_path / "dash.test.yml").write_text(json.dumps(test))
    res = subprocess.run([promtool, "test", "rules", "dash.test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert all('job="profwatch"' in k and 'instance="node1:9101"' in k for k in series)
    # the check bites: a query whose filter matches nothing is reported
    rules["groups"][0]["rules"][0]["expr"] = queries[0].replace('job=~"profwatch"', 'job=~"elsewhere"')
    (tmp_path / "dash.rules.yml").write_text(json.dumps(rules))
    res = subprocess.run([promtool, "test", "rules", "dash.test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode != 0 and "QueryEmpty0" in res.stdout + res.stderr
