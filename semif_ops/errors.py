"""The operator's own mistakes, kept free of AWS imports so any command (and the CLI front door) can raise
or catch them without boto3 installed."""


class UsageError(Exception):
    """Bad operator input detected before (or instead of) any AWS call; printed as one line."""


class OperationFailed(Exception):
    """The operation ran and did not succeed (a resource ended Failed, an answer was not what was asked
    for, a job was left running); printed as one line, exit 1."""
