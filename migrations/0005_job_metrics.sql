-- A job's training history by step (JobService.GetJobMetrics), kept with the job so that it
-- outlives the metrics service's series. Written by the api from rank 0's progress and
-- evaluation lines as the agents ship them (services/api/job_metrics.h).

-- One point per step: the progress interval ending at that step (loss, learning rate,
-- samples/s) and/or the evaluation run at it (eval_metrics, e.g. {"accuracy": 0.97}). Both
-- kinds of line of one step fill the same row. Keyed by (job, step) alone, not by attempt: a
-- re-shipped line lands on its own row and is absorbed (ON CONFLICT, same values), and a step
-- that a newer attempt trains again after a restart overwrites the older attempt's point, so
-- the history is the one the finished model went through. NULL progress columns: an
-- evaluation-only point (or a value the trainer could not print, NaN).
CREATE TABLE job_metric_points (
  job_id             uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  step               bigint NOT NULL CHECK (step >= 0),
  attempt            integer NOT NULL CHECK (attempt >= 1),
  -- When the api received the line (agents ship lines without times).
  time               timestamptz NOT NULL DEFAULT now(),
  loss               double precision,
  learning_rate      double precision,
  samples_per_second double precision,
  eval_metrics       jsonb CHECK (jsonb_typeof(eval_metrics) = 'object'),
  PRIMARY KEY (job_id, step)
);
