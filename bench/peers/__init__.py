"""Against the peers: prompt-outbox beside SAQ, BullMQ, streaq and arq
(``python -m bench.peers``)."""
