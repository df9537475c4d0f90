#!/bin/sh
# docker-compose.yml's cluster profile, run once by the postgres image when it makes
# the primary's data directory: a role for the standby to stream WAL with, and the
# line of pg_hba.conf that lets it (the image's own lines cover databases, not
# replication). Passwords come from the environment Compose hands the container.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v password="$REPLICATION_PASSWORD" <<'SQL'
CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD :'password';
SQL
echo "host replication replicator all scram-sha-256" >> "$PGDATA/pg_hba.conf"
