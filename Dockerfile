# syntax=docker/dockerfile:1
# Multi-stage: build a virtualenv with the project, copy only the venv into a slim runtime
# image that runs as a non-root user.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# The exact, hashed versions of requirements.lock first (a layer that changes only with it),
# then the project itself without resolving anything again.
COPY requirements.lock ./
RUN pip install --require-hashes -r requirements.lock
COPY pyproject.toml README.md settings.py ./
COPY bulk_recorder ./bulk_recorder
COPY consumer ./consumer
RUN pip install --no-deps . && python -m compileall -q /opt/venv

FROM python:3.11-slim AS runtime
RUN groupadd --system --gid 10001 recorder \
 && useradd --system --uid 10001 --gid recorder --no-create-home --shell /usr/sbin/nologin recorder
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LOG_FORMAT=json \
    API_HOST=0.0.0.0 \
    METRICS_HOST=0.0.0.0 \
    METRICS_PORT=9464
USER 10001:10001
EXPOSE 9464 8080
STOPSIGNAL SIGTERM
# One check for every role: `bulk-recorder healthcheck` finds the role this container runs
# (consume, relay or api) and asks its own /healthz, on the port that role's settings give.
# Health is liveness: a database or broker outage leaves the container healthy (readiness stays
# on /readyz, for a load balancer or `bulk-recorder healthcheck --ready`). Standard library only.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
  CMD ["bulk-recorder", "healthcheck"]
ENTRYPOINT ["bulk-recorder"]
CMD ["consume"]
