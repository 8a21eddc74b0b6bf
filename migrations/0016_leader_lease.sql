-- The control plane's leader (services/api/leader_lease.h): the one gradhub-api replica that
-- runs the scheduler's passes. One row; a replica leads while it holds an unexpired term.
-- Each takeover starts a new term (term + 1), which fences the deposed leader: every leader
-- transaction checks its term here first, under a lock a takeover waits for.
CREATE TABLE control_plane_leader (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  holder text NOT NULL,          -- the replica: host, pid and a random part, '' = none yet
  term bigint NOT NULL,          -- grows by one at every takeover
  acquired_at timestamptz NOT NULL,
  expires_at timestamptz NOT NULL
);
INSERT INTO control_plane_leader (holder, term, acquired_at, expires_at)
  VALUES ('', 0, now(), '-infinity');
