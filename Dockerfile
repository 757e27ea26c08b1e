# syntax=docker/dockerfile:1
#
# kube-icl: one image for every component. Entry points in the cluster:
#   icl plugin   (DaemonSet, manifests/deviceplugin/daemonset.yaml: runs as uid 0, see "Why the plugin runs as root")
#   icl extender (Deployment, manifests/scheduler/deploy/extender.yaml: the image's default non-root user)
# `icl sim --no-plots` works too; plots need the `plot` extra (matplotlib), left out to keep the image small.
#
#   docker build -t kube-icl:dev --build-arg REVISION=$(git rev-parse HEAD) .
#
# CI builds this very file without a Docker daemon: hack/image/build.py runs each FROM/COPY/RUN/ENV/USER step in
# a chroot of a debootstrap of the same Debian release, then assembles an OCI image with crane (docs/image.md).
# It understands ARG, FROM, ENV, RUN (shell form), COPY (--from, --chown), WORKDIR, USER, LABEL,
# ENTRYPOINT and CMD (JSON form) only: keep to those.
#
# Why the plugin runs as root (the DaemonSet sets runAsUser: 0, drops every capability, no privilege escalation):
# * it must create its socket in the kubelet's /var/lib/kubelet/device-plugins (hostPath, root:root 0755): creating
#   a file there needs write permission on the directory, which only its owner, uid 0, has;
# * it must connect to kubelet.sock there (root:root 0755 socket): connecting to a unix socket needs write
#   permission on it, again only uid 0;
# * the nvml backend opens /dev/nvidiactl and /dev/nvidiaN (root-owned; mode 0666 by default, 0660 with the
#   driver's NVreg_DeviceFileMode/NVreg_DeviceFileGID): uid 0 is their owner.
# uid 0 without capabilities is enough for all three (ordinary owner permissions; no CAP_DAC_OVERRIDE), which is
# why the DaemonSet drops ALL. A non-root uid would need CAP_DAC_OVERRIDE, and Kubernetes cannot grant a
# capability to a non-root process (no ambient capabilities), so there is no safer setting that works.

# Debian 12 point release, slim variant: Debian's own python3 (3.11), reproducible from the Debian archive.
# Release builds may pin a digest: --build-arg BASE=debian:12.15-slim@sha256:...
ARG BASE=debian:12.15-slim

# ---------------------------------------------------------------------------------------------------- builder
FROM ${BASE} AS builder
ARG DEBIAN_FRONTEND=noninteractive
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_NO_INPUT=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
# Dependencies before the sources, so that a source change reuses this layer. Every file pip fetches is checked
# against the sha256 of the lock files (make lock regenerates them from pyproject.toml).
COPY hack/image/requirements.lock hack/image/build-requirements.lock /tmp/lock/
RUN python3 -m venv /opt/build \
 && /opt/build/bin/python -m pip install --require-hashes --no-deps -r /tmp/lock/build-requirements.lock \
 && python3 -m venv --without-pip /opt/kube-icl \
 && /opt/build/bin/pip --python /opt/kube-icl/bin/python install \
      --require-hashes --no-deps --only-binary=:all: -r /tmp/lock/requirements.lock
# The whole context less what .dockerignore leaves out (tests, docs, caches, ...): a new package listed in
# pyproject.toml's packages.find comes along without touching this file.
COPY . /src/
# The app as a wheel (built offline from the locked setuptools), then installed without touching the network.
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/dist /src \
 && /opt/build/bin/pip --python /opt/kube-icl/bin/python install --no-deps --no-index /tmp/dist/kube_icl-*.whl \
 && /opt/build/bin/pip --python /opt/kube-icl/bin/python check \
 && /opt/kube-icl/bin/python -m compileall -q -j 0 /opt/kube-icl/lib

# ---------------------------------------------------------------------------------------------------- runtime
FROM ${BASE}
ARG VERSION=0.1.0
ARG REVISION=
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && groupadd --system --gid 65532 icl \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin icl
COPY --from=builder /opt/kube-icl /opt/kube-icl
ENV PATH=/opt/kube-icl/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    ICL_REVISION=${REVISION}
LABEL org.opencontainers.image.title="kube-icl" \
      org.opencontainers.image.description="Kubernetes device plugin and scheduler extender for accelerators joined by inter-chip links" \
      org.opencontainers.image.source="https://github.com/kube-icl/kube-icl" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
WORKDIR /
USER 65532:65532
ENTRYPOINT ["icl"]
CMD ["--help"]
