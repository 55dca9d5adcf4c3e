#!/bin/sh
# Run by compose's one-shot `roles` service as the superuser (PGHOST, PGUSER,
# PGPASSWORD, PGDATABASE), before `migrate`: creates the migrator and runtime roles
# of roles.sql with the passwords compose passes in, unless they exist. One
# transaction (-1): either both roles with all their grants, or nothing. Roles that
# exist keep their passwords (change one with ALTER ROLE ... PASSWORD).
set -eu
: "${MIGRATOR_PASSWORD:?set MIGRATOR_PASSWORD}"
: "${RUNTIME_PASSWORD:?set RUNTIME_PASSWORD}"
here=$(dirname "$0")
exists=$(psql -v ON_ERROR_STOP=1 -tAc \
  "SELECT count(*) FROM pg_roles WHERE rolname IN ('fencepost_migrator', 'fencepost_runtime')")
if [ "$exists" = 2 ]; then
  echo "roles: fencepost_migrator and fencepost_runtime exist"
  exit 0
fi
psql -1 -v ON_ERROR_STOP=1 \
     -v database="$PGDATABASE" \
     -v migrator=fencepost_migrator -v migrator_password="$MIGRATOR_PASSWORD" \
     -v runtime=fencepost_runtime -v runtime_password="$RUNTIME_PASSWORD" \
     -f "$here/roles.sql"
echo "roles: created fencepost_migrator and fencepost_runtime"
