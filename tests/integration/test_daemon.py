"""rvd end to end: the real daemon on loopback, driven by rvctl and by a
Python gRPC client. Every PR is checked against a float64 SVD oracle."""
import json
import math
import select
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from rvdtest import (RVCTL, RVD, Daemon, grpc, pr_oracle, rvd_pb2, scrape, spectrum_matrix,
                      to_bf16, write_llama, write_safetensors)
import reflection_pb2
import reflection_pb2_grpc

RTOL = 2e-6


def spec(name, layer, arr, layout=rvd_pb2.V_LAYOUT_SEPARATE, heads=2, kv=2, d=None,
         dtype=rvd_pb2.DTYPE_F32):
    d = d or arr.shape[0] // kv
    return rvd_pb2.TensorSpec(
        name=name, layer=layer, dtype=dtype, shape=list(arr.shape), layout=layout,
        geometry=rvd_pb2.HeadGeometry(num_heads=heads, num_kv_heads=kv, head_dim=d))


def header_for(model_id, arrays, **kw):
    tensors = [spec(f"layers.{l}.v_proj", l, a) for l, a in enumerate(arrays)]
    return rvd_pb2.MeasureHeader(model_id=model_id, tensors=tensors, **kw)


def chunks(header, blobs, chunk=4 << 20):
    yield rvd_pb2.MeasureChunk(header=header)
    for i, blob in enumerate(blobs):
        for off in range(0, len(blob), chunk):
            yield rvd_pb2.MeasureChunk(tensor_index=i, offset=off,
                                       data=blob[off:off + chunk])


def model_count(daemon, model_id):
    for m in daemon.stub.ListModels(rvd_pb2.ListModelsRequest()).models:
        if m.model_id == model_id:
            return m.measurements
    return 0


def assert_code(call, code, text):
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() == code, e.value.details()
    assert text in e.value.details(), e.value.details()


# ---- rvctl -------------------------------------------------------------------

def test_rvctl_measure_matches_svd_oracle(daemon, tmp_path):
    rng = np.random.default_rng(1)
    vs = write_llama(tmp_path / "llama", rng)
    r = daemon.rvctl("measure", tmp_path / "llama", "--model-id", "llama-tiny",
                     "--step", 10, "--json")
    out = json.loads(r.stdout)
    assert out["model_id"] == "llama-tiny" and out["step"] == 10
    assert out["backend"] == "cpu" and out["variant"] == "algebraic"
    assert set(out) >= {"rv", "per_layer_pr", "per_head_pr", "early_layers",
                        "late_layers", "elapsed_ms", "timestamp", "receive_ms",
                        "client_load_ms", "client_round_trip_ms"}
    oracle = {l: pr_oracle(v) for l, v in vs.items()}
    for l, pr in out["per_layer_pr"].items():
        assert abs(pr - oracle[int(l)]) <= RTOL * oracle[int(l)]
    assert out["early_layers"] == [0, 1] and out["late_layers"] == [6, 7]
    rv = math.sqrt(oracle[6] * oracle[7]) / math.sqrt(oracle[0] * oracle[1])
    assert abs(out["rv"] - rv) <= 4e-6 * rv
    assert model_count(daemon, "llama-tiny") == 1


def test_rvctl_sharded_per_head_and_layer_sets(daemon, tmp_path):
    rng = np.random.default_rng(2)
    vs = write_llama(tmp_path / "sharded", rng, layers=6, shards=3)
    r = daemon.rvctl("measure", tmp_path / "sharded", "--model-id", "sharded",
                     "--per-head", "--early", "0-1", "--late", "4,5", "--json")
    out = json.loads(r.stdout)
    assert out["early_layers"] == [0, 1] and out["late_layers"] == [4, 5]
    for l, heads in out["per_head_pr"].items():
        v = vs[int(l)]
        assert len(heads) == 2
        for h, pr in enumerate(heads):
            want = pr_oracle(v[h * 16:(h + 1) * 16])
            assert abs(pr - want) <= RTOL * want


