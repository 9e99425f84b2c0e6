"""deploy/prometheus/rvd-group-rules.yaml (issue 18, sharded models over
several nodes): promtool's syntax check, its unit tests
(rvd-group-rules_test.yaml: one series per model while its coordinator moves
between nodes, other jobs left out), and every metric a rule reads is one a
real rvd exports (or Prometheus's own up)."""
import pathlib

import yaml

from promql import PROMETHEUS_SERIES, metric_names, unknown_reads
from test_prometheus_rules import promtool

ROOT = pathlib.Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rvd-group-rules.yaml"


def rules():
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_check_group_rules():
    out = promtool("check", "rules", RULES.name)
    assert f"SUCCESS: {len(rules())} rules found" in out


def test_promtool_unit_tests_of_group_rules():
    out = promtool("test", "rules", "rvd-group-rules_test.yaml")
    assert "SUCCESS" in out


def test_every_recording_rule_is_unit_tested():
    tests = yaml.safe_load((RULES.parent / "rvd-group-rules_test.yaml").read_text())
    tested = {t["expr"] for case in tests["tests"] for t in case.get("promql_expr_test", [])}
    names = {r["record"] for r in rules()}
    assert names and names <= tested, sorted(names - tested)


def test_group_rules_read_only_metrics_rvd_exports(exported):
    known = dict(exported, **PROMETHEUS_SERIES)
    problems = []
    for r in rules():
        assert metric_names(r["expr"]), f"{r['record']} reads no metric"
        problems += [f"{r['record']}: {p}" for p in unknown_reads(r["expr"], known)]
    assert not problems, "\n".join(problems)
