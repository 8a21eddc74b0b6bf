-- The first schema of gradhub: tenants and tokens, jobs and their lifecycle, nodes and rank
-- placement, checkpoints, logs. Each migration runs in one transaction (see Migrator).

-- Tenants own jobs; a tenant sees only its own.
CREATE TABLE tenants (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  name         text NOT NULL UNIQUE CHECK (name ~ '^[a-z][a-z0-9-]{0,62}$'),
  display_name text NOT NULL DEFAULT '',
  create_time  timestamptz NOT NULL DEFAULT now()
);

-- Bearer tokens. Only the SHA-256 of a secret is stored; `prefix` (a few leading characters)
-- lets a person recognise a token in listings. Node tokens belong to no tenant.
CREATE TABLE api_tokens (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant_id    bigint REFERENCES tenants (id) ON DELETE CASCADE,
  kind         text NOT NULL CHECK (kind IN ('TENANT', 'NODE')),
  secret_sha256 bytea NOT NULL UNIQUE CHECK (octet_length(secret_sha256) = 32),
  prefix       text NOT NULL,
  description  text NOT NULL DEFAULT '',
  create_time  timestamptz NOT NULL DEFAULT now(),
  expire_time  timestamptz,
  revoke_time  timestamptz,
  CHECK ((kind = 'TENANT') = (tenant_id IS NOT NULL))
);

-- The job lifecycle (ARCHITECTURE.md) as data: every allowed state change is a row. The
-- trigger below refuses any other change, so no code path, however buggy, can move a job
-- out of a terminal state or skip a step.
CREATE TABLE job_state_transitions (
  from_state text NOT NULL,
  to_state   text NOT NULL,
  PRIMARY KEY (from_state, to_state)
);
INSERT INTO job_state_transitions (from_state, to_state) VALUES
  ('PENDING',    'SCHEDULED'),
  ('PENDING',    'CANCELLED'),
  ('SCHEDULED',  'RUNNING'),
  ('SCHEDULED',  'RESTARTING'),
  ('SCHEDULED',  'FAILED'),
  ('SCHEDULED',  'CANCELLED'),
  ('RUNNING',    'SUCCEEDED'),
  ('RUNNING',    'FAILED'),
  ('RUNNING',    'CANCELLED'),
  ('RUNNING',    'RESTARTING'),
  ('RESTARTING', 'SCHEDULED'),
  ('RESTARTING', 'FAILED'),
  ('RESTARTING', 'CANCELLED');

