#!/usr/bin/env bash
# The Debian packages the tests need, installed before the first test (`make test` runs this,
# and so does tests/slurm/cluster.sh start): the one list of them is PACKAGES below.
#
#   tests/system-packages.sh           # install what is missing (root or passwordless sudo)
#   tests/system-packages.sh --check   # exit 0 if all are installed, else 1 naming the missing
#   tests/system-packages.sh --list    # the packages, one a line
#
# Idempotent: when every package is installed (dpkg-query, a few milliseconds) it says so in
# one line and touches nothing. Otherwise it runs apt-get update and apt-get install, with
# apt's output in a log file and one line on stdout; it waits for and retries a dpkg or apt
# lock held by another install, and fails with one line naming apt's error and the log.
#
# Environment knobs:
#   HPCTF_APT_LOCK_TIMEOUT  seconds apt waits for a lock on each try      (default 120)
#   HPCTF_APT_ATTEMPTS      tries while someone else holds the lock       (default 5)
#   HPCTF_APT_LOG           apt's log file   (default a new ${TMPDIR:-/tmp}/hpctf-apt.*.log)
set -euo pipefail

# Debian 12 (bookworm) names; slurm-wlm is the metapackage of the next three.
PACKAGES=(
    slurm-wlm slurmctld slurmd slurm-client # the 2-node test cluster, sbatch, srun, scontrol
    munge                                   # Slurm's authentication (AuthType=auth/munge)
    shellcheck                              # every rendered batch script is linted
    util-linux                              # unshare, setsid, runuser (cluster.sh)
    mount                                   # mount --bind of each node's /etc/hosts
    iproute2                                # ss: is a cluster port already taken
    slurmdbd mariadb-server                 # accounting (sacct): HPCTF_SLURM_ACCOUNTING=1
    openssh-server openssh-client           # the SSH path's tests (tests/sshd.py): a real sshd
    debootstrap                             # the Slurm 24.11 root (tests/slurm/debian13-root.sh)
    chromium                                # hpctf ui's pages in a real headless browser (tests/browser.py)
)
ME=tests/system-packages.sh
LOCK_TIMEOUT=${HPCTF_APT_LOCK_TIMEOUT:-120}
ATTEMPTS=${HPCTF_APT_ATTEMPTS:-5}

die() {
    echo "$ME: ERROR: $*" >&2
    exit 1
}

# missing: the packages dpkg does not list as installed ("ii"), one a line.
missing() {
    local installed
    installed=$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${PACKAGES[@]}" \
        2>/dev/null | awk '$2 == "ii" { print $1 }') || true
    local p
    for p in "${PACKAGES[@]}"; do
        grep -qxF "$p" <<<"$installed" || echo "$p"
    done
}

# apt_install LOG PACKAGE...: one try of apt-get update + install, output appended to LOG.
apt_install() {
    local log=$1
    shift
    # An update that fails (no network) still leaves the lists a previous one fetched.
    "${SUDO[@]}" apt-get -q -o DPkg::Lock::Timeout="$LOCK_TIMEOUT" update >>"$log" 2>&1 || true
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -y \
        -o DPkg::Lock::Timeout="$LOCK_TIMEOUT" install --no-install-recommends "$@" >>"$log" 2>&1
}

case ${1:-} in
--list)
    printf '%s\n' "${PACKAGES[@]}"
    exit 0
    ;;
--check)
    mapfile -t todo < <(missing)
    ((${#todo[@]} == 0)) || die "not installed: ${todo[*]} (run $ME as root)"
    exit 0
    ;;
"") ;;
*)
    echo "usage: $0 [--check|--list]" >&2
    exit 2
    ;;
esac

command -v dpkg-query >/dev/null || die "dpkg-query not found: on a system without dpkg, install by hand: ${PACKAGES[*]}"
mapfile -t todo < <(missing)
if ((${#todo[@]} == 0)); then
    echo "$ME: all ${#PACKAGES[@]} system packages the tests need are installed"
    exit 0
fi

SUDO=()
if (($(id -u) != 0)); then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        die "${todo[*]} not installed, and installing needs root: run 'sudo $ME' once"
    fi
fi
command -v apt-get >/dev/null || die "apt-get not found: install by hand: ${todo[*]}"

log=${HPCTF_APT_LOG:-$(mktemp "${TMPDIR:-/tmp}/hpctf-apt.XXXXXX.log")}
start=$SECONDS
printf '%s' "$ME: installing ${todo[*]} with apt (log: $log) ... "
for ((attempt = 1; ; attempt++)); do
    mark=$(wc -l <"$log" 2>/dev/null || echo 0)
    echo "===== attempt $attempt: apt-get install ${todo[*]}" >>"$log"
    if apt_install "$log" "${todo[@]}" && mapfile -t left < <(missing) && ((${#left[@]} == 0)); then
        echo "done in $((SECONDS - start)) s"
        exit 0
    fi
    reason=$(tail -n +"$((mark + 1))" "$log" | grep -E '^E: ' | tail -n 1) || true
    # Another apt or dpkg (a second test run, unattended-upgrades) held a lock past apt's own
    # timeout: wait and try again. Any other failure is final.
    if ((attempt < ATTEMPTS)) && [[ $reason =~ (Could not get lock|Unable to acquire|Unable to lock) ]]; then
        sleep 10
        continue
    fi
    break
done
echo "failed after $((SECONDS - start)) s"
die "apt could not install ${todo[*]}: ${reason:-see the log}; full log: $log"
