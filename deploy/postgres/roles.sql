-- fencepost's database roles, least privilege. Run once by the superuser on an
-- empty database (docker compose: deploy/postgres/ensure-roles.sh, in the one-shot
-- `roles` service, when the roles are missing; elsewhere, by hand:
--   psql -v ON_ERROR_STOP=1 -d fencepost -v database=fencepost \
--        -v migrator=fencepost_migrator -v migrator_password=... \
--        -v runtime=fencepost_runtime -v runtime_password=... -f roles.sql
--
--   migrator  owns the schema: `fencepost migrate` runs as it (DDL, alembic).
--   runtime   the API and the workers: SELECT/INSERT/UPDATE/DELETE on fencepost's
--             tables, USAGE on its sequences, EXECUTE on its functions; no DDL,
--             no TRUNCATE, no ownership of anything.

CREATE ROLE :"migrator" LOGIN PASSWORD :'migrator_password';
CREATE ROLE :"runtime" LOGIN PASSWORD :'runtime_password';

-- Only these two roles (and the superuser) connect; nobody creates temporary
-- tables or other schemas in this database.
REVOKE ALL ON DATABASE :"database" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"database" TO :"migrator", :"runtime";

-- The migrator owns the schema, so every table, index, sequence and function
-- `fencepost migrate` creates is the migrator's; the runtime role may use the
-- schema's objects but create none.
ALTER SCHEMA public OWNER TO :"migrator";
REVOKE ALL ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO :"runtime";

-- Rights on what the migrator creates from now on (every migration).
ALTER DEFAULT PRIVILEGES FOR ROLE :"migrator" IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"runtime";
ALTER DEFAULT PRIVILEGES FOR ROLE :"migrator" IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO :"runtime";
-- (Functions are executable by PUBLIC by default: a per-schema default cannot
-- take that back, the role-wide one can.)
ALTER DEFAULT PRIVILEGES FOR ROLE :"migrator" REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
ALTER DEFAULT PRIVILEGES FOR ROLE :"migrator" IN SCHEMA public
    GRANT EXECUTE ON FUNCTIONS TO :"runtime";
