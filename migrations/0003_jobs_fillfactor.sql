-- Room on each page of jobs for updated row versions. A job's row is rewritten often without
-- touching an indexed column (its state reason, progress on every telemetry report), and with
-- space beside it such an update stays on the page (a HOT update) instead of inserting into
-- all six indexes: on a packed table, writing waiting reasons for a burst of new jobs cost the
-- database almost as much as inserting them. Applies to pages written from now on.
ALTER TABLE jobs SET (fillfactor = 70);
