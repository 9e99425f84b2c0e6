"""helm/rvd rendered without helm (helm_render.py, the subset the chart
uses): every template for the default values and for both modes parses as
YAML and as the Kubernetes kinds it claims (k8s_check), names and labels
are consistent, the toggles work, rvd accepts the config the chart
renders, the sidecar snippet makes a valid trainer pod and is the one in
helm/rvd/README.md, and files/ holds deploy/'s rules and dashboard.
Not run here: helm lint, helm template, a cluster (see helm/README.md)."""
import copy
import json
import pathlib
import re

import pytest
import yaml

from conftest import rvd_accepts
from helm_render import Chart, TemplateError
from k8s_check import check_objects

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "rvd"
RELEASE, NAMESPACE = "train", "ml"


def values(**overrides):
    v = yaml.safe_load((CHART / "values.yaml").read_text())
    for path, value in overrides.items():
        node = v
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return v


def render(v, release=RELEASE):
    out = Chart(CHART).render(copy.deepcopy(v), release=release, namespace=NAMESPACE)
    objs = []
    for name, text in out.items():
        # (Every action is rendered or refused; the "{{ }}" left are the
        # rules' and the dashboard's own, from .Files.Get.)
        assert "<no value>" not in text, name
        if name == "NOTES.txt":
            continue
        for doc in yaml.safe_load_all(text):
            if doc is not None:  # Helm drops empty documents
                objs.append(doc)
    return out, objs


def kinds(objs):
    return sorted(o["kind"] for o in objs)


