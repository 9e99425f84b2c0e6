"""A small, strict check of Kubernetes objects: the fields the API server
would require of the kinds deploy/ and helm/ use, and the references
between objects (volume mounts, probe ports, claims, Service selectors and
ports, ServiceMonitor selectors). Not the API server's whole schema: an
unknown field is caught only in the places listed in ALLOWED below.

check_objects(objs) returns a list of problems (empty: fine).
"""
import re

KINDS = {
    ("v1", "ConfigMap"), ("v1", "Service"), ("v1", "Pod"), ("v1", "Namespace"),
    ("v1", "ServiceAccount"), ("apps/v1", "DaemonSet"), ("apps/v1", "Deployment"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("resource.k8s.io/v1", "ResourceClaimTemplate"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
}
NAMESPACED = {k for _, k in KINDS} - {"Namespace"}
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_KEY = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# Fields a container may have here: a misspelt key (readinesProbe) fails.
ALLOWED = {
    "container": {"name", "image", "imagePullPolicy", "command", "args", "env",
                  "ports", "startupProbe", "readinessProbe", "livenessProbe",
                  "resources", "securityContext", "volumeMounts", "restartPolicy",
                  "workingDir", "envFrom"},
    "probe": {"grpc", "httpGet", "exec", "tcpSocket", "initialDelaySeconds",
              "periodSeconds", "timeoutSeconds", "failureThreshold",
              "successThreshold"},
    "securityContext": {"runAsNonRoot", "runAsUser", "runAsGroup",
                        "allowPrivilegeEscalation", "readOnlyRootFilesystem",
                        "capabilities", "privileged", "seccompProfile"},
}


def _labels_ok(where, labels, problems):
    for k, v in (labels or {}).items():
        if not LABEL_KEY.match(str(k)) or len(str(k).split("/")[-1]) > 63:
            problems.append(f"{where}: bad label key {k!r}")
        if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.match(v):
            problems.append(f"{where}: bad label value {k}={v!r} (labels are strings)")


def _pod_spec(where, spec, problems):
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    claims = {c["name"] for c in spec.get("resourceClaims", [])}
    containers = spec.get("containers") or []
    if not containers:
        problems.append(f"{where}: no containers")
    inits = spec.get("initContainers", [])
    names = [c.get("name") for c in containers + inits]
    if len(names) != len(set(names)):
        problems.append(f"{where}: container names repeat: {names}")
    for c in containers + inits:
        cw = f"{where} container {c.get('name')}"
        for key in ("name", "image"):
            if not c.get(key):
                problems.append(f"{cw}: no {key}")
        if not DNS1123_LABEL.match(c.get("name", "")):
            problems.append(f"{cw}: bad name")
        for k in set(c) - ALLOWED["container"]:
            problems.append(f"{cw}: unknown field {k}")
        if "restartPolicy" in c and (c not in inits or c["restartPolicy"] != "Always"):
            problems.append(f"{cw}: restartPolicy is only for sidecar init containers (Always)")
        ports = {}
        for p in c.get("ports", []):
            if not isinstance(p.get("containerPort"), int):
                problems.append(f"{cw}: containerPort must be an integer: {p}")
            ports[p.get("name")] = p.get("containerPort")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            pr = c.get(probe)
            if pr is None:
                continue
            for k in set(pr) - ALLOWED["probe"]:
                problems.append(f"{cw} {probe}: unknown field {k}")
            if "grpc" in pr:
                port = pr["grpc"].get("port")
                if not isinstance(port, int) or port not in ports.values():
                    problems.append(f"{cw} {probe}: grpc port {port!r} is not a container port (an integer)")
        for m in c.get("volumeMounts", []):
            if m.get("name") not in volumes:
                problems.append(f"{cw}: mounts unknown volume {m.get('name')}")
            if not str(m.get("mountPath", "")).startswith("/"):
                problems.append(f"{cw}: mountPath must be absolute: {m}")
        for claim in c.get("resources", {}).get("claims", []):
            if claim.get("name") not in claims:
                problems.append(f"{cw}: unknown resource claim {claim}")
        sc = c.get("securityContext", {})
        for k in set(sc) - ALLOWED["securityContext"]:
            problems.append(f"{cw} securityContext: unknown field {k}")
        for k in ("limits", "requests"):
            for res, q in c.get("resources", {}).get(k, {}).items():
                if not re.match(r"^\d+(\.\d+)?(m|Ki|Mi|Gi|Ti|k|M|G)?$", str(q)):
                    problems.append(f"{cw}: bad quantity {res}: {q!r}")
    for name, v in volumes.items():
        if not DNS1123_LABEL.match(name):
            problems.append(f"{where}: bad volume name {name}")
        if "configMap" in v and not v["configMap"].get("name"):
            problems.append(f"{where}: configMap volume {name} names no ConfigMap")


def pod_specs(obj):
    """(where, pod spec, pod labels) of a Pod or a workload's template."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind == "Pod":
        return [(f"Pod {name}", obj["spec"], obj["metadata"].get("labels", {}))]
    if kind in ("DaemonSet", "Deployment"):
        t = obj["spec"]["template"]
        return [(f"{kind} {name}", t["spec"], t["metadata"].get("labels", {}))]
    return []


def check_objects(objs):
    problems = []
    seen = set()
    for o in objs:
        if not isinstance(o, dict):
            problems.append(f"not an object: {o!r}")
            continue
        key = (o.get("apiVersion"), o.get("kind"))
        if key not in KINDS:
            problems.append(f"unknown apiVersion/kind {key}")
            continue
        meta = o.get("metadata") or {}
        name = meta.get("name", "")
        where = f"{o['kind']} {name}"
        if not name or len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
            problems.append(f"{where}: bad metadata.name")
        if o["kind"] in ("Service", "Namespace") and (len(name) > 63 or not DNS1123_LABEL.match(name)):
            problems.append(f"{where}: a {o['kind']} name must be a DNS-1123 label")
        if (o["kind"], meta.get("namespace"), name) in seen:
            problems.append(f"{where}: defined twice")
        seen.add((o["kind"], meta.get("namespace"), name))
        _labels_ok(where, meta.get("labels"), problems)
        for k, v in (meta.get("annotations") or {}).items():
            if not isinstance(v, str):
                problems.append(f"{where}: annotation {k} must be a string")
        if o["kind"] == "ConfigMap":
            for k, v in (o.get("data") or {}).items():
                if not isinstance(v, str):
                    problems.append(f"{where}: data.{k} must be a string")
        for pw, spec, labels in pod_specs(o):
            _labels_ok(pw + " template", labels, problems)
            _pod_spec(pw, spec, problems)
            if o["kind"] != "Pod":
                sel = o["spec"].get("selector", {}).get("matchLabels") or {}
                if not sel or any(labels.get(k) != v for k, v in sel.items()):
                    problems.append(f"{pw}: selector {sel} does not match its template's labels {labels}")
        if o["kind"] == "Service":
            ports = o["spec"].get("ports") or []
            if not ports or any(not isinstance(p.get("port"), int) for p in ports):
                problems.append(f"{where}: ports need integer port numbers")
            if len(ports) > 1 and any(not p.get("name") for p in ports):
                problems.append(f"{where}: several ports need names")
        if o["kind"] == "ServiceMonitor":
            if not o["spec"].get("endpoints") or not o["spec"].get("selector"):
                problems.append(f"{where}: needs selector and endpoints")
        if o["kind"] == "PodMonitor":
            if not o["spec"].get("podMetricsEndpoints") or not o["spec"].get("selector"):
                problems.append(f"{where}: needs selector and podMetricsEndpoints")
        if o["kind"] == "PrometheusRule":
            for g in o["spec"].get("groups") or [None]:
                if not g or not g.get("name") or not g.get("rules"):
                    problems.append(f"{where}: a group needs a name and rules")
    problems += _references(objs)
    return problems


def _references(objs):
    """Services select pods that have their target ports; ServiceMonitors
    select a Service with their port; ConfigMap volumes name a ConfigMap
    defined alongside (when any ConfigMap is)."""
    problems = []
    objs = [o for o in objs if isinstance(o, dict) and "kind" in o]
    workloads = [(o, pw, spec, labels) for o in objs for pw, spec, labels in pod_specs(o)]
    services = [o for o in objs if o["kind"] == "Service"]
    configmaps = {o["metadata"]["name"] for o in objs if o["kind"] == "ConfigMap"}
    for s in services:
        sel = s["spec"].get("selector") or {}
        matched = [(pw, spec) for _, pw, spec, labels in workloads
                   if sel and all(labels.get(k) == v for k, v in sel.items())]
        if workloads and not matched:
            problems.append(f"Service {s['metadata']['name']}: selector {sel} selects no pod here")
        for pw, spec in matched:
            names = {p.get("name"): p.get("containerPort")
                     for c in spec["containers"] + spec.get("initContainers", [])
                     for p in c.get("ports", [])}
            for p in s["spec"]["ports"]:
                t = p.get("targetPort", p["port"])
                if (isinstance(t, str) and t not in names) or (
                        isinstance(t, int) and t not in names.values()):
                    problems.append(f"Service {s['metadata']['name']}: targetPort {t!r} is not a port of {pw}")
    for m in (o for o in objs if o["kind"] == "ServiceMonitor"):
        sel = m["spec"]["selector"].get("matchLabels") or {}
        hits = [s for s in services
                if all((s["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())]
        if services and not hits:
            problems.append(f"ServiceMonitor {m['metadata']['name']}: selects no Service here")
        for e in m["spec"]["endpoints"]:
            if hits and not any(e.get("port") in {p.get("name") for p in s["spec"]["ports"]} for s in hits):
                problems.append(f"ServiceMonitor {m['metadata']['name']}: port {e.get('port')} is no port of its Service")
    if configmaps:
        for _, pw, spec, _ in workloads:
            for v in spec.get("volumes", []):
                if "configMap" in v and v["configMap"]["name"] not in configmaps:
                    problems.append(f"{pw}: volume {v['name']} names ConfigMap {v['configMap']['name']}, not defined here")
    return problems
