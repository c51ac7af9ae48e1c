"""Adapters: the outside systems behind the ports. `local/` (a directory, the
master-key file) and `aws/` (S3, KMS, Step Functions, EventBridge,
CloudFormation). boto3 and botocore are imported nowhere else."""
