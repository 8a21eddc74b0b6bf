-- Encryption at rest of the checkpoint store (services/checkpoint/key_store.h): the data keys
-- that seal blobs, each wrapped (AES-256-GCM) by the master key of gradhub-checkpoint's
-- --master-key-file, whose id (a fingerprint) is kept beside it. tenant_id NULL: the platform's
-- own key (code archives, kept once for every tenant). A tenant's keys go with the tenant: its
-- blobs can no longer be read (crypto-shredding).
CREATE TABLE checkpoint_keys (
  id            uuid PRIMARY KEY,
  tenant_id     bigint REFERENCES tenants (id) ON DELETE CASCADE,
  wrapped_key   bytea NOT NULL CHECK (octet_length(wrapped_key) = 60),
  master_key_id text NOT NULL CHECK (master_key_id ~ '^[0-9a-f]{16}$'),
  create_time   timestamptz NOT NULL DEFAULT now(),
  -- Set by a rotation: no new blob is sealed under it; those sealed before still read.
  retire_time   timestamptz
);

-- One current key per scope (tenant ids start at 1, so 0 stands for the platform).
CREATE UNIQUE INDEX checkpoint_keys_current ON checkpoint_keys (coalesce(tenant_id, 0))
  WHERE retire_time IS NULL;
CREATE INDEX checkpoint_keys_by_master ON checkpoint_keys (master_key_id);