def test_rvctl_single_file_bf16_gpt_neox(daemon, tmp_path):
    rng = np.random.default_rng(3)
    heads, d, hidden = 4, 8, 32
    vs, tensors = {}, {}
    for l in range(4):
        qkv = rng.standard_normal((heads * 3 * d, hidden)).astype(np.float32)
        values, bits = to_bf16(qkv)
        tensors[f"gpt_neox.layers.{l}.attention.query_key_value.weight"] = ("BF16", bits)
        per_head = values.reshape(heads, 3, d, hidden)
        vs[l] = per_head[:, 2].reshape(heads * d, hidden)
    write_safetensors(tmp_path / "neox.safetensors", tensors)
    r = daemon.rvctl("measure", tmp_path / "neox.safetensors", "--model-id", "neox",
                     "--arch", "gpt_neox", "--num-heads", heads, "--head-dim", d,
                     "--json")
    out = json.loads(r.stdout)
    for l, pr in out["per_layer_pr"].items():
        want = pr_oracle(vs[int(l)])
        assert abs(pr - want) <= RTOL * want


def test_rvctl_history_models_latest(daemon, tmp_path):
    rng = np.random.default_rng(4)
    write_llama(tmp_path / "m", rng, layers=4)
    for step in (1, 2, 3):
        daemon.rvctl("measure", tmp_path / "m", "--model-id", "hist", "--step", step)
    h = json.loads(daemon.rvctl("history", "hist", "--json").stdout)
    assert [m["step"] for m in h] == [1, 2, 3]
    h2 = json.loads(daemon.rvctl("history", "hist", "--limit", 2, "--json").stdout)
    assert [m["step"] for m in h2] == [2, 3]
    csv = daemon.rvctl("history", "hist", "--csv").stdout.strip().splitlines()
    assert csv[0].startswith("model_id,step,") and len(csv) == 4
    assert csv[3].split(",")[1] == "3"
    latest = json.loads(daemon.rvctl("latest", "hist", "--json").stdout)
    assert latest["step"] == 3
    models = json.loads(daemon.rvctl("models", "--json").stdout)
    assert any(m["model_id"] == "hist" and m["measurements"] == 3 for m in models)
    r = daemon.rvctl("history", "never-measured", check=False)
    assert r.returncode != 0 and "NOT_FOUND" in r.stderr


def test_rvctl_watch_sees_new_measurements(daemon, tmp_path):
    rng = np.random.default_rng(5)
    write_llama(tmp_path / "w", rng, layers=4)
    watcher = subprocess.Popen([str(RVCTL), "--address", daemon.grpc_address,
                                "watch", "watched", "--json", "--noalerts"],
                               stdout=subprocess.PIPE, text=True)
    try:
        # The watcher subscribes asynchronously: measure until it reports
        # (another model's measurement must never show up in its stream).
        for attempt in range(20):
            daemon.rvctl("measure", tmp_path / "w", "--model-id", "other")
            daemon.rvctl("measure", tmp_path / "w", "--model-id", "watched",
                         "--step", 42)
            ready, _, _ = select.select([watcher.stdout], [], [], 1.0)
            if ready:
                break
        line = watcher.stdout.readline()
        assert json.loads(line)["model_id"] == "watched"
        assert json.loads(line)["step"] == 42
    finally:
        watcher.kill()


