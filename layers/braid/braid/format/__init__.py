"""What is on disk: every byte Braid writes, section by section as docs/format.md.

ids (backup names and ids), layout (every repository key is built and parsed
here), timestamps (the one timestamp form), canonical (the one JSON encoder
for authenticated bytes), checksum (the stored CRC64NVME and its two
spellings), keys (data keys and what is derived from them), chunk (the chunk
codec), algorithms (the descriptor every manifest carries), manifest (sealed
over its body bytes as stored), repository (config.json and the published
backups) and staging (the cloud staging area). Pure: no adapter, no boto3.
"""
