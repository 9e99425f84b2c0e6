"""deploy/prometheus/rvd-rules.yaml: promtool's syntax check and its unit
tests (rvd-rules_test.yaml), and every metric a rule reads is one a real
rvd exports (or a series Prometheus makes itself: up)."""
import pathlib
import shutil
import subprocess

import yaml

from promql import PROMETHEUS_SERIES, metric_names, unknown_reads

ROOT = pathlib.Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rvd-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "rvd-rules_test.yaml"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

# The alerts issue 16 section 4 asks for, each named here so that deleting
# one fails the test.
REQUIRED_ALERTS = {
    "RvdRvDropFromBaseline", "RvdRvSharpDrop", "RvdRvBelowFloor",
    "RvdLayerPRCollapse", "RvdDown", "RvdMeasurementsStale",
    "RvdServerErrors", "RvdHighErrorRatio", "RvdEngineUnhealthy",
}


def promtool(*args):
    r = subprocess.run([PROMTOOL, *args], capture_output=True, text=True,
                       timeout=60, cwd=RULES.parent)
    assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def rules():
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_check_rules():
    out = promtool("check", "rules", RULES.name)
    assert f"SUCCESS: {len(rules())} rules found" in out


def test_promtool_unit_tests():
    promtool("test", "rules", RULE_TESTS.name)


def test_every_required_alert_exists_and_is_unit_tested():
    names = {r["alert"] for r in rules() if "alert" in r}
    assert REQUIRED_ALERTS <= names, f"missing: {sorted(REQUIRED_ALERTS - names)}"
    tested = {t["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for t in case.get("alert_rule_test", [])
              if t.get("exp_alerts")}
    assert names <= tested, f"alerts never shown firing in a unit test: {sorted(names - tested)}"


def test_every_alert_has_severity_and_summary():
    for r in rules():
        assert r["labels"]["severity"] in {"info", "warning", "critical"}, r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]


def test_rules_read_only_metrics_rvd_exports(exported):
    known = dict(exported, **PROMETHEUS_SERIES)
    problems = []
    for r in rules():
        assert metric_names(r["expr"]), f"{r['alert']} reads no metric"
        problems += [f"{r['alert']}: {p}" for p in unknown_reads(r["expr"], known)]
    assert not problems, "\n".join(problems)
