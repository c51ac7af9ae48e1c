"""How a stream becomes a published backup: cutting, the driver loop, the chunk
worker, finalize, and the local (embedded) engine. Imports no adapter."""
