"""The embedded default's outside world: a repository directory and a master-key file."""