CREATE TABLE jobs (
  id                      uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id               bigint NOT NULL REFERENCES tenants (id),
  -- A retried CreateJob carries the same request_id and finds this row instead of making a
  -- second job.
  request_id              text,
  display_name            text NOT NULL DEFAULT '',
  labels                  jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),
  -- The JobSpec in the proto3 JSON mapping, exactly as accepted.
  spec                    jsonb NOT NULL CHECK (jsonb_typeof(spec) = 'object'),
  state                   text NOT NULL DEFAULT 'PENDING' CHECK (state IN
                            ('PENDING', 'SCHEDULED', 'RUNNING', 'RESTARTING',
                             'SUCCEEDED', 'FAILED', 'CANCELLED')),
  state_reason            text NOT NULL DEFAULT '',
  priority                integer NOT NULL DEFAULT 0,
  world_size              integer NOT NULL CHECK (world_size > 0),
  current_attempt         integer NOT NULL DEFAULT 0 CHECK (current_attempt >= 0),
  max_infra_restarts      integer NOT NULL DEFAULT 0 CHECK (max_infra_restarts >= 0),
  max_job_restarts        integer NOT NULL DEFAULT 0 CHECK (max_job_restarts >= 0),
  infra_restarts          integer NOT NULL DEFAULT 0 CHECK (infra_restarts >= 0),
  job_restarts            integer NOT NULL DEFAULT 0 CHECK (job_restarts >= 0),
  cancel_requested        boolean NOT NULL DEFAULT false,
  progress_step           bigint NOT NULL DEFAULT 0,
  progress_total_steps    bigint NOT NULL DEFAULT 0,
  progress_loss           double precision,
  progress_samples_per_second double precision,
  progress_time           timestamptz,
  create_time             timestamptz NOT NULL DEFAULT now(),
  update_time             timestamptz NOT NULL DEFAULT now(),
  start_time              timestamptz,
  end_time                timestamptz,
  -- Bumped on every change: the etag, and a cheap "did anything change" for watchers.
  version                 bigint NOT NULL DEFAULT 1,
  UNIQUE (tenant_id, request_id),
  CHECK ((end_time IS NOT NULL) = (state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')))
);

-- The scheduler's queue scan: runnable jobs by priority, then submission order.
CREATE INDEX jobs_queue ON jobs (priority DESC, create_time, id)
  WHERE state IN ('PENDING', 'RESTARTING');
-- ListJobs pages through one tenant's jobs, newest first, optionally by state.
CREATE INDEX jobs_by_tenant ON jobs (tenant_id, create_time DESC, id DESC);
CREATE INDEX jobs_by_tenant_state ON jobs (tenant_id, state, create_time DESC, id DESC);
-- Label filters (labels @> '{"team":"vision"}').
CREATE INDEX jobs_labels ON jobs USING gin (labels jsonb_path_ops);

-- Refuses illegal state changes and derives what no writer should have to remember
-- (start/end times, version), so the CHECK on end_time holds by construction. A state that
-- is not in the lifecycle at all is left to the CHECK constraint, which names it as such.
CREATE FUNCTION jobs_before_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.state IS DISTINCT FROM OLD.state
     AND EXISTS (SELECT 1 FROM job_state_transitions WHERE NEW.state IN (from_state, to_state))
     AND NOT EXISTS (SELECT 1 FROM job_state_transitions
                     WHERE from_state = OLD.state AND to_state = NEW.state) THEN
    RAISE EXCEPTION 'job % cannot go from % to %', OLD.id, OLD.state, NEW.state
      USING ERRCODE = 'GH001';
  END IF;
  IF NEW.state = 'RUNNING' AND NEW.start_time IS NULL THEN
    NEW.start_time := now();
  END IF;
  IF NEW.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND NEW.end_time IS NULL THEN
    NEW.end_time := now();
  END IF;
  NEW.version := OLD.version + 1;
  NEW.update_time := now();
  RETURN NEW;
END
$$;
CREATE TRIGGER jobs_before_update BEFORE UPDATE ON jobs
  FOR EACH ROW EXECUTE FUNCTION jobs_before_update();

-- One attempt per placement of the job; a restart is a new attempt with its own rendezvous
-- prefix, so ranks of a dead attempt can never meet ranks of the next one.
CREATE TABLE job_attempts (
  job_id            uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  attempt           integer NOT NULL CHECK (attempt >= 1),
  state             text NOT NULL DEFAULT 'SCHEDULED' CHECK (state IN
                      ('SCHEDULED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
  rendezvous_prefix text NOT NULL UNIQUE,
  resumed_from_step bigint CHECK (resumed_from_step >= 0),
  failure_kind      text CHECK (failure_kind IN ('INFRASTRUCTURE', 'JOB', 'USER')),
  failure_message   text,
  failed_rank       integer,
  exit_code         integer,
  signal            integer,
  create_time       timestamptz NOT NULL DEFAULT now(),
  start_time        timestamptz,
  end_time          timestamptz,
  PRIMARY KEY (job_id, attempt)
);

-- Append-only history; every state change of a job writes one row in the same transaction.
CREATE TABLE job_events (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  job_id       uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  attempt      integer NOT NULL DEFAULT 0,
  type         text NOT NULL CHECK (type IN
                 ('STATE_CHANGED', 'RANK_FAILED', 'NODE_LOST', 'HANG_DETECTED',
                  'CHECKPOINT_COMMITTED', 'CANCEL_REQUESTED')),
  from_state   text,
  to_state     text,
  message      text NOT NULL DEFAULT '',
  failure_kind text CHECK (failure_kind IN ('INFRASTRUCTURE', 'JOB', 'USER')),
  rank         integer,
  node         text,
  exit_code    integer,
  signal       integer,
  create_time  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_events_by_job ON job_events (job_id, id);

-- Node agents. An agent restart registers a new session; ranks of the old session are gone.
CREATE TABLE nodes (
  id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  name                text NOT NULL UNIQUE CHECK (name ~ '^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$'),
  state               text NOT NULL DEFAULT 'READY' CHECK (state IN
                        ('READY', 'CORDONED', 'DRAINING', 'LOST')),
  device_kind         text NOT NULL DEFAULT 'CPU' CHECK (device_kind IN ('CPU', 'CUDA')),
  slots               integer NOT NULL CHECK (slots >= 0),
  devices             jsonb NOT NULL DEFAULT '[]',
  labels              jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),
  address             text NOT NULL DEFAULT '',
  agent_version       text NOT NULL DEFAULT '',
  session_id          uuid,
  last_heartbeat_seq  bigint NOT NULL DEFAULT 0,
  last_heartbeat_time timestamptz,
  register_time       timestamptz NOT NULL DEFAULT now()
);
-- The lost-node sweep scans nodes by heartbeat age.
CREATE INDEX nodes_by_heartbeat ON nodes (last_heartbeat_time) WHERE state <> 'LOST';

-- Where each rank of an attempt runs. A slot holds at most one active rank.
CREATE TABLE rank_assignments (
  job_id          uuid NOT NULL,
  attempt         integer NOT NULL,
  rank            integer NOT NULL CHECK (rank >= 0),
  node_id         bigint NOT NULL REFERENCES nodes (id),
  local_rank      integer NOT NULL CHECK (local_rank >= 0),
  slot            integer NOT NULL CHECK (slot >= 0),
  state           text NOT NULL DEFAULT 'ASSIGNED' CHECK (state IN
                    ('ASSIGNED', 'STARTING', 'RUNNING', 'STOPPING', 'SUCCEEDED', 'FAILED',
                     'STOPPED')),
  pid             integer,
  exit_code       integer,
  signal          integer,
  last_step       bigint NOT NULL DEFAULT 0,
  last_step_time  timestamptz,
  update_time     timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, attempt, rank),
  FOREIGN KEY (job_id, attempt) REFERENCES job_attempts (job_id, attempt) ON DELETE CASCADE
);
CREATE UNIQUE INDEX rank_assignments_slot_in_use ON rank_assignments (node_id, slot)
  WHERE state IN ('ASSIGNED', 'STARTING', 'RUNNING', 'STOPPING');
CREATE INDEX rank_assignments_by_node ON rank_assignments (node_id)
  WHERE state IN ('ASSIGNED', 'STARTING', 'RUNNING', 'STOPPING');

-- Checkpoint metadata; blobs live in the checkpoint store. Only COMMITTED rows are resumable.
CREATE TABLE checkpoints (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  attempt     integer NOT NULL CHECK (attempt >= 1),
  step        bigint NOT NULL CHECK (step >= 0),
  state       text NOT NULL DEFAULT 'UPLOADING' CHECK (state IN
                ('UPLOADING', 'COMMITTED', 'DELETED')),
  size_bytes  bigint NOT NULL CHECK (size_bytes >= 0),
  sha256      bytea CHECK (octet_length(sha256) = 32),
  blob_path   text NOT NULL,
  metadata    jsonb NOT NULL DEFAULT '{}',
  create_time timestamptz NOT NULL DEFAULT now(),
  commit_time timestamptz,
  CHECK (state <> 'COMMITTED' OR (sha256 IS NOT NULL AND commit_time IS NOT NULL))
);
CREATE UNIQUE INDEX checkpoints_committed_step ON checkpoints (job_id, step)
  WHERE state = 'COMMITTED';

-- Trainer output shipped by agents. (job, attempt, rank, stream, seq) is unique so a
-- retried shipment of the same lines is absorbed by ON CONFLICT DO NOTHING.
CREATE TABLE job_logs (
  job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  attempt     integer NOT NULL,
  rank        integer NOT NULL,
  stream      text NOT NULL CHECK (stream IN ('STDOUT', 'STDERR')),
  seq         bigint NOT NULL CHECK (seq >= 0),
  line        text NOT NULL,
  create_time timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, attempt, rank, stream, seq)
);
CREATE INDEX job_logs_by_time ON job_logs (job_id, attempt, create_time);
