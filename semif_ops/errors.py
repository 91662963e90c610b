"""The operator's own mistakes, kept free of AWS imports so any command (and the CLI front door) can raise
or catch them without boto3 installed."""


class UsageError(Exception):
    """Bad operator input detected before (or instead of) any AWS call; printed as one line."""
