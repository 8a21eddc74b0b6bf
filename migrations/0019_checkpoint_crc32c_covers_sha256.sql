-- Whether a checkpoint's recorded crc32c is of the very bytes its sha256 names (issue 37): the
-- uploader sent the whole blob's CRC-32C from the pass that computed the sha256 and the store
-- matched it with the CRC of the chunks it received, or the store hashed the blob itself (at
-- the commit, or in a scrub that found it whole). Only then does Checkpoint.crc32c carry it and
-- do clients check downloads against it instead of hashing. Existing rows are false: their
-- crc32c was combined from the chunks alone, so their clients keep checking the sha256 until a
-- scrub has hashed them.
ALTER TABLE checkpoints ADD COLUMN crc32c_covers_sha256 boolean NOT NULL DEFAULT false;
