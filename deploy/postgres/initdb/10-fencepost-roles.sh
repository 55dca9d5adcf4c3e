#!/bin/sh
# Run by the postgres image's entrypoint once, when it initializes an empty
# data volume (later starts skip /docker-entrypoint-initdb.d): creates the
# migrator and runtime roles of deploy/postgres/roles.sql with the passwords
# compose passes in. A volume initialized before this script existed keeps
# its roles: run roles.sql by hand (see its header).
set -eu
: "${FENCEPOST_MIGRATOR_PASSWORD:?set FENCEPOST_MIGRATOR_PASSWORD}"
: "${FENCEPOST_RUNTIME_PASSWORD:?set FENCEPOST_RUNTIME_PASSWORD}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
     -v database="$POSTGRES_DB" \
     -v migrator=fencepost_migrator -v migrator_password="$FENCEPOST_MIGRATOR_PASSWORD" \
     -v runtime=fencepost_runtime -v runtime_password="$FENCEPOST_RUNTIME_PASSWORD" \
     -f /fencepost/roles.sql
