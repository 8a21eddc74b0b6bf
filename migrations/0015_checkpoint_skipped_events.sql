-- CHECKPOINT_SKIPPED: rank 0 skipped a periodic checkpoint because the upload of the one
-- before was still going out (the checkpoint store unreachable, a slow link); the api appends
-- it from rank 0's checkpoint_skipped progress record (services/api/trainer_events.h).
ALTER TABLE job_events DROP CONSTRAINT job_events_type_check;
ALTER TABLE job_events ADD CONSTRAINT job_events_type_check CHECK (type IN
  ('STATE_CHANGED', 'RANK_FAILED', 'NODE_LOST', 'HANG_DETECTED', 'CHECKPOINT_COMMITTED',
   'CANCEL_REQUESTED', 'CHECKPOINT_CORRUPT', 'CHECKPOINT_SKIPPED'));
-- One per skipped step and attempt: an agent ships a batch of lines again when it saw no
-- answer, and the event must not repeat with it.
CREATE UNIQUE INDEX job_events_checkpoint_skipped ON job_events (job_id, attempt, checkpoint_step)
  WHERE type = 'CHECKPOINT_SKIPPED';