def test_rvctl_rejects_corrupt_checkpoints(daemon, tmp_path):
    rng = np.random.default_rng(6)
    write_llama(tmp_path / "c", rng, layers=4)
    f = tmp_path / "c" / "model.safetensors"
    data = f.read_bytes()
    cases = {
        "truncated": data[:len(data) - 100],
        "header_too_long": (10 ** 12).to_bytes(8, "little") + data[8:],
        "not_json": data[:8] + b"{" * (int.from_bytes(data[:8], "little")) + data[8 + int.from_bytes(data[:8], "little"):],
        "empty": b"",
    }
    for name, blob in cases.items():
        f.write_bytes(blob)
        r = daemon.rvctl("measure", tmp_path / "c", "--model-id", "corrupt", check=False)
        assert r.returncode == 1, (name, r.stderr)
        assert "model.safetensors" in r.stderr, (name, r.stderr)
    # A geometry that does not match the tensors: config lies about kv heads.
    write_llama(tmp_path / "g", rng, layers=4)
    cfg = json.loads((tmp_path / "g" / "config.json").read_text())
    cfg["num_key_value_heads"] = 1  # the tensors hold 2 kv heads
    (tmp_path / "g" / "config.json").write_text(json.dumps(cfg))
    r = daemon.rvctl("measure", tmp_path / "g", "--model-id", "corrupt", check=False)
    assert r.returncode == 1 and "shape" in r.stderr, r.stderr
    r = daemon.rvctl("measure", tmp_path / "nowhere", "--model-id", "corrupt", check=False)
    assert r.returncode == 1
    r = daemon.rvctl("measure", tmp_path / "c", check=False)
    assert r.returncode == 2 and "--model-id" in r.stderr
    assert model_count(daemon, "corrupt") == 0


# ---- the Python gRPC client ------------------------------------------------

def test_python_unary_and_stream_agree_with_oracle(daemon):
    rng = np.random.default_rng(7)
    arrays = [spectrum_matrix(rng, 32, 96, 0.1 * l) for l in range(8)]
    header = header_for("py", arrays, step=3, per_head=True)
    blobs = [a.tobytes() for a in arrays]
    unary = daemon.stub.Measure(rvd_pb2.MeasureRequest(header=header, data=blobs))
    stream = daemon.stub.MeasureStream(chunks(header, blobs, chunk=1000))
    for m in (unary, stream):
        assert m.HasField("rv")
        for layer in m.layers:
            want = pr_oracle(arrays[layer.layer])
            assert abs(layer.pr - want) <= RTOL * want
            assert len(layer.head_pr) == 2
    assert unary.rv == pytest.approx(stream.rv, rel=1e-12)
    assert unary.receive_ms == 0 and stream.receive_ms > 0
    assert model_count(daemon, "py") == 2


def test_large_stream_of_many_chunks(daemon):
    # 24 MiB in 4 MiB chunks: more than one message could carry.
    rng = np.random.default_rng(8)
    arrays = [rng.standard_normal((512, 4096)).astype(np.float32) for _ in range(3)]
    header = header_for("big", arrays)
    m = daemon.stub.MeasureStream(chunks(header, [a.tobytes() for a in arrays]))
    for layer in m.layers:
        want = pr_oracle(arrays[layer.layer])
        assert abs(layer.pr - want) <= RTOL * want


def test_zero_layer_reports_pr_zero_and_no_rv(daemon):
    arrays = [np.random.default_rng(9).standard_normal((8, 16)).astype(np.float32)
              for _ in range(4)]
    arrays[3][:] = 0
    m = daemon.stub.Measure(rvd_pb2.MeasureRequest(
        header=header_for("zeros", arrays), data=[a.tobytes() for a in arrays]))
    assert m.layers[3].pr == 0
    assert not m.HasField("rv")
    assert any("all zeros" in w for w in m.warnings)
    r = daemon.rvctl("latest", "zeros", "--json")
    assert json.loads(r.stdout)["rv"] is None


def test_wrong_layout_is_caught_and_nothing_is_stored(daemon):
    # A plain v_proj declared as phi3's fused qkv_proj: the shape cannot match.
    rng = np.random.default_rng(10)
    arrays = [rng.standard_normal((32, 64)).astype(np.float32) for _ in range(4)]
    header = header_for("wrong-layout", arrays)
    header.tensors[2].layout = rvd_pb2.V_LAYOUT_PHI3_QKV
    assert_code(lambda: daemon.stub.Measure(rvd_pb2.MeasureRequest(
        header=header, data=[a.tobytes() for a in arrays])),
        grpc.StatusCode.INVALID_ARGUMENT, "layers.2.v_proj")
    assert model_count(daemon, "wrong-layout") == 0


