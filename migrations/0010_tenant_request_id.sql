-- CreateTenant's request_id (tenants.proto): a retry with the same one returns the tenant the
-- first call created instead of ALREADY_EXISTS. Until now the api took the field and ignored
-- it. NULL: created without one.
ALTER TABLE tenants ADD COLUMN request_id text CHECK (length(request_id) <= 64);
