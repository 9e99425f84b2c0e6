"""What the deploy tests need to know about PromQL and rvd's /metrics.

metric_selectors(expr) finds the metric names a PromQL expression reads and
the label names its selectors match on. It is a scanner for the PromQL that
deploy/ writes, not a PromQL parser: string literals, range and subquery
brackets, Grafana variables ($model, ${datasource}, $__rate_interval) and
the label lists of by/without/on/ignoring/group_left/group_right are taken
out first; what is left that looks like an identifier, is not a keyword and
is not followed by "(" (a function or an aggregation) is a metric name. A
selector with no metric name ({__name__=...}) is refused: the test could not
say what it reads.

exposition(text) reads the Prometheus text format: sample name -> the label
names seen on it (histograms give their _bucket, _sum and _count samples).
"""
import re

IDENT = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on",
            "ignoring", "group_left", "group_right", "inf", "nan", "atan2"}
LABEL_LIST = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
SELECTOR = re.compile(rf"(?<![\w:])({IDENT})?\s*\{{([^{{}}]*)\}}")
MATCHER = re.compile(rf"\s*({IDENT})\s*(=~|!~|!=|=)\s*")

# Series that Prometheus itself makes, with the labels they carry: `up` per
# scrape target, ALERTS for the rules' alerts (plus each alert's labels).
PROMETHEUS_SERIES = {
    "up": {"job", "instance"},
    "ALERTS": {"alertname", "alertstate", "severity", "model_id", "layer",
               "job", "instance", "code", "alert", "rvd_alert"},
}
# Labels Prometheus adds to every scraped series (the scrape config's and
# the prometheus-operator's target labels).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service",
                 "container", "endpoint", "node"}


def metric_selectors(expr):
    """[(metric name, {label names matched})] for every metric expr reads."""
    found = []
    # Selectors with matchers, on the text with its strings still in.
    for m in SELECTOR.finditer(STRING.sub('""', expr)):
        name, body = m.group(1), m.group(2)
        if name is None or name in KEYWORDS:
            raise ValueError(f"a selector without a metric name in: {expr}")
        labels = set()
        for part in body.split(","):
            if part.strip():
                mm = MATCHER.match(part)
                if not mm:
                    raise ValueError(f"cannot read matcher {part!r} in: {expr}")
                labels.add(mm.group(1))
        found.append((name, labels))
    rest = STRING.sub(" ", expr)
    rest = VARIABLE.sub(" ", rest)
    rest = LABEL_LIST.sub(" ", rest)
    rest = re.sub(r"\{[^{}]*\}", " ", rest)
    rest = re.sub(r"\[[^\[\]]*\]", " ", rest)
    with_labels = {n for n, _ in found}
    for m in re.finditer(rf"(?<![\w:.])({IDENT})(\s*\()?", rest):
        name, call = m.group(1), m.group(2)
        if call or name in KEYWORDS:
            continue
        if name not in with_labels:
            found.append((name, set()))
            with_labels.add(name)
    return found


def metric_names(expr):
    return {n for n, _ in metric_selectors(expr)}


def exposition(text):
    """Sample name -> label names, from Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(rf"({IDENT})(\{{([^}}]*)\}})?\s", line)
        if not m:
            raise ValueError(f"not an exposition line: {line!r}")
        labels = set(re.findall(rf"({IDENT})=\"", m.group(3) or ""))
        out.setdefault(m.group(1), set()).update(labels)
    return out


def unknown_reads(expr, exported):
    """What expr reads that `exported` (name -> labels) does not have:
    a list of messages, empty when every name and label exists."""
    problems = []
    for name, labels in metric_selectors(expr):
        known = exported.get(name)
        if known is None:
            problems.append(f"metric {name} is not exported")
            continue
        extra = labels - known - TARGET_LABELS
        if extra:
            problems.append(f"{name} has no label(s) {sorted(extra)}")
    return problems
