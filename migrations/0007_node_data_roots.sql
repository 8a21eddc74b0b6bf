-- Node isolation: the directories whose files jobs may name on each node (gradhub-agent
-- --data-root), as its agent advertised them at RegisterNode. A JSON array of absolute paths;
-- empty = the node serves no files. CreateJob refuses a path under no registered node's roots,
-- and the scheduler places a job only on nodes whose roots hold every path it names.
ALTER TABLE nodes ADD COLUMN data_roots jsonb NOT NULL DEFAULT '[]';
