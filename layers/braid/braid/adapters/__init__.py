"""Adapters: the ports of the core, implemented locally and over boto3."""
