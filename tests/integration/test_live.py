"""Live models through the rvd binary on the CPU backend: the RPCs are
served and refuse with the proto's codes (a backend without a GPU cannot map
a trainer's memory: FAILED_PRECONDITION naming MeasureStream), the config
keys reach the daemon, and /metrics carries the rvd_live_* families. The
whole path with a GPU is cuda_live_daemon_test (label gpu); the registry's
logic on the CPU is live_registry_test."""
import os

import grpc
import pytest

from rvdtest import Daemon, rvd_pb2, scrape


def request(model_id="live-cpu"):
    spec = rvd_pb2.TensorSpec(
        name="v", layer=0, dtype=rvd_pb2.DTYPE_F32, shape=[16, 64],
        layout=rvd_pb2.V_LAYOUT_SEPARATE,
        geometry=rvd_pb2.HeadGeometry(num_heads=4, num_kv_heads=2, head_dim=8))
    tensor = rvd_pb2.LiveTensor(spec=spec, handle_kind=rvd_pb2.IPC_HANDLE_KIND_CUDA_IPC,
                                handle=b"\x01" * 64, segment_bytes=16 * 64 * 4,
                                strides=[64, 1])
    return rvd_pb2.RegisterLiveModelRequest(
        header=rvd_pb2.MeasureHeader(model_id=model_id), tensors=[tensor],
        device_uuid="GPU-00000000-0000-0000-0000-000000000000", producer_pid=os.getpid())


def test_live_rpcs_on_the_cpu_backend(tmp_path):
    d = Daemon(tmp_path, backend="cpu", max_live_models=3, live_lease_seconds=30)
    try:
        with pytest.raises(grpc.RpcError) as e:
            d.stub.RegisterLiveModel(request())
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
        assert "MeasureStream" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            d.stub.NotifyStep(rvd_pb2.NotifyStepRequest(model_id="live-cpu", step=1))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND, e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            d.stub.NotifyStep(rvd_pb2.NotifyStepRequest(model_id="not valid!", step=1))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as e:
            d.stub.UnregisterLiveModel(rvd_pb2.UnregisterLiveModelRequest(model_id="live-cpu"))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        text = scrape(d)
        assert "rvd_live_models 0" in text
        assert "rvd_live_segments_mapped 0" in text
        assert 'rvd_live_notifications_total{outcome="error"} 2' in text
        assert "rvd_live_snapshot_seconds_count 0" in text
        assert "rvd_live_measurement_seconds_count 0" in text
        assert "live models: not served" in d.log_text()
    finally:
        d.stop()


def test_live_config_keys_are_checked(tmp_path):
    with pytest.raises(RuntimeError) as e:
        Daemon(tmp_path, backend="cpu", live_lease_seconds=0)
    assert "live_lease_seconds" in str(e.value)
