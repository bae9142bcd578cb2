-- An append as one statement (docs/architecture.md, "Services: one log,
-- many writers").
--
-- Appends are serialised by one transaction-scoped advisory lock, so the
-- time that lock is held bounds the whole log's append rate. Taken by a
-- client transaction, it was held across three round trips (the lock, the
-- INSERT, the COMMIT) and across every pause of the client between them: on
-- a busy machine a writer waiting for a CPU between its INSERT and its
-- COMMIT held up every other writer. Called as one statement outside a
-- transaction, this function takes the lock, writes and commits on the
-- server; the lock is released when the statement's transaction ends.
--
-- Inside a VOLATILE function each statement reads a new snapshot, so the
-- numbering below sees the rows of the writer that held the lock before.
--
-- Refusals: SQLSTATE GS001 (no such lease), GS002 (the lease is at another
-- epoch; DETAIL holds the lease's epoch). Nothing is written then.
CREATE FUNCTION gpusched_append(
    p_service        text,
    p_partition      text,
    p_epoch          bigint,
    p_lock_key       bigint,
    p_schema_version integer,
    p_agg_kinds      text[],
    p_agg_ids        text[],
    p_kinds          text[],
    p_payloads       text[],
    p_producers      text[],
    p_causations     uuid[],
    p_correlations   uuid[],
    p_keys           text[],
    p_keep           boolean[]
) RETURNS TABLE (out_ord bigint, out_seq bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    held bigint;
    base bigint;
BEGIN
    SELECT l.epoch INTO held FROM leases l
     WHERE l.service = p_service AND l.partition = p_partition FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fence: no lease %/%', p_service, p_partition
            USING ERRCODE = 'GS001';
    END IF;
    IF held <> p_epoch THEN
        RAISE EXCEPTION 'stale epoch: lease %/% is at epoch %', p_service, p_partition, held
            USING ERRCODE = 'GS002', DETAIL = held::text;
    END IF;
    IF coalesce(array_length(p_kinds, 1), 0) = 0 THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(p_lock_key);
    SELECT coalesce(max(e.seq), 0) INTO base FROM events e;
    -- Rows skipped by key are left out before numbering, so the sequence
    -- stays dense; `ord` maps each written row to its event.
    RETURN QUERY
    WITH input AS (
        SELECT * FROM UNNEST(p_agg_kinds, p_agg_ids, p_kinds, p_payloads, p_producers,
                             p_causations, p_correlations, p_keys, p_keep)
               WITH ORDINALITY AS t(ak, ai, k, p, pr, ca, co, ik, keep, ord)),
     fresh AS (
        SELECT i.* FROM input i
         WHERE i.keep
           AND (i.ik IS NULL OR NOT EXISTS
                (SELECT 1 FROM events e WHERE e.idempotency_key = i.ik))),
     numbered AS (
        SELECT f.*, base + row_number() OVER (ORDER BY f.ord) AS nseq FROM fresh f),
     ins AS (
        INSERT INTO events (seq, recorded_at, aggregate_kind, aggregate_id, kind,
                            schema_version, payload, producer, epoch,
                            causation_id, correlation_id, idempotency_key)
        SELECT n.nseq, clock_timestamp(), n.ak, n.ai, n.k, p_schema_version, n.p::jsonb,
               n.pr, p_epoch, n.ca, n.co, n.ik
          FROM numbered n ORDER BY n.nseq
        RETURNING 1)
    SELECT n.ord, n.nseq FROM numbered n ORDER BY n.nseq;
END
$$;
