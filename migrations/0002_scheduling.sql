-- What the scheduler and the node protocol need beyond 0001.

-- Why a rank ended, in the agent's words (e.g. its last stderr line), for the event that
-- fails the attempt.
ALTER TABLE rank_assignments ADD COLUMN message text NOT NULL DEFAULT '';

-- When the job last entered the queue (submitted, or RESTARTING): the backfill rule bounds how
-- long a blocked job is passed over, counted from here.
ALTER TABLE jobs ADD COLUMN queued_time timestamptz NOT NULL DEFAULT now();

-- The controller's scan: attempts still in flight.
CREATE INDEX job_attempts_active ON job_attempts (job_id, attempt)
  WHERE state IN ('SCHEDULED', 'RUNNING');
-- Ranks of one attempt.
CREATE INDEX rank_assignments_by_attempt ON rank_assignments (job_id, attempt);
