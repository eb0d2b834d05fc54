-- A trivial script, for timing one EVALSHA round trip.
return 1
