"""The compute-node wing: what ``hpctf worker`` runs on every task of a job, in rooms:
:mod:`.start` (before and around TensorFlow), :mod:`.loop` (hpctf's training loop),
:mod:`.records` (checkpoints and the chief's records), :mod:`.users_code` (the user's own code:
Tasks, scripts, ``fit``) and :mod:`.doctor` (``hpctf doctor``'s checks). Only the loop and the
modules it loads import TensorFlow."""
