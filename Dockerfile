# syntax=docker/dockerfile:1
# rvd's image: the daemon, rvctl, the CUDA backend module and the default
# config on NVIDIA's CUDA runtime image, running as a non-root user.
#   docker build -t rvd:0.1.0 .
#   docker run --gpus all -p 50051:50051 -p 9464:9464 rvd:0.1.0
# Not built where it was written (no container engine there): see
# helm/README.md and tests/deploy/test_dockerfile.py for what is checked.
#
# Packages: the build stage installs the Makefile's DEBIAN_PACKAGES
# (`make deps`, the one list); the runtime stage installs the packages that
# own the shared libraries the built binaries load
# (deploy/docker/runtime-packages.sh), so no package is named twice.
# NVIDIA publishes CUDA images for Ubuntu, not Debian: 24.04 has the same
# package names as Debian 12 and is the GPU host's system (CUDA 13.0).
ARG CUDA_IMAGE_TAG=13.0.0-devel-ubuntu24.04
ARG CUDA_RUNTIME_TAG=13.0.0-runtime-ubuntu24.04

FROM nvidia/cuda:${CUDA_IMAGE_TAG} AS build
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# make itself, to run `make deps` (make is in DEBIAN_PACKAGES too).
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*
COPY Makefile ./
RUN make deps && rm -rf /var/lib/apt/lists/*
COPY CMakeLists.txt ./
COPY cmake cmake
COPY proto proto
COPY kernels kernels
COPY self_improve self_improve
COPY server server
COPY client client
COPY config config
COPY bench bench
COPY tests tests
COPY scripts scripts
COPY deploy/docker deploy/docker
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRVD_CUDA=ON \
 && cmake --build build -j"$(nproc)" --target rvd rvctl rvd_cuda \
 && test -f build/lib/librvd_cuda.so \
 && mkdir -p /out \
 && deploy/docker/runtime-packages.sh build/bin/rvd build/bin/rvctl build/lib/librvd_cuda.so \
      > /out/runtime-packages.txt

FROM nvidia/cuda:${CUDA_RUNTIME_TAG}
ENV DEBIAN_FRONTEND=noninteractive
COPY --from=build /out/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update -qq \
 && xargs -a /tmp/runtime-packages.txt apt-get install -y -qq --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt
# rvd's user (uid 10001, the chart's runAsUser) and its data directory.
RUN groupadd --system --gid 10001 rvd \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/rvd \
      --shell /usr/sbin/nologin rvd \
 && mkdir -p /var/lib/rvd && chown rvd:rvd /var/lib/rvd
# rvd looks for librvd_cuda.so beside itself and in ../lib.
COPY --from=build /src/build/bin/rvd /src/build/bin/rvctl /opt/rvd/bin/
COPY --from=build /src/build/lib/librvd_cuda.so /opt/rvd/lib/
COPY config/rvd.yaml /etc/rvd/rvd.yaml
ENV PATH=/opt/rvd/bin:$PATH
USER 10001:10001
EXPOSE 50051 9464
ENTRYPOINT ["/opt/rvd/bin/rvd"]
# The default config, listening on every address of the container (it
# binds loopback otherwise) and keeping its data in /var/lib/rvd.
CMD ["--config", "/etc/rvd/rvd.yaml", "--grpc-address", "0.0.0.0:50051", \
     "--metrics-address", "0.0.0.0:9464", "--data-dir", "/var/lib/rvd"]
