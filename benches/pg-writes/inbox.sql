-- A hand-written transactional inbox (benches/pg-writes.sh): one
-- transaction per delivery, a unique insert of its event identity and
-- body, then the object's conditional update; about 250-byte bodies.
\set obj random(1, :objects)
\set ev random(1, 4000000000)
BEGIN;
INSERT INTO inbox (event_id, object_id, body)
  VALUES ('e-' || :client_id || '-' || :ev, 'card-' || :obj, repeat('x', 250))
  ON CONFLICT (event_id) DO NOTHING;
UPDATE objects SET version = version + 1, state = repeat('y', 200)
  WHERE object_id = 'card-' || :obj AND version < version + 1;
COMMIT;
