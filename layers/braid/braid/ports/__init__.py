"""Ports: the small interfaces the core needs from outside systems (object
store, key service, multipart uploads, events). Adapters implement them."""
