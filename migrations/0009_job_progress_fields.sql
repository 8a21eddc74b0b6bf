-- The rest of a job's progress (JobProgress.epoch, learning_rate, eval_metrics): until now only
-- the step, total, loss and samples/s were kept, so every job read back epoch 0 and lr 0 and no
-- evaluation. Written from rank 0's progress and evaluation lines with the others; each column
-- keeps its value until a line that carries it says otherwise (services/api/job_metrics.h,
-- RecordJobProgress). NULL: not reported yet.
ALTER TABLE jobs ADD COLUMN progress_epoch bigint CHECK (progress_epoch >= 0);
ALTER TABLE jobs ADD COLUMN progress_learning_rate double precision;
-- The latest evaluation's metrics by name, e.g. {"accuracy": 0.97}.
ALTER TABLE jobs ADD COLUMN progress_eval_metrics jsonb
  CHECK (jsonb_typeof(progress_eval_metrics) = 'object');
