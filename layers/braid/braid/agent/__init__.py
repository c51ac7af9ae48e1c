"""The host side of the cloud path: the cloud engine the CLI drives, the
staging uploader, resume and throttling. Holds no key, calls no KMS."""
