"""deploy/kubernetes/: the examples parse, are the Kubernetes kinds they
claim with their required fields and consistent references (k8s_check),
have what issue 16 asks of them, and their rvd config is one the real rvd
accepts. Not run: a cluster (kubectl apply --dry-run=server needs one)."""
import pathlib

import yaml

from conftest import rvd_accepts
from k8s_check import check_objects

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"


def load(name):
    return [o for o in yaml.safe_load_all((K8S / name).read_text()) if o is not None]


def one(objs, kind):
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}s"
    return found[0]


def mounts(c):
    return {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}


def test_every_example_is_well_formed():
    files = sorted(p.name for p in K8S.glob("*.yaml"))
    assert files == ["rvd-daemonset.yaml", "trainer-with-rvd-sidecar.yaml"]
    for f in files:
        assert check_objects(load(f)) == [], f


def test_trainer_pod_with_native_sidecar():
    objs = load("trainer-with-rvd-sidecar.yaml")
    pod = one(objs, "Pod")["spec"]
    (rvd,) = [c for c in pod["initContainers"] if c["name"] == "rvd"]
    (trainer,) = pod["containers"]
    assert rvd["restartPolicy"] == "Always"        # native sidecar
    assert pod["shareProcessNamespace"] is True    # CUDA IPC handles
    # The same GPU: one pod-level claim named by both containers.
    assert [c["name"] for c in pod["resourceClaims"]] == ["gpu"]
    for c in (rvd, trainer):
        assert c["resources"]["claims"] == [{"name": "gpu"}], c["name"]
        assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
    template = one(objs, "ResourceClaimTemplate")
    assert pod["resourceClaims"][0]["resourceClaimTemplateName"] == template["metadata"]["name"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    # /dev/shm: one memory emptyDir in both containers.
    assert mounts(rvd)["/dev/shm"] == mounts(trainer)["/dev/shm"]
    assert volumes[mounts(rvd)["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    # The checkpoint volume: the trainer writes it, rvd reads it.
    ckpt = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert len(ckpt) == 1
    assert ckpt[0]["name"] in mounts(rvd).values() and ckpt[0]["name"] in mounts(trainer).values()
    # gRPC health probes on rvd's gRPC port.
    grpc_port = {p["name"]: p["containerPort"] for p in rvd["ports"]}["grpc"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert rvd[probe]["grpc"]["port"] == grpc_port, probe
    sc = rvd["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"]
    assert sc["allowPrivilegeEscalation"] is False
    # CAP_SYS_PTRACE only for expandable-segment handles: off (commented).
    assert sc["capabilities"] == {"drop": ["ALL"]}
    text = (K8S / "trainer-with-rvd-sidecar.yaml").read_text()
    assert '# add: ["SYS_PTRACE"]' in text and "expandable_segments" in text


def test_daemonset_example():
    objs = load("rvd-daemonset.yaml")
    ds = one(objs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["livenessProbe"]["grpc"]["port"] == 50051
    assert c["securityContext"]["readOnlyRootFilesystem"]
    assert spec["securityContext"]["runAsNonRoot"]
    svc = one(objs, "Service")
    assert {p["name"] for p in svc["spec"]["ports"]} == {"grpc", "metrics"}
    assert one(objs, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "metrics"


def test_example_configs_are_accepted_by_rvd(tmp_path):
    configs = {}
    for f in ("trainer-with-rvd-sidecar.yaml", "rvd-daemonset.yaml"):
        cm = one(load(f), "ConfigMap")
        configs[f.split(".")[0]] = cm["data"]["rvd.yaml"]
        text = cm["data"]["rvd.yaml"]
        # Reachable from the kubelet's probes and Prometheus (the pod IP).
        assert 'grpc_address: "0.0.0.0:50051"' in text
        assert 'metrics_address: "0.0.0.0:9464"' in text
    assert rvd_accepts(configs, tmp_path) == {}