def test_bad_requests_get_codes_that_name_the_problem(daemon):
    rng = np.random.default_rng(11)
    arrays = [rng.standard_normal((16, 32)).astype(np.float32) for _ in range(4)]
    blobs = [a.tobytes() for a in arrays]
    ok = header_for("bad", arrays)
    INVALID = grpc.StatusCode.INVALID_ARGUMENT

    def unary(header, data=blobs):
        return lambda: daemon.stub.Measure(rvd_pb2.MeasureRequest(header=header, data=data))

    def stream(messages):
        return lambda: daemon.stub.MeasureStream(iter(list(messages)))

    h = rvd_pb2.MeasureHeader(); h.CopyFrom(ok); h.model_id = "bad id!"
    assert_code(unary(h), INVALID, "invalid model_id")
    assert_code(unary(rvd_pb2.MeasureHeader(model_id="bad"), []), INVALID, "no tensors")
    h = rvd_pb2.MeasureHeader(); h.CopyFrom(ok); h.early_layers[:] = [0]; h.late_layers[:] = [9]
    assert_code(unary(h), INVALID, "late layer 9")
    h = rvd_pb2.MeasureHeader(); h.CopyFrom(ok); h.tensors[1].dtype = 9
    assert_code(unary(h), INVALID, "unknown dtype")
    h = rvd_pb2.MeasureHeader(); h.CopyFrom(ok); h.variant.name = "magic"
    assert_code(unary(h), INVALID, "unknown variant")
    h = rvd_pb2.MeasureHeader(); h.CopyFrom(ok); h.variant.name = "fused"
    assert_code(unary(h), grpc.StatusCode.UNIMPLEMENTED, "cpu")
    nan = [b for b in blobs]
    bad = arrays[1].copy(); bad[3, 4] = np.inf; nan[1] = bad.tobytes()
    assert_code(unary(ok, nan), INVALID, "layers.1.v_proj")
    assert_code(unary(ok, blobs[:3]), INVALID, "data blocks")
    short = list(blobs); short[2] = short[2][:-4]
    assert_code(unary(ok, short), INVALID, "layers.2.v_proj")

    assert_code(stream([]), INVALID, "no header")
    assert_code(stream([rvd_pb2.MeasureChunk(data=b"x")]), INVALID, "header")
    msgs = list(chunks(ok, blobs, chunk=256))
    assert_code(stream(msgs[:-1]), INVALID, "stream ended early")
    assert_code(stream(msgs + [rvd_pb2.MeasureChunk(tensor_index=3, offset=0, data=b"x")]),
                INVALID, "more bytes")
    swapped = msgs[:1] + msgs[2:3] + msgs[1:2] + msgs[3:]
    assert_code(stream(swapped), INVALID, "out-of-order")
    assert_code(stream(msgs[:1] + [rvd_pb2.MeasureChunk(
        tensor_index=0, offset=0, data=b"\0" * ((4 << 20) + 1))]), INVALID, "exceeds")
    assert model_count(daemon, "bad") == 0


def test_client_disconnect_mid_stream_leaves_daemon_serving(daemon):
    rng = np.random.default_rng(12)
    arrays = [rng.standard_normal((64, 256)).astype(np.float32) for _ in range(4)]
    header = header_for("disconnect", arrays)
    gate = threading.Event()

    def slow():
        yield rvd_pb2.MeasureChunk(header=header)
        yield rvd_pb2.MeasureChunk(tensor_index=0, offset=0, data=arrays[0].tobytes()[:100])
        gate.wait(10)

    future = daemon.stub.MeasureStream.future(slow())
    time.sleep(0.5)
    future.cancel()
    gate.set()
    time.sleep(0.3)
    assert model_count(daemon, "disconnect") == 0
    m = daemon.stub.Measure(rvd_pb2.MeasureRequest(
        header=header, data=[a.tobytes() for a in arrays]))
    assert m.model_id == "disconnect"


