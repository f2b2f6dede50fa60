# slackinterp: the Slack bot and its kernels in one image, running as a non-root user.
#   docker build -t slackinterp .
#   docker run --env-file .env -v slackinterp-data:/data slackinterp
# bubblewrap needs user namespaces: with Docker's default seccomp profile it may not start;
# then SLACKINTERP_SANDBOX=auto falls back to no sandbox (see `slackinterp doctor`), or run with
# --security-opt seccomp=unconfined to keep it.
# Run as root anyway (USER removed), kernels run as SLACKINTERP_KERNEL_USER (nobody) through
# setpriv (util-linux), never as root; the interpreter below (/usr/local) is readable by it.
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap ca-certificates chromium tini \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 interp \
    && mkdir -p /data && chown interp:interp /data

WORKDIR /app
COPY pyproject.toml README.md manifest.yml ./
COPY slackinterp ./slackinterp
RUN pip install --no-cache-dir ".[analysis]"

USER interp
ENV SLACKINTERP_DATA_DIR=/data \
    SLACKINTERP_METRICS_PORT=9102 \
    PYTHONUNBUFFERED=1
VOLUME ["/data"]
# HTTP mode listens on 3000; /metrics and /healthz on 9102 (Socket Mode needs no inbound port).
EXPOSE 3000 9102
HEALTHCHECK --interval=30s --timeout=8s CMD ["python", "-c", "\
import sys, urllib.request\n\
for port in (9102, 3000):\n\
    try:\n\
        urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=3)\n\
        sys.exit(0)\n\
    except OSError:\n\
        pass\n\
sys.exit(1)"]
ENTRYPOINT ["tini", "--"]
CMD ["slackinterp", "run"]
