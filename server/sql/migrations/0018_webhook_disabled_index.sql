-- The outbox's disabled deliveries, by URL. The event trigger (0016) skips a job's or batch's
-- delivery to a URL that answered 410 Gone before: NOT EXISTS a disabled delivery of the same
-- job or batch to that URL. With the job and the batch in one condition (an OR) and the
-- trigger's rows of unknown count, PostgreSQL planned that as a hash anti-join over every
-- delivery in the outbox: a done write with a webhook cost time in proportion to the outbox
-- (7.3 ms for one job with 10,000 deliveries kept, 142 ms for 100 jobs; docs/performance-notes.md,
-- "The outbox check of the event trigger"). Disabled deliveries are few (only a 410 makes
-- one), so this index holds only them, and the check reads those whatever the plan: 0.63 ms
-- and 4.9 ms there. Building it reads the outbox once, holding its writes back meanwhile.
CREATE INDEX webhook_deliveries_disabled ON webhook_deliveries (url) WHERE status = 'disabled';
