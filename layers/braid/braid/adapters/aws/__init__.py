"""AWS behind Braid's ports: the only package that imports boto3 or botocore."""
