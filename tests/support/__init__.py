"""What test modules share: serving and waiting, tokens, the webhook receiver, required tools.

Test modules import from here, never from one another (tests/test_architecture.py keeps it so)."""
