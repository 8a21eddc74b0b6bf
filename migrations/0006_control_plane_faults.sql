-- Control plane under faults (issue 23).

-- CANCELLING: CancelJob asked the agents to stop the job's ranks and they have not all been
-- reported gone yet (Kubernetes' Terminating). The scheduler moves the job to CANCELLED once
-- no rank of it is live, so CANCELLED always means that no process of the job runs.
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN
  ('PENDING', 'SCHEDULED', 'RUNNING', 'RESTARTING', 'CANCELLING',
   'SUCCEEDED', 'FAILED', 'CANCELLED'));
INSERT INTO job_state_transitions (from_state, to_state) VALUES
  ('SCHEDULED',  'CANCELLING'),
  ('RUNNING',    'CANCELLING'),
  ('RESTARTING', 'CANCELLING'),
  ('CANCELLING', 'CANCELLED');
-- The scheduler's scan for cancellations to finish.
CREATE INDEX jobs_cancelling ON jobs (id) WHERE state = 'CANCELLING';

-- CHECKPOINT_COMMITTED events say where a restart will resume: the checkpoint's step and size
-- (JobEvent.checkpoint_step, checkpoint_size_bytes), written in the commit's transaction.
ALTER TABLE job_events ADD COLUMN checkpoint_step bigint CHECK (checkpoint_step >= 0);
ALTER TABLE job_events ADD COLUMN checkpoint_size_bytes bigint CHECK (checkpoint_size_bytes >= 0);
