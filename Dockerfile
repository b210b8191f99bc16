# syntax=docker/dockerfile:1
# One image, five entry points: python -m agent | binder | loader | proxy | webhook (and the
# `tritonshare` CLI). Build: docker build -t ghcr.io/tritonshare/tritonshare:0.1.0 .
# (see docs/deploy.md). The tag and the version label are common/version.py's VERSION
# (tests/deploy/test_version.py checks the label).
#
# Stage 1 installs the project and its dependencies into a virtual environment (every dependency
# ships manylinux wheels) and compiles the proxy's hot modules with mypyc (`python -m
# proxy.native`, docs/proxy.md "The native build (mypyc)"): the only stage with a C compiler. The
# final stage gets only the venv, whose proxy package holds the compiled modules beside their
# sources.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG MYPY_VERSION=2.4.1
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/tritonshare
WORKDIR /src
COPY pyproject.toml README.md ./
COPY common ./common
COPY protos ./protos
COPY agent ./agent
COPY binder ./binder
COPY loader ./loader
COPY proxy ./proxy
COPY webhook ./webhook
# Not sim/ (the simulated cluster for tests and the demo), tests/ or benchmarks/: the product
# never imports them (import-linter), and an image should not carry a fake API server.
# A regular (not editable) install: the final stage must not depend on /src.
RUN /opt/tritonshare/bin/pip install '.[server]'
# The native build, from the same sources, then its extensions next to the installed modules
# (an extension module is found before the .py beside it). mypy and setuptools leave with pip.
RUN /opt/tritonshare/bin/pip install "mypy==${MYPY_VERSION}" "setuptools>=68" \
 && /opt/tritonshare/bin/python -m proxy.native --out /src/build/native \
 && site="$(/opt/tritonshare/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && cd /src/build/native \
 && find . -name '*.so' -exec cp --parents {} "$site" \; \
 && cd /src \
 && /opt/tritonshare/bin/pip uninstall -y mypy mypy_extensions pathspec librt ast-serialize \
 && /opt/tritonshare/bin/python -P -c 'import proxy.app, proxy.gateway.app, proxy.grpc.relay as m; assert m.__file__.endswith(".so"), m.__file__' \
 && /opt/tritonshare/bin/python -m compileall -q /opt/tritonshare/lib \
 && /opt/tritonshare/bin/pip uninstall -y pip setuptools

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="tritonshare" \
      org.opencontainers.image.description="Share GPUs between many ML models on Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"
COPY --from=build /opt/tritonshare /opt/tritonshare
ENV PATH=/opt/tritonshare/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric user, so Kubernetes' runAsNonRoot can verify it without looking into /etc/passwd.
USER 10001:10001
WORKDIR /tmp
# The manifests set the command per container; a bare `docker run` prints the CLI's help.
CMD ["tritonshare", "--help"]
