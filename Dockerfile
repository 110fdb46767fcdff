# syntax=docker/dockerfile:1
# Multi-stage: build a virtualenv with the project, copy only the venv into a slim runtime
# image that runs as a non-root user.

# The base, in this one place, by its full patch tag (both stages start from it). `make
# test-image` builds its stand-in under this same name (tests/image/base.sh reads it here).
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A C compiler, in this stage only: the install compiles the record rules (setup.py, mypyc; the
# base image has Python's headers). The runtime stage gets the built venv and no compiler.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# The exact, hashed versions of requirements.lock first (a layer that changes only with it),
# then the project itself without resolving anything again.
COPY requirements.lock ./
RUN pip install --require-hashes -r requirements.lock
COPY pyproject.toml setup.py README.md LICENSE settings.py ./
COPY bulk_recorder ./bulk_recorder
COPY consumer ./consumer
# The source revision, stamped into the package (bulk_recorder/build.py; no .git in the context).
ARG REVISION=unknown
RUN BULK_RECORDER_REVISION="${REVISION}" pip install --no-deps . \
 && python -m compileall -q /opt/venv

FROM ${PYTHON_IMAGE} AS runtime
ARG PYTHON_IMAGE
# What this image is. bulk_recorder.__version__: scripts/release.sh and tests/image/run.sh
# pass it (--build-arg VERSION=...), and tests/ops/test_dockerfile.py keeps this default equal
# to it for a plain `docker build`; they pass REVISION (the commit) and CREATED (RFC 3339) too.
ARG VERSION=1.0.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE=https://github.com/bulk-recorder/bulk-recorder
LABEL org.opencontainers.image.title="bulk-recorder" \
      org.opencontainers.image.description="Moves high-volume records from RabbitMQ into PostgreSQL in bulk: acked after commit, nothing lost, nothing doubled." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.documentation="${SOURCE}/tree/main/docs" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
RUN groupadd --system --gid 10001 recorder \
 && useradd --system --uid 10001 --gid recorder --no-create-home --shell /usr/sbin/nologin recorder
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LOG_FORMAT=json \
    API_HOST=0.0.0.0 \
    METRICS_HOST=0.0.0.0
USER 10001:10001
# No METRICS_PORT here: each role listens on its own default (docs/settings.md), as outside a
# container: consume 9464, relay 9465, api 8080 (API_PORT, /metrics included).
EXPOSE 9464 9465 8080
STOPSIGNAL SIGTERM
# One check for every role: `bulk-recorder healthcheck` finds the role this container runs
# (consume, relay or api) and asks its own /healthz, on the port that role's settings give.
# Health is liveness: a database or broker outage leaves the container healthy (readiness stays
# on /readyz, for a load balancer or `bulk-recorder healthcheck --ready`). Standard library only.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
  CMD ["bulk-recorder", "healthcheck"]
ENTRYPOINT ["bulk-recorder"]
CMD ["consume"]
