-- The audit log (audit.proto, issue 36): one row per mutating call of a tenant or of the admin
-- (CreateJob, CancelJob, CreateTenant, CreateToken, RevokeToken, CordonNode, DrainNode,
-- DeleteCheckpoint, UploadCode), refused calls included, written by gradhub-api and
-- gradhub-checkpoint (services/common/audit/) and read through AuditService.ListAuditEvents.
CREATE TABLE audit_events (
  -- `auditEvents/{id}`; increasing in the order the calls ended (the row is written as the
  -- call's status is sent).
  id        bigserial PRIMARY KEY,
  time      timestamptz NOT NULL DEFAULT clock_timestamp(),
  -- "admin", "unauthenticated", or the token's name: tenants/{t}/tokens/{id} (tenants/-/... for
  -- node and job tokens).
  actor     text NOT NULL CHECK (actor <> ''),
  -- tenants/{t} the call acted as or on; '' for node operations and calls of no tenant.
  tenant    text NOT NULL DEFAULT '',
  -- gradhub.v1.JobService/CancelJob
  method    text NOT NULL CHECK (method ~ '^gradhub\.v1\.[A-Za-z]+/[A-Za-z]+$'),
  resource  text NOT NULL DEFAULT '',
  -- "OK" or a gRPC status code name.
  outcome   text NOT NULL CHECK (outcome ~ '^[A-Z_]+$'),
  message   text NOT NULL DEFAULT '' CHECK (char_length(message) <= 512),
  transport text NOT NULL CHECK (transport IN ('grpc', 'rest')),
  peer      text NOT NULL DEFAULT ''
);

-- A tenant's listing, newest first: ListAuditEvents forces a tenant token's filter to its own
-- tenant. The admin's unfiltered listing walks the primary key backwards.
CREATE INDEX audit_events_by_tenant ON audit_events (tenant, id DESC);

-- Insert-only. The schema has no roles of its own (every server connects as the one
-- --database-url user, the tables' owner), so no GRANT can take UPDATE and DELETE away from
-- the api; these triggers refuse them instead, for every user, until an operator drops them on
-- purpose (e.g. to apply a retention policy).
CREATE FUNCTION audit_events_insert_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'audit_events is insert-only: % refused', TG_OP
    USING ERRCODE = 'GH002';
END;
$$;
CREATE TRIGGER audit_events_insert_only BEFORE UPDATE OR DELETE ON audit_events
  FOR EACH ROW EXECUTE FUNCTION audit_events_insert_only();
CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events
  FOR EACH STATEMENT EXECUTE FUNCTION audit_events_insert_only();
