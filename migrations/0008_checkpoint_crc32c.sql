-- The CRC-32C of a committed checkpoint's blob, computed by the store as it wrote the bytes
-- (or as it read them back at the commit). Downloads check the blob against it: CRC-32C runs at
-- about 19 GB/s on one core, SHA-256 at 1.3, so a download no longer costs the store a SHA-256
-- of the blob (the client still checks the sha256 end to end, and the scrub re-hashes it).
-- NULL for checkpoints committed before: their downloads check the sha256 as they did.
ALTER TABLE checkpoints ADD COLUMN crc32c bigint
  CHECK (crc32c BETWEEN 0 AND 4294967295);
