-- Dense sequence numbers, and job ids for submissions.
--
-- Appends hold a transaction-scoped advisory lock and number their rows
-- max(seq)+1, max(seq)+2, ... themselves, so the log has no gaps: a
-- follower that has applied seq N knows the next event is N+1 and can tell
-- a missing message from an idle log. An identity column would skip
-- numbers for rolled-back appends and for rows dropped as duplicates.
ALTER TABLE events ALTER COLUMN seq DROP IDENTITY IF EXISTS;

-- Job ids handed out to submissions (gateway instances draw blocks).
CREATE SEQUENCE job_ids AS bigint START WITH 1 CACHE 1;
