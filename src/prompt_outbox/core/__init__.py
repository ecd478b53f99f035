"""Values and rules: entries, the state machine, tunables, errors, keys, checks. No I/O."""
