# One image for every streamrec role (pass builder, pserver, trainer, the Airflow services and
# their tasks, serving).
FROM python:3.11-slim-bookworm
# curl: the healthcheck of airflow-api-server in docker-compose.yml
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
# every package of [tool.setuptools] packages in pyproject.toml, and the DAG and configs
COPY streamrec streamrec
COPY streaming streaming
COPY trainers trainers
COPY serving_export serving_export
COPY devservices devservices
COPY demo demo
COPY ops ops
COPY configs configs
COPY dags dags
# [postgres]: the metadata database driver (psycopg2) that docker-compose.yml uses
RUN pip install --no-cache-dir -e ".[airflow]" "apache-airflow[postgres]==3.3.2"
ENV STREAMREC_CONFIG=/app/configs/pipeline.docker.yaml
