"""deploy/grafana/rvd-dashboard.json: it parses, every panel queries
through the $datasource variable, every query is PromQL promtool parses and
(with the model variable's) names only metrics and labels a real rvd
exports, and the panels issue 16 asks for are there. Not checked: how Grafana draws it (no Grafana here)."""
import json
import pathlib
import re

from promql import PROMETHEUS_SERIES, metric_names, unknown_reads

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "rvd-dashboard.json"
DS = {"type": "prometheus", "uid": "${datasource}"}


def dashboard():
    return json.loads(DASHBOARD.read_text())


def panels(d):
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])  # panels inside a collapsed row


def query_panels(d):
    return [p for p in panels(d) if p["type"] != "row"]


def test_variables_datasource_and_model():
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    model = variables["model"]
    assert model["type"] == "query" and model["datasource"] == DS
    assert model["multi"] and model["includeAll"]


def test_model_variable_reads_an_exported_label(exported):
    model = {v["name"]: v for v in dashboard()["templating"]["list"]}["model"]
    q = model["query"]["query"] if isinstance(model["query"], dict) else model["query"]
    m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", q)
    assert m, q
    assert m.group(1) in exported and m.group(2) in exported[m.group(1)], q


def test_every_panel_uses_the_datasource_variable():
    for p in query_panels(dashboard()):
        assert p["datasource"] == DS, p["title"]
        assert p["targets"], f"panel {p['title']} has no query"
        for t in p["targets"]:
            assert t.get("datasource", DS) == DS, p["title"]


def test_panel_ids_unique_and_layout_fits():
    d = dashboard()
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids))
    for p in panels(d):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
    assert d["uid"] and d["title"]


def test_every_query_names_metrics_rvd_exports(exported):
    known = dict(exported, **PROMETHEUS_SERIES)
    problems = []
    for p in query_panels(dashboard()):
        for t in p["targets"]:
            if not metric_names(t["expr"]):
                problems.append(f"{p['title']}: {t['expr']} reads no metric")
            problems += [f"{p['title']}: {x}" for x in unknown_reads(t["expr"], known)]
    assert not problems, "\n".join(problems)


def test_the_panels_issue_16_asks_for():
    d = dashboard()
    by_metric = {}
    for p in query_panels(d):
        for t in p["targets"]:
            for name in metric_names(t["expr"]):
                by_metric.setdefault(name, set()).add(p["type"])
    assert "timeseries" in by_metric["rvd_rv"]                      # R_V over time
    assert "heatmap" in by_metric["rvd_participation_ratio"]        # per-layer PR
    assert "rvd_alert_active" in by_metric                          # alert state
    assert "rvd_measurement_duration_seconds_bucket" in by_metric   # latency
    assert "rvd_ingested_bytes_total" in by_metric                  # ingested bytes
    assert {"up", "rvd_engine_healthy", "rvd_errors_total"} <= set(by_metric)  # health
    # Per model: the R_V and PR queries filter on the model variable.
    for p in query_panels(d):
        for t in p["targets"]:
            if metric_names(t["expr"]) & {"rvd_rv", "rvd_participation_ratio"}:
                assert 'model_id=~"$model"' in t["expr"], (p["title"], t["expr"])


def test_every_query_is_valid_promql(tmp_path):
    """promtool parses each query (as a recording rule), with Grafana's
    variables replaced by what Grafana sends: $model's "All" (.*) and a
    range for $__rate_interval."""
    import shutil
    import subprocess

    import yaml

    exprs = [t["expr"] for p in query_panels(dashboard()) for t in p["targets"]]
    rules = [{"record": f"dashboard_query_{i}",
              "expr": e.replace("$__rate_interval", "2m").replace("$model", ".*")}
             for i, e in enumerate(exprs)]
    assert all("$" not in r["expr"] for r in rules), "a variable the test does not know"
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = subprocess.run([shutil.which("promtool") or "/usr/bin/promtool", "check", "rules",
                        str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in r.stdout
