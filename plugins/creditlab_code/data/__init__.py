"""The shipped coding problems (train.jsonl, test.jsonl), package data."""
