-- Whether the ranks of a failed attempt are stopped at once (SIGKILL) rather than with SIGTERM
-- and the agents' grace (nodes.proto heartbeat step 4a; issue 37). Decided when the attempt
-- fails, from its cause (FailureDiscardsRanks, services/api/scheduling_rules.h): true when one of
-- its own ranks failed or it hung, so that the survivors, which can finish no step, do not hold
-- the next attempt for the grace; false for a drained or lost node, whose ranks' rank 0 may
-- still commit its last step. Existing rows (and every attempt that has not failed) are false:
-- their ranks are stopped with the grace, as before.
ALTER TABLE job_attempts ADD COLUMN discard_ranks boolean NOT NULL DEFAULT false;
