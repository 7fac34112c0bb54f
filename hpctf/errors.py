"""The one error type for user mistakes.

Raised anywhere a user's input (files, flags, run directories, the Slurm environment) is wrong;
caught only at the CLI edge, which prints the message on one line per problem and exits 2.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix. The message says what was wrong and what is allowed."""

    exit_code = 2
