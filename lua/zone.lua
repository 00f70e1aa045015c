-- zone.lua: decodes a zone's argument z (PackZone in lua/wire.go packs it:
-- ((k - 1) * #KEYS + ki - 1) * 2 + last) into ki, the index of its bucket
-- in KEYS, k, its kind, and last, 1 when it is its request's last zone
-- (else 0). The one decoder of a zone's argument: lua.go writes it in
-- place of each "--@unzone" line of decide.lua and refund.lua, where ki,
-- k and last are declared. It runs once per zone of a batch, so it is
-- inlined rather than a function call.
last = z % 2
z = (z - last) / 2
ki = z % nkeys
k = (z - ki) / nkeys + 1
ki = ki + 1