CASES = {
    "default": values(),
    "daemonset-all": values(mode="daemonset", networkPolicy__enabled=True,
                            checkpoints__hostPath="/mnt/checkpoints",
                            data__hostPath="/var/lib/rvd-node",
                            sysPtrace=True, env=[{"name": "X", "value": "1"}]),
    "daemonset-per-gpu": values(mode="daemonset", daemonset__instancesPerNode=4,
                                networkPolicy__enabled=True, data__hostPath="/var/lib/rvd-node"),
    "sidecar": values(mode="sidecar"),
    "sidecar-checkpoints": values(mode="sidecar", checkpoints__volumeName="ckpt",
                                  sidecar__gpuClaimName=""),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_renders_valid_objects(case):
    _, objs = render(CASES[case])
    assert check_objects(objs) == []
    for o in objs:
        m = o["metadata"]
        full = "train-rvd"
        assert m["name"] == full or m["name"].startswith(full + "-"), m["name"]
        assert m["namespace"] == NAMESPACE
        labels = m["labels"]
        assert labels["app.kubernetes.io/name"] == "rvd"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "rvd-0.1.0"
        assert labels["app.kubernetes.io/component"] == CASES[case]["mode"]


def test_daemonset_mode_objects():
    _, objs = render(CASES["default"])
    assert CASES["default"]["mode"] == "daemonset"
    assert kinds(objs) == ["ConfigMap", "ConfigMap", "DaemonSet", "PrometheusRule",
                           "Service", "ServiceMonitor"]
    _, objs = render(CASES["daemonset-all"])
    assert "NetworkPolicy" in kinds(objs)
    svc = next(o for o in objs if o["kind"] == "Service")
    # The rules and the dashboard find rvd by job=~".*rvd.*": the
    # ServiceMonitor's job is the Service's name.
    assert "rvd" in svc["metadata"]["name"]
    ds = next(o for o in objs if o["kind"] == "DaemonSet")
    assert svc["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]


def test_sidecar_mode_objects():
    _, objs = render(CASES["sidecar"])
    assert kinds(objs) == ["ConfigMap", "ConfigMap", "ConfigMap", "PodMonitor",
                           "PrometheusRule"]
    pm = next(o for o in objs if o["kind"] == "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"] == {"rvd.dev/sidecar": "true"}
    assert "rvd" in pm["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["replacement"]


def test_toggles_turn_objects_off():
    v = values(serviceMonitor__enabled=False, prometheusRule__enabled=False,
               grafanaDashboard__enabled=False)
    _, objs = render(v)
    assert kinds(objs) == ["ConfigMap", "DaemonSet", "Service"]
    v = values(mode="sidecar", podMonitor__enabled=False)
    _, objs = render(v)
    assert "PodMonitor" not in kinds(objs)


def test_a_bad_mode_fails():
    with pytest.raises(TemplateError, match="mode must be sidecar or daemonset"):
        render(values(mode="sidcar"))


def test_instances_per_node_must_be_one_or_more():
    with pytest.raises(TemplateError, match="instancesPerNode must be 1 or more"):
        render(values(daemonset__instancesPerNode=0))


def test_daemonset_one_rvd_per_gpu():
    """instancesPerNode 4: container rvd-i sees GPU i alone, listens on the
    base ports + i (flags over the shared config), keeps its own data and
    /tmp; the Service, the ServiceMonitor and the NetworkPolicy cover every
    instance's ports."""
    n, grpc0, metrics0 = 4, 50051, 9464
    _, objs = render(CASES["daemonset-per-gpu"])
    ds = next(o for o in objs if o["kind"] == "DaemonSet")
    cs = ds["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in cs] == [f"rvd-{i}" for i in range(n)]
    for i, c in enumerate(cs):
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["NVIDIA_VISIBLE_DEVICES"] == str(i)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports == {f"grpc-{i}": grpc0 + i, f"metrics-{i}": metrics0 + i}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"] == {"port": grpc0 + i}, (i, probe)
        assert c["args"] == ["--config", "/etc/rvd/rvd.yaml",
                             "--grpc-address", f"0.0.0.0:{grpc0 + i}",
                             "--metrics-address", f"0.0.0.0:{metrics0 + i}"]
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert mounts["/var/lib/rvd"]["subPath"] == f"gpu-{i}"
        assert mounts["/tmp"]["subPath"] == f"gpu-{i}"
        assert "subPath" not in mounts["/dev/shm"]  # CUDA IPC needs the one /dev/shm
    svc = next(o for o in objs if o["kind"] == "Service")
    assert {(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]} == \
        {(f"{k}-{i}", base + i, f"{k}-{i}") for i in range(n)
         for k, base in (("grpc", grpc0), ("metrics", metrics0))}
    sm = next(o for o in objs if o["kind"] == "ServiceMonitor")
    assert [e["port"] for e in sm["spec"]["endpoints"]] == [f"metrics-{i}" for i in range(n)]
    np_ = next(o for o in objs if o["kind"] == "NetworkPolicy")
    ranges = [(r["ports"][0]["port"], r["ports"][0]["endPort"]) for r in np_["spec"]["ingress"]]
    assert ranges == [(grpc0, grpc0 + n - 1), (metrics0, metrics0 + n - 1)]
    # One instance (the default) keeps the plain names and no endPort.
    _, objs = render(CASES["daemonset-all"])
    (c,) = next(o for o in objs if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert c["name"] == "rvd" and c["args"] == ["--config", "/etc/rvd/rvd.yaml"]
    np_ = next(o for o in objs if o["kind"] == "NetworkPolicy")
    assert all("endPort" not in r["ports"][0] for r in np_["spec"]["ingress"])


def test_the_per_gpu_flags_are_rvds_own(tmp_path):
    """The flags a per-GPU container adds are config keys rvd takes on its
    command line (rvd --help), as rvd_accepts passes them."""
    from rvdtest import RVD
    import subprocess
    text = subprocess.run([str(RVD), "--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("--grpc-address", "--metrics-address"):
        assert flag in text, flag


def security_and_probes(c, sys_ptrace):
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["capabilities"].get("add", []) == (["SYS_PTRACE"] if sys_ptrace else [])
    grpc_port = {p["name"]: p["containerPort"] for p in c["ports"]}["grpc"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"] == {"port": grpc_port}, probe
    assert c["resources"]["limits"]["memory"]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/etc/rvd", "/var/lib/rvd", "/tmp", "/dev/shm"} <= mounts


def test_daemonset_container():
    for case, ptrace in (("default", False), ("daemonset-all", True)):
        _, objs = render(CASES[case])
        ds = next(o for o in objs if o["kind"] == "DaemonSet")
        (c,) = ds["spec"]["template"]["spec"]["containers"]
        security_and_probes(c, ptrace)
        assert ds["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"]
    assert {"name": "X", "value": "1"} in c["env"]
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["rvd-data"]["hostPath"]["path"] == "/var/lib/rvd-node"
    assert {"name": "rvd-data", "mountPath": "/var/lib/rvd"} in c["volumeMounts"]
    assert any(m["mountPath"] == "/checkpoints" and m["readOnly"] for m in c["volumeMounts"])


def sidecar_pod(out):
    cm = yaml.safe_load(out["sidecar-snippet.yaml"])
    snippet = yaml.safe_load(cm["data"]["pod-spec.yaml"])
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "trainer", "namespace": NAMESPACE,
                        "labels": {"rvd.dev/sidecar": "true"}},
           "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                    "containers": [{"name": "trainer", "image": "trainer:1",
                                    "resources": {"claims": [{"name": "gpu"}]},
                                    "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                                                     {"name": "ckpt", "mountPath": "/out"}]}],
                    "volumes": [{"name": "ckpt", "emptyDir": {}}]}}
    pod["spec"]["shareProcessNamespace"] = snippet["shareProcessNamespace"]
    pod["spec"]["initContainers"] = snippet["initContainers"]
    pod["spec"]["volumes"] += snippet["volumes"]
    return snippet, pod


def test_sidecar_snippet_makes_a_valid_trainer_pod():
    for case in ("sidecar", "sidecar-checkpoints"):
        out, objs = render(CASES[case])
        snippet, pod = sidecar_pod(out)
        config = next(o for o in objs if o["kind"] == "ConfigMap"
                      and o["metadata"]["name"] == "train-rvd")
        assert check_objects([pod, config]) == [], case
        assert snippet["shareProcessNamespace"] is True
        (c,) = snippet["initContainers"]
        assert c["restartPolicy"] == "Always"
        security_and_probes(c, False)
        if case == "sidecar":
            assert c["resources"]["claims"] == [{"name": "gpu"}]
            assert "env" not in c  # the GPU comes from the claim
        else:
            assert "claims" not in c["resources"]
            assert {"name": "ckpt", "mountPath": "/checkpoints", "readOnly": True} in c["volumeMounts"]


def test_readme_snippet_is_the_rendered_one():
    readme = (CHART / "README.md").read_text()
    m = re.search(r"<!-- sidecar-snippet -->\s*```yaml\n(.*?)```", readme, re.S)
    assert m, "helm/rvd/README.md has no sidecar snippet block"
    out, _ = render(CASES["sidecar"], release="rvd")
    cm = yaml.safe_load(out["sidecar-snippet.yaml"])
    assert yaml.safe_load(m.group(1)) == yaml.safe_load(cm["data"]["pod-spec.yaml"])


def test_config_is_the_values_and_rvd_accepts_it(tmp_path):
    configs = {}
    for case, v in CASES.items():
        _, objs = render(v)
        cm = next(o for o in objs if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"] == "train-rvd")
        text = cm["data"]["rvd.yaml"]
        assert yaml.safe_load(text) == v["config"]
        assert v["config"]["data_dir"] == "/var/lib/rvd"  # where rvd-data is mounted
        # The addresses' ports are the ports the containers expose.
        assert text and yaml.safe_load(text)["grpc_address"].endswith(f":{v['ports']['grpc']}")
        assert yaml.safe_load(text)["metrics_address"].endswith(f":{v['ports']['metrics']}")
        configs[case] = text
    assert rvd_accepts(configs, tmp_path) == {}


def test_rules_and_dashboard_are_deploys():
    assert (CHART / "files" / "rvd-rules.yaml").read_text() == \
        (ROOT / "deploy" / "prometheus" / "rvd-rules.yaml").read_text()
    assert (CHART / "files" / "rvd-dashboard.json").read_text() == \
        (ROOT / "deploy" / "grafana" / "rvd-dashboard.json").read_text()
    _, objs = render(CASES["default"])
    rule = next(o for o in objs if o["kind"] == "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((ROOT / "deploy" / "prometheus" / "rvd-rules.yaml").read_text())
    dash = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard"))
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dash["data"]["rvd-dashboard.json"]) == \
        json.loads((ROOT / "deploy" / "grafana" / "rvd-dashboard.json").read_text())


def test_chart_metadata():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "rvd"
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])
    project = re.search(r"project\(rvd VERSION (\S+)", (ROOT / "CMakeLists.txt").read_text())
    assert chart["appVersion"] == project.group(1)  # the image tag default


def test_renderer_refuses_what_it_does_not_know(tmp_path):
    (tmp_path / "templates").mkdir()
    (tmp_path / "Chart.yaml").write_text("name: x\nversion: 0.1.0\n")
    for bad in ("{{ range .Values.x }}{{ end }}", "{{ $x := 1 }}", "{{ .Values.a | b64enc }}",
                "{{ .Values.missing }}", "{{ if .Values.a }}", "{{ 1000000 }}",
                "{{ $i }}", "{{ range $i := 3 }}{{ end }}", "{{ range $i := until 2 }}{{ else }}{{ end }}",
                '{{ define "d" }}{{ $i }}{{ end }}{{ range $i := until 2 }}{{ include "d" . }}{{ end }}',
                '{{ dict "a" }}', "{{ dict 1 2 }}"):
        (tmp_path / "templates" / "t.yaml").write_text(bad)
        with pytest.raises(TemplateError):
            Chart(tmp_path).render({"a": 1})


def test_renderer_range_and_include_as_helm(tmp_path):
    """range $name := LIST binds dot and $name to each element; an included
    template's $ is its argument (Go templates), so dict carries what it
    needs."""
    (tmp_path / "templates").mkdir()
    (tmp_path / "Chart.yaml").write_text("name: x\nversion: 0.1.0\n")
    cases = {
        "{{ range $i := until 3 }}{{ $i }}{{ add $i 10 }}{{ . }},{{ end }}": "0100,1111,2122,",
        '{{ define "d" }}{{ $.x }}{{ .y.z }}{{ end }}{{ include "d" (dict "x" 5 "y" (dict "z" "w")) }}':
            "5w",
        "{{ range $i := .Values.l }}{{ $i.n }}{{ $.Values.a }}{{ end }}": "p1q1",
        "{{ add 50051 3 -1 }}": "50053",
    }
    for text, want in cases.items():
        (tmp_path / "templates" / "t.yaml").write_text(text)
        assert Chart(tmp_path).render({"a": 1, "l": [{"n": "p"}, {"n": "q"}]})["t.yaml"] == want, text
