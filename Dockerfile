# syntax=docker/dockerfile:1
# One image for every gpushare component: the entrypoint is `gpushare`, the chart picks the
# subcommand (extender, device-plugin, webhook, ...). `make image` builds it.
#
# Stage 1 builds wheels: gpushare's own (its build backend, packaging/, generates the gRPC stubs
# from its .proto copies, which git does not keep) and every dependency pinned by constraints.txt, so the runtime stage
# installs offline from that directory and carries no compiler, cache or source tree. The builder
# is the full Debian image, whose gcc compiles the CUDA interposer (libgpushare-cuda.so, package
# data of the wheel) on the runtime's Debian release, so the two agree on glibc.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG BUILDER_IMAGE=python:3.11-bookworm

FROM ${BUILDER_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /build
COPY pyproject.toml constraints.txt README.md ./
COPY packaging ./packaging
COPY src ./src
RUN python -m pip wheel --no-cache-dir -c constraints.txt --wheel-dir /wheels .

# Stage 2: the runtime. Non-root by default (uid 65532). Only the device plugin needs root: it
# creates its sockets in kubelet's /var/lib/kubelet/device-plugins hostPath, which root owns,
# so the Helm chart gives that one container runAsUser 0 (and privileged, a value).
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpushare" \
      org.opencontainers.image.description="Shared GPU scheduling for Kubernetes (aliyun.com/gpu-mem)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 65532 gpushare \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin gpushare
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links /wheels "gpushare==${VERSION}"
USER 65532:65532
ENTRYPOINT ["gpushare"]
CMD ["--help"]
