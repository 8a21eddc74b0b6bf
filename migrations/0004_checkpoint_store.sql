-- The checkpoint store (services/checkpoint): uploads in three steps, BAD blobs, deletion marks.

-- A checkpoint row is created by StartUpload (UPLOADING) and becomes COMMITTED once its blob is
-- durable under its final key. BAD: its blob no longer matched its sha256 or was missing (kept
-- for the history, never served). DELETED: marked by retention or DeleteCheckpoint in the
-- transaction that decided it; its blob and row are removed right after, or by the start-up
-- cleanup when the server died in between.
ALTER TABLE checkpoints DROP CONSTRAINT checkpoints_state_check;
ALTER TABLE checkpoints ADD CONSTRAINT checkpoints_state_check
  CHECK (state IN ('UPLOADING', 'COMMITTED', 'BAD', 'DELETED'));

-- The handle of an upload in UploadChunks and CommitCheckpoint, and its key in the blob store.
-- Bytes received are not kept here: the blob store knows them, and a row update per chunk would
-- cost more than the chunk.
ALTER TABLE checkpoints ADD COLUMN upload_id uuid NOT NULL DEFAULT gen_random_uuid();
ALTER TABLE checkpoints ADD CONSTRAINT checkpoints_upload_id_key UNIQUE (upload_id);
-- A retried StartUpload carries the same request_id and gets the same upload back.
ALTER TABLE checkpoints ADD COLUMN request_id text CHECK (length(request_id) <= 64);
ALTER TABLE checkpoints ADD CONSTRAINT checkpoints_job_request_id_key UNIQUE (job_id, request_id);
-- Why a checkpoint is BAD (sha256 mismatch, blob missing), and when that was found.
ALTER TABLE checkpoints ADD COLUMN bad_reason text;
ALTER TABLE checkpoints ADD COLUMN bad_time timestamptz;
ALTER TABLE checkpoints ADD CONSTRAINT checkpoints_bad_reason_check
  CHECK (state <> 'BAD' OR bad_reason IS NOT NULL);

-- ListCheckpoints and GetLatestCheckpoint: a job's checkpoints, newest step first.
CREATE INDEX checkpoints_by_job_step ON checkpoints (job_id, step DESC, id DESC);
-- The cleanup's scans: uploads that may be stale, rows whose blob is to be removed.
CREATE INDEX checkpoints_unfinished ON checkpoints (state, create_time)
  WHERE state IN ('UPLOADING', 'DELETED');

ALTER TABLE job_events DROP CONSTRAINT job_events_type_check;
ALTER TABLE job_events ADD CONSTRAINT job_events_type_check CHECK (type IN
  ('STATE_CHANGED', 'RANK_FAILED', 'NODE_LOST', 'HANG_DETECTED', 'CHECKPOINT_COMMITTED',
   'CANCEL_REQUESTED', 'CHECKPOINT_CORRUPT'));
