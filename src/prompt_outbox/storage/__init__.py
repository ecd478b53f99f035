"""Storage: the only layer that talks to Valkey (the store, its Lua scripts), the embedded
server and the durability check."""
