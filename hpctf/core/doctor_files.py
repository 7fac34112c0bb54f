"""The layout of a doctor directory, the contract between ``hpctf doctor`` (login node: writes
the settings, reads the results) and ``hpctf preflight`` (every task of its job: reads the
settings, writes its results)::

    <runs_root>/doctor-<site>-<time>/
        doctor.json            the settings every task reads
        results/rank-<N>.json  what task N found (hpctf.compute.start.preflight.Report)
        gate/rank-<N>.ok|.blocked   whether task N may join the all-reduce
        nccl/rank-<N>.log      NCCL's log of task N (NCCL_DEBUG=INFO)
"""

SETTINGS_FILE = "doctor.json"
RESULTS_DIR = "results"
GATE_DIR = "gate"
NCCL_DIR = "nccl"
