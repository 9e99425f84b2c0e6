"""The generated gRPC stubs, with an error that says where they come from."""
try:
    from rvd.v1 import rvd_pb2, rvd_pb2_grpc  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the checkout
    raise ImportError(
        "rvd's gRPC stubs (rvd/v1/rvd_pb2.py, rvd_pb2_grpc.py) are missing: "
        "the build generates them from proto/rvd/v1/rvd.proto (`make build`, "
        "or `cmake --build BUILD --target rvd_python_client`), then install "
        "again: " + str(e)) from e

__all__ = ["rvd_pb2", "rvd_pb2_grpc"]
