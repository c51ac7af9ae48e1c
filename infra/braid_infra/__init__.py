"""Braid's CDK constructs: one per concern, composed by BraidStack (stack.py)."""
