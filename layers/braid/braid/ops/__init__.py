"""What a user can do with a repository: open a backup, restore, verify,
retention. Imports no adapter: ports in, results out."""
