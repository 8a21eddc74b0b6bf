-- Script jobs (JobSpec.script, issue #31).

-- Code archives (code.proto): the blob is kept once per sha256 under the checkpoint store's
-- data directory (code/<sha256>); a row says that a tenant uploaded it, so a tenant sees only
-- what it uploaded itself, even when another uploaded the same bytes.
CREATE TABLE code_archives (
  tenant_id      bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
  sha256         text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
  size_bytes     bigint NOT NULL CHECK (size_bytes >= 0),
  unpacked_bytes bigint NOT NULL CHECK (unpacked_bytes >= 0),
  entries        integer NOT NULL CHECK (entries >= 0),
  create_time    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, sha256)
);
CREATE INDEX code_archives_by_sha256 ON code_archives (sha256);

-- Rank credentials (NodeService.IssueRankCredential): a JOB token acts only on its job, and
-- only while its attempt is the job's current one and the job has not ended.
ALTER TABLE api_tokens DROP CONSTRAINT api_tokens_kind_check;
ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_kind_check
  CHECK (kind IN ('TENANT', 'NODE', 'JOB'));
ALTER TABLE api_tokens ADD COLUMN job_id uuid REFERENCES jobs (id) ON DELETE CASCADE;
ALTER TABLE api_tokens ADD COLUMN attempt integer CHECK (attempt >= 1);
ALTER TABLE api_tokens ADD COLUMN rank integer CHECK (rank >= 0);
ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_job_check
  CHECK ((kind = 'JOB') = (job_id IS NOT NULL AND attempt IS NOT NULL AND rank IS NOT NULL));
CREATE INDEX api_tokens_by_job ON api_tokens (job_id) WHERE job_id IS NOT NULL;

-- MASTER_PORT of script jobs: the base port of the node running rank 0, plus rank 0's slot.
ALTER TABLE nodes ADD COLUMN master_port_base integer NOT NULL DEFAULT 0
  CHECK (master_port_base >= 0 AND master_port_base <= 65535);
