-- Explain answers "why was this job preempted" from the plan that chose it;
-- plans are logged under their beneficiary, so victims are found by this
-- index on the plan's victim list.
CREATE INDEX events_preemption_victims_idx ON events
    USING gin ((payload -> 'victims') jsonb_path_ops)
    WHERE kind = 'preemption_planned';
