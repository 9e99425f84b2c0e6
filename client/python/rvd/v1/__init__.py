"""rvd.v1: the gRPC stubs of proto/rvd/v1/rvd.proto (rvd_pb2, rvd_pb2_grpc).

The build generates them into this directory (client/python/CMakeLists.txt);
they are not checked in. A checkout without them (a copy of the working tree
on a GPU host, next to a staged build: scripts/gpu_stage.sh) takes those of
$RVD_BUILD_DIR/python/rvd/v1, which every build writes too.
"""
import os
import pathlib

if not (pathlib.Path(__file__).parent / "rvd_pb2.py").is_file() and \
        os.environ.get("RVD_BUILD_DIR"):
    _built = pathlib.Path(os.environ["RVD_BUILD_DIR"]) / "python" / "rvd" / "v1"
    if (_built / "rvd_pb2.py").is_file():
        __path__.append(str(_built))  # noqa: F821 - the package's own path
