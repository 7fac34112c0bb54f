"""``hpctf ui``: a read-only dashboard of a runs root's runs, sweeps and searches in the browser,
on the login node or from a laptop through the site's SSH connection.

:mod:`.ui_command` is the command (where the data comes from), :mod:`.server` the loopback web
server (token, Host check, the page's files and its JSON), ``static/`` the page itself (HTML,
CSS, JavaScript, and uPlot 1.6.31, MIT, for the charts: shipped with the package, no CDN).
The pages' data are typed calls (:mod:`hpctf.login.calls.pages`), one per refresh.
"""
