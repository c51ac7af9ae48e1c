"""What is on disk: every byte Braid writes, section by section as docs/format.md.

Ids, the repository layout (every key is built and parsed here), the chunk
codec, the stored checksum, keys, the manifest and the cloud staging area.
Pure: no adapter, no boto3.
"""
