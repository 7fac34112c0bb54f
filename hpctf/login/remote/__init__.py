"""The SSH path: hpctf on a laptop drives a cluster whose site names a ``login:`` host.

- :mod:`.where`: whether this process runs on the site's login host or must go over SSH;
- :mod:`.ssh`: the one multiplexed OpenSSH connection per host, and remote commands built
  from argv with every word quoted for the remote shell;
- :mod:`.forward`: the laptop's side of each command (which act on the cluster, which stay);
- :mod:`.shipping`: the laptop's code snapshot, as one content-addressed tar stream;
- :mod:`.cluster_side`: the hidden commands the cluster's hpctf runs for the laptop;
- the Python API's runs on a cluster: :mod:`hpctf.python_api.remote_run` (one status call per
  poll).

Never imports TensorFlow (the login wing's rule).
"""
