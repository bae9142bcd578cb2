-- gpusched event log and fencing leases (docs/architecture.md, "Services: one log, many writers").
--
-- `events` is append-only: the store only ever INSERTs; the triggers below
-- refuse UPDATE, DELETE and TRUNCATE for every client, so a bug or a
-- hand-typed statement cannot rewrite history.

CREATE TABLE events (
    -- Global order of the log; replay folds events in this order.
    seq             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    -- 'job' | 'node' | 'tenant' | 'cluster', and the id inside that kind.
    aggregate_kind  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    -- Event::kind(), e.g. 'job_bound'.
    kind            text        NOT NULL,
    schema_version  integer     NOT NULL,
    -- serde JSON of the Event, tagged by "type": readable in SQL
    -- (payload->>'type', payload->'assignments', ...).
    payload         jsonb       NOT NULL,
    -- Event::producer(), e.g. 'placement'.
    producer        text        NOT NULL,
    -- Fencing epoch of the lease the writer held when it appended.
    epoch           bigint      NOT NULL,
    causation_id    uuid,
    correlation_id  uuid,
    -- Unique where present (client submissions, redeliveries); most
    -- decisions carry none, so the index holds only keyed rows.
    idempotency_key text
);

-- Replay reads by `seq` (the primary key). Indexes are few on purpose:
-- each one costs every append.
CREATE UNIQUE INDEX events_idempotency_key_idx ON events (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX events_aggregate_idx ON events (aggregate_kind, aggregate_id, seq);
CREATE INDEX events_correlation_idx ON events (correlation_id)
    WHERE correlation_id IS NOT NULL;
-- recorded_at grows with seq (appends are serialised), so a BRIN index
-- finds a time's sequence range at almost no cost per append.
CREATE INDEX events_recorded_at_brin ON events USING brin (recorded_at);

CREATE FUNCTION events_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'events is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER events_no_update_or_delete
    BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_refuse_change();

CREATE TRIGGER events_no_truncate
    BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_refuse_change();

-- One active instance per (service, partition). `epoch` only grows: each
-- takeover increments it, and appends carrying an older epoch are refused.
CREATE TABLE leases (
    service     text        NOT NULL,
    partition   text        NOT NULL,
    epoch       bigint      NOT NULL CHECK (epoch > 0),
    holder      text        NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (service, partition)
);