def test_health_and_reflection(daemon):
    import health_pb2, health_pb2_grpc
    health = health_pb2_grpc.HealthStub(daemon.channel)
    SERVING = health_pb2.HealthCheckResponse.SERVING
    for service in ["", "rvd.v1.Rvd", "rvd.backend.cpu"]:
        assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == SERVING
    assert_code(lambda: health.Check(health_pb2.HealthCheckRequest(service="rvd.backend.cuda")),
                grpc.StatusCode.NOT_FOUND, "")
    stub = reflection_pb2_grpc.ServerReflectionStub(daemon.channel)
    replies = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for r in replies for s in r.list_services_response.service}
    assert "rvd.v1.Rvd" in names and "grpc.health.v1.Health" in names


# ---- /metrics ----------------------------------------------------------------

def test_metrics_expose_rv_and_pass_promtool(daemon, tmp_path):
    rng = np.random.default_rng(13)
    write_llama(tmp_path / "p", rng, layers=4)
    out = json.loads(daemon.rvctl("measure", tmp_path / "p", "--model-id", "prom",
                                  "--per-head", "--json").stdout)
    text = scrape(daemon)
    line = next(l for l in text.splitlines() if l.startswith('rvd_rv{model_id="prom"}'))
    assert float(line.split()[-1]) == pytest.approx(out["rv"], rel=1e-9)
    assert 'rvd_participation_ratio{layer="3",model_id="prom"}' in text
    assert 'rvd_participation_ratio_head{' in text
    assert 'rvd_measurements_total{backend="cpu",model_id="prom",variant="algebraic"} 1' in text
    # Which Gram path served: every CPU path listed, and this measurement's
    # 4 layers + 8 heads among the fast ones (earlier tests add more).
    served = {l.split('path="')[1].split('"')[0]: float(l.split()[-1])
              for l in text.splitlines() if l.startswith('rvd_engine_matrices_total{backend="cpu"')}
    assert set(served) == {"algebraic/cpu-avx512", "algebraic/openblas-ssyrk",
                           "algebraic/float64-fallback"}
    assert served["algebraic/cpu-avx512"] + served["algebraic/openblas-ssyrk"] >= 12
    assert "served_total=algebraic/" in daemon.log_text()
    assert "rvd_measurement_duration_seconds_bucket" in text
    assert "rvd_build_info{" in text
    assert "rvd_ingested_bytes_total" in text
    assert 'rvd_errors_total{code="INVALID_ARGUMENT"}' in text  # from earlier tests
    p = subprocess.run(["promtool", "check", "metrics"], input=text,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


# ---- limits and lifecycle ----------------------------------------------------

def test_request_byte_limit_answers_resource_exhausted(tmp_path):
    d = Daemon(tmp_path, max_request_bytes=100000)
    try:
        arrays = [np.ones((64, 512), np.float32) * (i + 1) for i in range(2)]
        assert_code(lambda: d.stub.MeasureStream(
            chunks(header_for("huge", arrays), [a.tobytes() for a in arrays])),
            grpc.StatusCode.RESOURCE_EXHAUSTED, "max_request_bytes")
        small = [np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)]
        assert d.stub.Measure(rvd_pb2.MeasureRequest(
            header=header_for("small", small), data=[small[0].tobytes()])).model_id == "small"
    finally:
        assert d.stop() == 0


def test_sigterm_finishes_in_flight_work_and_exits_zero(tmp_path):
    d = Daemon(tmp_path)
    rng = np.random.default_rng(14)
    arrays = [rng.standard_normal((256, 4096)).astype(np.float32) for _ in range(16)]
    header = header_for("inflight", arrays)
    future = d.stub.MeasureStream.future(chunks(header, [a.tobytes() for a in arrays]))
    time.sleep(0.3)
    start = time.time()
    d.proc.send_signal(signal.SIGTERM)
    m = future.result(timeout=30)
    assert len(m.layers) == 16
    assert d.proc.wait(timeout=10) == 0
    assert time.time() - start < 8
    assert "stopped" in d.log_text()


def test_bad_config_fails_to_start_with_a_message(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("grpc_adress: 127.0.0.1:1\n")
    r = subprocess.run([str(RVD), "--config", str(cfg)], capture_output=True, text=True,
                       timeout=20)
    assert r.returncode != 0 and "grpc_adress" in r.stderr
