# A stand-in for the postgres:15 image, which cannot be pulled here: Debian 12's PostgreSQL 15
# with the same contract (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, data in
# /var/lib/postgresql/data, port 5432, pg_isready).
FROM debian:12
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -q && apt-get install -y -q --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
RUN mkdir -p "$PGDATA" /var/run/postgresql && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
USER postgres
EXPOSE 5432
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
