"""Where KV and commands live: paged KV pools, shared-memory arenas and the command ring, the
token store, the allocator's settings, and the migrator that moves KV blocks over PCIe."""
