-- The rendezvous store's keys (services/api/rendezvous_store.h), shared by every api replica so
-- that a rendezvous survives the death of the replica that took its keys (issue #35). The
-- waiters stay in each replica's memory; only the keys and values live here.
--
-- Access pattern, and why this shape:
--   - point reads and upserts by key (Set, Get, Check; Add as one INSERT ... ON CONFLICT DO
--     UPDATE ... RETURNING): the primary key;
--   - DeletePrefix and the cleanup below: a range of that same index, [prefix, successor), as
--     bytea compares bytewise; no second index, so a Set maintains one index only;
--   - counters updated in place: fillfactor 70 leaves room on the page, so an Add is a HOT
--     update (no index write).
-- Keys and values are bytea: store keys are byte strings (a NUL is legal in a proto string, not
-- in a PostgreSQL text), values are bytes.
CREATE TABLE rendezvous_keys (
  key   bytea PRIMARY KEY CHECK (octet_length(key) > 0),
  value bytea NOT NULL
) WITH (fillfactor = 70);

-- Cleanup: an attempt's keys go when the attempt ends (SCHEDULED/RUNNING -> SUCCEEDED, FAILED
-- or CANCELLED, wherever in the api that is decided: attempts.cc, job_manager.cc,
-- scheduler.cc), in the transaction that ends it, and when the attempt row is deleted (job
-- retention) for whatever a straggler wrote after the end. The range is the attempt's
-- rendezvous_prefix `jobs/{id}/attempts/{n}/` up to the same text with the trailing '/'
-- (0x2f) replaced by '0' (0x30), its successor: attempt 1's range does not reach attempt 10's
-- keys.
CREATE FUNCTION rendezvous_keys_drop_attempt() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM rendezvous_keys
   WHERE key >= convert_to(OLD.rendezvous_prefix, 'UTF8')
     AND key < convert_to(left(OLD.rendezvous_prefix, -1) || '0', 'UTF8');
  RETURN NULL;
END
$$;
CREATE TRIGGER job_attempts_end_drops_rendezvous_keys AFTER UPDATE OF state ON job_attempts
  FOR EACH ROW
  WHEN (OLD.state IN ('SCHEDULED', 'RUNNING')
        AND NEW.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED'))
  EXECUTE FUNCTION rendezvous_keys_drop_attempt();
CREATE TRIGGER job_attempts_delete_drops_rendezvous_keys AFTER DELETE ON job_attempts
  FOR EACH ROW EXECUTE FUNCTION rendezvous_keys_drop_attempt();
