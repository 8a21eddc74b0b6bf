-- Node resources (issue 36), as each node's agent reports them at RegisterNode.

-- A rank's memory limit on the node (gradhub-agent --memory-per-slot); 0 = no limit. A job is
-- placed only where JobSpec.memoryPerRankMib fits it.
ALTER TABLE nodes ADD COLUMN memory_per_slot_bytes bigint NOT NULL DEFAULT 0
  CHECK (memory_per_slot_bytes >= 0);

-- Directories only one tenant's jobs may name (gradhub-agent --tenant-data-root TENANT=DIR): a
-- JSON array of {"tenant": "tenants/x", "path": "/dir"}. A job of tenants/x may name files under
-- data_roots and its own entries here, never another tenant's; CreateJob and the scheduler
-- both hold it to that.
ALTER TABLE nodes ADD COLUMN tenant_data_roots jsonb NOT NULL DEFAULT '[]'
  CHECK (jsonb_typeof(tenant_data_roots) = 'array');
