"""The cloud path: agent staging and the Step Functions pipeline steps.

Modules here are pure where they can be (they take ports: ObjectStore,
KeyService, and the small pipeline ports), so the same code runs in Lambda,
in tests against moto, and under the emulated cloud. boto3 glue lives in the
`aws_*` modules and `braid.adapters`.
"""
