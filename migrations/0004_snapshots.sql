-- Snapshots: the state folded up to a sequence of the log, so that a start
-- folds only the events after it (docs/architecture.md, "Snapshots"). A
-- cache of the log, never the truth: a start loads the newest one that
-- passes its checks, and any row may be deleted at any time.
CREATE TABLE snapshots (
    seq        bigint      NOT NULL,
    format     integer     NOT NULL,
    state_hash text        NOT NULL,
    bytes      bigint      NOT NULL,
    taken_by   text        NOT NULL,
    taken_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    body       bytea       NOT NULL,
    PRIMARY KEY (seq, format)
);

-- The body is dense binary already: compressing it would cost the writer
-- and every start, and save little.
ALTER TABLE snapshots ALTER COLUMN body SET STORAGE EXTERNAL;
