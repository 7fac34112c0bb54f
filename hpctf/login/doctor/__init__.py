"""``hpctf doctor``: a preflight job on every node of a site (:mod:`.doctor_commands`), and every
task's report judged together (:mod:`.verdict`, pure). The checks themselves run on the nodes:
:mod:`hpctf.compute.start.preflight` and :mod:`hpctf.compute.doctor.node_checks`."""
