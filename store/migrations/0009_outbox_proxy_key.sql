-- 0009: payloads queued through the webhook proxy (POST /outbox/{target})
-- get their own key space, apart from the events' ids.
--
-- Until now a proxied row took the caller's X-Event-Id as its event_id, so
-- it shared UNIQUE (target, event_id) with the platform's event ids: a
-- webhook whose id a proxy call had used already got no outbox row (the
-- emit path's ON CONFLICT DO NOTHING), and a proxy call reusing a queued
-- event's id got that event's row back, its own body dropped.
--
-- proxy_key holds the caller's key (X-Event-Id, Idempotency-Key, or the id
-- made for a call without one) of a proxied row, and is NULL for an event's
-- row. A proxied row's event_id is char(31) || 'proxy:' || proxy_key: it
-- starts with a control character, which no event id holds (the intake
-- refuses them, backstop's own ids are "evt_bs_" and hex, and the emit path
-- refuses this prefix), so the two can never meet in UNIQUE (target,
-- event_id). The key is what the target is sent as X-Event-Id and
-- webhook-id, and what the CLI and the dashboard show. No rebuild: the
-- column is added, delivery_attempts and its ON DELETE CASCADE stay as
-- they are.
ALTER TABLE outbox ADD COLUMN proxy_key TEXT;

-- Rows the old proxy wrote move to the new key space, so that they keep
-- their idempotency (a repeat of their key finds them) and stop holding an
-- id an event may come with. An event's row is recognised by its payload,
-- the envelope the emit path built: {"event_id":<its event_id>,"event":<its
-- event_type>,"created_at":…,"origin":…,"data":…}. The cheap byte prefix
-- matches ids that json_quote writes as encoding/json does; the JSON test
-- covers the others (IS, not =: a key that is absent must not make the
-- whole test NULL, which would leave the row out). Only a proxied body that is itself such an envelope,
-- with the same id and type, would be taken for an event's row, which
-- leaves it as it was before this migration.
UPDATE outbox SET proxy_key = event_id, event_id = char(31) || 'proxy:' || event_id
WHERE NOT (
    substr(payload, 1, length('{"event_id":' || json_quote(event_id) || ',"event":' || json_quote(event_type) || ',"created_at":'))
        = '{"event_id":' || json_quote(event_id) || ',"event":' || json_quote(event_type) || ',"created_at":'
    OR (json_valid(payload)
        AND json_type(payload, '$.event_id') IS 'text' AND json_extract(payload, '$.event_id') IS event_id
        AND json_type(payload, '$.event') IS 'text' AND json_extract(payload, '$.event') IS event_type
        AND json_type(payload, '$.origin') IS 'text')
);

-- A caller's key is queued once per target while its row is kept.
-- Partial: an event's row (proxy_key NULL) costs the emit path nothing here.
CREATE UNIQUE INDEX outbox_proxy_key ON outbox (target, proxy_key) WHERE proxy_key IS NOT NULL;
