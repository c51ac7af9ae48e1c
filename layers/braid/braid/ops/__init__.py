"""What a user can do with a repository: init, open a backup, restore, verify,
retention. Imports no adapter: ports in, results out."""
