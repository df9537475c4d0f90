#!/bin/sh
# docker-compose.yml's cluster profile: the synchronous standby. The first time (an
# empty data directory), a base backup of the primary with -R (primary_conninfo and
# standby.signal); every time, PostgreSQL streaming from it, under the name the
# primary's synchronous_standby_names waits for (standby).
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    until PGPASSWORD="$REPLICATION_PASSWORD" pg_basebackup -h pg-primary -U replicator \
        -D "$PGDATA" -X stream -R --checkpoint=fast; do
        echo "pg-standby: waiting for pg-primary" >&2
        sleep 2
    done
    chmod 0700 "$PGDATA"
fi
exec postgres -c cluster_name=standby -c hot_standby=on
