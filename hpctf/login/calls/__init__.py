"""The typed command layer: what a user asks of a run (its status, cancel, resubmit, its
metrics and logs) as functions with typed arguments and a typed, JSON-ready result
(:mod:`.models`), in one table (:mod:`.table`). The Python API calls them here; on a site
behind SSH the same request travels on ssh's standard input (never in an argument vector)
to ``hpctf _call`` on the login host, which answers with the same result
(:mod:`hpctf.login.remote.calling`)."""
