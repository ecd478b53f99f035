"""What test modules share: serving and waiting, tokens, the webhook agent, the short tunables
and the manual clock, required tools.

Test modules import from here, never from one another (tests/test_architecture.py keeps it so)."""
