"""rvd.v1: the gRPC stubs of proto/rvd/v1/rvd.proto (rvd_pb2, rvd_pb2_grpc).

The build generates them into this directory (client/python/CMakeLists.txt);
they are not checked in.
"""
